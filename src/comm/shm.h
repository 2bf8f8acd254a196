/* comm/shm.h: the shared-memory transport's segment and what its files share.
 *
 * The transport is five files: shm.c (setup, teardown, notices), shm_wait.c (how a rank waits
 * for another), shm_coll.c (the start of a collective and the collectives), shm_msg.c (moves and
 * the user's messages) and shm_mem.c (memory that collectives read in place). The design is in
 * shm.c's opening comment.
 */
#ifndef CDDP_COMM_SHM_H
#define CDDP_COMM_SHM_H

#include "comm/internal.h"

#define SEG_MAGIC 0x4344445053484d31ull /* "CDDPSHM1" */
#define CTL_SIZE  512
#define PAIR_SIZE 64
#define MAX_REGS  16

/* Where a collective's buffer lies in registered memory: the registration's number (0: not
 * registered) and the byte offset in it. */
typedef struct reg_at {
    uint64_t id;
    uint64_t offset;
} reg_at;

typedef struct ctl {
    _Atomic uint64_t arrive;
    int32_t pid;
    int32_t reg_made;       /* cddp_comm_alloc: 0, or the errno that kept this rank's block */
    fingerprint fp[2];      /* by sequence parity: a peer is at most one collective ahead */
    reg_at at[2];           /* by sequence parity, like fp */
    int32_t reg_mapped;     /* cddp_comm_alloc: 0, or the errno that kept a peer's block */
    _Atomic int32_t failed; /* the group failed on this rank: abort_reason says why */
    _Atomic int32_t cpu;    /* 1 + the CPU this rank last waited on (0: not known) */
    _Atomic int32_t left;   /* 1 once this rank destroyed the group (healthy), after */
    uint64_t left_after;    /* this many collectives */
    int32_t reg_fd;         /* cddp_comm_alloc: this rank's block's descriptor, for the peers */
    uint64_t reg_ino;       /* and its inode, which they check */
    char abort_reason[320]; /* written before the header's abort_rank, or before failed */
} ctl;

_Static_assert(sizeof(ctl) <= CTL_SIZE, "control block too large");

typedef struct seg_header {
    uint64_t magic;
    int32_t world;
    _Atomic int32_t abort_rank; /* 1 + the first rank that aborted the group, or 0 */
    uint64_t chunk;
    _Atomic uint32_t wake;    /* futex word: bumped by every arrival that has sleepers to wake */
    _Atomic int32_t sleepers; /* ranks blocked on wake */
    /* An in-place allreduce's pieces, by the parity of the group's in-place allreduces (a rank
     * is at most one ahead): the next piece to take, and the pieces reduced. */
    _Atomic uint64_t piece_next[2], piece_done[2];
} seg_header;

/* Messages from rank s to rank r: the sender puts each chunk in its send slot and counts it in
 * posted; the receiver copies it out and counts it in taken. A user message carries its count
 * and dtype (dtype >= 0), and a receiver that expected another one says so in refused; a move's
 * chunk carries its byte count (dtype -1). */
typedef struct pair {
    _Atomic uint64_t posted, taken;
    int64_t count, want_count;
    int32_t dtype, want_dtype;
    _Atomic int32_t refused;
} pair;

_Static_assert(sizeof(pair) <= PAIR_SIZE, "pair too large");

/* Memory from cddp_comm_alloc: every rank's block, mapped by every rank. */
typedef struct reg {
    uint64_t id; /* 1, 2, ...: the group's n-th allocation, the same on every rank; 0: free */
    size_t bytes;
    uint8_t **base; /* base[r]: rank r's block (base[rank] is the caller's) */
} reg;

typedef struct shm {
    uint8_t *seg;
    int seg_fd; /* rank 0: the segment's descriptor, until every rank has mapped it; else -1 */
    size_t seg_size, chunk;
    uint64_t step;     /* barriers passed */
    uint64_t in_place; /* in-place allreduces begun */
    float *acc;        /* float32 accumulator for one block of a reduction */
    uint8_t *tmp;
    uint8_t **slots; /* slots[r]: rank r's staging slot */
    uint8_t **src;   /* scratch: the sources of one reduction */
    uint8_t **dst;   /* scratch: its destinations */
    int slot_peer;   /* the peer this rank's send slot last held a chunk for, -1: none */
    size_t *taking;  /* per peer: bytes of its posted chunk already copied out (moves) */
    reg regs[MAX_REGS];
    uint64_t nallocs;
} shm;

