/* ddp.c: DistributedDataParallel over the model's flat gradient block.
 *
 * A bucket is a list of parameters whose gradients are reduced by one allreduce. While it holds
 * parameters that are neighbours in the flat block (the default: reverse declaration order), it
 * is one range of the block, reduced in place; a bucket rebuilt from a ready order that jumps
 * around is packed into a staging buffer first. With a compression hook every bucket is packed,
 * converted to 16 bits, summed (float32 accumulation in comm) and unpacked with the mean.
 *
 * A synchronised backward:
 *   first ready hook  queue the end-of-backward callback (finish); with join, queue the
 *                     allreduce of who is still training
 *   each ready hook   count the parameter off its bucket; launch every complete bucket that is
 *                     next in bucket order (launch order is the same on every rank): queued on
 *                     the communication thread, or, inline, reduced right here
 *   finish            parameters that got no gradient: an error naming them (the group is
 *                     aborted with it, so every rank reports it) or, with find_unused_parameters,
 *                     ready as they are; launch the rest; queue the used-parameter map; wait for
 *                     everything; unpack; restore parameters no rank used; after the first step,
 *                     rebuild the buckets in rank 0's ready order
 * Every rank issues the same collectives in the same order, which the fingerprints check.
 */
#include "cddp/ddp.h"
#include "comm/internal.h"
#include "core/internal.h"
#include "tensor/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define FIRST_BUCKET_BYTES ((size_t)1 << 20)

typedef struct bucket {
    int *params; /* parameter indices, in the order they are expected ready */
    int nparams;
    size_t numel;
    int64_t offset; /* first element in the flat block when contiguous, else -1 */
    int pending;    /* parameters still to become ready in this backward */
    float *stage;   /* packed float32 (non-contiguous buckets) */
    uint16_t *half; /* packed 16-bit (compression hooks) */
    cddp_comm_work *work;
    bool reduced; /* reduced inline, not yet finished */
    double t_start, t_end;
} bucket;

typedef struct event {
    const char *name;
    int bucket; /* -1: none */
    int tid;    /* 0: the training thread, 1: the communication thread */
    double t0, t1;
} event;

struct cddp_ddp {
    cddp_model *model;
    cddp_comm *group;
    float *grad_block; /* the model's gradients, in memory from cddp_comm_alloc (or NULL) */
    cddp_ddp_options o;
    int rank, world, nparams;
    double timeout;
    bucket *buckets;
    int nbuckets;
    int *bucket_of;   /* parameter -> bucket */
    bool *ready;      /* per parameter, in this backward */
    int32_t *used;    /* per parameter: got a gradient since the last synchronised step */
    float *saved;     /* gradients of locally unused parameters (find_unused_parameters) */
    bool *missing;    /* per parameter: not ready at the end of this backward */
    int *ready_order; /* the first step's order, for the rebuild */
    int nready_order;
    bool rebuilt, no_sync, in_backward, joined;
    bool inline_comm; /* buckets are reduced on the training thread (CDDP_DDP_OVERLAP_INLINE) */
    int next_launch;
    int32_t *active; /* join: per rank, 1 while it is training */
    cddp_comm_work *active_work, *used_work;
    cddp_error hook_err; /* the first failure inside a hook, reported by finish */
    int64_t steps;
    /* statistics and timeline */
    double t_forward, t_optim;
    cddp_ddp_stats stats;
    bool print_stats;
    long stats_every;
    char *timeline;
    event *events;
    size_t nevents, cap_events;
};

/* ---- small helpers ----------------------------------------------------------------------- */

cddp_model *cddp_ddp_model(const cddp_ddp *d) {
    return d->model;
}
cddp_comm *cddp_ddp_group(const cddp_ddp *d) {
    return d->group;
}
int cddp_ddp_rank(const cddp_ddp *d) {
    return d->rank;
}
int cddp_ddp_world_size(const cddp_ddp *d) {
    return d->world;
}
int cddp_ddp_local_rank(const cddp_ddp *d) {
    return cddp_comm_local_rank(d->group);
}
void cddp_ddp_no_sync(cddp_ddp *d, bool on) {
    d->no_sync = on;
}
cddp_ddp_stats cddp_ddp_stats_get(const cddp_ddp *d) {
    return d->stats;
}
int cddp_ddp_num_buckets(const cddp_ddp *d) {
    return d->nbuckets;
}

int cddp_ddp_bucket_params(const cddp_ddp *d, int b, int *params, int cap) {
    if (b < 0 || b >= d->nbuckets) return 0;
    for (int i = 0; i < d->buckets[b].nparams && i < cap; i++) params[i] = d->buckets[b].params[i];
    return d->buckets[b].nparams;
}

int cddp_ddp_print0(const cddp_ddp *d, const char *fmt, ...) {
    if (d->rank != 0) return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    return n;
}

/* A timeline is for profiling a stretch of training: it keeps the first million events. */
#define MAX_EVENTS ((size_t)1 << 20)

static void record(cddp_ddp *d, const char *name, int b, int tid, double t0, double t1) {
    if (!d->timeline || d->nevents >= MAX_EVENTS) return;
    if (d->nevents == d->cap_events) {
        size_t cap = d->cap_events ? d->cap_events * 2 : 1024;
        event *e = cddp_realloc(d->events, cap * sizeof *e);
        if (!e) return; /* the timeline loses events rather than the step failing */
        d->events = e;
        d->cap_events = cap;
    }
    d->events[d->nevents++] = (event){name, b, tid, t0, t1};
}

static double timeout_of(const cddp_ddp *d) {
    return d->o.timeout_s > 0 ? d->o.timeout_s : -1;
}

/* ---- buckets ----------------------------------------------------------------------------- */

