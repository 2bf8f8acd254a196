/* zero.c: the sharded optimizer (ZeRO-1) and sharded gradients (ZeRO-2) around
 * DistributedDataParallel's buckets.
 *
 * A rank's shard is its part of every bucket (cddp__ddp_part): the part of the reduced gradients
 * that the bucket's reduce-scatter hands it (reducer.c). The model is told (cddp_model_set_shard),
 * so its optimizer keeps state for the shard alone and updates only it; after the step every
 * bucket's updated parts are allgathered, in place where the bucket divides evenly among the
 * ranks, else through the bucket's staging buffer. Buckets stay in reverse declaration order
 * (never rebuilt), so the shard does not move between steps.
 *
 * ZeRO-2 (shard_gradients) keeps the gradients of the shard only: as a bucket's reduce-scatter
 * ends, its gradients outside this rank's part are released (cddp_device_release: the CPU gives
 * the pages back), and the model's zero_grad releases them too (cddp_model_shard_gradients).
 *
 * Accumulating over synchronised backwards (no zero_grad between them): the next reduce-scatter
 * must see each rank's local gradients only, but the shard holds the last one's result (and under
 * ZeRO-1 the rest holds what this rank contributed already). So the forward that follows moves the
 * shard aside (zacc) and clears the block, and the end of the next synchronised backward adds it
 * back: the sum of the results, with sum as with mean.
 *
 * A checkpoint file keeps DDP's layout: before its save the ranks gather the optimizer state (the
 * same allgather), so it loads on any number of ranks, sharded or not (each rank then reads its
 * shard's state alone). A checkpoint set (ddp/ckpt.c) needs no gather: each rank writes its own
 * shard.
 */
#include "cddp/checkpoint.h"
#include "ddp/internal.h"

#include "cddp/internal/device.h"

#include <string.h>
#include <sys/resource.h>

static int sum_double(void *user, double *value, cddp_error *err) {
    cddp_ddp *d = user;
    return cddp_comm_allreduce(d->group, value, value, 1, CDDP_COMM_F64, CDDP_COMM_SUM,
                               cddp__ddp_timeout(d), err);
}

int cddp__ddp_zero_setup(cddp_ddp *d, cddp_error *err) {
    d->rebuilt = true; /* the shard must not move: keep the first buckets */
    d->shard = cddp_malloc(sizeof *d->shard * 2 * (size_t)d->nbuckets);
    if (!d->shard) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    /* The buckets run from the last parameters to the first: the ranges ascend from the last. */
    int n = 0;
    for (int k = d->nbuckets - 1; k >= 0; k--) {
        int64_t lo, hi;
        cddp__ddp_part(d, &d->buckets[k], d->rank, &lo, &hi);
        d->shard[2 * n] = d->buckets[k].offset + lo;
        d->shard[2 * n + 1] = d->buckets[k].offset + hi;
        n++;
    }
    CDDP_TRY(cddp_model_set_shard(d->model, n, d->shard, sum_double, d, err));
    if (!d->o.shard_gradients) return CDDP_OK;
    cddp_model_shard_gradients(d->model, true);
    cddp_model_zero_grad(d->model); /* what the block held before: released outside the shard */
    return CDDP_OK;
}

/* ZeRO-2: bucket b's gradients outside this rank's part, released (the model's block, on its
 * device). */
int cddp__ddp_release_outside(cddp_ddp *d, bucket *b, cddp_error *err) {
    int64_t lo, hi;
    cddp__ddp_part(d, b, d->rank, &lo, &hi);
    float *g = cddp_model_grad(d->model) + b->offset;
    CDDP_TRY(cddp_device_release(d->dev, g, (size_t)lo * sizeof(float), err));
    return cddp_device_release(d->dev, g + hi, (b->numel - (size_t)hi) * sizeof(float), err);
}

/* As a step before or after a bucket's collective (cddp__ddp_before, _after). */
int cddp__ddp_release_step(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    return cddp__ddp_release_outside(b->ddp, b, err);
}

/* The elements of this rank's shard (0 without one). */
static size_t shard_numel(const cddp_ddp *d) {
    size_t n = 0;
    for (int k = 0; k < d->nbuckets && d->shard; k++)
        n += (size_t)(d->shard[2 * k + 1] - d->shard[2 * k]);
    return n;
}

/* The shard's ranges, back to back, from (to_acc) or into the gradient block: moved aside (the
 * block set to zero where it held anything: the shard, and under ZeRO-1 the rest, which this rank
 * contributed already), or added back. */
