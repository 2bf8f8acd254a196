/* fake_nccl.c: a stand-in for NCCL's library (its functions that the nccl transport calls, with
 * NCCL's header), for testing the nccl transport's bootstrap and error paths on machines without a
 * GPU. Buffers are host memory (cddp's CPU device); the ranks are processes of one host, meeting in
 * a shared memory segment named after the communicator's unique id: allreduce and reduce-scatter
 * sum float32 in rank order (allreduce also bfloat16 and half: summed in float32 in rank order,
 * then rounded to nearest even), allgather copies.
 *
 * FAKE_NCCL_INIT: ok (default), hang (forming never finishes), fail (ncclSystemError at once).
 * FAKE_NCCL_OP: ok (default), fail (allreduce refuses: ncclUnhandledCudaError), remote (allreduce
 * returns, then the communicator reports ncclRemoteError, as when a peer fails).
 * FAKE_NCCL_LOG: a file each rank appends "rank R of W id HEX" to when it joins. */
#include <fcntl.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_FLOATS (1 << 22)
#define MAX_RANKS  8

typedef struct shared {
    _Atomic int arrived, left, attached;
    float slot[MAX_RANKS][MAX_FLOATS];
} shared;

struct ncclComm {
    int rank, world;
    ncclResult_t state;
    char name[64];
    shared *sh;
    int round;
};

static const char *mode(const char *var) {
    const char *v = getenv(var);
    return v && *v ? v : "ok";
}

ncclResult_t ncclGetVersion(int *version) {
    *version = 22809;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(id->internal, sizeof id->internal, "fake-%d-%ld-%ld", (int)getpid(), (long)t.tv_sec,
             t.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    if (!config || config->magic != 0xcafebeef || config->blocking != 0)
        return ncclInvalidArgument; /* cddp asks for the nonblocking mode, with NCCL's initializer
                                     */
    if (!strcmp(mode("FAKE_NCCL_INIT"), "fail")) return ncclSystemError;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    struct ncclComm *c = calloc(1, sizeof *c);
    c->rank = rank, c->world = nranks;
    c->state = !strcmp(mode("FAKE_NCCL_INIT"), "hang") ? ncclInProgress : ncclSuccess;
    snprintf(c->name, sizeof c->name, "/cddp-%.50s", id.internal);
    for (char *p = c->name + 1; *p; p++)
        if (*p == '/') *p = '_';
    const char *log = getenv("FAKE_NCCL_LOG");
    FILE *f = log ? fopen(log, "a") : NULL;
    if (f) {
        fprintf(f, "rank %d of %d id %s\n", rank, nranks, id.internal);
        fclose(f);
    }
    if (nranks > 1) {
        int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ftruncate(fd, sizeof(shared)) != 0) return ncclSystemError;
        c->sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (c->sh == MAP_FAILED) return ncclSystemError;
        /* the last rank to map the segment removes its name: nothing is left in /dev/shm, even
         * when a rank exits without destroying its communicator */
        if (atomic_fetch_add(&c->sh->attached, 1) + 1 == nranks) shm_unlink(c->name);
    }
    *comm = c;
    return c->state == ncclSuccess ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
    *state = comm->state;
    return ncclSuccess;
}

/* Every rank at the barrier's round-th crossing (counter: arrived or left). */
static void barrier(_Atomic int *counter, int world, int round) {
    atomic_fetch_add(counter, 1);
    while (atomic_load(counter) < world * round) usleep(100);
}

/* Every rank's n floats of send into its slot; then each rank reads the slots it needs. */
static void meet(ncclComm_t comm, const void *send, size_t n) {
    comm->round++;
    memcpy(comm->sh->slot[comm->rank], send, n * sizeof(float));
    barrier(&comm->sh->arrived, comm->world, comm->round);
}

/* A 16-bit value (IEEE half with f16, else bfloat16) as float32, and float32 rounded to one. */
static float widened(uint16_t h, bool f16) {
    float f;
    if (f16) {
        _Float16 x;
        memcpy(&x, &h, 2);
        return (float)x;
    }
    uint32_t u = (uint32_t)h << 16;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t narrowed(float f, bool f16) {
    uint16_t h;
    if (f16) {
        _Float16 x = (_Float16)f;
        memcpy(&h, &x, 2);
        return h;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    if (comm->state != ncclSuccess) return ncclInvalidUsage;
    if (!strcmp(mode("FAKE_NCCL_OP"), "fail")) return ncclUnhandledCudaError;
    bool half = type == ncclBfloat16 || type == ncclFloat16, f16 = type == ncclFloat16;
    if ((type != ncclFloat32 && !half) || (op != ncclSum && op != ncclAvg) || count > MAX_FLOATS)
        return ncclInvalidArgument;
    float *out = recv;
    if (comm->world == 1) {
        memmove(out, send, count * (half ? 2 : sizeof(float)));
    } else {
        float *wide = half ? malloc(count * sizeof(float) + 1) : NULL;
        if (half && !wide) return ncclSystemError;
        for (size_t i = 0; half && i < count; i++)
            wide[i] = widened(((const uint16_t *)send)[i], f16);
        meet(comm, half ? wide : send, count);
        for (size_t i = 0; i < count; i++) {
            float s = 0;
            for (int r = 0; r < comm->world; r++) s += comm->sh->slot[r][i];
            s = op == ncclAvg ? s / (float)comm->world : s;
            if (half)
                ((uint16_t *)recv)[i] = narrowed(s, f16);
            else
                out[i] = s;
        }
        free(wide);
        barrier(&comm->sh->left, comm->world, comm->round);
    }
    if (!strcmp(mode("FAKE_NCCL_OP"), "remote")) comm->state = ncclRemoteError;
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    if (comm->state != ncclSuccess) return ncclInvalidUsage;
    if (type != ncclFloat32 || (op != ncclSum && op != ncclAvg) ||
        count * (size_t)comm->world > MAX_FLOATS)
        return ncclInvalidArgument;
    float *out = recv;
    if (comm->world == 1) {
        memmove(out, send, count * sizeof(float));
        return ncclSuccess;
    }
    meet(comm, send, count * (size_t)comm->world);
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < comm->world; r++) s += comm->sh->slot[r][comm->rank * count + i];
        out[i] = op == ncclAvg ? s / (float)comm->world : s;
    }
    barrier(&comm->sh->left, comm->world, comm->round);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    if (comm->state != ncclSuccess) return ncclInvalidUsage;
    if (type != ncclFloat32 || count > MAX_FLOATS) return ncclInvalidArgument;
    float *out = recv;
    if (comm->world == 1) {
        memmove(out, send, count * sizeof(float));
        return ncclSuccess;
    }
    meet(comm, send, count);
    for (int r = 0; r < comm->world; r++)
        memcpy(out + (size_t)r * count, comm->sh->slot[r], count * sizeof(float));
    barrier(&comm->sh->left, comm->world, comm->round);
    return ncclSuccess;
}

static ncclResult_t end(ncclComm_t comm) {
    if (comm->sh) {
        munmap(comm->sh, sizeof(shared));
        shm_unlink(comm->name); /* when not every rank came (gone already otherwise) */
    }
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    (void)comm;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    return end(comm);
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    return end(comm);
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error";
    case ncclSystemError:
        return "unhandled system error";
    case ncclInvalidArgument:
        return "invalid argument";
    case ncclInvalidUsage:
        return "invalid usage";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "the fake's mode";
}