static void free_buckets(cddp_ddp *d) {
    for (int b = 0; b < d->nbuckets; b++) {
        cddp_free(d->buckets[b].params);
        cddp_aligned_free(d->buckets[b].stage);
        cddp_aligned_free(d->buckets[b].half);
    }
    cddp_free(d->buckets);
    d->buckets = NULL;
    d->nbuckets = 0;
}

/* Cuts order (every parameter once) into buckets as PyTorch does: parameters join the open
 * bucket until it holds at least its limit, which closes it; the first bucket's limit is 1 MiB,
 * the others' bucket_cap_mb. A small first bucket starts communication early in backward.
 * One refinement: a bucket that reached its limit but is not one range of the flat block stays
 * open (up to twice its limit) while the next parameters make it one, since backward produces
 * a layer's weight and bias together but not always in declaration order; a bucket that is one
 * range is reduced in place, with no packing copy. */
static int build_buckets(cddp_ddp *d, const int *order, cddp_error *err) {
    free_buckets(d);
    size_t cap = (size_t)(d->o.bucket_cap_mb * 1024 * 1024);
    d->buckets = cddp_calloc((size_t)d->nparams, sizeof *d->buckets);
    if (!d->buckets) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    size_t limit = CDDP_MIN(FIRST_BUCKET_BYTES, cap), first = 0, end = 0;
    bool open = false;
    for (int k = 0; k < d->nparams; k++) {
        int i = order[k];
        size_t off = cddp_model_param_offset(d->model, i);
        size_t n = (size_t)cddp_model_param(d->model, i)->numel;
        if (!open) {
            bucket *nb = &d->buckets[d->nbuckets++];
            nb->params = cddp_malloc(sizeof(int) * (size_t)d->nparams);
            if (!nb->params) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
            first = off;
            end = off + n;
            open = true;
        }
        bucket *b = &d->buckets[d->nbuckets - 1];
        b->params[b->nparams++] = i;
        b->numel += n;
        d->bucket_of[i] = d->nbuckets - 1;
        first = CDDP_MIN(first, off);
        end = CDDP_MAX(end, off + n);
        size_t bytes = b->numel * sizeof(float);
        if ((bytes >= limit && end - first == b->numel) || bytes >= 2 * limit) {
            open = false;
            limit = cap;
        }
    }
    for (int k = 0; k < d->nbuckets; k++) {
        bucket *b = &d->buckets[k];
        /* Contiguous when the parameters (disjoint ranges) tile one range, in whatever order:
         * the allreduce of the range does not care in which order they became ready. */
        size_t lo = (size_t)-1, hi = 0;
        for (int j = 0; j < b->nparams; j++) {
            size_t off = cddp_model_param_offset(d->model, b->params[j]);
            lo = CDDP_MIN(lo, off);
            hi = CDDP_MAX(hi, off + (size_t)cddp_model_param(d->model, b->params[j])->numel);
        }
        b->offset = hi - lo == b->numel ? (int64_t)lo : -1;
        char names[160] = "";
        for (int j = 0, at = 0; j < b->nparams && at < (int)sizeof names; j++)
            at += snprintf(names + at, sizeof names - (size_t)at, "%s%s", j ? " " : "",
                           cddp_model_param(d->model, b->params[j])->name);
        cddp_log(CDDP_LOG_DEBUG, "ddp", "bucket %d: %zu elements, %s: %s", k, b->numel,
                 b->offset >= 0 ? "one range" : "packed", names);
        if (b->offset < 0 && d->o.hook == CDDP_DDP_HOOK_NONE &&
            !(b->stage = cddp_aligned_alloc(b->numel * sizeof(float) + 64)))
            return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        if (d->o.hook != CDDP_DDP_HOOK_NONE &&
            !(b->half = cddp_aligned_alloc(b->numel * sizeof(uint16_t) + 64)))
            return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    return CDDP_OK;
}

/* ---- launching and finishing buckets ----------------------------------------------------- */

static float *grad_of(const cddp_ddp *d, int i) {
    return cddp_model_grad(d->model) + cddp_model_param_offset(d->model, i);
}

/* Starts bucket k's allreduce: queued on the communication thread, or run here and now. */
static void launch(cddp_ddp *d, int k) {
    bucket *b = &d->buckets[k];
    void *buf;
    cddp_comm_dtype dt = CDDP_COMM_F32;
    cddp_comm_op op = d->o.sum ? CDDP_COMM_SUM : CDDP_COMM_MEAN;
    if (d->o.hook != CDDP_DDP_HOOK_NONE) {
        uint16_t (*to)(float) =
            d->o.hook == CDDP_DDP_HOOK_BF16 ? cddp__f32_to_bf16 : cddp__f32_to_f16;
        size_t at = 0;
        for (int j = 0; j < b->nparams; j++) {
            const float *g = grad_of(d, b->params[j]);
            int64_t n = cddp_model_param(d->model, b->params[j])->numel;
            for (int64_t e = 0; e < n; e++) b->half[at + (size_t)e] = to(g[e]);
            at += (size_t)n;
        }
        buf = b->half;
        dt = d->o.hook == CDDP_DDP_HOOK_BF16 ? CDDP_COMM_BF16 : CDDP_COMM_F16;
        op = CDDP_COMM_SUM; /* the mean is applied in float32 when unpacking */
    } else if (b->offset >= 0) {
        buf = cddp_model_grad(d->model) + b->offset;
    } else {
        size_t at = 0;
        for (int j = 0; j < b->nparams; j++) {
            int64_t n = cddp_model_param(d->model, b->params[j])->numel;
            memcpy(b->stage + at, grad_of(d, b->params[j]), (size_t)n * sizeof(float));
            at += (size_t)n;
        }
        buf = b->stage;
    }
    cddp_error err = {0};
    if (d->inline_comm) {
        b->t_start = cddp_now_s();
        int rc =
            cddp_comm_allreduce(d->group, buf, buf, (int64_t)b->numel, dt, op, timeout_of(d), &err);
        b->t_end = cddp_now_s();
        b->reduced = rc == CDDP_OK;
    } else {
        b->work = cddp_comm_allreduce_async(d->group, buf, buf, (int64_t)b->numel, dt, op,
                                            timeout_of(d), &err);
    }
    if (!b->work && !b->reduced && !d->hook_err.code) d->hook_err = err;
}

/* Launches every complete bucket that is next in order. */
static void launch_ready(cddp_ddp *d) {
    while (d->next_launch < d->nbuckets && d->buckets[d->next_launch].pending == 0)
        launch(d, d->next_launch++);
}

/* Waits for bucket k and moves its result into the gradients. */
static int finish_bucket(cddp_ddp *d, int k, cddp_error *err) {
    bucket *b = &d->buckets[k];
    if (b->work) {
        int rc = cddp__comm_wait_timed(b->work, -1, err, &b->t_start, &b->t_end);
        b->work = NULL;
        CDDP_TRY(rc);
    } else if (b->reduced) {
        b->reduced = false;
    } else {
        return CDDP_OK; /* not launched, or its launch failed (the hook's error says so) */
    }
    record(d, "allreduce", k, d->inline_comm ? 0 : 1, b->t_start, b->t_end);
    if (d->o.hook == CDDP_DDP_HOOK_NONE && b->offset >= 0) return CDDP_OK;
    float (*from)(uint16_t) =
        d->o.hook == CDDP_DDP_HOOK_BF16 ? cddp__bf16_to_f32 : cddp__f16_to_f32;
    float scale = d->o.sum ? 1.0f : 1.0f / (float)d->world;
    size_t at = 0;
    for (int j = 0; j < b->nparams; j++) {
        float *g = grad_of(d, b->params[j]);
        int64_t n = cddp_model_param(d->model, b->params[j])->numel;
        if (b->half)
            for (int64_t e = 0; e < n; e++) g[e] = from(b->half[at + (size_t)e]) * scale;
        else
            memcpy(g, b->stage + at, (size_t)n * sizeof(float));
        at += (size_t)n;
    }
    return CDDP_OK;
}

/* Waits for everything queued in this step (also after a failure: no work may outlive the
 * step and write into the gradients later). Returns the first failure. */
static int wait_all(cddp_ddp *d, cddp_error *err) {
    int rc = CDDP_OK;
    cddp_error e = {0};
    if (d->active_work) {
        int st = cddp_comm_wait(d->active_work, -1, &e);
        d->active_work = NULL;
        if (st && !rc) rc = st, *err = e;
    }
    for (int k = 0; k < d->nbuckets; k++) {
        int st = finish_bucket(d, k, &e);
        if (st && !rc) rc = st, *err = e;
    }
    if (d->used_work) {
        int st = cddp_comm_wait(d->used_work, -1, &e);
        d->used_work = NULL;
        if (st && !rc) rc = st, *err = e;
    }
    return rc;
}

/* ---- the backward ------------------------------------------------------------------------ */

static int finish(void *user, cddp_ctx *ctx, cddp_error *err);

static void reset_step(cddp_ddp *d) {
    d->next_launch = 0;
    for (int k = 0; k < d->nbuckets; k++) {
        d->buckets[k].pending = d->buckets[k].nparams;
        d->buckets[k].reduced = false;
    }
    memset(d->ready, 0, sizeof(bool) * (size_t)d->nparams);
    d->in_backward = false;
    d->hook_err = (cddp_error){0};
}

static void on_ready(void *user, cddp_tensor *p) {
    cddp_ddp *d = user;
    int i = p->param_index;
    d->used[i] = 1;
    if (d->no_sync) return;
    if (!d->in_backward) { /* the first hook of this backward */
        d->in_backward = true;
        if (cddp_backward_queue_callback(finish, d) != CDDP_OK && !d->hook_err.code)
            cddp_error_set(&d->hook_err, CDDP_ESTATE, "DDP: cannot queue the end of backward");
        if (d->o.join) {
            memset(d->active, 0, sizeof(int32_t) * (size_t)d->world);
            d->active[d->rank] = 1;
            cddp_error e = {0};
            d->active_work =
                cddp_comm_allreduce_async(d->group, d->active, d->active, d->world, CDDP_COMM_I32,
                                          CDDP_COMM_SUM, timeout_of(d), &e);
            if (!d->active_work && !d->hook_err.code) d->hook_err = e;
        }
    }
    if (d->ready[i]) return;
    d->ready[i] = true;
    if (!d->rebuilt && d->nready_order < d->nparams) d->ready_order[d->nready_order++] = i;
    bucket *b = &d->buckets[d->bucket_of[i]];
    if (--b->pending == 0) launch_ready(d);
}

/* After the first step every rank takes rank 0's ready order (parameters that never became
 * ready go last, in reverse declaration order) and rebuilds its buckets from it. */
static int rebuild(cddp_ddp *d, cddp_error *err) {
    int *order = d->ready_order;
    bool *seen = cddp_calloc((size_t)d->nparams, sizeof *seen);
    if (!seen) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    for (int k = 0; k < d->nready_order; k++) seen[order[k]] = true;
    int n = d->nready_order;
    for (int i = d->nparams - 1; i >= 0; i--)
        if (!seen[i]) order[n++] = i;
    cddp_free(seen);
    d->nready_order = n;
    CDDP_TRY(
        cddp_comm_broadcast(d->group, order, d->nparams, CDDP_COMM_I32, 0, timeout_of(d), err));
    d->rebuilt = true;
    bool same = true; /* the buckets already follow this order */
    for (int k = 0, pos = 0; k < d->nbuckets && same; pos += d->buckets[k++].nparams)
        for (int j = 0; j < d->buckets[k].nparams && same; j++)
            same = order[pos + j] == d->buckets[k].params[j];
    return same ? CDDP_OK : build_buckets(d, order, err);
}

static void report_stats(cddp_ddp *d, double t_walk_end, double t_done, double t_backward0) {
    cddp_ddp_stats *s = &d->stats;
    s->steps = ++d->steps;
    s->forward_s = d->t_forward > 0 && d->t_forward < t_backward0 ? t_backward0 - d->t_forward : 0;
    s->backward_s = t_walk_end - t_backward0;
    s->wait_s = t_done - t_walk_end;
    s->comm_s = 0;
    for (int k = 0; k < d->nbuckets; k++) s->comm_s += d->buckets[k].t_end - d->buckets[k].t_start;
    s->overlap = s->comm_s > 0 && !d->inline_comm ? 1.0 - s->wait_s / s->comm_s : 0;
    if (s->overlap < 0) s->overlap = 0;
    s->buckets = d->nbuckets;
    s->bytes = cddp_model_numel(d->model) * (d->o.hook ? 2 : 4);
    s->comm_inline = d->inline_comm;
    if (d->t_forward > 0 && d->t_forward < t_backward0)
        record(d, "forward", -1, 0, d->t_forward, t_backward0);
    record(d, "backward", -1, 0, t_backward0, t_walk_end);
    record(d, "wait for buckets", -1, 0, t_walk_end, t_done);
    d->t_forward = 0;
    if (d->print_stats && d->rank == 0 && d->steps % d->stats_every == 0)
        printf("[cddp ddp] step %" PRId64 ": forward %.2f ms, backward %.2f ms, allreduce %.2f ms "
               "in %d buckets (%.1f MB%s), waited %.2f ms after backward, overlap %.0f%%\n",
               s->steps, s->forward_s * 1e3, s->backward_s * 1e3, s->comm_s * 1e3, s->buckets,
               (double)s->bytes / 1e6, d->inline_comm ? ", inline in backward" : "",
               s->wait_s * 1e3, s->overlap * 100);
}

static int finish(void *user, cddp_ctx *ctx, cddp_error *err) {
    cddp_ddp *d = user;
    double t_walk_end = cddp_now_s();
    int rc = CDDP_OK;
    if (d->hook_err.code) {
        *err = d->hook_err;
        rc = err->code;
    }
    /* Parameters that got no gradient. */
    int missing = -1, nmissing = 0;
    for (int i = d->nparams - 1; i >= 0; i--)
        if (!d->ready[i]) {
            if (missing < 0) missing = i;
            nmissing++;
        }
    if (rc == CDDP_OK && missing >= 0 && !d->o.find_unused_parameters) {
        char names[200] = "";
        size_t at = 0;
        for (int i = 0, shown = 0; i < d->nparams; i++)
            if (!d->ready[i] && at < sizeof names)
                at += (size_t)snprintf(names + at, sizeof names - at, "%s'%s'", shown++ ? ", " : "",
                                       cddp_model_param(d->model, i)->name);
        rc = cddp_error_set(err, CDDP_ESTATE,
                            "%s %s got no gradient in this backward; if some parameters are "
                            "unused on some steps, wrap with find_unused_parameters = true",
                            nmissing > 1 ? "parameters" : "parameter", names);
        cddp_comm_abort(d->group, err->msg); /* every rank's pending buckets fail with it */
    }
    if (rc == CDDP_OK && missing >= 0) { /* find_unused_parameters: ready as they are */
        size_t at = 0;
        for (int i = 0; i < d->nparams; i++)
            if ((d->missing[i] = !d->ready[i])) {
                int64_t n = cddp_model_param(d->model, i)->numel;
                memcpy(d->saved + at, grad_of(d, i), (size_t)n * sizeof(float));
                at += (size_t)n;
            }
        for (int i = d->nparams - 1; i >= 0; i--)
            if (!d->ready[i]) {
                d->ready[i] = true;
                if (--d->buckets[d->bucket_of[i]].pending == 0) launch_ready(d);
            }
    }
    if (rc == CDDP_OK && d->o.find_unused_parameters) {
        cddp_error e = {0};
        d->used_work = cddp_comm_allreduce_async(d->group, d->used, d->used, d->nparams,
                                                 CDDP_COMM_I32, CDDP_COMM_MAX, timeout_of(d), &e);
        if (!d->used_work) rc = e.code, *err = e;
    }
    cddp_error e = {0};
    int st = wait_all(d, &e);
    if (st && !rc) rc = st, *err = e;
    if (rc == CDDP_OK && missing >= 0) { /* no rank used it: the gradient stays as it was */
        size_t at = 0;
        for (int i = 0; i < d->nparams; i++) {
            if (!d->missing[i]) continue;
            int64_t n = cddp_model_param(d->model, i)->numel;
            if (!d->used[i]) memcpy(grad_of(d, i), d->saved + at, (size_t)n * sizeof(float));
            at += (size_t)n;
        }
    }
    if (rc == CDDP_OK && d->o.join) {
        for (int r = 0; r < d->world; r++)
            if (!d->active[r] && d->o.join_throw) {
                rc = cddp_error_set(err, CDDP_ESTATE, "rank %d ran out of inputs (join_throw)", r);
                break;
            }
    }
    if (rc == CDDP_OK && !d->rebuilt) rc = rebuild(d, err);
    double t_done = cddp_now_s();
    if (rc == CDDP_OK) report_stats(d, t_walk_end, t_done, ctx->backward_t0);
    memset(d->used, 0, sizeof(int32_t) * (size_t)d->nparams);
    reset_step(d);
    return rc;
}

/* Every rank takes rank src's buffers (BatchNorm's running statistics, ...), unless the wrapper
 * was told not to; nothing when the model has none. */
static int sync_buffers(cddp_ddp *d, int src, cddp_error *err) {
    size_t n = cddp_model_buffer_numel(d->model);
    if (n == 0 || d->o.no_broadcast_buffers) return CDDP_OK;
    return cddp_comm_broadcast(d->group, cddp_model_buffer_data(d->model), (int64_t)n,
                               CDDP_COMM_F32, src, timeout_of(d), err);
}

/* ---- statistics and timeline ------------------------------------------------------------- */

static void on_event(void *user, cddp_model *m, cddp_model_event ev) {
    cddp_ddp *d = user;
    double now = cddp_now_s();
    /* Before a forward in training mode (the one that a synchronised backward follows), rank 0's
     * buffers go to everyone, as PyTorch's broadcast_buffers does. A failure is reported by the
     * backward. */
    if (ev == CDDP_EVENT_FORWARD && cddp_model_training(m) && !d->no_sync && !d->joined) {
        cddp_error e = {0};
        if (sync_buffers(d, 0, &e) != CDDP_OK && !d->hook_err.code) d->hook_err = e;
    }
    if (ev == CDDP_EVENT_FORWARD)
        d->t_forward = now;
    else if (ev == CDDP_EVENT_OPTIM_BEGIN)
        d->t_optim = now;
    else
        record(d, "optimizer step", -1, 0, d->t_optim, now);
}

/* Appends this rank's events to the shared trace file, under a lock, keeping the file one valid
 * JSON array (rank 0 created it as "[\n]\n" when wrapping). */
static void write_timeline(cddp_ddp *d) {
    int fd = open(d->timeline, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        cddp_log(CDDP_LOG_WARN, "ddp", "cannot write the timeline %s: %s", d->timeline,
                 strerror(errno));
        return;
    }
    flock(fd, LOCK_EX);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    off_t end = lseek(fd, 0, SEEK_END);
    if (f) {
        fprintf(f, "%s", end > 4 ? ",\n" : "");
        fprintf(f,
                "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
                "\"rank %d\"}},\n"
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": "
                "{\"name\": \"training\"}},\n"
                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": "
                "{\"name\": \"communication\"}}",
                d->rank, d->rank, d->rank, d->rank);
        for (size_t i = 0; i < d->nevents; i++) {
            const event *e = &d->events[i];
            fprintf(f,
                    ",\n{\"name\": \"%s%s\", \"cat\": \"ddp\", \"ph\": \"X\", \"ts\": %.3f, "
                    "\"dur\": %.3f, \"pid\": %d, \"tid\": %d",
                    e->name, e->bucket >= 0 ? " bucket" : "", e->t0 * 1e6, (e->t1 - e->t0) * 1e6,
                    d->rank, e->tid);
            if (e->bucket >= 0) fprintf(f, ", \"args\": {\"bucket\": %d}", e->bucket);
            fprintf(f, "}");
        }
        fprintf(f, "\n]\n");
        fclose(f);
    }
    if (text && pwrite(fd, text, len, end > 4 ? end - 3 : (end >= 2 ? 2 : 0)) != (ssize_t)len)
        cddp_log(CDDP_LOG_WARN, "ddp", "writing the timeline %s failed", d->timeline);
    free(text);
    flock(fd, LOCK_UN);
    close(fd);
}

/* ---- wrap -------------------------------------------------------------------------------- */

/* What every rank must agree on. */
typedef struct wrap_rec {
    int64_t nparams, numel, nbuffers;
    double bucket_cap_mb;
    int32_t sum, find_unused, hook, join, join_throw, no_broadcast_buffers;
} wrap_rec;

typedef struct param_rec {
    char name[64];
    int64_t ndim;
    int64_t shape[CDDP_MAX_DIMS];
} param_rec;

static const char *hook_name(int h) {
    return h == CDDP_DDP_HOOK_BF16 ? "bf16" : h == CDDP_DDP_HOOK_FP16 ? "fp16" : "none";
}

/* Every rank compares every rank with rank 0, so each reports the same first difference. */
static int agree(cddp_ddp *d, cddp_error *err) {
    cddp_model *m = d->model;
    int W = d->world, rc = CDDP_OK;
    int nb = cddp_model_num_buffers(m), nrec = d->nparams + nb; /* parameters, then buffers */
    wrap_rec mine = {d->nparams,      (int64_t)cddp_model_numel(m), nb,        d->o.bucket_cap_mb,
                     d->o.sum,        d->o.find_unused_parameters,  d->o.hook, d->o.join,
                     d->o.join_throw, d->o.no_broadcast_buffers};
    wrap_rec *all = cddp_calloc((size_t)W, sizeof *all);
    param_rec *pm = cddp_calloc((size_t)nrec + 1, sizeof *pm);
    param_rec *pall = cddp_calloc((size_t)W * ((size_t)nrec + 1), sizeof *pall);
    if (!all || !pm || !pall) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        goto out;
    }
    CDDP_TRY_GOTO(cddp_comm_allgather(d->group, &mine, all, sizeof mine / 8, CDDP_COMM_I64,
                                      timeout_of(d), err),
                  out);
    for (int r = 1; r < W; r++) {
        const wrap_rec *a = &all[r], *z = &all[0];
        if (a->nparams != z->nparams) {
            rc = cddp_error_set(err, CDDP_ESHAPE,
                                "DDP: rank %d's model has %" PRId64 " parameters (%" PRId64
                                " elements) but rank 0's has %" PRId64 " (%" PRId64
                                "); every rank must build the same model",
                                r, a->nparams, a->numel, z->nparams, z->numel);
            goto out;
        }
        if (a->nbuffers != z->nbuffers) {
            rc = cddp_error_set(err, CDDP_ESHAPE,
                                "DDP: rank %d's model has %" PRId64 " buffers but rank 0's has "
                                "%" PRId64 "; every rank must build the same model",
                                r, a->nbuffers, z->nbuffers);
            goto out;
        }
#define SAME(field, name, fmt, conv)                                                               \
    if (a->field != z->field) {                                                                    \
        rc = cddp_error_set(err, CDDP_EINVAL,                                                      \
                            "DDP: rank %d wraps with " name " = " fmt " but rank 0 with " fmt      \
                            "; every rank must pass the same options",                             \
                            r, conv(a->field), conv(z->field));                                    \
        goto out;                                                                                  \
    }
#define ASIS(x) (x)
        SAME(bucket_cap_mb, "bucket_cap_mb", "%g", ASIS)
        SAME(sum, "sum", "%d", ASIS)
        SAME(find_unused, "find_unused_parameters", "%d", ASIS)
        SAME(hook, "hook", "%s", hook_name)
        SAME(join, "join", "%d", ASIS)
        SAME(join_throw, "join_throw", "%d", ASIS)
        SAME(no_broadcast_buffers, "no_broadcast_buffers", "%d", ASIS)
#undef SAME
#undef ASIS
    }
    for (int i = 0; i < nrec; i++) {
        const cddp_tensor *t =
            i < d->nparams ? cddp_model_param(m, i) : cddp_model_buffer(m, i - d->nparams);
        snprintf(pm[i].name, sizeof pm[i].name, "%s", t->name);
        pm[i].ndim = t->ndim;
        for (int k = 0; k < t->ndim; k++) pm[i].shape[k] = t->shape[k];
    }
    int64_t n = (int64_t)(((size_t)nrec + 1) * sizeof *pm / 8);
    CDDP_TRY_GOTO(cddp_comm_allgather(d->group, pm, pall, n, CDDP_COMM_I64, timeout_of(d), err),
                  out);
    for (int r = 1; r < W; r++)
        for (int i = 0; i < nrec; i++) {
            const param_rec *a = &pall[(size_t)r * ((size_t)nrec + 1) + (size_t)i], *z = &pall[i];
            if (memcmp(a, z, sizeof *a) == 0) continue;
            char sa[64], sz[64];
            cddp__shape_str((int)a->ndim, a->shape, sa, sizeof sa);
            cddp__shape_str((int)z->ndim, z->shape, sz, sizeof sz);
            rc = cddp_error_set(err, CDDP_ESHAPE,
                                "DDP: %s %d differs: rank %d has '%s' %s but rank 0 has "
                                "'%s' %s; every rank must build the same model",
                                i < d->nparams ? "parameter" : "buffer",
                                i < d->nparams ? i : i - d->nparams, r, a->name, sa, z->name, sz);
            goto out;
        }
out:
    cddp_free(all);
    cddp_free(pm);
    cddp_free(pall);
    return rc;
}

