/* ckpt.c: DistributedDataParallel's checkpoints: one file, or a set with one file per rank.
 *
 * Every rank agrees on the outcome: a save or load fails on every rank when it failed on one,
 * naming that rank. A file is written by rank 0 (with ZeRO the state is first gathered); a set is
 * written by every rank at once, each its part of the flat block: with ZeRO its shard (so no
 * rank ever holds the whole optimizer state), without it an even 1/N of the block. Loading a file
 * or a set reads, on each rank, the parameters and the optimizer state of this rank's shard only
 * (cddp_checkpoint_load).
 */
#include "cddp/checkpoint.h"
#include "ddp/internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef struct ckpt_call {
    const char *path;
    cddp_optim *opt;
    const char *const *metadata;
    cddp_safetensors **file;
    char *loaded; /* where load says what it loaded (may be NULL) */
    size_t cap;
} ckpt_call;

/* The caller's metadata and "zero_stage" (the stage the checkpoint was saved under: 0 plain DDP, 1
 * ZeRO-1, 2 ZeRO-2; a key the caller set is kept as it is) in out (cap entries, NULL-ended);
 * NULL when it does not fit. */
static const char *const *with_stage(const cddp_ddp *d, const char *const *metadata,
                                     const char **out, int cap, char stage[2]) {
    int n = 0;
    bool given = false;
    for (; metadata && metadata[n]; n += 2) {
        if (n + 2 >= cap - 3) return NULL;
        out[n] = metadata[n];
        out[n + 1] = metadata[n + 1];
        given |= strcmp(metadata[n], "zero_stage") == 0;
    }
    stage[0] = (char)('0' + (d->o.shard_gradients ? 2 : d->o.shard_optimizer ? 1 : 0));
    stage[1] = '\0';
    if (!given) out[n++] = "zero_stage", out[n++] = stage;
    out[n] = NULL;
    return out;
}

#define MAX_META 256

static int save(cddp_ddp *d, void *arg, cddp_error *err) {
    const ckpt_call *a = arg;
    int32_t status = CDDP_OK;
    cddp_error mine = {0};
    if (d->rank == 0) status = cddp_checkpoint_save(a->path, d->model, a->opt, a->metadata, &mine);
    CDDP_TRY(
        cddp_comm_broadcast(d->group, &status, 1, CDDP_COMM_I32, 0, cddp__ddp_timeout(d), err));
    if (status == CDDP_OK) return CDDP_OK;
    if (d->rank == 0) {
        if (err) *err = mine;
        return status;
    }
    return cddp_error_set(err, status,
                          "rank 0 could not write the checkpoint %s (its log says why)", a->path);
}

/* One try: every rank loads path; all fail when one did. *damaged: some rank found the data
 * damaged (CDDP_EFORMAT), and *who the first rank that failed. */
static int load_once(cddp_ddp *d, const ckpt_call *a, const char *path, bool *damaged, int *who,
                     cddp_error *err) {
    cddp_error mine = {0};
    cddp_safetensors *f = NULL;
    int32_t st = cddp_checkpoint_load(path, d->model, a->opt, a->file ? &f : NULL, &mine);
    /* [some rank failed, INT32_MAX - the first that did (MAX finds it), one found damage] */
    int32_t worst[3] = {st != CDDP_OK, st != CDDP_OK ? INT32_MAX - d->rank : 0, st == CDDP_EFORMAT};
    int rc = cddp_comm_allreduce(d->group, worst, worst, 3, CDDP_COMM_I32, CDDP_COMM_MAX,
                                 cddp__ddp_timeout(d), err);
    *damaged = rc == CDDP_OK && worst[2];
    *who = worst[0] ? INT32_MAX - worst[1] : -1;
    if (rc == CDDP_OK && st != CDDP_OK) {
        if (err) *err = mine;
        rc = st;
    } else if (rc == CDDP_OK && worst[0]) {
        rc = cddp_error_set(err, CDDP_EIO,
                            "rank %d could not load the checkpoint %s (its log says why)", *who,
                            path);
    }
    if (rc == CDDP_OK && a->file)
        *a->file = f;
    else
        cddp_safetensors_destroy(f);
    return rc;
}

/* A folder of sets resumes from its newest complete set; one that fails its checks on any rank
 * (a changed byte, a shard from another save) gives way to the newest before it, every rank
 * going back alike, and the log says so. */
static int load(cddp_ddp *d, void *arg, cddp_error *err) {
    const ckpt_call *a = arg;
    char set[4096];
    bool folder = cddp_checkpoint_resolve(a->path, set, sizeof set, NULL) == CDDP_OK &&
                  strcmp(set, a->path) != 0;
    if (!folder) snprintf(set, sizeof set, "%s", a->path); /* a file or a set: no other to take */
    for (;;) {
        bool damaged = false;
        int who = 0;
        cddp_error e = {0};
        int rc = load_once(d, a, set, &damaged, &who, &e);
        char older[4096];
        if (rc == CDDP_OK || !folder || !damaged ||
            cddp_checkpoint_resolve_before(set, older, sizeof older, NULL) != CDDP_OK) {
            if (err && rc != CDDP_OK) *err = e;
            if (rc == CDDP_OK && a->loaded) snprintf(a->loaded, a->cap, "%s", set);
            return rc;
        }
        if (who == d->rank) cddp_log(CDDP_LOG_WARN, "ddp", "%s: %s", set, cddp_error_msg(&e));
        if (d->rank == 0)
            cddp_log(CDDP_LOG_WARN, "ddp",
                     "%s failed its checks on rank %d: resuming from %s, the newest set before it",
                     set, who, older);
        snprintf(set, sizeof set, "%s", older);
    }
}

