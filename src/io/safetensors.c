/* safetensors.c: reading and writing the safetensors format (see cddp/checkpoint.h).
 *
 * The reader trusts nothing: the header length is checked against the file size before any
 * allocation, the JSON is parsed with cJSON, and every entry's dtype, shape and byte range is
 * checked against the data section, so a truncated or corrupt file is an error that names the
 * file and the entry, never a crash. The data section is read into a 64-byte aligned buffer so
 * that tensors can be used in place.
 */
#include "cddp/checkpoint.h"
#include "cddp/core.h"
#include "io/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little endian");

#define MAX_HEADER (100u << 20) /* the format's own limit on the JSON header */

struct cddp_safetensors {
    cddp_st_tensor *tensors;
    int n;
    char **meta; /* key, value pairs */
    int nmeta;
    void *data;
};

static const char *st_dtype(cddp_dtype d) {
    return d == CDDP_F32    ? "F32"
           : d == CDDP_I32  ? "I32"
           : d == CDDP_BF16 ? "BF16"
           : d == CDDP_F16  ? "F16"
                            : "I64";
}

static int parse_dtype(const char *s, cddp_dtype *d) {
    if (strcmp(s, "F32") == 0)
        *d = CDDP_F32;
    else if (strcmp(s, "I32") == 0)
        *d = CDDP_I32;
    else if (strcmp(s, "I64") == 0)
        *d = CDDP_I64;
    else if (strcmp(s, "BF16") ==
             0) /* Hugging Face's weights, often: the GPT's loader reads them */
        *d = CDDP_BF16;
    else if (strcmp(s, "F16") == 0) /* half the GPT-2 checkpoints people have */
        *d = CDDP_F16;
    else
        return -1;
    return 0;
}

static int64_t numel_of(const cddp_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int cddp_safetensors_write(const char *path, const cddp_st_tensor *tensors, int n,
                           const char *const *metadata, cddp_error *err) {
    return cddp__safetensors_write(path, tensors, n, metadata, NULL, NULL, err);
}

int cddp__safetensors_write(const char *path, const cddp_st_tensor *tensors, int n,
                            const char *const *metadata, uint64_t *bytes_out, uint32_t *crc_out,
                            cddp_error *err) {
    int rc = CDDP_OK;
    char *json = NULL, *header = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    if (metadata && metadata[0]) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta && metadata[i]; i += 2) {
            if (!metadata[i + 1]) {
                rc = cddp_error_set(err, CDDP_EINVAL, "%s: metadata key '%s' has no value", path,
                                    metadata[i]);
                goto out;
            }
            cJSON_AddStringToObject(meta, metadata[i], metadata[i + 1]);
        }
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = &tensors[i];
        if (strcmp(t->name, "__metadata__") == 0 ||
            cJSON_GetObjectItemCaseSensitive(root, t->name)) {
            rc = cddp_error_set(err, CDDP_EINVAL, "%s: tensor name '%s' is reserved or repeated",
                                path, t->name);
            goto out;
        }
        uint64_t bytes = (uint64_t)numel_of(t) * cddp_dtype_size(t->dtype);
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = shape ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        if (!offs || !cJSON_AddStringToObject(e, "dtype", st_dtype(t->dtype))) {
            rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
        offset += bytes;
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    /* Pad the header with spaces so the data starts 8-byte aligned, as the format recommends. */
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    header = cddp_malloc(8 + padded);
    if (!header) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    uint64_t hl = padded;
    memcpy(header, &hl, 8);
    memcpy(header + 8, json, len);
    memset(header + 8 + len, ' ', padded - len);
    cddp__atomic_file af;
    rc = cddp__atomic_open(&af, path, err);
    if (rc) goto out;
    rc = cddp__atomic_write(&af, header, 8 + padded, err);
    for (int i = 0; rc == CDDP_OK && i < n; i++)
        rc = cddp__atomic_write(&af, tensors[i].data,
                                (size_t)numel_of(&tensors[i]) * cddp_dtype_size(tensors[i].dtype),
                                err);
    if (bytes_out) *bytes_out = af.bytes;
    if (crc_out) *crc_out = af.crc32;
    rc = cddp__atomic_close(&af, rc, err);
out:
    cddp_free(header);
    cJSON_free(json);
    cJSON_Delete(root);
    return rc;
}

void cddp_safetensors_destroy(cddp_safetensors *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) cddp_free((char *)f->tensors[i].name);
    for (int i = 0; i < 2 * f->nmeta; i++) cddp_free(f->meta[i]);
    cddp_free(f->tensors);
    cddp_free(f->meta);
    cddp_aligned_free(f->data);
    cddp_free(f);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that a tensor or a metadata key uses twice, in *twice (NULL: none), sorting a
 * list of the names (a crafted header may hold very many). CDDP_ENOMEM without memory for it. */
static int first_repeat(const cddp_safetensors *f, const char **twice) {
    *twice = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? f->nmeta : f->n;
        if (n < 2) continue;
        const char **names = cddp_malloc(sizeof *names * (size_t)n);
        if (!names) return CDDP_ENOMEM;
        for (int i = 0; i < n; i++) names[i] = pass ? f->meta[2 * i] : f->tensors[i].name;
        qsort(names, (size_t)n, sizeof *names, by_name);
        for (int i = 1; i < n && !*twice; i++)
            if (strcmp(names[i - 1], names[i]) == 0) *twice = names[i];
        cddp_free(names);
        if (*twice) return CDDP_OK;
    }
    return CDDP_OK;
}

