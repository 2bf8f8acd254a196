/* cddp/ipc.h: collectives on device memory between the ranks of one host, through memory each
 * rank's device shares with the others (CUDA IPC on GPUs; the emulated device shares alike).
 *
 * A communicator over a group's ranks (cddp_comm_create), all on one host, each on its device
 * (the same GPU may serve several). At creation each rank allocates a scratch block on its device
 * and an event made for sharing, and exports both; every rank opens every other's
 * (cddp_device_ipc_open, cddp_event_open_shared), through one allgather of the group. A
 * collective then runs on the communicator's own queue (a CUDA stream), after the work queued so
 * far on the device's default queue, and never makes the host wait for the device:
 *
 *   allreduce       each rank copies its data into its scratch; the ranks fence (below); rank r
 *                   adds up part r of every rank's scratch, in its own (part r: the r-th of world
 *                   nearly equal parts); they fence again; each rank copies every part from its
 *                   owner's scratch into its result
 *   reduce_scatter  copy, fence, rank r adds up its part of every rank's scratch into its result
 *   allgather       copy, fence, each rank copies every rank's piece into its result
 *
 * A fence: each rank records its shared event on the queue, the ranks meet on the host (which only
 * queues) in an allgather of the group that compares what each is doing (ranks that called
 * different collectives fail, naming both), and each rank's queue waits for every other's event:
 * so no rank reads another's scratch before that rank's copy (or sum) into it has run. The scratch
 * is used from its start on, each collective after the last; when the next does not fit, a fence
 * first makes sure every rank has read what it needed, and it starts over (a collective larger
 * than the scratch runs in pieces). A dead or stuck peer shows at the next fence as the group's
 * error (the meeting's deadline, a peer that left), and every later call reports it.
 *
 *   cddp_ipc *c = cddp_ipc_create(group, dev, NULL, &err);
 *   cddp_ipc_allreduce(c, grads, grads, count, CDDP_COMM_F32, CDDP_COMM_MEAN, &err);
 *   cddp_ipc_join(c, &err);   // kernels queued from now on see the sums
 *   cddp_ipc_wait(c, &err);   // and the host: after it, the sums are there
 *   cddp_ipc_destroy(c);
 *
 * Float32 only, sum and mean (the mean: the sum times 1 / world, which for a power of two is the
 * sum divided by world bit for bit, as the host's collectives divide).
 */
#ifndef CDDP_IPC_H
#define CDDP_IPC_H

#include "cddp/comm.h"
#include "cddp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cddp_ipc cddp_ipc;

typedef struct cddp_ipc_options {
    /* each rank's scratch block on its device (default 64 MiB; every rank passes the same): a
     * collective of up to this many bytes per rank runs in one piece */
    size_t scratch_bytes;
    double timeout_s; /* each fence's meeting, and forming it (default: the group's deadline) */
} cddp_ipc_options;

/* Collective. NULL with err (on every rank the same failure, naming the rank it happened on):
 * dev does not share memory with other processes (the CPU), the group spans hosts, the scratch
 * cannot be had, or a rank cannot open another's memory (CUDA IPC refused by the driver). */
CDDP_API cddp_ipc *cddp_ipc_create(cddp_comm *group, cddp_device *dev, const cddp_ipc_options *opts,
                                   cddp_error *err);
/* recv = op over the ranks of send (count floats; send may be recv), queued on the communicator's
 * queue after the work queued so far on the device's. The host waits only for the other ranks'
 * hosts (the fences' meetings). CDDP_OK, or the failure (then every later call reports it). */
CDDP_API int cddp_ipc_allreduce(cddp_ipc *c, const void *send, void *recv, int64_t count,
                                cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
/* Rank r's recv (count floats) = op over the ranks of elements [r count, (r + 1) count) of send
 * (world x count; recv may be send + r count). */
CDDP_API int cddp_ipc_reduce_scatter(cddp_ipc *c, const void *send, void *recv, int64_t count,
                                     cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
/* recv (world x count) = every rank's send (count floats) in rank order (send may be
 * recv + rank count). */
CDDP_API int cddp_ipc_allgather(cddp_ipc *c, const void *send, void *recv, int64_t count,
                                cddp_comm_dtype dtype, cddp_error *err);
/* The device's default queue: what is queued there from now on runs after the collectives
 * queued so far (the host does not wait). */
CDDP_API int cddp_ipc_join(cddp_ipc *c, cddp_error *err);
/* The host waits until the queued collectives have run. */
CDDP_API int cddp_ipc_wait(cddp_ipc *c, cddp_error *err);
/* CDDP_OK, or the communicator's earlier failure (the host does not wait: the fences report a
 * dead peer). */
CDDP_API int cddp_ipc_check(cddp_ipc *c, cddp_error *err);
/* Collective where it can be (every rank done reading the others' scratch before any frees its
 * own); after a failure, each rank's own. Accepts NULL. */
CDDP_API void cddp_ipc_destroy(cddp_ipc *c);

#ifdef __cplusplus
}
#endif
#endif