void cddp_ddp_destroy(cddp_ddp *d) {
    if (!d) return;
    if (d->timeline) write_timeline(d);
    if (d->model) {
        cddp_model_set_ready_hook(d->model, NULL, NULL);
        cddp_model_set_event_hook(d->model, NULL, NULL);
    }
    /* The model takes its gradients back into memory of its own; if it cannot, the block stays
     * (leaked) rather than leaving the model pointing at freed memory. */
    if (d->grad_block && d->model && cddp_model_set_grad_block(d->model, NULL) == CDDP_OK)
        cddp_comm_free(d->group, d->grad_block);
    free_buckets(d);
    cddp_free(d->bucket_of);
    cddp_free(d->ready);
    cddp_free(d->used);
    cddp_aligned_free(d->saved);
    cddp_free(d->missing);
    cddp_free(d->ready_order);
    cddp_free(d->active);
    cddp_free(d->timeline);
    cddp_free(d->events);
    cddp_free(d);
}

/* Moves the gradient block into memory the shared-memory transport reads in place, so that a
 * bucket's allreduce copies nothing in or out. The 16-bit hooks pack every bucket anyway, and
 * other backends have no such memory: the gradients stay where they are. If the memory cannot be
 * had (a small /dev/shm), training goes on with plain memory after a warning. */
