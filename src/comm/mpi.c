/* mpi.c: the MPI transport: cddp's collectives on MPI's, for jobs started by mpirun or srun.
 *
 * Built when CMake finds MPI (CDDP_HAVE_MPI); otherwise cddp__mpi_available() says no and the
 * transport is never chosen. The group duplicates MPI_COMM_WORLD, so cddp's traffic never mixes
 * with the program's own. MPI is initialised here unless the program already did it, and
 * finalised by the group that initialised it. bfloat16 and float16 are widened to float32 around
 * the MPI call, which keeps cddp's promise of float32 accumulation without custom MPI types.
 * Every collective is MPI's own (collective.c's table), after the same fingerprint check as on
 * every transport; moves (for the generic algorithms under CDDP_COMM_ALGORITHM=ring) are
 * nonblocking sends and receives. Dead peers are MPI's business (mpirun ends the job when a rank
 * dies) and an abort is MPI_Abort; deadlines are cddp's where the ranks meet: the fingerprints
 * travel by a nonblocking allgather and the moves by nonblocking messages, tested until they
 * complete, the call's deadline passes or the group is aborted. A rank that never comes (it left
 * the group, is stopped, stuck, or calls something else) then fails the others' call instead of
 * hanging them; MPI cannot cancel the pending operation, so such a group does not finalise MPI, and
 * the job's end is the program's exit (mpirun then ends the ranks still in MPI).
 */
#include "comm/internal.h"

#ifndef CDDP_HAVE_MPI

bool cddp__mpi_available(void) {
    return false;
}

int cddp__mpi_collective(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err) {
    (void)c, (void)a, (void)p, (void)deadline;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}

static int no_mpi(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err) {
    (void)c, (void)st, (void)deadline;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}

static void nothing(cddp_comm *c) {
    (void)c;
}

const cddp__transport cddp__mpi_transport = {
    .name = "mpi", .says = "mpi", .setup = no_mpi, .close = nothing};

#else

#include <inttypes.h>
#include <mpi.h>
#include <string.h>

#define COMM(c) (((mpi *)(c)->priv)->comm)
/* MPI counts are int: larger messages go in pieces of this many bytes. */
#define PIECE   ((int64_t)1 << 30)

bool cddp__mpi_available(void) {
    return true;
}

static int mpi_error(cddp_comm *c, cddp_error *err, int code, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    return cddp__comm_fail(c, err, CDDP_EIO, "MPI_%s failed: %.*s", what, len, msg);
}

typedef struct mpi {
    MPI_Comm comm;    /* the group's, duplicated from MPI_COMM_WORLD */
    bool owner;       /* this group initialised MPI and finalises it */
    bool abandoned;   /* a wait gave up on pending requests: MPI cannot be finalised */
    MPI_Request *req; /* a move's requests: the sends still in flight first */
    int npending, cap;
} mpi;

