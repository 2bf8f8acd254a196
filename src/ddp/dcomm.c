/* dcomm.c: collectives on a device's memory through one of three transports (cddp/dcomm.h): host
 * copies (here), CUDA IPC's communicator (ipc.c) or NCCL's (nccl.c), behind one table chosen when
 * the communicator is made; and the choice AUTO makes, which DistributedDataParallel makes too. */
#include "ddp/internal.h"

#include "cddp/ipc.h"

#include <stdio.h>
#include <string.h>

typedef struct transport {
    const char *name;
    int (*allreduce)(void *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dtype,
                     cddp_comm_op op, cddp_error *err);
    int (*reduce_scatter)(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err);
    int (*allgather)(void *c, const void *send, void *recv, int64_t count, cddp_comm_dtype dtype,
                     cddp_error *err);
    int (*join)(void *c, cddp_error *err);
    int (*wait)(void *c, cddp_error *err); /* after the join: the host waits for the results */
    int (*watch)(void *c, cddp_error *err);
    void (*destroy)(void *c);
} transport;

struct cddp_dcomm {
    const transport *t;
    void *c; /* the transport's communicator */
};

/* ---- host copies ---------------------------------------------------------------------------- */

/* A queued collective: its host copy (page-locked where the device has such memory, cap bytes),
 * the event after the copy to the host, what runs on the group's thread, what goes back at the
 * join, and the event after that copy back (before which the host copy may not be freed).
 *
 * A host copy is reused by the next collectives as soon as it is joined, its copy back perhaps not
 * run yet: the device's copies into and out of it are all queued on its default queue, in order,
 * and the group's thread writes it only after the `ready` event of the next copy into it. */
typedef struct staged {
    char *host;
    size_t cap;
    bool locked;
    cddp_event *ready, *done;
    cddp_comm_work *pre, *work;
    void *dst;
    size_t from, bytes; /* host + from -> dst */
} staged;

/* Host copies kept for the next collectives: page-locked memory is slow to get and, on a GPU,
 * freeing it waits for the device. Past this many, a joined one is let go (after its copy back). */
#define POOL_KEEP 16

typedef struct host_comm {
    cddp_comm *group;
    cddp_device *dev;
    double timeout;
    staged **q; /* the collectives queued since the last join (each where the group's thread
                 * reaches it until then: q grows, they do not move) */
    int n, cap;
    staged *pool[POOL_KEEP]; /* joined host copies, for the next collectives */
    int npool;
    cddp_error failed; /* latched */
} host_comm;

static int host_fail(host_comm *h, const cddp_error *e, cddp_error *err) {
    if (!h->failed.code) h->failed = *e;
    *err = h->failed;
    return h->failed.code;
}

static int wait_ready(void *s, cddp_error *err) {
    return cddp_event_synchronize(((staged *)s)->ready, err);
}

/* Frees s once its copy back has run. */
static void staged_free(host_comm *h, staged *s) {
    if (s->done) cddp_event_synchronize(s->done, NULL);
    cddp__ddp_host_copy_free(h->dev, s->host, s->locked);
    cddp_event_destroy(s->ready);
    cddp_event_destroy(s->done);
    cddp_free(s);
}

/* A host copy of at least `bytes` for the next collective: the smallest pooled one that holds
 * it, else a new one. NULL when out of memory. */
static staged *staged_get(host_comm *h, size_t bytes) {
    int best = -1;
    for (int i = 0; i < h->npool; i++)
        if (h->pool[i]->cap >= bytes && (best < 0 || h->pool[i]->cap < h->pool[best]->cap))
            best = i;
    if (best >= 0) {
        staged *s = h->pool[best];
        h->pool[best] = h->pool[--h->npool];
        return s;
    }
    staged *s = cddp_calloc(1, sizeof *s);
    if (!s) return NULL;
    cddp_error e = {0};
    s->cap = bytes;
    s->host = cddp__ddp_host_copy(h->dev, bytes, &s->locked);
    if (!s->host || !(s->ready = cddp_event_create(h->dev, &e)) ||
        !(s->done = cddp_event_create(h->dev, &e))) {
        staged_free(h, s);
        return NULL;
    }
    return s;
}

