/* wrap.c: wrapping a model with DistributedDataParallel, and what it does besides a step.
 *
 * At wrap every rank checks that all ranks built the same model (names, shapes, buffers) with
 * the same options, and fails naming the rank and value that differ; rank 0's weights and
 * buffers reach everyone; the buckets are built in reverse parameter order; the gradients move
 * into the group's memory; and each rank decides where its buckets are reduced (overlap).
 * join shadows the collectives of the ranks still training until every rank has joined.
 */
#include "cddp/checkpoint.h"
#include "ddp/internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- wrap -------------------------------------------------------------------------------- */

/* What every rank must agree on. */
typedef struct wrap_rec {
    int64_t nparams, numel, nbuffers;
    double bucket_cap_mb;
    int32_t sum, find_unused, hook, join, join_throw, no_broadcast_buffers;
    int32_t shard_optimizer, transport, powersgd_rank, comm_hook, shard_gradients;
    int64_t powersgd_start_step;
} wrap_rec;

typedef struct param_rec {
    char name[64];
    int64_t ndim;
    int64_t shape[CDDP_MAX_DIMS];
} param_rec;

static const char *transport_name(int i) {
    const cddp_dcomm_transport_info *t = cddp_dcomm_transport_at(i);
    return t ? t->name : "unknown";
}

static const char *hook_name(int h) {
    return h == CDDP_DDP_HOOK_BF16       ? "bf16"
           : h == CDDP_DDP_HOOK_FP16     ? "fp16"
           : h == CDDP_DDP_HOOK_POWERSGD ? "powersgd"
                                         : "none";
}

/* Every rank's parameters and buffers, by name and shape, against rank 0's: the first
 * difference named on every rank. */
static int agree_names(cddp_ddp *d, cddp_error *err) {
    cddp_model *m = d->model;
    int W = d->world, rc = CDDP_OK;
    int nrec = d->nparams + cddp_model_num_buffers(m); /* parameters, then buffers */
    param_rec *pm = cddp_calloc((size_t)nrec + 1, sizeof *pm);
    param_rec *pall = cddp_calloc((size_t)W * ((size_t)nrec + 1), sizeof *pall);
    if (!pm || !pall) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < nrec; i++) {
        const cddp_tensor *t =
            i < d->nparams ? cddp_model_param(m, i) : cddp_model_buffer(m, i - d->nparams);
        snprintf(pm[i].name, sizeof pm[i].name, "%s", t->name);
        pm[i].ndim = t->ndim;
        for (int k = 0; k < t->ndim; k++) pm[i].shape[k] = t->shape[k];
    }
    int64_t n = (int64_t)(((size_t)nrec + 1) * sizeof *pm / 8);
    CDDP_TRY_GOTO(
        cddp_comm_allgather(d->group, pm, pall, n, CDDP_COMM_I64, cddp__ddp_timeout(d), err), out);
    for (int r = 1; r < W; r++)
        for (int i = 0; i < nrec; i++) {
            const param_rec *a = &pall[(size_t)r * ((size_t)nrec + 1) + (size_t)i], *z = &pall[i];
            if (memcmp(a, z, sizeof *a) == 0) continue;
            char sa[64], sz[64];
            cddp_shape_str((int)a->ndim, a->shape, sa, sizeof sa);
            cddp_shape_str((int)z->ndim, z->shape, sz, sizeof sz);
            rc = cddp_error_set(err, CDDP_ESHAPE,
                                "DDP: %s %d differs: rank %d has '%s' %s but rank 0 has "
                                "'%s' %s; every rank must build the same model",
                                i < d->nparams ? "parameter" : "buffer",
                                i < d->nparams ? i : i - d->nparams, r, a->name, sa, z->name, sz);
            goto out;
        }
out:
    cddp_free(pm);
    cddp_free(pall);
    return rc;
}

