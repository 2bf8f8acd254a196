/* cddp/dcomm.h: collectives on a device's memory, whichever way they travel.
 *
 * One communicator over a group's ranks (cddp_comm_create), each on its device, and one transport
 * chosen when it is made, for the job's shape:
 *
 *   CDDP_DCOMM_AUTO  (the default) NCCL where every rank has a GPU of its own and NCCL opens on
 *                    every rank; otherwise HOST (one rank, the CPU, the emulated device, ranks
 *                    sharing a GPU, no NCCL). The ranks choose together, alike, from what each
 *                    one's device and machine are (cddp_dcomm_choose); IPC only when named (its
 *                    speed against HOST's on a shared GPU is not measured yet)
 *   CDDP_DCOMM_HOST  through host copies: each collective's data is copied to the
 *                    host (page-locked memory on a GPU) after the device's work queued so far, the
 *                    group's own transport reduces it there (shared memory, TCP, MPI: any group,
 *                    across nodes too) on its communication thread, and cddp_dcomm_join queues the
 *                    copies of the results back; the host copies are kept for the next
 *                    collectives (up to 16 of them: more between two joins are let go at the join,
 *                    which then waits for their copies back); on the CPU the group works on the
 *                    memory itself
 *   CDDP_DCOMM_IPC   through CUDA IPC (cddp/ipc.h): the ranks of one host read each other's device
 *                    memory, ranks sharing a GPU included (the emulated device shares alike)
 *   CDDP_DCOMM_NCCL  through NCCL (cddp/nccl.h): one rank per GPU, one host or many
 *
 * A collective is queued and returns: the host does not wait for the device (HOST: the
 * communication thread waits for the copy to the host; IPC and NCCL run on a stream of their
 * own). cddp_dcomm_join makes the device's default queue's later work see the results (HOST: the
 * host waits there for the group's collectives, not the device, and queues the copies back);
 * cddp_dcomm_wait also makes the host wait for them. Rank 0 logs the transport once, and why
 * it was chosen, as the group logs its backend. DistributedDataParallel's transport option takes
 * the same names and choice (its host path stages per bucket itself).
 *
 *   cddp_dcomm *d = cddp_dcomm_create(group, dev, &(cddp_dcomm_options){.transport =
 *                                     CDDP_DCOMM_IPC}, &err);
 *   cddp_dcomm_allreduce(d, loss_sum, loss_sum, 1, CDDP_COMM_F32, CDDP_COMM_MEAN, &err);
 *   cddp_dcomm_join(d, &err);   // kernels queued from now on see the mean
 *   cddp_dcomm_destroy(d);
 *
 * HOST takes every dtype and op of cddp/comm.h; IPC float32 sums and means; NCCL what NCCL takes.
 */
#ifndef CDDP_DCOMM_H
#define CDDP_DCOMM_H

#include "cddp/comm.h"
#include "cddp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cddp_dcomm_transport {
    CDDP_DCOMM_AUTO = 0,
    CDDP_DCOMM_HOST = 1,
    CDDP_DCOMM_IPC = 2,
    CDDP_DCOMM_NCCL = 3,
} cddp_dcomm_transport;

/* "auto", "host", "ipc", "nccl" (the spelling of --transport and CDDP_DDP_TRANSPORT). */
CDDP_API const char *cddp_dcomm_transport_spelling(cddp_dcomm_transport t);
/* The transport a spelling names: CDDP_OK, or CDDP_EINVAL (err lists the four). */
CDDP_API int cddp_dcomm_transport_parse(const char *name, cddp_dcomm_transport *t, cddp_error *err);
/* What CDDP_DCOMM_AUTO takes for this group and device: HOST or NCCL, and why in `why` (a
 * phrase: "ranks 0 and 1 share a GPU, which NCCL refuses ..."). Collective (one allgather of what
 * each rank's device and machine are); every rank gets the same answer. CDDP_OK, or the group's
 * failure. */
CDDP_API int cddp_dcomm_choose(cddp_comm *group, cddp_device *dev, cddp_dcomm_transport *t,
                               char *why, size_t why_size, cddp_error *err);

typedef struct cddp_dcomm_options {
    cddp_dcomm_transport transport; /* default (0): AUTO */
    double timeout_s;               /* each collective (default: cddp_comm_timeout) */
    size_t scratch_bytes; /* IPC: each rank's scratch (cddp_ipc_options; default 64 MiB) */
} cddp_dcomm_options;

typedef struct cddp_dcomm cddp_dcomm;

/* Collective. NULL with err: the transport named cannot serve this group or device (cddp/ipc.h
 * and cddp/nccl.h say when), or an unknown transport. */
CDDP_API cddp_dcomm *cddp_dcomm_create(cddp_comm *group, cddp_device *dev,
                                       const cddp_dcomm_options *opts, cddp_error *err);
/* "host", "CUDA IPC", "NCCL". */
CDDP_API const char *cddp_dcomm_transport_name(const cddp_dcomm *d);
/* As cddp/comm.h's (send and recv: memory of the communicator's device), queued. CDDP_OK, or the
 * failure (HOST: the group's, reported here or at the join). */
CDDP_API int cddp_dcomm_allreduce(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                                  cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
CDDP_API int cddp_dcomm_reduce_scatter(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                                       cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
CDDP_API int cddp_dcomm_allgather(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                                  cddp_comm_dtype dtype, cddp_error *err);
/* The device's default queue: what is queued there from now on sees the results. */
CDDP_API int cddp_dcomm_join(cddp_dcomm *d, cddp_error *err);
/* The join, and the host waits until the results are there. */
CDDP_API int cddp_dcomm_wait(cddp_dcomm *d, cddp_error *err);
/* The collectives queued so far go to whatever checks them without the host waiting (NCCL's
 * watchdog); CDDP_OK, or an earlier failure. */
CDDP_API int cddp_dcomm_watch(cddp_dcomm *d, cddp_error *err);
/* Joins what is still queued, then ends. Accepts NULL. */
CDDP_API void cddp_dcomm_destroy(cddp_dcomm *d);

#ifdef __cplusplus
}
#endif
#endif
