/* dropout.c: dropout with the context's generator; backward multiplies by the same mask.
 *
 * The mask is drawn on the host from the context's generator (the same stream on every device),
 * and the device multiplies by it. */
#include "tensor/internal.h"

cddp_tensor *cddp_dropout(cddp_ctx *ctx, cddp_tensor *x, float p, bool training) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("dropout", x);
    CDDP_CHECK(p >= 0.0f && p <= 1.0f, "dropout probability %g is not in [0, 1]", (double)p);
    if (!training || p == 0.0f) return x;
    cddp__cdev *d = CDDP__ON(ctx, "dropout", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    size_t bytes = (size_t)x->numel * sizeof(float);
    float *mask = out ? cddp__dalloc(d, bytes) : NULL;
    float *draw = mask ? cddp__staging(d, mask, bytes) : NULL;
    if (!draw) return NULL;
    float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (int64_t i = 0; i < x->numel; i++) draw[i] = cddp_rng_uniform(&ctx->rng) < p ? 0.0f : keep;
    cddp__upload(d, mask, draw, bytes);
    CDDP__K(&d->q, mul, .y = out->data, .a = x->data, .b = mask, .n = x->numel, .add = false);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_DROPOUT, out, 1, &x, &node)) return NULL;
    if (node) node->saved = mask;
    return out;
}

void cddp__dropout_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (dx && d)
        CDDP__K(&d->q, mul, .y = dx, .a = n->out->grad, .b = n->saved, .n = n->in[0]->numel,
                .add = true);
}
