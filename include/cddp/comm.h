/* cddp/comm.h: process groups and collective communication on raw buffers.
 *
 * A group is made from the environment a launcher leaves (cddprun or torchrun: RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; or mpirun / srun's variables) or from
 * explicit options. Rank 0 hosts a rendezvous store at MASTER_ADDR:MASTER_PORT (as
 * torch.distributed's env:// does); the ranks meet there, find out which of them share a host,
 * and connect. comm knows nothing of tensors: it moves counts of a dtype.
 *
 * Backends. Under mpirun or srun (when cddp is built with MPI), or with CDDP_BACKEND=mpi, the
 * collectives are MPI's, with the same fingerprint checks (deadlines and dead peers are then
 * MPI's business: mpirun ends the job when a rank dies). Otherwise:
 *
 * Transports. Ranks on one host use a shared-memory segment; it is created by rank 0, mapped by
 * everyone, and unlinked as soon as every rank has mapped it, so no name is left in /dev/shm
 * whatever happens to the processes afterwards. A group that spans hosts uses TCP between every
 * pair of ranks (a data and a control connection each), with a hierarchical allreduce: shared
 * memory within each host, a ring between the hosts' leaders. CDDP_TRANSPORT=tcp|shm forces one
 * (tcp: every pair over TCP, even on one host). cddp_comm_backend says "shm" or "tcp".
 *
 * Async work. Every collective also has an _async form that queues it on the group's
 * communication thread (started on first use) and returns a handle at once; queued work runs in
 * issue order, and a blocking call first waits for the queue to drain, so the order in which a
 * rank issues collectives is the order in which they run. Wait on each handle exactly once
 * (cddp_comm_wait frees it); cddp_comm_test says whether it finished. A waiting thread sleeps
 * on a condition variable: it does not take the CPU from the ranks that are computing.
 *
 * Safety. Every collective has a deadline (CDDP_TIMEOUT_S, or the per-call timeout). While it
 * waits, a rank checks that its peers are alive (their pids on shared memory, their control
 * connections over TCP): a dead peer fails the collective within a second with an error naming
 * the rank. Each collective carries a fingerprint (sequence number, kind, op,
 * dtype, count, root) that every rank checks against every other, so ranks that call different
 * collectives or pass different arguments fail with a message naming both sides instead of
 * hanging or computing garbage. A failure latches: every later call on the group fails at once
 * with the first error.
 */
#ifndef CDDP_COMM_H
#define CDDP_COMM_H

#include "cddp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cddp_comm_dtype {
    CDDP_COMM_F32,
    CDDP_COMM_F64,
    CDDP_COMM_I32,
    CDDP_COMM_I64,
    CDDP_COMM_BF16, /* reduced in float32, rounded to nearest even */
    CDDP_COMM_F16,  /* reduced in float32, rounded to nearest even */
} cddp_comm_dtype;

typedef enum cddp_comm_op {
    CDDP_COMM_SUM,
    CDDP_COMM_MEAN, /* the sum divided by the world size (integers: truncated) */
    CDDP_COMM_MIN,
    CDDP_COMM_MAX,
    CDDP_COMM_PRODUCT,
} cddp_comm_op;

CDDP_API size_t cddp_comm_dtype_size(cddp_comm_dtype dtype);
CDDP_API const char *cddp_comm_dtype_name(cddp_comm_dtype dtype);
CDDP_API const char *cddp_comm_op_name(cddp_comm_op op);

/* Zero-initialised options mean "from the environment". */
typedef struct cddp_comm_options {
    int rank, world_size;    /* world_size 0: from the environment */
    const char *master_addr; /* NULL: MASTER_ADDR, else 127.0.0.1 */
    int master_port;         /* 0: MASTER_PORT */
    const char *token;       /* NULL: CDDP_STORE_TOKEN, else "cddp" */
    double timeout_s;        /* default deadline of every call; 0: CDDP_TIMEOUT_S */
} cddp_comm_options;

typedef struct cddp_comm cddp_comm;

/* Makes the group: rendezvous, host discovery, transport setup. Blocks until every rank arrived
 * or CDDP_RDZV_TIMEOUT_S passed. NULL with err filled on failure. */
CDDP_API cddp_comm *cddp_comm_create(const cddp_comm_options *opts, cddp_error *err);
/* Leaves the group and frees it; accepts NULL. Not a collective: no rank waits for another. */
CDDP_API void cddp_comm_destroy(cddp_comm *c);

CDDP_API int cddp_comm_rank(const cddp_comm *c);
CDDP_API int cddp_comm_size(const cddp_comm *c);
/* The group's default deadline of a call, in seconds (cddp_comm_options.timeout_s, else
 * CDDP_TIMEOUT_S): what the device collectives built on the group (NCCL, CUDA IPC) wait too. */
