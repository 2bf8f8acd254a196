/* idx.c: the IDX reader and (Fashion-)MNIST loading (the format is described in cddp/data.h).
 *
 * zlib's gzread reads gzip and plain files through one interface, so the reader does not care
 * which it was given. The header is validated before the data is allocated: the size implied by
 * the dimensions must be sane and must match what the file holds, byte for byte.
 */
#include "cddp/data.h"
#include "cddp/core.h"
#include "data/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

static size_t idx_elem_size(int type) {
    switch (type) {
    case CDDP_IDX_U8:
    case CDDP_IDX_I8:
        return 1;
    case CDDP_IDX_I16:
        return 2;
    case CDDP_IDX_I32:
    case CDDP_IDX_F32:
        return 4;
    case CDDP_IDX_F64:
        return 8;
    }
    return 0;
}

/* Reads exactly n bytes; returns the count read, or -1 on a zlib error (message in *why). */
static int64_t gz_read_full(gzFile gz, void *buf, size_t n, const char **why) {
    size_t got = 0;
    while (got < n) {
        unsigned chunk = (unsigned)CDDP_MIN(n - got, (size_t)1 << 30);
        int r = gzread(gz, (char *)buf + got, chunk);
        if (r < 0) {
            int zerr;
            *why = gzerror(gz, &zerr);
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    /* gzread reports a truncated gzip stream at EOF via gzerror without failing the read. */
    int zerr = Z_OK;
    const char *msg = gzerror(gz, &zerr);
    if (zerr != Z_OK && zerr != Z_STREAM_END) {
        *why = msg;
        return -1;
    }
    return (int64_t)got;
}

static void byteswap(void *data, int64_t count, size_t size) {
    uint8_t *p = data;
    for (int64_t i = 0; i < count; i++, p += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* cddp_idx_read, or with first >= 0 its first `first` items along the first dimension only: the
 * file is read no further (nor checked beyond them). */
static int idx_read(const char *path, size_t max_bytes, int64_t first, cddp_idx *out,
                    cddp_error *err) {
    int rc = CDDP_OK;
    const char *why = "unexpected end of file";
    memset(out, 0, sizeof *out);
    if (max_bytes == 0) max_bytes = (size_t)16 << 30;
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s",
                              path, errno ? strerror(errno) : "zlib error");
    gzbuffer(gz, 1 << 18);
    uint8_t magic[4];
    if (gz_read_full(gz, magic, 4, &why) != 4) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: cannot read the IDX magic: %s", path, why);
        goto fail;
    }
    size_t esize = idx_elem_size(magic[2]);
    if (magic[0] != 0 || magic[1] != 0 || esize == 0 || magic[3] == 0 ||
        magic[3] > CDDP_IDX_MAX_DIMS) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: not an IDX file (magic %02x %02x %02x %02x; want 00 00, a type "
                            "of 08/09/0B/0C/0D/0E and 1..%d dimensions)",
                            path, magic[0], magic[1], magic[2], magic[3], CDDP_IDX_MAX_DIMS);
        goto fail;
    }
    out->type = (cddp_idx_type)magic[2];
    out->ndim = magic[3];
    out->elem_size = esize;
    uint8_t dims[4 * CDDP_IDX_MAX_DIMS];
    if (gz_read_full(gz, dims, 4 * (size_t)out->ndim, &why) != 4 * out->ndim) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: the header is cut short: %s", path, why);
        goto fail;
    }
    uint64_t count = 1;
    for (int i = 0; i < out->ndim; i++) {
        uint64_t d = (uint64_t)dims[4 * i] << 24 | (uint64_t)dims[4 * i + 1] << 16 |
                     (uint64_t)dims[4 * i + 2] << 8 | dims[4 * i + 3];
        out->dims[i] = (int64_t)d;
        if (d != 0 && count > max_bytes / esize / d) {
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s: dimension %d (%" PRIu64 ") makes the data larger than %zu "
                                "bytes; the header is corrupt or the file is not IDX",
                                path, i, d, max_bytes);
            goto fail;
        }
        count *= d;
    }
    bool partial = first >= 0 && first < out->dims[0];
    if (partial) { /* dims[0] > first >= 0, so it divides count */
        count = count / (uint64_t)out->dims[0] * (uint64_t)first;
        out->dims[0] = first;
    }
    out->count = (int64_t)count;
    size_t bytes = (size_t)count * esize;
    /* The memory grows with the data actually read (doubling from 64 MiB), not with what the
     * header claims: a small file that promises gigabytes costs no more than its own size. */
    int64_t got = 0;
    for (size_t cap = 0; rc == CDDP_OK && (size_t)got == cap && cap < bytes;) {
        size_t want = CDDP_MIN(bytes, cap ? 2 * cap : (size_t)64 << 20);
        uint8_t *grown = cddp_realloc(out->data, want ? want : 1);
        if (!grown) {
            rc = cddp_error_set(err, CDDP_ENOMEM, "%s: cannot allocate %zu bytes", path, want);
            goto fail;
        }
        out->data = grown;
        int64_t r = gz_read_full(gz, grown + cap, want - cap, &why);
        got = r < 0 ? -1 : (int64_t)cap + r;
        cap = want;
        if (r < 0) break;
    }
    if (!out->data && !(out->data = cddp_malloc(1))) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (got < 0 || (size_t)got != bytes) {
        if (got < 0)
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s: corrupt data: %s", path, why);
        else
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s: truncated: the header promises %zu data bytes but the file "
                                "holds %" PRId64,
                                path, bytes, got);
        goto fail;
    }
    uint8_t extra;
    got = partial ? 0 : gz_read_full(gz, &extra, 1, &why);
    if (got != 0) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: %s after the %zu data bytes the header "
                            "promises",
                            path, got < 0 ? why : "extra bytes", bytes);
        goto fail;
    }
    gzclose(gz);
    if (esize > 1) byteswap(out->data, out->count, esize);
    return CDDP_OK;
