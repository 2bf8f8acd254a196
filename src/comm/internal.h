/* comm/internal.h: the group's state, the transport interface, and what comm's files share.
 *
 * The floors of comm, lowest first (a file calls only the floors below it, never a circle):
 *
 *   reduce.c    reduction kernels, and the 16-bit conversions by the collectives' dtype (core's)
 *   flight.c    the flight recorder: the process's last collectives and step marks, its dump
 *   fail.c      the group's latched failure, aborts, the fingerprint check and its messages
 *   cpus.c      the CPUs of the ranks on a host: how many share this rank's
 *   self.c shm.c tcp.c mpi.c
 *               transports: connecting the ranks, the start of a collective (every rank's
 *               fingerprint checked), moving bytes between two ranks, the user's send/recv,
 *               registered memory, and the collectives they do natively
 *   ring.c hier.c
 *               algorithms written once over a transport's moves: the ring (reduce-scatter,
 *               allgather, allreduce) and linear broadcast/gather/scatter; the hierarchical
 *               allreduce across hosts (shared memory on each, a ring between them)
 *   collective.c
 *               one call: its checks, its fingerprint, the algorithm chosen from one table
 *   work.c      the communication thread and the handles of queued calls
 *   bootstrap.c the launcher's environment, read once
 *   group.c     making and ending a group, the public calls
 *
 * A transport is a struct of function pointers (cddp__transport); a new transport is one file
 * with one such struct, and one line in group.c's list.
 */
#ifndef CDDP_COMM_INTERNAL_H
#define CDDP_COMM_INTERNAL_H

#include "cddp/comm.h"
#include "cddp/core.h"
#include "cddp/flight.h"

#include <sched.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

struct cddp_store;

/* What a call is. */
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
    K_CALL,  /* cddp_comm_call_async, local: fn(arg) on the communication thread */
    K_SEND,  /* point to point: root is the peer */
    K_RECV,
    K_COUNT
};

/* What every rank publishes at the start of a collective; compared across ranks. */
typedef struct fingerprint {
    uint64_t seq;
    int32_t kind, op, dtype, root;
    int64_t count;
} fingerprint;

/* One call: what every transport and algorithm executes, inline or on the thread. */
typedef struct coll {
    int kind;
    cddp_comm_op op;
    cddp_comm_dtype dtype;
    int root;
    int64_t count;
    const void *send;
    void *recv;
    double timeout_s; /* < 0: the group's */
    cddp_comm_fn fn;  /* K_CALL's */
    void *arg;
    uint64_t flight; /* its flight record entry, from the queue (0: none yet) */
} coll;

/* Where a collective's buffer lies in memory from cddp_comm_alloc, when every rank's buffer is at
 * the same place of the same allocation (a transport's begin decides, comparing all ranks):
 * then it may be read in place. */
typedef struct cddp__place {
    const void *reg; /* the transport's registration, NULL: not in place */
    size_t offset;   /* bytes from the registration's start */
} cddp__place;

/* A transfer between this rank and a peer: n bytes at buf, done of them moved so far. */
typedef struct cddp__xfer {
    int peer;
    uint8_t *buf;
    size_t n, done;
} cddp__xfer;

typedef struct cddp_comm cddp_comm;

