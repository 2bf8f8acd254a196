/* device.c: the device calls every device shares: the public memory and copy calls, which go
 * through the device's table, and a kernel's scratch and failure reports (see device.h). */
#include "tensor/device.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void *cddp__kq_scratch(cddp__kq *q, size_t bytes) {
    if (q->scratch) return q->scratch(q, bytes);
    cddp__kq_fail(q, CDDP_ESTATE, "a kernel on %s needs scratch memory, and runs outside a context",
                  q->dev->name);
    return NULL;
}

void cddp__kq_fail(cddp__kq *q, int code, const char *fmt, ...) {
    char msg[CDDP_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (q->fail)
        q->fail(q, code, msg);
    else
        cddp_log(CDDP_LOG_ERROR, "device", "%s: %s", q->dev->name, msg);
}

cddp__kq cddp__device_kq(cddp_device *dev) {
    return (cddp__kq){.dev = dev};
}

const char *cddp_device_name(const cddp_device *dev) {
    return dev->name;
}

cddp_device_kind cddp_device_kind_of(const cddp_device *dev) {
    return dev->kind;
}

int cddp_device_index(const cddp_device *dev) {
    return dev->index;
}

bool cddp_device_host_accessible(const cddp_device *dev) {
    return dev->host_access;
}

const char *cddp_device_describe(const cddp_device *dev) {
    return dev->describe;
}

const char *cddp_device_bus_id(const cddp_device *dev) {
    return dev->bus_id[0] ? dev->bus_id : dev->name;
}

void *cddp_device_native_queue(cddp_device *dev) {
    return dev->ops->native_queue ? dev->ops->native_queue(dev, NULL) : NULL;
}

const char *cddp_device_platform(const cddp_device *dev) {
    return dev->platform;
}

int cddp_device_make_current(cddp_device *dev, cddp_error *err) {
    return dev->ops->make_current ? dev->ops->make_current(dev, err) : CDDP_OK;
}

int cddp_device_synchronize(cddp_device *dev, cddp_error *err) {
    return dev->ops->synchronize(dev, NULL, err);
}

void *cddp_device_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    return dev->ops->alloc(dev, bytes, err);
}

void cddp_device_free(cddp_device *dev, void *p) {
    if (p) dev->ops->free(dev, p);
}

int cddp_device_computes(cddp_device *dev, cddp_dtype dtype, const char **how, cddp_error *err) {
    return dev->k->computes(dtype, how, err);
}

int cddp_device_upload(cddp_device *dev, void *dst, const void *src, size_t bytes,
                       cddp_error *err) {
    return bytes ? dev->ops->upload(dev, NULL, dst, src, bytes, err) : CDDP_OK;
}

int cddp_device_download(cddp_device *dev, void *dst, const void *src, size_t bytes,
                         cddp_error *err) {
    return bytes ? dev->ops->download(dev, NULL, dst, src, bytes, err) : CDDP_OK;
}

int cddp_device_copy(cddp_device *dev, void *dst, const void *src, size_t bytes, cddp_error *err) {
    return bytes && dst != src ? dev->ops->copy(dev, NULL, dst, src, bytes, err) : CDDP_OK;
}

int cddp_device_memset(cddp_device *dev, void *dst, int byte, size_t bytes, cddp_error *err) {
    return bytes ? dev->ops->memset(dev, NULL, dst, byte, bytes, err) : CDDP_OK;
}

int cddp_device_release(cddp_device *dev, void *p, size_t bytes, cddp_error *err) {
    if (!bytes) return CDDP_OK;
    return dev->ops->release ? dev->ops->release(dev, p, bytes, err)
                             : dev->ops->memset(dev, NULL, p, 0, bytes, err);
}

int cddp_device_download_async(cddp_device *dev, void *dst, const void *src, size_t bytes,
                               cddp_error *err) {
    return bytes ? dev->ops->download_async(dev, NULL, dst, src, bytes, err) : CDDP_OK;
}

int cddp_device_upload_async(cddp_device *dev, void *dst, const void *src, size_t bytes,
                             cddp_error *err) {
    if (!bytes) return CDDP_OK;
    return dev->ops->upload_async ? dev->ops->upload_async(dev, NULL, dst, src, bytes, err)
                                  : dev->ops->upload(dev, NULL, dst, src, bytes, err);
}

struct cddp_event {
    cddp_device *dev;
    void *ev; /* the device's */
};

cddp_event *cddp_event_create(cddp_device *dev, cddp_error *err) {
    cddp_event *e = cddp_calloc(1, sizeof *e);
    if (!e) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory for an event");
        return NULL;
    }
    e->dev = dev;
    if (!(e->ev = dev->ops->event_create(dev, err))) {
        cddp_free(e);
        return NULL;
    }
    return e;
}