static int mpi_setup(cddp_comm *c, struct cddp_store *st, double deadline, cddp_error *err) {
    (void)st, (void)deadline;
    int inited = 0, provided;
    mpi *m = c->priv = cddp_calloc(1, sizeof *m);
    if (!m) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return cddp_error_set(err, CDDP_EIO, "MPI_Init_thread failed");
        m->owner = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(COMM(c), MPI_ERRORS_RETURN);
    MPI_Comm_rank(COMM(c), &c->rank);
    MPI_Comm_size(COMM(c), &c->world);
    MPI_Comm shared;
    MPI_Comm_split_type(COMM(c), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
    MPI_Comm_rank(shared, &c->local_rank);
    MPI_Comm_size(shared, &c->local_world);
    /* the CPU sets of this host's ranks (mpirun binds each rank to a core or a socket) */
    cpu_set_t mine, *sets = cddp_calloc((size_t)c->local_world, sizeof *sets);
    if (!sets) {
        MPI_Comm_free(&shared);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    if (MPI_Allgather(&mine, sizeof mine, MPI_BYTE, sets, sizeof mine, MPI_BYTE, shared) ==
        MPI_SUCCESS)
        cddp__comm_set_cpus(c, sets, c->local_world, c->local_rank);
    cddp_free(sets);
    MPI_Comm_free(&shared);
    int leader = c->local_rank == 0; /* one per host */
    MPI_Allreduce(&leader, &c->nhosts, 1, MPI_INT, MPI_SUM, COMM(c));
    return CDDP_OK;
}

static void mpi_close(cddp_comm *c) {
    mpi *m = c->priv;
    if (!m) return;
    if (m->abandoned) { /* freeing or finalising under a pending operation may never return */
        cddp_free(m->req);
        cddp_free(m);
        c->priv = NULL;
        return;
    }
    if (m->comm) MPI_Comm_free(&m->comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (m->owner && !finalized) MPI_Finalize();
    cddp_free(m->req);
    cddp_free(m);
    c->priv = NULL;
}

/* MPI_Waitall with cddp's deadline (< 0: none) and abort: MPI_Testall in a loop, which polls as
 * MPI_Waitall itself does (Open MPI's waits spin on its progress engine; a sleep between tests
 * would add its wake-up to every collective: 4 floats took 290 us instead of 5), looking at the
 * deadline and the abort flag every 10 ms. On either the requests are abandoned (MPI cannot cancel
 * them: the group then never finalises MPI) and the group fails. MPI does not say which rank is
 * late. */
static int mpi_wait(cddp_comm *c, MPI_Request *req, int n, double deadline, const char *what,
                    cddp_error *err) {
    double next_look = cddp_now_s() + 0.01;
    for (unsigned k = 1;; k++) {
        int done = 0, rc = MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(c, err, rc, what);
        if (done) return CDDP_OK;
        if (k % 64) continue;
        double now = cddp_now_s();
        if (now < next_look) continue;
        next_look = now + 0.01;
        int st = cddp__comm_aborted_here(c, err);
        if (!st && deadline >= 0 && now > deadline)
            st = cddp__comm_timed_out(c, err, what, c->seq, -1);
        if (st) {
            ((mpi *)c->priv)->abandoned = true;
            return st;
        }
    }
}

static int mpi_begin(cddp_comm *c, const coll *a, const fingerprint *mine, double deadline,
                     cddp__place *place, cddp_error *err) {
    (void)a;
    *place = (cddp__place){NULL, 0};
    fingerprint *all = cddp_malloc(sizeof *all * (size_t)c->world);
    if (!all) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    MPI_Request req;
    int rc = MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE,
                            COMM(c), &req);
    int st = rc == MPI_SUCCESS ? mpi_wait(c, &req, 1, deadline, "collective", err)
                               : mpi_error(c, err, rc, "Iallgather");
    if (!st) st = cddp__comm_check_fingerprints(c, mine, all, sizeof *all, err);
    if (!((mpi *)c->priv)->abandoned) cddp_free(all); /* MPI may still write an abandoned one */
    return st;
}

static MPI_Datatype mpi_type(cddp_comm_dtype dt) {
    switch (dt) {
    case CDDP_COMM_F64:
        return MPI_DOUBLE;
    case CDDP_COMM_I32:
        return MPI_INT32_T;
    case CDDP_COMM_I64:
        return MPI_INT64_T;
    default:
        return MPI_FLOAT; /* float32, and the 16-bit types widened to it */
    }
}

static MPI_Op mpi_op(cddp_comm_op op) {
    switch (op) {
    case CDDP_COMM_MIN:
        return MPI_MIN;
    case CDDP_COMM_MAX:
        return MPI_MAX;
    case CDDP_COMM_PRODUCT:
        return MPI_PROD;
    default:
        return MPI_SUM; /* sum, and mean before the division */
    }
}

static int mpi_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err) {
    bool narrow = dt == CDDP_COMM_BF16 || dt == CDDP_COMM_F16;
    size_t es = narrow ? 4 : cddp_comm_dtype_size(dt);
    float *wide = NULL;
    void *buf = recv;
    if (narrow) { /* widen to float32, reduce, narrow back once */
        wide = cddp_malloc(sizeof(float) * (size_t)(count ? count : 1));
        if (!wide) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
        cddp_comm_to_f32(dt, send, wide, count);
        buf = wide;
    } else if (send != recv) {
        memcpy(recv, send, (size_t)count * es);
    }
    int64_t per = PIECE / (int64_t)es;
    for (int64_t off = 0; off < count; off += per) {
        int n = (int)(count - off < per ? count - off : per);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)off * es, n, mpi_type(dt),
                               mpi_op(op), COMM(c));
        if (rc != MPI_SUCCESS) {
            cddp_free(wide);
            return mpi_error(c, err, rc, "Allreduce");
        }
    }
    if (op == CDDP_COMM_MEAN) cddp_comm_divide(narrow ? CDDP_COMM_F32 : dt, buf, count, c->world);
    if (narrow) {
        cddp_comm_from_f32(dt, wide, recv, count);
        cddp_free(wide);
    }
    return CDDP_OK;
}

