/* tokens.c: token files in llm.c's format, and text read as tokens (cddp/data.h).
 *
 * A token file is a header of 256 little-endian int32 (the magic, the version, the token count,
 * then zeros) followed by the tokens, little-endian: uint16 in GPT-2's files (magic 20240520,
 * version 1), uint32 in Llama 3's (magic 20240801, version 7), as llm.c writes them. cddp also
 * records the vocabulary of the tokenizer that wrote the file in the header's fourth int32 (llm.c
 * leaves it zero and reads past it), so that a model of another vocabulary can refuse the file.
 * The reader checks the header against the file's size before it allocates anything, so a corrupt
 * count cannot ask for absurd memory, and a truncated or overlong file is an error that says how
 * many bytes it lacks or has in excess. On a little-endian host the tokens are the file's pages,
 * mapped (private, so a write copies the page) rather than read: a corpus costs no memory of its
 * own, the ranks of a host share its pages, and only what training touches is read from the
 * disk. Files are written through io/atomic.c: a reader sees the old file or the new one, and a
 * mapping keeps the old.
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
#define WIDE_MAGIC   20240801 /* llm.c's Llama 3 token files: uint32 tokens */
#define WIDE_VERSION 7

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
    int64_t count = (int32_t)le32(header + 8), vocab = (int32_t)le32(header + 12);
    bool wide = magic == WIDE_MAGIC;
    size_t width = wide ? 4 : 2;
    if (magic != CDDP_TOKENS_MAGIC && !wide) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: magic %" PRIu32 ", expected %d or %d (llm.c's token files; make "
                            "one from text with cddp-tokenize)",
                            path, magic, CDDP_TOKENS_MAGIC, WIDE_MAGIC);
        goto out;
    }
    if (version != (wide ? WIDE_VERSION : CDDP_TOKENS_VERSION)) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: version %" PRIu32 ", only version %d (%s tokens) is known for "
                            "magic %" PRIu32,
                            path, version, wide ? WIDE_VERSION : CDDP_TOKENS_VERSION,
                            wide ? "uint32" : "uint16", magic);
        goto out;
    }
    if (count < 0) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: negative token count %" PRId64, path, count);
        goto out;
    }
    if (vocab < 0 || (!wide && vocab > 65536)) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: a vocabulary of %" PRId64 " tokens recorded for %s tokens", path,
                            vocab, wide ? "uint32" : "uint16");
        goto out;
    }
    int64_t expect = HEADER_BYTES + (int64_t)width * count;
    if (size != expect) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: %s: the header promises %" PRId64 " tokens (%" PRId64
                            " bytes in all), the file holds %" PRId64 " bytes",
                            path, size < expect ? "truncated" : "trailing bytes", count, expect,
                            size);
        goto out;
    }
    out->vocab_size = vocab;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (count > 0) { /* the file's pages are the tokens: mapped, shared until written */
        void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fileno(f), 0);
        if (map == MAP_FAILED) {
            rc = cddp_error_set(err, errno == ENOMEM ? CDDP_ENOMEM : CDDP_EIO,
                                "%s: cannot map its %" PRId64 " bytes: %s", path, size,
                                strerror(errno));
            goto out;
        }
        void *at = (uint8_t *)map + HEADER_BYTES;
        *out = (cddp_tokens){.count = count,
                             .data = wide ? NULL : at,
                             .wide = wide ? at : NULL,
                             .vocab_size = vocab,
                             .map = map,
                             .map_bytes = (size_t)size};
        goto out;
    }
#endif
    uint8_t *b = cddp_malloc(count ? (size_t)count * width : 1);
    if (!b) {
        rc =
            cddp_error_set(err, CDDP_ENOMEM, "%s: cannot allocate %" PRId64 " tokens", path, count);
        goto out;
    }
    *(wide ? (void **)&out->wide : (void **)&out->data) = b;
    if ((rc = read_all(f, path, b, (size_t)count * width, err)) != CDDP_OK) goto out;
    for (int64_t i = 0; i < count; i++) /* in place, from little-endian */
        if (wide)
            out->wide[i] = le32(b + 4 * i);
        else
            out->data[i] = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
    out->count = count;
out:
    fclose(f);
    if (rc != CDDP_OK) cddp_tokens_free(out);
    return rc;
}

