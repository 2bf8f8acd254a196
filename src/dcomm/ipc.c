/* ipc.c: the CUDA IPC transport (cddp/dcomm.h's "ipc"): collectives on device memory between the
 * ranks of one host, through memory each rank's device shares with the others (CUDA IPC on GPUs;
 * the emulated device shares alike).
 *
 * A communicator over a group's ranks (cddp_comm_create), all on one host, each on its device
 * (the same GPU may serve several). At creation each rank allocates a scratch block on its device
 * and an event made for sharing, and exports both; every rank opens every other's
 * (cddp_device_ipc_open, cddp_event_open_shared), through one allgather of the group. A
 * collective then runs on the communicator's own queue (a CUDA stream), after the work queued so
 * far on the device's default queue, and never makes the host wait for the device:
 *
 *   allreduce       each rank copies its data into its scratch; the ranks fence (below); rank r
 *                   adds up part r of every rank's scratch, in its own (part r: the r-th of world
 *                   nearly equal parts); they fence again; each rank copies every part from its
 *                   owner's scratch into its result
 *   reduce_scatter  copy, fence, rank r adds up its part of every rank's scratch into its result
 *   allgather       copy, fence, each rank copies every rank's piece into its result
 *
 * A fence: each rank records its shared event on the queue, the ranks meet on the host (which only
 * queues) in an allgather of the group that compares what each is doing (ranks that called
 * different collectives fail, naming both), and each rank's queue waits for every other's event:
 * so no rank reads another's scratch before that rank's copy (or sum) into it has run. The scratch
 * is used from its start on, each collective after the last; when the next does not fit, a fence
 * first makes sure every rank has read what it needed, and it starts over (a collective larger
 * than the scratch runs in pieces). A dead or stuck peer shows at the next fence as the group's
 * error (the meeting's deadline, a peer that left), and every later call reports it.
 *
 * Float32 only, sum and mean (the mean: the sum times 1 / world, which for a power of two is the
 * sum divided by world bit for bit, as the host's collectives divide).
 *
 * Every rank issues the same collectives in the same order (the group's rule), so each takes the
 * same region of every rank's scratch: `used` advances alike everywhere, and a rank reads region
 * [at, at + bytes) of another's scratch knowing that the other wrote its own copy there. */
#include "dcomm/internal.h"

#include "cddp/internal/device.h"

#include <stdio.h>
#include <string.h>

#define DEFAULT_SCRATCH ((size_t)64 << 20)
#define ALIGN           256

/* What a fence's meeting compares across the ranks: the collective (its kind, count and op, -1
 * for none) and which of its fences this is, so that ranks that call different collectives fail,
 * saying so, instead of reading each other's scratch wrongly. */
enum { MEET_WORDS = 4 };
enum { ALLREDUCE = 1, REDUCE_SCATTER, ALLGATHER };
enum { FIRST, SECOND, START_OVER };

typedef struct ipc {
    cddp_comm *group;
    cddp_device *dev;
    cddp_queue *queue; /* the collectives' */
    int rank, world;
    double timeout;
    size_t cap, used; /* the scratch's size, and how much of it this round of collectives took */
    char **scratch;   /* per rank: its scratch as this process reaches it (own: allocated here) */
    cddp_event **ev;  /* per rank: its shared event (own: made here, the others opened) */
    cddp_event *ready, *done; /* the device's default queue -> the collectives' queue, and back */
    int64_t *met;             /* a fence's meeting: every rank's MEET_WORDS */
    cddp_error failed;        /* latched: every later call reports it */
} ipc;

/* Every rank's outcome of a step of creation: CDDP_OK everywhere, or the first failing rank's
 * error on every rank. */
typedef struct outcome {
    int32_t rc;
    char msg[252];
} outcome;