/* The byte range of tensor t, whose data is still an offset into the data section. */
static uint64_t st_begin(const cddp_st_tensor *t) {
    return (uint64_t)(uintptr_t)t->data;
}
static uint64_t st_end(const cddp_st_tensor *t) {
    return st_begin(t) + (uint64_t)numel_of(t) * cddp_dtype_size(t->dtype);
}
static int by_begin(const void *a, const void *b) {
    uint64_t x = st_begin(*(const cddp_st_tensor *const *)a),
             y = st_begin(*(const cddp_st_tensor *const *)b);
    return (x > y) - (x < y);
}

/* Two tensors whose bytes overlap, in *a and *b (NULL: none): the format gives each tensor bytes
 * of its own, and a writer never shares them, so a file that does is damaged or crafted (writing
 * one tensor would change the other). Empty tensors overlap nothing. CDDP_ENOMEM without memory. */
static int first_overlap(const cddp_safetensors *f, const cddp_st_tensor **a,
                         const cddp_st_tensor **b) {
    *a = *b = NULL;
    if (f->n < 2) return CDDP_OK;
    const cddp_st_tensor **by = cddp_malloc(sizeof *by * (size_t)f->n);
    if (!by) return CDDP_ENOMEM;
    int n = 0;
    for (int i = 0; i < f->n; i++)
        if (st_end(&f->tensors[i]) > st_begin(&f->tensors[i])) by[n++] = &f->tensors[i];
    qsort(by, (size_t)n, sizeof *by, by_begin);
    for (int i = 1; i < n && !*a; i++)
        if (st_begin(by[i]) < st_end(by[i - 1])) *a = by[i - 1], *b = by[i];
    cddp_free(by);
    return CDDP_OK;
}

/* A JSON number that is a non-negative integer representable exactly; -1 otherwise. */
static int64_t json_uint(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return -1;
    return (int64_t)d;
}

