/* reduce.c: the sum and the mean of all elements, to a scalar. */
#include "tensor/internal.h"

static cddp_tensor *reduce_all(cddp_ctx *ctx, cddp_tensor *x, cddp__op op) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any(op == CDDP_OP_SUM ? "sum" : "mean", x); /* every element, any order */
    double s = 0.0;
    for (int64_t i = 0; i < x->numel; i++) s += cddp_f32(x)[i];
    if (op == CDDP_OP_MEAN) s /= (double)x->numel;
    cddp_tensor *out = cddp__scalar(ctx, (float)s);
    if (!out || !cddp__record_op(ctx, op, out, 1, &x, NULL)) return NULL;
    return out;
}

cddp_tensor *cddp_sum(cddp_ctx *ctx, cddp_tensor *x) {
    return reduce_all(ctx, x, CDDP_OP_SUM);
}
cddp_tensor *cddp_mean(cddp_ctx *ctx, cddp_tensor *x) {
    return reduce_all(ctx, x, CDDP_OP_MEAN);
}

static void reduce_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    const float *dy = n->out->grad;
    int64_t numel = n->in[0]->numel;
    /* sum: dx = g everywhere; mean: g / n. */
    if (!dx) return;
    float g = dy[0] / (n->op == CDDP_OP_MEAN ? (float)numel : 1.0f);
    for (int64_t i = 0; i < numel; i++) dx[i] += g;
}

void cddp__sum_backward(cddp_ctx *ctx, cddp__node *n) {
    reduce_backward(ctx, n);
}

void cddp__mean_backward(cddp_ctx *ctx, cddp__node *n) {
    reduce_backward(ctx, n);
}
