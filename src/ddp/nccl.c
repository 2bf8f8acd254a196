/* nccl.c: collectives on device memory through NCCL (cddp/nccl.h).
 *
 * NCCL is opened at run time (dlopen), so that a cddp built with its header runs on machines
 * without it, and tests can open a stand-in (tests/nccl/fake_nccl.c). The communicator is made in
 * NCCL's nonblocking mode: every call that returns ncclInProgress is then polled
 * (ncclCommGetAsyncError) until it settles or the timeout passes, when the communicator is
 * aborted. On a GPU the collectives go on a stream of the communicator's own, ordered by two
 * events: `ready`, recorded on the device's stream before each collective and waited for by the
 * communicator's, and `done`, the other way round (cddp_nccl_join). cddp_nccl_watch hands an event
 * after the queued collectives to the communicator's watchdog, a thread that polls it beside
 * NCCL's asynchronous error and aborts the communicator at an error or the timeout (so that a
 * dead peer's stuck kernels end and the device's stream with them), while the host goes on
 * queueing; a lock keeps the watchdog's abort from another call's use of the communicator.
 * Without NCCL's header (CDDP_HAVE_NCCL unset) every call says so. */
#include "cddp/nccl.h"

#include "ddp/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CDDP_HAVE_NCCL

static int no_nccl(cddp_error *err) {
    return cddp_error_set(err, CDDP_EUNSUPPORTED,
                          "NCCL is not available: this cddp was built without NCCL's header "
                          "(nccl.h, with the CUDA toolkit)");
}

cddp_nccl *cddp_nccl_create(cddp_comm *group, cddp_device *dev, const cddp_nccl_options *opts,
                            cddp_error *err) {
    (void)group, (void)dev, (void)opts;
    no_nccl(err);
    return NULL;
}
int cddp_nccl_allreduce(cddp_nccl *n, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    (void)n, (void)send, (void)recv, (void)count, (void)dtype, (void)op;
    return no_nccl(err);
}
int cddp_nccl_reduce_scatter(cddp_nccl *n, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    (void)n, (void)send, (void)recv, (void)count, (void)dtype, (void)op;
    return no_nccl(err);
}
int cddp_nccl_allgather(cddp_nccl *n, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dtype, cddp_error *err) {
    (void)n, (void)send, (void)recv, (void)count, (void)dtype;
    return no_nccl(err);
}
int cddp_nccl_join(cddp_nccl *n, cddp_error *err) {
    (void)n;
    return no_nccl(err);
}
int cddp_nccl_wait(cddp_nccl *n, cddp_error *err) {
    (void)n;
    return no_nccl(err);
}
int cddp_nccl_watch(cddp_nccl *n, cddp_error *err) {
    (void)n;
    return no_nccl(err);
}
int cddp_nccl_version(const cddp_nccl_options *opts) {
    (void)opts;
    return 0;
}
void cddp_nccl_destroy(cddp_nccl *n) {
    (void)n;
}

#else

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <unistd.h>

/* The NCCL functions cddp calls, by their names. */
#define NCCL_FUNCTIONS(X)                                                                          \
    X(ncclGetVersion)                                                                              \
    X(ncclGetUniqueId)                                                                             \
    X(ncclCommInitRankConfig)                                                                      \
    X(ncclCommGetAsyncError)                                                                       \
    X(ncclCommFinalize)                                                                            \
    X(ncclCommDestroy)                                                                             \
    X(ncclCommAbort)                                                                               \
    X(ncclAllReduce)                                                                               \
    X(ncclReduceScatter)                                                                           \
    X(ncclAllGather)                                                                               \
    X(ncclGetErrorString)                                                                          \
    X(ncclGetLastError)

typedef struct lib {
#define POINTER(name) __typeof__(&name) name;
    NCCL_FUNCTIONS(POINTER)
#undef POINTER
} lib;

/* Collectives handed to the watchdog: an event after them and when they must have finished. */
#define WATCHED  64
typedef struct watched {
    cudaEvent_t ev;
    double deadline;
} watched;

