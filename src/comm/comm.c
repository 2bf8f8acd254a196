/* comm.c: process groups, rendezvous, and the shared-memory collectives.
 *
 * Rendezvous. Rank 0 starts a store at MASTER_ADDR:MASTER_PORT (under cddprun: on any free port,
 * which it posts in the launcher's store); every rank connects, posts its host identity (boot id
 * + hostname) and pid, and reads everyone's. Ranks on one host then share
 * a segment that rank 0 creates, everyone maps, and rank 0 unlinks once all have mapped it.
 *
 * The segment holds, per rank, a control block (an arrival counter, the pid, fingerprints) and a
 * staging slot of CDDP_SHM_CHUNK_KB. Synchronisation is a counter barrier: a rank bumps its
 * counter to the next step and waits until every counter reached it. Waiting spins for 20 us,
 * then blocks on a futex in the segment that arrivals wake, so that eight ranks on two cores
 * still make progress; every 10 ms it checks the deadline and whether the peers' processes still
 * exist.
 *
 * Allreduce, per chunk of the message (bandwidth: each rank reads (n-1)/n of every other rank's
 * chunk once and writes its slice once, the 2(n-1)/n of a ring, with no ring latency):
 *   1. every rank copies its chunk into its slot;                              barrier
 *      (the first barrier of a collective also checks every rank's fingerprint)
 *   2. rank r reduces slice r of the chunk over all slots, in rank order, and writes the result
 *      into slice r of its own slot (no other rank reads that region in this phase); barrier
 *   3. every rank copies slice q from rank q's slot, for every q;              barrier
 * Each slice is reduced by one rank in one order, so every rank receives bit-identical results.
 */

#include "cddp/comm.h"
#include "cddp/store.h"
#include "comm/internal.h"
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

size_t cddp_comm_dtype_size(cddp_comm_dtype d) {
    switch (d) {
    case CDDP_COMM_F32:
    case CDDP_COMM_I32:
        return 4;
    case CDDP_COMM_F64:
    case CDDP_COMM_I64:
        return 8;
    case CDDP_COMM_BF16:
    case CDDP_COMM_F16:
        return 2;
    }
    return 0;
}

const char *cddp_comm_dtype_name(cddp_comm_dtype d) {
    static const char *n[] = {"float32", "float64", "int32", "int64", "bfloat16", "float16"};
    return (unsigned)d < CDDP_ARRAY_LEN(n) ? n[d] : "unknown";
}

const char *cddp_comm_op_name(cddp_comm_op op) {
    static const char *n[] = {"sum", "mean", "min", "max", "product"};
    return (unsigned)op < CDDP_ARRAY_LEN(n) ? n[op] : "unknown";
}

int cddp_comm_rank(const cddp_comm *c) {
    return c->rank;
}
int cddp_comm_size(const cddp_comm *c) {
    return c->world;
}
int cddp_comm_local_rank(const cddp_comm *c) {
    return c->local_rank;
}
int cddp_comm_local_size(const cddp_comm *c) {
    return c->local_world;
}
const char *cddp_comm_backend(const cddp_comm *c) {
    static const char *names[] = {"self", "shm", "tcp", "mpi"};
    return names[c->backend];
}

const char *cddp_comm_error(const cddp_comm *c) {
    return c->failed.code ? c->failed.msg : NULL;
}

static ctl *ctl_of(const cddp_comm *c, int r) {
    return (ctl *)(c->seg + 4096 + (size_t)r * CTL_SIZE);
}

static uint8_t *slot_of(const cddp_comm *c, int r) {
    return c->seg + 4096 + (size_t)c->world * CTL_SIZE + (size_t)r * c->chunk;
}

/* Rank r's slot for the messages it sends: apart from the collectives' slots, which a peer may
 * still read after this rank has left a collective. */
static uint8_t *send_slot_of(const cddp_comm *c, int r) {
    return slot_of(c, c->world + r);
}

static pair *pair_of(const cddp_comm *c, int from, int to) {
    return (pair *)(slot_of(c, 2 * c->world) + ((size_t)from * c->world + to) * PAIR_SIZE);
}

int cddp__comm_fail(cddp_comm *c, cddp_error *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cddp__error_vset(&c->failed, code, fmt, ap);
    va_end(ap);
    if (c->backend == BACKEND_TCP) cddp__tcp_failed(c);
    if (err) *err = c->failed;
    return code;
}

/* ---- waiting ----------------------------------------------------------------------------- */

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

int cddp__comm_aborted_here(cddp_comm *c, cddp_error *err) {
    if (!atomic_load_explicit(&c->aborted, memory_order_acquire)) return CDDP_OK;
    char why[sizeof c->abort_reason];
    pthread_mutex_lock(&c->mu);
    memcpy(why, c->abort_reason, sizeof why);
    pthread_mutex_unlock(&c->mu);
    return cddp__comm_fail(c, err, CDDP_EIO, "the group was aborted on this rank: %s", why);
}

int cddp__comm_peer_aborted(cddp_comm *c, cddp_error *err, int who, const char *why) {
    return cddp__comm_fail(c, err, CDDP_EIO, "rank %d aborted the group: %.319s", who, why);
}

int cddp__comm_peer_died(cddp_comm *c, cddp_error *err, int who, int pid, const char *what,
                         uint64_t num) {
    return cddp__comm_fail(c, err, CDDP_EIO,
                           "rank %d (pid %d) died during %s #%" PRIu64
                           "; the group is unusable (the launcher's report says why it died)",
                           who, pid, what, num);
}

int cddp__comm_timed_out(cddp_comm *c, cddp_error *err, const char *what, uint64_t num, int who) {
    return cddp__comm_fail(c, err, CDDP_ETIMEDOUT,
                           "%s #%" PRIu64 " timed out waiting for rank %d (is it stopped, stuck, "
                           "or calling something else?); raise CDDP_TIMEOUT_S or the call's "
                           "timeout if it is only slow",
                           what, num, who);
}

/* Latches an abort of this group, local (cddp_comm_abort on this rank) or by a peer. */
static int check_abort(cddp_comm *c, cddp_error *err) {
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    if (!c->seg) return CDDP_OK;
    int who = atomic_load_explicit(&((seg_header *)c->seg)->abort_rank, memory_order_acquire) - 1;
    if (who >= 0) return cddp__comm_peer_aborted(c, err, who, ctl_of(c, who)->abort_reason);
    return CDDP_OK;
}

