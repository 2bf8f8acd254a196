/* tcp.c: the TCP transport: a full mesh of connections between the ranks.
 *
 * Setup. Every rank listens on its address (CDDP_LOCAL_ADDR, which cddprun sets from
 * --local_addr or the hostname; else 127.0.0.1 when the master is local, else the hostname),
 * posts it in the rendezvous store, connects twice to every lower rank (saying who it is, which
 * connection and its pid) and accepts every higher one. Both ends of each connection prove the
 * job token to the other without sending it (cddp/net.h: a nonce each way, then an HMAC of both
 * under a label naming the two ranks, the channel and the side), so a process without the token
 * can neither pose as a rank nor take a rank's place. Each pair of ranks has
 *
 *   - a data connection, for the collectives' bytes: non-blocking, TCP_NODELAY, 4 MiB buffers,
 *     every transfer a loop that sends and receives at once (full duplex) with the collective's
 *     deadline, retrying for 20 us when stuck (the answer is usually that close) before it
 *     sleeps in poll;
 *   - a control connection, for one notice: this rank aborted the group (and why), failed (and
 *     with which error), or left it (cddp_comm_destroy). A rank that dies sends none, so its
 *     peers read end-of-file with no notice: it died. A transfer that cannot progress watches
 *     every control connection, so every survivor learns of a failure at once and names the
 *     rank at its root, even when it is waiting for another rank.
 *
 * Fingerprints. Each collective starts with every rank sending its fingerprint to every other and
 * reading theirs (one hop of latency, whatever the world size); a point-to-point message carries a
 * fingerprint of kind send, so a rank that is in a collective when a message arrives reports both
 * sides too.
 *
 * The collectives are the generic ones (ring.c, hier.c) over this transport's moves, but for the
 * latency path of allreduce: up to CDDP_TCP_SMALL_KB, every rank sends its fingerprint and its
 * whole buffer to every other and reduces all of them in rank order, one hop for both.
 */
#include "comm/tcp.h"
#include "cddp/net.h"

#include "cddp/store.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- notices ----------------------------------------------------------------------------- */