CDDP_API double cddp_comm_timeout(const cddp_comm *c);
CDDP_API int cddp_comm_local_rank(const cddp_comm *c);
CDDP_API int cddp_comm_local_size(const cddp_comm *c);
/* The cores this rank may count as its own: the CPUs it may run on (cddp_num_cores) divided
 * among the ranks on its host that may run on some of them too. A launcher that binds each rank
 * to CPUs of its own (cddprun --bind_core, srun --cpus-per-task with its binding) gives each
 * rank all of its CPUs; unbound ranks share the host's. 0 when the host's ranks outnumber its
 * cores. */
CDDP_API int cddp_comm_local_cores(const cddp_comm *c);
/* The transport: "self" (one rank), "shm", "tcp" or "mpi". */
CDDP_API const char *cddp_comm_backend(const cddp_comm *c);
/* Seconds the program's threads have spent blocked in this group so far: in its blocking
 * collectives and in cddp_comm_wait (not the communication thread's own time). What DDP's
 * straggler attribution takes out of the phases of a step. */
CDDP_API double cddp_comm_blocked_s(const cddp_comm *c);
/* The group's first error, or NULL while it is healthy. */
CDDP_API const char *cddp_comm_error(const cddp_comm *c);

/* Collectives. timeout_s < 0 takes the group's default. send and recv may be the same buffer
 * (in place). count may be 0. On failure the group is failed from then on. */
CDDP_API int cddp_comm_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                                 cddp_comm_dtype dtype, cddp_comm_op op, double timeout_s,
                                 cddp_error *err);
/* root's count elements of buf reach every rank's buf. */
CDDP_API int cddp_comm_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dtype,
                                 int root, double timeout_s, cddp_error *err);
/* Each rank's count elements, in rank order, into recv (world_size * count). */
CDDP_API int cddp_comm_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                                 cddp_comm_dtype dtype, double timeout_s, cddp_error *err);
/* Reduces world_size * count elements of every rank's send, then rank r receives elements
 * [r * count, (r + 1) * count) of the result in recv (count elements). recv may not overlap send
 * except at send + rank * count (in place). */
CDDP_API int cddp_comm_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                                      cddp_comm_dtype dtype, cddp_comm_op op, double timeout_s,
                                      cddp_error *err);
/* Each rank's count elements, in rank order, into root's recv (world_size * count); recv is
 * ignored on the other ranks (may be NULL). */
CDDP_API int cddp_comm_gather(cddp_comm *c, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dtype, int root, double timeout_s, cddp_error *err);
/* root's send (world_size * count elements) in rank-sized parts: part r into rank r's recv
 * (count elements); send is ignored on the other ranks (may be NULL). */
CDDP_API int cddp_comm_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                               cddp_comm_dtype dtype, int root, double timeout_s, cddp_error *err);
CDDP_API int cddp_comm_barrier(cddp_comm *c, double timeout_s, cddp_error *err);

/* Point to point. send gives count elements of buf to rank dst, which takes them with a recv
 * from this rank of the same count and dtype; messages between two ranks arrive in the order
 * they were sent. send returns once dst has the data (so two ranks that both send first wait
 * for each other: pair them, e.g. even ranks send first) or at the deadline. A count or dtype
 * that differs from the receiver's fails on both ranks, naming both sides (on the MPI backend
 * only the receiver learns of it). Sending to or receiving from oneself is CDDP_EINVAL. */
CDDP_API int cddp_comm_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dtype,
                            int dst, double timeout_s, cddp_error *err);
CDDP_API int cddp_comm_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dtype, int src,
                            double timeout_s, cddp_error *err);

/* ---- the reduction kernels ----------------------------------------------------------------
 * What every transport computes, for code that combines buffers itself (DDP's compression
 * hooks, a custom reducer): the same bits as a collective gives for the same inputs. */

/* dst[i] = dst[i] op src[i] for n elements of a 4- or 8-byte dtype (sum and mean add). */
CDDP_API void cddp_comm_combine(cddp_comm_dtype dtype, cddp_comm_op op, void *dst, const void *src,
                                int64_t n);
/* buf[i] /= world for n elements of a 4- or 8-byte dtype (integers truncate): the mean's end. */
CDDP_API void cddp_comm_divide(cddp_comm_dtype dtype, void *buf, int64_t n, int world);
/* n bfloat16 or float16 values to float32, and float32 values to them (rounded to nearest
 * even; a NaN stays a NaN). */
