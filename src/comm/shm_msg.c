/* shm_msg.c: the shared-memory transport's moves and the user's messages (design in shm.c). */
#include "comm/shm.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- moving bytes and messages ----------------------------------------------------------- */

/* Waits until this rank's send slot is free: the last chunk it held was taken. */
static int slot_free(cddp_comm *c, const char *what, double deadline, cddp_error *err) {
    int q = priv(c)->slot_peer;
    if (q < 0) return CDDP_OK;
    pair *p = pair_of(c, c->rank, q);
    return cddp__shm_wait_for(c, &p->taken, atomic_load(&p->posted), q, what, c->seq, deadline,
                              err);
}

typedef struct moving {
    const cddp_comm *c;
    const cddp__xfer *send, *recv;
    int nsend, nrecv;
} moving;

/* Whether a move can progress: a chunk waits for a receive, or the send slot was freed. */
static bool can_move(const void *arg) {
    const moving *m = arg;
    const cddp_comm *c = m->c;
    for (int i = 0; i < m->nrecv; i++) {
        const pair *p = pair_of(c, m->recv[i].peer, c->rank);
        if (m->recv[i].done < m->recv[i].n && atomic_load(&p->posted) > atomic_load(&p->taken))
            return true;
    }
    for (int i = 0; i < m->nsend; i++) {
        const pair *p =
            pair_of(c, c->rank, priv(c)->slot_peer < 0 ? m->send[i].peer : priv(c)->slot_peer);
        if (m->send[i].done < m->send[i].n && atomic_load(&p->posted) == atomic_load(&p->taken))
            return true;
    }
    return false;
}

/* Sends are posted chunk by chunk through the one send slot (so one send at a time), receives
 * taken as their chunks arrive; a send is done once its last chunk is posted (it is taken by
 * the receiver's own move). */
int cddp__shm_move(cddp_comm *c, cddp__xfer *send, int nsend, cddp__xfer *recv, int nrecv, bool all,
                   const char *what, double deadline, cddp_error *err) {
    shm *s = priv(c);
    CDDP_CHECK(nsend <= 1, "the shared-memory transport moves one send at a time (%d asked)",
               nsend);
    moving m = {c, send, recv, nsend, nrecv};
    waiting w = {0};
    for (;;) {
        bool progress = false, sends_left = false, recvs_left = false;
        for (int i = 0; i < nrecv; i++) {
            cddp__xfer *x = &recv[i];
            pair *p = pair_of(c, x->peer, c->rank);
            if (x->done < x->n && atomic_load(&p->posted) > atomic_load(&p->taken)) {
                if (p->dtype >= 0)
                    return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                           "%s #%" PRIu64
                                           ": rank %d sent a message (cddp_comm_send) "
                                           "where this rank is in a collective; did every rank "
                                           "call the same collectives and messages in the same "
                                           "order?",
                                           what, c->seq, x->peer);
                size_t *off = &s->taking[x->peer];
                size_t k = CDDP_MIN((size_t)p->count - *off, x->n - x->done);
                memcpy(x->buf + x->done, send_slot_of(c, x->peer) + *off, k);
                x->done += k;
                if ((*off += k) == (size_t)p->count) {
                    *off = 0;
                    atomic_fetch_add(&p->taken, 1);
                    cddp__shm_wake(c);
                }
                progress = true;
            }
            recvs_left |= x->done < x->n;
        }
        for (int i = 0; i < nsend; i++) {
            cddp__xfer *x = &send[i];
            int q = s->slot_peer < 0 ? x->peer : s->slot_peer;
            pair *held = pair_of(c, c->rank, q);
            if (x->done < x->n && atomic_load(&held->posted) == atomic_load(&held->taken)) {
                pair *p = pair_of(c, c->rank, x->peer);
                size_t k = CDDP_MIN(s->chunk, x->n - x->done);
                memcpy(send_slot_of(c, c->rank), x->buf + x->done, k);
                p->count = (int64_t)k;
                p->dtype = -1;
                s->slot_peer = x->peer;
                atomic_fetch_add(&p->posted, 1);
                cddp__shm_wake(c);
                x->done += k;
                progress = true;
            }
            sends_left |= x->done < x->n;
        }
        if (!recvs_left && (!all || !sends_left)) return CDDP_OK;
        if (progress) {
            w.spin.start = 0;
            continue;
        }
        int who = recvs_left ? -1 : s->slot_peer;
        for (int i = 0; i < nrecv && who < 0; i++)
            if (recv[i].done < recv[i].n) who = recv[i].peer;
        CDDP_TRY(cddp__shm_idle(c, &w, can_move, &m, who, true, what, c->seq, deadline, err));
    }
}

/* The user's messages, through the same send slot: the sender waits for each chunk to be taken,
 * so send returns once the receiver has the data. The receiver checks the message's count and
 * dtype against its own and, if they differ, says so in the pair (refused) and fails; the
 * sender then fails too, naming both sides. */
int cddp__shm_p2p(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    shm *s = priv(c);
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype), off = 0;
    int peer = a->root, me = c->rank;
    bool sending = a->kind == K_SEND;
    pair *p = sending ? pair_of(c, me, peer) : pair_of(c, peer, me);
    if (sending) CDDP_TRY(slot_free(c, "send", deadline, err));
    do {
        size_t n = CDDP_MIN(s->chunk, bytes - off);
        if (sending) {
            uint64_t k = atomic_load(&p->posted) + 1;
            memcpy(send_slot_of(c, me), (const uint8_t *)a->send + off, n);
            p->count = a->count;
            p->dtype = (int32_t)a->dtype;
            s->slot_peer = peer;
            atomic_store(&p->posted, k);
            cddp__shm_wake(c);
            CDDP_TRY(cddp__shm_wait_for(c, &p->taken, k, peer, "send", k, deadline, err));
            if (atomic_load(&p->refused))
                return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                       "send to rank %d of count %" PRId64 " %s, but rank %d "
                                       "receives count %" PRId64 " %s",
                                       peer, a->count, cddp_comm_dtype_name(a->dtype), peer,
                                       p->want_count, cddp_comm_dtype_name(p->want_dtype));
        } else {
            uint64_t k = atomic_load(&p->taken) + 1;
            CDDP_TRY(cddp__shm_wait_for(c, &p->posted, k, peer, "recv", k, deadline, err));
            if (p->count != a->count || p->dtype != (int32_t)a->dtype) {
                p->want_count = a->count;
                p->want_dtype = (int32_t)a->dtype;
                atomic_store(&p->refused, 1);
                atomic_store(&p->taken, k);
                cddp__shm_wake(c);
                return cddp__comm_fail(c, err, CDDP_ESHAPE,
                                       "recv from rank %d of count %" PRId64 " %s, but rank %d "
                                       "sends count %" PRId64 " %s",
                                       peer, a->count, cddp_comm_dtype_name(a->dtype), peer,
                                       p->count, cddp_comm_dtype_name(p->dtype));
            }
            memcpy((uint8_t *)a->recv + off, send_slot_of(c, peer), n);
            atomic_store(&p->taken, k);
            cddp__shm_wake(c);
        }
        off += n;
    } while (off < bytes);
    return CDDP_OK;
}