static int agree(ipc *c, int rc, const cddp_error *mine, cddp_error *err) {
    outcome me = {rc, ""}, *all = cddp_calloc((size_t)c->world, sizeof *all);
    if (rc != CDDP_OK) snprintf(me.msg, sizeof me.msg, "%.250s", mine->msg);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int st = cddp_comm_allgather(c->group, &me, all, sizeof me / sizeof(int32_t), CDDP_COMM_I32,
                                 c->timeout, err);
    for (int r = 0; st == CDDP_OK && r < c->world; r++)
        if (all[r].rc != CDDP_OK)
            st = cddp_error_set(err, all[r].rc, "CUDA IPC: %s", all[r].msg); /* it names r */
    cddp_free(all);
    return st;
}

/* The handles a rank sends the others. */
typedef struct handles {
    cddp_ipc_handle mem, ev;
} handles;

static int make_own(ipc *c, handles *h, cddp_error *err) {
    if (!cddp_device_ipc_capable(c->dev))
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "%s shares no memory with other processes: ranks on the CPU "
                              "reduce through the group's own transports",
                              cddp_device_name(c->dev));
    if (!(c->queue = cddp_queue_create(c->dev, err))) return err->code;
    if (!(c->scratch[c->rank] = cddp_device_alloc(c->dev, c->cap, err))) return err->code;
    if (!(c->ready = cddp_event_create(c->dev, err)) || !(c->done = cddp_event_create(c->dev, err)))
        return err->code;
    if (!(c->ev[c->rank] = cddp_event_create_shared(c->dev, &h->ev, err))) return err->code;
    return cddp_device_ipc_export(c->dev, c->scratch[c->rank], &h->mem, err);
}

static int open_peers(ipc *c, const handles *all, cddp_error *err) {
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        if (!(c->scratch[r] = cddp_device_ipc_open(c->dev, &all[r].mem, err)) ||
            !(c->ev[r] = cddp_event_open_shared(c->dev, &all[r].ev, err)))
            return err->code;
    }
    return CDDP_OK;
}

/* Each rank's own, after a failure or once the others are done with it. */
static void release(ipc *c) {
    if (c->queue) {
        cddp_error e = {0};
        if (c->done && cddp_queue_record(c->queue, c->done, &e) == CDDP_OK)
            cddp_event_synchronize(c->done, &e);
    }
    for (int r = 0; c->scratch && r < c->world; r++)
        if (r != c->rank) {
            cddp_device_ipc_close(c->dev, c->scratch[r]);
            cddp_event_destroy(c->ev[r]);
        }
    if (c->scratch) cddp_device_free(c->dev, c->scratch[c->rank]);
    if (c->ev) cddp_event_destroy(c->ev[c->rank]);
    cddp_event_destroy(c->ready);
    cddp_event_destroy(c->done);
    cddp_queue_destroy(c->queue);
    cddp_free(c->scratch);
    cddp_free(c->ev);
    cddp_free(c->met);
    cddp_free(c);
}

static void *ipc_open(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *opts,
                      cddp_error *err) {
    const cddp_dcomm_options o = *opts;
    ipc *c = cddp_calloc(1, sizeof *c);
    if (!c) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    c->group = group;
    c->dev = dev;
    c->rank = cddp_comm_rank(group);
    c->world = cddp_comm_size(group);
    c->timeout = o.timeout_s > 0 ? o.timeout_s : cddp_comm_timeout(group);
    c->cap = ((o.scratch_bytes ? o.scratch_bytes : DEFAULT_SCRATCH) + ALIGN - 1) / ALIGN * ALIGN;
    c->scratch = cddp_calloc((size_t)c->world, sizeof *c->scratch);
    c->ev = cddp_calloc((size_t)c->world, sizeof *c->ev);
    c->met = cddp_calloc((size_t)c->world * MEET_WORDS, sizeof *c->met);
    handles mine = {0}, *all = cddp_calloc((size_t)c->world, sizeof *all);
    cddp_error e = {0};
    int rc = !c->scratch || !c->ev || !c->met || !all
                 ? cddp_error_set(&e, CDDP_ENOMEM, "out of memory")
                 : CDDP_OK;
    if (rc == CDDP_OK && cddp_comm_local_size(group) != c->world)
        rc = cddp_error_set(&e, CDDP_EUNSUPPORTED,
                            "the group spans hosts (%d of its %d ranks on this one): CUDA IPC "
                            "joins the ranks of one host; across hosts, reduce with NCCL or "
                            "through host copies",
                            cddp_comm_local_size(group), c->world);
    if (rc == CDDP_OK) rc = make_own(c, &mine, &e);
    rc = agree(c, rc, &e, err);
    if (rc == CDDP_OK)
        rc = cddp_comm_allgather(group, &mine, all, sizeof mine / sizeof(int32_t), CDDP_COMM_I32,
                                 c->timeout, err);
    if (rc == CDDP_OK) rc = agree(c, open_peers(c, all, &e), &e, err);
    cddp_free(all);
    if (rc != CDDP_OK) {
        release(c);
        return NULL;
    }
    cddp_log(CDDP_LOG_DEBUG, "ipc", "%d ranks share their %s memory: %zu KiB of scratch each",
             c->world, cddp_device_name(dev), c->cap >> 10);
    return c;
}