static int place_gradients(cddp_ddp *d, cddp_error *err) {
    if (d->o.hook != CDDP_DDP_HOOK_NONE || strcmp(cddp_comm_backend(d->group), "shm") != 0 ||
        !cddp_knob_int(CDDP_KNOB_SHM_ZERO_COPY))
        return CDDP_OK;
    cddp_error e = {0};
    float *block = cddp_comm_alloc(d->group, cddp_model_numel(d->model) * sizeof(float), &e);
    if (!block) {
        if (cddp_comm_error(d->group)) { /* the group failed: a peer died, say */
            *err = e;
            return e.code;
        }
        cddp_log(CDDP_LOG_WARN, "ddp",
                 "gradients stay in plain memory (one more copy per "
                 "allreduce): %s",
                 e.msg);
        return CDDP_OK;
    }
    if (cddp_model_set_grad_block(d->model, block) != CDDP_OK) {
        cddp_comm_free(d->group, block);
        return cddp_error_set(err, CDDP_ENOMEM, "%s", cddp_model_error(d->model));
    }
    d->grad_block = block;
    return CDDP_OK;
}

/* Inline when the option or CDDP_DDP_OVERLAP says so, or (auto) when there is nothing to overlap
 * with (a group of one, whose allreduce moves nothing: the thread's hand-off alone would cost a
 * wake-up per step) or this host cannot give every local rank a core for its training thread and
 * another for its communication thread: the ranks' CPU set has fewer than 2 cores, or fewer than
 * two per rank on the host. A communication thread that must take turns with the training
 * threads gains no overlap and costs a thread switch, a wake-up and a cache refill per bucket. */
