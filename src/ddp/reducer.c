/* reducer.c: what reduces one gradient bucket (the interface is in ddp/internal.h).
 *
 *   allreduce  a bucket that is one range of the flat gradient block is reduced in place (with
 *              the block in memory from cddp_comm_alloc, the shared-memory transport reads every
 *              rank's copy where it is: no copy at all); a bucket rebuilt from a ready order that
 *              jumps around is packed into a staging buffer and unpacked afterwards
 *   comm_hook  the user's function (cddp_ddp_options.comm_hook) on the bucket's gradients, one
 *              range of the block or packed as allreduce's, queued on the group's thread as one
 *              call (its blocking collectives run there, in its turn) or run inline
 *   zero       (shard_optimizer) every bucket is reduce-scattered: each rank receives its part
 *              (cddp__ddp_part) of the reduced bucket, in place when the bucket divides evenly,
 *              else through a staging buffer padded with zeros to world parts of equal length
 *   bf16, fp16 every bucket is packed as 16-bit floats (rounded to nearest even), summed by the
 *              transport in float32, and unpacked with the mean applied in float32: half the
 *              bytes on the wire, PyTorch's bf16/fp16 compression hooks; with shard_optimizer
 *              reduce-scattered alike (zero_half), each rank unpacking its part
 *   device     (the nccl and ipc options) every bucket is allreduced in the device's memory by
 *              the device communicator (cddp/dcomm.h: NCCL's or CUDA IPC's), on its stream after
 *              the kernels that wrote the gradients (so nothing waits for them); a bucket that is
 *              not one range is packed and unpacked by device copies; with shard_optimizer,
 *              reduce-scattered as zero's are, padded on the device; with a bf16/fp16 hook (NCCL
 *              only), rounded on the device and summed by NCCL in 16 bits
 *
 * Packing runs where the collective runs (cddp__ddp_before): on the communication thread when
 * buckets are reduced there, after whatever must come first (a device's copy of the gradients).
 */
#include "ddp/internal.h"

#include "cddp/internal/device.h"

#include <stdio.h>
#include <string.h>

void cddp__ddp_before(cddp_ddp *d, bucket *b, cddp_comm_fn fn) {
    cddp_error err = {0};
    if (d->inline_comm) {
        if (fn(b, &err) != CDDP_OK && !d->hook_err.code) d->hook_err = err;
        return;
    }
    CDDP_CHECK(b->npre < (int)CDDP_ARRAY_LEN(b->pre), "DDP: a bucket with more than %d steps",
               (int)CDDP_ARRAY_LEN(b->pre));
    cddp_comm_work *w = cddp_comm_call_async(d->group, fn, b, &err);
    if (w)
        b->pre[b->npre++] = w;
    else if (!d->hook_err.code)
        d->hook_err = err;
}

void cddp__ddp_after(cddp_ddp *d, bucket *b, cddp_comm_fn fn) {
    cddp_error err = {0};
    if (d->inline_comm) {
        if (b->reduced && fn(b, &err) != CDDP_OK && !d->hook_err.code) d->hook_err = err;
        return;
    }
    if (!b->work) return; /* its launch failed: the hook's error says so */
    if (!(b->post = cddp_comm_call_async(d->group, fn, b, &err)) && !d->hook_err.code)
        d->hook_err = err;
}

void cddp__ddp_collective(cddp_ddp *d, bucket *b, cddp__ddp_kind kind, const void *send, void *recv,
                          int64_t count, cddp_comm_dtype dtype, cddp_comm_op op) {
    cddp_error err = {0};
    double t = cddp__ddp_timeout(d);
    bool scatter = kind == CDDP__DDP_REDUCE_SCATTER;
    if (d->inline_comm) {
        b->t_start = cddp_now_s();
        int rc = scatter ? cddp_comm_reduce_scatter(d->group, send, recv, count, dtype, op, t, &err)
                         : cddp_comm_allreduce(d->group, send, recv, count, dtype, op, t, &err);
        b->t_end = cddp_now_s();
        b->reduced = rc == CDDP_OK;
    } else {
        b->work =
            scatter
                ? cddp_comm_reduce_scatter_async(d->group, send, recv, count, dtype, op, t, &err)
                : cddp_comm_allreduce_async(d->group, send, recv, count, dtype, op, t, &err);
    }
    if (!b->work && !b->reduced && !d->hook_err.code) d->hook_err = err;
}

