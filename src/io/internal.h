/* io/internal.h: atomic file replacement, shared by every writer of files users keep.
 *
 * cddp__atomic_open creates PATH.tmp.HOST.PID next to PATH (first removing such temporaries of
 * this host whose writer no longer runs: a save killed midway); writes go there; cddp__atomic_close
 * with a success status flushes the data to disk, renames the temporary over PATH and syncs the
 * folder, and with a failure status removes the temporary. Readers of PATH see the old file or
 * the complete new one, never a part.
 */
#ifndef CDDP_IO_INTERNAL_H
#define CDDP_IO_INTERNAL_H

#include "cddp/checkpoint.h"
#include "cddp/core.h"

#include <stdbool.h>
#include <stdint.h>

#include <stdio.h>

#define CDDP__HOST_STATES 2

typedef struct cddp__atomic_file {
    FILE *f;
    const char *path;
    char tmp[4096];
    uint64_t bytes; /* written so far, and their CRC-32 (zlib's) */
    uint32_t crc32;
} cddp__atomic_file;

int cddp__atomic_open(cddp__atomic_file *af, const char *path, cddp_error *err);
int cddp__atomic_write(cddp__atomic_file *af, const void *data, size_t bytes, cddp_error *err);
/* zlib's CRC-32 of bytes more at data, continuing crc (0 to start), for any length. */
uint32_t cddp__crc32(uint32_t crc, const void *data, size_t bytes);
/* Commits when rc is CDDP_OK, discards otherwise; returns the final status. */
int cddp__atomic_close(cddp__atomic_file *af, int rc, cddp_error *err);
/* mkdir -p path: CDDP_OK when it is a folder now. */
int cddp__make_dirs(const char *path, cddp_error *err);

/* cddp_safetensors_write that also returns the file's size and CRC-32 (either may be NULL). */
int cddp__safetensors_write(const char *path, const cddp_st_tensor *tensors, int n,
                            const char *const *metadata, uint64_t *bytes, uint32_t *crc32,
                            cddp_error *err);

/* The header of a safetensors file alone: every check of cddp_safetensors_read but none on the
 * data, which stays on disk. Each tensor's data is its byte offset from *data_start (the file's
 * offset of the data section; cddp__st_offset reads it). *size: the file's size. */
cddp_safetensors *cddp__safetensors_index(const char *path, uint64_t *data_start, uint64_t *size,
                                          cddp_error *err);
/* The same on a file open as fd (read from its start; fd's own offset is not used). */
cddp_safetensors *cddp__safetensors_index_fd(int fd, const char *path, uint64_t *data_start,
                                             uint64_t *size, cddp_error *err);
static inline uint64_t cddp__st_offset(const cddp_st_tensor *t) {
    return (uint64_t)(uintptr_t)t->data;
}
/* gpt_weights.c: a model's sizes from a cddp checkpoint's metadata: keys[i] into *at[i], each an
 * integer in [1, 2^24]; CDDP_EFORMAT naming path and the key that is missing or wrong. */
int cddp__meta_sizes(const cddp_safetensors *f, const char *path, const char *const *keys,
                     int64_t *const *at, int n, cddp_error *err);

/* json.c: the JSON object in the file at path (at most `most` bytes) into *root (cJSON_Delete
 * it): CDDP_ENOENT when there is no such file, CDDP_EFORMAT when it is not a JSON object. */
typedef struct cJSON cJSON;
int cddp__json_read(const char *path, size_t most, cJSON **root, cddp_error *err);

/* st_files.c: one safetensors file, or Hugging Face's sharded checkpoint (its
 * model.safetensors.index.json, whose weight_map names each tensor's file), as one set of
 * tensors whose data stays on disk. */
typedef struct cddp__st_files {
    int n;                    /* files */
    cddp_safetensors **index; /* each file's header (cddp__safetensors_index_fd) */
    int *fd;
    uint64_t *data_start;
    char **path;
} cddp__st_files;
/* Opens path: a safetensors file (fd: it, open, taken over; -1 to open it here), or an index
 * whose every shard is opened and checked (each tensor of the map in the file it names, none in
 * two). On failure everything is closed and the error names the file and tensor. */
int cddp__st_files_open(cddp__st_files *f, const char *path, int fd, cddp_error *err);
/* A model's folder as Hugging Face keeps one: the file to read in it (model.safetensors.index.json
 * with its shards, else model.safetensors) into file (cap bytes); path itself when path is not a
 * folder or holds neither (a folder is then a cddp checkpoint set). */
const char *cddp__hf_weights_file(const char *path, char *file, size_t cap);
void cddp__st_files_close(cddp__st_files *f);
/* The tensor called name and (file may be NULL) the index of its file; NULL when none has it. */
const cddp_st_tensor *cddp__st_files_find(const cddp__st_files *f, const char *name, int *file);
/* Every tensor of every file, in file order: count, then i in [0, count). */
int cddp__st_files_count(const cddp__st_files *f);
const cddp_st_tensor *cddp__st_files_at(const cddp__st_files *f, int i, int *file);
/* The first bytes of t's data (t from this set) into dst. */
int cddp__st_files_read(const cddp__st_files *f, const cddp_st_tensor *t, void *dst, size_t bytes,
                        cddp_error *err);
