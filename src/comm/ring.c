/* ring.c: the collectives written once, over any transport that moves bytes between two ranks.
 *
 * The ring allreduce. The n ranks stand in a ring, each sending to the next and receiving from
 * the previous, and the message is cut into n segments. It runs in two halves, and each rank
 * sends and receives 2(n-1)/n of the message in all, which is the least any allreduce can move
 * (bandwidth-optimal), whatever n is:
 *
 *   reduce-scatter  at step s (0..n-2) rank r sends segment (r - s - 1) mod n to r + 1 and
 *                   receives segment (r - s - 2) mod n from r - 1, which it adds into its copy.
 *                   After n - 1 steps rank r holds segment r reduced over every rank.
 *   allgather       at step s rank r sends segment (r - s) mod n, which it holds complete, and
 *                   receives segment (r - s - 1) mod n, complete, from r - 1.
 *
 * Within a step the outgoing segment streams out while the incoming one arrives in pipeline
 * chunks (CDDP_TCP_CHUNK_KB), each added while the next is on its way, so the link and the adds
 * overlap. Every element is reduced by one rank in one order and copied to the others, so every
 * rank gets bit-identical results; a mean divides each segment once, where it is complete.
 * 16-bit types travel as 16 bits and accumulate in float32 (ring_allreduce_half): each hop's
 * partial sum is rounded for the wire and widened where it arrives, each rank's complete
 * segment is rounded once, and the allgather moves the rounded segments, so the bytes on the
 * wire are half of float32's (what the bf16/fp16 gradient hooks are for) and every rank gets the
 * same bits. On 2 ranks (or hosts) that is one rounding, as in the other paths; each more rank
 * adds one to the partial sums (a 16-bit ring, NCCL's, rounds at every hop). The ring's latency is
 * 2(n-1) steps, which is why small messages take a transport's one-hop path where it has one.
 *
 * reduce_scatter is the first half over the whole input, whose segments are then exactly the
 * ranks' blocks; allgather the second half. broadcast, gather and scatter are linear: the root
 * sends to or receives from every rank in turn (DDP uses them at wrap and join only).
 */
#include "comm/internal.h"

#include <string.h>

static int64_t seg_lo(int64_t n, int q, int W) {
    return n * q / W;
}

static int ring_peer(const cddp__ring *g, int i) {
    i = ((i % g->n) + g->n) % g->n;
    return g->members ? g->members[i] : i;
}

/* The group's scratch, grown to bytes; NULL when out of memory (the group fails). */
static uint8_t *scratch(cddp_comm *c, size_t bytes, cddp_error *err) {
    if (bytes > c->scratch_size) {
        cddp_aligned_free(c->scratch);
        c->scratch_size = bytes;
        if (!(c->scratch = cddp_aligned_alloc(bytes + 64))) c->scratch_size = 0;
    }
    if (!c->scratch) cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory (%zu bytes)", bytes);
    return c->scratch;
}

/* Sends sn bytes to rank to while receiving rn bytes from rank from (either may be -1). */
static int exchange(cddp_comm *c, int to, const void *sbuf, size_t sn, int from, void *rbuf,
                    size_t rn, double deadline, cddp_error *err) {
    cddp__xfer out = {to, (uint8_t *)sbuf, sn, 0}, in = {from, rbuf, rn, 0};
    return c->tr->move(c, &out, to >= 0, &in, from >= 0, true, "collective", deadline, err);
}

/* Reduce-scatter of buf (count elements of dt, 4 or 8 bytes each) over the ring g: afterwards
 * segment g->idx of buf holds the reduction (the other segments are partial). */
static int reduce_scatter_buf(cddp_comm *c, const cddp__ring *g, uint8_t *buf, int64_t count,
                              cddp_comm_dtype dt, cddp_comm_op op, double deadline,
                              cddp_error *err) {
    int W = g->n, me = g->idx, next = ring_peer(g, me + 1), prev = ring_peer(g, me - 1);
    size_t es = cddp_comm_dtype_size(dt);
    uint8_t *tmp = scratch(c, c->ring_chunk, err);
    if (!tmp) return CDDP_ENOMEM;
    int64_t per = (int64_t)(c->ring_chunk / es);
    for (int s = 0; s < W - 1; s++) {
        int sq = ((me - s - 1) % W + W) % W, rq = ((me - s - 2) % W + W) % W;
        int64_t slo = seg_lo(count, sq, W), sn = seg_lo(count, sq + 1, W) - slo;
        int64_t rlo = seg_lo(count, rq, W), rn = seg_lo(count, rq + 1, W) - rlo;
        cddp__xfer out = {next, buf + (size_t)slo * es, (size_t)sn * es, 0};
        for (int64_t at = 0; at < rn; at += per) {
            int64_t kr = CDDP_MIN(per, rn - at);
            cddp__xfer in = {prev, tmp, (size_t)kr * es, 0};
            CDDP_TRY(c->tr->move(c, &out, 1, &in, 1, false, "collective", deadline, err));
            cddp_comm_combine(dt, op, buf + (size_t)(rlo + at) * es, tmp, kr);
        }
        CDDP_TRY(c->tr->move(c, &out, 1, NULL, 0, true, "collective", deadline, err));
    }
    return CDDP_OK;
}