static int choose_overlap(cddp_ddp *d, cddp_error *err) {
    cddp_ddp_overlap o = d->o.overlap;
    const char *knob = cddp_knob_str(CDDP_KNOB_DDP_OVERLAP);
    if (o == CDDP_DDP_OVERLAP_AUTO && strcmp(knob, "thread") == 0) o = CDDP_DDP_OVERLAP_THREAD;
    if (o == CDDP_DDP_OVERLAP_AUTO && strcmp(knob, "inline") == 0) o = CDDP_DDP_OVERLAP_INLINE;
    if (o == CDDP_DDP_OVERLAP_AUTO && strcmp(knob, "auto") != 0)
        return cddp_error_set(err, CDDP_EINVAL,
                              "CDDP_DDP_OVERLAP=%s: expected thread, inline or auto", knob);
    if (o == CDDP_DDP_OVERLAP_AUTO) {
        cpu_set_t set;
        int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
        if (cores <= 0) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        int local = cddp_comm_local_size(d->group);
        o = d->world == 1 || cores < 2 * local ? CDDP_DDP_OVERLAP_INLINE : CDDP_DDP_OVERLAP_THREAD;
        cddp_log(CDDP_LOG_DEBUG, "ddp", "%d cores for %d ranks on this host: buckets reduced %s",
                 cores, local, o == CDDP_DDP_OVERLAP_INLINE ? "inline" : "on the thread");
    }
    d->inline_comm = o == CDDP_DDP_OVERLAP_INLINE;
    return CDDP_OK;
}