void cddp__ddp_collective_first(cddp_ddp *d, bucket *b, const void *send, void *recv, int64_t count,
                                cddp_comm_op op) {
    cddp_error err = {0};
    double t = cddp__ddp_timeout(d);
    if (d->inline_comm) {
        if (cddp_comm_allreduce(d->group, send, recv, count, CDDP_COMM_F32, op, t, &err) &&
            !d->hook_err.code)
            d->hook_err = err;
        return;
    }
    CDDP_CHECK(b->npre < (int)CDDP_ARRAY_LEN(b->pre), "DDP: a bucket with more than %d steps",
               (int)CDDP_ARRAY_LEN(b->pre));
    cddp_comm_work *w =
        cddp_comm_allreduce_async(d->group, send, recv, count, CDDP_COMM_F32, op, t, &err);
    if (w)
        b->pre[b->npre++] = w;
    else if (!d->hook_err.code)
        d->hook_err = err;
}

/* Copies the bucket's gradients to stage back to back (to_block false), or back (true). */
static void pack(cddp_ddp *d, bucket *b, float *stage, bool to_block) {
    size_t at = 0;
    for (int j = 0; j < b->nparams; j++) {
        int64_t n = cddp_model_param(d->model, b->params[j])->numel;
        float *g = cddp__ddp_grad(d, b->params[j]);
        if (to_block)
            memcpy(g, stage + at, (size_t)n * sizeof(float));
        else
            memcpy(stage + at, g, (size_t)n * sizeof(float));
        at += (size_t)n;
    }
}

/* ---- allreduce --------------------------------------------------------------------------- */