/* s joined: into the pool, or freed when the pool is full. */
static void staged_put(host_comm *h, staged *s) {
    if (h->npool < POOL_KEEP)
        h->pool[h->npool++] = s;
    else
        staged_free(h, s);
}

/* Queues kind's collective on a host copy of `bytes`, into which the device's `in` bytes at `into`
 * are copied first; the join copies `back` bytes from `from` into dst. */
typedef enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER } kind;

static int host_queue(host_comm *h, kind k, const void *in, size_t in_bytes, size_t into,
                      size_t bytes, void *dst, size_t from, size_t back, int64_t count,
                      cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    if (h->failed.code) return host_fail(h, &h->failed, err);
    cddp_error e = {0};
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 8;
        staged **q = cddp_realloc(h->q, (size_t)cap * sizeof *q);
        if (!q) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        h->q = q, h->cap = cap;
    }
    staged *s = staged_get(h, bytes);
    if (!s)
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for a host copy of %zu bytes",
                              bytes);
    s->dst = dst, s->from = from, s->bytes = back, s->pre = s->work = NULL;
    h->q[h->n++] = s;
    char *at = s->host;
    if (cddp_device_download_async(h->dev, at + into, in, in_bytes, &e) != CDDP_OK ||
        cddp_event_record(s->ready, &e) != CDDP_OK ||
        !(s->pre = cddp_comm_call_async(h->group, wait_ready, s, &e)))
        return host_fail(h, &e, err);
    size_t es = cddp_comm_dtype_size(dtype);
    int rank = cddp_comm_rank(h->group);
    s->work = k == ALLREDUCE
                  ? cddp_comm_allreduce_async(h->group, at, at, count, dtype, op, h->timeout, &e)
              : k == REDUCE_SCATTER
                  ? cddp_comm_reduce_scatter_async(h->group, at, at + (size_t)rank * count * es,
                                                   count, dtype, op, h->timeout, &e)
                  : cddp_comm_allgather_async(h->group, at + (size_t)rank * count * es, at, count,
                                              dtype, h->timeout, &e);
    return s->work ? CDDP_OK : host_fail(h, &e, err);
}

static int host_allreduce(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    host_comm *h = c;
    if (cddp_device_host_accessible(h->dev))
        return cddp_comm_allreduce(h->group, send, recv, count, dtype, op, h->timeout, err);
    size_t b = (size_t)count * cddp_comm_dtype_size(dtype);
    return host_queue(h, ALLREDUCE, send, b, 0, b, recv, 0, b, count, dtype, op, err);
}

static int host_reduce_scatter(void *c, const void *send, void *recv, int64_t count,
                               cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    host_comm *h = c;
    if (cddp_device_host_accessible(h->dev))
        return cddp_comm_reduce_scatter(h->group, send, recv, count, dtype, op, h->timeout, err);
    size_t b = (size_t)count * cddp_comm_dtype_size(dtype),
           all = b * (size_t)cddp_comm_size(h->group);
    return host_queue(h, REDUCE_SCATTER, send, all, 0, all, recv,
                      b * (size_t)cddp_comm_rank(h->group), b, count, dtype, op, err);
}

static int host_allgather(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_error *err) {
    host_comm *h = c;
    if (cddp_device_host_accessible(h->dev))
        return cddp_comm_allgather(h->group, send, recv, count, dtype, h->timeout, err);
    size_t b = (size_t)count * cddp_comm_dtype_size(dtype),
           all = b * (size_t)cddp_comm_size(h->group);
    return host_queue(h, ALLGATHER, send, b, b * (size_t)cddp_comm_rank(h->group), all, recv, 0,
                      all, count, dtype, CDDP_COMM_SUM, err);
}

/* Every queued collective waited for (all of them, also after a failure: none may outlive the
 * join), its result copied back on the device's default queue (queued: the host waits for the
 * group's collectives, not for the device), its host copy into the pool. */