/* Sends this rank's notice to every peer, once: the first of abort, failure or leaving counts. */
static void tell(cddp_comm *c, int kind, const char *why) {
    tcp *t = T(c);
    int none = 0;
    if (!t || !atomic_compare_exchange_strong(&t->told, &none, 1)) return;
    notice n = {TCP_MAGIC, kind, 0, {0}};
    int skip = 0; /* the "rank N: " the error starts with: the peers name this rank themselves */
    sscanf(why, "rank %*d: %n", &skip);
    snprintf(n.why, sizeof n.why, "%s", why + skip);
    for (int r = 0; r < c->world; r++)
        if (t->control[r] >= 0) {
            /* A few hundred bytes into an idle socket's buffer: this does not block. */
            if (send(t->control[r], &n, sizeof n, MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof n)
                cddp_log(CDDP_LOG_DEBUG, "comm", "could not tell rank %d: %s", r, strerror(errno));
            shutdown(t->control[r], SHUT_WR);
        }
    atomic_store(&t->told, 2);
}

static void tcp_abort(cddp_comm *c, const char *reason) {
    tell(c, PEER_ABORTED, reason);
}

static void tcp_failed(cddp_comm *c) {
    tell(c, PEER_FAILED, c->failed.msg);
}

/* Appends a poll entry for the control connection of every peer not yet heard from, to t->pfd
 * from index np; returns the new count. */
static int watch_controls(const cddp_comm *c, int np) {
    const tcp *t = T(c);
    for (int r = 0; r < c->world; r++)
        if (t->control[r] >= 0 && t->state[r] == PEER_LIVE)
            t->pfd[np++] = (struct pollfd){t->control[r], POLLIN, 0};
    return np;
}

/* Reads what peer r's control connection holds so far; returns its state. */
static int peer_state(cddp_comm *c, int r) {
    tcp *t = T(c);
    while (t->state[r] == PEER_LIVE) {
        ssize_t k = recv(t->control[r], (char *)&t->notes[r] + t->noted[r],
                         sizeof(notice) - t->noted[r], MSG_DONTWAIT);
        if (k > 0 && (t->noted[r] += (size_t)k) == sizeof(notice))
            t->state[r] = t->notes[r].magic == TCP_MAGIC && t->notes[r].kind >= PEER_ABORTED &&
                                  t->notes[r].kind <= PEER_LEFT
                              ? t->notes[r].kind
                              : PEER_DIED;
        else if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
            t->state[r] = PEER_DIED; /* closed with no notice (or a partial one) */
        else if (k < 0 && errno == EAGAIN)
            break;
    }
    t->notes[r].why[sizeof t->notes[r].why - 1] = '\0';
    return t->state[r];
}

/* The failure a peer's notice (or its death) makes of this rank's call. */
static int peer_failure(cddp_comm *c, int r, const char *what, cddp_error *err) {
    tcp *t = T(c);
    switch (t->state[r]) {
    case PEER_DIED:
        return cddp__comm_peer_died(c, err, r, t->pid[r], what, c->seq);
    case PEER_ABORTED:
        return cddp__comm_peer_aborted(c, err, r, t->notes[r].why);
    case PEER_FAILED:
        return cddp__comm_peer_failed(c, err, r, t->notes[r].why);
    default: /* PEER_LEFT: its notice says after how many collectives */
        return cddp__comm_peer_left(c, err, r, what, c->seq, strtoull(t->notes[r].why, NULL, 10));
    }
}

/* The root of a failure among the peers whose control connection is readable now: a death
 * first, then an abort, then a failure (which a death or an abort elsewhere may have caused;
 * unless settled, this waits a moment for one). A peer that left is not a failure by itself.
 * CDDP_OK when there is none. */
static int check_peers(cddp_comm *c, const char *what, bool settled, cddp_error *err) {
    tcp *t = T(c);
    CDDP_TRY(cddp__comm_aborted_here(c, err)); /* the peers may be failing because of it */
    static const int severity[] = {[PEER_FAILED] = 1, [PEER_ABORTED] = 2, [PEER_DIED] = 3};
    int worst = -1;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank || t->control[r] < 0) continue;
        int s = peer_state(c, r);
        if (s == PEER_LEFT || s == PEER_LIVE) continue;
        if (worst < 0 || severity[s] > severity[t->state[worst]]) worst = r;
    }
    if (worst >= 0 && t->state[worst] == PEER_FAILED && !settled) {
        /* A peer failed because of something: if a rank died or aborted, its own connections
         * say so within moments, and that is the error to report. */
        for (double until = cddp_now_s() + 0.2; cddp_now_s() < until;) {
            bool root = false;
            for (int r = 0; r < c->world; r++) {
                int st = t->control[r] < 0 ? PEER_LIVE : peer_state(c, r);
                root |= st == PEER_DIED || st == PEER_ABORTED;
            }
            int np = watch_controls(c, 0);
            if (root || np == 0) break;
            poll(t->pfd, (nfds_t)np, 10);
        }
        return check_peers(c, what, true, err);
    }
    return worst < 0 ? CDDP_OK : peer_failure(c, worst, what, err);
}

/* Peer r closed its data connection: waits a moment for its notice, then names the cause. */
static int peer_closed(cddp_comm *c, int r, const char *what, cddp_error *err) {
    tcp *t = T(c);
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    double until = cddp_now_s() + 1.0;
    while (peer_state(c, r) == PEER_LIVE && cddp_now_s() < until) {
        struct pollfd pf = {t->control[r], POLLIN, 0};
        poll(&pf, 1, 10);
    }
    if (t->state[r] == PEER_LIVE)
        return cddp__comm_fail(c, err, CDDP_EIO,
                               "%s #%" PRIu64 ": rank %d closed the connection: it died or "
                               "failed; %s",
                               what, c->seq, r, cddp__comm_cause_told(c));
    if (t->state[r] == PEER_FAILED) CDDP_TRY(check_peers(c, what, false, err)); /* the root cause */
    return peer_failure(c, r, what, err);
}

/* ---- moving bytes ------------------------------------------------------------------------ */

static bool receives_left(const xfer *in, int nin) {
    for (int i = 0; i < nin; i++)
        if (in[i].done < in[i].n) return true;
    return false;
}

/* Sends and receives every transfer at once, or fails (latching the group) on the deadline, an
 * abort of this rank, or a peer's failure. Tries the sockets first and polls only when none can
 * progress, watching every control connection meanwhile. Without all, returns once the
 * receives are complete, the sends perhaps not (the caller calls again to go on with them). */