static int ipc_check(void *arg, cddp_error *err) {
    ipc *c = arg;
    if (!c->failed.code) return CDDP_OK;
    *err = c->failed;
    return c->failed.code;
}

/* A failure, latched. */
static int fail(ipc *c, const cddp_error *e, cddp_error *err) {
    if (!c->failed.code) c->failed = *e;
    *err = c->failed;
    return c->failed.code;
}

static void describe(const int64_t *w, char *out, size_t size) {
    static const char *const kinds[] = {"?", "allreduce", "reduce_scatter", "allgather"};
    static const char *const fences[] = {"its first fence", "its second fence",
                                         "starting the scratch over"};
    snprintf(out, size, "%s of %lld floats%s%s%s, at %s", kinds[w[0] >= 1 && w[0] <= 3 ? w[0] : 0],
             (long long)w[1], w[2] >= 0 ? " (" : "",
             w[2] >= 0 ? cddp_comm_op_name((cddp_comm_op)w[2]) : "", w[2] >= 0 ? ")" : "",
             fences[w[3] >= 0 && w[3] <= 2 ? w[3] : 0]);
}

/* Every rank's queue goes on only after every other rank's work queued so far (see above): this
 * rank's event recorded, the ranks met on the host (comparing `what`), the others' events waited
 * for. */
static int fence(ipc *c, int kind, int64_t count, int op, int step, cddp_error *err) {
    cddp_error e = {0};
    const int64_t what[MEET_WORDS] = {kind, count, op, step};
    if (cddp_queue_record(c->queue, c->ev[c->rank], &e) != CDDP_OK ||
        cddp_comm_allgather(c->group, what, c->met, MEET_WORDS, CDDP_COMM_I64, c->timeout, &e) !=
            CDDP_OK)
        return fail(c, &e, err);
    for (int r = 1; r < c->world; r++)
        if (memcmp(c->met + r * MEET_WORDS, c->met, sizeof what) != 0) {
            char theirs[160], first[160];
            describe(c->met + r * MEET_WORDS, theirs, sizeof theirs);
            describe(c->met, first, sizeof first);
            cddp_error_set(&e, CDDP_EINVAL,
                           "CUDA IPC: rank %d called %s where rank 0 called %s: every rank must "
                           "call the same collectives in the same order",
                           r, theirs, first);
            return fail(c, &e, err);
        }
    for (int r = 0; r < c->world; r++)
        if (r != c->rank && cddp_queue_wait(c->queue, c->ev[r], &e) != CDDP_OK)
            return fail(c, &e, err);
    return CDDP_OK;
}