void cddp_event_destroy(cddp_event *e) {
    if (!e) return;
    e->dev->ops->event_destroy(e->dev, e->ev);
    cddp_free(e);
}

int cddp_event_record(cddp_event *e, cddp_error *err) {
    return e->dev->ops->event_record(e->dev, NULL, e->ev, err);
}

int cddp_event_synchronize(cddp_event *e, cddp_error *err) {
    return e->dev->ops->event_synchronize(e->dev, e->ev, err);
}

int cddp_event_query(cddp_event *e, bool *done, cddp_error *err) {
    *done = true;
    return e->dev->ops->event_query ? e->dev->ops->event_query(e->dev, e->ev, done, err) : CDDP_OK;
}

/* ---- host memory and queues of one's own ---------------------------------------------------- */

void *cddp_device_host_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    if (dev->ops->host_alloc) return dev->ops->host_alloc(dev, bytes ? bytes : 1, err);
    void *p = cddp_aligned_alloc(bytes ? bytes : 1);
    if (!p) cddp_error_set(err, CDDP_ENOMEM, "cannot allocate %zu MiB of host memory", bytes >> 20);
    return p;
}

void cddp_device_host_free(cddp_device *dev, void *p) {
    if (!p) return;
    if (dev->ops->host_free)
        dev->ops->host_free(dev, p);
    else
        cddp_aligned_free(p);
}

void *cddp_device_host_copy(cddp_device *dev, size_t bytes, bool *locked) {
    cddp_error e = {0};
    void *p = cddp_device_host_alloc(dev, bytes ? bytes : 1, &e);
    if ((*locked = p != NULL)) return p;
    cddp_log(CDDP_LOG_DEBUG, "device", "a host copy in pageable memory: %s", e.msg);
    return cddp_aligned_alloc(bytes + 64);
}

void cddp_device_host_copy_free(cddp_device *dev, void *p, bool locked) {
    if (locked)
        cddp_device_host_free(dev, p);
    else
        cddp_aligned_free(p);
}

int cddp_device_host_register(cddp_device *dev, void *p, size_t bytes, cddp_error *err) {
    return dev->ops->host_register && bytes ? dev->ops->host_register(dev, p, bytes, err) : CDDP_OK;
}

void cddp_device_host_unregister(cddp_device *dev, void *p) {
    if (p && dev->ops->host_unregister) dev->ops->host_unregister(dev, p);
}

struct cddp_queue {
    cddp_device *dev;
    void *q; /* the device's; NULL on a device without queues of its own (the CPU) */
};

static cddp_queue *queue_create(cddp_device *dev, bool first, cddp_error *err) {
    cddp_queue *q = cddp_calloc(1, sizeof *q);
    if (!q) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory for a queue");
        return NULL;
    }
    q->dev = dev;
    if (dev->ops->queue_create && !(q->q = dev->ops->queue_create(dev, first, err))) {
        cddp_free(q);
        return NULL;
    }
    return q;
}

cddp_queue *cddp_queue_create(cddp_device *dev, cddp_error *err) {
    return queue_create(dev, false, err);
}

cddp_queue *cddp_queue_create_first(cddp_device *dev, cddp_error *err) {
    return queue_create(dev, true, err);
}

void *cddp_queue_native(cddp_queue *q) {
    return q->dev->ops->native_queue ? q->dev->ops->native_queue(q->dev, q->q) : NULL;
}

void cddp_queue_destroy(cddp_queue *q) {
    if (!q) return;
    if (q->q) q->dev->ops->queue_destroy(q->dev, q->q);
    cddp_free(q);
}

cddp_device *cddp_queue_device(const cddp_queue *q) {
    return q->dev;
}

int cddp_queue_upload(cddp_queue *q, void *dst, const void *src, size_t bytes, cddp_error *err) {
    if (!bytes) return CDDP_OK;
    const cddp__device_ops *o = q->dev->ops;
    return o->upload_async ? o->upload_async(q->dev, q->q, dst, src, bytes, err)
                           : o->upload(q->dev, q->q, dst, src, bytes, err);
}

static int same_device(const cddp_queue *q, const cddp_event *e, const char *what,
                       cddp_error *err) {
    if (e->dev == q->dev) return CDDP_OK;
    return cddp_error_set(err, CDDP_EINVAL, "%s: the queue is on %s and the event on %s", what,
                          q->dev->name, e->dev->name);
}

int cddp_queue_record(cddp_queue *q, cddp_event *e, cddp_error *err) {
    CDDP_TRY(same_device(q, e, "cddp_queue_record", err));
    return q->dev->ops->event_record(q->dev, q->q, e->ev, err);
}