static int host_join(void *c, cddp_error *err) {
    host_comm *h = c;
    for (int i = 0; i < h->n; i++) {
        staged *s = h->q[i];
        cddp_error e = {0};
        /* both waited for whatever the first says: the group's thread may still read the copy */
        int rc = s->pre ? cddp_comm_wait(s->pre, -1, &e) : CDDP_OK;
        if (s->work && cddp_comm_wait(s->work, -1, rc == CDDP_OK ? &e : NULL) != CDDP_OK &&
            rc == CDDP_OK)
            rc = e.code;
        if (rc == CDDP_OK && !h->failed.code &&
            cddp_device_upload_async(h->dev, s->dst, s->host + s->from, s->bytes, &e) == CDDP_OK)
            rc = cddp_event_record(s->done, &e);
        else if (rc == CDDP_OK && !h->failed.code)
            rc = e.code;
        if (rc != CDDP_OK && !h->failed.code) h->failed = e;
        staged_put(h, s);
    }
    h->n = 0;
    return h->failed.code ? host_fail(h, &h->failed, err) : CDDP_OK;
}

static int host_wait(void *c, cddp_error *err) {
    host_comm *h = c;
    cddp_error e = {0};
    if (cddp_device_synchronize(h->dev, &e) != CDDP_OK) return host_fail(h, &e, err);
    return CDDP_OK;
}

static int host_watch(void *c, cddp_error *err) {
    host_comm *h = c;
    return h->failed.code ? host_fail(h, &h->failed, err) : CDDP_OK;
}

static void host_destroy(void *c) {
    host_comm *h = c;
    cddp_error e = {0};
    host_join(h, &e);
    for (int i = 0; i < h->npool; i++) staged_free(h, h->pool[i]);
    cddp_free(h->q);
    cddp_free(h);
}

static const transport host = {"host",    host_allreduce, host_reduce_scatter, host_allgather,
                               host_join, host_wait,      host_watch,          host_destroy};

/* ---- NCCL and CUDA IPC ---------------------------------------------------------------------- */

static int nccl_allreduce(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_nccl_allreduce(c, send, recv, count, dtype, op, err);
}
static int nccl_reduce_scatter(void *c, const void *send, void *recv, int64_t count,
                               cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_nccl_reduce_scatter(c, send, recv, count, dtype, op, err);
}
static int nccl_allgather(void *c, const void *send, void *recv, int64_t count,
                          cddp_comm_dtype dtype, cddp_error *err) {
    return cddp_nccl_allgather(c, send, recv, count, dtype, err);
}
static int nccl_join(void *c, cddp_error *err) {
    return cddp_nccl_join(c, err);
}
static int nccl_wait(void *c, cddp_error *err) {
    return cddp_nccl_wait(c, err);
}
static int nccl_watch(void *c, cddp_error *err) {
    return cddp_nccl_watch(c, err);
}
static void nccl_destroy(void *c) {
    cddp_nccl_destroy(c);
}

static const transport nccl = {"NCCL",    nccl_allreduce, nccl_reduce_scatter, nccl_allgather,
                               nccl_join, nccl_wait,      nccl_watch,          nccl_destroy};

static int ipc_allreduce(void *c, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_ipc_allreduce(c, send, recv, count, dtype, op, err);
}
static int ipc_reduce_scatter(void *c, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return cddp_ipc_reduce_scatter(c, send, recv, count, dtype, op, err);
}
static int ipc_allgather(void *c, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_error *err) {
    return cddp_ipc_allgather(c, send, recv, count, dtype, err);
}
static int ipc_join(void *c, cddp_error *err) {
    return cddp_ipc_join(c, err);
}
static int ipc_wait(void *c, cddp_error *err) {
    return cddp_ipc_wait(c, err);
}
static int ipc_check(void *c, cddp_error *err) {
    return cddp_ipc_check(c, err);
}
static void ipc_destroy(void *c) {
    cddp_ipc_destroy(c);
}

static const transport ipc = {"CUDA IPC", ipc_allreduce, ipc_reduce_scatter, ipc_allgather,
                              ipc_join,   ipc_wait,      ipc_check,          ipc_destroy};