/* The start of a collective: its arguments, and its queue after the device's work so far. */
static int begin(ipc *c, const char *what, cddp_comm_dtype dtype, cddp_comm_op op, int64_t count,
                 cddp_error *err) {
    CDDP_TRY(ipc_check(c, err));
    if (dtype != CDDP_COMM_F32 || (op != CDDP_COMM_SUM && op != CDDP_COMM_MEAN) || count < 0)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "CUDA IPC %s: float32 sums and means only (asked: %s %s of %lld)",
                              what, cddp_comm_dtype_name(dtype), cddp_comm_op_name(op),
                              (long long)count);
    cddp_error e = {0};
    if (cddp_event_record(c->ready, &e) != CDDP_OK ||
        cddp_queue_wait(c->queue, c->ready, &e) != CDDP_OK)
        return fail(c, &e, err);
    return CDDP_OK;
}

/* Where a piece of `bytes` goes in every rank's scratch: after the last, or (fenced) from the
 * start. */
static int take(ipc *c, int kind, int64_t count, int op, size_t bytes, size_t *at,
                cddp_error *err) {
    bytes = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (c->used + bytes > c->cap) {
        /* every rank has read what it needed of every scratch */
        CDDP_TRY(fence(c, kind, count, op, START_OVER, err));
        c->used = 0;
    }
    *at = c->used;
    c->used += bytes;
    return CDDP_OK;
}

/* The most floats of a piece whose scratch region is `per` times its length. */
static int64_t piece(const ipc *c, int64_t per) {
    return (int64_t)(c->cap / (sizeof(float) * (size_t)per)) / (ALIGN / sizeof(float)) *
           (ALIGN / sizeof(float));
}

static float *at_of(const ipc *c, int r, size_t at) {
    return (float *)(void *)(c->scratch[r] + at);
}

/* dst = op over the ranks of their scratch's n floats at `at` (dst's own rank first, then the
 * others in rank order; the sum of two is the same either way round). */
static void add_up(ipc *c, float *dst, size_t at, int64_t n, cddp_comm_op op, bool assign) {
    if (n <= 0) return;
    if (assign) cddp_queue_accumulate(c->queue, dst, at_of(c, c->rank, at), (size_t)n, true);
    for (int r = 0; r < c->world; r++)
        if (r != c->rank) cddp_queue_accumulate(c->queue, dst, at_of(c, r, at), (size_t)n, false);
    if (op == CDDP_COMM_MEAN) cddp_queue_scale(c->queue, dst, (size_t)n, 1.0f / (float)c->world);
}

/* Copies n floats, or latches the failure. */
static int copy(ipc *c, void *dst, const void *src, int64_t n, cddp_error *err) {
    cddp_error e = {0};
    if (n <= 0 || cddp_queue_copy(c->queue, dst, src, (size_t)n * sizeof(float), &e) == CDDP_OK)
        return CDDP_OK;
    return fail(c, &e, err);
}

static int ipc_allreduce(void *arg, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    ipc *c = arg;
    CDDP_TRY(begin(c, "allreduce", dtype, op, count, err));
    const float *s = send;
    float *out = recv;
    int64_t most = piece(c, 1);
    for (int64_t k = 0; k < count; k += most) {
        int64_t m = CDDP_MIN(most, count - k), part = (m + c->world - 1) / c->world;
        size_t at;
        CDDP_TRY(take(c, ALLREDUCE, count, op, (size_t)m * sizeof(float), &at, err));
        CDDP_TRY(copy(c, at_of(c, c->rank, at), s + k, m, err));
        CDDP_TRY(fence(c, ALLREDUCE, count, op, FIRST, err));
        int64_t lo = CDDP_MIN(c->rank * part, m), hi = CDDP_MIN(lo + part, m);
        /* this rank's part, summed into its own scratch (the others read theirs only) */
        add_up(c, at_of(c, c->rank, at + (size_t)lo * sizeof(float)),
               at + (size_t)lo * sizeof(float), hi - lo, op, false);
        CDDP_TRY(fence(c, ALLREDUCE, count, op, SECOND, err));
        for (int r = 0; r < c->world; r++) {
            int64_t rlo = CDDP_MIN(r * part, m), rhi = CDDP_MIN(rlo + part, m);
            CDDP_TRY(copy(c, out + k + rlo, at_of(c, r, at + (size_t)rlo * sizeof(float)),
                          rhi - rlo, err));
        }
    }
    return CDDP_OK;
}

