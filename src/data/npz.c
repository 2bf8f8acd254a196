/* npz.c: a member of a zip archive, as NumPy's .npz files hold their arrays (np.savez stores them,
 * np.savez_compressed deflates them), for cddp_dataset_from_files's ARCHIVE:NAME fields.
 *
 * A zip file ends with the end-of-central-directory record (22 bytes and a comment of up to 64
 * KiB), which says where the central directory is: a record per member with its name, compression,
 * sizes and where its local header is; the member's data follow that local header (30 bytes, the
 * name and an extra field of the local header's own lengths). Sizes or offsets past 4 GiB live in
 * the ZIP64 extra field (id 1) of the member's record, and the directory's own in the ZIP64
 * end-of-central-directory record, found through its locator just before the end record. Every
 * length and offset is checked against the file before it is used. A stored member is read from
 * the file where it lies; a deflated one is inflated into memory once (zlib, raw deflate) and its
 * CRC-32 checked.
 */
#include "cddp/core.h"
#include "data/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define EOCD_SIG     0x06054b50u
#define EOCD64_SIG   0x06064b50u
#define LOCATOR_SIG  0x07064b50u
#define CENTRAL_SIG  0x02014b50u
#define LOCAL_SIG    0x04034b50u
#define NO32         0xffffffffu
#define MAX_DIR_SIZE ((uint64_t)64 << 20)

