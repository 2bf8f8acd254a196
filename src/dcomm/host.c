/* host.c: the host transport (cddp/dcomm.h's "host"): each collective's data copied to host memory
 * after the device's work queued so far, reduced there by the group's own transport (shared
 * memory, TCP, MPI: any group, across hosts too) on its communication thread, and copied back at
 * the join. On a device whose memory the host reads (the CPU), the group works on it directly. */
#include "dcomm/internal.h"

#include "cddp/internal/device.h"

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
    cddp_device_host_copy_free(h->dev, s->host, s->locked);
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
    s->host = cddp_device_host_copy(h->dev, bytes, &s->locked);
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

static void *host_open(cddp_comm *group, cddp_device *dev, const cddp_dcomm_options *o,
                       cddp_error *err) {
    host_comm *h = cddp_calloc(1, sizeof *h);
    if (h)
        *h = (host_comm){
            .group = group, .dev = dev, .timeout = o->timeout_s > 0 ? o->timeout_s : -1};
    else
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return h;
}

const cddp__dtransport cddp__host_dtransport = {
    .info = {.name = "host",
             .says = "host",
             .how = "through host copies and the group's transport"},
    .join_waits = true,
    .open = host_open,
    .allreduce = host_allreduce,
    .reduce_scatter = host_reduce_scatter,
    .allgather = host_allgather,
    .join = host_join,
    .wait = host_wait,
    .watch = host_watch,
    .destroy = host_destroy,
};