static int mpi_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int root,
                         cddp_error *err) {
    int64_t bytes = count * (int64_t)cddp_comm_dtype_size(dt);
    for (int64_t off = 0; off < bytes; off += PIECE) {
        int n = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        int rc = MPI_Bcast((char *)buf + off, n, MPI_BYTE, root, COMM(c));
        if (rc != MPI_SUCCESS) return mpi_error(c, err, rc, "Bcast");
    }
    return CDDP_OK;
}

static int mpi_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dt, cddp_error *err) {
    int64_t bytes = count * (int64_t)cddp_comm_dtype_size(dt);
    if (bytes > PIECE) /* one rank's part must fit an int count */
        return cddp__comm_fail(c, err, CDDP_EUNSUPPORTED,
                               "allgather of more than 1 GiB per rank "
                               "on the MPI backend");
    /* In place (send is this rank's part of recv, as the sharded optimizer gathers): MPI wants
     * that said, not two aliased buffers. */
    const void *from =
        send == (const char *)recv + (size_t)c->rank * (size_t)bytes ? MPI_IN_PLACE : send;
    int rc = MPI_Allgather(from, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Allgather");
}

/* The reduction over the whole send buffer, then this rank's part: simple rather than
 * bandwidth-optimal (MPI_Reduce_scatter_block has no mean and no 16-bit float types). */
static int mpi_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(dt), part = (size_t)count * es;
    uint8_t *all = cddp_malloc(part * (size_t)c->world + 1);
    if (!all) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    int rc = mpi_allreduce(c, send, all, count * c->world, dt, op, err);
    if (rc == CDDP_OK) memmove(recv, all + part * (size_t)c->rank, part);
    cddp_free(all);
    return rc;
}

static int part_bytes(cddp_comm *c, int64_t count, cddp_comm_dtype dt, const char *what,
                      cddp_error *err) {
    int64_t bytes = count * (int64_t)cddp_comm_dtype_size(dt);
    if (bytes > PIECE)
        return cddp__comm_fail(c, err, CDDP_EUNSUPPORTED,
                               "%s of more than 1 GiB per rank on the MPI backend", what);
    return CDDP_OK;
}

static int mpi_gather(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                      int root, cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "gather", err));
    int bytes = (int)(count * (int64_t)cddp_comm_dtype_size(dt));
    int rc = MPI_Gather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, root, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Gather");
}

static int mpi_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                       cddp_comm_dtype dt, int root, cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "scatter", err));
    int bytes = (int)(count * (int64_t)cddp_comm_dtype_size(dt));
    int rc = MPI_Scatter(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, root, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Scatter");
}

static int mpi_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                    cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "send", err));
    int n = (int)(count * (int64_t)cddp_comm_dtype_size(dt));
    int rc = MPI_Send(buf, n, MPI_BYTE, peer, 7, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Send");
}

static int mpi_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                    cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "recv", err));
    int n = (int)(count * (int64_t)cddp_comm_dtype_size(dt)), got;
    MPI_Status st;
    int rc = MPI_Probe(peer, 7, COMM(c), &st);
    if (rc != MPI_SUCCESS) return mpi_error(c, err, rc, "Probe");
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != n)
        return cddp__comm_fail(c, err, CDDP_ESHAPE,
                               "recv from rank %d of %d bytes (count %" PRId64 " %s), but rank %d "
                               "sent %d bytes",
                               peer, n, count, cddp_comm_dtype_name(dt), peer, got);
    rc = MPI_Recv(buf, n, MPI_BYTE, peer, 7, COMM(c), MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Recv");
}

/* A running MPI call cannot be interrupted: the job ends. */
static void mpi_abort(cddp_comm *c, const char *reason) {
    cddp_log(CDDP_LOG_ERROR, "comm", "aborting the MPI job: %s", reason);
    MPI_Abort(COMM(c), 1);
}

