/* ddp/internal.h: DistributedDataParallel's state, and the reducer interface.
 *
 * DDP is these files, on public APIs only (comm.h, dcomm.h, nn.h, autograd.h, checkpoint.h,
 * device.h), lowest first:
 *
 *   stage.c     a model on a device the host cannot read: host copies of its blocks, filled and
 *               emptied around each bucket's reduction
 *   reducer.c   what reduces one bucket (the reducers below)
 *   powersgd.c  the PowerSGD reducer: low-rank compression with error feedback
 *   timeline.c  the step's statistics and the Chrome-trace timeline
 *   straggler.c the step's phases compared across ranks: a rank slower than the others named,
 *               with the phase its time goes to
 *   buckets.c   the buckets and a synchronised backward: ready hooks, launching complete buckets
 *               in order, the end of backward, the rebuild in ready order; the step's events
 *   zero.c      the sharded optimizer (ZeRO-1) and gradients (ZeRO-2): each rank's shard of the
 *               buckets, the gradients outside it released, accumulation over synchronised
 *               backwards, the parameters' allgather after a step, the norm's sum, checkpoints of
 *               the state, what a rank holds
 *   wrap.c      wrapping a model: the agreement checks, the first broadcast, where the gradients
 *               live and where buckets are reduced; join, barrier
 *   ckpt.c      checkpoints: one file (rank 0's, ZeRO's state gathered first) or a set (a file
 *               per rank), saved and loaded with every rank agreeing on the outcome
 *
 * A reducer reduces one bucket, a list of parameters whose gradients travel together: launch
 * packs what the bucket needs and starts its collective (queued on the group's thread, or run
 * inline on the training thread: cddp__ddp_collective decides), finish moves the result into the
 * gradients once the collective is done. Plain allreduce, and allreduce of 16-bit copies
 * (bf16/fp16 compression), the sharded optimizer's reduce-scatter, PowerSGD and a hook of the
 * user's are the instances.
 */
#ifndef CDDP_DDP_INTERNAL_H
#define CDDP_DDP_INTERNAL_H

#include "cddp/autograd.h"
#include "cddp/comm.h"
#include "cddp/ddp.h"
#include "cddp/dcomm.h"

typedef struct cddp_ddp cddp_ddp;

typedef struct bucket {
    cddp_ddp *ddp;
    int *params; /* parameter indices, in the order they are expected ready */
    int nparams;
    size_t numel;
    int64_t offset;  /* first element in the flat block when contiguous, else -1 */
    int pending;     /* parameters still to become ready in this backward */
    float *stage;    /* packed float32 (non-contiguous buckets; on the device with nccl) */
    uint16_t *half;  /* packed 16-bit (compression reducers) */
    float *lowrank;  /* PowerSGD: the Qs of its matrices, back to back */
    bool compressed; /* PowerSGD: this step's reduction was compressed */
    cddp_comm_work *work;
    /* what runs before the last collective on the thread (cddp__ddp_before, and collectives
     * before the last: cddp__ddp_collective_first) */
    cddp_comm_work *pre[6];
    int npre;
    cddp_comm_work *post; /* what runs after its collective on the thread (cddp__ddp_after) */
    cddp_event *ready_ev; /* staged: recorded after the copy of its gradients to the host */
    bool reduced;         /* reduced inline, not yet finished */
    double t_start, t_end;
    char label[88]; /* its collective's name in the flight record: its first and last parameter */
} bucket;

typedef struct cddp__reducer {
    const char *name;
    /* Allocates what bucket b needs (staging, 16-bit copies) once the buckets are built. */
    int (*prepare)(cddp_ddp *d, bucket *b, cddp_error *err);
    /* Packs bucket b and starts its collective (cddp__ddp_collective). A failure is kept for
     * the end of backward (d->hook_err). */
    void (*launch)(cddp_ddp *d, bucket *b);
    /* The collective is done: the result goes into the gradients. */
    void (*finish)(cddp_ddp *d, bucket *b);
} cddp__reducer;

extern const cddp__reducer cddp__allreduce_reducer, cddp__bf16_reducer, cddp__fp16_reducer,
    cddp__zero_reducer, cddp__dev_reducer, cddp__dev_zero_reducer, cddp__dev_bf16_reducer,
    cddp__dev_fp16_reducer, cddp__powersgd_reducer, cddp__zero_half_reducer, cddp__user_reducer;

