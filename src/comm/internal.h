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

#include <stdatomic.h>
#include <stddef.h>

#define SEG_MAGIC 0x4344445053484d31ull /* "CDDPSHM1" */
#define CTL_SIZE  256

enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_BARRIER };
enum { BACKEND_SELF, BACKEND_SHM, BACKEND_MPI };

typedef struct fingerprint {
    uint64_t seq;
    int32_t kind, op, dtype, root;
    int64_t count;
} fingerprint;

typedef struct ctl {
    _Atomic uint64_t arrive;
    int32_t pid;
    int32_t pad;
    fingerprint fp[2]; /* by sequence parity: a peer is at most one collective ahead */
} ctl;

_Static_assert(sizeof(ctl) <= CTL_SIZE, "control block too large");

typedef struct seg_header {
    uint64_t magic;
    int32_t world;
    int32_t pad;
    uint64_t chunk;
} seg_header;

struct cddp_comm {
    int backend;
    int rank, world, local_rank, local_world;
    double timeout;
    cddp_error failed; /* latched */
    uint64_t seq, step;
    /* shm */
    uint8_t *seg;
    size_t seg_size, chunk;
    float *acc; /* float32 accumulator for one slice */
    uint8_t *tmp;
    /* mpi */
    void *mpi;      /* the group's MPI_Comm, duplicated from MPI_COMM_WORLD */
    bool mpi_owner; /* this group initialised MPI and finalises it */
};

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

#endif