static void shard_move(cddp_ddp *d, bool to_acc) {
    float *g = cddp_model_grad(d->model), *acc = d->zacc;
    for (int k = 0; k < d->nbuckets; k++) {
        size_t n = (size_t)(d->shard[2 * k + 1] - d->shard[2 * k]);
        float *at = g + d->shard[2 * k];
        if (to_acc) {
            cddp_device_copy(d->dev, acc, at, n * sizeof(float), NULL);
            if (d->o.shard_gradients) cddp_device_memset(d->dev, at, 0, n * sizeof(float), NULL);
        } else {
            cddp_device_accumulate(d->dev, at, acc, n);
        }
        acc += n;
    }
    if (to_acc && !d->o.shard_gradients)
        cddp_device_memset(d->dev, g, 0, cddp_model_numel(d->model) * sizeof(float), NULL);
}

void cddp__ddp_zero_on_forward(cddp_ddp *d) {
    if (!d->zheld || d->no_sync || d->world == 1 || !cddp_model_training(d->model)) return;
    if (!d->zacc) {
        cddp_error e = {0};
        if (!(d->zacc = cddp_device_alloc(d->dev, shard_numel(d) * sizeof(float) + 64, &e))) {
            if (!d->hook_err.code) d->hook_err = e; /* the backward fails with it */
            return;
        }
    }
    shard_move(d, true);
    d->zheld = false;
    d->zacc_waits = true;
}

void cddp__ddp_zero_after_backward(cddp_ddp *d) {
    if (d->zacc_waits) shard_move(d, false);
    d->zacc_waits = false;
    d->zheld = true;
}

void cddp__ddp_zero_on_zero_grad(cddp_ddp *d) {
    d->zheld = d->zacc_waits = false;
}

void cddp__ddp_zero_release(cddp_ddp *d) {
    if (d->model && d->shard) {
        cddp_model_shard_gradients(d->model, false);
        cddp_model_set_shard(d->model, 0, NULL, NULL, NULL, NULL);
    }
    cddp_free(d->shard);
    d->shard = NULL;
    if (d->zacc) cddp_device_free(d->dev, d->zacc);
    d->zacc = NULL;
}

/* The allgather of every bucket's parts of block, a flat block of host memory. */
static int gather_host(cddp_ddp *d, float *block, cddp_error *err) {
    for (int k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
        float *at = block + b->offset;
        if (!b->stage) {
            CDDP_TRY(cddp_comm_allgather(d->group, at + lo, at, c, CDDP_COMM_F32,
                                         cddp__ddp_timeout(d), err));
            continue;
        }
        float *mine = b->stage + (size_t)(d->rank * c);
        memset(mine, 0, (size_t)c * sizeof(float));
        memcpy(mine, at + lo, (size_t)(hi - lo) * sizeof(float));
        CDDP_TRY(cddp_comm_allgather(d->group, mine, b->stage, c, CDDP_COMM_F32,
                                     cddp__ddp_timeout(d), err));
        memcpy(at, b->stage, b->numel * sizeof(float));
    }
    return CDDP_OK;
}

/* The allgather on the device by its communicator (the nccl and ipc options): as gather_host,
 * the copies device copies; then the device's stream joined to it, and the watchdog given it
 * (NCCL's errors show at the next call). */
static int gather_device(cddp_ddp *d, float *block, cddp_error *err) {
    for (int k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
        float *at = block + b->offset;
        if (!b->stage) { /* divides evenly: rank r's part is at r c, in place */
            CDDP_TRY(cddp_dcomm_allgather(d->dcomm, at + lo, at, c, CDDP_COMM_F32, err));
            continue;
        }
        float *mine = b->stage + (size_t)(d->rank * c);
        CDDP_TRY(cddp_device_memset(d->dev, mine, 0, (size_t)c * sizeof(float), err));
        CDDP_TRY(cddp_device_copy(d->dev, mine, at + lo, (size_t)(hi - lo) * sizeof(float), err));
        CDDP_TRY(cddp_dcomm_allgather(d->dcomm, mine, b->stage, c, CDDP_COMM_F32, err));
        CDDP_TRY(cddp_dcomm_join(d->dcomm, err)); /* the copy on the device's stream after it */
        CDDP_TRY(cddp_device_copy(d->dev, at, b->stage, b->numel * sizeof(float), err));
    }
    CDDP_TRY(cddp_dcomm_join(d->dcomm, err)); /* the next forward reads the gathered parameters */
    return cddp_dcomm_watch(d->dcomm, err);
}

/* block is the model's device's memory: gathered in place on the host, or (staged) through a host
 * copy, from the device and back; with nccl or ipc, on the device. */