/* PowerSGD's state of one parameter (powersgd.c): kept across steps and bucket rebuilds. */
typedef struct cddp__psgd {
    int64_t n, m; /* the gradient as an n x m matrix */
    int r;        /* its rank; 0: not compressed (a vector, or too small to gain) */
    float *q;     /* m x r, the last step's Q (warm start); NULL until the first compressed step */
    float *error; /* n x m, what the last approximation left out of this rank's gradient */
} cddp__psgd;

/* Straggler attribution's phases of a step: the program's time between steps (its data loading),
 * forward, backward, the optimizer step (the four a rank is busy with), and the wait for the
 * buckets' communication after backward. */
enum {
    CDDP__PH_DATA,
    CDDP__PH_FORWARD,
    CDDP__PH_BACKWARD,
    CDDP__PH_OPTIM,
    CDDP__PH_WAIT,
    CDDP__PHASES
};

typedef struct cddp__straggler {
    long every;                    /* CDDP_STRAGGLER_EVERY (0: off) */
    double pct;                    /* CDDP_STRAGGLER_PCT */
    bool in_step;                  /* a forward of this step came */
    double t_first_forward, t_end; /* this step's first forward; the last step's end */
    /* cddp_comm_blocked_s at the last step's end, this step's first forward, its backward's
     * first gradient and the optimizer step's start: blocked time is no phase's own */
    double b_end, b_forward, b_backward, b_optim;
    double optim;               /* the last optimizer step's time, not yet counted */
    double sum[CDDP__PHASES];   /* the window's steps, added */
    double worst[CDDP__PHASES]; /* its busiest step (left out of the means) */
    int steps;                  /* in the window */
} cddp__straggler;

typedef struct event {
    const char *name;
    int bucket; /* -1: none */
    int tid;    /* 0: the training thread, 1: the communication thread */
    double t0, t1;
} event;

struct cddp_ddp {
    cddp_model *model;
    cddp_comm *group;
    const cddp__reducer *reducer;
    float *grad_block; /* the model's gradients, in memory from cddp_comm_alloc (or NULL) */
    /* the model's device, and (staged: the host cannot read it) the host copies of its blocks
     * that the collectives work on (stage.c); hgrad is the model's gradient block otherwise */
    cddp_device *dev;
    bool staged, hgrad_comm;
    bool locked[3]; /* hgrad, hparams, hbufs page-locked (stage.c) */
    /* a group of one whose reduction leaves every gradient as it is (a plain mean or sum: no hook,
     * join, find_unused_parameters, shard_optimizer or nccl): buckets are neither reduced nor,
     * on a device the host cannot read, copied to the host and back */
    bool alone;
    const cddp_dcomm_transport_info *tr; /* the transport chosen (never "auto") */
    cddp_dcomm *dcomm; /* an on_device transport's: buckets reduced on the device itself */
    char why[200];     /* why the transport was taken, for the log */
    float *hgrad, *hparams, *hbufs;
    cddp_ddp_options o;
    int rank, world, nparams;
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
    cddp_error hook_err; /* the first failure inside a hook, reported by the end of backward */
    int64_t steps;
    /* statistics and timeline */
    double t_forward, t_optim;
    cddp_ddp_stats stats;
    bool print_stats;
    long stats_every;
    char *timeline;
    cddp__straggler sg;
    event *events;
    size_t nevents, cap_events;
    /* shard_optimizer: this rank's part of every bucket, [begin, end) pairs in the flat block */
    int64_t *shard;
    /* accumulation across synchronised backwards (zero.c): the shard holds reduced gradients
     * (held); they wait in zacc (zacc_waits) while the next backward's local ones are reduced */
    float *zacc;
    bool zheld, zacc_waits;
    cddp__psgd *psgd;  /* PowerSGD: per parameter */
    size_t step_bytes; /* what this step's collectives carried, where a reducer counts them */
};

/* The deadline of DDP's collectives: the option's, or the group's (-1). */
static inline double cddp__ddp_timeout(const cddp_ddp *d) {
    return d->o.timeout_s > 0 ? d->o.timeout_s : -1;
}

/* Parameter i's gradient in the block the collectives see (d->hgrad). */
static inline float *cddp__ddp_grad(const cddp_ddp *d, int i) {
    return d->hgrad + cddp_model_param_offset(d->model, i);
}

/* ---- wrap.c ------------------------------------------------------------------------------ */

/* Whether the transport chosen reduces on the device itself (nccl, ipc), not through host
 * copies. */
static inline bool cddp__ddp_on_device(const cddp_ddp *d) {
    return d->tr->on_device;
}