/* Allgather of the n segments of buf over the ring g: member idx starts with segment idx. */
static int allgather_buf(cddp_comm *c, const cddp__ring *g, uint8_t *buf, int64_t count, size_t es,
                         double deadline, cddp_error *err) {
    int W = g->n, me = g->idx, next = ring_peer(g, me + 1), prev = ring_peer(g, me - 1);
    for (int s = 0; s < W - 1; s++) {
        int sq = ((me - s) % W + W) % W, rq = ((me - s - 1) % W + W) % W;
        int64_t slo = seg_lo(count, sq, W), sn = seg_lo(count, sq + 1, W) - slo;
        int64_t rlo = seg_lo(count, rq, W), rn = seg_lo(count, rq + 1, W) - rlo;
        CDDP_TRY(exchange(c, next, buf + (size_t)slo * es, (size_t)sn * es, prev,
                          buf + (size_t)rlo * es, (size_t)rn * es, deadline, err));
    }
    return CDDP_OK;
}

/* The reduce-scatter of ring_allreduce_half: wide (n float32) accumulates, and each segment sent
 * is first rounded into narrow (n 16-bit values of dt16), which goes on the wire. */
static int reduce_scatter_half(cddp_comm *c, const cddp__ring *g, float *wide, uint16_t *narrow,
                               int64_t count, cddp_comm_dtype dt16, cddp_comm_op op,
                               double deadline, cddp_error *err) {
    int W = g->n, me = g->idx, next = ring_peer(g, me + 1), prev = ring_peer(g, me - 1);
    int64_t per = (int64_t)(c->ring_chunk / sizeof(uint16_t));
    uint8_t *tmp = scratch(c, (size_t)per * (sizeof(uint16_t) + sizeof(float)), err);
    if (!tmp) return CDDP_ENOMEM;
    uint16_t *in16 = (uint16_t *)tmp;
    float *in32 = (float *)(tmp + (size_t)per * sizeof(uint16_t));
    for (int s = 0; s < W - 1; s++) {
        int sq = ((me - s - 1) % W + W) % W, rq = ((me - s - 2) % W + W) % W;
        int64_t slo = seg_lo(count, sq, W), sn = seg_lo(count, sq + 1, W) - slo;
        int64_t rlo = seg_lo(count, rq, W), rn = seg_lo(count, rq + 1, W) - rlo;
        cddp_comm_from_f32(dt16, wide + slo, narrow + slo, sn);
        cddp__xfer out = {next, (uint8_t *)(narrow + slo), (size_t)sn * sizeof(uint16_t), 0};
        for (int64_t at = 0; at < rn; at += per) {
            int64_t kr = CDDP_MIN(per, rn - at);
            cddp__xfer in = {prev, (uint8_t *)in16, (size_t)kr * sizeof(uint16_t), 0};
            CDDP_TRY(c->tr->move(c, &out, 1, &in, 1, false, "collective", deadline, err));
            cddp_comm_to_f32(dt16, in16, in32, kr);
            cddp_comm_combine(CDDP_COMM_F32, op, wide + rlo + at, in32, kr);
        }
        CDDP_TRY(c->tr->move(c, &out, 1, NULL, 0, true, "collective", deadline, err));
    }
    return CDDP_OK;
}

int cddp__ring_allreduce_half(cddp_comm *c, const cddp__ring *g, float *wide, uint16_t *narrow,
                              int64_t n, cddp_comm_dtype dt16, cddp_comm_op op, double deadline,
                              cddp_error *err) {
    CDDP_TRY(reduce_scatter_half(c, g, wide, narrow, n, dt16, op, deadline, err));
    int64_t lo = seg_lo(n, g->idx, g->n), hi = seg_lo(n, g->idx + 1, g->n);
    if (op == CDDP_COMM_MEAN) cddp_comm_divide(CDDP_COMM_F32, wide + lo, hi - lo, c->world);
    cddp_comm_from_f32(dt16, wide + lo, narrow + lo, hi - lo);
    return allgather_buf(c, g, (uint8_t *)narrow, n, sizeof(uint16_t), deadline, err);
}

int cddp__ring_allreduce_buf(cddp_comm *c, const cddp__ring *g, uint8_t *buf, int64_t n,
                             cddp_comm_dtype dt, cddp_comm_op op, double deadline,
                             cddp_error *err) {
    size_t es = cddp_comm_dtype_size(dt);
    CDDP_TRY(reduce_scatter_buf(c, g, buf, n, dt, op, deadline, err));
    if (op == CDDP_COMM_MEAN) {
        int64_t lo = seg_lo(n, g->idx, g->n);
        cddp_comm_divide(dt, buf + (size_t)lo * es, seg_lo(n, g->idx + 1, g->n) - lo, c->world);
    }
    return allgather_buf(c, g, buf, n, es, deadline, err);
}

