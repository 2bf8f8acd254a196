/* shm_coll.c: the shared-memory transport's collectives and the start of each (design in
 * shm.c). */
#include "comm/shm.h"

#include <string.h>

/* ---- the start of a collective ----------------------------------------------------------- */

/* Publishes the fingerprint and where an in-place allreduce's buffer lies, meets everyone, and
 * checks that every rank called the same thing; the buffer is read in place when every rank's
 * lies at the same offset of the same registration (every rank compares every rank's, so all
 * reach the same answer). */
int cddp__shm_begin(cddp_comm *c, const coll *a, const fingerprint *mine, double deadline,
                    cddp__place *place, cddp_error *err) {
    const reg *g = NULL;
    size_t offset = 0;
    reg_at at = {0, 0};
    size_t es = cddp_comm_dtype_size(a->dtype);
    if (a->kind == K_ALLREDUCE && a->send == a->recv && a->count > 0 &&
        (g = cddp__shm_find_reg(c, a->recv, (size_t)a->count * es, &offset)))
        at = (reg_at){g->id, offset};
    ctl_of(c, c->rank)->at[c->seq & 1] = at;
    ctl_of(c, c->rank)->fp[c->seq & 1] = *mine;
    CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
    for (int r = 0; r < c->world && g; r++) {
        const reg_at *their = &ctl_of(c, r)->at[c->seq & 1];
        if (their->id != at.id || their->offset != at.offset) g = NULL;
    }
    *place = (cddp__place){g, offset};
    return cddp__comm_check_fingerprints(c, mine, &ctl_of(c, 0)->fp[c->seq & 1], CTL_SIZE, err);
}

/* ---- collectives ------------------------------------------------------------------------- */

/* Elements per slot for one round; every slot holds at least world * 8 bytes. */
static int64_t per_round(const cddp_comm *c, size_t es, int parts) {
    return CDDP_MAX((int64_t)(priv(c)->chunk / es) / parts, 1);
}

/* In place in registered memory (every rank's buffer at the same offset of the same
 * registration; begin met everyone, so every buffer holds its input). The message is cut into
 * pieces of IN_PLACE_PIECE bytes, which the ranks take in turn from a counter in the segment: the
 * rank that takes piece k reduces it from every rank's buffer, in rank order, into every rank's
 * buffer, and counts it done; a rank leaves when every piece is done (after which no rank touches
 * the buffers for this call). Who reduces a piece does not change its bits; what changes is that a
 * rank whose core is busy (another process, a slower step) takes fewer pieces and the others take
 * the rest, and that no barrier ends the call (the next one begins with one), where a fixed slice
 * per rank, then a barrier, had everyone wait for the slowest twice. With one of 2 cores loaded
 * (bench/allreduce_tails.sh, 5 rounds, median of the rounds' p50): 4-16 KiB 43-70 -> 2.2-4.8 us;
 * idle unchanged (4 KiB 2.1 -> 2.0 us, 64 KiB 15.0 -> 14.4); the loaded bandwidth of 1-64 MiB
 * unchanged, within the rounds' spread. The counters are by parity; rank 0 clears the other
 * parity's for the next call, which no rank can be in yet. */
#define IN_PLACE_PIECE (64 << 10)

static int allreduce_in_place(cddp_comm *c, const coll *a, const reg *g, size_t offset,
                              double deadline, cddp_error *err) {
    shm *s = priv(c);
    seg_header *h = header(c);
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world;
    int64_t n = a->count, per = CDDP_MAX((int64_t)(IN_PLACE_PIECE / es), 1);
    uint64_t pieces = (uint64_t)((n + per - 1) / per), k, mine = 0;
    int par = (int)(++s->in_place & 1);
    if (c->rank == 0) {
        atomic_store(&h->piece_next[!par], 0);
        atomic_store(&h->piece_done[!par], 0);
    }
    for (int r = 0; r < W; r++) s->src[r] = g->base[r] + offset;
    while ((k = atomic_fetch_add(&h->piece_next[par], 1)) < pieces) {
        int64_t lo = (int64_t)k * per, m = CDDP_MIN(per, n - lo);
        for (int r = 0; r < W; r++) s->dst[r] = s->src[r] + (size_t)lo * es;
        cddp__comm_reduce_sources(a->dtype, a->op, s->src, W, lo, m, s->dst, W, s->acc, s->tmp);
        atomic_fetch_add(&h->piece_done[par], 1); /* sequentially consistent, as arrivals */
        mine++;
    }
    if (mine) cddp__shm_wake(c);
    /* a piece that a peer took and never finished: each peer's process is looked for in turn */
    return cddp__shm_wait_for(c, &h->piece_done[par], pieces, -1, "collective", c->seq, deadline,
                              err);
}

/* Per round of n elements, slice q (elements [n q / W, n (q + 1) / W)) is staged in part q of a
 * slot, at the same place in every round:
 *   1. every rank copies every slice but its own into its slot;                 barrier
 *   2. rank r reduces slice r from every peer's slot and its own send buffer, in rank order,
 *      into its recv and into part r of its slot;                               barrier
 *   3. every rank copies slice q from part q of rank q's slot.
 * The next round's step 1 writes only parts that step 3 does not read, so no barrier is needed
 * between rounds, nor at the end: the next collective begins with one. */