/* Wakes every rank blocked in sync_all (after an arrival or an abort), if any is. */
static void wake_sleepers(cddp_comm *c) {
    seg_header *h = (seg_header *)c->seg;
    if (atomic_load(&h->sleepers) > 0) {
        atomic_fetch_add(&h->wake, 1);
        syscall(SYS_futex, &h->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* Blocks until a rank arrives or aborts (wake_sleepers), or for at most 10 ms. The arrival
 * store and the sleepers load of wake_sleepers, and the sleepers increment and the arrival load
 * here, are sequentially consistent: either this rank sees the arrival, or the arriving rank
 * sees the sleeper and bumps the futex word, so a wake-up is never lost. */
static void sleep_until_arrival(cddp_comm *c, _Atomic uint64_t *arrive, uint64_t step) {
    seg_header *h = (seg_header *)c->seg;
    uint32_t seen = atomic_load(&h->wake);
    atomic_fetch_add(&h->sleepers, 1);
    if (atomic_load(arrive) < step && !atomic_load(&h->abort_rank) && !atomic_load(&c->aborted))
        syscall(SYS_futex, &h->wake, FUTEX_WAIT, seen, &(struct timespec){0, 10000000}, NULL, 0);
    atomic_fetch_sub(&h->sleepers, 1);
}

/* Waits until *a (written by rank who) reaches at least target, or the group fails (deadline,
 * dead peer, abort). The errors name the wait as "what #num".
 *
 * A waiting rank spins for 20 us (the peer is about to arrive: the latency path), then blocks
 * on a futex in the segment until an arrival wakes it (the peer is computing, stopped, or far
 * behind: leave the core to whoever works; with more ranks than cores this is what lets the
 * late rank run). Every 10 ms at most it checks the deadline and whether the peer's process
 * still exists. */
static int wait_for(cddp_comm *c, _Atomic uint64_t *a, uint64_t target, int who, const char *what,
                    uint64_t num, double deadline, cddp_error *err) {
    double start = 0, next_check = 0;
    for (unsigned spins = 0; atomic_load_explicit(a, memory_order_acquire) < target; spins++) {
        relax();
        if (spins % 64) continue;
        CDDP_TRY(check_abort(c, err));
        double now = cddp_now_s();
        if (start == 0) start = now;
        if (now - start < 20e-6) continue;
        sleep_until_arrival(c, a, target);
        now = cddp_now_s();
        if (now < next_check) continue;
        next_check = now + 0.01;
        /* A peer may arrive, finish and exit between the load above and this check; its
         * arrival is written before it exits, so it is dead only if it has not arrived. */
        pid_t pid = ctl_of(c, who)->pid;
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH &&
            atomic_load_explicit(a, memory_order_acquire) < target) {
            CDDP_TRY(check_abort(c, err)); /* it may have aborted the group, then exited */
            return cddp__comm_peer_died(c, err, who, (int)pid, what, num);
        }
        if (deadline >= 0 && now > deadline) return cddp__comm_timed_out(c, err, what, num, who);
    }
    return CDDP_OK;
}

/* Every rank arrives at the next step, or the group fails (deadline, dead peer). */
static int sync_all(cddp_comm *c, double deadline, cddp_error *err) {
    uint64_t step = ++c->step;
    atomic_store(&ctl_of(c, c->rank)->arrive, step);
    wake_sleepers(c);
    for (int r = 0; r < c->world; r++)
        CDDP_TRY(wait_for(c, &ctl_of(c, r)->arrive, step, r, "collective", c->seq, deadline, err));
    return CDDP_OK;
}

/* ---- fingerprints ------------------------------------------------------------------------ */

static void describe(const fingerprint *f, char *out, size_t n) {
    switch (f->kind) {
    case K_ALLREDUCE:
        snprintf(out, n, "allreduce(%s, %s, count %" PRId64 ")", cddp_comm_op_name(f->op),
                 cddp_comm_dtype_name(f->dtype), f->count);
        break;
    case K_BROADCAST:
        snprintf(out, n, "broadcast(%s, count %" PRId64 ", root %d)",
                 cddp_comm_dtype_name(f->dtype), f->count, f->root);
        break;
    case K_ALLGATHER:
        snprintf(out, n, "allgather(%s, count %" PRId64 ")", cddp_comm_dtype_name(f->dtype),
                 f->count);
        break;
    case K_REDUCE_SCATTER:
        snprintf(out, n, "reduce_scatter(%s, %s, count %" PRId64 ")", cddp_comm_op_name(f->op),
                 cddp_comm_dtype_name(f->dtype), f->count);
        break;
    case K_GATHER:
    case K_SCATTER:
        snprintf(out, n, "%s(%s, count %" PRId64 ", root %d)",
                 f->kind == K_GATHER ? "gather" : "scatter", cddp_comm_dtype_name(f->dtype),
                 f->count, f->root);
        break;
    case K_ALLOC:
        snprintf(out, n, "alloc(%" PRId64 " bytes)", f->count);
        break;
    case K_SEND:
        snprintf(out, n, "send(%s, count %" PRId64 ", to rank %d)", cddp_comm_dtype_name(f->dtype),
                 f->count, f->root);
        break;
    default:
        snprintf(out, n, "barrier()");
        break;
    }
}

int cddp__comm_check(const cddp_comm *c, const coll *a, cddp_error *err) {
    if ((unsigned)a->dtype > CDDP_COMM_F16 || (unsigned)a->op > CDDP_COMM_PRODUCT)
        return cddp_error_set(err, CDDP_EINVAL, "unknown dtype %d or op %d", (int)a->dtype,
                              (int)a->op);
    if (a->count < 0) return cddp_error_set(err, CDDP_EINVAL, "count %" PRId64 " < 0", a->count);
    if (a->root < 0 || a->root >= c->world)
        return cddp_error_set(err, CDDP_EINVAL, "root %d is not a rank of this group (0..%d)",
                              a->root, c->world - 1);
    return CDDP_OK;
}

/* The registration that holds [p, p + bytes) on this rank, with p's offset in it; NULL if none. */
static const reg *find_reg(const cddp_comm *c, const void *p, size_t bytes, size_t *offset) {
    uintptr_t at = (uintptr_t)p;
    for (int i = 0; i < MAX_REGS; i++) {
        const reg *g = &c->regs[i];
        uintptr_t b = (uintptr_t)(g->id ? g->base[c->rank] : NULL);
        if (g->id && at >= b && at + bytes <= b + g->bytes) {
            *offset = at - b;
            return g;
        }
    }
    return NULL;
}

/* Starts a collective: checks the group, publishes the fingerprint, meets everyone, and checks
 * that every rank called the same thing. *direct (with *offset) is the registration that holds
 * the buffer at the same offset on every rank, for an in-place allreduce on the shm transport;
 * every rank reaches the same answer, since each compares every rank's. */
static int begin(cddp_comm *c, const coll *a, double *deadline, const reg **direct, size_t *offset,
                 cddp_error *err) {
    *direct = NULL;
    if (c->failed.code) {
        if (err) *err = c->failed;
        return c->failed.code;
    }
    CDDP_TRY(cddp__comm_check(c, a, err));
    CDDP_TRY(check_abort(c, err));
    c->seq++;
    *deadline = cddp_now_s() + (a->timeout_s >= 0 ? a->timeout_s : c->timeout);
    fingerprint mine = {c->seq, a->kind, a->op, (int32_t)a->dtype, a->root, a->count};
    if (c->backend == BACKEND_SELF) return CDDP_OK;
    if (c->backend == BACKEND_MPI) return cddp__mpi_fingerprints(c, &mine, err);
    if (c->backend == BACKEND_TCP) return cddp__tcp_fingerprints(c, a, &mine, *deadline, err);
    const reg *g = NULL;
    reg_at at = {0, 0};
    size_t es = cddp_comm_dtype_size(a->dtype);
    if (a->kind == K_ALLREDUCE && a->send == a->recv && a->count > 0 &&
        (g = find_reg(c, a->recv, (size_t)a->count * es, offset)))
        at = (reg_at){g->id, *offset};
    ctl_of(c, c->rank)->at[c->seq & 1] = at;
    ctl_of(c, c->rank)->fp[c->seq & 1] = mine;
    CDDP_TRY(sync_all(c, *deadline, err));
    for (int r = 0; r < c->world && g; r++) {
        const reg_at *their = &ctl_of(c, r)->at[c->seq & 1];
        if (their->id != at.id || their->offset != at.offset) g = NULL;
    }
    *direct = g;
    return cddp__comm_check_fingerprints(c, &mine, &ctl_of(c, 0)->fp[c->seq & 1], CTL_SIZE, err);
}

int cddp__comm_check_fingerprints(cddp_comm *c, const fingerprint *mine, const fingerprint *fps,
                                  size_t stride, cddp_error *err) {
    for (int r = 0; r < c->world; r++) {
        const fingerprint *f = (const fingerprint *)((const uint8_t *)fps + (size_t)r * stride);
        if (memcmp(f, mine, sizeof *mine) != 0) {
            char a[128], b[128];
            describe(mine, a, sizeof a);
            describe(f, b, sizeof b);
            return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                   "collective #%" PRIu64 " differs between ranks: this rank (%d) "
                                   "called %s but rank %d called %s; did every rank call the same "
                                   "collectives in the same order with the same arguments?",
                                   c->seq, c->rank, a, r, b);
        }
    }
    return CDDP_OK;
}

/* ---- reduction kernels ------------------------------------------------------------------- */

float cddp__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t cddp__f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float cddp__f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

uint16_t cddp__f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* dst[i] op= src[i] for n elements of type T (sum and mean add). */
#define REDUCE_LOOP(T, dst, src, n, op)                                                            \
    do {                                                                                           \
        T *d__ = (T *)(dst);                                                                       \
        const T *s__ = (const T *)(src);                                                           \
        switch (op) {                                                                              \
        case CDDP_COMM_SUM:                                                                        \
        case CDDP_COMM_MEAN:                                                                       \
            for (int64_t i = 0; i < (n); i++) d__[i] += s__[i];                                    \
            break;                                                                                 \
        case CDDP_COMM_PRODUCT:                                                                    \
            for (int64_t i = 0; i < (n); i++) d__[i] *= s__[i];                                    \
            break;                                                                                 \
        case CDDP_COMM_MIN:                                                                        \
            for (int64_t i = 0; i < (n); i++) d__[i] = s__[i] < d__[i] ? s__[i] : d__[i];          \
            break;                                                                                 \
        case CDDP_COMM_MAX:                                                                        \
            for (int64_t i = 0; i < (n); i++) d__[i] = s__[i] > d__[i] ? s__[i] : d__[i];          \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* dst[i] op= src[i] for n elements of a 4- or 8-byte dtype (16-bit ones are reduced in
 * float32 by their callers). */
void cddp__comm_combine(cddp_comm_dtype dt, cddp_comm_op op, void *dst, const void *src,
                        int64_t n) {
    switch (dt) {
    case CDDP_COMM_F64:
        REDUCE_LOOP(double, dst, src, n, op);
        break;
    case CDDP_COMM_I32:
        REDUCE_LOOP(int32_t, dst, src, n, op);
        break;
    case CDDP_COMM_I64:
        REDUCE_LOOP(int64_t, dst, src, n, op);
        break;
    default:
        REDUCE_LOOP(float, dst, src, n, op);
        break;
    }
}

#define MEAN_LOOP(T, buf, n, W)                                                                    \
    do {                                                                                           \
        T *b__ = (T *)(buf);                                                                       \
        for (int64_t i = 0; i < (n); i++) b__[i] /= (T)(W);                                        \
    } while (0)

/* buf[i] /= W for n elements of a 4- or 8-byte dtype (integers: truncated): the mean's end. For
 * a power of two, a floating-point multiply by 1 / W gives the quotient bit for bit (both are
 * the exact value, rounded once) at a fraction of a division's cost. */
void cddp__comm_divide(cddp_comm_dtype dt, void *buf, int64_t n, int W) {
    if ((W & (W - 1)) == 0 && (dt == CDDP_COMM_F32 || dt == CDDP_COMM_F64)) {
        if (dt == CDDP_COMM_F64) {
            double s = 1.0 / W, *b = buf;
            for (int64_t i = 0; i < n; i++) b[i] *= s;
        } else {
            float s = 1.0f / (float)W, *b = buf;
            for (int64_t i = 0; i < n; i++) b[i] *= s;
        }
        return;
    }
    switch (dt) {
    case CDDP_COMM_F64:
        MEAN_LOOP(double, buf, n, W);
        break;
    case CDDP_COMM_I32:
        MEAN_LOOP(int32_t, buf, n, W);
        break;
    case CDDP_COMM_I64:
        MEAN_LOOP(int64_t, buf, n, W);
        break;
    default:
        MEAN_LOOP(float, buf, n, W);
        break;
    }
}

void cddp__comm_widen(cddp_comm_dtype dt, const void *src, float *dst, int64_t n) {
    float (*to)(uint16_t) = dt == CDDP_COMM_BF16 ? cddp__bf16_to_f32 : cddp__f16_to_f32;
    for (int64_t i = 0; i < n; i++) dst[i] = to(((const uint16_t *)src)[i]);
}

void cddp__comm_narrow(cddp_comm_dtype dt, const float *src, void *dst, int64_t n) {
    uint16_t (*from)(float) = dt == CDDP_COMM_BF16 ? cddp__f32_to_bf16 : cddp__f32_to_f16;
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = from(src[i]);
}

/* Elements one block of a reduction holds: small enough for L1, so each source is read once
 * from memory and the destination written once. */
#define RBLOCK 2048

/* acc = (x + y) * s, in one pass: the first step of every float32 sum (s = 1, exact), and with
 * s = 1/2 the whole mean of two ranks (DDP's gradients on a pair). */
static void sum_f32(float *restrict acc, const float *x, const float *y, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] = (x[i] + y[i]) * s;
}

/* Reduces elements [lo, lo + n) of src[0], ..., src[world - 1], in rank order, into each of the
 * ndst destinations (dst[k] points at element lo of destination k). A destination may be the
 * same range of one of the sources: each block is read whole before it is written. */
static void reduce_slice(cddp_comm *c, cddp_comm_dtype dt, cddp_comm_op op, uint8_t *const *src,
                         int64_t lo, int64_t n, uint8_t *const *dst, int ndst) {
    size_t es = cddp_comm_dtype_size(dt);
    int W = c->world;
    bool half = dt == CDDP_COMM_BF16 || dt == CDDP_COMM_F16;
    for (int64_t at = 0; at < n; at += RBLOCK) {
        int64_t m = CDDP_MIN(RBLOCK, n - at);
        size_t first = (size_t)(lo + at) * es, bytes = (size_t)m * es;
        if (half) {
            float *acc = c->acc, *tmp = (float *)c->tmp;
            for (int r = 0; r < W; r++) {
                cddp__comm_widen(dt, src[r] + first, r == 0 ? acc : tmp, m);
                if (r) cddp__comm_combine(CDDP_COMM_F32, op, acc, tmp, m);
            }
            if (op == CDDP_COMM_MEAN) cddp__comm_divide(CDDP_COMM_F32, acc, m, W);
            cddp__comm_narrow(dt, acc, dst[0] + (size_t)at * es, m);
            for (int k = 1; k < ndst; k++)
                memcpy(dst[k] + (size_t)at * es, dst[0] + (size_t)at * es, bytes);
            continue;
        }
        uint8_t *acc = c->tmp;
        if (dt == CDDP_COMM_F32 && (op == CDDP_COMM_SUM || op == CDDP_COMM_MEAN) && W > 1) {
            bool scaled = op == CDDP_COMM_MEAN && W == 2; /* the mean of 2: a multiply, exact */
            sum_f32((float *)acc, (const float *)(src[0] + first), (const float *)(src[1] + first),
                    scaled ? 0.5f : 1.0f, m);
            for (int r = 2; r < W; r++) cddp__comm_combine(dt, op, acc, src[r] + first, m);
            if (op == CDDP_COMM_MEAN && !scaled) cddp__comm_divide(dt, acc, m, W);
        } else {
            memcpy(acc, src[0] + first, bytes);
            for (int r = 1; r < W; r++) cddp__comm_combine(dt, op, acc, src[r] + first, m);
            if (op == CDDP_COMM_MEAN) cddp__comm_divide(dt, acc, m, W);
        }
        for (int k = 0; k < ndst; k++) memcpy(dst[k] + (size_t)at * es, acc, bytes);
    }
}

/* ---- collectives on the shared-memory segment --------------------------------------------- */

/* Elements per slot for one round; every slot holds at least world * 8 bytes. */
static int64_t per_round(const cddp_comm *c, size_t es, int parts) {
    return CDDP_MAX((int64_t)(c->chunk / es) / parts, 1);
}

/* Per round of n elements, slice q (elements [n q / W, n (q + 1) / W)) is staged in part q of a
 * slot, at the same place in every round:
 *   1. every rank copies every slice but its own into its slot;                 barrier
 *   2. rank r reduces slice r from every peer's slot and its own send buffer, in rank order,
 *      into its recv and into part r of its slot;                               barrier
 *   3. every rank copies slice q from part q of rank q's slot.
 * The next round's step 1 writes only parts that step 3 does not read, so no barrier is needed
 * between rounds, nor at the end: the next collective begins with one. */
static int shm_allreduce(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world, me = c->rank;
    size_t part = c->chunk / (size_t)W / 64 * 64; /* bytes, a multiple of the cache line */
    int64_t per = (int64_t)(part / es) * W;
    const uint8_t *send = a->send;
    uint8_t *recv = a->recv;
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        for (int q = 0; q < W; q++) {
            int64_t qlo = n * q / W, qhi = n * (q + 1) / W;
            if (q != me)
                memcpy(c->slots[me] + (size_t)q * part, send + (size_t)(off + qlo) * es,
                       (size_t)(qhi - qlo) * es);
        }
        CDDP_TRY(sync_all(c, deadline, err));
        int64_t lo = n * me / W, hi = n * (me + 1) / W;
        for (int q = 0; q < W; q++) /* so that element lo of source q is element lo of slice */
            c->src[q] = q == me ? (uint8_t *)send + (size_t)off * es
                                : c->slots[q] + (size_t)me * part - (size_t)lo * es;
        uint8_t *dst[2] = {recv + (size_t)(off + lo) * es, c->slots[me] + (size_t)me * part};
        reduce_slice(c, a->dtype, a->op, c->src, lo, hi - lo, dst, 2);
        CDDP_TRY(sync_all(c, deadline, err));
        for (int q = 0; q < W; q++) {
            int64_t qlo = n * q / W, qhi = n * (q + 1) / W;
            if (q != me)
                memcpy(recv + (size_t)(off + qlo) * es, c->slots[q] + (size_t)q * part,
                       (size_t)(qhi - qlo) * es);
        }
    }
    return CDDP_OK;
}

/* In place in registered memory (every rank's buffer at the same offset of the same
 * registration; begin() has met everyone, so every buffer holds its input): rank r reduces
 * slice r of every rank's buffer and writes the result into slice r of every rank's buffer;
 * barrier (after which every buffer holds the whole result and no peer touches this rank's
 * buffer any more). No rank reads or writes another's slice, so one barrier is enough; nothing
 * is staged, and the message needs no chunks. */
static int shm_allreduce_direct(cddp_comm *c, const coll *a, const reg *g, size_t offset,
                                double deadline, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world, me = c->rank;
    int64_t n = a->count;
    int64_t lo = n * me / W, hi = n * (me + 1) / W;
    for (int r = 0; r < W; r++) {
        c->src[r] = g->base[r] + offset;
        c->dst[r] = c->src[r] + (size_t)lo * es;
    }
    reduce_slice(c, a->dtype, a->op, c->src, lo, hi - lo, c->dst, W);
    return sync_all(c, deadline, err);
}

/* Per round, every rank stages n elements of each of the world's blocks (block q at q * n in
 * its slot); rank r reduces region r over all slots straight into its recv. */
static int shm_reduce_scatter(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world, me = c->rank;
    int64_t per = per_round(c, es, W);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        for (int q = 0; q < W; q++)
            memcpy(c->slots[me] + (size_t)(q * n) * es,
                   (const uint8_t *)a->send + (size_t)(q * a->count + off) * es, (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
        uint8_t *dst = (uint8_t *)a->recv + (size_t)off * es;
        reduce_slice(c, a->dtype, a->op, c->slots, me * n, n, &dst, 1);
        CDDP_TRY(sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

static int shm_broadcast(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(a->dtype);
    int64_t per = per_round(c, es, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        uint8_t *p = (uint8_t *)a->recv + (size_t)off * es;
        if (c->rank == a->root) memcpy(c->slots[a->root], p, (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
        if (c->rank != a->root) memcpy(p, c->slots[a->root], (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

/* allgather (root -1: everyone receives) and gather (only root receives). */
static int shm_gather(cddp_comm *c, const coll *a, int root, double deadline, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(a->dtype);
    int64_t per = per_round(c, es, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        memcpy(c->slots[c->rank], (const uint8_t *)a->send + (size_t)off * es, (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
        if (root < 0 || root == c->rank)
            for (int q = 0; q < c->world; q++)
                memcpy((uint8_t *)a->recv + (size_t)(q * a->count + off) * es, c->slots[q],
                       (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

/* root stages n elements of every rank's part (part q at q * n in its slot). */
static int shm_scatter(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world;
    int64_t per = per_round(c, es, W);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        if (c->rank == a->root)
            for (int q = 0; q < W; q++)
                memcpy(c->slots[a->root] + (size_t)(q * n) * es,
                       (const uint8_t *)a->send + (size_t)(q * a->count + off) * es,
                       (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
        memcpy((uint8_t *)a->recv + (size_t)off * es,
               c->slots[a->root] + (size_t)(c->rank * n) * es, (size_t)n * es);
        CDDP_TRY(sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

/* One rank: every collective is a copy of its own part (the mean of one value is the value). */
static void self_execute(const coll *a) {
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype);
    if (a->kind != K_BROADCAST && a->kind != K_BARRIER && a->recv != a->send)
        memmove(a->recv, a->send, bytes);
}

/* ---- registered memory ------------------------------------------------------------------ */

static void unmap_reg(cddp_comm *c, reg *g) {
    for (int r = 0; r < c->world && g->base; r++)
        if (g->base[r] && g->base[r] != MAP_FAILED) munmap(g->base[r], g->bytes);
    cddp_free(g->base);
    *g = (reg){0};
}

/* Maps shared-memory block name (bytes); MAP_FAILED with errno set on failure. */
static void *map_block(const char *name, size_t bytes, bool create) {
    int fd =
        shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return MAP_FAILED;
    int e = 0;
    /* Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS on first touch. */
    if (create && (e = ftruncate(fd, (off_t)bytes) != 0 ? errno : 0) == 0)
        e = posix_fallocate(fd, 0, (off_t)bytes);
    void *p = e ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!e && p == MAP_FAILED) e = errno;
    close(fd);
    if (e && create) shm_unlink(name);
    errno = e;
    return p;
}

/* cddp_comm_alloc on the shm transport. Each rank makes a block of its own in /dev/shm and posts
 * its name; barrier; each maps every peer's block; barrier; each unlinks its name (every rank
 * has it mapped, so nothing stays in /dev/shm). A rank that could not make or map a block makes
 * every rank fail the same way, and the group stays usable. */
static int shm_alloc(cddp_comm *c, size_t bytes, double deadline, void **out, cddp_error *err) {
    int W = c->world, me = c->rank, slot = -1;
    for (int i = 0; i < MAX_REGS && slot < 0; i++)
        if (!c->regs[i].id) slot = i;
    reg *g = slot >= 0 ? &c->regs[slot] : NULL;
    uint64_t id = ++c->nallocs;
    ctl *mine = ctl_of(c, me);
    snprintf(mine->reg_name, sizeof mine->reg_name, "/cddp-%d-m%" PRIu64, (int)getpid(), id);
    mine->reg_made = ENOSPC;
    if (g && (g->base = cddp_calloc((size_t)W, sizeof *g->base))) {
        g->bytes = bytes;
        g->base[me] = map_block(mine->reg_name, bytes, true);
        mine->reg_made = g->base[me] == MAP_FAILED ? errno : 0;
    }
    CDDP_TRY(sync_all(c, deadline, err));
    int bad = -1, why = 0;
    for (int r = 0; r < W && bad < 0; r++)
        if (ctl_of(c, r)->reg_made) bad = r, why = ctl_of(c, r)->reg_made;
    if (bad < 0) {
        mine->reg_mapped = 0;
        for (int r = 0; r < W && !mine->reg_mapped; r++)
            if (r != me &&
                (g->base[r] = map_block(ctl_of(c, r)->reg_name, bytes, false)) == MAP_FAILED)
                mine->reg_mapped = errno;
        int rc = sync_all(c, deadline, err);
        shm_unlink(mine->reg_name);
        CDDP_TRY(rc);
        for (int r = 0; r < W && bad < 0; r++)
            if (ctl_of(c, r)->reg_mapped) bad = r, why = ctl_of(c, r)->reg_mapped;
    } else if (g && g->base && g->base[me] != MAP_FAILED) {
        shm_unlink(mine->reg_name);
    }
    if (bad >= 0) {
        if (g) unmap_reg(c, g);
        return cddp_error_set(err, CDDP_ENOMEM,
                              "cannot allocate %zu MiB of shared memory on rank %d: %s (is "
                              "/dev/shm too small? under docker, raise --shm-size; or set "
                              "CDDP_SHM_ZERO_COPY=0 to use plain memory)",
                              bytes >> 20, bad, slot < 0 ? "too many allocations" : strerror(why));
    }
    g->id = id;
    *out = g->base[me];
    return CDDP_OK;
}

static int alloc_execute(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    size_t bytes = (size_t)a->count;
    void **out = a->recv;
    if (c->backend == BACKEND_SHM && bytes > 0 && cddp_knob_int(CDDP_KNOB_SHM_ZERO_COPY))
        return shm_alloc(c, bytes, deadline, out, err);
    if (!(*out = cddp_aligned_alloc(bytes ? bytes : 64)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory (%zu bytes)", bytes);
    return CDDP_OK;
}

static void free_execute(cddp_comm *c, void *p) {
    for (int i = 0; i < MAX_REGS; i++)
        if (c->regs[i].id && c->regs[i].base[c->rank] == p) {
            unmap_reg(c, &c->regs[i]);
            return;
        }
    cddp_aligned_free(p);
}

/* ---- point to point ----------------------------------------------------------------------- */

/* A message goes chunk by chunk through the sender's send slot: the sender copies a chunk in and
 * counts it posted; the receiver checks the message's count and dtype against its own, copies
 * the chunk out and counts it taken; the sender waits for that before the next chunk, and
 * returns only when the last one was taken. */
static int shm_p2p(cddp_comm *c, const coll *a, cddp_error *err) {
    double deadline = cddp_now_s() + (a->timeout_s >= 0 ? a->timeout_s : c->timeout);
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype), off = 0;
    int peer = a->root, me = c->rank;
    bool sending = a->kind == K_SEND;
    pair *p = sending ? pair_of(c, me, peer) : pair_of(c, peer, me);
    do {
        size_t n = CDDP_MIN(c->chunk, bytes - off);
        if (sending) {
            uint64_t k = atomic_load(&p->posted) + 1;
            memcpy(send_slot_of(c, me), (const uint8_t *)a->send + off, n);
            p->count = a->count;
            p->dtype = (int32_t)a->dtype;
            atomic_store(&p->posted, k);
            wake_sleepers(c);
            CDDP_TRY(wait_for(c, &p->taken, k, peer, "send", k, deadline, err));
            if (atomic_load(&p->refused))
                return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                       "send to rank %d of count %" PRId64 " %s, but rank %d "
                                       "receives count %" PRId64 " %s",
                                       peer, a->count, cddp_comm_dtype_name(a->dtype), peer,
                                       p->want_count, cddp_comm_dtype_name(p->want_dtype));
        } else {
            uint64_t k = atomic_load(&p->taken) + 1;
            CDDP_TRY(wait_for(c, &p->posted, k, peer, "recv", k, deadline, err));
            if (p->count != a->count || p->dtype != (int32_t)a->dtype) {
                p->want_count = a->count;
                p->want_dtype = (int32_t)a->dtype;
                atomic_store(&p->refused, 1);
                atomic_store(&p->taken, k);
                wake_sleepers(c);
                return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                       "recv from rank %d of count %" PRId64 " %s, but rank %d "
                                       "sends count %" PRId64 " %s",
                                       peer, a->count, cddp_comm_dtype_name(a->dtype), peer,
                                       p->count, cddp_comm_dtype_name(p->dtype));
            }
            memcpy((uint8_t *)a->recv + off, send_slot_of(c, peer), n);
            atomic_store(&p->taken, k);
            wake_sleepers(c);
        }
        off += n;
    } while (off < bytes);
    return CDDP_OK;
}

static int p2p_execute(cddp_comm *c, const coll *a, cddp_error *err) {
    if (c->failed.code) {
        if (err) *err = c->failed;
        return c->failed.code;
    }
    const char *verb = a->kind == K_SEND ? "send to" : "receive from";
    if (a->root < 0 || a->root >= c->world)
        return cddp_error_set(err, CDDP_EINVAL, "cannot %s rank %d: the group has ranks 0..%d",
                              verb, a->root, c->world - 1);
    CDDP_TRY(cddp__comm_check(c, a, err));
    if (a->root == c->rank)
        return cddp_error_set(err, CDDP_EINVAL, "rank %d cannot %s itself", c->rank, verb);
    CDDP_TRY(check_abort(c, err));
    if (c->backend == BACKEND_MPI)
        return a->kind == K_SEND ? cddp__mpi_send(c, a->send, a->count, a->dtype, a->root, err)
                                 : cddp__mpi_recv(c, a->recv, a->count, a->dtype, a->root, err);
    if (c->backend == BACKEND_TCP)
        return cddp__tcp_p2p(c, a, cddp_now_s() + (a->timeout_s >= 0 ? a->timeout_s : c->timeout),
                             err);
    return shm_p2p(c, a, err);
}

/* ---- running a call ---------------------------------------------------------------------- */

int cddp__comm_execute(cddp_comm *c, const coll *a, cddp_error *err) {
    double deadline = 0;
    const reg *direct;
    size_t offset = 0;
    if (a->kind == K_FREE) {
        free_execute(c, a->recv);
        return CDDP_OK;
    }
    if (a->kind == K_SEND || a->kind == K_RECV) return p2p_execute(c, a, err);
    CDDP_TRY(begin(c, a, &deadline, &direct, &offset, err));
    if (a->kind == K_BARRIER) return CDDP_OK;
    if (a->kind == K_ALLOC) return alloc_execute(c, a, deadline, err);
    if (c->backend == BACKEND_SELF) {
        self_execute(a);
        return CDDP_OK;
    }
    if (c->backend == BACKEND_MPI) switch (a->kind) {
        case K_ALLREDUCE:
            return cddp__mpi_allreduce(c, a->send, a->recv, a->count, a->dtype, a->op, err);
        case K_BROADCAST:
            return cddp__mpi_broadcast(c, a->recv, a->count, a->dtype, a->root, err);
        case K_ALLGATHER:
            return cddp__mpi_allgather(c, a->send, a->recv, a->count, a->dtype, err);
        case K_REDUCE_SCATTER:
            return cddp__mpi_reduce_scatter(c, a->send, a->recv, a->count, a->dtype, a->op, err);
        case K_GATHER:
            return cddp__mpi_gather(c, a->send, a->recv, a->count, a->dtype, a->root, err);
        default:
            return cddp__mpi_scatter(c, a->send, a->recv, a->count, a->dtype, a->root, err);
        }
    if (c->backend == BACKEND_TCP) return cddp__tcp_execute(c, a, deadline, err);
    switch (a->kind) {
    case K_ALLREDUCE:
        if (direct) return shm_allreduce_direct(c, a, direct, offset, deadline, err);
        return shm_allreduce(c, a, deadline, err);
    case K_BROADCAST:
        return shm_broadcast(c, a, deadline, err);
    case K_ALLGATHER:
        return shm_gather(c, a, -1, deadline, err);
    case K_REDUCE_SCATTER:
        return shm_reduce_scatter(c, a, deadline, err);
    case K_GATHER:
        return shm_gather(c, a, a->root, deadline, err);
    default:
        return shm_scatter(c, a, deadline, err);
    }
}

/* ---- the public calls: blocking, and queued on the communication thread ------------------- */

#define CALL(k, s, r, n, dt, o, rt, t)                                                             \
    (&(coll){.kind = (k),                                                                          \
             .send = (s),                                                                          \
             .recv = (r),                                                                          \
             .count = (n),                                                                         \
             .dtype = (dt),                                                                        \
             .op = (o),                                                                            \
             .root = (rt),                                                                         \
             .timeout_s = (t)})

int cddp_comm_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_comm_op op, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_ALLREDUCE, send, recv, count, dt, op, 0, timeout_s), err);
}

int cddp_comm_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int root,
                        double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_BROADCAST, buf, buf, count, dt, 0, root, timeout_s), err);
}

int cddp_comm_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_ALLGATHER, send, recv, count, dt, 0, 0, timeout_s), err);
}

int cddp_comm_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dt, cddp_comm_op op, double timeout_s,
                             cddp_error *err) {
    return cddp__comm_run(c, CALL(K_REDUCE_SCATTER, send, recv, count, dt, op, 0, timeout_s), err);
}

int cddp_comm_gather(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                     int root, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_GATHER, send, recv, count, dt, 0, root, timeout_s), err);
}

int cddp_comm_scatter(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                      int root, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_SCATTER, send, recv, count, dt, 0, root, timeout_s), err);
}

int cddp_comm_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dt, int dst,
                   double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_SEND, buf, NULL, count, dt, 0, dst, timeout_s), err);
}

int cddp_comm_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int src,
                   double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_RECV, NULL, buf, count, dt, 0, src, timeout_s), err);
}