typedef struct cddp__transport {
    const char *name; /* what cddp_comm_backend says, and CDDP_TRANSPORT's spelling */
    const char *says; /* in the line rank 0 logs: "shared memory" */
    bool one_host;    /* only between ranks on one host */
    /* Connects this rank with the others (c->rank, c->world set) through the rendezvous store,
     * which is NULL for a transport that brings its own (mpi). Fills c->priv. */
    int (*setup)(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err);
    /* Leaves: says goodbye where peers would wait, frees c->priv. Accepts a failed setup. */
    void (*close)(cddp_comm *c);
    /* Tells the peers that this rank aborted the group, with the reason (any thread). */
    void (*abort)(cddp_comm *c, const char *reason);
    /* Tells the peers, once, that the group failed here (c->failed holds why); NULL: they learn
     * it from their own waits. */
    void (*failed)(cddp_comm *c);
    /* Starts collective a: publishes mine, waits for every rank and checks every rank's
     * fingerprint against it (so it is also a barrier); *place says whether every rank's buffer
     * is in the same registered memory. NULL: nothing to meet (one rank). */
    int (*begin)(cddp_comm *c, const coll *a, const fingerprint *mine, double deadline,
                 cddp__place *place, cddp_error *err);
    /* Moves bytes between this rank and its peers: returns when every receive completed and,
     * with all, every send too (else sends may be under way: call again to finish them). The
     * algorithms are written on it. Fails (latching the group) at the deadline, on an abort or
     * a peer's death. NULL: no point-to-point (one rank). */
    int (*move)(cddp_comm *c, cddp__xfer *send, int nsend, cddp__xfer *recv, int nrecv, bool all,
                const char *what, double deadline, cddp_error *err);
    /* The user's send or recv (a->kind): the message's count and dtype are checked against the
     * receiver's, and both sides fail on a mismatch. */
    int (*p2p)(cddp_comm *c, const coll *a, double deadline, cddp_error *err);
    /* Memory that collectives read in place (every rank calls it; every rank gets it or every
     * rank fails). NULL: plain memory. */
    int (*alloc)(cddp_comm *c, size_t bytes, double deadline, void **out, cddp_error *err);
    /* Frees p if it came from alloc; false when it did not. */
    bool (*free)(cddp_comm *c, void *p);
    /* After a failure reported by a peer, waits up to wait_s for the failure at its root (a
     * death, an abort) to show and latches it; CDDP_OK when none shows. NULL: nothing more to
     * learn. */
    int (*root_cause)(cddp_comm *c, const char *what, double wait_s, cddp_error *err);
} cddp__transport;

/* Of the n CPU sets of the ranks on one host, how many meet sets[me], sets[me] included: 1 when
 * a launcher bound each rank to CPUs of its own, n when they all may run anywhere; 0 when
 * sets[me] is empty (not known). A set not known (empty) counts as meeting every set. */
int cddp__cpu_sharers(const cpu_set_t *sets, int n, int me);
/* Sets c->own_cpus and c->cpu_sharers from the host's ranks' CPU sets (mine among them). */
void cddp__comm_set_cpus(cddp_comm *c, const cpu_set_t *sets, int n, int me);
/* This process's CPU set as hex digits, a byte at a time (every rank on a host reads them in the
 * same byte order); empty when it cannot be read. out holds 2 * sizeof(cpu_set_t) + 1. */
void cddp__cpus_text(char *out);
/* The CPU set cddp__cpus_text wrote; empty when t is not one. */
void cddp__cpus_parse(const char *t, cpu_set_t *s);

extern const cddp__transport cddp__self_transport, cddp__shm_transport, cddp__tcp_transport,
    cddp__mpi_transport;

struct cddp_comm {
    const cddp__transport *tr;
    void *priv;          /* the transport's state */
    char started_by[32]; /* the launcher (cddp__launch.by): where a dead rank's cause is told */
    int rank, world, local_rank, local_world;
    int nhosts; /* hosts the group's ranks are on */
    /* The CPUs this rank may run on (its affinity; 0: not known), and how many of the ranks on
     * its host may run on some of them, itself included (cddp__cpu_sharers) */
    int own_cpus, cpu_sharers;
    double timeout;
    /* The stall inspector: the call under way and when it started, when this rank last said it
     * was stalled, and CDDP_STALL_WARN_S (0: never). */
    fingerprint call;
    double call_start, stall_said, stall_warn;
    double spin_s;        /* how long a wait spins before it sleeps (CDDP_SPIN_US) */
    cddp_error failed;    /* latched */
    uint64_t seq;         /* collectives started */
    int flight_group;     /* the flight recorder's number for this group, from 1; 0: not recorded */
    uint64_t flight_call; /* the record's entry of the call under way (0: none) */
    _Atomic int64_t blocked_ns; /* cddp_comm_blocked_s */
    /* The rendezvous keys of a group inside the job's store: "" for the job's group,
     * "comm/h<leader>/" for the shared-memory group of one host. */
    char key_prefix[32];
    const char *token; /* the job token, during the rendezvous only: the TCP mesh proves it */
    /* Hierarchical allreduce across hosts: the shared-memory group of this host's ranks (NULL
     * when this rank is alone on its host or the allreduce is flat), and the global ranks of the
     * hosts' leaders (local rank 0), in rank order; leader_index is this rank's place among
     * them, -1 if it is not one. */
    cddp_comm *host;
    int *leaders;
    int nleaders, leader_index, host_leader;
    bool ring_only;    /* CDDP_COMM_ALGORITHM=ring: the generic algorithms, never a native path */
    size_t ring_chunk; /* the ring's pipeline chunk, bytes (CDDP_TCP_CHUNK_KB) */
    uint8_t *scratch;  /* the algorithms' scratch (ring.c), grown as needed */
    size_t scratch_size;
    /* abort, from any thread: the flag is read by waits, the reason under mu */
    _Atomic int aborted;
    _Atomic int aborting; /* cddp__comm_abort calls under way (destroy waits for them) */
    char abort_reason[320];
    /* async work (work.c): one thread runs queued calls in issue order; a blocking call runs
     * on its caller once the queue is empty and the thread idle. All under mu. */
    pthread_mutex_t mu;
    pthread_cond_t queued, finished;
    pthread_t thread;
    bool thread_started, stopping, thread_busy, inline_busy;
    struct cddp_comm_work *head, *tail, *free_list, *all;
};

