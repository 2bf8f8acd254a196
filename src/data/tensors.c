/* tensors.c: a tensor of a safetensors file (PyTorch's safetensors.torch.save_file, NumPy's
 * safetensors.numpy.save_file, cddp's own checkpoints) as a cddp_dataset_from_files field.
 *
 * A safetensors file is an 8-byte little-endian length N, N bytes of JSON naming each tensor's
 * dtype, shape and [begin, end) offsets into the data that follow, then the data. Only the header
 * is read here, every number checked against the file; the tensor's bytes are read where they lie
 * as the loader asks for its samples (npy.c), as a stored .npy array's are.
 */
#include "cddp/core.h"
#include "data/internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER ((uint64_t)100 << 20)

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

bool cddp__st_is(int fd) {
    uint8_t h[9];
    struct stat st;
    if (pread(fd, h, 9, 0) != 9 || fstat(fd, &st) != 0) return false;
    uint64_t n = le64(h);
    return h[8] == '{' && n >= 2 && n <= MAX_HEADER && n <= (uint64_t)st.st_size - 8;
}

/* safetensors' dtype names as NumPy's kind and size ('B' 2: bfloat16) */
static bool dtype_of(const char *s, char *kind, int *size) {
    static const struct {
        const char *name;
        char kind;
        int size;
    } t[] = {{"BOOL", 'b', 1}, {"U8", 'u', 1},  {"I8", 'i', 1},  {"U16", 'u', 2}, {"I16", 'i', 2},
             {"U32", 'u', 4},  {"I32", 'i', 4}, {"U64", 'u', 8}, {"I64", 'i', 8}, {"F16", 'f', 2},
             {"BF16", 'B', 2}, {"F32", 'f', 4}, {"F64", 'f', 8}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].name)) {
            *kind = t[i].kind, *size = t[i].size;
            return true;
        }
    return false;
}

/* A whole number in [0, 2^62) from JSON, else -1. */
static int64_t whole(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    return d >= 0 && d < 4611686018427387904.0 && d == (double)(int64_t)d ? (int64_t)d : -1;
}

int cddp__st_find(int fd, const char *path, const char *name, cddp__st_tensor *t, char *names,
                  size_t cap, cddp_error *err) {
    *t = (cddp__st_tensor){0};
    names[0] = '\0';
    struct stat st;
    uint8_t h8[8];
    if (fstat(fd, &st) != 0 || pread(fd, h8, 8, 0) != 8)
        return cddp_error_set(err, CDDP_EIO, "cannot read %s: %s", path, strerror(errno));
    uint64_t n = le64(h8), file = (uint64_t)st.st_size;
    if (n < 2 || n > MAX_HEADER || n > file - 8)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: a header of %" PRIu64 " bytes does not fit "
                              "the file (a damaged safetensors file?)",
                              path, n);
    char *text = cddp_malloc(n);
    if (!text) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory", path);
    int r = cddp__read_exact(fd, text, n, 8), rc = CDDP_OK;
    if (r != CDDP_OK)
        rc = cddp_error_set(err, CDDP_EIO, "cannot read %s: %s", path,
                            r < 0 ? strerror(errno) : "it ends early");
    cJSON *root = rc ? NULL : cJSON_ParseWithLength(text, n);
    cddp_free(text);
    if (rc) return rc;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: its header is not a JSON object (a damaged safetensors file?)",
                              path);
    }
    const cJSON *e, *found = NULL;
    size_t listed = 0;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        if (!found && !strcmp(e->string, name)) found = e;
        if (listed + strlen(e->string) + 3 < cap)
            listed += (size_t)snprintf(names + listed, cap - listed, "%s%s", listed ? ", " : "",
                                       e->string);
    }
    if (!found) {
        cJSON_Delete(root);
        return CDDP_ENOENT;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(found, "dtype"),
                *shape = cJSON_GetObjectItemCaseSensitive(found, "shape"),
                *offs = cJSON_GetObjectItemCaseSensitive(found, "data_offsets");
    int nd = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    int64_t b = cJSON_IsArray(offs) && cJSON_GetArraySize(offs) == 2
                    ? whole(cJSON_GetArrayItem(offs, 0))
                    : -1,
            end = b >= 0 ? whole(cJSON_GetArrayItem(offs, 1)) : -1;
    if (!cJSON_IsString(dt) || nd < 0 || nd > CDDP__MAX_NDIM || b < 0 || end < b ||
        (uint64_t)end > file - 8 - n)
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: tensor '%s' lacks a dtype, a shape or data_offsets inside the "
                            "file (a damaged safetensors file?)",
                            path, name);
    else if (!dtype_of(dt->valuestring, &t->kind, &t->size))
        rc = cddp_error_set(
            err, CDDP_EUNSUPPORTED,
            "%s: tensor '%s' holds %s; cddp reads BOOL, U8..U64, I8..I64, F16, BF16, "
            "F32 and F64",
            path, name, dt->valuestring);
    for (int d = 0; !rc && d < nd; d++)
        if ((t->shape[d] = whole(cJSON_GetArrayItem(shape, d))) < 0)
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s: tensor '%s' has an invalid shape", path,
                                name);
    cJSON_Delete(root);
    if (rc) return rc;
    t->ndim = nd;
    t->offset = 8 + n + (uint64_t)b;
    t->bytes = (uint64_t)(end - b);
    return CDDP_OK;
}