struct cddp_nccl {
    const lib *l;
    pthread_mutex_t lock; /* every call, and the watchdog's polls: one at a time */
    ncclComm_t comm;
    cddp_device *dev;
    cudaStream_t stream; /* the collectives' (NULL on the CPU: they run when called) */
    cudaStream_t main;   /* the device's, where contexts' kernels run */
    cudaEvent_t ready, done;
    int rank, world;
    double timeout;
    cddp_error failed; /* latched: every later call reports it */
    /* the watchdog (started by the first cddp_nccl_watch), its ring of events under lock */
    pthread_t watchdog;
    pthread_cond_t wake;
    bool watching, stop;
    watched ring[WATCHED];
    int head, count;
};

/* The libraries opened, by path (a process opens one or two: NCCL, a test's stand-in). */
#define MAX_LIBS 4
static struct {
    char path[256];
    lib l;
} libs[MAX_LIBS];
static int nlibs;
static pthread_mutex_t libs_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *library_of(const cddp_nccl_options *opts) {
    if (opts && opts->library && *opts->library) return opts->library;
    const char *env = getenv("CDDP_NCCL_LIBRARY");
    return env && *env ? env : "libnccl.so.2";
}

/* The library's functions, opened once per path; NULL with err saying what is missing. */
static const lib *open_lib(const char *path, cddp_error *err) {
    pthread_mutex_lock(&libs_lock);
    const lib *found = NULL;
    for (int i = 0; i < nlibs && !found; i++)
        if (!strcmp(libs[i].path, path)) found = &libs[i].l;
    if (!found && nlibs < MAX_LIBS) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        lib l;
        const char *missing = NULL;
#define LOOKUP(name)                                                                               \
    if (h && !missing && !(*(void **)&l.name = dlsym(h, #name))) missing = #name;
        NCCL_FUNCTIONS(LOOKUP)
#undef LOOKUP
        if (!h)
            cddp_error_set(err, CDDP_EUNSUPPORTED, "NCCL is not available: %s", dlerror());
        else if (missing)
            cddp_error_set(err, CDDP_EUNSUPPORTED, "NCCL is not available: %s has no %s", path,
                           missing);
        if (h && !missing) {
            snprintf(libs[nlibs].path, sizeof libs[nlibs].path, "%s", path);
            libs[nlibs].l = l;
            found = &libs[nlibs++].l;
        } else if (h) {
            dlclose(h);
        }
    } else if (!found) {
        cddp_error_set(err, CDDP_EUNSUPPORTED, "NCCL: more than %d libraries opened", MAX_LIBS);
    }
    pthread_mutex_unlock(&libs_lock);
    return found;
}

int cddp_nccl_version(const cddp_nccl_options *opts) {
    cddp_error err = {0};
    const lib *l = open_lib(library_of(opts), &err);
    int v = 0;
    if (l && l->ncclGetVersion(&v) != ncclSuccess) v = 0;
    return v;
}

/* Latches and reports NCCL's failure r of `what` on n (its last error's words too). */
static int failed(cddp_nccl *n, ncclResult_t r, const char *what, cddp_error *err) {
    if (!n->failed.code) {
        const char *last = n->comm ? n->l->ncclGetLastError(n->comm) : NULL;
        cddp_error_set(&n->failed, r == ncclRemoteError ? CDDP_EIO : CDDP_ESTATE,
                       "NCCL: %s failed (%d ranks): %s%s%s", what, n->world,
                       n->l->ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    }
    if (n->comm) {
        n->l->ncclCommAbort(n->comm);
        n->comm = NULL;
    }
    return cddp_error_set(err, n->failed.code, "%s", n->failed.msg);
}

/* Polls the communicator until `what` (a call that returned ncclInProgress, or queued work) has
 * settled: CDDP_OK, or its failure; at the deadline the communicator is aborted. */
static int settle(cddp_nccl *n, const char *what, double deadline, cddp_error *err) {
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = n->l->ncclCommGetAsyncError(n->comm, &state);
        if (r != ncclSuccess) return failed(n, r, what, err);
        if (state == ncclSuccess) return CDDP_OK;
        if (state != ncclInProgress) return failed(n, state, what, err);
        if (cddp_now_s() > deadline) {
            cddp_error_set(&n->failed, CDDP_ETIMEDOUT,
                           "NCCL: %s did not finish within %.0f s (%d ranks: one did not join, "
                           "or one is stuck): the communicator was aborted",
                           what, n->timeout, n->world);
            return failed(n, ncclInProgress, what, err);
        }
        usleep(1000);
    }
}

static int check(cddp_nccl *n, cddp_error *err) {
    if (n->failed.code) return cddp_error_set(err, n->failed.code, "%s", n->failed.msg);
    return CDDP_OK;
}

/* A CUDA failure of `what` on n's device, in err. */
static int cuda_failed(cddp_nccl *n, cudaError_t e, const char *what, cddp_error *err) {
    return cddp_error_set(err, CDDP_EIO, "NCCL: %s on %s: %s", what, cddp_device_name(n->dev),
                          cudaGetErrorString(e));
}

/* On a GPU: the communicator's stream (of the highest priority, so that its kernels get the
 * multiprocessors as soon as backward's leave one) and its two events. */
static int own_stream(cddp_nccl *n, cddp_error *err) {
    if (!n->main) return CDDP_OK;
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&n->stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
    return e == cudaSuccess ? CDDP_OK : cuda_failed(n, e, "making the collectives' stream", err);
}

/* What is queued on `later` from now on runs after the work queued so far on `first` (through ev;
 * the host does not wait). */
static int order(cddp_nccl *n, cudaStream_t first, cudaStream_t later, cudaEvent_t ev,
                 const char *what, cddp_error *err) {
    cudaError_t e = cudaEventRecord(ev, first);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(later, ev, 0);
    return e == cudaSuccess ? CDDP_OK : cuda_failed(n, e, what, err);
}

/* Frees n and what own_stream made (a stream with work left goes once that work is done). */
static void release(cddp_nccl *n) {
    pthread_cond_destroy(&n->wake);
    pthread_mutex_destroy(&n->lock);
    if (n->ready) cudaEventDestroy(n->ready);
    if (n->done) cudaEventDestroy(n->done);
    if (n->stream) cudaStreamDestroy(n->stream);
    cddp_free(n);
}

/* NCCL takes one rank per GPU (two ranks on one fail inside NCCL's init): every rank's GPU, by
 * its host and PCI address (cddp_device_bus_id: the same GPU whatever CUDA_VISIBLE_DEVICES
 * numbers it), compared across the group first, so that every rank says which ranks share one. */
static int one_rank_per_gpu(cddp_comm *group, cddp_device *dev, cddp_error *err) {
    if (cddp_device_kind_of(dev) != CDDP_DEVICE_CUDA) return CDDP_OK;
    int world = cddp_comm_size(group), a = 0, b = 0;
    cddp__placement *all = cddp_calloc((size_t)world, sizeof *all);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "NCCL: out of memory");
    int rc = cddp__placement_gather(group, dev, 0, all, err);
    if (rc == CDDP_OK && cddp__placement_shared(all, world, &a, &b)) {
        char where[320], here[340] = "";
        cddp__placement_where(dev, where, sizeof where);
        if (all[a].card == all[cddp_comm_rank(group)].card)
            snprintf(here, sizeof here, " (here: %s)", where);
        rc = cddp_error_set(err, CDDP_EINVAL,
                            "NCCL: ranks %d and %d are on one GPU%s: NCCL takes one rank per "
                            "GPU: start at most one rank per GPU (cddprun --nproc_per_node "
                            "gpu), or take ipc instead (--ipc: ranks of one host that share a "
                            "GPU sum from each other's memory), or the host transport (the "
                            "gradients then go through host memory)",
                            a, b, here);
    }
    cddp_free(all);
    return rc;
}

cddp_nccl *cddp_nccl_create(cddp_comm *group, cddp_device *dev, const cddp_nccl_options *opts,
                            cddp_error *err) {
    /* NCCL reads GPU memory (and, in tests with a stand-in, the host's): not the emulated
     * device's, which only its queue may touch. Every rank has the same kind of device. */
    if (cddp_device_kind_of(dev) != CDDP_DEVICE_CUDA && !cddp_device_host_accessible(dev)) {
        cddp_error_set(err, CDDP_EINVAL, "NCCL: %s: NCCL moves GPU memory: use a CUDA device",
                       cddp_device_name(dev));
        return NULL;
    }
    const lib *l = open_lib(library_of(opts), err);
    /* rank 0's id, with whether it has one: every rank takes part in the broadcast, so that a
     * rank 0 without NCCL does not leave the others waiting */
    struct {
        int32_t ok;
        ncclUniqueId id;
    } msg = {0};
    int rank = cddp_comm_rank(group), world = cddp_comm_size(group);
    if (rank == 0 && l) msg.ok = l->ncclGetUniqueId(&msg.id) == ncclSuccess;
    _Static_assert(sizeof msg % 4 == 0, "the id travels as int32");
    if (cddp_comm_broadcast(group, &msg, (int64_t)(sizeof msg / 4), CDDP_COMM_I32, 0, -1, err) !=
        CDDP_OK)
        return NULL;
    if (one_rank_per_gpu(group, dev, err) != CDDP_OK || !l) return NULL;
    if (!msg.ok) {
        cddp_error_set(err, CDDP_EUNSUPPORTED,
                       "NCCL: rank 0 could not make the communicator's id (NCCL missing or "
                       "failing there)");
        return NULL;
    }
    cddp_nccl *n = cddp_calloc(1, sizeof *n);
    if (!n) {
        cddp_error_set(err, CDDP_ENOMEM, "NCCL: out of memory");
        return NULL;
    }
    *n = (cddp_nccl){.l = l,
                     .dev = dev,
                     .main = cddp_device_native_queue(dev),
                     .rank = rank,
                     .world = world,
                     .timeout =
                         opts && opts->timeout_s > 0 ? opts->timeout_s : cddp_comm_timeout(group)};
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->wake, NULL);
    if (cddp_device_kind_of(dev) == CDDP_DEVICE_CUDA) cudaSetDevice(cddp_device_index(dev));
    if (own_stream(n, err) != CDDP_OK) {
        release(n);
        return NULL;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = l->ncclCommInitRankConfig(&n->comm, world, msg.id, rank, &config);
    if ((r != ncclSuccess && r != ncclInProgress) ||
        settle(n, "forming the communicator", cddp_now_s() + n->timeout, err) != CDDP_OK) {
        if (r != ncclSuccess && r != ncclInProgress) failed(n, r, "forming the communicator", err);
        release(n);
        return NULL;
    }
    return n;
}

static bool types_of(cddp_comm_dtype dt, cddp_comm_op op, ncclDataType_t *t, ncclRedOp_t *o) {
    static const ncclDataType_t types[] = {
        [CDDP_COMM_F32] = ncclFloat32,   [CDDP_COMM_F64] = ncclFloat64,
        [CDDP_COMM_I32] = ncclInt32,     [CDDP_COMM_I64] = ncclInt64,
        [CDDP_COMM_BF16] = ncclBfloat16, [CDDP_COMM_F16] = ncclFloat16};
    static const ncclRedOp_t ops[] = {[CDDP_COMM_SUM] = ncclSum,
                                      [CDDP_COMM_MEAN] = ncclAvg,
                                      [CDDP_COMM_MIN] = ncclMin,
                                      [CDDP_COMM_MAX] = ncclMax,
                                      [CDDP_COMM_PRODUCT] = ncclProd};
    if ((unsigned)dt >= CDDP_ARRAY_LEN(types) || (unsigned)op >= CDDP_ARRAY_LEN(ops)) return false;
    *t = types[dt], *o = ops[op];
    return true;
}

/* The collective's types in NCCL's terms (also set current the device's GPU); err when NCCL has
 * none for them. */
static int prepare(cddp_nccl *n, const char *what, int64_t count, cddp_comm_dtype dtype,
                   cddp_comm_op op, ncclDataType_t *t, ncclRedOp_t *o, cddp_error *err) {
    CDDP_TRY(check(n, err));
    if (count < 0 || !types_of(dtype, op, t, o))
        return cddp_error_set(err, CDDP_EINVAL, "NCCL: %s of %lld %s by %s: not one NCCL has", what,
                              (long long)count, cddp_comm_dtype_name(dtype), cddp_comm_op_name(op));
    if (cddp_device_kind_of(n->dev) == CDDP_DEVICE_CUDA) cudaSetDevice(cddp_device_index(n->dev));
    /* after the work queued on the device so far (which wrote send) */
    return n->stream ? order(n, n->main, n->stream, n->ready, "ordering a collective", err)
                     : CDDP_OK;
}

/* What NCCL said when it was given the collective: queued, in progress (settled), or refused. */
static int issued(cddp_nccl *n, ncclResult_t r, const char *what, cddp_error *err) {
    if (r == ncclInProgress) return settle(n, what, cddp_now_s() + n->timeout, err);
    return r == ncclSuccess ? CDDP_OK : failed(n, r, what, err);
}

/* The collectives cddp queues, and queueing one (under the lock, the watchdog kept out). */
typedef enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER } collective;
static const char *const collective_names[] = {"allreduce", "reduce-scatter", "allgather"};