/* ---- stage.c ----------------------------------------------------------------------------- */

/* Finds the model's device; when the host cannot read it, makes the host copies. */
int cddp__ddp_stage_setup(cddp_ddp *d, cddp_error *err);
void cddp__ddp_stage_release(cddp_ddp *d);
/* What a bucket needs to be staged (its event), once it is built. */
int cddp__ddp_stage_bucket(cddp_ddp *d, bucket *b, cddp_error *err);
/* Staged: queues the copy of bucket b's gradients to the host and records its event; stage_wait
 * (a cddp_comm_fn, its argument the bucket) waits for it; stage_out copies the reduced gradients
 * back. Nothing when not staged. */
int cddp__ddp_stage_in(cddp_ddp *d, bucket *b, cddp_error *err);
int cddp__ddp_stage_wait(void *bucket, cddp_error *err);
int cddp__ddp_stage_out(cddp_ddp *d, bucket *b, cddp_error *err);
/* Staged: the parameters and buffers into their host copies (waited for), and back (params,
 * buffers: which). Nothing when not staged. */
int cddp__ddp_params_in(cddp_ddp *d, cddp_error *err);
int cddp__ddp_params_out(cddp_ddp *d, bool params, bool buffers, cddp_error *err);
/* The blocks the collectives work on: the host copies when staged, else the model's. */
float *cddp__ddp_params(const cddp_ddp *d);
float *cddp__ddp_buffers(const cddp_ddp *d);

/* ---- reducer.c --------------------------------------------------------------------------- */

/* The reducer the options ask for. */
const cddp__reducer *cddp__ddp_reducer(const cddp_ddp *d);
/* The collectives a reducer starts. */
typedef enum cddp__ddp_kind { CDDP__DDP_ALLREDUCE, CDDP__DDP_REDUCE_SCATTER } cddp__ddp_kind;
/* Runs fn(b) before bucket b's collective: now when buckets are reduced inline, else queued on
 * the communication thread ahead of it (a reducer's packing, staging's wait). A failure is kept
 * for the end of backward. */
void cddp__ddp_before(cddp_ddp *d, bucket *b, cddp_comm_fn fn);
/* Runs fn(b) once bucket b's collective is done: now when it ran inline (and succeeded), else
 * queued on the communication thread behind it (b->post), where it runs whether the collective
 * succeeded or not. A failure is kept for the end of backward. */
void cddp__ddp_after(cddp_ddp *d, bucket *b, cddp_comm_fn fn);
/* Starts a reducer's collective (send and recv as cddp_comm_allreduce or _reduce_scatter take
 * them): inline (done when it returns: b->reduced) or queued on the group's thread (b->work).
 * A failure is kept for the end of backward. */
void cddp__ddp_collective(cddp_ddp *d, bucket *b, cddp__ddp_kind kind, const void *send, void *recv,
                          int64_t count, cddp_comm_dtype dtype, cddp_comm_op op);
/* An allreduce that comes before the bucket's last collective (PowerSGD's first sum): inline, or
 * queued ahead of what follows (b->pre). A failure is kept for the end of backward. */
void cddp__ddp_collective_first(cddp_ddp *d, bucket *b, const void *send, void *recv, int64_t count,
                                cddp_comm_op op);

/* ---- powersgd.c -------------------------------------------------------------------------- */

/* Frees PowerSGD's per-parameter state. */
void cddp__ddp_psgd_free(cddp_ddp *d);

/* ---- buckets.c --------------------------------------------------------------------------- */

/* Cuts order (every parameter once) into buckets and prepares them for the reducer. */
int cddp__ddp_build_buckets(cddp_ddp *d, const int *order, cddp_error *err);
void cddp__ddp_free_buckets(cddp_ddp *d);
/* Launches bucket k now (join's shadow steps launch every bucket). */
void cddp__ddp_launch(cddp_ddp *d, int k);
/* Waits for everything queued in this step; the first failure. */
int cddp__ddp_wait_all(cddp_ddp *d, cddp_error *err);
/* After the first step: every rank takes rank 0's ready order and rebuilds its buckets. */
int cddp__ddp_rebuild(cddp_ddp *d, cddp_error *err);
void cddp__ddp_reset_step(cddp_ddp *d);
/* The parameter-ready hook (autograd.h). */
void cddp__ddp_on_ready(void *user, cddp_tensor *p);
/* Every rank takes rank src's buffers, unless the options keep each rank's own. */
int cddp__ddp_sync_buffers(cddp_ddp *d, int src, cddp_error *err);
/* The model's step events (forward, optimizer): the buffer broadcast, and the timeline. */
void cddp__ddp_on_event(void *user, cddp_model *m, cddp_model_event ev);

