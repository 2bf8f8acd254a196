/* comm/internal.h: the group's state and what the backends share.
 *
 * A group runs on one backend: "self" (one rank), "shm" (ranks on one host, shared memory) or
 * "mpi" (MPI collectives, for jobs started by mpirun/srun). Every collective begins the same way
 * whatever the backend: the fingerprint of the call is compared across ranks, so mismatches are
 * reported identically.
 */
#ifndef CDDP_COMM_INTERNAL_H
#define CDDP_COMM_INTERNAL_H

#include "cddp/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#define SEG_MAGIC 0x4344445053484d31ull /* "CDDPSHM1" */
#define CTL_SIZE  512

enum {
    K_ALLREDUCE,
    K_BROADCAST,
    K_ALLGATHER,
    K_BARRIER,
    K_REDUCE_SCATTER,
    K_GATHER,
    K_SCATTER,
    K_ALLOC, /* cddp_comm_alloc: count is the byte size, recv receives the pointer */
    K_FREE,  /* cddp_comm_free, local: recv is the memory */
    K_SEND,  /* point to point: root is the peer */
    K_RECV,
};
enum { BACKEND_SELF, BACKEND_SHM, BACKEND_TCP, BACKEND_MPI };

typedef struct fingerprint {
    uint64_t seq;
    int32_t kind, op, dtype, root;
    int64_t count;
} fingerprint;

/* Where a collective's buffer lies in registered memory: the registration's number (0: not
 * registered) and the byte offset in it. Equal on every rank: the collective reads in place. */
typedef struct reg_at {
    uint64_t id;
    uint64_t offset;
} reg_at;

typedef struct ctl {
    _Atomic uint64_t arrive;
    int32_t pid;
    int32_t reg_made;   /* cddp_comm_alloc: 0, or the errno that kept this rank's block */
    fingerprint fp[2];  /* by sequence parity: a peer is at most one collective ahead */
    reg_at at[2];       /* by sequence parity, like fp */
    int32_t reg_mapped; /* cddp_comm_alloc: 0, or the errno that kept a peer's block */
    int32_t pad;
    char reg_name[48];      /* cddp_comm_alloc: this rank's block, for the peers to map */
    char abort_reason[320]; /* written before the header's abort_rank */
} ctl;

_Static_assert(sizeof(ctl) <= CTL_SIZE, "control block too large");

typedef struct seg_header {
    uint64_t magic;
    int32_t world;
    _Atomic int32_t abort_rank; /* 1 + the first rank that aborted the group, or 0 */
    uint64_t chunk;
    _Atomic uint32_t wake;    /* futex word: bumped by every arrival that has sleepers to wake */
    _Atomic int32_t sleepers; /* ranks blocked on wake */
} seg_header;

/* Point to point from rank s to rank r (one per ordered pair, after the slots): the sender puts
 * each chunk in its own slot and counts it in posted; the receiver copies it out and counts it
 * in taken. The message's count and dtype travel along; a receiver that expected another one
 * says so in refused. */
typedef struct pair {
    _Atomic uint64_t posted, taken;
    int64_t count, want_count;
    int32_t dtype, want_dtype;
    _Atomic int32_t refused;
} pair;

#define PAIR_SIZE 64
_Static_assert(sizeof(pair) <= PAIR_SIZE, "pair too large");

/* Memory from cddp_comm_alloc: on the shm transport every rank's block, mapped by every rank. */
typedef struct reg {
    uint64_t id; /* 1, 2, ...: the group's n-th allocation, the same on every rank; 0: free */
    size_t bytes;
    uint8_t **base; /* base[r]: rank r's block (base[rank] is the caller's) */
} reg;

#define MAX_REGS 16

/* One collective call: what every backend executes, inline or on the communication thread. */
typedef struct coll {
    int kind;
    cddp_comm_op op;
    cddp_comm_dtype dtype;
    int root;
    int64_t count;
    const void *send;
    void *recv;
    double timeout_s; /* < 0: the group's */
} coll;