cddp_ddp *cddp_ddp_wrap(cddp_model *m, cddp_comm *group, const cddp_ddp_options *opts,
                        cddp_error *err) {
    if (!m || !group) {
        cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_wrap: the model and the group are required");
        return NULL;
    }
    if (cddp_model_numel(m) == 0 || !cddp_model_grad(m)) {
        cddp_error_set(err, CDDP_ESTATE,
                       "cddp_ddp_wrap: the model has no parameters, or is not built yet "
                       "(call cddp_model_build first)");
        return NULL;
    }
    cddp_ddp_options o = opts ? *opts : (cddp_ddp_options){0};
    if (o.bucket_cap_mb <= 0) o.bucket_cap_mb = 25;
    if ((unsigned)o.hook > CDDP_DDP_HOOK_FP16) {
        cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_wrap: unknown hook %d", (int)o.hook);
        return NULL;
    }
    if ((unsigned)o.overlap > CDDP_DDP_OVERLAP_INLINE) {
        cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_wrap: unknown overlap %d", (int)o.overlap);
        return NULL;
    }
    cddp_ddp *d = cddp_calloc(1, sizeof *d);
    if (!d) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    d->model = m;
    d->group = group;
    d->o = o;
    d->rank = cddp_comm_rank(group);
    d->world = cddp_comm_size(group);
    d->nparams = cddp_model_num_params(m);
    size_t np = (size_t)d->nparams;
    d->bucket_of = cddp_calloc(np, sizeof(int));
    d->ready = cddp_calloc(np, sizeof(bool));
    d->used = cddp_calloc(np, sizeof(int32_t));
    d->missing = cddp_calloc(np, sizeof(bool));
    d->ready_order = cddp_calloc(np, sizeof(int));
    d->active = cddp_calloc((size_t)d->world, sizeof(int32_t));
    if (o.find_unused_parameters)
        d->saved = cddp_aligned_alloc(cddp_model_numel(m) * sizeof(float) + 64);
    int rc = CDDP_OK;
    if (!d->bucket_of || !d->ready || !d->used || !d->missing || !d->ready_order || !d->active ||
        (o.find_unused_parameters && !d->saved)) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        goto out;
    }
    const char *tl = cddp_knob_str(CDDP_KNOB_TIMELINE);
    if (*tl && strcmp(tl, "off") != 0) {
        if (!(d->timeline = cddp_malloc(strlen(tl) + 1))) {
            rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
            goto out;
        }
        strcpy(d->timeline, tl);
        if (d->rank == 0) { /* before the broadcast below, which no rank passes before rank 0 */
            FILE *f = fopen(tl, "w");
            if (!f || fputs("[\n]\n", f) < 0) cddp_log(CDDP_LOG_WARN, "ddp", "cannot write %s", tl);
            if (f) fclose(f);
        }
    }
    CDDP_TRY_GOTO(choose_overlap(d, err), out);
    d->print_stats = cddp_knob_int(CDDP_KNOB_DDP_STATS) != 0;
    d->stats_every = CDDP_MAX(cddp_knob_int(CDDP_KNOB_DDP_STATS_EVERY), 1);
    CDDP_TRY_GOTO(agree(d, err), out);
    /* Everyone starts from rank 0's weights. */
    CDDP_TRY_GOTO(cddp_comm_broadcast(group, cddp_model_data(m), (int64_t)cddp_model_numel(m),
                                      CDDP_COMM_F32, 0, timeout_of(d), err),
                  out);
    if (cddp_model_buffer_numel(m) > 0)
        CDDP_TRY_GOTO(cddp_comm_broadcast(group, cddp_model_buffer_data(m),
                                          (int64_t)cddp_model_buffer_numel(m), CDDP_COMM_F32, 0,
                                          timeout_of(d), err),
                      out);
    for (int k = 0; k < d->nparams; k++) d->ready_order[k] = d->nparams - 1 - k;
    CDDP_TRY_GOTO(build_buckets(d, d->ready_order, err), out);
    CDDP_TRY_GOTO(place_gradients(d, err), out);
    reset_step(d);
    cddp_model_set_ready_hook(m, on_ready, d);
    cddp_model_set_event_hook(m, on_event, d);