/* ---- zero.c ------------------------------------------------------------------------------ */

/* Bucket b's part for rank r: elements [*lo, *hi) of the bucket (ceil(numel / world) each, the
 * last parts shorter or empty); returns the part's length, the reduce-scatter's count. */
static inline int64_t cddp__ddp_part(const cddp_ddp *d, const bucket *b, int r, int64_t *lo,
                                     int64_t *hi) {
    int64_t n = (int64_t)b->numel, c = (n + d->world - 1) / d->world;
    *lo = CDDP_MIN((int64_t)r * c, n);
    *hi = CDDP_MIN(*lo + c, n);
    return c;
}
/* Gives the model this rank's shard (the buckets' parts) and the norm's sum across the group. */
int cddp__ddp_zero_setup(cddp_ddp *d, cddp_error *err);
void cddp__ddp_zero_release(cddp_ddp *d);
/* Every rank's parts of block (a flat block of the model's layout) reach every rank. */
int cddp__ddp_zero_gather(cddp_ddp *d, float *block, cddp_error *err);
/* ZeRO-2 (shard_gradients): bucket b's gradients outside this rank's part released, now
 * (release_outside) or as a step of the communication thread (release_step: its argument the
 * bucket). */
int cddp__ddp_release_outside(cddp_ddp *d, bucket *b, cddp_error *err);
int cddp__ddp_release_step(void *bucket, cddp_error *err);
/* Gradient accumulation over synchronised backwards: a forward that follows one, with no
 * zero_grad between, moves the shard's reduced gradients aside (the next reduce-scatter must see
 * local gradients only), and the end of the next synchronised backward adds them back. */
void cddp__ddp_zero_on_forward(cddp_ddp *d);
void cddp__ddp_zero_after_backward(cddp_ddp *d);
void cddp__ddp_zero_on_zero_grad(cddp_ddp *d);
/* After an optimizer step: the parameters' allgather (a failure is kept for the next backward). */
void cddp__ddp_zero_after_step(cddp_ddp *d);
/* cddp_ddp_save with a sharded optimizer: fn runs with the whole state gathered on every rank,
 * then each rank keeps its shard again. */
int cddp__ddp_zero_with_whole_state(cddp_ddp *d, cddp_optim *opt,
                                    int (*fn)(cddp_ddp *d, void *arg, cddp_error *err), void *arg,
                                    cddp_error *err);

/* ---- timeline.c -------------------------------------------------------------------------- */

/* Records an event for the timeline (when there is one). */
void cddp__ddp_record(cddp_ddp *d, const char *name, int b, int tid, double t0, double t1);
/* The end of a synchronised step: statistics, the timeline, CDDP_DDP_STATS's line. */
void cddp__ddp_report_stats(cddp_ddp *d, double t_walk_end, double t_done, double t_backward0);
/* Opens the timeline (rank 0 creates the file) when CDDP_TIMELINE asks for one. */
int cddp__ddp_timeline_open(cddp_ddp *d, cddp_error *err);
/* Appends this rank's events to the timeline file (at destroy). */
void cddp__ddp_timeline_write(cddp_ddp *d);

/* ---- straggler.c ------------------------------------------------------------------------- */

/* Reads CDDP_STRAGGLER_EVERY and _PCT. */
void cddp__ddp_straggler_init(cddp_ddp *d);
/* A forward began at now (the first of a step starts it). */
void cddp__ddp_straggler_forward(cddp_ddp *d, double now);
/* The first gradient of a synchronised backward is ready; the optimizer step begins. */
void cddp__ddp_straggler_backward(cddp_ddp *d);
void cddp__ddp_straggler_optimizing(cddp_ddp *d);
/* The optimizer step ended at now. */
void cddp__ddp_straggler_optimized(cddp_ddp *d, double now);
/* The end of a synchronised backward (its walk began at t_backward, ended at t_walk_end; the
 * buckets were done at t_done): the step's phases join the window; every CDDP_STRAGGLER_EVERY
 * steps the ranks compare their windows (one allgather) and rank 0 names a straggler. */
int cddp__ddp_straggler_step(cddp_ddp *d, double t_backward, double t_walk_end, double t_done,
                             cddp_error *err);

#endif