/* ---- the choice ------------------------------------------------------------------------------ */

static const char *const spellings[] = {"auto", "host", "ipc", "nccl"};

const char *cddp_dcomm_transport_spelling(cddp_dcomm_transport t) {
    return (unsigned)t <= CDDP_DCOMM_NCCL ? spellings[t] : "unknown";
}

int cddp_dcomm_transport_parse(const char *name, cddp_dcomm_transport *t, cddp_error *err) {
    for (unsigned i = 0; name && i <= CDDP_DCOMM_NCCL; i++)
        if (strcmp(name, spellings[i]) == 0) {
            *t = (cddp_dcomm_transport)i;
            return CDDP_OK;
        }
    return cddp_error_set(err, CDDP_EINVAL,
                          "'%s' is not a transport: expected auto, host, ipc or nccl",
                          name ? name : "(null)");
}

static const char *kind_name(int64_t k) {
    return k == CDDP_DEVICE_CPU ? "cpu" : k == CDDP_DEVICE_EMU ? "emu" : "cuda";
}

cddp_dcomm_transport cddp__dcomm_decide(const cddp__placement *all, int world, char *why,
                                        size_t n) {
    int a = 0, b = 0;
    if (world == 1) {
        snprintf(why, n, "one rank: nothing travels");
        return CDDP_DCOMM_HOST;
    }
    for (int r = 1; r < world; r++)
        if (all[r].kind != all[0].kind) {
            snprintf(why, n, "the ranks' devices are of different kinds (rank 0 %s, rank %d %s)",
                     kind_name(all[0].kind), r, kind_name(all[r].kind));
            return CDDP_DCOMM_HOST;
        }
    if (all[0].kind == CDDP_DEVICE_CPU) {
        snprintf(why, n, "the CPU: the group's transport works on the memory itself");
        return CDDP_DCOMM_HOST;
    }
    if (all[0].kind != CDDP_DEVICE_CUDA) {
        snprintf(why, n,
                 "NCCL moves GPU memory only, not the emulated device's; ipc shares it when "
                 "named");
        return CDDP_DCOMM_HOST;
    }
    for (int r = 0; r < world; r++)
        if (all[r].nccl <= 0) {
            snprintf(why, n,
                     "NCCL does not open on rank %d (libnccl.so.2, or CDDP_NCCL_LIBRARY; "
                     "cddp_nccl_version is 0 there)",
                     r);
            return CDDP_DCOMM_HOST;
        }
    if (cddp__placement_shared(all, world, &a, &b)) {
        snprintf(why, n,
                 "ranks %d and %d share a GPU, which NCCL refuses (ipc, named, reads each "
                 "other's memory instead)",
                 a, b);
        return CDDP_DCOMM_HOST;
    }
    int64_t v = all[0].nccl;
    snprintf(why, n, "one rank per GPU, NCCL on every rank (%d.%d.%d on rank 0)", (int)(v / 10000),
             (int)(v / 100 % 100), (int)(v % 100));
    return CDDP_DCOMM_NCCL;
}

int cddp_dcomm_choose(cddp_comm *group, cddp_device *dev, cddp_dcomm_transport *t, char *why,
                      size_t why_size, cddp_error *err) {
    int world = cddp_comm_size(group);
    cddp__placement *all = cddp_calloc((size_t)world, sizeof *all);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int64_t v = cddp_device_kind_of(dev) == CDDP_DEVICE_CUDA ? cddp_nccl_version(NULL) : 0;
    int rc = cddp__placement_gather(group, dev, v, all, err);
    if (rc == CDDP_OK) *t = cddp__dcomm_decide(all, world, why, why_size);
    cddp_free(all);
    return rc;
}

/* ---- the communicator ----------------------------------------------------------------------- */

