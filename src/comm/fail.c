/* fail.c: how a group fails: the latched first error, aborts, and the words every transport
 * uses for them.
 *
 * A failure latches: the first error stays in the group and every later call fails at once
 * with it. The transport is told (so that it can tell the peers, which may be waiting for this
 * rank), and so is this host's shared-memory group of a hierarchical allreduce, whose ranks wait
 * for this one where no notice reaches. An abort, from any thread, sets a flag that every wait
 * polls; its reason is read under the group's lock.
 */
#include "comm/internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int cddp__comm_fail(cddp_comm *c, cddp_error *err, int code, const char *fmt, ...) {
    if (!c->failed.code) {
        va_list ap;
        va_start(ap, fmt);
        cddp_error_vset(&c->failed, code, fmt, ap);
        va_end(ap);
        if (c->tr && c->tr->failed) c->tr->failed(c);
        if (c->host && !atomic_load(&c->host->aborted)) cddp__comm_abort(c->host, c->failed.msg);
        if (c->flight_group > 0) cddp__flight_dump_because(c->failed.msg);
    }
    if (err) *err = c->failed;
    return c->failed.code;
}

int cddp__comm_failed(const cddp_comm *c, cddp_error *err) {
    if (c->failed.code && err) *err = c->failed;
    return c->failed.code;
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

const char *cddp__comm_cause_told(const cddp_comm *c) {
    const char *by = c->started_by;
    return !strcmp(by, "cddprun")  ? "the launcher's report says why"
           : !strcmp(by, "srun")   ? "srun's output for its task says why"
           : !strcmp(by, "mpirun") ? "mpirun's output says why"
           : *by                   ? "its launcher's output says why"
                                   : "its own output says why";
}

int cddp__comm_peer_died(cddp_comm *c, cddp_error *err, int who, int pid, const char *what,
                         uint64_t num) {
    return cddp__comm_fail(c, err, CDDP_EIO,
                           "rank %d (pid %d) died during %s #%" PRIu64
                           "; the group is unusable (%s)",
                           who, pid, what, num, cddp__comm_cause_told(c));
}

int cddp__comm_peer_left(cddp_comm *c, cddp_error *err, int who, const char *what, uint64_t num,
                         uint64_t after) {
    return cddp__comm_fail(c, err, CDDP_EIO,
                           "rank %d left the group (cddp_comm_destroy) after %" PRIu64
                           " collectives, while this rank was in %s #%" PRIu64
                           " with it: the ranks did not make the same calls. Did they take "
                           "different numbers of steps (data of different lengths, a last batch "
                           "some ranks lack)? Give every rank as many batches (a "
                           "DistributedSampler does), or let ranks finish early with DDP's join",
                           who, after, what, num);
}

int cddp__comm_timed_out(cddp_comm *c, cddp_error *err, const char *what, uint64_t num, int who) {
    if (who < 0) /* MPI: its collectives do not say who is late */
        return cddp__comm_fail(c, err, CDDP_ETIMEDOUT,
                               "%s #%" PRIu64 " timed out: not every rank reached it (over MPI "
                               "cddp cannot tell which: one that left the group, is stopped, "
                               "stuck, or calling something else?); raise CDDP_TIMEOUT_S or the "
                               "call's timeout if it is only slow",
                               what, num);
    return cddp__comm_fail(c, err, CDDP_ETIMEDOUT,
                           "%s #%" PRIu64 " timed out waiting for rank %d (is it stopped, stuck, "
                           "or calling something else?); raise CDDP_TIMEOUT_S or the call's "
                           "timeout if it is only slow",
                           what, num, who);
}

int cddp__comm_peer_failed(cddp_comm *c, cddp_error *err, int who, const char *why) {
    return cddp__comm_fail(c, err, CDDP_EIO, "rank %d failed: %.400s", who, why);
}

void cddp__comm_abort(cddp_comm *c, const char *reason) {
    atomic_fetch_add(&c->aborting, 1);
    if (!reason || !*reason) reason = "cddp_comm_abort was called";
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->aborted)) snprintf(c->abort_reason, sizeof c->abort_reason, "%s", reason);
    pthread_mutex_unlock(&c->mu);
    atomic_store_explicit(&c->aborted, 1, memory_order_release);
    if (c->tr && c->tr->abort) c->tr->abort(c, reason);
    if (c->host) cddp__comm_abort(c->host, reason);
    atomic_fetch_sub(&c->aborting, 1);
}

/* ---- fingerprints ------------------------------------------------------------------------ */

static void describe(const fingerprint *f, char *out, size_t n);

void cddp__comm_stalled(cddp_comm *c, const int *ranks, int n, bool arrived) {
    double now = cddp_now_s();
    if (c->stall_warn <= 0 || c->call_start <= 0 || n <= 0 || now - c->call_start < c->stall_warn ||
        now - c->stall_said < c->stall_warn)
        return;
    c->stall_said = now;
    char call[160], who[256];
    describe(&c->call, call, sizeof call);
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof who - 16; i++)
        at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", i ? ", " : "", ranks[i]);
    cddp_log(CDDP_LOG_WARN, "comm",
             "%s #%" PRIu64 " has waited %.0f s for rank%s %s, which %s; the wait ends at the "
             "call's timeout (%.0f s by default: CDDP_TIMEOUT_S). Is %s stopped, stuck or "
             "calling something else?",
             call, c->call.seq, now - c->call_start, n > 1 ? "s" : "", who,
             arrived ? (n > 1 ? "have not sent their part yet" : "has not sent its part yet")
                     : (n > 1 ? "have not reached this call" : "has not reached this call"),
             c->timeout, n > 1 ? "one of them" : "it");
    if (c->flight_group > 0) {
        char why[sizeof call + sizeof who + 80];
        snprintf(why, sizeof why, "%s #%" PRIu64 " stalled: it has waited %.0f s for rank%s %s",
                 call, c->call.seq, now - c->call_start, n > 1 ? "s" : "", who);
        cddp__flight_dump_because(why);
    }
}

static void describe(const fingerprint *f, char *out, size_t n) {
    const char *dt = cddp_comm_dtype_name(f->dtype), *op = cddp_comm_op_name(f->op);
    const char *name = cddp__comm_kind_name(f->kind);
    switch (f->kind) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER:
        snprintf(out, n, "%s(%s, %s, count %" PRId64 ")", name, op, dt, f->count);
        break;
    case K_BROADCAST:
    case K_GATHER:
    case K_SCATTER:
        snprintf(out, n, "%s(%s, count %" PRId64 ", root %d)", name, dt, f->count, f->root);
        break;
    case K_ALLGATHER:
        snprintf(out, n, "allgather(%s, count %" PRId64 ")", dt, f->count);
        break;
    case K_ALLOC:
        snprintf(out, n, "alloc(%" PRId64 " bytes)", f->count);
        break;
    case K_SEND:
        snprintf(out, n, "send(%s, count %" PRId64 ", to rank %d)", dt, f->count, f->root);
        break;
    case K_RECV:
        snprintf(out, n, "recv(%s, count %" PRId64 ", from rank %d)", dt, f->count, f->root);
        break;
    default:
        snprintf(out, n, "barrier()");
        break;
    }
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
