/* hier.c: the hierarchical allreduce, for a group across hosts with several ranks on some.
 *
 * Inside a host, shared memory is an order of magnitude faster than any network; across hosts,
 * only one copy of the message needs to cross. So: reduce on each host over its shared-memory
 * group (c->host), a ring allreduce of the hosts' leaders (local rank 0) over the group's own
 * transport, then a broadcast on each host. For 16-bit types the sums run in float32 and the
 * hosts' sums cross between the leaders as 16-bit values (ring.c's ring_allreduce_half: half
 * the bytes, what the 16-bit gradient hooks are for), each segment rounded once with a mean's
 * division before; otherwise a mean is a sum divided once at the end, as the flat ring does.
 *
 * A failure on a host's group (whose ranks are numbered 0..local_world-1 there) is most often
 * caused by a rank that the group's transport names too (it died or aborted), by its global
 * rank: the transport is given a moment to say so before the host's own error is reported.
 */
#include "comm/internal.h"

#include <stdio.h>
#include <string.h>

static int host_failure(cddp_comm *c, const cddp_error *e, cddp_error *err) {
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    if (c->tr->root_cause) CDDP_TRY(c->tr->root_cause(c, "collective", 1.0, err));
    return cddp__comm_fail(c, err, e->code,
                           "in this host's shared memory, whose ranks are numbered 0..%d there "
                           "(this host's ranks in order): %s",
                           c->local_world - 1, e->msg);
}

static int on_host(cddp_comm *c, int kind, cddp_comm_op op, cddp_comm_dtype dt, void *buf,
                   int64_t n, double deadline, cddp_error *err) {
    coll a = {.kind = kind, .op = op, .dtype = dt, .root = 0, .count = n, .send = buf, .recv = buf};
    cddp_error e = {0};
    if (cddp__shm_run(c->host, &a, CDDP_MAX(deadline, cddp_now_s() + 1e-3), &e) != CDDP_OK)
        return host_failure(c, &e, err);
    return CDDP_OK;
}

int cddp__hier_allreduce(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err) {
    (void)p;
    int64_t n = a->count;
    uint8_t *buf = a->recv;
    float *wide = NULL;
    cddp_comm_dtype dt = a->dtype;
    if (cddp__comm_is_half(dt)) { /* float32 in the sums; 16 bits between the hosts */
        if (!(wide = cddp_aligned_alloc((size_t)n * sizeof(float) + 64)))
            return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
        cddp_comm_to_f32(dt, a->send, wide, n);
        buf = (uint8_t *)wide;
        dt = CDDP_COMM_F32;
    } else if (a->send != a->recv) {
        memcpy(buf, a->send, (size_t)n * cddp_comm_dtype_size(dt));
    }
    cddp_comm_op sum = a->op == CDDP_COMM_MEAN ? CDDP_COMM_SUM : a->op;
    int rc = CDDP_OK;
    if (c->host) rc = on_host(c, K_ALLREDUCE, sum, dt, buf, n, deadline, err);
    if (rc == CDDP_OK && c->leader_index >= 0 && wide) {
        /* the hosts' sums cross as 16-bit values (rounded once each, the mean's division
         * before), then widen again for the host's broadcast */
        cddp__ring g = {c->leaders, c->nleaders, c->leader_index};
        rc = cddp__ring_allreduce_half(c, &g, wide, a->recv, n, a->dtype, a->op, deadline, err);
        if (rc == CDDP_OK) cddp_comm_to_f32(a->dtype, a->recv, wide, n);
    } else if (rc == CDDP_OK && c->leader_index >= 0) {
        cddp__ring g = {c->leaders, c->nleaders, c->leader_index};
        rc = cddp__ring_allreduce_buf(c, &g, buf, n, dt, sum, deadline, err);
        if (rc == CDDP_OK && a->op == CDDP_COMM_MEAN) cddp_comm_divide(dt, buf, n, c->world);
    }
    if (rc == CDDP_OK && c->host) rc = on_host(c, K_BROADCAST, sum, dt, buf, n, deadline, err);
    if (wide && rc == CDDP_OK) cddp_comm_from_f32(a->dtype, wide, a->recv, n);
    cddp_aligned_free(wide);
    return rc;
}