int cddp_queue_wait(cddp_queue *q, cddp_event *e, cddp_error *err) {
    CDDP_TRY(same_device(q, e, "cddp_queue_wait", err));
    return q->dev->ops->queue_wait ? q->dev->ops->queue_wait(q->dev, q->q, e->ev, err) : CDDP_OK;
}

int cddp_device_wait_event(cddp_device *dev, cddp_event *e, cddp_error *err) {
    if (e->dev != dev)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_device_wait_event: the device is %s and the event on %s",
                              dev->name, e->dev->name);
    return dev->ops->queue_wait ? dev->ops->queue_wait(dev, NULL, e->ev, err) : CDDP_OK;
}

int cddp_queue_copy(cddp_queue *q, void *dst, const void *src, size_t bytes, cddp_error *err) {
    return bytes && dst != src ? q->dev->ops->copy(q->dev, q->q, dst, src, bytes, err) : CDDP_OK;
}

void cddp_queue_accumulate(cddp_queue *q, float *dst, const float *src, size_t n, bool assign) {
    cddp__kq k = {.dev = q->dev, .queue = q->q};
    CDDP__K(&k, accumulate, .dst = dst, .src = src, .n = (int64_t)n, .assign = assign);
}

void cddp_queue_scale(cddp_queue *q, float *x, size_t n, float s) {
    cddp__kq k = {.dev = q->dev, .queue = q->q};
    CDDP__K(&k, scale, .y = x, .x = x, .s = s, .n = (int64_t)n);
}

/* ---- shared with other processes ------------------------------------------------------------ */

bool cddp_device_ipc_capable(const cddp_device *dev) {
    return dev->ops->ipc_export != NULL;
}

static int no_ipc(const cddp_device *dev, cddp_error *err) {
    return cddp_error_set(err, CDDP_EUNSUPPORTED,
                          "%s does not share its memory with other processes (a GPU does, and the "
                          "emulated device)",
                          dev->name);
}

/* What every handle opens with: which kind of device made it, whether it is an event, and which
 * process; the device's own bytes follow. */
typedef struct ipc_head {
    char magic[8];
    int32_t kind, event, pid, unused;
} ipc_head;

_Static_assert(sizeof(ipc_head) + CDDP__IPC_PAYLOAD == CDDP_IPC_HANDLE_BYTES,
               "a handle is its head and a device's payload");

static unsigned char *head_write(const cddp_device *dev, cddp_ipc_handle *h, bool event) {
    ipc_head head = {"cddpipc", (int32_t)dev->kind, event, (int32_t)getpid(), 0};
    memset(h, 0, sizeof *h);
    memcpy(h->bytes, &head, sizeof head);
    return h->bytes + sizeof head;
}

/* The exporting process, or -1 with err: a handle of another kind of device, of the other of
 * memory and events, or of this same process (which cannot open its own). */
static int head_read(const cddp_device *dev, const cddp_ipc_handle *h, bool event,
                     cddp_error *err) {
    ipc_head head;
    memcpy(&head, h->bytes, sizeof head);
    const char *what = event ? "an event" : "memory";
    if (memcmp(head.magic, "cddpipc", 8) != 0 || head.kind != (int32_t)dev->kind ||
        head.event != event) {
        cddp_error_set(err, CDDP_EINVAL,
                       "%s: not a handle of %s of this kind of device (exported by another kind, "
                       "or for the other of memory and events?)",
                       dev->name, what);
        return -1;
    }
    if (head.pid == (int32_t)getpid()) {
        cddp_error_set(err, CDDP_EINVAL,
                       "%s: a handle of %s exported by this same process (another process opens "
                       "it)",
                       dev->name, what);
        return -1;
    }
    return head.pid;
}

int cddp_device_ipc_export(cddp_device *dev, void *p, cddp_ipc_handle *h, cddp_error *err) {
    unsigned char *payload = head_write(dev, h, false);
    return dev->ops->ipc_export ? dev->ops->ipc_export(dev, p, payload, err) : no_ipc(dev, err);
}

void *cddp_device_ipc_open(cddp_device *dev, const cddp_ipc_handle *h, cddp_error *err) {
    if (!dev->ops->ipc_open) {
        no_ipc(dev, err);
        return NULL;
    }
    int pid = head_read(dev, h, false, err);
    return pid < 0 ? NULL : dev->ops->ipc_open(dev, h->bytes + sizeof(ipc_head), pid, err);
}

void cddp_device_ipc_close(cddp_device *dev, void *p) {
    if (p && dev->ops->ipc_close) dev->ops->ipc_close(dev, p);
}