void *cddp_comm_alloc(cddp_comm *c, size_t bytes, cddp_error *err) {
    void *p = NULL;
    if (bytes > INT64_MAX) {
        cddp_error_set(err, CDDP_EINVAL, "cannot allocate %zu bytes", bytes);
        return NULL;
    }
    int rc = cddp__comm_run(c, CALL(K_ALLOC, NULL, &p, (int64_t)bytes, 0, 0, 0, -1), err);
    return rc == CDDP_OK ? p : NULL;
}

void cddp_comm_free(cddp_comm *c, void *p) {
    if (c && p) cddp__comm_run(c, CALL(K_FREE, NULL, p, 0, 0, 0, 0, -1), NULL);
}

int cddp_comm_barrier(cddp_comm *c, double timeout_s, cddp_error *err) {
    return cddp__comm_run(c, CALL(K_BARRIER, NULL, NULL, 0, CDDP_COMM_F32, 0, 0, timeout_s), err);
}

cddp_comm_work *cddp_comm_allreduce_async(cddp_comm *c, const void *send, void *recv, int64_t count,
                                          cddp_comm_dtype dt, cddp_comm_op op, double timeout_s,
                                          cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_ALLREDUCE, send, recv, count, dt, op, 0, timeout_s), err);
}

cddp_comm_work *cddp_comm_broadcast_async(cddp_comm *c, void *buf, int64_t count,
                                          cddp_comm_dtype dt, int root, double timeout_s,
                                          cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_BROADCAST, buf, buf, count, dt, 0, root, timeout_s), err);
}

