/* nccl.c: the NCCL transport (cddp/dcomm.h's "nccl"): collectives on device memory through NCCL,
 * NVIDIA's collective library, one rank per GPU, on one host or many.
 *
 * NCCL is opened at run time (dlopen: $CDDP_NCCL_LIBRARY, else libnccl.so.2), so that a cddp built
 * with its header runs on machines without it, and tests can open a stand-in
 * (tests/nccl/fake_nccl.c, on the CPU, whose memory it reads). The communicator is bootstrapped
 * through the group (rank 0 makes NCCL's unique id and broadcasts it: no MPI needed) and made in
 * NCCL's nonblocking mode: every call that returns ncclInProgress is then polled
 * (ncclCommGetAsyncError) until it settles or the timeout passes, when the communicator is
 * aborted; a rank that does not join never leaves the others hanging.
 *
 * Everything it asks of the device goes through the device's seam (cddp/device.h), never the
 * platform's runtime: the collectives go on a queue of the device's (cddp_queue_create_first: on a
 * GPU a stream of the highest priority, so that its kernels get the multiprocessors as soon as
 * backward's leave one) whose platform handle NCCL takes (cddp_queue_native), ordered with the
 * device's default queue by two events: `ready`, recorded there before each collective and waited
 * for by the collectives' queue, and `done`, the other way round (the join). The watch hands an
 * event after the queued collectives to the communicator's watchdog, a thread that polls it
 * (cddp_event_query) beside NCCL's asynchronous error and aborts the communicator at an error or
 * the timeout (so that a dead peer's stuck kernels end, and the device's queue with them), while
 * the host goes on queueing; a lock keeps the watchdog's abort from another call's use of the
 * communicator. Without NCCL's header (CDDP_HAVE_NCCL unset) opening it says so. */
#include "dcomm/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NCCL serves the devices of this platform; and, for a stand-in library in tests, the CPU. */
#define PLATFORM "cuda"

static bool platform_of(cddp_device *dev) {
    const char *p = cddp_device_platform(dev);
    return p && strcmp(p, PLATFORM) == 0;
}

/* NCCL's version where it opens (as 22809 for 2.28.9), 0 where it does not. */
static int version(void);

/* AUTO's offer: NCCL's version on a device of its platform (0 where it does not open), -1 on
 * another device. */
static int64_t nccl_offer(cddp_device *dev) {
    return platform_of(dev) ? version() : -1;
}

static bool nccl_serves(const cddp__placement *all, int world, int at, char *why, size_t n) {
    int a = 0, b = 0;
    for (int r = 0; r < world; r++)
        if (all[r].offer[at] < 0) {
            snprintf(why, n,
                     "NCCL moves GPU memory only (%s devices), not %s's (rank %d); ipc shares "
                     "it when named",
                     PLATFORM, all[r].device, r);
            return false;
        }
    for (int r = 0; r < world; r++)
        if (all[r].offer[at] == 0) {
            snprintf(why, n, "NCCL does not open on rank %d (libnccl.so.2, or CDDP_NCCL_LIBRARY)",
                     r);
            return false;
        }
    if (cddp__placement_shared(all, world, &a, &b)) {
        snprintf(why, n,
                 "ranks %d and %d share a GPU, which NCCL refuses (ipc, named, reads each "
                 "other's memory instead)",
                 a, b);
        return false;
    }
    int64_t v = all[0].offer[at];
    snprintf(why, n, "one rank per GPU, NCCL on every rank (%d.%d.%d on rank 0)", (int)(v / 10000),
             (int)(v / 100 % 100), (int)(v % 100));
    return true;
}

#ifndef CDDP_HAVE_NCCL

static int version(void) {
    return 0;
}

static void *nccl_open(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *o,
                       cddp_error *err) {
    (void)group, (void)dev, (void)o;
    cddp_error_set(err, CDDP_EUNSUPPORTED,
                   "NCCL is not available: this cddp was built without NCCL's header (nccl.h, "
                   "with the CUDA toolkit)");
    return NULL;
}

/* never called: nothing opens */
static int nccl_collective(void *c, const void *send, void *recv, int64_t count,
                           cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    (void)c, (void)send, (void)recv, (void)count, (void)dtype, (void)op;
    return cddp_error_set(err, CDDP_ESTATE, "NCCL is not available");
}
static int nccl_allgather(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_error *err) {
    return nccl_collective(c, send, recv, count, dtype, CDDP_COMM_SUM, err);
}
static int nccl_step(void *c, cddp_error *err) {
    return nccl_collective(c, NULL, NULL, 0, CDDP_COMM_F32, CDDP_COMM_SUM, err);
}
static void nccl_destroy(void *c) {
    (void)c;
}
#define nccl_allreduce      nccl_collective
#define nccl_reduce_scatter nccl_collective
#define nccl_join           nccl_step
#define nccl_wait           nccl_step
#define nccl_watch          nccl_step
#define nccl_known_done     NULL

