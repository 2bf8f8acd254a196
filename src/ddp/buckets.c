/* buckets.c: DistributedDataParallel's buckets, and a synchronised backward.
 *
 * A bucket is a list of parameters whose gradients are reduced together, by the reducer the
 * options chose (reducer.c). While it holds parameters that are neighbours in the flat block
 * (the default: reverse declaration order), it is one range of the block, reduced in place; a
 * bucket rebuilt from a ready order that jumps around is packed first.
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
#include "ddp/internal.h"
#include "cddp/flight.h"

#include <stdio.h>
#include <string.h>

#define FIRST_BUCKET_BYTES ((size_t)1 << 20)

/* ---- buckets ----------------------------------------------------------------------------- */

void cddp__ddp_free_buckets(cddp_ddp *d) {
    for (int b = 0; b < d->nbuckets; b++) {
        cddp_free(d->buckets[b].params);
        if (d->dcomm) {
            cddp_device_free(d->dev, d->buckets[b].stage);
            cddp_device_free(d->dev, d->buckets[b].half);
        } else {
            cddp_aligned_free(d->buckets[b].stage);
            cddp_aligned_free(d->buckets[b].half);
            cddp_aligned_free(d->buckets[b].lowrank);
        }
        cddp_event_destroy(d->buckets[b].ready_ev);
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
int cddp__ddp_build_buckets(cddp_ddp *d, const int *order, cddp_error *err) {
    cddp__ddp_free_buckets(d);
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
            nb->ddp = d;
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
        const char *head = cddp_model_param(d->model, b->params[0])->name;
        const char *tail = cddp_model_param(d->model, b->params[b->nparams - 1])->name;
        snprintf(b->label, sizeof b->label,
                 b->nparams > 1 ? "bucket %d: %.36s .. %.36s" : "bucket %d: %.72s", k, head, tail);
        CDDP_TRY(d->reducer->prepare(d, b, err));
        CDDP_TRY(cddp__ddp_stage_bucket(d, b, err));
    }
    return CDDP_OK;
}

/* ---- launching and finishing buckets ----------------------------------------------------- */

/* Starts bucket k's reduction: queued on the communication thread, or run here and now; for a
 * staged model after the device's copy of its gradients to the host (stage.c). */
void cddp__ddp_launch(cddp_ddp *d, int k) {
    bucket *b = &d->buckets[k];
    if (d->alone) return; /* the mean over one rank: the gradients as they are */
    if (d->staged && !d->dcomm) {
        cddp_error err = {0};
        if (cddp__ddp_stage_in(d, b, &err) != CDDP_OK) {
            if (!d->hook_err.code) d->hook_err = err;
            return;
        }
        cddp__ddp_before(d, b, cddp__ddp_stage_wait);
    }
    cddp_flight_label(b->label);
    d->reducer->launch(d, b);
    cddp_flight_label(NULL);
}

/* Launches every complete bucket that is next in order. */
static void launch_ready(cddp_ddp *d) {
    while (d->next_launch < d->nbuckets && d->buckets[d->next_launch].pending == 0)
        cddp__ddp_launch(d, d->next_launch++);
}

/* Waits for bucket k and moves its result into the gradients (for a staged model, back on the
 * device). */
static int finish_bucket(cddp_ddp *d, int k, cddp_error *err) {
    bucket *b = &d->buckets[k];
    int rc = CDDP_OK;
    for (int i = 0; i < b->npre; i++) { /* all of them: no work may outlive the step */
        cddp_error e = {0};
        int st = cddp_comm_wait(b->pre[i], -1, &e);
        if (st && !rc) rc = st, *err = e;
    }
    b->npre = 0;
    if (rc != CDDP_OK) {
        if (b->work) cddp_comm_wait(b->work, -1, NULL);
        if (b->post) cddp_comm_wait(b->post, -1, NULL);
        b->work = b->post = NULL;
        b->reduced = false;
        return rc;
    }
    if (b->work) {
        rc = cddp_comm_wait_timed(b->work, -1, &b->t_start, &b->t_end, err);
        b->work = NULL;
        if (b->post) { /* after the collective, whatever it returned */
            cddp_error e = {0};
            int st = cddp_comm_wait(b->post, -1, &e);
            b->post = NULL;
            if (st && !rc) rc = st, *err = e;
        }
        CDDP_TRY(rc);
    } else if (b->reduced) {
        b->reduced = false;
    } else {
        return CDDP_OK; /* not launched, or its launch failed (the hook's error says so) */
    }
    cddp__ddp_record(d, "allreduce", k, d->inline_comm ? 0 : 1, b->t_start, b->t_end);
    d->reducer->finish(d, b);
    if (!d->dcomm) CDDP_TRY(cddp__ddp_stage_out(d, b, err));
    /* ZeRO-2 on a device: its block's gradients outside the shard, once the shard is in place */
    return d->o.shard_gradients && (d->staged || d->dcomm) ? cddp__ddp_release_outside(d, b, err)
                                                           : CDDP_OK;
}

/* Waits for everything queued in this step (also after a failure: no work may outlive the
 * step and write into the gradients later). Returns the first failure. */
int cddp__ddp_wait_all(cddp_ddp *d, cddp_error *err) {
    int rc = CDDP_OK;
    cddp_error e = {0};
    /* NCCL's buckets run on its stream: what finishing queues next on the device's (a packed
     * bucket's copies back, the optimizer) comes after them */
    if (d->dcomm && cddp_dcomm_join(d->dcomm, &e) != CDDP_OK) rc = e.code, *err = e;
    if (d->active_work) {
        int st = cddp_comm_wait(d->active_work, -1, &e);
        d->active_work = NULL;
        if (st && !rc) rc = st, *err = e;
    }
    for (int k = 0; k < d->nbuckets; k++) {
        int st = finish_bucket(d, k, &e);
        if (st && !rc) rc = st, *err = e;
    }
    /* NCCL's buckets run on the device, after which the joined stream's work (the optimizer)
     * runs: the host does not wait for them; the watchdog does, and a failure shows at the next
     * call (a step's collectives, or this wait) */
    if (d->dcomm && !rc) rc = cddp_dcomm_watch(d->dcomm, err);
    if (d->used_work) {
        int st = cddp_comm_wait(d->used_work, -1, &e);
        d->used_work = NULL;
        if (st && !rc) rc = st, *err = e;
    }
    return rc;
}

/* ---- the backward ------------------------------------------------------------------------ */

static int finish(void *user, cddp_ctx *ctx, cddp_error *err);

void cddp__ddp_reset_step(cddp_ddp *d) {
    d->next_launch = 0;
    for (int k = 0; k < d->nbuckets; k++) {
        d->buckets[k].pending = d->buckets[k].nparams;
        d->buckets[k].reduced = false;
    }
    memset(d->ready, 0, sizeof(bool) * (size_t)d->nparams);
    d->in_backward = false;
    d->hook_err = (cddp_error){0};
}

void cddp__ddp_on_ready(void *user, cddp_tensor *p) {
    cddp_ddp *d = user;
    int i = p->param_index;
    d->used[i] = 1;
    if (d->no_sync) return;
    if (!d->in_backward) { /* the first hook of this backward */
        d->in_backward = true;
        cddp_flight_mark("backward", d->steps + 1);
        cddp__ddp_straggler_backward(d);
        if (cddp_backward_queue_callback(finish, d) != CDDP_OK && !d->hook_err.code)
            cddp_error_set(&d->hook_err, CDDP_ESTATE, "DDP: cannot queue the end of backward");
        if (d->o.join) {
            memset(d->active, 0, sizeof(int32_t) * (size_t)d->world);
            d->active[d->rank] = 1;
            cddp_error e = {0};
            d->active_work =
                cddp_comm_allreduce_async(d->group, d->active, d->active, d->world, CDDP_COMM_I32,
                                          CDDP_COMM_SUM, cddp__ddp_timeout(d), &e);
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
int cddp__ddp_rebuild(cddp_ddp *d, cddp_error *err) {
    int *order = d->ready_order;
    bool *seen = cddp_calloc((size_t)d->nparams, sizeof *seen);
    if (!seen) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    for (int k = 0; k < d->nready_order; k++) seen[order[k]] = true;
    int n = d->nready_order;
    for (int i = d->nparams - 1; i >= 0; i--)
        if (!seen[i]) order[n++] = i;
    cddp_free(seen);
    d->nready_order = n;
    CDDP_TRY(cddp_comm_broadcast(d->group, order, d->nparams, CDDP_COMM_I32, 0,
                                 cddp__ddp_timeout(d), err));
    d->rebuilt = true;
    bool same = true; /* the buckets already follow this order */
    for (int k = 0, pos = 0; k < d->nbuckets && same; pos += d->buckets[k++].nparams)
        for (int j = 0; j < d->buckets[k].nparams && same; j++)
            same = order[pos + j] == d->buckets[k].params[j];
    return same ? CDDP_OK : cddp__ddp_build_buckets(d, order, err);
}

/* Parameter i's gradient from before the backward (saved: its numel floats), where this rank keeps
 * it: all of it, or under ZeRO-2 the part in its shard (the rest stays released). */
static int restore_unused(cddp_ddp *d, int i, const float *saved, cddp_error *err) {
    cddp_tensor *p = cddp_model_param(d->model, i);
    int64_t off = (int64_t)cddp_model_param_offset(d->model, i), end = off + p->numel;
    if (!d->o.shard_gradients)
        return cddp_device_upload(d->dev, p->grad, saved, (size_t)p->numel * sizeof(float), err);
    for (int k = 0; k < d->nbuckets; k++) {
        int64_t lo = CDDP_MAX(off, d->shard[2 * k]), hi = CDDP_MIN(end, d->shard[2 * k + 1]);
        if (lo < hi)
            CDDP_TRY(cddp_device_upload(d->dev, p->grad + (lo - off), saved + (lo - off),
                                        (size_t)(hi - lo) * sizeof(float), err));
    }
    return CDDP_OK;
}

static int finish(void *user, cddp_ctx *ctx, cddp_error *err) {
    cddp_ddp *d = user;
    double t_walk_end = cddp_now_s();
    cddp_flight_mark("wait for buckets", d->steps + 1);
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
        for (int i = 0; i < d->nparams && rc == CDDP_OK; i++)
            if ((d->missing[i] = !d->ready[i])) {
                cddp_tensor *p = cddp_model_param(d->model, i);
                size_t bytes = (size_t)p->numel * sizeof(float);
                rc = cddp_device_download(d->dev, d->saved + at, p->grad, bytes, err);
                at += (size_t)p->numel;
            }
        for (int i = d->nparams - 1; i >= 0; i--)
            if (!d->ready[i]) {
                d->ready[i] = true;
                if (--d->buckets[d->bucket_of[i]].pending == 0) launch_ready(d);
            }
    }
    if (rc == CDDP_OK && d->o.find_unused_parameters) {
        cddp_error e = {0};
        d->used_work =
            cddp_comm_allreduce_async(d->group, d->used, d->used, d->nparams, CDDP_COMM_I32,
                                      CDDP_COMM_MAX, cddp__ddp_timeout(d), &e);
        if (!d->used_work) rc = e.code, *err = e;
    }
    cddp_error e = {0};
    int st = cddp__ddp_wait_all(d, &e);
    if (st && !rc) rc = st, *err = e;
    if (rc == CDDP_OK && missing >= 0) { /* no rank used it: the gradient stays as it was */
        size_t at = 0;
        for (int i = 0; i < d->nparams && rc == CDDP_OK; i++) {
            if (!d->missing[i]) continue;
            cddp_tensor *p = cddp_model_param(d->model, i);
            if (!d->used[i]) rc = restore_unused(d, i, d->saved + at, err);
            at += (size_t)p->numel;
        }
    }
    /* then the shard's gradients of the earlier backwards (moved aside at the forward) back */
    if (rc == CDDP_OK && d->o.shard_optimizer) cddp__ddp_zero_after_backward(d);
    if (rc == CDDP_OK && d->o.join) {
        for (int r = 0; r < d->world; r++)
            if (!d->active[r] && d->o.join_throw) {
                rc = cddp_error_set(err, CDDP_ESTATE, "rank %d ran out of inputs (join_throw)", r);
                break;
            }
    }
    if (rc == CDDP_OK && !d->rebuilt) rc = cddp__ddp_rebuild(d, err);
    double t_done = cddp_now_s();
    if (rc == CDDP_OK) cddp__ddp_report_stats(d, t_walk_end, t_done, cddp_backward_start_time(ctx));
    if (rc == CDDP_OK)
        rc = cddp__ddp_straggler_step(d, cddp_backward_start_time(ctx), t_walk_end, t_done, err);
    cddp_flight_mark("after backward", d->steps);
    memset(d->used, 0, sizeof(int32_t) * (size_t)d->nparams);
    cddp__ddp_reset_step(d);
    return rc;
}

/* Every rank takes rank src's buffers (BatchNorm's running statistics, ...), unless the wrapper
 * was told not to; nothing when the model has none. */
int cddp__ddp_sync_buffers(cddp_ddp *d, int src, cddp_error *err) {
    size_t n = cddp_model_buffer_numel(d->model);
    if (n == 0 || d->o.no_broadcast_buffers) return CDDP_OK;
    if (d->staged)
        CDDP_TRY(cddp_device_download(d->dev, d->hbufs, cddp_model_buffer_data(d->model),
                                      n * sizeof(float), err));
    CDDP_TRY(cddp_comm_broadcast(d->group, cddp__ddp_buffers(d), (int64_t)n, CDDP_COMM_F32, src,
                                 cddp__ddp_timeout(d), err));
    return cddp__ddp_params_out(d, false, true, err);
}

/* ---- the step's events ------------------------------------------------------------------- */

void cddp__ddp_on_event(void *user, cddp_model *m, cddp_model_event ev) {
    cddp_ddp *d = user;
    double now = cddp_now_s();
    /* Before a forward in training mode (the one that a synchronised backward follows), rank 0's
     * buffers go to everyone, as PyTorch's broadcast_buffers does. A failure is reported by the
     * backward. */
    if (ev == CDDP_EVENT_FORWARD && cddp_model_training(m) && !d->no_sync && !d->joined) {
        cddp_error e = {0};
        if (cddp__ddp_sync_buffers(d, 0, &e) != CDDP_OK && !d->hook_err.code) d->hook_err = e;
    }
    if (ev == CDDP_EVENT_ZERO_GRAD) {
        if (d->o.shard_optimizer) cddp__ddp_zero_on_zero_grad(d);
        return;
    }
    if (ev == CDDP_EVENT_FORWARD && d->o.shard_optimizer) cddp__ddp_zero_on_forward(d);
    if (ev == CDDP_EVENT_FORWARD) {
        cddp_flight_mark("forward", d->steps + 1);
        cddp__ddp_straggler_forward(d, now);
        d->t_forward = now;
    } else if (ev == CDDP_EVENT_OPTIM_BEGIN) {
        cddp_flight_mark("optimizer step", d->steps);
        cddp__ddp_straggler_optimizing(d);
        d->t_optim = now;
    } else {
        cddp_flight_mark("between steps", d->steps + 1);
        cddp__ddp_straggler_optimized(d, now);
        cddp__ddp_record(d, "optimizer step", -1, 0, d->t_optim, now);
        if (d->o.shard_optimizer) cddp__ddp_zero_after_step(d);
    }
}
