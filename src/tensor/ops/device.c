/* device.c: moving a tensor to another device, differentiably (PyTorch's tensor.to(device)): the
 * copy's gradient comes back to the source's device and is added there. */
#include "tensor/internal.h"

/* n bytes from src on device from to dst on device to; the failure latched in ctx. */
static void copy_across(cddp_ctx *ctx, cddp_device *to, void *dst, cddp_device *from,
                        const void *src, size_t n) {
    cddp_error e = {0};
    int rc = cddp_device_transfer(to, dst, from, src, n, &e);
    if (rc != CDDP_OK)
        cddp_ctx_fail(ctx, rc, "copying %zu bytes from %s to %s: %s", n, from->name, to->name,
                      e.msg);
}

cddp_tensor *cddp_to(cddp_ctx *ctx, cddp_tensor *x, cddp_device *dev) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    CDDP_CHECK(dev, "cddp_to: no device given");
    if (x->device == dev) return x;
    cddp__cdev *d = cddp__ctx_dev(ctx, dev);
    cddp_tensor *out = cddp__empty(d, x->dtype, x->ndim, x->shape);
    if (!out) return NULL;
    out->block = x->block;
    copy_across(ctx, dev, out->data, x->device, x->data,
                (size_t)x->numel * cddp_dtype_size(x->dtype));
    if (!cddp__record_op(ctx, CDDP_OP_TO_DEVICE, out, 1, &x, NULL)) return NULL;
    return CDDP__FAILED(ctx) ? NULL : out;
}

/* The gradient comes back to x's device, then is stored or added there. */
void cddp__to_device_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0];
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp__cdev *d = cddp__ctx_dev(ctx, x->device);
    size_t bytes = (size_t)x->numel * sizeof(float);
    float *back = dx && d ? cddp__dalloc(d, bytes) : NULL;
    if (!back) return;
    copy_across(ctx, x->device, back, n->out->device, n->out->grad, bytes);
    CDDP__K(&d->q, accumulate, .dst = dx, .src = back, .n = x->numel, .assign = assign);
}