static int parse_entry(const char *path, const cJSON *e, uint64_t data_len, cddp_st_tensor *t,
                       cddp_error *err) {
    const char *name = e->string;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
        !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: tensor '%s' lacks dtype, shape or a "
                              "two-element data_offsets",
                              path, name);
    if (parse_dtype(dtype->valuestring, &t->dtype) != 0)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s: tensor '%s' has dtype %s; cddp reads "
                              "F32, BF16, F16, I32 and I64",
                              path, name, dtype->valuestring);
    int nd = cJSON_GetArraySize(shape);
    if (nd > CDDP_MAX_DIMS)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s: tensor '%s' has %d dimensions; cddp "
                              "reads up to %d",
                              path, name, nd, CDDP_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    for (int d = 0; d < nd; d++) {
        int64_t s = json_uint(cJSON_GetArrayItem(shape, d));
        if (s < 0 || (s > 0 && numel > UINT64_MAX / 16 / (uint64_t)s))
            return cddp_error_set(err, CDDP_EFORMAT, "%s: tensor '%s' has an invalid shape", path,
                                  name);
        t->shape[d] = s;
        numel *= (uint64_t)s;
    }
    int64_t b = json_uint(cJSON_GetArrayItem(offs, 0)),
            end = json_uint(cJSON_GetArrayItem(offs, 1));
    uint64_t want = numel * cddp_dtype_size(t->dtype);
    if (b < 0 || end < b || (uint64_t)end > data_len)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: tensor '%s' has data_offsets [%" PRId64 ", %" PRId64
                              "] outside the %" PRIu64 "-byte data section (is the "
                              "file truncated?)",
                              path, name, b, end, data_len);
    if ((uint64_t)(end - b) != want)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: tensor '%s' spans %" PRId64 " bytes but its "
                              "shape and dtype need %" PRIu64,
                              path, name, end - b, want);
    t->data = (const void *)(uintptr_t)b; /* an offset until the data is read */
    return CDDP_OK;
}

/* Parses and checks the header of the file open as fp; the tensors' data are offsets into the
 * data section, which starts at *data_start and is *data_len bytes long. */
/* The header's __metadata__ object e into f's key-value pairs (strings only). */
static int parse_metadata(const char *path, const cJSON *e, cddp_safetensors *f, cddp_error *err) {
    const cJSON *kv;
    if (!cJSON_IsObject(e)) {
        return cddp_error_set(err, CDDP_EFORMAT, "%s: __metadata__ is not an object", path);
    }
    int nkv = cJSON_GetArraySize(e);
    char **meta = cddp_realloc(f->meta, (size_t)(2 * nkv + 2) * sizeof *meta);
    if (!meta) {
        return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    }
    f->meta = meta;
    cJSON_ArrayForEach(kv, e) {
        if (!cJSON_IsString(kv)) {
            return cddp_error_set(err, CDDP_EFORMAT, "%s: metadata '%s' is not a string", path,
                                  kv->string);
        }
        f->meta[2 * f->nmeta] = cddp_strdup(kv->string);
        f->meta[2 * f->nmeta + 1] = cddp_strdup(kv->valuestring);
        if (!f->meta[2 * f->nmeta] || !f->meta[2 * f->nmeta + 1]) {
            cddp_free(f->meta[2 * f->nmeta]);
            cddp_free(f->meta[2 * f->nmeta + 1]);
            return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        }
        f->nmeta++;
    }
    return CDDP_OK;
}

/* Every name once, and every tensor's bytes its own in the data section. */
static int check_entries(const char *path, const cddp_safetensors *f, cddp_error *err) {
    /* A name twice (JSON allows it) would leave it open which tensor or value counts. */
    const char *twice = NULL;
    if (first_repeat(f, &twice) == CDDP_ENOMEM) {
        return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    }
    if (twice) {
        return cddp_error_set(err, CDDP_EFORMAT, "%s: '%s' appears twice in the header", path,
                              twice);
    }
    const cddp_st_tensor *x, *y;
    if (first_overlap(f, &x, &y) == CDDP_ENOMEM) {
        return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    }
    if (x) {
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: tensors '%s' (bytes %" PRIu64 "-%" PRIu64 ") and '%s' (bytes "
                              "%" PRIu64 "-%" PRIu64 ") overlap in the data section: each tensor "
                              "needs bytes of its own (a damaged file?)",
                              path, x->name, st_begin(x), st_end(x), y->name, st_begin(y),
                              st_end(y));
    }
    return CDDP_OK;
}