cddp_comm_work *cddp_comm_allgather_async(cddp_comm *c, const void *send, void *recv, int64_t count,
                                          cddp_comm_dtype dt, double timeout_s, cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_ALLGATHER, send, recv, count, dt, 0, 0, timeout_s), err);
}

cddp_comm_work *cddp_comm_reduce_scatter_async(cddp_comm *c, const void *send, void *recv,
                                               int64_t count, cddp_comm_dtype dt, cddp_comm_op op,
                                               double timeout_s, cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_REDUCE_SCATTER, send, recv, count, dt, op, 0, timeout_s),
                              err);
}

cddp_comm_work *cddp_comm_barrier_async(cddp_comm *c, double timeout_s, cddp_error *err) {
    return cddp__comm_enqueue(c, CALL(K_BARRIER, NULL, NULL, 0, CDDP_COMM_F32, 0, 0, timeout_s),
                              err);
}

void cddp_comm_abort(cddp_comm *c, const char *reason) {
    if (!c) return;
    atomic_fetch_add(&c->aborting, 1);
    if (!reason || !*reason) reason = "cddp_comm_abort was called";
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->aborted)) snprintf(c->abort_reason, sizeof c->abort_reason, "%s", reason);
    pthread_mutex_unlock(&c->mu);
    atomic_store_explicit(&c->aborted, 1, memory_order_release);
    if (c->seg) { /* tell the peers: the reason first, then the flag */
        snprintf(ctl_of(c, c->rank)->abort_reason, sizeof ctl_of(c, c->rank)->abort_reason, "%s",
                 reason);
        int32_t none = 0;
        atomic_compare_exchange_strong(&((seg_header *)c->seg)->abort_rank, &none, c->rank + 1);
        wake_sleepers(c);
    }
    if (c->backend == BACKEND_TCP) cddp__tcp_abort(c, reason);
    if (c->host) cddp_comm_abort(c->host, reason);
    if (c->backend == BACKEND_MPI) cddp__mpi_abort(c);
    atomic_fetch_sub(&c->aborting, 1);
}