static int tcp_move(cddp_comm *c, xfer *out, int nout, xfer *in, int nin, bool all,
                    const char *what, double deadline, cddp_error *err) {
    tcp *t = T(c);
    bool until_received = !all;
    cddp__spin spin = {0};
    for (;;) {
        bool progress = false, left = false;
        for (int i = 0; i < nout; i++) {
            xfer *x = &out[i];
            if (x->done == x->n) continue;
            ssize_t k = send(t->data[x->peer], x->buf + x->done, x->n - x->done,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0)
                x->done += (size_t)k, progress = true;
            else if (errno != EAGAIN && errno != EINTR)
                return peer_closed(c, x->peer, what, err);
            left |= x->done < x->n;
        }
        for (int i = 0; i < nin; i++) {
            xfer *x = &in[i];
            if (x->done == x->n) continue;
            ssize_t k = recv(t->data[x->peer], x->buf + x->done, x->n - x->done, MSG_DONTWAIT);
            if (k > 0)
                x->done += (size_t)k, progress = true;
            else if (k == 0 || (errno != EAGAIN && errno != EINTR))
                return peer_closed(c, x->peer, what, err);
            left |= x->done < x->n;
        }
        if (!left || (until_received && !receives_left(in, nin))) return CDDP_OK;
        if (progress) {
            spin.start = 0;
            continue;
        }
        /* The peer is most likely about to answer: retry before sleeping in poll (the latency
         * path), as the shared-memory waits do. */
        if (cddp__comm_spin(c, &spin, cddp_now_s(), false)) continue;
        spin = (cddp__spin){0};
        CDDP_TRY(cddp__comm_aborted_here(c, err));
        int np = 0, waiting_for = -1;
        for (int i = 0; i < nout; i++)
            if (out[i].done < out[i].n) {
                t->pfd[np++] = (struct pollfd){t->data[out[i].peer], POLLOUT, 0};
                waiting_for = out[i].peer;
            }
        for (int i = 0; i < nin; i++)
            if (in[i].done < in[i].n) {
                t->pfd[np++] = (struct pollfd){t->data[in[i].peer], POLLIN, 0};
                waiting_for = in[i].peer;
            }
        int first_control = np;
        np = watch_controls(c, np);
        int ms = cddp_net_poll_ms(deadline);
        int pr = poll(t->pfd, (nfds_t)np, ms < 0 || ms > 10 ? 10 : ms);
        if (pr < 0 && errno != EINTR)
            return cddp__comm_fail(c, err, CDDP_EIO, "%s: poll: %s", what, strerror(errno));
        /* Bytes that arrived before a peer's notice are read first: a receiver that failed on
         * a mismatch answered the sender before it said so. */
        bool data_ready = false, control_ready = false;
        for (int i = 0; i < np && pr > 0; i++)
            *(i < first_control ? &data_ready : &control_ready) |= t->pfd[i].revents != 0;
        if (control_ready && !data_ready) CDDP_TRY(check_peers(c, what, false, err));
        if (pr <= 0 && deadline >= 0 && cddp_now_s() > deadline)
            return cddp__comm_timed_out(c, err, what, c->seq, waiting_for);
        if (pr <= 0 && c->stall_warn > 0 && cddp_now_s() - c->call_start >= c->stall_warn) {
            int late[64], n = 0; /* the peers whose bytes this rank still waits for */
            for (int i = 0; i < nout + nin && n < 64; i++) {
                const xfer *x = i < nout ? &out[i] : &in[i - nout];
                bool seen = false;
                for (int k = 0; k < n; k++) seen |= late[k] == x->peer;
                if (x->done < x->n && !seen) late[n++] = x->peer;
            }
            cddp__comm_stalled(c, late, n, true);
        }
    }
}

/* Sends sn bytes to rank to while receiving rn bytes from rank from. */
static int exchange(cddp_comm *c, int to, const void *sbuf, size_t sn, int from, void *rbuf,
                    size_t rn, const char *what, double deadline, cddp_error *err) {
    xfer out = {to, (uint8_t *)sbuf, sn, 0}, in = {from, rbuf, rn, 0};
    return tcp_move(c, &out, to >= 0, &in, from >= 0, true, what, deadline, err);
}

static uint8_t *scratch(cddp_comm *c, size_t bytes) {
    tcp *t = T(c);
    if (bytes > t->scratch_size) {
        cddp_aligned_free(t->scratch);
        t->scratch_size = bytes;
        if (!(t->scratch = cddp_aligned_alloc(bytes + 64))) t->scratch_size = 0;
    }
    return t->scratch;
}

/* Every rank's message is a fingerprint header of HDR bytes (its collective's), then its data. */
#define HDR 64

/* Sends this rank's message (n bytes at all + rank * stride: the header, then the data) to every
 * peer and receives each peer's into all + r * stride: first the headers, which are checked
 * against this rank's fingerprint, then the data. A collective that differs thus fails before
 * any of its data is taken for this one's. */