static cddp_safetensors *parse_header(const char *path, FILE *fp, uint64_t *data_start,
                                      uint64_t *data_len, cddp_error *err) {
    int rc = CDDP_OK;
    cJSON *root = NULL;
    char *header = NULL;
    cddp_safetensors *f = cddp_calloc(1, sizeof *f);
    if (!f) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    struct stat st;
    uint64_t hl = 0;
    if (fstat(fileno(fp), &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = cddp_error_set(err, CDDP_EINVAL, "%s is a folder, not a safetensors file", path);
        goto out;
    }
    if (fstat(fileno(fp), &st) != 0 || st.st_size < 8 || fread(&hl, 8, 1, fp) != 1) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: too short to be a safetensors file", path);
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (hl < 2 || hl > MAX_HEADER || hl > size - 8) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: header length %" PRIu64 " does not fit a "
                            "%" PRIu64 "-byte file (not safetensors, or truncated)",
                            path, hl, size);
        goto out;
    }
    header = cddp_malloc(hl + 1);
    if (!header || fread(header, 1, hl, fp) != hl) {
        rc = cddp_error_set(err, header ? CDDP_EIO : CDDP_ENOMEM, "%s: cannot read the header",
                            path);
        goto out;
    }
    header[hl] = '\0';
    root = cJSON_ParseWithLength(header, hl);
    if (!cJSON_IsObject(root)) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: the header is not a JSON object", path);
        goto out;
    }
    *data_start = 8 + hl;
    *data_len = size - 8 - hl;
    int count = cJSON_GetArraySize(root);
    f->tensors = cddp_calloc((size_t)count, sizeof *f->tensors);
    f->meta = cddp_calloc((size_t)count * 2 + 2, sizeof *f->meta);
    if (!f->tensors || !f->meta) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    const cJSON *e;
    int seen_meta = 0;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta++) { /* JSON allows a key twice; which one would count? */
                rc = cddp_error_set(err, CDDP_EFORMAT, "%s: __metadata__ appears twice", path);
                goto out;
            }
            rc = parse_metadata(path, e, f, err);
            if (rc) goto out;
            continue;
        }
        cddp_st_tensor *t = &f->tensors[f->n];
        rc = parse_entry(path, e, *data_len, t, err);
        if (rc) goto out;
        if (!(t->name = cddp_strdup(e->string))) {
            rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        f->n++;
    }
    rc = check_entries(path, f, err);
out:
    cJSON_Delete(root);
    cddp_free(header);
    if (rc != CDDP_OK) {
        cddp_safetensors_destroy(f);
        return NULL;
    }
    return f;
}

static FILE *open_file(const char *path, cddp_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s", path,
                       strerror(errno));
    return fp;
}