static int queue_collective(cddp_nccl *n, collective c, const void *send, void *recv, int64_t count,
                            cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    const char *what = collective_names[c];
    pthread_mutex_lock(&n->lock);
    int rc = prepare(n, what, count, dtype, op, &t, &o, err);
    if (rc == CDDP_OK) {
        ncclResult_t r =
            c == ALLREDUCE
                ? n->l->ncclAllReduce(send, recv, (size_t)count, t, o, n->comm, n->stream)
            : c == REDUCE_SCATTER
                ? n->l->ncclReduceScatter(send, recv, (size_t)count, t, o, n->comm, n->stream)
                : n->l->ncclAllGather(send, recv, (size_t)count, t, n->comm, n->stream);
        rc = issued(n, r, what, err);
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

int cddp_nccl_allreduce(cddp_nccl *n, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return queue_collective(n, ALLREDUCE, send, recv, count, dtype, op, err);
}

int cddp_nccl_reduce_scatter(cddp_nccl *n, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return queue_collective(n, REDUCE_SCATTER, send, recv, count, dtype, op, err);
}

int cddp_nccl_allgather(cddp_nccl *n, const void *send, void *recv, int64_t count,
                        cddp_comm_dtype dtype, cddp_error *err) {
    return queue_collective(n, ALLGATHER, send, recv, count, dtype, CDDP_COMM_SUM, err);
}

int cddp_nccl_join(cddp_nccl *n, cddp_error *err) {
    pthread_mutex_lock(&n->lock);
    int rc = check(n, err);
    if (rc == CDDP_OK && n->stream) {
        cudaSetDevice(cddp_device_index(n->dev));
        rc = order(n, n->stream, n->main, n->done, "ordering after the collectives", err);
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

/* One look at the collectives queued before ev, under lock: *running while they run within the
 * deadline (CDDP_OK); else CDDP_OK when they ran, or the failure: NCCL's asynchronous error or
 * the deadline passed (latched, the communicator aborted: its kernels then end), or CUDA's. A
 * peer that died leaves NCCL's kernels waiting for ever, so the event is polled, never waited on.
 */
static int poll_event(cddp_nccl *n, cudaEvent_t ev, double deadline, bool *running,
                      cddp_error *err) {
    *running = false;
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return CDDP_OK;
    if (e != cudaErrorNotReady) return cuda_failed(n, e, "waiting for the collectives", err);
    ncclResult_t state = ncclSuccess, r = n->l->ncclCommGetAsyncError(n->comm, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
        return failed(n, r != ncclSuccess ? r : state, "a collective", err);
    if (cddp_now_s() > deadline) {
        cddp_error_set(&n->failed, CDDP_ETIMEDOUT,
                       "NCCL: the collectives did not finish within %.0f s (%d ranks: a peer "
                       "stopped, or one is stuck): the communicator was aborted",
                       n->timeout, n->world);
        return failed(n, ncclInProgress, "a collective", err);
    }
    *running = true;
    return CDDP_OK;
}

/* Waits for the stream's work, polling an event after it (poll_event), then for NCCL's own
 * settling. Where there is no stream (the CPU), the collectives ran when they were called. */
static int wait_locked(cddp_nccl *n, cddp_error *err) {
    CDDP_TRY(check(n, err));
    double deadline = cddp_now_s() + n->timeout;
    if (n->stream) {
        cudaEvent_t ev = NULL;
        cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(ev, n->stream);
        bool running = e == cudaSuccess;
        int rc = running ? CDDP_OK : cuda_failed(n, e, "waiting for the collectives", err);
        while (running && (rc = poll_event(n, ev, deadline, &running, err)) == CDDP_OK && running)
            usleep(200);
        if (ev) cudaEventDestroy(ev);
        CDDP_TRY(rc);
    }
    return settle(n, "a collective", deadline, err);
}

int cddp_nccl_wait(cddp_nccl *n, cddp_error *err) {
    pthread_mutex_lock(&n->lock);
    int rc = wait_locked(n, err);
    pthread_mutex_unlock(&n->lock);
    return rc;
}

/* The oldest watched event, under lock: false while its collectives still run within their time;
 * else it is dropped (run, or the communicator failed: poll_event latches NCCL's failure or the
 * timeout and aborts the communicator; a CUDA error is latched here), the failure shown by the
 * next call. */
static bool poll_oldest(cddp_nccl *n) {
    watched *w = &n->ring[n->head];
    if (!n->failed.code) {
        bool running = false;
        cddp_error e = {0};
        if (poll_event(n, w->ev, w->deadline, &running, &e) != CDDP_OK && !n->failed.code)
            n->failed = e;
        if (running) return false;
    }
    cudaEventDestroy(w->ev);
    n->head = (n->head + 1) % WATCHED;
    n->count--;
    return true;
}

/* The watchdog: polls the watched events, oldest first, every 0.5 ms while there are some. */
static void *watchdog(void *arg) {
    cddp_nccl *n = arg;
    cudaSetDevice(cddp_device_index(n->dev));
    pthread_mutex_lock(&n->lock);
    while (!n->stop) {
        if (n->count == 0) {
            pthread_cond_wait(&n->wake, &n->lock);
        } else if (!poll_oldest(n)) {
            pthread_mutex_unlock(&n->lock);
            usleep(500);
            pthread_mutex_lock(&n->lock);
        }
    }
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

int cddp_nccl_watch(cddp_nccl *n, cddp_error *err) {
    if (!n->stream) return cddp_nccl_wait(n, err); /* the CPU: they ran when they were called */
    pthread_mutex_lock(&n->lock);
    int rc = check(n, err);
    if (rc == CDDP_OK && n->count == WATCHED) { /* the watchdog is behind: wait here instead */
        rc = wait_locked(n, err);
        pthread_mutex_unlock(&n->lock);
        return rc;
    }
    if (rc == CDDP_OK && !n->watching) {
        if (pthread_create(&n->watchdog, NULL, watchdog, n) == 0)
            n->watching = true;
        else
            rc = cddp_error_set(err, CDDP_ESTATE, "NCCL: cannot start the watchdog thread");
    }
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaSuccess;
    if (rc == CDDP_OK) {
        cudaSetDevice(cddp_device_index(n->dev));
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventRecord(ev, n->stream);
        if (e != cudaSuccess) {
            if (ev) cudaEventDestroy(ev);
            rc = cuda_failed(n, e, "watching the collectives", err);
        }
    }
    if (rc == CDDP_OK) {
        n->ring[(n->head + n->count) % WATCHED] = (watched){ev, cddp_now_s() + n->timeout};
        n->count++;
        pthread_cond_signal(&n->wake);
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

void cddp_nccl_destroy(cddp_nccl *n) {
    if (!n) return;
    if (n->watching) {
        pthread_mutex_lock(&n->lock);
        n->stop = true;
        pthread_cond_signal(&n->wake);
        pthread_mutex_unlock(&n->lock);
        pthread_join(n->watchdog, NULL);
    }
    for (; n->count > 0; n->count--, n->head = (n->head + 1) % WATCHED)
        cudaEventDestroy(n->ring[n->head].ev);
    if (n->comm) {
        cddp_error err = {0};
        ncclResult_t r = n->l->ncclCommFinalize(n->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            settle(n, "closing the communicator", cddp_now_s() + n->timeout, &err) == CDDP_OK)
            n->l->ncclCommDestroy(n->comm);
        else if (n->comm)
            n->l->ncclCommAbort(n->comm);
    }
    release(n);
}

#endif