cddp_dcomm *cddp__dcomm_open(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *opts,
                             cddp_error *err) {
    cddp_dcomm_options o = opts ? *opts : (cddp_dcomm_options){0};
    if (o.transport == CDDP_DCOMM_AUTO || (unsigned)o.transport > CDDP_DCOMM_NCCL) {
        cddp_error_set(err, CDDP_EINVAL, "cddp_dcomm_create: unknown transport %d",
                       (int)o.transport);
        return NULL;
    }
    cddp_dcomm *d = cddp_calloc(1, sizeof *d);
    if (!d) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    if (o.transport == CDDP_DCOMM_NCCL) {
        d->t = &nccl;
        d->c = cddp_nccl_create(group, dev, &(cddp_nccl_options){.timeout_s = o.timeout_s}, err);
    } else if (o.transport == CDDP_DCOMM_IPC) {
        d->t = &ipc;
        d->c = cddp_ipc_create(
            group, dev,
            &(cddp_ipc_options){.scratch_bytes = o.scratch_bytes, .timeout_s = o.timeout_s}, err);
    } else {
        host_comm *h = cddp_calloc(1, sizeof *h);
        if (h)
            *h = (host_comm){
                .group = group, .dev = dev, .timeout = o.timeout_s > 0 ? o.timeout_s : -1};
        else
            cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        d->t = &host;
        d->c = h;
    }
    if (!d->c) {
        cddp_free(d);
        return NULL;
    }
    return d;
}

const char *cddp__dcomm_how(cddp_dcomm_transport t, cddp_device *dev) {
    return t == CDDP_DCOMM_NCCL ? "by NCCL, on a stream of its own"
           : t == CDDP_DCOMM_IPC
               ? "through CUDA IPC (each rank sums its part from the others' memory), on a stream "
                 "of its own"
           : cddp_device_host_accessible(dev) ? "by the group's transport, on the memory itself"
                                              : "through host copies and the group's transport";
}

cddp_dcomm *cddp_dcomm_create(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *opts,
                              cddp_error *err) {
    cddp_dcomm_options o = opts ? *opts : (cddp_dcomm_options){0};
    char why[200];
    snprintf(why, sizeof why, "transport %s, as named", cddp_dcomm_transport_spelling(o.transport));
    if (o.transport == CDDP_DCOMM_AUTO &&
        cddp_dcomm_choose(group, dev, &o.transport, why, sizeof why, err) != CDDP_OK)
        return NULL;
    cddp_dcomm *d = cddp__dcomm_open(group, dev, &o, err);
    if (d)
        cddp_log(cddp_comm_rank(group) == 0 ? CDDP_LOG_INFO : CDDP_LOG_DEBUG, "dcomm",
                 "collectives on %s's memory: %s (%s%s)", cddp_device_name(dev),
                 cddp__dcomm_how(o.transport, dev),
                 opts && opts->transport != CDDP_DCOMM_AUTO ? "" : "auto: ", why);
    return d;
}

const char *cddp_dcomm_transport_name(const cddp_dcomm *d) {
    return d->t->name;
}

int cddp_dcomm_allreduce(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return d->t->allreduce(d->c, send, recv, count, dtype, op, err);
}

int cddp_dcomm_reduce_scatter(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                              cddp_comm_dtype dtype, cddp_comm_op op, cddp_error *err) {
    return d->t->reduce_scatter(d->c, send, recv, count, dtype, op, err);
}

int cddp_dcomm_allgather(cddp_dcomm *d, const void *send, void *recv, int64_t count,
                         cddp_comm_dtype dtype, cddp_error *err) {
    return d->t->allgather(d->c, send, recv, count, dtype, err);
}

int cddp_dcomm_join(cddp_dcomm *d, cddp_error *err) {
    return d->t->join(d->c, err);
}

int cddp_dcomm_wait(cddp_dcomm *d, cddp_error *err) {
    CDDP_TRY(d->t->join(d->c, err));
    return d->t->wait(d->c, err);
}

int cddp_dcomm_watch(cddp_dcomm *d, cddp_error *err) {
    return d->t->watch(d->c, err);
}

void cddp_dcomm_destroy(cddp_dcomm *d) {
    if (!d) return;
    d->t->destroy(d->c);
    cddp_free(d);
}
