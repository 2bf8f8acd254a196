/* mpi.c: the MPI backend: cddp's collective API on MPI's collectives.
 *
 * Built when CMake finds MPI (CDDP_HAVE_MPI); otherwise cddp__mpi_available() says no and the
 * rest is never called. The group duplicates MPI_COMM_WORLD, so cddp's traffic never mixes with
 * the program's own. MPI is initialised here unless the program already did it, and finalised by
 * the group that initialised it. bfloat16 and float16 are widened to float32 around the MPI
 * call, which keeps cddp's promise of float32 accumulation without custom MPI types.
 */
#include "comm/internal.h"
#include "core/internal.h"

#ifndef CDDP_HAVE_MPI

bool cddp__mpi_available(void) {
    return false;
}
int cddp__mpi_init(cddp_comm *c, cddp_error *err) {
    (void)c;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
void cddp__mpi_finalize(cddp_comm *c) {
    (void)c;
}
int cddp__mpi_fingerprints(cddp_comm *c, const fingerprint *mine, cddp_error *err) {
    (void)c, (void)mine;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dt, (void)op;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int root,
                        cddp_error *err) {
    (void)c, (void)buf, (void)count, (void)dt, (void)root;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dt;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}

int cddp__mpi_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dt, (void)op;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_gather(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                     int root, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dt, (void)root;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_scatter(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                      int root, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dt, (void)root;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                   cddp_error *err) {
    (void)c, (void)buf, (void)count, (void)dt, (void)peer;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
int cddp__mpi_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                   cddp_error *err) {
    (void)c, (void)buf, (void)count, (void)dt, (void)peer;
    return cddp_error_set(err, CDDP_EUNSUPPORTED, "cddp was built without MPI");
}
void cddp__mpi_abort(cddp_comm *c) {
    (void)c;
}

#else

#include <inttypes.h>
#include <mpi.h>
#include <string.h>

#define COMM(c) (*(MPI_Comm *)(c)->mpi)
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

int cddp__mpi_init(cddp_comm *c, cddp_error *err) {
    int inited = 0, provided;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return cddp_error_set(err, CDDP_EIO, "MPI_Init_thread failed");
        c->mpi_owner = true;
    }
    c->mpi = cddp_malloc(sizeof(MPI_Comm));
    if (!c->mpi) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    MPI_Comm_dup(MPI_COMM_WORLD, (MPI_Comm *)c->mpi);
    MPI_Comm_set_errhandler(COMM(c), MPI_ERRORS_RETURN);
    MPI_Comm_rank(COMM(c), &c->rank);
    MPI_Comm_size(COMM(c), &c->world);
    MPI_Comm shared;
    MPI_Comm_split_type(COMM(c), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
    MPI_Comm_rank(shared, &c->local_rank);
    MPI_Comm_size(shared, &c->local_world);
    MPI_Comm_free(&shared);
    int leader = c->local_rank == 0; /* one per host */
    MPI_Allreduce(&leader, &c->nhosts, 1, MPI_INT, MPI_SUM, COMM(c));
    return CDDP_OK;
}

void cddp__mpi_finalize(cddp_comm *c) {
    if (!c->mpi) return;
    MPI_Comm_free((MPI_Comm *)c->mpi);
    cddp_free(c->mpi);
    c->mpi = NULL;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (c->mpi_owner && !finalized) MPI_Finalize();
}

int cddp__mpi_fingerprints(cddp_comm *c, const fingerprint *mine, cddp_error *err) {
    fingerprint *all = cddp_malloc(sizeof *all * (size_t)c->world);
    if (!all) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    int rc =
        MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, COMM(c));
    int st = rc == MPI_SUCCESS ? cddp__comm_check_fingerprints(c, mine, all, sizeof *all, err)
                               : mpi_error(c, err, rc, "Allgather");
    cddp_free(all);
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

int cddp__mpi_allreduce(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err) {
    bool narrow = dt == CDDP_COMM_BF16 || dt == CDDP_COMM_F16;
    size_t es = narrow ? 4 : cddp_comm_dtype_size(dt);
    float *wide = NULL;
    void *buf = recv;
    if (narrow) { /* widen to float32, reduce, narrow back once */
        wide = cddp_malloc(sizeof(float) * (size_t)(count ? count : 1));
        if (!wide) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
        const uint16_t *s = send;
        for (int64_t i = 0; i < count; i++)
            wide[i] = dt == CDDP_COMM_BF16 ? cddp__bf16_to_f32(s[i]) : cddp__f16_to_f32(s[i]);
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
    if (op == CDDP_COMM_MEAN)
        for (int64_t i = 0; i < count; i++) switch (narrow ? CDDP_COMM_F32 : dt) {
            case CDDP_COMM_F64:
                ((double *)buf)[i] /= c->world;
                break;
            case CDDP_COMM_I32:
                ((int32_t *)buf)[i] /= c->world;
                break;
            case CDDP_COMM_I64:
                ((int64_t *)buf)[i] /= c->world;
                break;
            default:
                ((float *)buf)[i] /= (float)c->world;
                break;
            }
    if (narrow) {
        uint16_t *d = recv;
        for (int64_t i = 0; i < count; i++)
            d[i] = dt == CDDP_COMM_BF16 ? cddp__f32_to_bf16(wide[i]) : cddp__f32_to_f16(wide[i]);
        cddp_free(wide);
    }
    return CDDP_OK;
}

int cddp__mpi_broadcast(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int root,
                        cddp_error *err) {
    int64_t bytes = count * (int64_t)cddp_comm_dtype_size(dt);
    for (int64_t off = 0; off < bytes; off += PIECE) {
        int n = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        int rc = MPI_Bcast((char *)buf + off, n, MPI_BYTE, root, COMM(c));
        if (rc != MPI_SUCCESS) return mpi_error(c, err, rc, "Bcast");
    }
    return CDDP_OK;
}

int cddp__mpi_allgather(cddp_comm *c, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dt, cddp_error *err) {
    int64_t bytes = count * (int64_t)cddp_comm_dtype_size(dt);
    if (bytes > PIECE) /* one rank's part must fit an int count */
        return cddp__comm_fail(c, err, CDDP_EUNSUPPORTED,
                               "allgather of more than 1 GiB per rank "
                               "on the MPI backend");
    int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Allgather");
}

/* The reduction over the whole send buffer, then this rank's part: simple rather than
 * bandwidth-optimal (MPI_Reduce_scatter_block has no mean and no 16-bit float types). */
int cddp__mpi_reduce_scatter(cddp_comm *c, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dt, cddp_comm_op op, cddp_error *err) {
    size_t es = cddp_comm_dtype_size(dt), part = (size_t)count * es;
    uint8_t *all = cddp_malloc(part * (size_t)c->world + 1);
    if (!all) return cddp__comm_fail(c, err, CDDP_ENOMEM, "out of memory");
    int rc = cddp__mpi_allreduce(c, send, all, count * c->world, dt, op, err);
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

int cddp__mpi_gather(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                     int root, cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "gather", err));
    int bytes = (int)(count * (int64_t)cddp_comm_dtype_size(dt));
    int rc = MPI_Gather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, root, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Gather");
}

int cddp__mpi_scatter(cddp_comm *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dt,
                      int root, cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "scatter", err));
    int bytes = (int)(count * (int64_t)cddp_comm_dtype_size(dt));
    int rc = MPI_Scatter(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, root, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Scatter");
}

/* A running MPI call cannot be interrupted: the job ends. */
/* One message of count elements as bytes (the dtype is checked through the count in bytes: the
 * receiver probes the message's size first and fails naming both sides when it differs; the
 * sender learns of it only through the job ending, as MPI gives no way back). */
int cddp__mpi_send(cddp_comm *c, const void *buf, int64_t count, cddp_comm_dtype dt, int peer,
                   cddp_error *err) {
    CDDP_TRY(part_bytes(c, count, dt, "send", err));
    int n = (int)(count * (int64_t)cddp_comm_dtype_size(dt));
    int rc = MPI_Send(buf, n, MPI_BYTE, peer, 7, COMM(c));
    return rc == MPI_SUCCESS ? CDDP_OK : mpi_error(c, err, rc, "Send");
}

int cddp__mpi_recv(cddp_comm *c, void *buf, int64_t count, cddp_comm_dtype dt, int peer,
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

void cddp__mpi_abort(cddp_comm *c) {
    char why[sizeof c->abort_reason];
    pthread_mutex_lock(&c->mu);
    memcpy(why, c->abort_reason, sizeof why);
    pthread_mutex_unlock(&c->mu);
    cddp_log(CDDP_LOG_ERROR, "comm", "aborting the MPI job: %s", why);
    MPI_Abort(COMM(c), 1);
}

#endif
