/* tokens.c: token files in llm.c's format, and text read as byte tokens (cddp/data.h).
 *
 * A token file is a header of 256 little-endian int32 (magic 20240520, version 1, the token
 * count, then zeros) followed by the tokens as little-endian uint16. The reader checks the header
 * against the file's size before it allocates anything, so a corrupt count cannot ask for absurd
 * memory, and a truncated or overlong file is an error that says how many bytes it lacks or has
 * in excess. On a little-endian host the tokens are the file's pages, mapped (private, so a write
 * copies the page) rather than read: a corpus costs no memory of its own, the ranks of a host
 * share its pages, and only what training touches is read from the disk. Files are written
 * through io/atomic.c: a reader sees the old file or the new one, and a mapping keeps the old.
 */
#include "cddp/core.h"
#include "cddp/data.h"
#include "io/internal.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define HEADER_INTS  256
#define HEADER_BYTES (HEADER_INTS * 4)

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int open_sized(const char *path, const char *what, FILE **f, int64_t *size,
                      cddp_error *err) {
    *f = fopen(path, "rb");
    if (!*f)
        return cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO,
                              "cannot open %s %s: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(*f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(*f);
        *f = NULL;
        return cddp_error_set(err, CDDP_EIO, "%s: not a regular file", path);
    }
    *size = (int64_t)st.st_size;
    return CDDP_OK;
}

static int read_all(FILE *f, const char *path, void *buf, size_t n, cddp_error *err) {
    if (n && fread(buf, 1, n, f) != n)
        return cddp_error_set(err, CDDP_EIO, "%s: read failed: %s", path,
                              ferror(f) ? strerror(errno) : "the file shrank while being read");
    return CDDP_OK;
}

int cddp_tokens_read(const char *path, cddp_tokens *out, cddp_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f;
    int64_t size;
    CDDP_TRY(open_sized(path, "token file", &f, &size, err));
    int rc = CDDP_OK;
    uint8_t header[HEADER_BYTES];
    if (size < HEADER_BYTES) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: %" PRId64 " bytes, shorter than the %d-byte header of a token "
                            "file (llm.c's format: is this a token file?)",
                            path, size, HEADER_BYTES);
        goto out;
    }
    if ((rc = read_all(f, path, header, HEADER_BYTES, err)) != CDDP_OK) goto out;
    uint32_t magic = le32(header), version = le32(header + 4);
    int64_t count = (int32_t)le32(header + 8);
    if (magic != CDDP_TOKENS_MAGIC) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: magic %" PRIu32 ", expected %d (llm.c's token files; make one "
                            "from text with cddp-tokenize)",
                            path, magic, CDDP_TOKENS_MAGIC);
        goto out;
    }
    if (version != CDDP_TOKENS_VERSION) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: version %" PRIu32 ", only version %d (uint16 tokens) is supported",
                            path, version, CDDP_TOKENS_VERSION);
        goto out;
    }
    if (count < 0) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: negative token count %" PRId64, path, count);
        goto out;
    }
    int64_t expect = HEADER_BYTES + 2 * count;
    if (size != expect) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: %s: the header promises %" PRId64 " tokens (%" PRId64
                            " bytes in all), the file holds %" PRId64 " bytes",
                            path, size < expect ? "truncated" : "trailing bytes", count, expect,
                            size);
        goto out;
    }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (count > 0) { /* the file's pages are the tokens: mapped, shared until written */
        void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fileno(f), 0);
        if (map == MAP_FAILED) {
            rc = cddp_error_set(err, errno == ENOMEM ? CDDP_ENOMEM : CDDP_EIO,
                                "%s: cannot map its %" PRId64 " bytes: %s", path, size,
                                strerror(errno));
            goto out;
        }
        *out = (cddp_tokens){.count = count,
                             .data = (uint16_t *)((uint8_t *)map + HEADER_BYTES),
                             .map = map,
                             .map_bytes = (size_t)size};
        goto out;
    }
#endif
    out->data = cddp_malloc(count ? (size_t)count * 2 : 1);
    if (!out->data) {
        rc =
            cddp_error_set(err, CDDP_ENOMEM, "%s: cannot allocate %" PRId64 " tokens", path, count);
        goto out;
    }
    if ((rc = read_all(f, path, out->data, (size_t)count * 2, err)) != CDDP_OK) goto out;
    const uint8_t *b = (const uint8_t *)out->data;
    for (int64_t i = 0; i < count; i++) out->data[i] = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
    out->count = count;
out:
    fclose(f);
    if (rc != CDDP_OK) cddp_tokens_free(out);
    return rc;
}

