/* reduce.c: the sum and the mean of all elements, to a scalar. */
#include "tensor/internal.h"

static cddp_tensor *reduce_all(cddp_ctx *ctx, cddp_tensor *x, cddp__op op) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    const char *name = op == CDDP_OP_SUM ? "sum" : "mean";
    cddp__need_f32_any(name, x); /* every element, any order */
    cddp__cdev *d = CDDP__ON(ctx, name, x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 0, NULL);
    if (!out) return NULL;
    CDDP__K(&d->q, sum, .x = x->data, .out = out->data, .n = x->numel, .mean = op == CDDP_OP_MEAN);
    if (!cddp__record_op(ctx, op, out, 1, &x, NULL)) return NULL;
    return out;
}

cddp_tensor *cddp_sum(cddp_ctx *ctx, cddp_tensor *x) {
    return reduce_all(ctx, x, CDDP_OP_SUM);
}
cddp_tensor *cddp_mean(cddp_ctx *ctx, cddp_tensor *x) {
    return reduce_all(ctx, x, CDDP_OP_MEAN);
}

/* sum: dx = g everywhere; mean: g / n. */
static void reduce_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (dx && d)
        CDDP__K(&d->q, sum_grad, .dy = n->out->grad, .dx = dx, .n = n->in[0]->numel,
                .mean = n->op == CDDP_OP_MEAN);
}

void cddp__sum_backward(cddp_ctx *ctx, cddp__node *n) {
    reduce_backward(ctx, n);
}

void cddp__mean_backward(cddp_ctx *ctx, cddp__node *n) {
    reduce_backward(ctx, n);
}