struct cddp_comm_work {
    coll call;
    cddp_comm *group;
    int status;
    cddp_error err;
    bool done;
    double t_start, t_end;       /* when it ran (cddp_now_s), for DDP's statistics and timeline */
    struct cddp_comm_work *next; /* in the queue, or in the free list */
    struct cddp_comm_work *all_next; /* every handle the group made, for destroy */
};

struct cddp_comm {
    int backend;
    int rank, world, local_rank, local_world;
    int nhosts; /* hosts the group's ranks are on */
    double timeout;
    cddp_error failed; /* latched */
    uint64_t seq, step;
    /* shm */
    uint8_t *seg;
    size_t seg_size, chunk;
    float *acc; /* float32 accumulator for one block of a reduction */
    uint8_t *tmp;
    uint8_t **slots; /* slots[r]: rank r's staging slot */
    uint8_t **src;   /* scratch: the sources of one reduction */
    uint8_t **dst;   /* scratch: its destinations */
    reg regs[MAX_REGS];
    uint64_t nallocs;
    char
        key_prefix[32]; /* of its rendezvous keys: "" for a group, "comm/h<leader>/" for a host's */
    /* tcp (comm/tcp.c) */
    struct cddp__tcp *tcp;
    /* Hierarchical allreduce across hosts (tcp): the shm group of this host's ranks (NULL when
     * this rank is alone on its host), and the global ranks of the hosts' leaders (local rank 0),
     * in rank order; leader_index is this rank's place among them, -1 if it is not one. */
    cddp_comm *host;
    int *leaders;
    int nleaders, leader_index, host_leader;
    /* mpi */
    void *mpi;      /* the group's MPI_Comm, duplicated from MPI_COMM_WORLD */
    bool mpi_owner; /* this group initialised MPI and finalises it */
    /* abort, from any thread: the flag is read by waits, the reason under mu */
    _Atomic int aborted;
    _Atomic int aborting; /* cddp_comm_abort calls under way (destroy waits for them) */
    char abort_reason[320];
    /* async work (work.c): one thread runs queued calls in issue order; a blocking call runs
     * on its caller once the queue is empty and the thread idle. All under mu. */
    pthread_mutex_t mu;
    pthread_cond_t queued, finished;
    pthread_t thread;
    bool thread_started, stopping, thread_busy, inline_busy;
    cddp_comm_work *head, *tail, *free_list, *all;
};

/* What the launcher that started this process says (bootstrap.c). */
typedef struct cddp__launch {
    char by[32];     /* "cddprun", "torchrun", "mpirun", "srun", ...; "" when nothing started us */
    char why[48];    /* the variable that says so: "OMPI_COMM_WORLD_SIZE set" */
    int rank, world; /* 0 and 1 when nothing started us */
    int local_rank, local_world; /* -1 when the launcher does not say */
    bool mpi;                    /* an MPI launcher (mpirun, PMI): the MPI backend fits */
    char master_addr[256];       /* MASTER_ADDR; "" unset */
    int master_port;             /* MASTER_PORT; -1 unset */
    bool derived_master;         /* both derived from srun's variables */
    char store_addr[256];        /* cddprun's store: CDDP_STORE_ADDR ("" unset), */
    int store_port;              /* CDDP_STORE_PORT (-1 unset), */
    const char *store_token;     /* CDDP_STORE_TOKEN (NULL unset), */
    int restart;                 /* CDDP_RESTART_COUNT (0 unset) */
} cddp__launch;

/* Reads the environment; CDDP_EINVAL (err filled) when a rank variable is malformed. */
int cddp__launch_read(cddp__launch *l, cddp_error *err);

