/* cddp/dcomm.h: collectives on a device's memory, whichever way they travel.
 *
 * One communicator over a group's ranks (cddp_comm_create), each on its device, and one transport
 * chosen when it is made, by name, for the job's shape:
 *
 *   "auto"  (the default, NULL) NCCL where every rank has a GPU of its own and NCCL opens on every
 *           rank; otherwise host (one rank, the CPU, the emulated device, ranks sharing a GPU, no
 *           NCCL). The ranks choose together, alike, from what each one's device and machine are
 *           (cddp_dcomm_choose); ipc only when named (its speed against host's on a shared GPU is
 *           not measured yet)
 *   "host"  through host copies: each collective's data is copied to the host (page-locked memory
 *           on a GPU) after the device's work queued so far, the group's own transport reduces it
 *           there (shared memory, TCP, MPI: any group, across nodes too) on its communication
 *           thread, and cddp_dcomm_join queues the copies of the results back; the host copies
 *           are kept for the next collectives (up to 16 of them: more between two joins are let
 *           go at the join, which then waits for their copies back); on the CPU the group works
 *           on the memory itself. Every dtype and op of cddp/comm.h
 *   "ipc"   through CUDA IPC: the ranks of one host read each other's device memory, ranks
 *           sharing a GPU included (the emulated device shares alike). Each rank allocates a
 *           scratch block on its device (scratch_bytes) and an event made for sharing, which every
 *           other rank opens; a collective copies into the scratch, the ranks fence (each records
 *           its event, they meet on the host comparing what each is doing, each queue waits for
 *           the others' events) and each rank sums its part from every rank's scratch. Float32
 *           sums and means only; the group on one host (it says so otherwise)
 *   "nccl"  through NCCL, opened at run time ($CDDP_NCCL_LIBRARY, else libnccl.so.2): one rank
 *           per GPU (two ranks on one GPU are refused, naming them), one host or many; what NCCL
 *           takes. Bootstrapped through the group (no MPI needed); formed without blocking, so a
 *           rank that does not join, or a communicator stuck past the timeout, is aborted with an
 *           error naming what did not finish, never a hang
 *
 * A collective is queued and returns: the host does not wait for the device (host: the
 * communication thread waits for the copy to the host; ipc and nccl run on a queue of their own,
 * after the work queued so far on the device's default queue). cddp_dcomm_join makes the device's
 * default queue's later work see the results (host: the host waits there for the group's
 * collectives, not the device, and queues the copies back); cddp_dcomm_wait also makes the host
 * wait for them; cddp_dcomm_watch hands the collectives queued so far to whatever checks them
 * without the host waiting (NCCL's watchdog, which aborts the communicator at NCCL's error or past
 * the timeout, so that a dead peer's kernels end, and latches the failure for the next call).
 * Rank 0 logs the transport once, and why it was chosen, as the group logs its backend.
 * DistributedDataParallel's transport option takes the same names and choice (its host path
 * stages per bucket itself).
 *
 *   cddp_dcomm *d = cddp_dcomm_create(group, dev, &(cddp_dcomm_options){.transport = "ipc"},
 *                                     &err);
 *   cddp_dcomm_allreduce(d, loss_sum, loss_sum, 1, CDDP_COMM_F32, CDDP_COMM_MEAN, &err);
 *   cddp_dcomm_join(d, &err);   // kernels queued from now on see the mean
 *   cddp_dcomm_destroy(d);
 */
#ifndef CDDP_DCOMM_H
#define CDDP_DCOMM_H

#include "cddp/comm.h"
#include "cddp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a transport is, by name. */
typedef struct cddp_dcomm_transport_info {
    const char *name; /* "nccl": as --transport, CDDP_DDP_TRANSPORT and the options spell it */
    const char *says; /* "NCCL": in logs (cddp_dcomm_transport_name) */
    const char *how;  /* how it reduces, for a log line: "by NCCL, on a stream of its own" */
    int index;        /* its place among the transports (0: "auto"), the same in every process */
    bool automatic;   /* "auto": not a transport, the choice of one (cddp_dcomm_choose) */
    bool on_device;   /* works on the device's memory itself, on a queue of its own (ipc, nccl);
                       * else through host copies (host) */
    bool f32_sums;    /* takes float32 sums and means only (ipc) */
} cddp_dcomm_transport_info;

/* The transport a name names (NULL and "auto": the choice); NULL with CDDP_EINVAL in err, which
 * lists the names, for none. */
CDDP_API const cddp_dcomm_transport_info *cddp_dcomm_transport_find(const char *name,
                                                                    cddp_error *err);
/* The transport at index (cddp_dcomm_transport_info.index); NULL past the last. */
CDDP_API const cddp_dcomm_transport_info *cddp_dcomm_transport_at(int index);
/* What "auto" takes for this group and device (host or nccl), and why in `why` (a phrase: "ranks
 * 0 and 1 share a GPU, which NCCL refuses ..."). Collective (one allgather of what each rank's
 * device and machine are); every rank gets the same answer. CDDP_OK, or the group's failure. */
CDDP_API int cddp_dcomm_choose(cddp_comm *group, cddp_device *dev,
                               const cddp_dcomm_transport_info **t, char *why, size_t why_size,
                               cddp_error *err);

typedef struct cddp_dcomm_options {
    const char *transport; /* "auto" (default, NULL), "host", "ipc", "nccl" */
    double timeout_s;      /* forming it, and each collective (default: cddp_comm_timeout) */
    /* ipc: each rank's scratch block on its device (default 64 MiB; every rank passes the same):
     * a collective of up to this many bytes per rank runs in one piece, a larger one in pieces */
    size_t scratch_bytes;
} cddp_dcomm_options;

typedef struct cddp_dcomm cddp_dcomm;

/* Collective. NULL with err (on every rank, naming the rank where it failed where it can): the
 * transport named cannot serve this group or device (ipc: the CPU, a group across hosts, memory
 * the driver will not share; nccl: not a GPU, ranks sharing one, no NCCL, a rank that did not
 * join in time), or an unknown transport. */
CDDP_API cddp_dcomm *cddp_dcomm_create(cddp_comm *group, cddp_device *dev,
                                       const cddp_dcomm_options *opts, cddp_error *err);
/* "host", "CUDA IPC", "NCCL" (cddp_dcomm_transport_info.says). */
CDDP_API const char *cddp_dcomm_transport_name(const cddp_dcomm *d);
/* As cddp/comm.h's (send and recv: memory of the communicator's device), queued. CDDP_OK, or the
 * failure (host: the group's, reported here or at the join; a failure is latched: every later
 * call reports it). allreduce: recv = op over the ranks of send (count elements; send may be
 * recv). reduce_scatter: rank r's recv (count elements) = op over the ranks of elements
 * [r count, (r + 1) count) of send (world x count; in place when recv is send + r count).
 * allgather: recv (world x count) = every rank's send (count elements) in rank order (in place
 * when send is recv + rank count). */
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