int cddp_tokens_write(const char *path, const cddp_tokens *t, cddp_error *err) {
    if (t->count < 0 || t->count > INT32_MAX)
        return cddp_error_set(err, CDDP_ERANGE,
                              "%s: %" PRId64 " tokens; a token file holds 0 to %d (an int32 count)",
                              path, t->count, INT32_MAX);
    bool wide = t->wide != NULL;
    if (t->vocab_size < 0 || t->vocab_size > INT32_MAX || (!wide && t->vocab_size > 65536))
        return cddp_error_set(err, CDDP_ERANGE,
                              "%s: a vocabulary of %" PRId64 " tokens for %s tokens", path,
                              t->vocab_size, wide ? "uint32" : "uint16");
    uint8_t header[HEADER_BYTES] = {0};
    put_le32(header, wide ? WIDE_MAGIC : CDDP_TOKENS_MAGIC);
    put_le32(header + 4, wide ? WIDE_VERSION : CDDP_TOKENS_VERSION);
    put_le32(header + 8, (uint32_t)t->count);
    put_le32(header + 12, (uint32_t)t->vocab_size);
    cddp__atomic_file af;
    CDDP_TRY(cddp__atomic_open(&af, path, err));
    int rc = cddp__atomic_write(&af, header, sizeof header, err);
    uint8_t chunk[8192];
    for (int64_t i = 0; rc == CDDP_OK && i < t->count;) {
        size_t n = 0;
        for (; n < sizeof chunk && i < t->count; i++)
            if (wide) {
                put_le32(chunk + n, t->wide[i]);
                n += 4;
            } else {
                chunk[n++] = (uint8_t)t->data[i];
                chunk[n++] = (uint8_t)(t->data[i] >> 8);
            }
        rc = cddp__atomic_write(&af, chunk, n, err);
    }
    return cddp__atomic_close(&af, rc, err);
}

/* The file's bytes in *bytes (*n of them; cddp_free it). */
static int read_bytes(const char *path, uint8_t **bytes, int64_t *n, cddp_error *err) {
    FILE *f;
    int64_t size;
    *bytes = NULL;
    CDDP_TRY(open_sized(path, "text file", &f, &size, err));
    int rc = CDDP_OK;
    if (!(*bytes = cddp_malloc(size ? (size_t)size : 1)))
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: cannot hold its %" PRId64 " bytes", path, size);
    else
        rc = read_all(f, path, *bytes, (size_t)size, err);
    fclose(f);
    if (rc != CDDP_OK) {
        cddp_free(*bytes);
        *bytes = NULL;
    }
    *n = size;
    return rc;
}

/* What to do with each text: fn(bytes, n, user). */
typedef int (*text_fn)(const uint8_t *bytes, int64_t n, void *user, cddp_error *err);

static int name_order(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The folder's file names that do not start with a dot, sorted (*names, *n; free each). */
static int list_folder(const char *dir, char ***names, int *n, cddp_error *err) {
    DIR *d = opendir(dir);
    *names = NULL;
    *n = 0;
    if (!d) return cddp_error_set(err, CDDP_EIO, "cannot read folder %s: %s", dir, strerror(errno));
    int cap = 0, rc = CDDP_OK;
    for (struct dirent *e; rc == CDDP_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = cddp_realloc(*names, (size_t)cap * sizeof **names);
            if (!grown) {
                rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory listing %s", dir);
                break;
            }
            *names = grown;
        }
        (*names)[*n] = cddp_malloc(strlen(e->d_name) + 1);
        if (!(*names)[*n])
            rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory listing %s", dir);
        else
            strcpy((*names)[(*n)++], e->d_name);
    }
    closedir(d);
    if (rc == CDDP_OK && *n > 1) qsort(*names, (size_t)*n, sizeof **names, name_order);
    return rc;
}

/* fn over the text of path: a file, or every regular file of a folder that holds text (no NUL
 * byte), in name order (symbolic links skipped, so that a file linked twice counts once). */
static int each_text(const char *path, text_fn fn, void *user, cddp_error *err) {
    struct stat st;
    uint8_t *bytes;
    int64_t n;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        CDDP_TRY(read_bytes(path, &bytes, &n, err));
        int rc = fn(bytes, n, user, err);
        cddp_free(bytes);
        return rc;
    }
    char **names;
    int count, files = 0;
    int rc = list_folder(path, &names, &count, err);
    for (int i = 0; i < count && rc == CDDP_OK; i++) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", path, names[i]);
        if (lstat(file, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if ((rc = read_bytes(file, &bytes, &n, err)) != CDDP_OK) break;
        if (!memchr(bytes, 0, (size_t)n)) {
            rc = fn(bytes, n, user, err);
            files++;
        }
        cddp_free(bytes);
    }
    for (int i = 0; i < count; i++) cddp_free(names[i]);
    cddp_free(names);
    if (rc == CDDP_OK && files == 0)
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: no text file in this folder", path);
    return rc;
}