/* The buffer a reduction works in: recv itself (send copied in), or, for a 16-bit type, a
 * float32 copy of send; *wide is that copy, to narrow back and free. */
static uint8_t *work_buffer(cddp_comm *c, const coll *a, int64_t n, float **wide, cddp_error *err) {
    *wide = NULL;
    if (cddp__comm_is_half(a->dtype)) {
        if (!(*wide = cddp_aligned_alloc((size_t)n * sizeof(float) + 64))) {
            cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
            return NULL;
        }
        cddp_comm_to_f32(a->dtype, a->send, *wide, n);
        return (uint8_t *)*wide;
    }
    if (a->send != a->recv) memcpy(a->recv, a->send, (size_t)n * cddp_comm_dtype_size(a->dtype));
    return a->recv;
}

int cddp__ring_allreduce(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err) {
    (void)p;
    float *wide;
    uint8_t *buf = work_buffer(c, a, a->count, &wide, err);
    if (!buf) return CDDP_ENOMEM;
    cddp__ring flat = {NULL, c->world, c->rank};
    int rc =
        wide ? cddp__ring_allreduce_half(c, &flat, wide, a->recv, a->count, a->dtype, a->op,
                                         deadline, err)
             : cddp__ring_allreduce_buf(c, &flat, buf, a->count, a->dtype, a->op, deadline, err);
    cddp_aligned_free(wide);
    return rc;
}

int cddp__ring_reduce_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                              cddp_error *err) {
    (void)p;
    int W = c->world;
    size_t es = cddp_comm_dtype_size(a->dtype);
    int64_t total = a->count * W;
    bool half = cddp__comm_is_half(a->dtype);
    size_t wes = half ? 4 : es;
    /* 16-bit: a float32 copy to sum in, and 16-bit staging for the wire (as the allreduce) */
    uint8_t *buf = cddp_aligned_alloc((size_t)total * (wes + (half ? es : 0)) + 64);
    if (!buf) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    if (half)
        cddp_comm_to_f32(a->dtype, a->send, (float *)buf, total);
    else
        memcpy(buf, a->send, (size_t)total * es);
    cddp_comm_dtype dt = half ? CDDP_COMM_F32 : a->dtype;
    cddp__ring flat = {NULL, W, c->rank};
    int rc =
        half ? reduce_scatter_half(c, &flat, (float *)buf, (uint16_t *)(buf + (size_t)total * wes),
                                   total, a->dtype, a->op, deadline, err)
             : reduce_scatter_buf(c, &flat, buf, total, dt, a->op, deadline, err);
    uint8_t *mine = buf + (size_t)(a->count * c->rank) * wes;
    if (rc == CDDP_OK && a->op == CDDP_COMM_MEAN) cddp_comm_divide(dt, mine, a->count, W);
    if (rc == CDDP_OK && half)
        cddp_comm_from_f32(a->dtype, (const float *)mine, a->recv, a->count);
    else if (rc == CDDP_OK)
        memcpy(a->recv, mine, (size_t)a->count * es);
    cddp_aligned_free(buf);
    return rc;
}

int cddp__ring_allgather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err) {
    (void)p;
    size_t es = cddp_comm_dtype_size(a->dtype), bytes = (size_t)a->count * es;
    memmove((uint8_t *)a->recv + (size_t)c->rank * bytes, a->send, bytes);
    cddp__ring flat = {NULL, c->world, c->rank};
    return allgather_buf(c, &flat, a->recv, a->count * c->world, es, deadline, err);
}

int cddp__linear_broadcast(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                           cddp_error *err) {
    (void)p;
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype);
    if (c->rank != a->root) return exchange(c, -1, NULL, 0, a->root, a->recv, bytes, deadline, err);
    for (int r = 0; r < c->world; r++)
        if (r != c->rank) CDDP_TRY(exchange(c, r, a->recv, bytes, -1, NULL, 0, deadline, err));
    return CDDP_OK;
}

int cddp__linear_gather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err) {
    (void)p;
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype);
    if (c->rank != a->root) return exchange(c, a->root, a->send, bytes, -1, NULL, 0, deadline, err);
    memmove((uint8_t *)a->recv + (size_t)c->rank * bytes, a->send, bytes);
    for (int r = 0; r < c->world; r++)
        if (r != c->rank)
            CDDP_TRY(exchange(c, -1, NULL, 0, r, (uint8_t *)a->recv + (size_t)r * bytes, bytes,
                              deadline, err));
    return CDDP_OK;
}

int cddp__linear_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err) {
    (void)p;
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype);
    if (c->rank != a->root) return exchange(c, -1, NULL, 0, a->root, a->recv, bytes, deadline, err);
    for (int r = 0; r < c->world; r++)
        if (r != c->rank)
            CDDP_TRY(exchange(c, r, (const uint8_t *)a->send + (size_t)r * bytes, bytes, -1, NULL,
                              0, deadline, err));
    memmove(a->recv, (const uint8_t *)a->send + (size_t)c->rank * bytes, bytes);
    return CDDP_OK;
}
