/* cddp/nccl.h: collectives on device memory through NCCL, NVIDIA's collective library.
 *
 * A communicator over a group's ranks (cddp_comm_create), each rank on its device. It is
 * bootstrapped through the group: rank 0 makes NCCL's unique id and broadcasts it, so no MPI is
 * needed. NCCL is opened at run time: the library named by the options, else $CDDP_NCCL_LIBRARY,
 * else libnccl.so.2. A build without NCCL's header, or a machine without the library, gets an
 * error that says so.
 *
 * The communicator forms without blocking (NCCL's nonblocking mode). A rank that does not join,
 * or a communicator stuck past the timeout, is aborted with an error naming what did not finish:
 * never a hang. Collectives run on the communicator's own queue (a CUDA stream of the highest
 * priority), each after the work already queued on the device's default queue
 * (cddp_device_native_queue, where contexts' kernels run), so that the kernels queued after it
 * run beside it: DDP's buckets are reduced while the rest of backward computes. cddp_nccl_join
 * makes the default queue's later work wait for the collectives (the host does not wait);
 * cddp_nccl_wait makes the host wait for them and reports NCCL's asynchronous errors (a peer's
 * failure); cddp_nccl_watch leaves that to the communicator's watchdog thread, which aborts the
 * communicator at NCCL's error or past the timeout (a dead peer's kernels then end) and latches
 * the failure for the next call, while the host goes on (DDP's steps: the GPU is never left idle
 * waiting for the host to queue the next work).
 *
 *   cddp_nccl *n = cddp_nccl_create(group, dev, NULL, &err);
 *   cddp_nccl_allreduce(n, grads, grads, count, CDDP_COMM_F32, CDDP_COMM_MEAN, &err);
 *   cddp_nccl_join(n, &err);   // kernels queued from now on see the sums
 *   cddp_nccl_wait(n, &err);   // and the host: after it, the sums are there, or err says why
 *   cddp_nccl_watch(n, &err);  // or: the watchdog checks them; a failure shows at a later call
 *   cddp_nccl_destroy(n);
 */
#ifndef CDDP_NCCL_H
#define CDDP_NCCL_H

#include "cddp/comm.h"
#include "cddp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cddp_nccl cddp_nccl;

typedef struct cddp_nccl_options {
    const char *library; /* the NCCL library to open (default: $CDDP_NCCL_LIBRARY, libnccl.so.2) */
    double timeout_s;    /* forming the communicator, and each wait (default: the group's) */
} cddp_nccl_options;

/* NULL with err saying why: dev is not a CUDA device (or the CPU, for a stand-in library in
 * tests), no NCCL in this build or on this machine, rank 0 could not make the id, or the
 * communicator did not form within the timeout (then every rank's attempt aborts). */
CDDP_API cddp_nccl *cddp_nccl_create(cddp_comm *group, cddp_device *dev,
                                     const cddp_nccl_options *opts, cddp_error *err);
/* recv = op over the ranks of send (count elements; send may be recv), queued on the
 * communicator's queue after the work queued so far on the device's. CDDP_OK, or NCCL's
 * refusal. The same goes for the two below. */
CDDP_API int cddp_nccl_allreduce(cddp_nccl *n, const void *send, void *recv, int64_t count,
                                 cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
/* Rank r's recv (count elements) = op over the ranks of elements [r count, (r + 1) count) of
 * send (world x count; in place when recv is send + r count). */
CDDP_API int cddp_nccl_reduce_scatter(cddp_nccl *n, const void *send, void *recv, int64_t count,
                                      cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
/* recv (world x count) = every rank's send (count elements) in rank order (in place when send is
 * recv + rank count). */
CDDP_API int cddp_nccl_allgather(cddp_nccl *n, const void *send, void *recv, int64_t count,
                                 cddp_comm_dtype dtype, cddp_error *err);
/* The device's default queue: what is queued there from now on runs after the collectives
 * queued so far (the host does not wait). CDDP_OK, or the communicator's earlier failure. */
CDDP_API int cddp_nccl_join(cddp_nccl *n, cddp_error *err);
/* Waits until the queued collectives have run: CDDP_OK, or NCCL's asynchronous error (the
 * communicator is then aborted and every later call fails). */
CDDP_API int cddp_nccl_wait(cddp_nccl *n, cddp_error *err);
/* Hands the collectives queued so far to the watchdog and returns at once: CDDP_OK, or the
 * communicator's earlier failure. Where they run when called (no stream: a stand-in on the CPU),
 * as cddp_nccl_wait. */
CDDP_API int cddp_nccl_watch(cddp_nccl *n, cddp_error *err);
/* NCCL's version, as 22809 for 2.28.9 (0 when it cannot be opened). */
CDDP_API int cddp_nccl_version(const cddp_nccl_options *opts);
CDDP_API void cddp_nccl_destroy(cddp_nccl *n); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