/* Every rank compares every rank with rank 0, so each reports the same first difference. */
static int agree(cddp_ddp *d, cddp_error *err) {
    cddp_model *m = d->model;
    int W = d->world, rc = CDDP_OK;
    int nb = cddp_model_num_buffers(m);
    wrap_rec mine = {d->nparams,
                     (int64_t)cddp_model_numel(m),
                     nb,
                     d->o.bucket_cap_mb,
                     d->o.sum,
                     d->o.find_unused_parameters,
                     d->o.hook,
                     d->o.join,
                     d->o.join_throw,
                     d->o.no_broadcast_buffers,
                     d->o.shard_optimizer,
                     d->tr->index,
                     d->o.powersgd_rank,
                     d->o.comm_hook != NULL,
                     d->o.shard_gradients,
                     d->o.powersgd_start_step};
    wrap_rec *all = cddp_calloc((size_t)W, sizeof *all);
    if (!all) {
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        goto out;
    }
    CDDP_TRY_GOTO(cddp_comm_allgather(d->group, &mine, all, sizeof mine / 8, CDDP_COMM_I64,
                                      cddp__ddp_timeout(d), err),
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
#define HAS(x)  ((x) ? "set" : "none")
        SAME(bucket_cap_mb, "bucket_cap_mb", "%g", ASIS)
        SAME(sum, "sum", "%d", ASIS)
        SAME(find_unused, "find_unused_parameters", "%d", ASIS)
        SAME(hook, "hook", "%s", hook_name)
        SAME(join, "join", "%d", ASIS)
        SAME(join_throw, "join_throw", "%d", ASIS)
        SAME(no_broadcast_buffers, "no_broadcast_buffers", "%d", ASIS)
        SAME(shard_optimizer, "shard_optimizer", "%d", (int))
        SAME(shard_gradients, "shard_gradients", "%d", (int))
        SAME(transport, "transport", "%s", transport_name)
        SAME(powersgd_rank, "powersgd_rank", "%d", ASIS)
        SAME(powersgd_start_step, "powersgd_start_step", "%" PRId64, ASIS)
        SAME(comm_hook, "a comm_hook", "%s", HAS)
#undef SAME
#undef ASIS
#undef HAS
    }
out:
    cddp_free(all);
    return rc == CDDP_OK ? agree_names(d, err) : rc;
}