static int ipc_reduce_scatter(void *arg, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    ipc *c = arg;
    CDDP_TRY(begin(c, "reduce_scatter", dtype, op, count, err));
    const float *s = send;
    float *out = recv;
    int64_t most = piece(c, c->world);
    for (int64_t k = 0; k < count; k += most) {
        int64_t m = CDDP_MIN(most, count - k);
        size_t at, row = (size_t)m * sizeof(float);
        CDDP_TRY(take(c, REDUCE_SCATTER, count, op, row * (size_t)c->world, &at, err));
        for (int r = 0; r < c->world; r++)
            CDDP_TRY(copy(c, at_of(c, c->rank, at + (size_t)r * row), s + r * count + k, m, err));
        CDDP_TRY(fence(c, REDUCE_SCATTER, count, op, FIRST, err));
        add_up(c, out + k, at + (size_t)c->rank * row, m, op, true);
    }
    return CDDP_OK;
}

static int ipc_allgather(void *arg, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_error *err) {
    ipc *c = arg;
    CDDP_TRY(begin(c, "allgather", dtype, CDDP_COMM_SUM, count, err));
    const float *s = send;
    float *out = recv;
    int64_t most = piece(c, 1);
    for (int64_t k = 0; k < count; k += most) {
        int64_t m = CDDP_MIN(most, count - k);
        size_t at;
        CDDP_TRY(take(c, ALLGATHER, count, -1, (size_t)m * sizeof(float), &at, err));
        CDDP_TRY(copy(c, at_of(c, c->rank, at), s + k, m, err));
        CDDP_TRY(fence(c, ALLGATHER, count, -1, FIRST, err));
        for (int r = 0; r < c->world; r++)
            CDDP_TRY(copy(c, out + r * count + k, at_of(c, r, at), m, err));
    }
    return CDDP_OK;
}

static int ipc_join(void *arg, cddp_error *err) {
    ipc *c = arg;
    CDDP_TRY(ipc_check(c, err));
    cddp_error e = {0};
    if (cddp_queue_record(c->queue, c->done, &e) != CDDP_OK ||
        cddp_device_wait_event(c->dev, c->done, &e) != CDDP_OK)
        return fail(c, &e, err);
    return CDDP_OK;
}

static int ipc_wait(void *arg, cddp_error *err) {
    ipc *c = arg;
    CDDP_TRY(ipc_check(c, err));
    cddp_error e = {0};
    if (cddp_queue_record(c->queue, c->done, &e) != CDDP_OK ||
        cddp_event_synchronize(c->done, &e) != CDDP_OK)
        return fail(c, &e, err);
    return CDDP_OK;
}

static void ipc_destroy(void *arg) {
    ipc *c = arg;
    if (!c) return;
    cddp_error e = {0};
    /* no rank frees its scratch while another may still read it: each waits for its own reads,
     * then all meet (skipped after a failure: the group may have lost a rank) */
    if (!c->failed.code && ipc_wait(c, &e) == CDDP_OK) cddp_comm_barrier(c->group, c->timeout, &e);
    release(c);
}

const cddp__dtransport cddp__ipc_dtransport = {
    .info = {.name = "ipc",
             .says = "CUDA IPC",
             .how = "through CUDA IPC (each rank sums its part from the others' memory), on a "
                    "stream of its own",
             .on_device = true,
             .f32_sums = true},
    .open = ipc_open,
    .allreduce = ipc_allreduce,
    .reduce_scatter = ipc_reduce_scatter,
    .allgather = ipc_allgather,
    .join = ipc_join,
    .wait = ipc_wait,
    .watch = ipc_check,
    .destroy = ipc_destroy,
};
