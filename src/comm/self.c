/* self.c: the transport of a group of one rank: nothing to connect, meet or move. Every
 * collective is a copy of this rank's own part (the mean of one value is the value). */
#include "comm/internal.h"

#include <string.h>

static int self_setup(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err) {
    (void)c, (void)st, (void)deadline, (void)err;
    return CDDP_OK;
}

static void self_close(cddp_comm *c) {
    (void)c;
}

static int self_p2p(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    (void)deadline;
    return cddp_error_set(err, CDDP_EINVAL, "rank %d cannot %s itself", c->rank,
                          a->kind == K_SEND ? "send to" : "receive from");
}

int cddp__self_collective(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                          cddp_error *err) {
    (void)c, (void)p, (void)deadline, (void)err;
    size_t bytes = (size_t)a->count * cddp_comm_dtype_size(a->dtype);
    if (a->kind != K_BROADCAST && a->recv != a->send) memmove(a->recv, a->send, bytes);
    return CDDP_OK;
}

const cddp__transport cddp__self_transport = {
    .name = "self",
    .says = "no communication",
    .setup = self_setup,
    .close = self_close,
    .p2p = self_p2p,
};