/* Checks a call's arguments before it runs or is queued. */
int cddp__comm_check(const cddp_comm *c, const coll *a, cddp_error *err);
/* Runs a call now, on this thread (comm.c). */
int cddp__comm_execute(cddp_comm *c, const coll *a, cddp_error *err);
/* Runs a call on the caller's thread once queued work is done (work.c). */
int cddp__comm_run(cddp_comm *c, const coll *a, cddp_error *err);
/* Queues a call on the communication thread (work.c). */
cddp_comm_work *cddp__comm_enqueue(cddp_comm *c, const coll *a, cddp_error *err);
/* cddp_comm_wait that also reports when the work ran. */
int cddp__comm_wait_timed(cddp_comm_work *w, double timeout_s, cddp_error *err, double *t_start,
                          double *t_end);
/* Initialises and tears down the async state (work.c). */
int cddp__comm_work_init(cddp_comm *c);
void cddp__comm_work_fini(cddp_comm *c);

/* Latches the failure into the group and err; returns code. */
int cddp__comm_fail(cddp_comm *c, cddp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Compares mine with every rank's fingerprint (fps[r] for rank r); a mismatch fails the group
 * with a message naming both sides. */
int cddp__comm_check_fingerprints(cddp_comm *c, const fingerprint *mine, const fingerprint *fps,
                                  size_t stride, cddp_error *err);
float cddp__bf16_to_f32(uint16_t h);
uint16_t cddp__f32_to_bf16(float f);
float cddp__f16_to_f32(uint16_t h);
uint16_t cddp__f32_to_f16(float f);

void cddp__comm_combine(cddp_comm_dtype dt, cddp_comm_op op, void *dst, const void *src, int64_t n);
void cddp__comm_divide(cddp_comm_dtype dt, void *buf, int64_t n, int W);
/* bfloat16/float16 values to float32, and back (rounded to nearest even). */
void cddp__comm_widen(cddp_comm_dtype dt, const void *src, float *dst, int64_t n);
void cddp__comm_narrow(cddp_comm_dtype dt, const float *src, void *dst, int64_t n);

/* The failures every transport reports in the same words (each latches the group). */
int cddp__comm_aborted_here(cddp_comm *c, cddp_error *err); /* CDDP_OK when not aborted */
int cddp__comm_peer_aborted(cddp_comm *c, cddp_error *err, int who, const char *why);
int cddp__comm_peer_died(cddp_comm *c, cddp_error *err, int who, int pid, const char *what,
                         uint64_t num);
int cddp__comm_timed_out(cddp_comm *c, cddp_error *err, const char *what, uint64_t num, int who);

/* The TCP transport (comm/tcp.c): a full mesh between the ranks, ring collectives. */
struct cddp_store;
int cddp__tcp_setup(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err);
void cddp__tcp_close(cddp_comm *c);
/* Tells every peer that this rank aborted the group (reason) or failed (its latched error). */
void cddp__tcp_abort(cddp_comm *c, const char *reason);
void cddp__tcp_failed(cddp_comm *c);
int cddp__tcp_fingerprints(cddp_comm *c, const coll *a, const fingerprint *mine, double deadline,
                           cddp_error *err);
int cddp__tcp_execute(cddp_comm *c, const coll *a, double deadline, cddp_error *err);
int cddp__tcp_p2p(cddp_comm *c, const coll *a, double deadline, cddp_error *err);

/* The MPI backend (comm/mpi.c, built when CMake finds MPI). */
bool cddp__mpi_available(void);
int cddp__mpi_init(cddp_comm *c, cddp_error *err);
void cddp__mpi_finalize(cddp_comm *c);
int cddp__mpi_fingerprints(cddp_comm *c, const fingerprint *mine, cddp_error *err);
int cddp__mpi_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err);
int cddp__mpi_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int root,
                        cddp_error *err);
int cddp__mpi_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_error *err);
int cddp__mpi_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err);
int cddp__mpi_gather(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                     int root, cddp_error *err);
int cddp__mpi_scatter(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                      int root, cddp_error *err);
int cddp__mpi_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                   cddp_error *err);
int cddp__mpi_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                   cddp_error *err);
void cddp__mpi_abort(cddp_comm *c);

#endif