struct cddp_comm_work {
    coll call;
    cddp_comm *group;
    int status;
    cddp_error err;
    bool done;
    double t_start, t_end;           /* when it ran (cddp_now_s) */
    struct cddp_comm_work *next;     /* in the queue, or in the free list */
    struct cddp_comm_work *all_next; /* every handle the group made, for destroy */
};

/* ---- reduce.c ---------------------------------------------------------------------------- */

/* Elements one block of a reduction holds: small enough for L1. */
#define CDDP_COMM_RBLOCK 2048

bool cddp__comm_is_half(cddp_comm_dtype dt);
/* Reduces elements [lo, lo + n) of the W sources src[0..W-1], in rank order, into each of the
 * ndst destinations (dst[k] points at element lo of destination k). A destination may be the
 * same range of one of the sources: each block is read whole before it is written. acc holds
 * CDDP_COMM_RBLOCK floats, tmp CDDP_COMM_RBLOCK doubles. */
void cddp__comm_reduce_sources(cddp_comm_dtype dt, cddp_comm_op op, uint8_t *const *src, int W,
                               int64_t lo, int64_t n, uint8_t *const *dst, int ndst, float *acc,
                               void *tmp);

/* ---- flight.c ---------------------------------------------------------------------------- */

/* A call's kind in words: "allreduce", "send". */
const char *cddp__comm_kind_name(int kind);

/* A group made by cddp_comm_create joins the recorder (c->flight_group); the first sets up the
 * ring (CDDP_FLIGHT_EVENTS) and SIGUSR1's handler. */
void cddp__flight_join(cddp_comm *c);
/* Call a of group c enters the record, issued now (the thread's label with it); its id, 0 when
 * not recorded (a local call, a group not recorded, the recorder off). It starts (its sequence
 * number known) when it meets the other ranks. */
uint64_t cddp__flight_call(const cddp_comm *c, const coll *a);
void cddp__flight_started(uint64_t id, uint64_t seq);
/* (its end: cddp_flight_ended, cddp/flight.h) */
/* Writes the record, saying why, and logs where it went. */
void cddp__flight_dump_because(const char *why);
/* Waits until every SIGUSR1 taken so far has been answered by a dump (at most timeout_s): the
 * recorder's thread answers a burst of them with one. */
void cddp__flight_settle(double timeout_s);

/* ---- fail.c ------------------------------------------------------------------------------ */

/* A wait's spin before it sleeps: when it began (0: not yet), and whether a yield handed this
 * core to another thread. */
typedef struct cddp__spin {
    double start;
    bool shared;
} cddp__spin;