CDDP_API void cddp_comm_to_f32(cddp_comm_dtype dtype, const void *src, float *dst, int64_t n);
CDDP_API void cddp_comm_from_f32(cddp_comm_dtype dtype, const float *src, void *dst, int64_t n);

/* ---- memory the transport reads in place ------------------------------------------------ */

/* Collective: every rank calls it with the same bytes. Returns memory (64-byte aligned) that
 * collectives read in place: an in-place allreduce whose buffer lies in it, at the same offset
 * on every rank, copies nothing in or out on the shared-memory transport (each rank reduces its
 * slice straight from its peers' blocks). On other backends, or with CDDP_SHM_ZERO_COPY=0, it
 * is plain memory. Every other use works as with any memory. NULL with err set when a rank
 * cannot get the memory (then on every rank, and the group stays usable: fall back to
 * malloc). */
CDDP_API void *cddp_comm_alloc(cddp_comm *c, size_t bytes, cddp_error *err);
/* Frees memory from cddp_comm_alloc; accepts NULL. Not a collective, but every collective on the
 * memory must have finished (waited on) first. Call before cddp_comm_destroy. */
CDDP_API void cddp_comm_free(cddp_comm *c, void *p);

/* ---- async work ------------------------------------------------------------------------- */

typedef struct cddp_comm_work cddp_comm_work;

/* Queue the collective; NULL with err set when it cannot be queued (bad arguments, the group
 * already failed). The buffers must stay valid and untouched until the work is waited on. The
 * deadline (timeout_s, or the group's) counts from when the work starts running. */
CDDP_API cddp_comm_work *cddp_comm_allreduce_async(cddp_comm *c, const void *send, void *recv,
                                                   int64_t count, cddp_comm_dtype dtype,
                                                   cddp_comm_op op, double timeout_s,
                                                   cddp_error *err);
CDDP_API cddp_comm_work *cddp_comm_broadcast_async(cddp_comm *c, void *buf, int64_t count,
                                                   cddp_comm_dtype dtype, int root,
                                                   double timeout_s, cddp_error *err);
CDDP_API cddp_comm_work *cddp_comm_allgather_async(cddp_comm *c, const void *send, void *recv,
                                                   int64_t count, cddp_comm_dtype dtype,
                                                   double timeout_s, cddp_error *err);
CDDP_API cddp_comm_work *cddp_comm_reduce_scatter_async(cddp_comm *c, const void *send, void *recv,
                                                        int64_t count, cddp_comm_dtype dtype,
                                                        cddp_comm_op op, double timeout_s,
                                                        cddp_error *err);
CDDP_API cddp_comm_work *cddp_comm_barrier_async(cddp_comm *c, double timeout_s, cddp_error *err);
/* Queues fn(arg) on the group's communication thread, in issue order with its collectives (not a
 * collective: this rank's alone): how a caller makes a queued collective wait for something of its
 * own first (a device's copy of the data it reads, cddp/device.h's events) without waiting itself,
 * or runs collectives of its own there (DDP's comm_hook): fn may call the group's blocking
 * collectives, which run at once on that thread, in fn's turn; waiting in fn for work queued
 * after it fails (CDDP_ESTATE) instead of never ending. cddp_comm_wait returns fn's status (err
 * filled by fn on failure). */
typedef int (*cddp_comm_fn)(void *arg, cddp_error *err);
CDDP_API cddp_comm_work *cddp_comm_call_async(cddp_comm *c, cddp_comm_fn fn, void *arg,
                                              cddp_error *err);

/* Waits until w finished, returns its status (err filled on failure) and frees w. timeout_s < 0
 * waits as long as the work's own deadline allows; a timeout_s that passes first aborts the group
 * (the work can no longer be trusted to finish) and returns CDDP_ETIMEDOUT. */
CDDP_API int cddp_comm_wait(cddp_comm_work *w, double timeout_s, cddp_error *err);
/* cddp_comm_wait that also says when the work ran: *started and *ended (either may be NULL)
 * receive cddp_now_s() at its start and end on the communication thread, for profiles and
 * timelines. */
CDDP_API int cddp_comm_wait_timed(cddp_comm_work *w, double timeout_s, double *started,
                                  double *ended, cddp_error *err);
/* true once w finished (successfully or not); w stays valid until waited on. */
CDDP_API bool cddp_comm_test(cddp_comm_work *w);

/* Fails the group from any thread: the collective running now, queued work and every later
 * call fail with reason, here and on every peer of the shared-memory transport (which fail with
 * "rank R aborted the group: reason"). On the MPI backend a running MPI call cannot be
 * interrupted, so abort calls MPI_Abort, which ends the job. */
CDDP_API void cddp_comm_abort(cddp_comm *c, const char *reason);

#ifdef __cplusplus
}
#endif
#endif
