/* data/internal.h: what the loader needs from the sampler beyond the public API. */
#ifndef CDDP_DATA_INTERNAL_H
#define CDDP_DATA_INTERNAL_H

#include "cddp/data.h"

/* Marks n more samples of the current epoch consumed, without counting as an explicit epoch
 * choice (so automatic epoch advance still applies at the next begin). */
void cddp__sampler_advance(cddp_sampler *s, int64_t n);
/* This rank's indices of the current epoch from where this run started it (the state's position):
 * all of them when it started at the beginning; as many as cddp_sampler_len at most. */
void cddp__sampler_run_indices(const cddp_sampler *s, int64_t *out);

/* Above this many samples a shuffling sampler keeps no list: each epoch's order is a rule
 * (sampler.c). Tests lower it to run every case both ways. */
extern int64_t cddp__sampler_list_max;
/* What computes this run's indices without a list (no shuffle, or the rule): entry k of them is
 * the epoch's list entry first + k stride (mod n), through the keyed bijection when shuffled. A
 * copy of the sampler's parameters, so the loader's thread may use it while the sampler moves
 * on. */
typedef struct cddp__sampler_run {
    uint64_t key, mask;
    int64_t n, first, stride;
    int half;
    bool shuffle;
} cddp__sampler_run;
/* Sets run and returns true when the sampler keeps no list; false when it does (then
 * cddp__sampler_run_indices copies the run's indices). */
bool cddp__sampler_run_rule(const cddp_sampler *s, cddp__sampler_run *run);
int64_t cddp__sampler_run_index(const cddp__sampler_run *run, int64_t k);

/* cddp_mnist_load, or with first >= 0 the split's first `first` samples only, its files read no
 * further (cddp_dataset_mnist_first). */
int cddp__mnist_load(const char *dir, bool train, int64_t first, cddp_mnist *out, cddp_error *err);

/* npz.c: n bytes at offset at of fd into dst, however many reads it takes (EINTR retried):
 * CDDP_OK; or 1 when the file ends first, or -1 with errno set when a read fails. */
int cddp__read_exact(int fd, void *dst, size_t n, uint64_t at);

/* npz.c: a member of a zip archive (NumPy's .npz: np.savez stores its arrays, np.savez_compressed
 * deflates them). A stored member lies in the file at offset, size bytes; a deflated one is
 * inflated into data (size bytes, cddp_free it; NULL for a stored one). */
typedef struct cddp__zip_member {
    uint64_t offset, size;
    uint8_t *data;
} cddp__zip_member;
/* Whether the file open as fd starts as a zip archive does. */
bool cddp__zip_is(int fd);
/* Member name (".npy" added unless it ends so) of the archive open as fd (path: for messages).
 * CDDP_ENOENT when there is none, with names (cap bytes) listing the archive's arrays; a damaged
 * archive, an encrypted member or another compression fail in words. */
/* npy.c: an array of at most this many bytes (header included) is read whole when the dataset
 * opens, and its samples taken from memory; a larger one is read a sample at a time. Tests lower
 * it to read small files a sample at a time. */
extern int64_t cddp__npy_memory_max;

/* tensors.c: a tensor of a safetensors file: its element type as NumPy's kind and size ('B', 2:
 * bfloat16), its shape, and where its bytes lie in the file. */
#define CDDP__MAX_NDIM 32
typedef struct cddp__st_tensor {
    char kind;
    int size, ndim;
    int64_t shape[CDDP__MAX_NDIM];
    uint64_t offset, bytes;
} cddp__st_tensor;
/* Whether the file open as fd starts as a safetensors file does (a header length that fits, then
 * '{'). */
bool cddp__st_is(int fd);
/* Tensor name of the safetensors file open as fd (path: for messages): CDDP_ENOENT when there is
 * none, with names (cap bytes) listing its tensors; a damaged header or an unknown dtype fail in
 * words. */
int cddp__st_find(int fd, const char *path, const char *name, cddp__st_tensor *t, char *names,
                  size_t cap, cddp_error *err);
int cddp__zip_find(int fd, const char *path, const char *name, cddp__zip_member *m, char *names,
                   size_t cap, cddp_error *err);

#endif