out:
    if (rc != CDDP_OK) {
        d->model = NULL; /* nothing was hooked */
        cddp_free(d->timeline);
        d->timeline = NULL;
        cddp_ddp_destroy(d);
        return NULL;
    }
    return d;
}

/* ---- join, barrier, checkpoints ---------------------------------------------------------- */

int cddp_ddp_join(cddp_ddp *d, cddp_error *err) {
    if (!d->o.join)
        return cddp_error_set(err, CDDP_ESTATE,
                              "cddp_ddp_join needs the join option at wrap (every rank's steps "
                              "then also reduce who is still training)");
    if (d->joined) return CDDP_OK;
    d->joined = true;
    for (;;) {
        /* The ranks still training broadcast buffers before each forward: shadow that too. */
        CDDP_TRY(sync_buffers(d, 0, err));
        memset(d->active, 0, sizeof(int32_t) * (size_t)d->world);
        CDDP_TRY(cddp_comm_allreduce(d->group, d->active, d->active, d->world, CDDP_COMM_I32,
                                     CDDP_COMM_SUM, timeout_of(d), err));
        int still = 0;
        for (int r = 0; r < d->world; r++) still += d->active[r];
        if (still == 0) break;
        if (d->o.join_throw) {
            char msg[128];
            snprintf(msg, sizeof msg, "rank %d ran out of inputs (join_throw)", d->rank);
            cddp_comm_abort(d->group, msg);
            return cddp_error_set(err, CDDP_ESTATE, "%s", msg);
        }
        /* Shadow one step of the others: zeros into every bucket, in bucket order. */
        memset(cddp_model_grad(d->model), 0, cddp_model_numel(d->model) * sizeof(float));
        for (int k = 0; k < d->nbuckets; k++) launch(d, k);
        d->next_launch = d->nbuckets;
        int rc = d->hook_err.code ? d->hook_err.code : CDDP_OK;
        if (rc) *err = d->hook_err;
        if (rc == CDDP_OK && d->o.find_unused_parameters) {
            memset(d->used, 0, sizeof(int32_t) * (size_t)d->nparams);
            d->used_work =
                cddp_comm_allreduce_async(d->group, d->used, d->used, d->nparams, CDDP_COMM_I32,
                                          CDDP_COMM_MAX, timeout_of(d), err);
            if (!d->used_work) rc = err->code;
        }
        cddp_error e = {0};
        int st = wait_all(d, &e);
        if (st && !rc) rc = st, *err = e;
        if (rc == CDDP_OK && !d->rebuilt) rc = rebuild(d, err);
        reset_step(d);
        CDDP_TRY(rc);
    }
    /* The models agree again: everyone takes the parameters of the rank with the most steps. */
    int64_t *steps = cddp_calloc((size_t)d->world, sizeof *steps);
    if (!steps) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = cddp_comm_allgather(d->group, &d->steps, steps, 1, CDDP_COMM_I64, timeout_of(d), err);
    int src = 0;
    for (int r = 1; r < d->world; r++)
        if (steps[r] > steps[src]) src = r;
    cddp_free(steps);
    CDDP_TRY(rc);
    CDDP_TRY(cddp_comm_broadcast(d->group, cddp_model_data(d->model),
                                 (int64_t)cddp_model_numel(d->model), CDDP_COMM_F32, src,
                                 timeout_of(d), err));
    return sync_buffers(d, src, err);
}