int cddp_ddp_save(cddp_ddp *d, const char *path, cddp_optim *opt, const char *const *metadata,
                  cddp_error *err) {
    const char *meta[MAX_META];
    char stage[2];
    ckpt_call a = {path, opt, with_stage(d, metadata, meta, MAX_META, stage), NULL, NULL, 0};
    if (!a.metadata)
        return cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_save: more than %d metadata pairs",
                              MAX_META / 2 - 2);
    if (d->o.shard_optimizer && opt) return cddp__ddp_zero_with_whole_state(d, opt, save, &a, err);
    return save(d, &a, err);
}

int cddp_ddp_load_from(cddp_ddp *d, const char *path, cddp_optim *opt, cddp_safetensors **file,
                       char *loaded, size_t cap, cddp_error *err) {
    ckpt_call a = {path, opt, NULL, file, cap ? loaded : NULL, cap};
    if (file) *file = NULL;
    return load(d, &a, err); /* a sharded optimizer reads its shard's state alone */
}

int cddp_ddp_load(cddp_ddp *d, const char *path, cddp_optim *opt, cddp_safetensors **file,
                  cddp_error *err) {
    return cddp_ddp_load_from(d, path, opt, file, NULL, 0, err);
}

/* Fails every rank once one failed: this rank's own error, or one naming the first rank that
 * did. */
static int agree(cddp_ddp *d, int rc, const cddp_error *mine, const char *what, cddp_error *err) {
    int32_t who = rc != CDDP_OK ? d->rank : INT32_MAX;
    CDDP_TRY(cddp_comm_allreduce(d->group, &who, &who, 1, CDDP_COMM_I32, CDDP_COMM_MIN,
                                 cddp__ddp_timeout(d), err));
    if (who == INT32_MAX) return CDDP_OK;
    if (rc != CDDP_OK) {
        if (err) *err = *mine;
        return rc;
    }
    return cddp_error_set(err, CDDP_EIO, "rank %d could not %s (its log says why)", who, what);
}

int cddp_ddp_save_set(cddp_ddp *d, const char *root, int64_t step, int keep, cddp_optim *opt,
                      const char *const *metadata, cddp_error *err) {
    char dir[4096] = "", what[4300], stage[2];
    const char *meta[MAX_META];
    if (!(metadata = with_stage(d, metadata, meta, MAX_META, stage)))
        return cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_save_set: more than %d metadata pairs",
                              MAX_META / 2 - 2);
    cddp_error mine = {0};
    int rc = d->rank == 0 ? cddp_ckpt_set_prepare(root, step, dir, sizeof dir, &mine) : CDDP_OK;
    snprintf(what, sizeof what, "prepare the checkpoint set in %s", root);
    CDDP_TRY(agree(d, rc, &mine, what, err));
    if (d->rank != 0) CDDP_TRY(cddp_ckpt_set_path(root, step, dir, sizeof dir, err));
    /* This rank's part: its ZeRO shard, or an even share of the block. */
    int64_t even[2], *ranges = even, n = (int64_t)cddp_model_numel(d->model);
    int nranges = 1;
    even[0] = n * d->rank / d->world;
    even[1] = n * (d->rank + 1) / d->world;
    if (d->o.shard_optimizer) ranges = d->shard, nranges = d->nbuckets;
    cddp_ckpt_shard info = {0};
    rc = cddp_ckpt_set_write_shard(dir, d->rank, d->world, d->model, opt, nranges, ranges, &info,
                                   &mine);
    snprintf(what, sizeof what, "write its shard of %s", dir);
    CDDP_TRY(agree(d, rc, &mine, what, err));
    /* Rank 0 learns every shard's size and checksum, then commits the manifest. */
    int64_t *all = cddp_malloc(sizeof *all * 2 * (size_t)d->world);
    cddp_ckpt_shard *shards = cddp_malloc(sizeof *shards * (size_t)d->world);
    int64_t pair[2] = {info.bytes, (int64_t)info.crc32};
    rc = all && shards ? CDDP_OK : cddp_error_set(&mine, CDDP_ENOMEM, "out of memory");
    snprintf(what, sizeof what, "hold the list of shards");
    rc = agree(d, rc, &mine, what, err);
    if (rc == CDDP_OK)
        rc = cddp_comm_allgather(d->group, pair, all, 2, CDDP_COMM_I64, cddp__ddp_timeout(d), err);
    if (rc == CDDP_OK) {
        for (int r = 0; r < d->world; r++)
            shards[r] = (cddp_ckpt_shard){.bytes = all[2 * r], .crc32 = (uint32_t)all[2 * r + 1]};
        int st = d->rank == 0 ? cddp_ckpt_set_commit(dir, d->world, d->model, opt, shards, metadata,
                                                     keep, &mine)
                              : CDDP_OK;
        snprintf(what, sizeof what, "commit the manifest of %s", dir);
        rc = agree(d, st, &mine, what, err);
    }
    cddp_free(all);
    cddp_free(shards);
    return rc;
}
