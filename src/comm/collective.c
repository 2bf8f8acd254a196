/* collective.c: one call, from its checks to its result: the argument checks, the fingerprint
 * every rank compares at the start (the transport's begin), and the algorithm, chosen from one
 * table.
 *
 * The table lists, per kind of collective, the algorithms in order of preference; the first
 * that fits the call runs. Native paths of a transport come first (shared memory's in-place
 * allreduce, TCP's one-hop small allreduce, MPI's own collectives), then the hierarchical
 * allreduce for groups across hosts, then the generic algorithms written over the transport's
 * moves (ring.c), which fit any transport that can move bytes. CDDP_COMM_ALGORITHM=ring skips
 * the native paths, so that every transport's moves run every collective (the tests use it).
 * Every rank chooses alike: the choice depends only on the call's arguments, which the
 * fingerprints prove equal, and on the group.
 */
#include "comm/internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef int (*algorithm_fn)(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                            cddp_error *err);

typedef struct algorithm {
    int kind;                  /* K_*; -1: every collective */
    const char *name;          /* for the debug log */
    const cddp__transport *on; /* the transport it needs; NULL: any that moves bytes */
    bool (*fits)(const cddp_comm *c, const coll *a); /* NULL: always */
    bool without_begin; /* it checks the fingerprints itself (with its data) */
    algorithm_fn run;
} algorithm;

static bool across_hosts(const cddp_comm *c, const coll *a) {
    (void)a;
    return c->nleaders > 0;
}

static const algorithm algorithms[] = {
    {-1, "one rank", &cddp__self_transport, NULL, false, cddp__self_collective},
    {-1, "mpi", &cddp__mpi_transport, NULL, false, cddp__mpi_collective},
    {K_ALLREDUCE, "shm", &cddp__shm_transport, NULL, false, cddp__shm_allreduce},
    {K_BROADCAST, "shm", &cddp__shm_transport, NULL, false, cddp__shm_broadcast},
    {K_ALLGATHER, "shm", &cddp__shm_transport, NULL, false, cddp__shm_allgather},
    {K_GATHER, "shm", &cddp__shm_transport, NULL, false, cddp__shm_gather},
    {K_SCATTER, "shm", &cddp__shm_transport, NULL, false, cddp__shm_scatter},
    {K_REDUCE_SCATTER, "shm", &cddp__shm_transport, NULL, false, cddp__shm_reduce_scatter},
    {K_ALLREDUCE, "tcp one hop", &cddp__tcp_transport, cddp__tcp_small, true,
     cddp__tcp_allreduce_small},
    {K_ALLREDUCE, "hierarchical", NULL, across_hosts, false, cddp__hier_allreduce},
    /* the generic algorithms */
    {K_ALLREDUCE, "ring", NULL, NULL, false, cddp__ring_allreduce},
    {K_REDUCE_SCATTER, "ring", NULL, NULL, false, cddp__ring_reduce_scatter},
    {K_ALLGATHER, "ring", NULL, NULL, false, cddp__ring_allgather},
    {K_BROADCAST, "linear", NULL, NULL, false, cddp__linear_broadcast},
    {K_GATHER, "linear", NULL, NULL, false, cddp__linear_gather},
    {K_SCATTER, "linear", NULL, NULL, false, cddp__linear_scatter},
};

/* The first algorithm of the table that fits a; NULL for a barrier (the begin is all of it)
 * and when none does. */
static const algorithm *choose(const cddp_comm *c, const coll *a) {
    if (a->kind == K_BARRIER) return NULL;
    for (size_t i = 0; i < CDDP_ARRAY_LEN(algorithms); i++) {
        const algorithm *g = &algorithms[i];
        if (g->kind >= 0 && g->kind != a->kind) continue;
        if (g->on ? g->on != c->tr : !c->tr->move) continue;
        if (g->on && c->ring_only && c->tr->move) continue; /* a native path, not wanted */
        if (g->fits && !g->fits(c, a)) continue;
        return g;
    }
    return NULL;
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

static double deadline_of(const cddp_comm *c, const coll *a) {
    return cddp_now_s() + (a->timeout_s >= 0 ? a->timeout_s : c->timeout);
}

/* ---- point to point and memory ----------------------------------------------------------- */

/* The call under way, for the stall inspector. */
static void begin_call(cddp_comm *c, const fingerprint *f) {
    cddp__flight_started(c->flight_call, f->seq);
    c->call = *f;
    c->call_start = cddp_now_s();
    c->stall_said = 0;
}

static int p2p(cddp_comm *c, const coll *a, cddp_error *err) {
    CDDP_TRY(cddp__comm_failed(c, err));
    const char *verb = a->kind == K_SEND ? "send to" : "receive from";
    if (a->root < 0 || a->root >= c->world)
        return cddp_error_set(err, CDDP_EINVAL, "cannot %s rank %d: the group has ranks 0..%d",
                              verb, a->root, c->world - 1);
    CDDP_TRY(cddp__comm_check(c, a, err));
    if (a->root == c->rank)
        return cddp_error_set(err, CDDP_EINVAL, "rank %d cannot %s itself", c->rank, verb);
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    begin_call(c, &(fingerprint){c->seq, a->kind, a->op, (int32_t)a->dtype, a->root, a->count});
    return c->tr->p2p(c, a, deadline_of(c, a), err);
}

static int alloc(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    size_t bytes = (size_t)a->count;
    void **out = a->recv;
    if (c->tr->alloc && bytes > 0) return c->tr->alloc(c, bytes, deadline, out, err);
    if (!(*out = cddp_aligned_alloc(bytes ? bytes : 64)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory (%zu bytes)", bytes);
    return CDDP_OK;
}

static void release(cddp_comm *c, void *p) {
    if (!c->tr->free || !c->tr->free(c, p)) cddp_aligned_free(p);
}

/* ---- running a call ---------------------------------------------------------------------- */

static int execute(cddp_comm *c, const coll *a, cddp_error *err) {
    if (a->kind == K_SEND || a->kind == K_RECV) return p2p(c, a, err);
    CDDP_TRY(cddp__comm_failed(c, err));
    CDDP_TRY(cddp__comm_check(c, a, err));
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    c->seq++;
    double deadline = deadline_of(c, a);
    const algorithm *g = a->kind == K_ALLOC ? NULL : choose(c, a);
    if (!g && a->kind != K_ALLOC && a->kind != K_BARRIER)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "no algorithm for this collective on the %s transport", c->tr->name);
    fingerprint mine = {c->seq, a->kind, a->op, (int32_t)a->dtype, a->root, a->count};
    begin_call(c, &mine);
    cddp__place place = {NULL, 0};
    if (c->tr->begin && !(g && g->without_begin))
        CDDP_TRY(c->tr->begin(c, a, &mine, deadline, &place, err));
    if (a->kind == K_ALLOC) return alloc(c, a, deadline, err);
    if (!g) return CDDP_OK; /* a barrier: everyone met in begin */
    return g->run(c, a, &place, deadline, err);
}

int cddp__comm_execute(cddp_comm *c, const coll *a, cddp_error *err) {
    if (a->kind == K_FREE) {
        release(c, a->recv);
        return CDDP_OK;
    }
    if (a->kind == K_CALL) return a->fn(a->arg, err);
    uint64_t id = a->flight ? a->flight : cddp__flight_call(c, a);
    c->flight_call = id;
    int rc = execute(c, a, err);
    c->flight_call = 0;
    cddp_flight_ended(id, rc);
    return rc;
}