/* ---- the group --------------------------------------------------------------------------- */

/* This host's identity: the kernel's boot id and the hostname. */
static void host_identity(char *out, size_t n) {
    const char *id = cddp_knob_str(CDDP_KNOB_HOST_ID);
    if (*id && strcmp(id, "auto") != 0) {
        snprintf(out, n, "%s", id);
        return;
    }
    char boot[64] = "", host[128] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    gethostname(host, sizeof host - 1);
    snprintf(out, n, "%s/%s", boot, host);
}

/* Under cddprun, rank 0 starts the group's store on any free port and posts the port in the
 * launcher's store (CDDP_STORE_ADDR/PORT/TOKEN), where the other ranks read it. MASTER_PORT, a
 * port cddprun found free and released for programs that bind it themselves (PyTorch's), is not
 * used: between its release and rank 0's bind, any process that binds or connects could take
 * it. The key names the restart round, MASTER_PORT (a job started by hand from inside a worker
 * sets its own) and the group's number in this process (groups are created collectively, so
 * every rank counts the same). */
static int store_via_launcher(const cddp__launch *l, int rank, const char *addr, const char *token,
                              cddp_store_server **srv, int *port, cddp_error *err) {
    static _Atomic int groups;
    char key[96], text[16];
    snprintf(key, sizeof key, "comm/r%d/m%d/g%d/port", l->restart, l->master_port,
             atomic_fetch_add(&groups, 1));
    cddp_store_options lo = {l->store_addr[0] ? l->store_addr : addr, l->store_port, l->store_token,
                             0, NULL};
    cddp_store *launcher = cddp_store_connect(&lo, err);
    if (!launcher) return err ? err->code : CDDP_EIO;
    int rc = CDDP_OK;
    if (rank == 0) {
        if (!(*srv = cddp_store_server_start(addr, 0, token, err))) {
            rc = err ? err->code : CDDP_EIO;
        } else {
            *port = cddp_store_server_port(*srv);
            snprintf(text, sizeof text, "%d", *port);
            rc = cddp_store_set_str(launcher, key, text, err);
        }
    } else {
        void *v = NULL;
        size_t n = 0;
        rc = cddp_store_get(launcher, key, -1, &v, &n, err);
        if (rc == CDDP_OK) *port = atoi(v);
        cddp_free(v);
    }
    cddp_store_close(launcher);
    return rc;
}