/* One round of a wait that found nothing ready, at time now: true while it should spin on,
 * false when it should sleep. It spins up to c->spin_s (CDDP_SPIN_US); past the first 20 us
 * every round yields the core to any other runnable thread, and the spin ends the first time
 * one ran meanwhile (the yield took over 20 us): on a busy machine a rank sleeps as soon as
 * something else wants its core. With beside (the awaited peer last waited on this CPU: the
 * scheduler put both ranks on one core), every round yields from the first, and a long yield
 * does not end the spin, for the thread that ran was most likely that peer: the two hand the core
 * to each other at each step instead of each spinning 20 us and then sleeping until woken (2
 * ranks on one core, 4 KiB: 76 us a call before). The shared-memory and TCP waits both spin this
 * way. */
static inline bool cddp__comm_spin(const cddp_comm *c, cddp__spin *s, double now, bool beside) {
    if (s->start == 0) s->start = now;
    if (s->shared || now - s->start >= c->spin_s) return false;
    if (beside || now - s->start > 20e-6) {
        double t0 = cddp_now_s();
        sched_yield();
        s->shared = !beside && cddp_now_s() - t0 > 20e-6;
    }
    return true;
}

/* Latches the failure into the group and err (the first one stays), tells the peers, and aborts
 * this host's group (whose ranks may wait for this one); returns code. */
int cddp__comm_fail(cddp_comm *c, cddp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The group's latched failure into err; its code, CDDP_OK while healthy. */
int cddp__comm_failed(const cddp_comm *c, cddp_error *err);
/* The failures every transport reports in the same words (each latches the group). */
int cddp__comm_aborted_here(cddp_comm *c, cddp_error *err); /* CDDP_OK when not aborted */
int cddp__comm_peer_aborted(cddp_comm *c, cddp_error *err, int who, const char *why);
/* Where the cause of a rank's end is told, in words, for c's launcher: cddprun's report, srun's
 * or mpirun's output, the rank's own output. */
const char *cddp__comm_cause_told(const cddp_comm *c);
int cddp__comm_peer_died(cddp_comm *c, cddp_error *err, int who, int pid, const char *what,
                         uint64_t num);
/* who < 0: a rank the transport cannot name (MPI) */
int cddp__comm_timed_out(cddp_comm *c, cddp_error *err, const char *what, uint64_t num, int who);
/* Rank who destroyed the group after `after` collectives while this rank waits for it in call num:
 * the ranks did not make the same calls (most often: different numbers of steps). */
int cddp__comm_peer_left(cddp_comm *c, cddp_error *err, int who, const char *what, uint64_t num,
                         uint64_t after);
/* The stall inspector, from a transport's wait: once the call has waited CDDP_STALL_WARN_S (and
 * every CDDP_STALL_WARN_S after), logs the call and the n ranks it waits for; arrived: whether
 * they entered the call (and owe their data) or have not. */
void cddp__comm_stalled(cddp_comm *c, const int *ranks, int n, bool arrived);
int cddp__comm_peer_failed(cddp_comm *c, cddp_error *err, int who, const char *why);
/* Aborts the group from any thread: this rank's waits fail with reason, the transport tells
 * the peers, this host's group aborts too. */
void cddp__comm_abort(cddp_comm *c, const char *reason);
/* Compares mine with every rank's fingerprint (fps[r] for rank r, stride bytes apart); a
 * mismatch fails the group with a message naming both sides. */
int cddp__comm_check_fingerprints(cddp_comm *c, const fingerprint *mine, const fingerprint *fps,
                                  size_t stride, cddp_error *err);

/* ---- the transports' native collectives (named in collective.c's table) ------------------ */

int cddp__self_collective(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                          cddp_error *err);
int cddp__shm_allreduce(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err);
int cddp__shm_broadcast(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err);
int cddp__shm_allgather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err);
int cddp__shm_gather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                     cddp_error *err);
int cddp__shm_reduce_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                             cddp_error *err);
int cddp__shm_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                      cddp_error *err);
/* Runs a (an allreduce or a broadcast) on a host's shared-memory group: begin and the
 * collective (hier.c's steps). */
int cddp__shm_run(cddp_comm *c, const coll *a, double deadline, cddp_error *err);
/* TCP's one-hop allreduce (up to CDDP_TCP_SMALL_KB): every rank sends its fingerprint and data
 * to every other at once; no begin. */
bool cddp__tcp_small(const cddp_comm *c, const coll *a);
int cddp__tcp_allreduce_small(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                              cddp_error *err);
bool cddp__mpi_available(void);
int cddp__mpi_collective(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err);