/* Room for n more tokens in t (16 or 32 bits, as t holds them), *cap its capacity. */
static int reserve(cddp_tokens *t, int64_t n, int64_t *cap, bool wide, cddp_error *err) {
    if (t->count + n <= *cap) return CDDP_OK;
    int64_t want = CDDP_MAX(2 * *cap, t->count + n);
    void **p = wide ? (void **)&t->wide : (void **)&t->data;
    void *grown = cddp_realloc(*p, (size_t)want * (wide ? 4 : 2));
    if (!grown)
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %" PRId64 " tokens", want);
    *p = grown;
    *cap = want;
    return CDDP_OK;
}

typedef struct gather {
    cddp_tokens *out;
    int64_t cap;
    const cddp_tokenizer *tok; /* NULL: the byte tokenizer */
} gather;

static int gather_text(const uint8_t *bytes, int64_t n, void *user, cddp_error *err) {
    gather *g = user;
    cddp_tokens *t = g->out;
    if (!g->tok) {
        CDDP_TRY(reserve(t, n, &g->cap, false, err));
        for (int64_t i = 0; i < n; i++) t->data[t->count++] = bytes[i];
        return CDDP_OK;
    }
    int32_t *ids;
    int64_t count;
    CDDP_TRY(cddp_tokenizer_encode(g->tok, (const char *)bytes, (size_t)n, &ids, &count, err));
    int64_t eos = cddp_tokenizer_eos(g->tok);
    bool wide = t->wide != NULL;
    int rc = reserve(t, count + (eos >= 0), &g->cap, wide, err);
    if (rc == CDDP_OK && eos >= 0) { /* each text starts with it, as llm.c's documents */
        if (wide)
            t->wide[t->count++] = (uint32_t)eos;
        else
            t->data[t->count++] = (uint16_t)eos;
    }
    for (int64_t i = 0; rc == CDDP_OK && i < count; i++)
        if (wide)
            t->wide[t->count++] = (uint32_t)ids[i];
        else
            t->data[t->count++] = (uint16_t)ids[i];
    cddp_free(ids);
    return rc;
}

/* The text of path as tokens, each byte one (tok NULL) or encoded with tok. */
static int gather_path(const char *path, const cddp_tokenizer *tok, cddp_tokens *out,
                       cddp_error *err) {
    memset(out, 0, sizeof *out);
    gather g = {.out = out, .tok = tok};
    out->vocab_size = tok ? cddp_tokenizer_vocab_size(tok) : 256;
    bool wide = out->vocab_size > 65536;
    int rc = reserve(out, 1, &g.cap, wide, err); /* never NULL, even for no text */
    if (rc == CDDP_OK) rc = each_text(path, gather_text, &g, err);
    if (rc != CDDP_OK) cddp_tokens_free(out);
    return rc;
}

int cddp_tokens_from_text(const char *path, cddp_tokens *out, cddp_error *err) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return cddp_error_set(err, CDDP_EIO,
                              "%s: a folder, not a text file (cddp_tokens_load "
                              "reads folders)",
                              path);
    return gather_path(path, NULL, out, err);
}

int cddp_tokens_encode(const cddp_tokenizer *tok, const char *path, cddp_tokens *out,
                       cddp_error *err) {
    return gather_path(path, tok, out, err);
}

int cddp_tokens_load(const char *path, cddp_tokens *out, cddp_error *err) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return gather_path(path, NULL, out, err);
    FILE *f;
    int64_t size;
    CDDP_TRY(open_sized(path, "data file", &f, &size, err));
    uint8_t head[4] = {0};
    bool binary = size >= 4 && fread(head, 1, 4, f) == 4 &&
                  (le32(head) == CDDP_TOKENS_MAGIC || le32(head) == WIDE_MAGIC);
    fclose(f);
    return binary ? cddp_tokens_read(path, out, err) : cddp_tokens_from_text(path, out, err);
}