fail:
    gzclose(gz);
    cddp_idx_free(out);
    return rc;
}

int cddp_idx_read(const char *path, size_t max_bytes, cddp_idx *out, cddp_error *err) {
    return idx_read(path, max_bytes, -1, out, err);
}

void cddp_idx_free(cddp_idx *idx) {
    if (!idx) return;
    cddp_free(idx->data);
    memset(idx, 0, sizeof *idx);
}

/* Opens dir/name.gz, falling back to dir/name. */
static int read_either(const char *dir, const char *name, int64_t first, cddp_idx *out,
                       cddp_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.gz", dir, name);
    int rc = idx_read(path, 0, first, out, err);
    if (rc != CDDP_ENOENT) return rc;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    rc = idx_read(path, 0, first, out, err);
    if (rc == CDDP_ENOENT)
        cddp_error_set(err, rc,
                       "%s/%s(.gz) not found; install Debian's dataset-fashion-mnist or "
                       "point --data / CDDP_DATA at a folder with the IDX files",
                       dir, name);
    return rc;
}

int cddp_mnist_load(const char *dir, bool train, cddp_mnist *out, cddp_error *err) {
    return cddp__mnist_load(dir, train, -1, out, err);
}

int cddp__mnist_load(const char *dir, bool train, int64_t first, cddp_mnist *out, cddp_error *err) {
    memset(out, 0, sizeof *out);
    if (!dir) dir = cddp_knob_str(CDDP_KNOB_DATA);
    const char *split = train ? "train" : "t10k";
    char name[64];
    cddp_idx im = {0}, lb = {0};
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    int rc = read_either(dir, name, first, &im, err);
    if (rc) return rc;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    rc = read_either(dir, name, first, &lb, err);
    if (rc) goto fail;
    if (im.type != CDDP_IDX_U8 || im.ndim != 3 || lb.type != CDDP_IDX_U8 || lb.ndim != 1) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: %s files must be uint8 images (N,rows,cols) "
                            "and uint8 labels (N)",
                            dir, split);
        goto fail;
    }
    if (im.dims[0] != lb.dims[0]) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: %" PRId64 " %s images but %" PRId64 " labels",
                            dir, im.dims[0], split, lb.dims[0]);
        goto fail;
    }
    for (int64_t i = 0; i < lb.count; i++)
        if (((uint8_t *)lb.data)[i] > 9) {
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s: %s label %" PRId64 " is %d, not 0..9", dir,
                                split, i, ((uint8_t *)lb.data)[i]);
            goto fail;
        }
    if (im.dims[1] != 28 || im.dims[2] != 28) { /* 784 pixels in another shape: scrambled */
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: %s images are %" PRId64 "x%" PRId64 "; (Fashion-)MNIST's are "
                            "28x28",
                            dir, split, im.dims[1], im.dims[2]);
        goto fail;
    }
    out->n = im.dims[0];
    out->rows = im.dims[1];
    out->cols = im.dims[2];
    out->images = im.data;
    out->labels = lb.data;
    return CDDP_OK;
fail:
    cddp_idx_free(&im);
    cddp_idx_free(&lb);
    return rc;
}

void cddp_mnist_free(cddp_mnist *ds) {
    if (!ds) return;
    cddp_free(ds->images);
    cddp_free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

void cddp_mnist_normalize(const cddp_mnist *ds, int64_t first, int64_t count, float mean, float std,
                          float *dst) {
    CDDP_CHECK(first >= 0 && count >= 0 && first + count <= ds->n,
               "images [%lld, %lld) out of range for %lld", (long long)first,
               (long long)(first + count), (long long)ds->n);
    int64_t px = ds->rows * ds->cols;
    const uint8_t *src = ds->images + first * px;
    float scale = 1.0f / (255.0f * std), shift = mean / std;
    for (int64_t i = 0; i < count * px; i++) dst[i] = (float)src[i] * scale - shift;
}
