/* dcomm/internal.h: collectives on a device's memory (cddp/dcomm.h): the transport table, and what
 * its files share.
 *
 * dcomm is a floor of its own, above comm (a group's collectives on host memory) and the devices
 * (tensor: memory, queues and events), on their public APIs only; DistributedDataParallel (ddp)
 * is built on it. Its files, lowest first (a file calls only the ones above it in this list):
 *
 *   placement.c where each rank's device is, and what the transports offer there, gathered
 *               across a group (one allgather)
 *   host.c      the host transport: each collective's data copied to host memory, reduced there
 *               by the group's own transport, and copied back
 *   ipc.c       CUDA IPC: the ranks of one host read each other's device memory
 *   nccl.c      NCCL, opened at run time, on a queue of the device's (cddp_queue_create_first)
 *   dcomm.c     the list of transports, AUTO's choice, the public calls
 *
 * A transport is one file with one cddp__dtransport, and one line in dcomm.c's list: a second
 * collective library for GPUs (RCCL, oneCCL) is a file beside nccl.c. No file here asks which
 * kind of device it runs on: a transport asks the device what it can do (host-accessible memory,
 * memory shared with other processes, the platform whose libraries may queue work on it).
 */
#ifndef CDDP_DCOMM_INTERNAL_H
#define CDDP_DCOMM_INTERNAL_H

#include "cddp/dcomm.h"

/* Transports in the list at most (the placement's room for their offers). */
#define CDDP__DCOMM_MAX 6

/* ---- placement.c ------------------------------------------------------------------------- */

/* Where one rank's device is, and what each transport offers there (int64s: one allgather). */
typedef struct cddp__placement {
    int64_t kind;    /* cddp_device_kind: ranks on devices of different kinds go through host */
    int64_t card;    /* a hash of cddp__placement_where: equal for ranks on one device of a host */
    int64_t host;    /* the host reads the device's memory (the CPU) */
    char device[16]; /* its name ("cuda:0"), for the messages */
    int64_t offer[CDDP__DCOMM_MAX]; /* by the transports' places in the list: what each offers
                                     * here (its offer: NCCL's version, 0 none, -1 not this
                                     * device's platform) */
} cddp__placement;

/* "HOST BUS_ID": where the device is, for the messages that name it. */
void cddp__placement_where(cddp_device *dev, char *out, size_t n);
/* Every rank's placement into all (world of them), this rank's with the transports' offers here
 * (CDDP__DCOMM_MAX of them; NULL: none asked); collective. */
int cddp__placement_gather(cddp_comm *group, cddp_device *dev, const int64_t *offers,
                           cddp__placement *all, cddp_error *err);
/* The first two ranks (a < b) on one device of one host, if any. */
bool cddp__placement_shared(const cddp__placement *all, int world, int *a, int *b);

/* ---- the transports ----------------------------------------------------------------------- */

typedef struct cddp__dtransport {
    cddp_dcomm_transport_info info; /* its name and traits, as the public API shows them */
    bool join_waits; /* the join waits on the host until the collectives are done (host copies):
                      * the flight recorder marks them done there, else at the wait */
    /* What this rank offers AUTO on dev (a number its serves reads: NCCL's version; 0 nothing).
     * NULL: never chosen by AUTO, only when named. */
    int64_t (*offer)(cddp_device *dev);
    /* AUTO, once the ranks' devices are all of one kind, none the host's memory, and more than
     * one rank: whether it serves them (all[r].offer[at] is what rank r offered), and why, in
     * words, into `why` (also when it does not). */
    bool (*serves)(const cddp__placement *all, int world, int at, char *why, size_t n);
    /* Collective: its communicator over the group's ranks, each on its device; NULL with err
     * saying why it cannot serve them (the same on every rank where it can be). */
    void *(*open)(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *o, cddp_error *err);
    /* cddp/dcomm.h's calls, on its communicator. wait: after the join, the host waits for the
     * results. */
    int (*allreduce)(void *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dtype,
                     cddp_comm_op op, cddp_error *err);
    int (*reduce_scatter)(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
    int (*allgather)(void *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dtype,
                     cddp_error *err);
    int (*join)(void *c, cddp_error *err);
    int (*wait)(void *c, cddp_error *err);
    int (*watch)(void *c, cddp_error *err);
    /* How many of the collectives it took, the first ones in order, are known to have run (the
     * watchdog's count; any thread). NULL: none is known before the join (join_waits) or a
     * wait. For the flight recorder. */
    uint64_t (*known_done)(void *c);
    void (*destroy)(void *c);
} cddp__dtransport;

extern const cddp__dtransport cddp__host_dtransport, cddp__ipc_dtransport, cddp__nccl_dtransport;

/* ---- dcomm.c ------------------------------------------------------------------------------ */

/* The transports, in the order AUTO asks them; n into *count. */
const cddp__dtransport *const *cddp__dcomm_list(int *count);
/* cddp_dcomm_create with the transport t (its log line at debug level): for tests, with a table
 * of their own. */
cddp_dcomm *cddp__dcomm_open(const cddp__dtransport *t, cddp_comm *group, cddp_device *dev,
                             const cddp_dcomm_options *o, cddp_error *err);
/* AUTO's rule (cddp/dcomm.h) over what the ranks brought: the transport chosen, why into `why`. */
const cddp__dtransport *cddp__dcomm_decide(const cddp__placement *all, int world, char *why,
                                           size_t n);

#endif