void cddp_ddp_destroy(cddp_ddp *d) {
    if (!d) return;
    if (d->timeline) cddp__ddp_timeline_write(d);
    if (d->model) {
        cddp_model_set_ready_hook(d->model, NULL, NULL);
        cddp_model_set_event_hook(d->model, NULL, NULL);
    }
    cddp__ddp_zero_release(d);
    cddp__ddp_stage_release(d);
    /* The model takes its gradients back into memory of its own; if it cannot, the block stays
     * (leaked) rather than leaving the model pointing at freed memory. */
    if (d->grad_block && d->model && cddp_model_set_grad_block(d->model, NULL) == CDDP_OK)
        cddp_comm_free(d->group, d->grad_block);
    cddp__ddp_free_buckets(d);
    cddp__ddp_psgd_free(d);
    cddp_dcomm_destroy(d->dcomm);
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

/* Moves the gradient block into memory from the group (cddp_comm_alloc), which the shared-memory
 * transport reads in place, so that a bucket's allreduce copies nothing in or out (on other
 * transports it is plain memory). The 16-bit reducers pack every bucket anyway: the gradients
 * stay where they are. If the memory cannot be had (a small /dev/shm), training goes on with
 * plain memory after a warning. */
static int place_gradients(cddp_ddp *d, cddp_error *err) {
    if (d->staged) return CDDP_OK; /* the host copy of stage.c is the collectives' */
    d->hgrad = cddp_model_grad(d->model);
    if (d->reducer != &cddp__allreduce_reducer || d->alone) return CDDP_OK;
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
    d->hgrad = block;
    return CDDP_OK;
}

/* Inline when the option or CDDP_DDP_OVERLAP says so, or (auto) when there is nothing to overlap
 * with (a group of one, whose allreduce moves nothing: the thread's hand-off alone would cost a
 * wake-up per step) or this host cannot give every local rank a core for its training thread and
 * another for its communication thread: fewer than 2 cores of its own (cddp_comm_local_cores:
 * its CPUs, shared among the host's ranks that may run on them). A communication thread that must
 * take turns with the training threads gains no overlap and costs a thread switch, a wake-up and a
 * cache refill per bucket. */
static int choose_overlap(cddp_ddp *d, cddp_error *err) {
    cddp_ddp_overlap o = d->o.overlap;
    const char *knob = cddp_knob_str(CDDP_KNOB_DDP_OVERLAP);
    if (o == CDDP_DDP_OVERLAP_AUTO && strcmp(knob, "thread") == 0) o = CDDP_DDP_OVERLAP_THREAD;
    if (o == CDDP_DDP_OVERLAP_AUTO && strcmp(knob, "inline") == 0) o = CDDP_DDP_OVERLAP_INLINE;
    if (o == CDDP_DDP_OVERLAP_AUTO && strcmp(knob, "auto") != 0)
        return cddp_error_set(err, CDDP_EINVAL,
                              "CDDP_DDP_OVERLAP=%s: expected thread, inline or auto", knob);
    if (o == CDDP_DDP_OVERLAP_AUTO) {
        int cores = cddp_comm_local_cores(d->group);
        o = d->world == 1 || cores < 2 ? CDDP_DDP_OVERLAP_INLINE : CDDP_DDP_OVERLAP_THREAD;
        cddp_log(CDDP_LOG_DEBUG, "ddp", "%d cores of its own for this rank: buckets reduced %s",
                 cores, o == CDDP_DDP_OVERLAP_INLINE ? "inline" : "on the thread");
    }
    d->inline_comm = o == CDDP_DDP_OVERLAP_INLINE;
    return CDDP_OK;
}

/* The options, checked alone (before any rank talks to another): bucket_cap_mb's default, the
 * combinations that do not go together, refused in words; the transport asked for (the option's,
 * else CDDP_DDP_TRANSPORT's: *from_knob), or NULL. */
static const cddp_dcomm_transport_info *check_options(cddp_ddp_options *o, bool *from_knob,
                                                      cddp_error *err) {
    if (o->bucket_cap_mb <= 0) o->bucket_cap_mb = 25;
    if (o->shard_gradients) o->shard_optimizer = true; /* ZeRO-2 is ZeRO-1's sharding, and more */
    if ((unsigned)o->hook > CDDP_DDP_HOOK_POWERSGD) {
        cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_wrap: unknown hook %d", (int)o->hook);
        return NULL;
    }
    if ((unsigned)o->overlap > CDDP_DDP_OVERLAP_INLINE) {
        cddp_error_set(err, CDDP_EINVAL, "cddp_ddp_wrap: unknown overlap %d", (int)o->overlap);
        return NULL;
    }
    if (o->shard_optimizer && (o->hook == CDDP_DDP_HOOK_POWERSGD || o->join)) {
        cddp_error_set(err, CDDP_EUNSUPPORTED,
                       "cddp_ddp_wrap: shard_optimizer does not go with %s; %s",
                       o->join ? "join" : "the powersgd hook",
                       o->join ? "a rank that joined takes no optimizer step, so its shard "
                                 "would stay behind: train with even inputs (drop the last "
                                 "batches) or without shard_optimizer"
                               : "PowerSGD compresses whole matrices, which the shards cut: drop "
                                 "the hook or the option");
        return NULL;
    }
    if (o->hook == CDDP_DDP_HOOK_POWERSGD &&
        (o->join || o->powersgd_rank < 0 || o->powersgd_start_step < 0)) {
        cddp_error_set(err, CDDP_EINVAL,
                       o->join ? "cddp_ddp_wrap: the powersgd hook does not go with join (a rank "
                                 "that joined would have to shadow its two sums a bucket): "
                                 "train with even inputs, or with another hook"
                               : "cddp_ddp_wrap: powersgd_rank and powersgd_start_step must not "
                                 "be negative (0: their defaults, 1 and 1001)");
        return NULL;
    }
    if (o->comm_hook &&
        (o->hook != CDDP_DDP_HOOK_NONE || o->sum || o->shard_optimizer || o->join)) {
        cddp_error_set(err, CDDP_EINVAL,
                       "cddp_ddp_wrap: a comm_hook makes the gradients itself: it does not go "
                       "with %s",
                       o->hook != CDDP_DDP_HOOK_NONE ? "a hook (choose one of the two)"
                       : o->sum ? "sum (the hook decides what it leaves: a sum, or the mean)"
                       : o->shard_optimizer
                           ? "shard_optimizer (whose reduce-scatter gives each rank its part)"
                           : "join (a rank that joined could not shadow the hook's collectives)");
        return NULL;
    }
    /* the transport asked for: the option's, else CDDP_DDP_TRANSPORT's */
    *from_knob = !o->transport || strcmp(o->transport, "auto") == 0;
    const char *asked = *from_knob ? cddp_knob_str(CDDP_KNOB_DDP_TRANSPORT) : o->transport;
    cddp_error e = {0};
    const cddp_dcomm_transport_info *tr = cddp_dcomm_transport_find(asked, &e);
    if (!tr) { /* e says "'NAME' is not a transport: expected ...", after this rank's prefix */
        const char *says = strchr(e.msg, '\'');
        cddp_error_set(err, CDDP_EINVAL, "%s%s: %s", *from_knob ? "CDDP_DDP_TRANSPORT=" : "",
                       *from_knob ? asked : "cddp_ddp_wrap", says ? says : e.msg);
        return NULL;
    }
    if (tr->on_device && (o->hook == CDDP_DDP_HOOK_POWERSGD || o->comm_hook)) {
        cddp_error_set(err, CDDP_EUNSUPPORTED,
                       "cddp_ddp_wrap: %s reduces host memory: it does not go with the %s "
                       "transport (take the host transport, or another hook)",
                       o->comm_hook ? "a comm_hook" : "the powersgd hook", tr->name);
        return NULL;
    }
    if (tr->f32_sums && o->hook != CDDP_DDP_HOOK_NONE) {
        cddp_error_set(err, CDDP_EUNSUPPORTED,
                       "cddp_ddp_wrap: the %s transport does not go with a bf16/fp16 hook: %s "
                       "reduces in float32 (the hooks halve what crosses a network; between "
                       "the GPUs of one host, drop the hook)",
                       tr->name, tr->says);
        return NULL;
    }
    return tr;
}

/* The transport, once every rank asks for the same (d->tr: the one asked for): auto's choice
 * made and why said in d->why; the reducer it takes, the host copies of a model on a device,
 * the device communicator of a transport that reduces on the device; the line that says so. */
static int take_transport(cddp_ddp *d, bool from_knob, cddp_error *err) {
    const cddp_ddp_options *o = &d->o;
    if (d->tr->automatic && (o->hook == CDDP_DDP_HOOK_POWERSGD || o->comm_hook)) {
        d->tr = cddp_dcomm_transport_find("host", NULL); /* its sums are of host memory */
        snprintf(d->why, sizeof d->why, "auto: %s reduces host memory",
                 o->comm_hook ? "the comm_hook" : "the powersgd hook");
    } else if (d->tr->automatic) {
        char why[sizeof d->why - 8];
        CDDP_TRY(
            cddp_dcomm_choose(d->group, cddp_model_device(d->model), &d->tr, why, sizeof why, err));
        snprintf(d->why, sizeof d->why, "auto: %s", why);
    } else {
        snprintf(d->why, sizeof d->why, "transport %s, as %s", d->tr->name,
                 from_knob ? "CDDP_DDP_TRANSPORT names" : "named");
    }
    d->o.transport = d->tr->name;
    if (cddp__ddp_on_device(d) && o->shard_optimizer && o->hook != CDDP_DDP_HOOK_NONE)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "cddp_ddp_wrap: shard_optimizer with a bf16/fp16 hook reduces host "
                              "copies: not with the %s transport (%s); take the host transport, "
                              "or drop the hook or the option",
                              d->tr->name, d->why);
    d->reducer = cddp__ddp_reducer(d);
    d->alone = d->world == 1 && d->reducer == &cddp__allreduce_reducer && !o->join &&
               !o->find_unused_parameters;
    CDDP_TRY(cddp__ddp_stage_setup(d, err));
    if (cddp__ddp_on_device(d)) { /* ipc: a scratch as large as the gradients (and each
                                   * bucket's padding), so a step never waits to start it over */
        size_t scratch =
            (cddp_model_numel(d->model) + (size_t)(d->nparams + 1) * (size_t)d->world * 64) *
            sizeof(float);
        if (!(d->dcomm = cddp_dcomm_create(d->group, d->dev,
                                           &(cddp_dcomm_options){.transport = d->tr->name,
                                                                 .timeout_s = o->timeout_s,
                                                                 .scratch_bytes = scratch},
                                           err)))
            return err->code;
    }
    /* what a device's gradients go through and why, once, on rank 0 (as comm's backend line) */
    if (d->staged && d->alone)
        cddp_log(d->rank == 0 ? CDDP_LOG_INFO : CDDP_LOG_DEBUG, "ddp",
                 "the model is on %s: its gradients are left where they are (one rank: nothing "
                 "to reduce)",
                 cddp_device_name(d->dev));
    else if (d->staged)
        cddp_log(d->rank == 0 ? CDDP_LOG_INFO : CDDP_LOG_DEBUG, "ddp",
                 "the model is on %s: its gradients are reduced %s (%s)", cddp_device_name(d->dev),
                 d->dcomm ? d->tr->how : "from host copies by the group's transports", d->why);
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
    bool from_knob = false;
    const cddp_dcomm_transport_info *tr = check_options(&o, &from_knob, err);
    if (!tr) return NULL;
    cddp_ddp *d = cddp_calloc(1, sizeof *d);
    if (!d) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    d->model = m;
    d->group = group;
    d->o = o;
    d->tr = tr;
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
    CDDP_TRY_GOTO(cddp__ddp_timeline_open(d, err), out);
    CDDP_TRY_GOTO(choose_overlap(d, err), out);
    d->print_stats = cddp_knob_int(CDDP_KNOB_DDP_STATS) != 0;
    d->stats_every = CDDP_MAX(cddp_knob_int(CDDP_KNOB_DDP_STATS_EVERY), 1);
    cddp__ddp_straggler_init(d);
    CDDP_TRY_GOTO(agree(d, err), out);
    CDDP_TRY_GOTO(take_transport(d, from_knob, err), out);
    /* Everyone starts from rank 0's weights. */
    CDDP_TRY_GOTO(cddp__ddp_params_in(d, err), out);
    CDDP_TRY_GOTO(cddp_comm_broadcast(group, cddp__ddp_params(d), (int64_t)cddp_model_numel(m),
                                      CDDP_COMM_F32, 0, cddp__ddp_timeout(d), err),
                  out);
    if (cddp_model_buffer_numel(m) > 0)
        CDDP_TRY_GOTO(cddp_comm_broadcast(group, cddp__ddp_buffers(d),
                                          (int64_t)cddp_model_buffer_numel(m), CDDP_COMM_F32, 0,
                                          cddp__ddp_timeout(d), err),
                      out);
    CDDP_TRY_GOTO(cddp__ddp_params_out(d, true, true, err), out);
    for (int k = 0; k < d->nparams; k++) d->ready_order[k] = d->nparams - 1 - k;
    CDDP_TRY_GOTO(cddp__ddp_build_buckets(d, d->ready_order, err), out);
    CDDP_TRY_GOTO(place_gradients(d, err), out);
    if (o.shard_optimizer) CDDP_TRY_GOTO(cddp__ddp_zero_setup(d, err), out);
    cddp__ddp_reset_step(d);
    cddp_model_set_ready_hook(m, cddp__ddp_on_ready, d);
    cddp_model_set_event_hook(m, cddp__ddp_on_event, d);
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
        CDDP_TRY(cddp__ddp_sync_buffers(d, 0, err));
        memset(d->active, 0, sizeof(int32_t) * (size_t)d->world);
        CDDP_TRY(cddp_comm_allreduce(d->group, d->active, d->active, d->world, CDDP_COMM_I32,
                                     CDDP_COMM_SUM, cddp__ddp_timeout(d), err));
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
        cddp_model_zero_grad(d->model);
        for (int k = 0; k < d->nbuckets; k++) cddp__ddp_launch(d, k);
        d->next_launch = d->nbuckets;
        int rc = d->hook_err.code ? d->hook_err.code : CDDP_OK;
        if (rc) *err = d->hook_err;
        if (rc == CDDP_OK && d->o.find_unused_parameters) {
            memset(d->used, 0, sizeof(int32_t) * (size_t)d->nparams);
            d->used_work =
                cddp_comm_allreduce_async(d->group, d->used, d->used, d->nparams, CDDP_COMM_I32,
                                          CDDP_COMM_MAX, cddp__ddp_timeout(d), err);
            if (!d->used_work) rc = err->code;
        }
        cddp_error e = {0};
        int st = cddp__ddp_wait_all(d, &e);
        if (st && !rc) rc = st, *err = e;
        if (rc == CDDP_OK && !d->rebuilt) rc = cddp__ddp_rebuild(d, err);
        cddp__ddp_reset_step(d);
        CDDP_TRY(rc);
    }
    /* The models agree again: everyone takes the parameters of the rank with the most steps. */
    int64_t *steps = cddp_calloc((size_t)d->world, sizeof *steps);
    if (!steps) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = cddp_comm_allgather(d->group, &d->steps, steps, 1, CDDP_COMM_I64, cddp__ddp_timeout(d),
                                 err);
    int src = 0;
    for (int r = 1; r < d->world; r++)
        if (steps[r] > steps[src]) src = r;
    cddp_free(steps);
    CDDP_TRY(rc);
    CDDP_TRY(cddp__ddp_params_in(d, err));
    CDDP_TRY(cddp_comm_broadcast(d->group, cddp__ddp_params(d), (int64_t)cddp_model_numel(d->model),
                                 CDDP_COMM_F32, src, cddp__ddp_timeout(d), err));
    CDDP_TRY(cddp__ddp_params_out(d, true, false, err));
    return cddp__ddp_sync_buffers(d, src, err);
}

int cddp_ddp_barrier(cddp_ddp *d, cddp_error *err) {
    return cddp_comm_barrier(d->group, cddp__ddp_timeout(d), err);
}
