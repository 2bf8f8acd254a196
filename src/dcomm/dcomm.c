/* dcomm.c: the list of transports for device memory (cddp/dcomm.h), the choice AUTO makes (which
 * DistributedDataParallel makes too), and the public calls, each through the chosen transport's
 * table. A transport is one line in the list. */
#include "dcomm/internal.h"

#include "cddp/flight.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The transports, in the order AUTO asks them; the last one serves every job. */
static const cddp__dtransport *const list[] = {
    &cddp__nccl_dtransport,
    &cddp__ipc_dtransport,
    &cddp__host_dtransport,
};
enum { N = CDDP_ARRAY_LEN(list) };
_Static_assert(N <= CDDP__DCOMM_MAX, "a placement has room for every transport's offer");

const cddp__dtransport *const *cddp__dcomm_list(int *count) {
    *count = N;
    return list;
}

/* ---- names ------------------------------------------------------------------------------------
 */

/* "auto", then the list's, with their places. */
static cddp_dcomm_transport_info infos[N + 1];
static pthread_once_t infos_once = PTHREAD_ONCE_INIT;

static void fill_infos(void) {
    infos[0] = (cddp_dcomm_transport_info){.name = "auto", .says = "auto", .automatic = true};
    for (int i = 0; i < N; i++) {
        infos[i + 1] = list[i]->info;
        infos[i + 1].index = i + 1;
    }
}

const cddp_dcomm_transport_info *cddp_dcomm_transport_at(int index) {
    pthread_once(&infos_once, fill_infos);
    return index >= 0 && index <= N ? &infos[index] : NULL;
}

const cddp_dcomm_transport_info *cddp_dcomm_transport_find(const char *name, cddp_error *err) {
    pthread_once(&infos_once, fill_infos);
    if (!name || !*name) return &infos[0];
    for (int i = 0; i <= N; i++)
        if (strcmp(name, infos[i].name) == 0) return &infos[i];
    char names[160] = ""; /* "auto, nccl, ipc or host" */
    for (int i = 0; i <= N; i++) {
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s",
                 i == 0   ? ""
                 : i == N ? " or "
                          : ", ",
                 infos[i].name);
    }
    cddp_error_set(err, CDDP_EINVAL, "'%s' is not a transport: expected %s", name, names);
    return NULL;
}

/* ---- the choice ------------------------------------------------------------------------------ */

const cddp__dtransport *cddp__dcomm_decide(const cddp__placement *all, int world, char *why,
                                           size_t n) {
    const cddp__dtransport *host = list[N - 1];
    if (world == 1) {
        snprintf(why, n, "one rank: nothing travels");
        return host;
    }
    for (int r = 1; r < world; r++)
        if (all[r].kind != all[0].kind) {
            snprintf(why, n, "the ranks' devices are of different kinds (rank 0 %s, rank %d %s)",
                     all[0].device, r, all[r].device);
            return host;
        }
    if (all[0].host) {
        snprintf(why, n, "%s: the group's transport works on the memory itself", all[0].device);
        return host;
    }
    bool said = false;
    for (int i = 0; i < N - 1; i++) {
        if (!list[i]->serves) continue;
        char mine[200];
        if (list[i]->serves(all, world, i, mine, sizeof mine)) {
            snprintf(why, n, "%s", mine);
            return list[i];
        }
        if (!said) snprintf(why, n, "%s", mine); /* the first refusal says why */
        said = true;
    }
    return host;
}

int cddp_dcomm_choose(cddp_comm *group, cddp_device *dev, const cddp_dcomm_transport_info **t,
                      char *why, size_t why_size, cddp_error *err) {
    int world = cddp_comm_size(group);
    cddp__placement *all = cddp_calloc((size_t)world, sizeof *all);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int64_t offers[CDDP__DCOMM_MAX] = {0};
    for (int i = 0; i < N; i++) offers[i] = list[i]->offer ? list[i]->offer(dev) : 0;
    int rc = cddp__placement_gather(group, dev, offers, all, err);
    if (rc == CDDP_OK) {
        const cddp__dtransport *c = cddp__dcomm_decide(all, world, why, why_size);
        for (int i = 0; i < N; i++)
            if (list[i] == c) *t = cddp_dcomm_transport_at(i + 1);
    }
    cddp_free(all);
    return rc;
}

/* ---- the communicator ------------------------------------------------------------------------ */

/* Collectives the flight recorder shows in flight, at most: an older one stays "started". */
enum { PENDING = 256 };

struct cddp_dcomm {
    const cddp__dtransport *t;
    void *c;    /* the transport's communicator */
    int flight; /* the flight recorder's group for its collectives (0: not recorded) */
    /* their entries not yet known done, oldest first; first: the place of pending[head] among
     * the collectives the transport took (from 0) */
    uint64_t pending[PENDING];
    int head, npending;
    uint64_t first;
};