static int all_to_all(cddp_comm *c, uint8_t *all, size_t stride, size_t n, double deadline,
                      cddp_error *err) {
    int W = c->world, me = c->rank;
    xfer *out = T(c)->xfers, *in = out + W - 1;
    int k = 0;
    for (int r = 0; r < W; r++)
        if (r != me) {
            out[k] = (xfer){r, all + (size_t)me * stride, n, 0};
            in[k] = (xfer){r, all + (size_t)r * stride, HDR, 0};
            k++;
        }
    int rc = tcp_move(c, out, W - 1, in, W - 1, n <= HDR, "collective", deadline, err);
    if (rc == CDDP_OK)
        rc = cddp__comm_check_fingerprints(c, (const fingerprint *)(all + (size_t)me * stride),
                                           (const fingerprint *)all, stride, err);
    for (int i = 0; i < W - 1 && rc == CDDP_OK; i++) {
        in[i].buf += HDR;
        in[i].n = n - HDR;
        in[i].done = 0;
    }
    if (rc == CDDP_OK) rc = tcp_move(c, out, W - 1, in, W - 1, true, "collective", deadline, err);
    return rc;
}

/* ---- the start of a collective ---------------------------------------------------------- */

bool cddp__tcp_small(const cddp_comm *c, const coll *a) {
    return (size_t)a->count * cddp_comm_dtype_size(a->dtype) <= T(c)->small;
}

/* Every rank's fingerprint to every other, checked. */
static int tcp_begin(cddp_comm *c, const coll *a, const fingerprint *mine, double deadline,
                     cddp__place *place, cddp_error *err) {
    (void)a;
    *place = (cddp__place){NULL, 0};
    uint8_t *all = scratch(c, HDR * (size_t)c->world);
    if (!all) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    memset(all + (size_t)c->rank * HDR, 0, HDR);
    memcpy(all + (size_t)c->rank * HDR, mine, sizeof *mine);
    return all_to_all(c, all, HDR, HDR, deadline, err);
}

/* ---- collectives ------------------------------------------------------------------------- */

/* The latency path: every rank sends its fingerprint and buffer to every other and reduces all
 * the buffers in rank order. */
int cddp__tcp_allreduce_small(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                              cddp_error *err) {
    (void)p;
    int W = c->world;
    size_t es = cddp_comm_dtype_size(a->dtype), bytes = (size_t)a->count * es;
    size_t stride = HDR + ((bytes + 63) & ~(size_t)63), n = HDR + bytes;
    bool half = cddp__comm_is_half(a->dtype);
    fingerprint fp = {c->seq, a->kind, a->op, (int32_t)a->dtype, a->root, a->count};
    uint8_t *all = scratch(c, stride * (size_t)W + (half ? 2 * (size_t)a->count * 4 : 0));
    if (!all) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    uint8_t *mine = all + (size_t)c->rank * stride;
    memset(mine, 0, HDR);
    memcpy(mine, &fp, sizeof fp);
    memcpy(mine + HDR, a->send, bytes);
    CDDP_TRY(all_to_all(c, all, stride, n, deadline, err));
    uint8_t *first = all + HDR;
    if (half) { /* accumulate in float32, round once */
        float *acc = (float *)(all + stride * (size_t)W), *tmp = acc + a->count;
        cddp_comm_to_f32(a->dtype, first, acc, a->count);
        for (int r = 1; r < W; r++) {
            cddp_comm_to_f32(a->dtype, first + (size_t)r * stride, tmp, a->count);
            cddp_comm_combine(CDDP_COMM_F32, a->op, acc, tmp, a->count);
        }
        if (a->op == CDDP_COMM_MEAN) cddp_comm_divide(CDDP_COMM_F32, acc, a->count, W);
        cddp_comm_from_f32(a->dtype, acc, a->recv, a->count);
        return CDDP_OK;
    }
    for (int r = 1; r < W; r++)
        cddp_comm_combine(a->dtype, a->op, first, first + (size_t)r * stride, a->count);
    if (a->op == CDDP_COMM_MEAN) cddp_comm_divide(a->dtype, first, a->count, W);
    memcpy(a->recv, first, bytes);
    return CDDP_OK;
}

/* After a peer's failure: for up to wait_s, the root cause (a death, an abort) as the control
 * connections tell it. */