static inline shm *priv(const cddp_comm *c) {
    return c->priv;
}

static inline ctl *ctl_of(const cddp_comm *c, int r) {
    return (ctl *)(priv(c)->seg + 4096 + (size_t)r * CTL_SIZE);
}

static inline uint8_t *slot_of(const cddp_comm *c, int r) {
    return priv(c)->seg + 4096 + (size_t)c->world * CTL_SIZE + (size_t)r * priv(c)->chunk;
}

/* Rank r's slot for the messages it sends: apart from the collectives' slots, which a peer may
 * still read after this rank has left a collective. */
static inline uint8_t *send_slot_of(const cddp_comm *c, int r) {
    return slot_of(c, c->world + r);
}

static inline pair *pair_of(const cddp_comm *c, int from, int to) {
    return (pair *)(slot_of(c, 2 * c->world) + ((size_t)from * c->world + to) * PAIR_SIZE);
}

static inline seg_header *header(const cddp_comm *c) {
    return (seg_header *)priv(c)->seg;
}

/* ---- shm_wait.c ----------------------------------------------------------------------- */

void cddp__shm_relax(void);
/* Latches an abort of this group, local (on this rank) or by a peer. */
int cddp__shm_check_abort(cddp_comm *c, cddp_error *err);
/* Wakes every rank blocked in a wait (after an arrival or an abort), if any is. */
void cddp__shm_wake(cddp_comm *c);
/* A wait in progress: when it began sleeping, when it next checks the peer and the deadline. */
typedef struct waiting {
    cddp__spin spin;
    double next_check;
} waiting;
/* One round of a wait that found nothing ready (see shm_wait.c). */
int cddp__shm_idle(cddp_comm *c, waiting *w, bool (*ready)(const void *), const void *arg, int who,
                   bool notices, const char *what, uint64_t num, double deadline, cddp_error *err);
/* Waits until *a (written by rank who, or by any peer when who is -1) reaches at least target, or
 * the group fails; the errors name the wait "what #num". */
int cddp__shm_wait_for(cddp_comm *c, _Atomic uint64_t *a, uint64_t target, int who,
                       const char *what, uint64_t num, double deadline, cddp_error *err);
/* Every rank arrives at the next step, or the group fails (deadline, dead peer). */
int cddp__shm_sync_all(cddp_comm *c, double deadline, cddp_error *err);

/* ---- the transport's entries (shm_coll.c, shm_msg.c, shm_mem.c) --------------------------- */

int cddp__shm_begin(cddp_comm *c, const coll *a, const fingerprint *mine, double deadline,
                    cddp__place *place, cddp_error *err);
int cddp__shm_move(cddp_comm *c, cddp__xfer *send, int nsend, cddp__xfer *recv, int nrecv, bool all,
                   const char *what, double deadline, cddp_error *err);
int cddp__shm_p2p(cddp_comm *c, const coll *a, double deadline, cddp_error *err);
int cddp__shm_alloc(cddp_comm *c, size_t bytes, double deadline, void **out, cddp_error *err);
bool cddp__shm_free(cddp_comm *c, void *p);
/* An unnamed shared-memory file of bytes, its pages reserved, and its inode; -1 with errno. */
int cddp__shm_create(size_t bytes, uint64_t *ino);
/* Maps a shared-memory file; MAP_FAILED with errno. */
void *cddp__shm_map_fd(int fd, size_t bytes);
/* Maps the shared-memory file that process pid holds as descriptor fd (its inode ino, bytes
 * long), through /proc; MAP_FAILED with errno (ESTALE: the descriptor is another file now). */
void *cddp__shm_map_peer(int pid, int fd, uint64_t ino, size_t bytes);
/* What to add to strerror(e) when cddp__shm_map_peer failed with e. */
const char *cddp__shm_map_hint(int e);
/* The registration that holds [p, p + bytes) on this rank, with p's offset in it; NULL if none. */
const reg *cddp__shm_find_reg(const cddp_comm *c, const void *p, size_t bytes, size_t *offset);
void cddp__shm_unmap_reg(cddp_comm *c, reg *g);

#endif