int cddp__shm_allreduce(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err) {
    if (p->reg) return allreduce_in_place(c, a, p->reg, p->offset, deadline, err);
    shm *s = priv(c);
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world, me = c->rank;
    size_t part = s->chunk / (size_t)W / 64 * 64; /* bytes, a multiple of the cache line */
    int64_t per = (int64_t)(part / es) * W;
    const uint8_t *send = a->send;
    uint8_t *recv = a->recv;
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        for (int q = 0; q < W; q++) {
            int64_t qlo = n * q / W, qhi = n * (q + 1) / W;
            if (q != me)
                memcpy(s->slots[me] + (size_t)q * part, send + (size_t)(off + qlo) * es,
                       (size_t)(qhi - qlo) * es);
        }
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
        int64_t lo = n * me / W, hi = n * (me + 1) / W;
        for (int q = 0; q < W; q++) /* so that element lo of source q is element lo of slice */
            s->src[q] = q == me ? (uint8_t *)send + (size_t)off * es
                                : s->slots[q] + (size_t)me * part - (size_t)lo * es;
        uint8_t *dst[2] = {recv + (size_t)(off + lo) * es, s->slots[me] + (size_t)me * part};
        cddp__comm_reduce_sources(a->dtype, a->op, s->src, W, lo, hi - lo, dst, 2, s->acc, s->tmp);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
        for (int q = 0; q < W; q++) {
            int64_t qlo = n * q / W, qhi = n * (q + 1) / W;
            if (q != me)
                memcpy(recv + (size_t)(off + qlo) * es, s->slots[q] + (size_t)q * part,
                       (size_t)(qhi - qlo) * es);
        }
    }
    return CDDP_OK;
}

/* Per round, every rank stages n elements of each of the world's blocks (block q at q * n in
 * its slot); rank r reduces region r over all slots straight into its recv. */
int cddp__shm_reduce_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                             cddp_error *err) {
    (void)p;
    shm *s = priv(c);
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world, me = c->rank;
    int64_t per = per_round(c, es, W);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        for (int q = 0; q < W; q++)
            memcpy(s->slots[me] + (size_t)(q * n) * es,
                   (const uint8_t *)a->send + (size_t)(q * a->count + off) * es, (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
        uint8_t *dst = (uint8_t *)a->recv + (size_t)off * es;
        cddp__comm_reduce_sources(a->dtype, a->op, s->slots, W, me * n, n, &dst, 1, s->acc, s->tmp);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

int cddp__shm_broadcast(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err) {
    (void)p;
    shm *s = priv(c);
    size_t es = cddp_comm_dtype_size(a->dtype);
    int64_t per = per_round(c, es, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        uint8_t *q = (uint8_t *)a->recv + (size_t)off * es;
        if (c->rank == a->root) memcpy(s->slots[a->root], q, (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
        if (c->rank != a->root) memcpy(q, s->slots[a->root], (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

/* allgather (root -1: everyone receives) and gather (only root receives). */
static int gather(cddp_comm *c, const coll *a, int root, double deadline, cddp_error *err) {
    shm *s = priv(c);
    size_t es = cddp_comm_dtype_size(a->dtype);
    int64_t per = per_round(c, es, 1);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        memcpy(s->slots[c->rank], (const uint8_t *)a->send + (size_t)off * es, (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
        if (root < 0 || root == c->rank)
            for (int q = 0; q < c->world; q++)
                memcpy((uint8_t *)a->recv + (size_t)(q * a->count + off) * es, s->slots[q],
                       (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

int cddp__shm_allgather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err) {
    (void)p;
    return gather(c, a, -1, deadline, err);
}

int cddp__shm_gather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                     cddp_error *err) {
    (void)p;
    return gather(c, a, a->root, deadline, err);
}

/* root stages n elements of every rank's part (part q at q * n in its slot). */
int cddp__shm_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                      cddp_error *err) {
    (void)p;
    shm *s = priv(c);
    size_t es = cddp_comm_dtype_size(a->dtype);
    int W = c->world;
    int64_t per = per_round(c, es, W);
    for (int64_t off = 0; off < a->count; off += per) {
        int64_t n = CDDP_MIN(per, a->count - off);
        if (c->rank == a->root)
            for (int q = 0; q < W; q++)
                memcpy(s->slots[a->root] + (size_t)(q * n) * es,
                       (const uint8_t *)a->send + (size_t)(q * a->count + off) * es,
                       (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
        memcpy((uint8_t *)a->recv + (size_t)off * es,
               s->slots[a->root] + (size_t)(c->rank * n) * es, (size_t)n * es);
        CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
    }
    return CDDP_OK;
}

int cddp__shm_run(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    CDDP_TRY(cddp__comm_failed(c, err));
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    c->seq++;
    fingerprint mine = {c->seq, a->kind, a->op, (int32_t)a->dtype, a->root, a->count};
    cddp__place place;
    CDDP_TRY(cddp__shm_begin(c, a, &mine, deadline, &place, err));
    return a->kind == K_ALLREDUCE ? cddp__shm_allreduce(c, a, &place, deadline, err)
                                  : cddp__shm_broadcast(c, a, &place, deadline, err);
}