static int tcp_root_cause(cddp_comm *c, const char *what, double wait_s, cddp_error *err) {
    tcp *t = T(c);
    for (double until = cddp_now_s() + wait_s; cddp_now_s() < until;) {
        CDDP_TRY(check_peers(c, what, false, err));
        poll(t->pfd, (nfds_t)watch_controls(c, 0), 10);
    }
    return CDDP_OK;
}

/* ---- point to point ---------------------------------------------------------------------- */

/* The message goes after a fingerprint of kind send (count, dtype, root = the receiver); the
 * receiver answers with its own expectation, so a mismatch fails both sides. */
static int tcp_p2p(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    int peer = a->root, me = c->rank;
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype);
    /* Headers of HDR bytes, as every collective's, so that a collective meeting a message reads
     * its fingerprint whole (and the other way round). */
    fingerprint mine = {0, K_SEND, 0, (int32_t)a->dtype, a->kind == K_SEND ? peer : me, a->count};
    fingerprint theirs;
    uint8_t out[HDR] = {0}, in[HDR];
    memcpy(out, &mine, sizeof mine);
    if (a->kind == K_SEND) {
        CDDP_TRY(exchange(c, peer, out, HDR, -1, NULL, 0, "send", deadline, err));
        CDDP_TRY(exchange(c, peer, a->send, bytes, -1, NULL, 0, "send", deadline, err));
        CDDP_TRY(exchange(c, -1, NULL, 0, peer, in, HDR, "send", deadline, err));
        memcpy(&theirs, in, sizeof theirs);
        if (memcmp(&theirs, &mine, sizeof mine) != 0)
            return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                   "send to rank %d of count %" PRId64 " %s, but rank %d "
                                   "receives count %" PRId64 " %s",
                                   peer, a->count, cddp_comm_dtype_name(a->dtype), peer,
                                   theirs.count, cddp_comm_dtype_name(theirs.dtype));
        return CDDP_OK;
    }
    CDDP_TRY(exchange(c, -1, NULL, 0, peer, in, HDR, "recv", deadline, err));
    memcpy(&theirs, in, sizeof theirs);
    /* Tell the sender what this rank expects before failing, so that both report it. */
    CDDP_TRY(exchange(c, peer, out, HDR, -1, NULL, 0, "recv", deadline, err));
    if (memcmp(&theirs, &mine, sizeof mine) != 0)
        return cddp__comm_fail(c, err, CDDP_ESHAPE,
                               "recv from rank %d of count %" PRId64 " %s, but rank %d sends "
                               "count %" PRId64 " %s",
                               peer, a->count, cddp_comm_dtype_name(a->dtype), peer, theirs.count,
                               cddp_comm_dtype_name(theirs.dtype));
    return exchange(c, -1, NULL, 0, peer, a->recv, bytes, "recv", deadline, err);
}

/* ---- teardown ---------------------------------------------------------------------------- */

/* Says goodbye (a peer still waiting on this rank then fails at once), ends both directions of
 * every connection after what was sent, and reads away what is left so that closing does not
 * reset a peer's connection before it has read this rank's last bytes. */
static void tcp_close(cddp_comm *c) {
    tcp *t = T(c);
    if (!t) return;
    if (t->data && t->control) {
        char after[24]; /* the collectives this rank made, for a peer still in one */
        snprintf(after, sizeof after, "%" PRIu64, c->seq);
        tell(c, PEER_LEFT, after);
        while (atomic_load(&t->told) != 2) /* another thread's abort is telling the peers */
            sched_yield();
        uint8_t sink[4096];
        for (int r = 0; r < c->world; r++) {
            int fds[2] = {t->data[r], t->control[r]};
            for (int i = 0; i < 2; i++) {
                if (fds[i] < 0) continue;
                shutdown(fds[i], SHUT_WR);
                while (recv(fds[i], sink, sizeof sink, MSG_DONTWAIT) > 0) {}
                close(fds[i]);
            }
        }
    }
    cddp_free(t->data);
    cddp_free(t->control);
    cddp_free(t->pid);
    cddp_free(t->state);
    cddp_free(t->notes);
    cddp_free(t->noted);
    cddp_free(t->pfd);
    cddp_free(t->xfers);
    cddp_aligned_free(t->scratch);
    cddp_free(t);
    c->priv = NULL;
}

const cddp__transport cddp__tcp_transport = {
    .name = "tcp",
    .says = "tcp",
    .setup = cddp__tcp_setup,
    .close = tcp_close,
    .abort = tcp_abort,
    .failed = tcp_failed,
    .begin = tcp_begin,
    .move = tcp_move,
    .p2p = tcp_p2p,
    .root_cause = tcp_root_cause,
};