int cddp_tokens_write(const char *path, const uint16_t *tokens, int64_t count, cddp_error *err) {
    if (count < 0 || count > INT32_MAX)
        return cddp_error_set(err, CDDP_ERANGE,
                              "%s: %" PRId64 " tokens; a token file holds 0 to %d (an int32 count)",
                              path, count, INT32_MAX);
    uint8_t header[HEADER_BYTES] = {0};
    put_le32(header, CDDP_TOKENS_MAGIC);
    put_le32(header + 4, CDDP_TOKENS_VERSION);
    put_le32(header + 8, (uint32_t)count);
    cddp__atomic_file af;
    CDDP_TRY(cddp__atomic_open(&af, path, err));
    int rc = cddp__atomic_write(&af, header, sizeof header, err);
    uint8_t chunk[8192];
    for (int64_t i = 0; rc == CDDP_OK && i < count;) {
        size_t n = 0;
        for (; n < sizeof chunk && i < count; n += 2, i++) {
            chunk[n] = (uint8_t)tokens[i];
            chunk[n + 1] = (uint8_t)(tokens[i] >> 8);
        }
        rc = cddp__atomic_write(&af, chunk, n, err);
    }
    return cddp__atomic_close(&af, rc, err);
}

int cddp_tokens_from_text(const char *path, cddp_tokens *out, cddp_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f;
    int64_t size;
    CDDP_TRY(open_sized(path, "text file", &f, &size, err));
    int rc = CDDP_OK;
    uint8_t *bytes = cddp_malloc(size ? (size_t)size : 1);
    out->data = cddp_malloc(size ? (size_t)size * 2 : 1);
    if (!bytes || !out->data)
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: cannot hold %" PRId64 " bytes as tokens", path,
                            size);
    else
        rc = read_all(f, path, bytes, (size_t)size, err);
    if (rc == CDDP_OK) {
        for (int64_t i = 0; i < size; i++) out->data[i] = bytes[i];
        out->count = size;
    }
    cddp_free(bytes);
    fclose(f);
    if (rc != CDDP_OK) cddp_tokens_free(out);
    return rc;
}

static int name_order(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the file's bytes as tokens unless it holds a NUL byte (not text). */
static int append_text(const char *path, cddp_tokens *all, int64_t *cap, bool *used,
                       cddp_error *err) {
    cddp_tokens one;
    CDDP_TRY(cddp_tokens_from_text(path, &one, err));
    *used = true;
    for (int64_t i = 0; i < one.count && *used; i++) *used = one.data[i] != 0;
    int rc = CDDP_OK;
    if (*used && all->count + one.count > *cap) {
        int64_t want = CDDP_MAX(2 * *cap, all->count + one.count);
        uint16_t *grown = cddp_realloc(all->data, (size_t)want * sizeof *grown);
        if (!grown)
            rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory for %" PRId64 " tokens", want);
        else {
            all->data = grown;
            *cap = want;
        }
    }
    if (*used && rc == CDDP_OK && one.count > 0) {
        memcpy(all->data + all->count, one.data, (size_t)one.count * sizeof *one.data);
        all->count += one.count;
    }
    cddp_tokens_free(&one);
    return rc;
}

/* Every regular file of the folder that holds text, in name order, one after another. */
static int load_folder(const char *dir, cddp_tokens *out, cddp_error *err) {
    DIR *d = opendir(dir);
    if (!d) return cddp_error_set(err, CDDP_EIO, "cannot read folder %s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = CDDP_OK;
    for (struct dirent *e; rc == CDDP_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = cddp_realloc(names, (size_t)cap * sizeof *names);
            if (!grown) {
                rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory listing %s", dir);
                break;
            }
            names = grown;
        }
        names[n] = cddp_malloc(strlen(e->d_name) + 1);
        if (!names[n])
            rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory listing %s", dir);
        else
            strcpy(names[n++], e->d_name);
    }
    closedir(d);
    if (rc == CDDP_OK && n > 1) qsort(names, (size_t)n, sizeof *names, name_order);
    int64_t tcap = 0;
    int files = 0;
    for (int i = 0; i < n && rc == CDDP_OK; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue; /* links count once */
        bool used = false;
        rc = append_text(path, out, &tcap, &used, err);
        files += used;
    }
    for (int i = 0; i < n; i++) cddp_free(names[i]);
    cddp_free(names);
    if (rc == CDDP_OK && files == 0)
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: no text file in this folder", dir);
    if (rc != CDDP_OK) cddp_tokens_free(out);
    return rc;
}

int cddp_tokens_load(const char *path, cddp_tokens *out, cddp_error *err) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return load_folder(path, out, err);
    FILE *f;
    int64_t size;
    CDDP_TRY(open_sized(path, "data file", &f, &size, err));
    uint8_t head[4] = {0};
    bool binary = size >= 4 && fread(head, 1, 4, f) == 4 && le32(head) == CDDP_TOKENS_MAGIC;
    fclose(f);
    return binary ? cddp_tokens_read(path, out, err) : cddp_tokens_from_text(path, out, err);
}