int cddp__ddp_zero_gather(cddp_ddp *d, float *block, cddp_error *err) {
    if (d->dcomm) return gather_device(d, block, err);
    if (!d->staged) return gather_host(d, block, err);
    size_t bytes = cddp_model_numel(d->model) * sizeof(float);
    bool params = block == cddp_model_data(d->model); /* the step's: into the parameters' copy */
    float *host = params ? d->hparams : cddp_aligned_alloc(bytes + 64);
    if (!host) return cddp_error_set(err, CDDP_ENOMEM, "out of memory for the allgather");
    int rc = cddp_device_download(d->dev, host, block, bytes, err);
    if (rc == CDDP_OK) rc = gather_host(d, host, err);
    if (rc == CDDP_OK) rc = cddp_device_upload(d->dev, block, host, bytes, err);
    if (!params) cddp_aligned_free(host);
    return rc;
}

void cddp__ddp_zero_after_step(cddp_ddp *d) {
    double t0 = cddp_now_s();
    cddp_error e = {0};
    if (cddp__ddp_zero_gather(d, cddp_model_data(d->model), &e) != CDDP_OK) {
        cddp_log(CDDP_LOG_ERROR, "ddp", "allgather of the parameters after the step: %s", e.msg);
        if (!d->hook_err.code) d->hook_err = e;
    }
    double t1 = cddp_now_s();
    d->stats.allgather_s = t1 - t0;
    cddp__ddp_record(d, "allgather", -1, 0, t0, t1);
}

/* Every rank's status, so that all go on together or all stop: the worst, and who had it. */
static int agree(cddp_ddp *d, int rc, cddp_error *err) {
    int32_t worst[2] = {rc != CDDP_OK ? 1 : 0, rc != CDDP_OK ? d->rank : -1};
    CDDP_TRY(cddp_comm_allreduce(d->group, worst, worst, 2, CDDP_COMM_I32, CDDP_COMM_MAX,
                                 cddp__ddp_timeout(d), err));
    if (rc != CDDP_OK) return rc;
    if (worst[0])
        return cddp_error_set(err, CDDP_ENOMEM,
                              "rank %d could not hold the whole optimizer state (its log says why)",
                              worst[1]);
    return CDDP_OK;
}

int cddp__ddp_zero_with_whole_state(cddp_ddp *d, cddp_optim *opt,
                                    int (*fn)(cddp_ddp *d, void *arg, cddp_error *err), void *arg,
                                    cddp_error *err) {
    cddp_error e = {0};
    /* The whole block: the optimizer keeps what it has, zeros elsewhere. */
    int mine = cddp_model_set_shard(d->model, 0, NULL, NULL, NULL, &e);
    if (mine == CDDP_OK) mine = cddp_optim_sync_shard(opt, &e);
    if (mine != CDDP_OK) cddp_log(CDDP_LOG_ERROR, "ddp", "%s", e.msg);
    int rc = agree(d, mine, err);
    if (mine != CDDP_OK && err) *err = e;
    for (int s = 0; rc == CDDP_OK && s < cddp_optim_num_states(opt); s++)
        rc = cddp__ddp_zero_gather(d, cddp_optim_state(opt, s, NULL), err);
    if (rc == CDDP_OK) rc = fn(d, arg, err);
    /* Back to the shard; shrinking cannot fail but for memory, which then says so. */
    cddp_error back = {0};
    int st = cddp_model_set_shard(d->model, d->nbuckets, d->shard, sum_double, d, &back);
    if (st == CDDP_OK) st = cddp_optim_sync_shard(opt, &back);
    if (st != CDDP_OK && rc == CDDP_OK) {
        if (err) *err = back;
        rc = st;
    }
    return rc;
}

cddp_ddp_memory cddp_ddp_memory_get(const cddp_ddp *d, const cddp_optim *opt) {
    size_t numel = cddp_model_numel(d->model), shard = shard_numel(d);
    cddp_ddp_memory m = {
        .stage = d->o.shard_gradients   ? 2
                 : d->o.shard_optimizer ? 1
                                        : 0,
        .params = numel * sizeof(float),
        /* released on the CPU; a device's are zeroed, their memory kept */
        .grads = (d->o.shard_gradients && cddp_device_host_accessible(d->dev) ? shard : numel) *
                 sizeof(float),
        .optimizer =
            opt ? cddp_optim_state_numel(opt) * (size_t)cddp_optim_num_states(opt) * sizeof(float)
                : 0,
    };
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) m.peak_rss = (size_t)ru.ru_maxrss * 1024;
    return m;
}