int cddp_ddp_barrier(cddp_ddp *d, cddp_error *err) {
    return cddp_comm_barrier(d->group, timeout_of(d), err);
}

int cddp_ddp_save(cddp_ddp *d, const char *path, const cddp_optim *opt, const char *const *metadata,
                  cddp_error *err) {
    int32_t status = CDDP_OK;
    cddp_error mine = {0};
    if (d->rank == 0) status = cddp_checkpoint_save(path, d->model, opt, metadata, &mine);
    CDDP_TRY(cddp_comm_broadcast(d->group, &status, 1, CDDP_COMM_I32, 0, timeout_of(d), err));
    if (status == CDDP_OK) return CDDP_OK;
    if (d->rank == 0) {
        if (err) *err = mine;
        return status;
    }
    return cddp_error_set(err, status,
                          "rank 0 could not write the checkpoint %s (its log says why)", path);
}

int cddp_ddp_load(cddp_ddp *d, const char *path, cddp_optim *opt, cddp_safetensors **file,
                  cddp_error *err) {
    cddp_error mine = {0};
    cddp_safetensors *f = NULL;
    int32_t st = cddp_checkpoint_load(path, d->model, opt, file ? &f : NULL, &mine);
    int32_t worst[2] = {st != CDDP_OK ? 1 : 0, st != CDDP_OK ? d->rank : -1};
    int rc = cddp_comm_allreduce(d->group, worst, worst, 2, CDDP_COMM_I32, CDDP_COMM_MAX,
                                 timeout_of(d), err);
    if (rc == CDDP_OK && st != CDDP_OK) {
        if (err) *err = mine;
        rc = st;
    } else if (rc == CDDP_OK && worst[0]) {
        rc = cddp_error_set(err, CDDP_EIO,
                            "rank %d could not load the checkpoint %s (its log says why)", worst[1],
                            path);
    }
    if (rc == CDDP_OK && file)
        *file = f;
    else
        cddp_safetensors_destroy(f);
    return rc;
}