/* An event made for sharing (its handle into out) or opened from another process's (in). */
static cddp_event *shared_event(cddp_device *dev, cddp_ipc_handle *out, const cddp_ipc_handle *in,
                                cddp_error *err) {
    const cddp__device_ops *o = dev->ops;
    if (out ? !o->ipc_event_create : !o->ipc_event_open) {
        no_ipc(dev, err);
        return NULL;
    }
    int pid = in ? head_read(dev, in, true, err) : 0;
    if (pid < 0) return NULL;
    cddp_event *e = cddp_calloc(1, sizeof *e);
    if (!e) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory for an event");
        return NULL;
    }
    e->dev = dev;
    if (!(e->ev = out ? o->ipc_event_create(dev, head_write(dev, out, true), err)
                      : o->ipc_event_open(dev, in->bytes + sizeof(ipc_head), pid, err))) {
        cddp_free(e);
        return NULL;
    }
    return e;
}

cddp_event *cddp_event_create_shared(cddp_device *dev, cddp_ipc_handle *h, cddp_error *err) {
    return shared_event(dev, h, NULL, err);
}

cddp_event *cddp_event_open_shared(cddp_device *dev, const cddp_ipc_handle *h, cddp_error *err) {
    return shared_event(dev, NULL, h, err);
}

int cddp_device_transfer(cddp_device *to, void *dst, cddp_device *from, const void *src,
                         size_t bytes, cddp_error *err) {
    if (bytes == 0) return CDDP_OK;
    if (to == from) return cddp_device_copy(to, dst, src, bytes, err);
    if (from->host_access) return to->ops->upload(to, NULL, dst, src, bytes, err);
    if (to->host_access) return from->ops->download(from, NULL, dst, src, bytes, err);
    void *bounce = cddp_malloc(bytes); /* two devices: through the host */
    if (!bounce)
        return cddp_error_set(err, CDDP_ENOMEM,
                              "out of memory for a %zu MiB copy from %s "
                              "to %s",
                              bytes >> 20, from->name, to->name);
    int rc = from->ops->download(from, NULL, bounce, src, bytes, err);
    if (rc == CDDP_OK) rc = to->ops->upload(to, NULL, dst, bounce, bytes, err);
    cddp_free(bounce);
    return rc;
}

/* ---- kernels on flat blocks ---------------------------------------------------------------- */

void cddp_device_sgd(cddp_device *dev, float *p, const float *grad, float *buf, size_t n,
                     const cddp_sgd_hparams *h) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, sgd, .p = p, .g = grad, .buf = buf, .n = (int64_t)n, .h = *h);
}

void cddp_device_adamw(cddp_device *dev, float *p, const float *grad, float *m, float *v, size_t n,
                       const cddp_adamw_hparams *h) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, adamw, .p = p, .g = grad, .m = m, .v = v, .n = (int64_t)n, .h = *h);
}

void cddp_device_lion(cddp_device *dev, float *p, const float *grad, float *m, size_t n,
                      const cddp_lion_hparams *h) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, lion, .p = p, .g = grad, .m = m, .n = (int64_t)n, .h = *h);
}

void cddp_device_scale(cddp_device *dev, float *x, size_t n, float s) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, scale, .y = x, .x = x, .s = s, .n = (int64_t)n);
}

void cddp_device_accumulate(cddp_device *dev, float *dst, const float *src, size_t n) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, accumulate, .dst = dst, .src = src, .n = (int64_t)n, .assign = false);
}

void cddp_device_to_half(cddp_device *dev, uint16_t *h, const float *x, size_t n, bool f16) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, cast16, .h = h, .f = (float *)x, .n = (int64_t)n, .f16 = f16, .scale = 1.0f);
}

void cddp_device_from_half(cddp_device *dev, float *x, const uint16_t *h, size_t n, bool f16,
                           float scale) {
    cddp__kq q = cddp__device_kq(dev);
    CDDP__K(&q, cast16, .h = (uint16_t *)h, .f = x, .n = (int64_t)n, .f16 = f16, .widen = true,
            .scale = scale);
}

/* A device's slot for results the host reads back (a sum), made on first use, one caller at a
 * time. */
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

int cddp_device_sum_squares(cddp_device *dev, const float *x, size_t n, double *out,
                            cddp_error *err) {
    cddp__kq q = cddp__device_kq(dev);
    if (dev->host_access) {
        CDDP__K(&q, sum_squares, .x = x, .out = out, .n = (int64_t)n);
        return CDDP_OK;
    }
    pthread_mutex_lock(&slot_lock);
    int rc = CDDP_OK;
    if (!dev->slot && !(dev->slot = cddp_device_alloc(dev, 64, err))) rc = CDDP_ENOMEM;
    if (rc == CDDP_OK) {
        CDDP__K(&q, sum_squares, .x = x, .out = dev->slot, .n = (int64_t)n);
        rc = cddp_device_download(dev, out, dev->slot, sizeof *out, err);
    }
    pthread_mutex_unlock(&slot_lock);
    return rc;
}