static int plain_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    (void)d;
    if (b->offset < 0 && !(b->stage = cddp_aligned_alloc(b->numel * sizeof(float) + 64)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return CDDP_OK;
}

static int plain_pack(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    (void)err;
    pack(b->ddp, b, b->stage, false);
    return CDDP_OK;
}

static void plain_launch(cddp_ddp *d, bucket *b) {
    float *buf = b->stage;
    if (b->offset >= 0)
        buf = d->hgrad + b->offset;
    else
        cddp__ddp_before(d, b, plain_pack);
    cddp__ddp_collective(d, b, CDDP__DDP_ALLREDUCE, buf, buf, (int64_t)b->numel, CDDP_COMM_F32,
                         d->o.sum ? CDDP_COMM_SUM : CDDP_COMM_MEAN);
}

static void plain_finish(cddp_ddp *d, bucket *b) {
    if (b->offset < 0) pack(d, b, b->stage, true);
}

const cddp__reducer cddp__allreduce_reducer = {"allreduce", plain_prepare, plain_launch,
                                               plain_finish};

/* ---- a hook of the user's (cddp_ddp_options.comm_hook) ----------------------------------- */

/* The hook on the bucket's gradients (packed first when the bucket is not one range). A failure
 * aborts the group, so that the other ranks, which may wait for this one in the hook's
 * collectives, fail at once with its reason. */
static int user_call(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    cddp_ddp *d = b->ddp;
    int k = (int)(b - d->buckets);
    float *buf = b->offset >= 0 ? d->hgrad + b->offset : b->stage;
    if (b->offset < 0) pack(d, b, b->stage, false);
    cddp_error e = {0};
    int rc = d->o.comm_hook(d->o.comm_hook_state, d->group, k, buf, (int64_t)b->numel, &e);
    if (rc == CDDP_OK) return CDDP_OK;
    if (!e.msg[0]) cddp_error_set(&e, rc, "status %d, no message", rc);
    int skip = 0; /* the "rank N: " it may start with: the message is this rank's anyway */
    sscanf(e.msg, "rank %*d: %n", &skip);
    char why[CDDP_ERROR_MSG_MAX];
    snprintf(why, sizeof why, "DDP: the comm_hook failed on bucket %d: %.400s", k, e.msg + skip);
    cddp_comm_abort(d->group, why);
    return cddp_error_set(err, rc < 0 ? rc : CDDP_EIO, "%s", why);
}

static void user_launch(cddp_ddp *d, bucket *b) {
    cddp_error err = {0};
    if (d->inline_comm) {
        b->t_start = cddp_now_s();
        int rc = user_call(b, &err);
        b->t_end = cddp_now_s();
        b->reduced = rc == CDDP_OK;
    } else {
        b->work = cddp_comm_call_async(d->group, user_call, b, &err);
    }
    if (!b->work && !b->reduced && !d->hook_err.code) d->hook_err = err;
}

const cddp__reducer cddp__user_reducer = {"comm_hook", plain_prepare, user_launch, plain_finish};

/* ---- reduce-scatter (ZeRO-1) ------------------------------------------------------------- */

static int zero_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    if (b->offset < 0)
        return cddp_error_set(err, CDDP_ESTATE, "shard_optimizer: a bucket is not one range");
    size_t padded = (size_t)(c * d->world);
    if (padded != b->numel && !(b->stage = cddp_aligned_alloc(padded * sizeof(float) + 64)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return CDDP_OK;
}

/* The bucket into its staging buffer, padded with zeros to world parts of equal length. */
static int zero_pack(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    cddp_ddp *d = b->ddp;
    (void)err;
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    memcpy(b->stage, d->hgrad + b->offset, b->numel * sizeof(float));
    memset(b->stage + b->numel, 0, ((size_t)(c * d->world) - b->numel) * sizeof(float));
    return CDDP_OK;
}

/* ZeRO-2 on host memory: the bucket's gradients outside this rank's part released as soon as
 * its reduce-scatter has read them (a staged model's device block: at the bucket's finish). */
static void release_after(cddp_ddp *d, bucket *b) {
    if (d->o.shard_gradients && !d->staged) cddp__ddp_after(d, b, cddp__ddp_release_step);
}

static void zero_launch(cddp_ddp *d, bucket *b) {
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    float *buf = d->hgrad + b->offset;
    if (b->stage) {
        cddp__ddp_before(d, b, zero_pack);
        buf = b->stage;
    }
    cddp__ddp_collective(d, b, CDDP__DDP_REDUCE_SCATTER, buf, buf + (size_t)(d->rank * c), c,
                         CDDP_COMM_F32, d->o.sum ? CDDP_COMM_SUM : CDDP_COMM_MEAN);
    release_after(d, b);
}

static void zero_finish(cddp_ddp *d, bucket *b) {
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    float *g = d->hgrad + b->offset;
    if (b->stage && hi > lo)
        memcpy(g + lo, b->stage + (size_t)(d->rank * c), (size_t)(hi - lo) * sizeof(float));
}

const cddp__reducer cddp__zero_reducer = {"reduce_scatter", zero_prepare, zero_launch, zero_finish};

/* ---- bf16 and fp16 compression ----------------------------------------------------------- */

static cddp_comm_dtype half_type(const cddp_ddp *d) {
    return d->o.hook == CDDP_DDP_HOOK_BF16 ? CDDP_COMM_BF16 : CDDP_COMM_F16;
}

static int half_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    (void)d;
    if (!(b->half = cddp_aligned_alloc(b->numel * sizeof(uint16_t) + 64)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return CDDP_OK;
}

static int half_pack(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    cddp_ddp *d = b->ddp;
    (void)err;
    size_t at = 0;
    for (int j = 0; j < b->nparams; j++) {
        int64_t n = cddp_model_param(d->model, b->params[j])->numel;
        cddp_comm_from_f32(half_type(d), cddp__ddp_grad(d, b->params[j]), b->half + at, n);
        at += (size_t)n;
    }
    return CDDP_OK;
}

/* Summed, not averaged: the mean is applied in float32 when unpacking. */
static void half_launch(cddp_ddp *d, bucket *b) {
    cddp__ddp_before(d, b, half_pack);
    cddp__ddp_collective(d, b, CDDP__DDP_ALLREDUCE, b->half, b->half, (int64_t)b->numel,
                         half_type(d), CDDP_COMM_SUM);
}

/* n summed 16-bit values into float32 gradients, the mean applied (not with sum). */
static void unpack_half(const cddp_ddp *d, const uint16_t *from, float *g, int64_t n) {
    float scale = d->o.sum ? 1.0f : 1.0f / (float)d->world;
    cddp_comm_to_f32(half_type(d), from, g, n);
    for (int64_t e = 0; e < n; e++) g[e] *= scale;
}

static void half_finish(cddp_ddp *d, bucket *b) {
    size_t at = 0;
    for (int j = 0; j < b->nparams; j++) {
        int64_t n = cddp_model_param(d->model, b->params[j])->numel;
        unpack_half(d, b->half + at, cddp__ddp_grad(d, b->params[j]), n);
        at += (size_t)n;
    }
}

/* ---- bf16 and fp16 compression with the sharded optimizer: reduce-scatter of 16-bit copies -- */

/* The bucket as 16-bit floats, padded with zeros to world parts of equal length; and what the
 * float32 reducer prepares too: the parameters' allgather after each step (zero.c) goes through
 * its padded staging buffer where the parts do not divide the bucket evenly. */
static int zero_half_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    CDDP_TRY(zero_prepare(d, b, err));
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    if (!(b->half = cddp_aligned_alloc((size_t)(c * d->world) * sizeof(uint16_t) + 64)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return CDDP_OK;
}

static int zero_half_pack(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    cddp_ddp *d = b->ddp;
    (void)err;
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    cddp_comm_from_f32(half_type(d), d->hgrad + b->offset, b->half, (int64_t)b->numel);
    memset(b->half + b->numel, 0, ((size_t)(c * d->world) - b->numel) * sizeof(uint16_t));
    return CDDP_OK;
}

/* Summed, not averaged: the mean is applied in float32 when unpacking. */
static void zero_half_launch(cddp_ddp *d, bucket *b) {
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    cddp__ddp_before(d, b, zero_half_pack);
    cddp__ddp_collective(d, b, CDDP__DDP_REDUCE_SCATTER, b->half, b->half + (size_t)(d->rank * c),
                         c, half_type(d), CDDP_COMM_SUM);
    release_after(d, b);
}

static void zero_half_finish(cddp_ddp *d, bucket *b) {
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    if (hi > lo)
        unpack_half(d, b->half + (size_t)(d->rank * c), d->hgrad + b->offset + lo, hi - lo);
}

const cddp__reducer cddp__zero_half_reducer = {"reduce_scatter_16", zero_half_prepare,
                                               zero_half_launch, zero_half_finish};

const cddp__reducer cddp__bf16_reducer = {"bf16", half_prepare, half_launch, half_finish};
const cddp__reducer cddp__fp16_reducer = {"fp16", half_prepare, half_launch, half_finish};

/* ---- on the device (NCCL, CUDA IPC)
 * ----------------------------------------------------------------- */

static int dev_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    if (b->offset >= 0) return CDDP_OK;
    b->stage = cddp_device_alloc(d->dev, b->numel * sizeof(float), err);
    return b->stage ? CDDP_OK : err->code;
}

/* The bucket's gradients to its staging buffer (to_block false) or back, on the device. */
static int dev_pack(cddp_ddp *d, bucket *b, bool to_block, cddp_error *err) {
    float *g = cddp_model_grad(d->model), *s = b->stage;
    for (int j = 0; j < b->nparams; j++) {
        size_t n = (size_t)cddp_model_param(d->model, b->params[j])->numel * sizeof(float);
        float *p = g + cddp_model_param_offset(d->model, b->params[j]);
        CDDP_TRY(to_block ? cddp_device_copy(d->dev, p, s, n, err)
                          : cddp_device_copy(d->dev, s, p, n, err));
        s += n / sizeof(float);
    }
    return CDDP_OK;
}

/* The end of a bucket's launch on NCCL: when it ended, whether it is queued, a failure kept. */
static void dev_launched(cddp_ddp *d, bucket *b, int rc, const cddp_error *err) {
    b->t_end = cddp_now_s();
    b->reduced = rc == CDDP_OK;
    if (rc != CDDP_OK && !d->hook_err.code) d->hook_err = *err;
}

static void dev_launch(cddp_ddp *d, bucket *b) {
    cddp_error err = {0};
    float *buf = b->offset >= 0 ? cddp_model_grad(d->model) + b->offset : b->stage;
    b->t_start = cddp_now_s();
    int rc = b->offset >= 0 ? CDDP_OK : dev_pack(d, b, false, &err);
    if (rc == CDDP_OK)
        rc = cddp_dcomm_allreduce(d->dcomm, buf, buf, (int64_t)b->numel, CDDP_COMM_F32,
                                  d->o.sum ? CDDP_COMM_SUM : CDDP_COMM_MEAN, &err);
    dev_launched(d, b, rc, &err);
}

static void dev_finish(cddp_ddp *d, bucket *b) {
    cddp_error err = {0};
    if (b->offset < 0 && dev_pack(d, b, true, &err) != CDDP_OK && !d->hook_err.code)
        d->hook_err = err;
}

const cddp__reducer cddp__dev_reducer = {"device", dev_prepare, dev_launch, dev_finish};

static int dev_zero_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    if (b->offset < 0)
        return cddp_error_set(err, CDDP_ESTATE, "shard_optimizer: a bucket is not one range");
    size_t padded = (size_t)(c * d->world);
    if (padded == b->numel) return CDDP_OK;
    b->stage = cddp_device_alloc(d->dev, padded * sizeof(float), err);
    return b->stage ? CDDP_OK : err->code;
}

/* As zero_launch, on the device: the bucket padded with zeros into its staging buffer when it
 * does not divide evenly, then reduce-scattered in place. */
static void dev_zero_launch(cddp_ddp *d, bucket *b) {
    cddp_error err = {0};
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    float *buf = cddp_model_grad(d->model) + b->offset;
    size_t n = b->numel * sizeof(float), padded = (size_t)(c * d->world) * sizeof(float);
    b->t_start = cddp_now_s();
    int rc = CDDP_OK;
    if (b->stage) {
        rc = cddp_device_copy(d->dev, b->stage, buf, n, &err);
        if (rc == CDDP_OK)
            rc = cddp_device_memset(d->dev, (char *)b->stage + n, 0, padded - n, &err);
        buf = b->stage;
    }
    if (rc == CDDP_OK)
        rc = cddp_dcomm_reduce_scatter(d->dcomm, buf, buf + (size_t)(d->rank * c), c, CDDP_COMM_F32,
                                       d->o.sum ? CDDP_COMM_SUM : CDDP_COMM_MEAN, &err);
    dev_launched(d, b, rc, &err);
}

static void dev_zero_finish(cddp_ddp *d, bucket *b) {
    cddp_error err = {0};
    int64_t lo, hi, c = cddp__ddp_part(d, b, d->rank, &lo, &hi);
    if (b->stage && hi > lo &&
        cddp_device_copy(d->dev, cddp_model_grad(d->model) + b->offset + lo,
                         b->stage + (size_t)(d->rank * c), (size_t)(hi - lo) * sizeof(float),
                         &err) != CDDP_OK &&
        !d->hook_err.code)
        d->hook_err = err;
}

const cddp__reducer cddp__dev_zero_reducer = {"device_reduce_scatter", dev_zero_prepare,
                                              dev_zero_launch, dev_zero_finish};

/* bf16 and fp16 compression on the device: the bucket rounded into its 16-bit buffer there, summed
 * by NCCL in that type, the mean applied in float32 when widening it back into the gradients. */
static int dev_half_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    b->half = cddp_device_alloc(d->dev, b->numel * sizeof(uint16_t), err);
    return b->half ? CDDP_OK : err->code;
}

/* Each of the bucket's gradients into its place in b->half (to_half) or back; a bucket that is
 * one range of the gradient block in one kernel. */
static void dev_half_pack(cddp_ddp *d, bucket *b, bool back) {
    bool f16 = d->o.hook == CDDP_DDP_HOOK_FP16, one = b->offset >= 0;
    float scale = d->o.sum ? 1.0f : 1.0f / (float)d->world, *g = cddp_model_grad(d->model);
    size_t at = 0;
    for (int j = 0; j < (one ? 1 : b->nparams); j++) {
        size_t n = one ? b->numel : (size_t)cddp_model_param(d->model, b->params[j])->numel;
        float *p = g + (one ? (size_t)b->offset : cddp_model_param_offset(d->model, b->params[j]));
        if (back)
            cddp_device_from_half(d->dev, p, b->half + at, n, f16, scale);
        else
            cddp_device_to_half(d->dev, b->half + at, p, n, f16);
        at += n;
    }
}

static void dev_half_launch(cddp_ddp *d, bucket *b) {
    cddp_error err = {0};
    b->t_start = cddp_now_s();
    dev_half_pack(d, b, false);
    int rc = cddp_dcomm_allreduce(d->dcomm, b->half, b->half, (int64_t)b->numel, half_type(d),
                                  CDDP_COMM_SUM, &err);
    dev_launched(d, b, rc, &err);
}

static void dev_half_finish(cddp_ddp *d, bucket *b) {
    dev_half_pack(d, b, true);
}

const cddp__reducer cddp__dev_bf16_reducer = {"device_bf16", dev_half_prepare, dev_half_launch,
                                              dev_half_finish};
const cddp__reducer cddp__dev_fp16_reducer = {"device_fp16", dev_half_prepare, dev_half_launch,
                                              dev_half_finish};

const cddp__reducer *cddp__ddp_reducer(const cddp_ddp *d) {
    const cddp_ddp_options *o = &d->o;
    bool dev = cddp__ddp_on_device(d);
    if (dev && o->hook != CDDP_DDP_HOOK_NONE)
        return o->hook == CDDP_DDP_HOOK_BF16 ? &cddp__dev_bf16_reducer : &cddp__dev_fp16_reducer;
    if (dev) return o->shard_optimizer ? &cddp__dev_zero_reducer : &cddp__dev_reducer;
    if (o->shard_optimizer)
        return o->hook == CDDP_DDP_HOOK_NONE ? &cddp__zero_reducer : &cddp__zero_half_reducer;
    if (o->comm_hook) return &cddp__user_reducer;
    switch (o->hook) {
    case CDDP_DDP_HOOK_POWERSGD:
        return &cddp__powersgd_reducer;
    case CDDP_DDP_HOOK_BF16:
        return &cddp__bf16_reducer;
    case CDDP_DDP_HOOK_FP16:
        return &cddp__fp16_reducer;
    default:
        return &cddp__allreduce_reducer;
    }
}