/* The user's messages: one message of count elements as bytes (the receiver probes its size
 * first and fails naming both sides when it differs; the sender learns of it only through the
 * job ending, as MPI gives no way back). */
static int mpi_p2p(cddp_comm *c, const coll *a, double deadline, cddp_error *err) {
    (void)deadline;
    return a->kind == K_SEND ? mpi_send(c, a->send, a->count, a->dtype, a->root, err)
                             : mpi_recv(c, a->recv, a->count, a->dtype, a->root, err);
}

/* Moves as nonblocking sends and receives, cut into messages of the ring's chunk counted from
 * each transfer's start, so that a segment sent whole is received chunk by chunk (the ring's
 * pipeline) and the other way round. Without all, the sends stay in flight (their requests are
 * kept) and only the receives are waited for; a later call with all waits for them too, each
 * wait until the call's deadline (mpi_wait). */
static int mpi_move(cddp_comm *c, cddp__xfer *send, int nsend, cddp__xfer *recv, int nrecv,
                    bool all, const char *what, double deadline, cddp_error *err) {
    mpi *m = c->priv;
    size_t piece = CDDP_MIN(c->ring_chunk, (size_t)PIECE);
    int n = m->npending;
    for (int i = 0; i < nsend; i++) n += (int)((send[i].n - send[i].done + piece - 1) / piece);
    for (int i = 0; i < nrecv; i++) n += (int)((recv[i].n - recv[i].done + piece - 1) / piece);
    if (n > m->cap) {
        MPI_Request *r = cddp_realloc(m->req, sizeof *r * (size_t)n);
        if (!r) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
        m->req = r;
        m->cap = n;
    }
    int k = m->npending, rc = MPI_SUCCESS; /* sends first (kept in flight), then receives */
    for (int i = 0; i < nsend && rc == MPI_SUCCESS; i++) {
        for (size_t off = send[i].done; off < send[i].n && rc == MPI_SUCCESS; off += piece)
            rc = MPI_Isend(send[i].buf + off, (int)CDDP_MIN(piece, send[i].n - off), MPI_BYTE,
                           send[i].peer, 8, COMM(c), &m->req[k++]);
        send[i].done = send[i].n;
    }
    m->npending = k;
    for (int i = 0; i < nrecv && rc == MPI_SUCCESS; i++) {
        for (size_t off = recv[i].done; off < recv[i].n && rc == MPI_SUCCESS; off += piece)
            rc = MPI_Irecv(recv[i].buf + off, (int)CDDP_MIN(piece, recv[i].n - off), MPI_BYTE,
                           recv[i].peer, 8, COMM(c), &m->req[k++]);
        recv[i].done = recv[i].n;
    }
    if (rc != MPI_SUCCESS) return mpi_error(c, err, rc, what);
    CDDP_TRY(mpi_wait(c, m->req + m->npending, k - m->npending, deadline, what, err));
    if (all) {
        CDDP_TRY(mpi_wait(c, m->req, m->npending, deadline, what, err));
        m->npending = 0;
    }
    return CDDP_OK;
}

int cddp__mpi_collective(cddp_comm *c, const coll *a, const cddp__place *p, double deadline,
                         cddp_error *err) {
    (void)p, (void)deadline;
    switch (a->kind) {
    case K_ALLREDUCE:
        return mpi_allreduce(c, a->send, a->recv, a->count, a->dtype, a->op, err);
    case K_BROADCAST:
        return mpi_broadcast(c, a->recv, a->count, a->dtype, a->root, err);
    case K_ALLGATHER:
        return mpi_allgather(c, a->send, a->recv, a->count, a->dtype, err);
    case K_REDUCE_SCATTER:
        return mpi_reduce_scatter(c, a->send, a->recv, a->count, a->dtype, a->op, err);
    case K_GATHER:
        return mpi_gather(c, a->send, a->recv, a->count, a->dtype, a->root, err);
    default:
        return mpi_scatter(c, a->send, a->recv, a->count, a->dtype, a->root, err);
    }
}

const cddp__transport cddp__mpi_transport = {
    .name = "mpi",
    .says = "mpi",
    .setup = mpi_setup,
    .close = mpi_close,
    .abort = mpi_abort,
    .begin = mpi_begin,
    .move = mpi_move,
    .p2p = mpi_p2p,
};

#endif