/* ---- ring.c and hier.c ------------------------------------------------------------------- */

/* A ring: n members (global ranks; NULL: ranks 0..n-1), this rank at idx. */
typedef struct cddp__ring {
    const int *members;
    int n, idx;
} cddp__ring;

/* Ring allreduce of buf in place (4- or 8-byte elements) over g; mean divides by the group's
 * size. */
int cddp__ring_allreduce_buf(cddp_comm *c, const cddp__ring *g, uint8_t *buf, int64_t n,
                             cddp_comm_dtype dt, cddp_comm_op op, double deadline, cddp_error *err);
/* The same for a 16-bit type dt16 (ring.c's opening says how): wide holds n float32 values (the
 * input, widened; overwritten), narrow receives the result (n 16-bit values; may be the input's
 * own memory, which is no longer read). */
int cddp__ring_allreduce_half(cddp_comm *c, const cddp__ring *g, float *wide, uint16_t *narrow,
                              int64_t n, cddp_comm_dtype dt16, cddp_comm_op op, double deadline,
                              cddp_error *err);
/* The generic collectives, over the transport's moves. */
int cddp__ring_allreduce(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err);
int cddp__ring_reduce_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                              cddp_error *err);
int cddp__ring_allgather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err);
int cddp__linear_broadcast(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                           cddp_error *err);
int cddp__linear_gather(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                        cddp_error *err);
int cddp__linear_scatter(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err);
int cddp__hier_allreduce(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err);

/* ---- collective.c, work.c ---------------------------------------------------------------- */

/* Checks a call's arguments before it runs or is queued. */
int cddp__comm_check(const cddp_comm *c, const coll *a, cddp_error *err);
/* Runs a call now, on this thread. */
int cddp__comm_execute(cddp_comm *c, const coll *a, cddp_error *err);
/* Runs a call on the caller's thread once queued work is done. */
int cddp__comm_run(cddp_comm *c, const coll *a, cddp_error *err);
/* Queues a call on the communication thread. */
cddp_comm_work *cddp__comm_enqueue(cddp_comm *c, const coll *a, cddp_error *err);
int cddp__comm_work_init(cddp_comm *c);
void cddp__comm_work_fini(cddp_comm *c);

/* ---- bootstrap.c ------------------------------------------------------------------------- */

/* What the launcher that started this process says. */
typedef struct cddp__launch {
    char by[32];     /* "cddprun", "torchrun", "mpirun", "srun", ...; "" when nothing started us */
    char why[96];    /* the variable that says so: "OMPI_COMM_WORLD_SIZE set" */
    int rank, world; /* 0 and 1 when nothing started us */
    int local_rank, local_world; /* -1 when the launcher does not say */
    bool mpi;                    /* an MPI launcher (mpirun, PMI): the MPI backend fits */
    char master_addr[256];       /* MASTER_ADDR; "" unset */
    int master_port;             /* MASTER_PORT; -1 unset */
    bool derived_addr;           /* master_addr derived from srun's variables (the step's */
    bool derived_port;           /* first host), master_port too (job and step): each unset */
    int slurm_job, slurm_step;   /* under srun: SLURM_JOB_ID, SLURM_STEP_ID; else -1 */
    int slurm_nnodes;            /* under srun: the step's node count; else 0 */
    char store_addr[256];        /* cddprun's store: CDDP_STORE_ADDR ("" unset), */
    int store_port;              /* CDDP_STORE_PORT (-1 unset), */
    const char *store_token;     /* CDDP_STORE_TOKEN (NULL unset), */
    int restart;                 /* CDDP_RESTART_COUNT (0 unset) */
    char slurm_token[64];        /* under srun: the job's and step's token; "" otherwise */
    int slurm_tasks_outside;     /* SLURM_NTASKS outside a step (a batch script); 0 otherwise */
    bool pmi2;                   /* a step of srun --mpi=pmi2, taken as srun's (not MPI) */
} cddp__launch;

/* Reads the environment; CDDP_EINVAL (err filled) when a rank variable is malformed. */
int cddp__launch_read(cddp__launch *l, cddp_error *err);

#endif
