/* device.c: the device calls every device shares: the public memory and copy calls, which go
 * through the device's table, and a kernel's scratch and failure reports (see device.h). */
#include "tensor/device.h"

#include <stdio.h>

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

int cddp_device_synchronize(cddp_device *dev, cddp_error *err) {
    return dev->ops->synchronize(dev, NULL, err);
}

void *cddp_device_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    return dev->ops->alloc(dev, bytes, err);
}

void cddp_device_free(cddp_device *dev, void *p) {
    if (p) dev->ops->free(dev, p);
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