static int setup_shm(cddp_comm *c, cddp_store *st, cddp_error *err) {
    long kb = cddp_knob_int(CDDP_KNOB_SHM_CHUNK_KB);
    c->chunk = CDDP_MAX((size_t)(kb < 4 ? 4 : kb) * 1024, (size_t)c->world * 64);
    c->seg_size = 4096 + (size_t)c->world * CTL_SIZE + 2 * (size_t)c->world * c->chunk +
                  (size_t)c->world * c->world * PAIR_SIZE;
    c->acc = cddp_aligned_alloc(RBLOCK * sizeof(float));
    c->tmp = cddp_aligned_alloc(RBLOCK * sizeof(double));
    c->slots = cddp_calloc((size_t)c->world, sizeof *c->slots);
    c->src = cddp_calloc((size_t)c->world, sizeof *c->src);
    c->dst = cddp_calloc((size_t)c->world, sizeof *c->dst);
    if (!c->acc || !c->tmp || !c->slots || !c->src || !c->dst)
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    char name[96], key[64];
    int fd = -1;
    if (c->rank == 0) {
        uint64_t rnd = (uint64_t)(cddp_now_s() * 1e9) ^ ((uint64_t)getpid() << 20);
        snprintf(name, sizeof name, "/cddp-%d-%" PRIx64, (int)getpid(), rnd);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)c->seg_size) != 0) {
            int e = errno;
            if (fd >= 0) {
                close(fd);
                shm_unlink(name);
            }
            return cddp_error_set(err, CDDP_EIO,
                                  "cannot create the shared-memory segment %s "
                                  "(%zu MiB): %s; is /dev/shm full?",
                                  name, c->seg_size >> 20, strerror(e));
        }
        snprintf(key, sizeof key, "%scomm/shm", c->key_prefix);
        CDDP_TRY(cddp_store_set_str(st, key, name, err));
    } else {
        void *v;
        size_t n;
        snprintf(key, sizeof key, "%scomm/shm", c->key_prefix);
        CDDP_TRY(cddp_store_get(st, key, -1, &v, &n, err));
        snprintf(name, sizeof name, "%s", (char *)v);
        cddp_free(v);
        fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0)
            return cddp_error_set(err, CDDP_EIO, "cannot open the shared-memory segment %s: %s",
                                  name, strerror(errno));
    }
    void *p = mmap(NULL, c->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (c->rank == 0) shm_unlink(name);
        return cddp_error_set(err, CDDP_EIO, "cannot map %s: %s", name, strerror(errno));
    }
    c->seg = p;
    for (int r = 0; r < c->world; r++) c->slots[r] = slot_of(c, r);
    ctl_of(c, c->rank)->pid = (int32_t)getpid();
    if (c->rank == 0) {
        seg_header *h = (seg_header *)c->seg;
        h->world = c->world;
        h->chunk = c->chunk;
        atomic_thread_fence(memory_order_release);
        h->magic = SEG_MAGIC;
    }
    snprintf(key, sizeof key, "%scomm/mapped/%d", c->key_prefix, c->rank);
    CDDP_TRY(cddp_store_set_str(st, key, "1", err));
    /* Once every rank has mapped the segment its name goes: nothing is left in /dev/shm, whatever
     * happens to the processes afterwards. */
    if (c->rank == 0) {
        const char **keys = cddp_calloc((size_t)c->world, sizeof *keys);
        char(*k)[64] = cddp_calloc((size_t)c->world, 64);
        for (int r = 0; r < c->world; r++) {
            snprintf(k[r], 64, "%scomm/mapped/%d", c->key_prefix, r);
            keys[r] = k[r];
        }
        int rc = cddp_store_wait(st, keys, c->world, -1, err);
        shm_unlink(name);
        cddp_free(keys);
        cddp_free(k);
        CDDP_TRY(rc);
        snprintf(key, sizeof key, "%scomm/ready", c->key_prefix);
        CDDP_TRY(cddp_store_set_str(st, key, "1", err));
    } else {
        snprintf(key, sizeof key, "%scomm/ready", c->key_prefix);
        const char *k = key;
        CDDP_TRY(cddp_store_wait(st, &k, 1, -1, err));
        if (((seg_header *)c->seg)->magic != SEG_MAGIC || ((seg_header *)c->seg)->world != c->world)
            return cddp_error_set(err, CDDP_EIO,
                                  "the shared-memory segment %s is not this "
                                  "group's",
                                  name);
    }
    return CDDP_OK;
}