/* The oldest pending entry, ended with rc. */
static void end_oldest(cddp_dcomm *d, int rc) {
    cddp_flight_ended(d->pending[d->head], rc);
    d->head = (d->head + 1) % PENDING;
    d->npending--;
    d->first++;
}

/* The flight recorder: those the transport knows done (its watchdog), then rc for all that
 * remain when rc is a failure (or `all`: the join or wait that waited for them). */
static int settled(cddp_dcomm *d, int rc, bool all) {
    uint64_t known = d->t->known_done ? d->t->known_done(d->c) : 0;
    while (d->npending > 0 && d->first < known) end_oldest(d, CDDP_OK);
    while (d->npending > 0 && (all || rc != CDDP_OK)) end_oldest(d, rc);
    return rc;
}

/* A collective issued (rc: how the call went): pending while it is not known done. */
static int issued(cddp_dcomm *d, uint64_t entry, int rc) {
    if (entry && rc != CDDP_OK) cddp_flight_ended(entry, rc);
    if (!entry || rc != CDDP_OK) return rc;
    if (d->npending == PENDING) { /* the oldest stays "started" */
        d->head = (d->head + 1) % PENDING;
        d->npending--;
        d->first++;
    }
    d->pending[(d->head + d->npending++) % PENDING] = entry;
    return settled(d, rc, false);
}

cddp_dcomm *cddp__dcomm_open(const cddp__dtransport *t, cddp_comm *group, cddp_device *dev,
                             const cddp_dcomm_options *o, cddp_error *err) {
    cddp_dcomm *d = cddp_calloc(1, sizeof *d);
    if (!d) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    d->t = t;
    if (!(d->c = t->open(group, dev, o, err))) {
        cddp_free(d);
        return NULL;
    }
    d->flight = cddp_flight_group_open(cddp_device_name(dev), t->info.says);
    return d;
}

cddp_dcomm *cddp_dcomm_create(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *opts,
                              cddp_error *err) {
    cddp_dcomm_options o = opts ? *opts : (cddp_dcomm_options){0};
    const cddp_dcomm_transport_info *info = cddp_dcomm_transport_find(o.transport, err),
                                    *named = info;
    if (!info) return NULL;
    char why[200];
    snprintf(why, sizeof why, "transport %s, as named", info->name);
    if (info->automatic && cddp_dcomm_choose(group, dev, &info, why, sizeof why, err) != CDDP_OK)
        return NULL;
    cddp_dcomm *d = cddp__dcomm_open(list[info->index - 1], group, dev, &o, err);
    if (!d) return NULL;
    /* said once, on rank 0, where the choice was the library's; a caller that named the transport
     * (DistributedDataParallel, which logs its own line) knows it */
    cddp_log(cddp_comm_rank(group) == 0 && info != named ? CDDP_LOG_INFO : CDDP_LOG_DEBUG, "dcomm",
             "collectives on %s's memory: %s (%s%s)", cddp_device_name(dev),
             cddp_device_host_accessible(dev) && !info->on_device
                 ? "by the group's transport, on the memory itself"
                 : info->how,
             info == named ? "" : "auto: ", why);
    return d;
}

const char *cddp_dcomm_transport_name(const cddp_dcomm *d) {
    return d->t->info.says;
}

int cddp_dcomm_allreduce(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    uint64_t e = cddp_flight_issued(d->flight, "allreduce", op, dtype, count);
    return issued(d, e, d->t->allreduce(d->c, send, recv, count, dtype, op, err));
}

int cddp_dcomm_reduce_scatter(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    uint64_t e = cddp_flight_issued(d->flight, "reduce_scatter", op, dtype, count);
    return issued(d, e, d->t->reduce_scatter(d->c, send, recv, count, dtype, op, err));
}

int cddp_dcomm_allgather(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_error *err) {
    uint64_t e = cddp_flight_issued(d->flight, "allgather", CDDP_COMM_SUM, dtype, count);
    return issued(d, e, d->t->allgather(d->c, send, recv, count, dtype, err));
}

int cddp_dcomm_join(cddp_dcomm *d, cddp_error *err) {
    return settled(d, d->t->join(d->c, err), d->t->join_waits);
}

int cddp_dcomm_wait(cddp_dcomm *d, cddp_error *err) {
    int rc = d->t->join(d->c, err);
    return settled(d, rc == CDDP_OK ? d->t->wait(d->c, err) : rc, true);
}

int cddp_dcomm_watch(cddp_dcomm *d, cddp_error *err) {
    return settled(d, d->t->watch(d->c, err), false);
}

void cddp_dcomm_destroy(cddp_dcomm *d) {
    if (!d) return;
    d->t->destroy(d->c); /* joins what is still queued: left started if it could not */
    cddp_free(d);
}