#else

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
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
    cddp_event *ev; /* made for the slot on its first use, recorded again on each */
    double deadline;
    uint64_t issued; /* the collectives queued before it */
} watched;

typedef struct nccl {
    const lib *l;
    pthread_mutex_t lock; /* every call, and the watchdog's polls: one at a time */
    ncclComm_t comm;
    cddp_device *dev;
    cddp_queue *queue; /* the collectives' */
    void *stream;      /* its platform handle (NULL on the CPU: they run when called) */
    cddp_event *ready, *done, *waited;
    int rank, world;
    double timeout;
    cddp_error failed; /* latched: every later call reports it */
    /* the watchdog (started by the first watch), its ring of events under lock */
    pthread_t watchdog;
    pthread_cond_t wake;
    bool watching, stop;
    watched ring[WATCHED];
    int head, count;
    uint64_t issued;             /* collectives NCCL took, under lock */
    _Atomic uint64_t known_done; /* of them, the first this many are known to have run */
} nccl;

/* The libraries opened, by path (a process opens one or two: NCCL, a test's stand-in). */
#define MAX_LIBS 4
static struct {
    char path[256];
    lib l;
} libs[MAX_LIBS];
static int nlibs;
static pthread_mutex_t libs_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *library_of(void) {
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

static int version(void) {
    cddp_error err = {0};
    const lib *l = open_lib(library_of(), &err);
    int v = 0;
    if (l && l->ncclGetVersion(&v) != ncclSuccess) v = 0;
    return v;
}

/* Latches and reports NCCL's failure r of `what` on n (its last error's words too). */
static int failed(nccl *n, ncclResult_t r, const char *what, cddp_error *err) {
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
static int settle(nccl *n, const char *what, double deadline, cddp_error *err) {
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

static int check(nccl *n, cddp_error *err) {
    if (n->failed.code) return cddp_error_set(err, n->failed.code, "%s", n->failed.msg);
    return CDDP_OK;
}

/* A failure of the device's in `what` (its words in e), latched: the communicator is no longer
 * ordered with the device's work. */
static int device_failed(nccl *n, const cddp_error *e, const char *what, cddp_error *err) {
    if (!n->failed.code)
        cddp_error_set(&n->failed, e->code, "NCCL: %s on %s: %s", what, cddp_device_name(n->dev),
                       e->msg);
    return cddp_error_set(err, n->failed.code, "%s", n->failed.msg);
}

/* The collectives' queue (see the top) and the events that order it with the device's. */
static int own_queue(nccl *n, cddp_error *err) {
    cddp_error e = {0};
    if (!(n->queue = cddp_queue_create_first(n->dev, &e)) ||
        !(n->ready = cddp_event_create(n->dev, &e)) || !(n->done = cddp_event_create(n->dev, &e)) ||
        !(n->waited = cddp_event_create(n->dev, &e)))
        return device_failed(n, &e, "making the collectives' stream", err);
    n->stream = cddp_queue_native(n->queue);
    return CDDP_OK;
}

/* Frees n and what own_queue made (a queue with work left goes once that work is done). */
static void release(nccl *n) {
    pthread_cond_destroy(&n->wake);
    pthread_mutex_destroy(&n->lock);
    for (int i = 0; i < WATCHED; i++) cddp_event_destroy(n->ring[i].ev);
    cddp_event_destroy(n->ready);
    cddp_event_destroy(n->done);
    cddp_event_destroy(n->waited);
    cddp_queue_destroy(n->queue);
    cddp_free(n);
}

/* NCCL takes one rank per GPU (two ranks on one fail inside NCCL's init): every rank's GPU, by
 * its host and PCI address (cddp_device_bus_id: the same GPU whatever CUDA_VISIBLE_DEVICES
 * numbers it), compared across the group first, so that every rank says which ranks share one. */
static int one_rank_per_gpu(cddp_comm *group, cddp_device *dev, cddp_error *err) {
    if (!platform_of(dev)) return CDDP_OK; /* a stand-in on the CPU */
    int world = cddp_comm_size(group), a = 0, b = 0;
    cddp__placement *all = cddp_calloc((size_t)world, sizeof *all);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "NCCL: out of memory");
    int rc = cddp__placement_gather(group, dev, NULL, all, err);
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

static void *nccl_open(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *o,
                       cddp_error *err) {
    /* NCCL reads GPU memory (and, in tests with a stand-in, the host's): not the emulated
     * device's, which only its queue may touch. Every rank has the same kind of device. */
    if (!platform_of(dev) && !cddp_device_host_accessible(dev)) {
        cddp_error_set(err, CDDP_EINVAL, "NCCL: %s: NCCL moves GPU memory: use a CUDA device",
                       cddp_device_name(dev));
        return NULL;
    }
    const lib *l = open_lib(library_of(), err);
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
    nccl *n = cddp_calloc(1, sizeof *n);
    if (!n) {
        cddp_error_set(err, CDDP_ENOMEM, "NCCL: out of memory");
        return NULL;
    }
    *n = (nccl){.l = l,
                .dev = dev,
                .rank = rank,
                .world = world,
                .timeout = o->timeout_s > 0 ? o->timeout_s : cddp_comm_timeout(group)};
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->wake, NULL);
    cddp_error e = {0};
    if (own_queue(n, err) != CDDP_OK || (cddp_device_make_current(dev, &e) != CDDP_OK &&
                                         device_failed(n, &e, "forming the communicator", err))) {
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

/* The collective's types in NCCL's terms, queued after the work queued so far on the device's
 * default queue (which wrote send); err when NCCL has none for them. */
static int prepare(nccl *n, const char *what, int64_t count, cddp_comm_dtype dtype, cddp_comm_op op,
                   ncclDataType_t *t, ncclRedOp_t *o, cddp_error *err) {
    CDDP_TRY(check(n, err));
    if (count < 0 || !types_of(dtype, op, t, o))
        return cddp_error_set(err, CDDP_EINVAL, "NCCL: %s of %lld %s by %s: not one NCCL has", what,
                              (long long)count, cddp_comm_dtype_name(dtype), cddp_comm_op_name(op));
    cddp_error e = {0};
    if (cddp_event_record(n->ready, &e) != CDDP_OK || cddp_queue_wait(n->queue, n->ready, &e))
        return device_failed(n, &e, "ordering a collective", err);
    return CDDP_OK;
}

/* What NCCL said when it was given the collective: queued, in progress (settled), or refused. */
static int issued(nccl *n, ncclResult_t r, const char *what, cddp_error *err) {
    if (r == ncclInProgress) return settle(n, what, cddp_now_s() + n->timeout, err);
    return r == ncclSuccess ? CDDP_OK : failed(n, r, what, err);
}

/* The collectives cddp queues, and queueing one (under the lock, the watchdog kept out). */
typedef enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER } collective;
static const char *const collective_names[] = {"allreduce", "reduce-scatter", "allgather"};

static int queue_collective(nccl *n, collective c, const void *send, void *recv, int64_t count,
                            cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    ncclDataType_t t = ncclFloat32;
    ncclRedOp_t o = ncclSum;
    const char *what = collective_names[c];
    cudaStream_t s = n->stream;
    pthread_mutex_lock(&n->lock);
    int rc = prepare(n, what, count, dtype, op, &t, &o, err);
    if (rc == CDDP_OK) {
        ncclResult_t r = c == ALLREDUCE
                             ? n->l->ncclAllReduce(send, recv, (size_t)count, t, o, n->comm, s)
                         : c == REDUCE_SCATTER
                             ? n->l->ncclReduceScatter(send, recv, (size_t)count, t, o, n->comm, s)
                             : n->l->ncclAllGather(send, recv, (size_t)count, t, n->comm, s);
        rc = issued(n, r, what, err);
        if (rc == CDDP_OK) n->issued++;
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

static int nccl_allreduce(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return queue_collective(c, ALLREDUCE, send, recv, count, dtype, op, err);
}

static int nccl_reduce_scatter(void *c, const void *send, void *recv, int64_t count,
                               cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return queue_collective(c, REDUCE_SCATTER, send, recv, count, dtype, op, err);
}

static int nccl_allgather(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_error *err) {
    return queue_collective(c, ALLGATHER, send, recv, count, dtype, CDDP_COMM_SUM, err);
}

static int nccl_join(void *c, cddp_error *err) {
    nccl *n = c;
    pthread_mutex_lock(&n->lock);
    int rc = check(n, err);
    cddp_error e = {0};
    if (rc == CDDP_OK && (cddp_queue_record(n->queue, n->done, &e) != CDDP_OK ||
                          cddp_device_wait_event(n->dev, n->done, &e) != CDDP_OK))
        rc = device_failed(n, &e, "ordering after the collectives", err);
    pthread_mutex_unlock(&n->lock);
    return rc;
}

/* One look at the collectives queued before ev, under lock: *running while they run within the
 * deadline (CDDP_OK); else CDDP_OK when they ran, or the failure: NCCL's asynchronous error or
 * the deadline passed (latched, the communicator aborted: its kernels then end), or the device's.
 * A peer that died leaves NCCL's kernels waiting for ever, so the event is polled, never waited
 * on. */
static int poll_event(nccl *n, cddp_event *ev, double deadline, bool *running, cddp_error *err) {
    *running = false;
    bool done = false;
    cddp_error e = {0};
    if (cddp_event_query(ev, &done, &e) != CDDP_OK)
        return device_failed(n, &e, "waiting for the collectives", err);
    if (done) return CDDP_OK;
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

/* Waits for the queue's work, polling an event after it (poll_event), then for NCCL's own
 * settling. Where there is no stream (the CPU), the collectives ran when they were called. */
static int wait_locked(nccl *n, cddp_error *err) {
    CDDP_TRY(check(n, err));
    double deadline = cddp_now_s() + n->timeout;
    if (n->stream) {
        cddp_error e = {0};
        if (cddp_queue_record(n->queue, n->waited, &e) != CDDP_OK)
            return device_failed(n, &e, "waiting for the collectives", err);
        bool running = true;
        int rc = CDDP_OK;
        while (running && (rc = poll_event(n, n->waited, deadline, &running, err)) == CDDP_OK &&
               running)
            usleep(200);
        CDDP_TRY(rc);
    }
    CDDP_TRY(settle(n, "a collective", deadline, err));
    atomic_store(&n->known_done, n->issued);
    return CDDP_OK;
}

static int nccl_wait(void *c, cddp_error *err) {
    nccl *n = c;
    pthread_mutex_lock(&n->lock);
    int rc = wait_locked(n, err);
    pthread_mutex_unlock(&n->lock);
    return rc;
}

/* The oldest watched event, under lock: false while its collectives still run within their time;
 * else it is dropped (run, or the communicator failed: poll_event latches NCCL's failure, the
 * timeout or the device's), the failure shown by the next call. */
static bool poll_oldest(nccl *n) {
    watched *w = &n->ring[n->head];
    if (!n->failed.code) {
        bool running = false;
        cddp_error e = {0};
        if (poll_event(n, w->ev, w->deadline, &running, &e) != CDDP_OK && !n->failed.code)
            n->failed = e;
        if (running) return false;
        if (!n->failed.code) atomic_store(&n->known_done, w->issued);
    }
    n->head = (n->head + 1) % WATCHED;
    n->count--;
    return true;
}

/* The watchdog: polls the watched events, oldest first, every 0.5 ms while there are some. */
static void *watchdog(void *arg) {
    nccl *n = arg;
    cddp_device_make_current(n->dev, NULL);
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

static int nccl_watch(void *c, cddp_error *err) {
    nccl *n = c;
    if (!n->stream) return nccl_wait(n, err); /* the CPU: they ran when they were called */
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
    watched *w = &n->ring[(n->head + n->count) % WATCHED];
    cddp_error e = {0};
    if (rc == CDDP_OK && ((!w->ev && !(w->ev = cddp_event_create(n->dev, &e))) ||
                          cddp_queue_record(n->queue, w->ev, &e) != CDDP_OK))
        rc = device_failed(n, &e, "watching the collectives", err);
    if (rc == CDDP_OK) {
        w->deadline = cddp_now_s() + n->timeout;
        w->issued = n->issued;
        n->count++;
        pthread_cond_signal(&n->wake);
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

static uint64_t nccl_known_done(void *c) {
    return atomic_load(&((nccl *)c)->known_done);
}

static void nccl_destroy(void *c) {
    nccl *n = c;
    if (!n) return;
    if (n->watching) {
        pthread_mutex_lock(&n->lock);
        n->stop = true;
        pthread_cond_signal(&n->wake);
        pthread_mutex_unlock(&n->lock);
        pthread_join(n->watchdog, NULL);
    }
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

const cddp__dtransport cddp__nccl_dtransport = {
    .info = {.name = "nccl",
             .says = "NCCL",
             .how = "by NCCL, on a stream of its own",
             .on_device = true},
    .offer = nccl_offer,
    .serves = nccl_serves,
    .open = nccl_open,
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .join = nccl_join,
    .wait = nccl_wait,
    .watch = nccl_watch,
    .known_done = nccl_known_done,
    .destroy = nccl_destroy,
};