/* The hosts' leaders (each host's lowest rank), from every rank's host identity. */
static int find_leaders(cddp_comm *c, const char *const *hosts, cddp_error *err) {
    if (!(c->leaders = cddp_calloc((size_t)c->world, sizeof(int))))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    c->leader_index = -1;
    for (int r = 0; r < c->world; r++) {
        int first = 0;
        while (strcmp(hosts[first], hosts[r]) != 0) first++;
        if (r == c->rank) c->host_leader = first;
        if (first != r) continue;
        if (r == c->rank) c->leader_index = c->nleaders;
        c->leaders[c->nleaders++] = r;
    }
    return CDDP_OK;
}

/* The shm group of the ranks on this host, for the hierarchical allreduce. Its rendezvous keys
 * are named after the host's leader; its communication thread never starts (the group's own
 * thread runs its calls). */
static int setup_host_group(cddp_comm *c, cddp_store *st, cddp_error *err) {
    if (c->local_world == 1) return CDDP_OK;
    cddp_comm *h = cddp_calloc(1, sizeof *h);
    if (!h || cddp__comm_work_init(h) != CDDP_OK) {
        cddp_free(h);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    c->host = h;
    h->backend = BACKEND_SHM;
    h->rank = h->local_rank = c->local_rank;
    h->world = h->local_world = c->local_world;
    h->timeout = c->timeout;
    snprintf(h->key_prefix, sizeof h->key_prefix, "comm/h%d/", c->host_leader);
    return setup_shm(h, st, err);
}

/* Says once, on rank 0, what the group runs on and why, and who started it. */
static void log_backend(const cddp_comm *c, const cddp__launch *l, const char *why) {
    if (c->rank != 0 || !cddp_log_enabled(CDDP_LOG_INFO)) return;
    static const char *how[] = {"no communication", "shared memory", "tcp", "mpi"};
    char hosts[48] = "";
    if (c->world > 1)
        snprintf(hosts, sizeof hosts, " on %d host%s", c->nhosts, c->nhosts == 1 ? "" : "s");
    bool tell = l->why[0] && strcmp(l->why, why) != 0; /* how the launcher was recognised */
    cddp_log(
        CDDP_LOG_INFO, "comm", "%d rank%s%s: %s%s%s%s; started by %s%s%s%s", c->world,
        c->world == 1 ? "" : "s", hosts, how[c->backend], *why ? " (" : "", why, *why ? ")" : "",
        l->by[0] ? l->by
                 : "no launcher (none of RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID is "
                   "set)",
        tell ? " (" : "", tell ? l->why : "", tell ? ")" : "");
}

/* More than one rank on this host and no thread count chosen: one thread each for the math
 * libraries, as cddprun gives its workers, so that the ranks do not each start a pool as large
 * as the host. Said once, on rank 0. */
static void limit_threads(const cddp_comm *c) {
    if (c->local_world < 2 || getenv("OPENBLAS_NUM_THREADS") || getenv("GOTO_NUM_THREADS") ||
        getenv("OMP_NUM_THREADS"))
        return;
    cddp_set_num_threads(1);
    if (c->rank == 0)
        cddp_log(CDDP_LOG_INFO, "comm",
                 "%d ranks share this host: setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 "
                 "(unset here) so that they do not oversubscribe the cores; set them to tune",
                 c->local_world);
}

/* The MPI backend: CDDP_BACKEND=mpi, or auto under an MPI launcher when MPI is built in (and
 * the options do not describe a group of their own). CDDP_EINVAL/EUNSUPPORTED when asked for
 * something that cannot be. */
static int want_mpi(const cddp__launch *l, const cddp_comm_options *o, bool *mpi, char *why,
                    size_t n, cddp_error *err) {
    const char *want = cddp_knob_str(CDDP_KNOB_BACKEND);
    if (strcmp(want, "auto") && strcmp(want, "shm") && strcmp(want, "mpi"))
        return cddp_error_set(err, CDDP_EINVAL, "CDDP_BACKEND=%s: expected auto, shm or mpi", want);
    *mpi = !strcmp(want, "mpi") ||
           (!strcmp(want, "auto") && l->mpi && cddp__mpi_available() && o->world_size <= 0);
    if (*mpi && !cddp__mpi_available())
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "CDDP_BACKEND=mpi, but this cddp was built without MPI (install "
                              "libopenmpi-dev and rebuild)");
    snprintf(why, n, "%s", !strcmp(want, "mpi") ? "CDDP_BACKEND=mpi" : l->why);
    return CDDP_OK;
}

/* Who shares a host with whom: every rank posts its host identity and reads everyone's. Sets
 * local_rank, local_world, nhosts and the hosts' leaders. */
