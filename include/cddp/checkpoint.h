/* cddp/checkpoint.h: safetensors files, and model + optimizer checkpoints stored in them.
 *
 * safetensors is an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value", ...}}, then the raw little-endian tensor bytes. PyTorch,
 * NumPy and other tools read and write it, so a cddp checkpoint opens elsewhere and the other way
 * round. Parameter names are the model's own (no "module." prefix).
 *
 * Writes are atomic: the file is written as PATH.tmp.PID, flushed to disk, then renamed over
 * PATH, so a crash during a save leaves the previous checkpoint (or none), never a truncated one.
 */
#ifndef CDDP_CHECKPOINT_H
#define CDDP_CHECKPOINT_H

#include "cddp/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a safetensors file. */
typedef struct cddp_st_tensor {
    const char *name;
    cddp_dtype dtype; /* F32, I32 or I64 in the file */
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    const void *data; /* numel * dtype size bytes, 64-byte aligned when read */
} cddp_st_tensor;

/* Writes n tensors and the metadata (key, value, key, value, ..., NULL; may be NULL) to path,
 * atomically. Names must be unique and not "__metadata__". */
CDDP_API int cddp_safetensors_write(const char *path, const cddp_st_tensor *tensors, int n,
                                    const char *const *metadata, cddp_error *err);

typedef struct cddp_safetensors cddp_safetensors;

/* Reads and validates a whole file: the header length against the file size, the JSON, every
 * dtype, shape and offset range against the data. NULL with err set on any problem. */
CDDP_API cddp_safetensors *cddp_safetensors_read(const char *path, cddp_error *err);
CDDP_API void cddp_safetensors_destroy(cddp_safetensors *f);
CDDP_API int cddp_safetensors_count(const cddp_safetensors *f);
CDDP_API const cddp_st_tensor *cddp_safetensors_at(const cddp_safetensors *f, int i);
CDDP_API const cddp_st_tensor *cddp_safetensors_find(const cddp_safetensors *f, const char *name);
/* A metadata value, or NULL. */
CDDP_API const char *cddp_safetensors_meta(const cddp_safetensors *f, const char *key);

/* Saves every parameter of m under its name and, when opt is not NULL, its state as
 * "optim.<state>.<param>" with the optimizer's kind, step count and learning rate in the
 * metadata, plus the caller's metadata pairs (for example "epoch", "3"). Atomic. */
CDDP_API int cddp_checkpoint_save(const char *path, const cddp_model *m, const cddp_optim *opt,
                                  const char *const *metadata, cddp_error *err);

/* Loads a checkpoint into m (and opt, when not NULL). Every parameter must be present with the
 * same shape and dtype and the file may hold no other model tensors; the message names each
 * difference. Nothing is changed unless everything matches. On success *file (if not NULL)
 * receives the open file for reading metadata; the caller destroys it. */
CDDP_API int cddp_checkpoint_load(const char *path, cddp_model *m, cddp_optim *opt,
                                  cddp_safetensors **file, cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
