/* metrics.c: argmax and accuracy: what evaluation reads off logits (not differentiable). */
#include "tensor/internal.h"

cddp_tensor *cddp_argmax(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("argmax", x);
    CDDP_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] > 0, "argmax of an empty last dimension");
    int64_t C = x->shape[x->ndim - 1];
    cddp__cdev *d = CDDP__ON(ctx, "argmax", x);
    cddp_tensor *out = cddp__empty(d, CDDP_I64, x->ndim - 1, x->shape);
    if (!out) return NULL;
    CDDP__K(&d->q, argmax, .x = x->data, .out = out->data, .rows = out->numel, .C = C);
    return out;
}

int64_t cddp_count_correct(const cddp_tensor *logits, const cddp_tensor *labels) {
    cddp__need_f32("count_correct", logits);
    CDDP_CHECK(logits->ndim == 2 && labels->ndim == 1 && labels->shape[0] == logits->shape[0] &&
                   (labels->dtype == CDDP_I32 || labels->dtype == CDDP_I64),
               "count_correct: logits %s and labels %s (want (N,C) float32 and (N) integers)",
               CDDP__SHAPE(logits), CDDP__SHAPE(labels));
    CDDP_CHECK(logits->device == labels->device,
               "count_correct: expected all tensors to be on the same device, but found logits on "
               "%s and labels on %s",
               logits->device->name, labels->device->name);
    int64_t N = logits->shape[0], C = logits->shape[1], correct = 0;
    if (N == 0 || C == 0) return 0;
    /* No context: the count lands in device memory of its own, read back at once. */
    cddp_device *dev = logits->device;
    cddp__kq q = cddp__device_kq(dev);
    cddp_error e = {0};
    int64_t *count = dev->host_access ? &correct : cddp_device_alloc(dev, sizeof *count, &e);
    CDDP_CHECK(count, "count_correct: %s", e.msg);
    CDDP__K(&q, argmax, .x = logits->data, .labels = labels->data, .dtype = labels->dtype,
            .count = count, .rows = N, .C = C);
    if (count != &correct) {
        int rc = cddp_device_download(dev, &correct, count, sizeof correct, &e);
        cddp_device_free(dev, count);
        CDDP_CHECK(rc == CDDP_OK, "count_correct: %s", e.msg);
    }
    return correct;
}

double cddp_accuracy(const cddp_tensor *logits, const cddp_tensor *labels) {
    int64_t n = logits->ndim >= 1 ? logits->shape[0] : 0;
    return n ? (double)cddp_count_correct(logits, labels) / (double)n : 0.0;
}