cddp_safetensors *cddp__safetensors_index_fd(int fd, const char *path, uint64_t *data_start,
                                             uint64_t *size, cddp_error *err) {
    *data_start = *size = 0;
    int own = dup(fd);
    FILE *fp = own >= 0 ? fdopen(own, "rb") : NULL;
    if (!fp) {
        if (own >= 0) close(own);
        cddp_error_set(err, CDDP_EIO, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    uint64_t len = 0;
    cddp_safetensors *f =
        fseek(fp, 0, SEEK_SET) == 0 ? parse_header(path, fp, data_start, &len, err) : NULL;
    if (!f && err && !err->msg[0])
        cddp_error_set(err, CDDP_EIO, "cannot read %s: %s", path, strerror(errno));
    fclose(fp);
    *size = *data_start + len;
    return f;
}

cddp_safetensors *cddp__safetensors_index(const char *path, uint64_t *data_start, uint64_t *size,
                                          cddp_error *err) {
    *data_start = *size = 0;
    FILE *fp = open_file(path, err);
    if (!fp) return NULL;
    uint64_t len = 0;
    cddp_safetensors *f = parse_header(path, fp, data_start, &len, err);
    fclose(fp);
    *size = *data_start + len;
    return f;
}

void cddp__safetensors_forget_data(cddp_safetensors *f) {
    for (int i = 0; i < f->n; i++) f->tensors[i].data = NULL;
}

int cddp__pread_all(int fd, void *dst, size_t n, uint64_t at, const char *path, cddp_error *err) {
    for (size_t got = 0; got < n;) {
        ssize_t k = pread(fd, (char *)dst + got, n - got, (off_t)(at + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return cddp_error_set(err, CDDP_EIO, "reading %s: %s", path,
                                  k < 0 ? strerror(errno) : "the file ends early");
        got += (size_t)k;
    }
    return CDDP_OK;
}

cddp_safetensors *cddp_safetensors_read(const char *path, cddp_error *err) {
    FILE *fp = open_file(path, err);
    if (!fp) return NULL;
    uint64_t start = 0, len = 0;
    cddp_safetensors *f = parse_header(path, fp, &start, &len, err);
    if (f && !(f->data = cddp_aligned_alloc(len))) {
        cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for %" PRIu64 " bytes of tensor data",
                       path, len);
    } else if (f && len && fread(f->data, 1, len, fp) != len) {
        cddp_error_set(err, CDDP_EIO, "%s: cannot read %" PRIu64 " bytes of tensor data", path,
                       len);
    } else if (f) {
        for (int i = 0; i < f->n; i++)
            f->tensors[i].data = (const char *)f->data + (uintptr_t)f->tensors[i].data;
        fclose(fp);
        return f;
    }
    fclose(fp);
    cddp_safetensors_destroy(f);
    return NULL;
}

int cddp_safetensors_count(const cddp_safetensors *f) {
    return f->n;
}

const cddp_st_tensor *cddp_safetensors_at(const cddp_safetensors *f, int i) {
    CDDP_CHECK(i >= 0 && i < f->n, "tensor index %d out of range (%d tensors)", i, f->n);
    return &f->tensors[i];
}

const cddp_st_tensor *cddp_safetensors_find(const cddp_safetensors *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *cddp_safetensors_meta(const cddp_safetensors *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

int cddp__shard_header_crc(const char *path, uint32_t *crc, cddp_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cddp_error_set(err, CDDP_EIO, "cannot open %s: %s", path, strerror(errno));
    unsigned char len8[8];
    int rc = cddp__pread_all(fd, len8, 8, 0, path, err);
    uint64_t n = 0;
    for (int i = 7; rc == CDDP_OK && i >= 0; i--) n = n << 8 | len8[i];
    if (rc == CDDP_OK && n > (100u << 20))
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: a header of %" PRIu64 " bytes", path, n);
    unsigned char *head = rc == CDDP_OK ? cddp_malloc((size_t)n + 1) : NULL;
    if (rc == CDDP_OK && !head) rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    if (rc == CDDP_OK) rc = cddp__pread_all(fd, head, (size_t)n, 8, path, err);
    if (rc == CDDP_OK) *crc = cddp__crc32(cddp__crc32(0, len8, 8), head, (size_t)n);
    cddp_free(head);
    close(fd);
    return rc;
}

int cddp__pread_crc(int fd, void *dst, size_t n, uint64_t at, uint32_t want, const char *path,
                    const char *what, cddp_error *err) {
    CDDP_TRY(cddp__pread_all(fd, dst, n, at, path, err));
    uint32_t c = cddp__crc32(0, dst, n);
    if (c == want) return CDDP_OK;
    return cddp_error_set(err, CDDP_EFORMAT,
                          "%s: bytes %" PRIu64 "..%" PRIu64 " (%s) have CRC-32 %08x, not the %08x "
                          "written: the shard changed after the save",
                          path, at, at + n - 1, what, (unsigned)c, (unsigned)want);
}
