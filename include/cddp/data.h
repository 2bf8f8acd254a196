/* cddp/data.h: datasets. For now: IDX files (gzip or raw) and (Fashion-)MNIST loading.
 *
 * IDX is the format of MNIST and Fashion-MNIST: two zero bytes, a type byte, a dimension count,
 * the dimensions as big-endian uint32, then the elements, big-endian. The reader accepts every
 * IDX element type and any number of dimensions, reads gzip-compressed and plain files alike
 * (zlib), and checks the header against the data: a wrong magic, an unknown type, absurd
 * dimensions, a truncated or overlong file, or corrupt gzip is an error naming the file.
 */
#ifndef CDDP_DATA_H
#define CDDP_DATA_H

#include "cddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cddp_idx_type {
    CDDP_IDX_U8 = 0x08,
    CDDP_IDX_I8 = 0x09,
    CDDP_IDX_I16 = 0x0B,
    CDDP_IDX_I32 = 0x0C,
    CDDP_IDX_F32 = 0x0D,
    CDDP_IDX_F64 = 0x0E,
} cddp_idx_type;

#define CDDP_IDX_MAX_DIMS 16

/* An IDX array in host byte order. */
typedef struct cddp_idx {
    cddp_idx_type type;
    int ndim;
    int64_t dims[CDDP_IDX_MAX_DIMS];
    int64_t count;    /* product of dims */
    size_t elem_size; /* bytes per element */
    void *data;       /* count * elem_size bytes, owned; release with cddp_idx_free */
} cddp_idx;

/* Reads path (gzip or raw). max_bytes bounds the data size accepted (0: 16 GiB), so a corrupt
 * header cannot ask for absurd memory. On failure *out is zeroed and err says why. */
CDDP_API int cddp_idx_read(const char *path, size_t max_bytes, cddp_idx *out, cddp_error *err);
CDDP_API void cddp_idx_free(cddp_idx *idx);

/* (Fashion-)MNIST: images (N, rows, cols) uint8 and labels (N) uint8. */
typedef struct cddp_mnist {
    int64_t n, rows, cols;
    uint8_t *images; /* n * rows * cols */
    uint8_t *labels; /* n */
} cddp_mnist;

/* Loads the train (train = true) or t10k split from dir: {train,t10k}-{images-idx3,
 * labels-idx1}-ubyte, with or without .gz. dir NULL means CDDP_DATA (default: Debian's
 * dataset-fashion-mnist folder). Checks that image and label counts agree and labels are 0..9. */
CDDP_API int cddp_mnist_load(const char *dir, bool train, cddp_mnist *out, cddp_error *err);
CDDP_API void cddp_mnist_free(cddp_mnist *ds);
/* Writes images [first, first + count) as float32 (x / 255 - mean) / std into dst. */
CDDP_API void cddp_mnist_normalize(const cddp_mnist *ds, int64_t first, int64_t count, float mean,
                                   float std, float *dst);

#ifdef __cplusplus
}
#endif
#endif
