/* dropout.c: dropout with the context's generator; backward multiplies by the same mask. */
#include "tensor/internal.h"

cddp_tensor *cddp_dropout(cddp_ctx *ctx, cddp_tensor *x, float p, bool training) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("dropout", x);
    CDDP_CHECK(p >= 0.0f && p <= 1.0f, "dropout probability %g is not in [0, 1]", (double)p);
    if (!training || p == 0.0f) return x;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *mask = cddp__ctx_alloc(ctx, (size_t)x->numel * sizeof(float));
    if (!out || !mask) return NULL;
    float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (int64_t i = 0; i < x->numel; i++) {
        mask[i] = cddp_rng_uniform(&ctx->rng) < p ? 0.0f : keep;
        cddp_f32(out)[i] = cddp_f32(x)[i] * mask[i];
    }
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_DROPOUT, out, 1, &x, &node)) return NULL;
    if (node) node->saved = mask;
    return out;
}

void cddp__dropout_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    const float *dy = n->out->grad;
    int64_t numel = n->in[0]->numel;
    if (dx)
        for (int64_t i = 0; i < numel; i++) dx[i] += dy[i] * ((const float *)n->saved)[i];
}