static uint32_t le16(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
static uint32_t le32(const uint8_t *p) {
    return le16(p) | le16(p + 2) << 16;
}
static uint64_t le64(const uint8_t *p) {
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

int cddp__read_exact(int fd, void *dst, size_t n, uint64_t at) {
    for (size_t got = 0; got < n;) {
        ssize_t k = pread(fd, (char *)dst + got, n - got, (off_t)(at + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? -1 : 1;
        got += (size_t)k;
    }
    return CDDP_OK;
}

static int read_at(int fd, void *dst, size_t n, uint64_t at, const char *path, cddp_error *err) {
    int r = cddp__read_exact(fd, dst, n, at);
    if (r == CDDP_OK) return CDDP_OK;
    return cddp_error_set(err, r < 0 ? CDDP_EIO : CDDP_EFORMAT, "%s: %s", path,
                          r < 0 ? strerror(errno) : "the zip archive ends early");
}

/* zlib's CRC-32 of n bytes (its counts are 32-bit: in pieces) */
static uint32_t crc_of(const uint8_t *p, uint64_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    for (uint64_t k; n; p += k, n -= k) {
        k = CDDP_MIN(n, (uint64_t)1 << 30);
        c = crc32(c, p, (uInt)k);
    }
    return (uint32_t)c;
}

static int damaged(const char *path, const char *what, cddp_error *err) {
    return cddp_error_set(err, CDDP_EFORMAT, "%s: %s (a damaged .npz or zip file?)", path, what);
}

bool cddp__zip_is(int fd) {
    uint8_t sig[4];
    return pread(fd, sig, 4, 0) == 4 && le32(sig) == LOCAL_SIG;
}

/* Where the central directory is: *at, *size bytes, *count records. */
static int directory(int fd, uint64_t file, const char *path, uint64_t *at, uint64_t *size,
                     uint64_t *count, cddp_error *err) {
    size_t tail = (size_t)CDDP_MIN(file, (uint64_t)22 + 65535);
    uint8_t *t = cddp_malloc(tail);
    if (!t) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    int rc = read_at(fd, t, tail, file - tail, path, err);
    int64_t e = -1; /* the end record: the last signature whose comment reaches the end */
    for (int64_t k = (int64_t)tail - 22; !rc && k >= 0 && e < 0; k--)
        if (le32(t + k) == EOCD_SIG && (uint64_t)k + 22 + le16(t + k + 20) == tail) e = k;
    if (!rc && e < 0) rc = damaged(path, "no end of central directory", err);
    if (!rc) {
        *count = le16(t + e + 10);
        *size = le32(t + e + 12);
        *at = le32(t + e + 16);
        /* ZIP64: the locator, 20 bytes before the end record, points at the larger record */
        uint64_t end_at = file - tail + (uint64_t)e;
        if (end_at >= 20 && (*count == 0xffff || *size == NO32 || *at == NO32)) {
            uint8_t loc[20], rec[56];
            rc = read_at(fd, loc, 20, end_at - 20, path, err);
            if (!rc && le32(loc) != LOCATOR_SIG)
                rc = damaged(path, "a ZIP64 archive without its locator", err);
            uint64_t r = rc ? 0 : le64(loc + 8);
            if (!rc && r + 56 > end_at)
                rc = damaged(path, "the ZIP64 end record is out of the file", err);
            if (!rc) rc = read_at(fd, rec, 56, r, path, err);
            if (!rc && le32(rec) != EOCD64_SIG)
                rc = damaged(path, "no ZIP64 end of central directory", err);
            if (!rc) *count = le64(rec + 32), *size = le64(rec + 40), *at = le64(rec + 48);
        }
    }
    cddp_free(t);
    if (!rc && (*size > MAX_DIR_SIZE || *at > file || *size > file - *at))
        rc = damaged(path, "its central directory is out of the file", err);
    return rc;
}

/* Member `want`'s record in the directory d (size bytes, count records): compression, flags,
 * CRC-32, sizes and local header's offset (ZIP64's where a field is full). CDDP_ENOENT when no
 * member has that name, with names (cap bytes) listing the .npy members. */
typedef struct record {
    uint32_t method, flags, crc;
    uint64_t csize, usize, local;
} record;

static int find(const uint8_t *d, uint64_t size, uint64_t count, const char *path, const char *want,
                record *out, char *names, size_t cap, cddp_error *err) {
    size_t at = 0, listed = 0, wl = strlen(want);
    names[0] = '\0';
    for (uint64_t i = 0; i < count; i++) {
        if (size - at < 46 || le32(d + at) != CENTRAL_SIG)
            return damaged(path, "a central directory record is cut short", err);
        const uint8_t *r = d + at;
        size_t nl = le16(r + 28), xl = le16(r + 30), cl = le16(r + 32);
        if (size - at - 46 < nl + xl + cl)
            return damaged(path, "a central directory record is cut short", err);
        const char *name = (const char *)r + 46;
        if (nl == wl && memcmp(name, want, wl) == 0) {
            *out = (record){.method = le16(r + 10),
                            .flags = le16(r + 8),
                            .crc = le32(r + 16),
                            .csize = le32(r + 20),
                            .usize = le32(r + 24),
                            .local = le32(r + 42)};
            /* the ZIP64 extra field: 8 bytes for each of usize, csize, local that is full */
            const uint8_t *x = r + 46 + nl, *xe = x + xl;
            while (xe - x >= 4) {
                size_t len = le16(x + 2);
                if ((size_t)(xe - x) - 4 < len) break;
                if (le16(x) == 1) {
                    const uint8_t *v = x + 4, *ve = v + len;
                    uint64_t *f[3] = {&out->usize, &out->csize, &out->local};
                    for (int k = 0; k < 3; k++)
                        if (*f[k] == NO32) {
                            if (ve - v < 8)
                                return damaged(path, "a ZIP64 extra field is cut short", err);
                            *f[k] = le64(v);
                            v += 8;
                        }
                }
                x += 4 + len;
            }
            return CDDP_OK;
        }
        if (nl > 4 && memcmp(name + nl - 4, ".npy", 4) == 0 && listed + nl < cap)
            listed += (size_t)snprintf(names + listed, cap - listed, "%s%.*s", listed ? ", " : "",
                                       (int)nl - 4, name);
        at += 46 + nl + xl + cl;
    }
    return CDDP_ENOENT;
}

int cddp__zip_find(int fd, const char *path, const char *name, cddp__zip_member *m, char *names,
                   size_t cap, cddp_error *err) {
    *m = (cddp__zip_member){0};
    struct stat st;
    if (fstat(fd, &st) != 0) return cddp_error_set(err, CDDP_EIO, "%s: %s", path, strerror(errno));
    uint64_t file = (uint64_t)st.st_size, at = 0, size = 0, count = 0;
    if (file < 22) return damaged(path, "too short for a zip archive", err);
    CDDP_TRY(directory(fd, file, path, &at, &size, &count, err));
    uint8_t *d = cddp_malloc(size ? size : 1);
    if (!d) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    char want[300];
    snprintf(want, sizeof want, "%s%s", name,
             strlen(name) > 4 && !strcmp(name + strlen(name) - 4, ".npy") ? "" : ".npy");
    record r = {0};
    int rc = read_at(fd, d, size, at, path, err);
    if (!rc) rc = find(d, size, count, path, want, &r, names, cap, err);
    cddp_free(d);
    if (rc == CDDP_ENOENT)
        return cddp_error_set(err, CDDP_ENOENT, "%s holds no array '%s' (it holds %s)", path, name,
                              names[0] ? names : "none");
    if (rc) return rc;
    if (r.flags & 1)
        return cddp_error_set(err, CDDP_EUNSUPPORTED, "%s: '%s' is encrypted", path, want);
    if (r.method != 0 && r.method != 8)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s: '%s' is compressed by method %u; cddp reads stored (np.savez) "
                              "and deflated (np.savez_compressed) arrays",
                              path, want, r.method);
    uint8_t local[30];
    if (r.local > file || file - r.local < 30)
        return damaged(path, "a local header is out of the file", err);
    CDDP_TRY(read_at(fd, local, 30, r.local, path, err));
    if (le32(local) != LOCAL_SIG) return damaged(path, "a local header has no signature", err);
    uint64_t data = r.local + 30 + le16(local + 26) + le16(local + 28);
    if (data > file || r.csize > file - data)
        return damaged(path, "a member's data run past the end of the file", err);
    m->size = r.usize;
    if (r.method == 0) {
        if (r.csize != r.usize) return damaged(path, "a stored member's two sizes differ", err);
        m->offset = data;
        return CDDP_OK;
    }
    /* deflated: the whole member into memory, checked against its CRC-32; deflate gives at most
     * 1032 bytes a byte, so a larger size is a damaged (or crafted) record, not an allocation */
    if (r.usize / 1032 > r.csize + 1)
        return damaged(path, "a compressed member claims more than deflate can hold", err);
    uint8_t *in = cddp_malloc(r.csize ? r.csize : 1), *out = cddp_malloc(r.usize ? r.usize : 1);
    if (!in || !out) {
        cddp_free(in);
        cddp_free(out);
        return cddp_error_set(err, CDDP_ENOMEM,
                              "%s: '%s' is compressed (np.savez_compressed): inflating its %" PRIu64
                              " bytes needs that much memory; np.savez stores it, and cddp then "
                              "reads it from the file",
                              path, want, r.usize);
    }
    rc = read_at(fd, in, r.csize, data, path, err);
    z_stream z = {0};
    if (!rc && inflateInit2(&z, -MAX_WBITS) != Z_OK)
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: cannot start zlib", path);
    if (!rc) {
        int zr = Z_OK;
        uint64_t done_in = 0, done_out = 0;
        while (zr == Z_OK) { /* zlib's counts are 32-bit: in pieces */
            z.next_in = in + done_in;
            z.avail_in = (uInt)CDDP_MIN(r.csize - done_in, (uint64_t)1 << 30);
            z.next_out = out + done_out;
            z.avail_out = (uInt)CDDP_MIN(r.usize - done_out, (uint64_t)1 << 30);
            uInt ai = z.avail_in, ao = z.avail_out;
            zr = inflate(&z, Z_NO_FLUSH);
            done_in += ai - z.avail_in;
            done_out += ao - z.avail_out;
            if (zr == Z_OK && ai == z.avail_in && ao == z.avail_out) zr = Z_DATA_ERROR;
        }
        inflateEnd(&z);
        if (zr != Z_STREAM_END || done_out != r.usize)
            rc = damaged(path, "a compressed member does not inflate to its size", err);
        else if (crc_of(out, r.usize) != r.crc)
            rc = damaged(path, "a compressed member fails its CRC-32", err);
    }
    cddp_free(in);
    if (rc) {
        cddp_free(out);
        return rc;
    }
    m->data = out;
    return CDDP_OK;
}