/* t's n values (F32, BF16 or F16, widened exactly) into dst as float32. */
int cddp__st_files_read_f32(const cddp__st_files *f, const cddp_st_tensor *t, float *dst, int64_t n,
                            cddp_error *err);
/* CDDP_OK when x's n values are finite; else CDDP_EFORMAT naming path's tensor name, how many are
 * not and the first. */
int cddp__check_finite(const char *path, const char *name, const float *x, int64_t n,
                       cddp_error *err);
/* Sets every tensor's data of an index to NULL: a handle for its names, shapes and metadata. */
void cddp__safetensors_forget_data(cddp_safetensors *f);
/* Reads n bytes at offset at of fd (the file path, for the message) into dst, all or an error. */
int cddp__pread_all(int fd, void *dst, size_t n, uint64_t at, const char *path, cddp_error *err);
/* The same, then their CRC-32 against want: CDDP_EFORMAT naming the file, the bytes and what they
 * hold when it differs. */
int cddp__pread_crc(int fd, void *dst, size_t n, uint64_t at, uint32_t want, const char *path,
                    const char *what, cddp_error *err);

/* A model's blocks (and its optimizer's state) where the host reads them, for a save: the blocks
 * themselves on the CPU, else copies made now from the model's device. */
typedef struct cddp__host_model {
    const float *params, *bufs;
    const float *state[CDDP__HOST_STATES]; /* the optimizer's blocks, NULL without */
    float *own;                            /* the copies (NULL on the CPU) */
} cddp__host_model;
int cddp__host_model_get(const cddp_model *m, const cddp_optim *opt, cddp__host_model *h,
                         cddp_error *err);
void cddp__host_model_free(cddp__host_model *h);
/* Where buffer i's data is in the host view's buffer block. */
const float *cddp__host_buffer(const cddp__host_model *h, const cddp_model *m, int i);

/* Appends the optimizer's metadata pairs (optimizer, optimizer_steps, lr) to meta at k; steps and
 * lr are the caller's buffers that the values live in. Returns the new k. */
int cddp__optim_meta(const cddp_optim *opt, const char **meta, int k, char steps[32], char lr[32]);

/* ---- checkpoint sets (ckpt_set.c writes them, ckpt_read.c reads them) ---- */
#define CDDP__CKPT_MAX_STATES 4
#define CDDP__CKPT_INCOMPLETE (-1) /* a set folder without a manifest */
#define CDDP__CKPT_UNREADABLE (-2) /* a manifest that does not parse */

typedef struct cddp__ckpt_entry {
    char name[256];    /* the folder's name in the root */
    int64_t step, seq; /* seq: the commit number, or one of the two codes above */
} cddp__ckpt_entry;
/* The set folders (step-<digits>) of root, newest commit first, then the unreadable and the
 * incomplete ones; *out is the caller's to free (cddp_free). The count (0 with none or no
 * memory). */
int cddp__ckpt_scan(const char *root, cddp__ckpt_entry **out);

/* Where the shards of a set keep each range of the flat block. */
typedef struct cddp__ckpt_range {
    int64_t begin, end;
    int shard;
    uint64_t at[1 + CDDP__CKPT_MAX_STATES];  /* file offsets: the parameters', then each state's */
    uint32_t crc[1 + CDDP__CKPT_MAX_STATES]; /* their CRC-32s, from the shard's header */
    bool has_crc;                            /* false in a set written before shards had them */
} cddp__ckpt_range;
typedef struct cddp__ckpt_layout {
    cddp__ckpt_range *ranges; /* ascending, covering [0, numel) once */
    int n;
} cddp__ckpt_layout;
/* Reads the headers of dir's world shards: each must have the size shards[r].bytes, hold every
 * state (names) beside each parameter range, and together they cover [0, numel) once. */
int cddp__ckpt_index(const char *dir, int world, const cddp_ckpt_shard *shards, int nstates,
                     const char *const *states, int64_t numel, cddp__ckpt_layout *layout,
                     cddp_error *err);
void cddp__ckpt_layout_free(cddp__ckpt_layout *layout);
/* CRC-32 of the header of the shard at path (its 8-byte length and its JSON, which holds each
 * tensor's CRC-32): what a manifest binds each shard by, so that a shard from another save, even
 * of the same size, is found. */
int cddp__shard_header_crc(const char *path, uint32_t *crc, cddp_error *err);

/* Hands the open set's manifest to the caller (who destroys it); the set has none after. */
cddp_safetensors *cddp__ckpt_set_take_manifest(cddp_ckpt_set *s);

/* cddp_checkpoint_load for a set (path: a set or a folder of sets). */
int cddp__ckpt_set_load(const char *path, cddp_model *m, cddp_optim *opt, cddp_safetensors **file,
                        cddp_error *err);

#endif