static int group_hosts(cddp_comm *c, cddp_store *st, cddp_error *err) {
    char me[256], key[64];
    host_identity(me, sizeof me);
    snprintf(key, sizeof key, "comm/host/%d", c->rank);
    CDDP_TRY(cddp_store_set_str(st, key, me, err));
    char **hosts = cddp_calloc((size_t)c->world, sizeof *hosts);
    if (!hosts) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = CDDP_OK, local = 0, before = 0;
    for (int r = 0; r < c->world && rc == CDDP_OK; r++) {
        size_t n;
        snprintf(key, sizeof key, "comm/host/%d", r);
        if ((rc = cddp_store_get(st, key, -1, (void **)&hosts[r], &n, err)) != CDDP_OK) break;
        if (strcmp(hosts[r], me) == 0) {
            local++;
            if (r < c->rank) before++;
        }
    }
    if (rc == CDDP_OK) rc = find_leaders(c, (const char *const *)hosts, err);
    for (int r = 0; r < c->world; r++) cddp_free(hosts[r]);
    cddp_free(hosts);
    c->local_rank = before;
    c->local_world = local;
    c->nhosts = c->nleaders;
    return rc;
}

/* The transport: shared memory when every rank is on this host, else TCP (hierarchical when
 * some host has several ranks); CDDP_TRANSPORT forces one. Every rank reaches the same choice:
 * the host count is the same for all. */
static int connect_ranks(cddp_comm *c, cddp_store *st, char *why, size_t n, cddp_error *err) {
    const char *tr = cddp_knob_str(CDDP_KNOB_TRANSPORT);
    if (strcmp(tr, "auto") && strcmp(tr, "shm") && strcmp(tr, "tcp"))
        return cddp_error_set(err, CDDP_EINVAL, "CDDP_TRANSPORT=%s: expected auto, shm or tcp", tr);
    if (!strcmp(tr, "shm") && c->local_world != c->world)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "CDDP_TRANSPORT=shm, but the group spans hosts (%d of %d ranks on "
                              "this one): unset it to use TCP between the hosts",
                              c->local_world, c->world);
    if (strcmp(tr, "tcp") && c->local_world == c->world) {
        c->backend = BACKEND_SHM;
        snprintf(why, n, "%s",
                 strcmp(tr, "shm") ? "every rank on this host" : "CDDP_TRANSPORT=shm");
        return setup_shm(c, st, err);
    }
    c->backend = BACKEND_TCP;
    double rdzv = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    CDDP_TRY(cddp__tcp_setup(c, st, rdzv, err));
    /* Across hosts with several ranks on some, allreduce goes through each host's shared
     * memory (CDDP_TRANSPORT=tcp keeps everything on TCP). */
    if (!strcmp(tr, "auto") && c->nleaders > 1 && c->nleaders < c->world) {
        snprintf(why, n, "ranks on different hosts, allreduce hierarchical");
        CDDP_TRY(setup_host_group(c, st, err));
        cddp_log(CDDP_LOG_INFO, "comm",
                 "TCP between %d hosts; allreduce is hierarchical: shared memory among this "
                 "host's %d ranks, a TCP ring between the hosts' leaders",
                 c->nleaders, c->local_world);
        return CDDP_OK;
    }
    snprintf(why, n, "%s", strcmp(tr, "tcp") ? "ranks on different hosts" : "CDDP_TRANSPORT=tcp");
    c->nleaders = 0;
    return CDDP_OK;
}

/* Meets the other ranks at rank 0's store and connects to them. */
static int rendezvous(cddp_comm *c, const cddp__launch *l, const cddp_comm_options *opts,
                      const cddp_comm_options *o, char *why, size_t n, cddp_error *err) {
    const char *addr = o->master_addr ? o->master_addr : l->master_addr;
    if (!*addr) addr = "127.0.0.1";
    int port = o->master_port > 0 ? o->master_port : l->master_port;
    if (port <= 0 || port > 65535)
        return cddp_error_set(err, CDDP_EINVAL,
                              "MASTER_PORT is not set (or not a port): start the program with "
                              "cddprun, torchrun, mpirun or srun, or pass master_port");
    if (l->derived_master && c->rank == 0)
        cddp_log(CDDP_LOG_INFO, "comm",
                 "srun: meeting at %s:%d (the step's first host; MASTER_ADDR and MASTER_PORT "
                 "choose another)",
                 addr, port);
    const char *token = o->token ? o->token : l->store_token ? l->store_token : "cddp";
    bool whole_job =
        !opts || (opts->world_size <= 0 && !opts->master_addr && opts->master_port <= 0);
    cddp_store_server *srv = NULL;
    cddp_store *st = NULL;
    int rc = CDDP_OK;
    if (whole_job && l->store_port > 0)
        CDDP_TRY_GOTO(store_via_launcher(l, c->rank, addr, token, &srv, &port, err), out);
    else if (c->rank == 0 && !(srv = cddp_store_server_start(addr, port, token, err))) {
        rc = err ? err->code : CDDP_EIO;
        goto out;
    }
    cddp_store_options so = {addr, port, token, 0, NULL};
    if (!(st = cddp_store_connect(&so, err))) {
        rc = err ? err->code : CDDP_EIO;
        goto out;
    }
    CDDP_TRY_GOTO(group_hosts(c, st, err), out);
    CDDP_TRY_GOTO(connect_ranks(c, st, why, n, err), out);
    /* Rank 0's store may go once everyone has left the rendezvous. */
    char key[64];
    snprintf(key, sizeof key, "comm/done/%d", c->rank);
    CDDP_TRY_GOTO(cddp_store_set_str(st, key, "1", err), out);
    for (int r = 1; r < c->world && c->rank == 0; r++) {
        snprintf(key, sizeof key, "comm/done/%d", r);
        const char *k = key;
        CDDP_TRY_GOTO(cddp_store_wait(st, &k, 1, -1, err), out);
    }
out:
    cddp_store_close(st);
    cddp_store_server_stop(srv);
    return rc;
}

cddp_comm *cddp_comm_create(const cddp_comm_options *opts, cddp_error *err) {
    cddp_comm_options o = opts ? *opts : (cddp_comm_options){0};
    cddp__launch l;
    char why[160] = "";
    bool mpi = false;
    cddp_comm *c = cddp_calloc(1, sizeof *c);
    if (!c || cddp__comm_work_init(c) != CDDP_OK) {
        cddp_free(c);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    int rc = cddp__launch_read(&l, err);
    if (rc == CDDP_OK) rc = want_mpi(&l, &o, &mpi, why, sizeof why, err);
    if (rc != CDDP_OK) goto out;
    c->timeout = o.timeout_s > 0 ? o.timeout_s : (double)cddp_knob_int(CDDP_KNOB_TIMEOUT_S);
    c->local_world = c->nhosts = 1;
    if (mpi) {
        c->backend = BACKEND_MPI;
        CDDP_TRY_GOTO(cddp__mpi_init(c, err), out);
        cddp_log_set_rank(c->rank);
    } else {
        if (o.world_size <= 0) o.rank = l.rank, o.world_size = l.world;
        if (o.rank < 0 || o.rank >= o.world_size) {
            rc =
                cddp_error_set(err, CDDP_EINVAL, "rank %d is not in [0, %d)", o.rank, o.world_size);
            goto out;
        }
        c->rank = o.rank;
        c->world = o.world_size;
        c->backend = BACKEND_SELF;
        cddp_log_set_rank(c->rank);
        if (c->world > 1) CDDP_TRY_GOTO(rendezvous(c, &l, opts, &o, why, sizeof why, err), out);
    }
    log_backend(c, &l, why);
    limit_threads(c);
out:
    if (rc != CDDP_OK) {
        cddp_comm_destroy(c);
        return NULL;
    }
    return c;
}

void cddp_comm_destroy(cddp_comm *c) {
    if (!c) return;
    /* An abort from another thread that this rank's calls already failed on may still be telling
     * the peers: it finishes first. */
    while (atomic_load(&c->aborting)) sched_yield();
    cddp__comm_work_fini(c);
    if (c->backend == BACKEND_MPI) cddp__mpi_finalize(c);
    cddp__tcp_close(c);
    cddp_comm_destroy(c->host);
    cddp_free(c->leaders);
    for (int i = 0; i < MAX_REGS; i++)
        if (c->regs[i].id) unmap_reg(c, &c->regs[i]);
    if (c->seg) munmap(c->seg, c->seg_size);
    cddp_aligned_free(c->acc);
    cddp_aligned_free(c->tmp);
    cddp_free(c->slots);
    cddp_free(c->src);
    cddp_free(c->dst);
    cddp_free(c);
}
