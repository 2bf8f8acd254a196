/* loss.c: cross-entropy over (N, C) logits with integer labels, and the mean squared error. */
#include "tensor/internal.h"

#include <string.h>

cddp_tensor *cddp_cross_entropy(cddp_ctx *ctx, cddp_tensor *logits, cddp_tensor *labels,
                                cddp_reduction reduction) {
    if (CDDP__FAILED(ctx) || !logits || !labels) return NULL;
    cddp__need_f32("cross_entropy", logits);
    CDDP_CHECK(labels->dtype == CDDP_I32 || labels->dtype == CDDP_I64,
               "cross_entropy labels must be int32 or int64, got %s",
               cddp_dtype_name(labels->dtype));
    CDDP_CHECK(logits->ndim == 2 && labels->ndim == 1 && labels->shape[0] == logits->shape[0],
               "cross_entropy: logits %s and labels %s (want (N,C) and (N))", CDDP__SHAPE(logits),
               CDDP__SHAPE(labels));
    int64_t N = logits->shape[0], C = logits->shape[1];
    cddp__cdev *d = CDDP__ON(ctx, "cross_entropy", logits, labels);
    if (!d) return NULL;
    CDDP__K(&d->q, check_ids, .ids = labels->data, .dtype = labels->dtype, .n = N, .limit = C,
            .fmt = "cross_entropy: label %lld of sample %lld is out of range for %lld classes "
                   "(labels must be in [0, %lld])");
    if (CDDP__FAILED(ctx)) return NULL;
    /* Each row's largest value and log-sum-exp are kept: backward makes the softmax from them
     * and the logits (which the step keeps), not from N x C log-probabilities written and read
     * back (GPT-2's classifier: 3.3 GB a step, twice) */
    float *stats = cddp__dalloc(d, (size_t)(2 * N) * sizeof(float));
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 0, NULL);
    if (!stats || !out) return NULL;
    CDDP__K(&d->q, cross_entropy, .logits = logits->data, .labels = labels->data,
            .dtype = labels->dtype, .stats = stats, .loss = out->data, .N = N, .C = C,
            .mean = reduction == CDDP_REDUCE_MEAN);
    cddp__node *n;
    if (!cddp__record_op(ctx, CDDP_OP_CROSS_ENTROPY, out, 2, (cddp_tensor *[]){logits, labels}, &n))
        return NULL;
    if (n) {
        n->arg.reduction = reduction;
        n->saved = stats;
    }
    return out;
}

/* For a linear layer in bf16 that made the logits (a classifier; through a reshape, as the GPT's
 * (B, T, V) logits reach the loss as (B T, V)), their gradient rounded as that layer's backward
 * would round it, and its bias's gradient on the way (cddp__input_grad_half): the gradient is
 * written once, in half the bytes, and never copied or read back in float32. */
void cddp__cross_entropy_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign = true;
    cddp__node *made = NULL;
    uint16_t *dx16 = cddp__input_grad_half(ctx, n, 0, &made);
    float *dx = dx16 ? NULL : cddp__input_grad_assign(ctx, n, &assign);
    float *colsum = dx16 ? cddp__linear_bias_grad(ctx, made) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    cddp_tensor *x = n->in[0], *labels = n->in[1];
    if ((!dx && !dx16) || !d || CDDP__FAILED(ctx)) return;
    CDDP__K(&d->q, cross_entropy_grad, .logits = x->data, .stats = n->saved, .labels = labels->data,
            .dtype = labels->dtype, .dy = n->out->grad, .dx = dx, .N = x->shape[0],
            .C = x->shape[1], .mean = n->arg.reduction == CDDP_REDUCE_MEAN, .assign = assign,
            .dx16 = dx16, .colsum = colsum);
}

cddp_tensor *cddp_mse_loss(cddp_ctx *ctx, cddp_tensor *pred, cddp_tensor *target,
                           cddp_reduction reduction) {
    if (CDDP__FAILED(ctx) || !pred || !target) return NULL;
    cddp__need_f32("mse_loss", pred);
    cddp__need_f32("mse_loss", target);
    CDDP_CHECK(pred->numel == target->numel && pred->ndim == target->ndim &&
                   memcmp(pred->shape, target->shape, sizeof(int64_t) * (size_t)pred->ndim) == 0,
               "mse_loss: prediction %s and target %s differ in shape", CDDP__SHAPE(pred),
               CDDP__SHAPE(target));
    cddp__cdev *d = CDDP__ON(ctx, "mse_loss", pred, target);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 0, NULL);
    if (!out) return NULL;
    CDDP__K(&d->q, mse, .p = pred->data, .t = target->data, .loss = out->data, .n = pred->numel,
            .mean = reduction == CDDP_REDUCE_MEAN);
    cddp__node *n;
    if (!cddp__record_op(ctx, CDDP_OP_MSE, out, 2, (cddp_tensor *[]){pred, target}, &n))
        return NULL;
    if (n) n->arg.reduction = reduction;
    return out;
}

void cddp__mse_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *p = n->in[0], *t = n->in[1];
    float *dp = p->requires_grad ? cddp_grad_buffer(ctx, p) : NULL;
    float *dt = t->requires_grad ? cddp_grad_buffer(ctx, t) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (CDDP__FAILED(ctx) || !d) return;
    CDDP__K(&d->q, mse_grad, .p = p->data, .t = t->data, .dy = n->out->grad, .dp = dp, .dt = dt,
            .n = p->numel, .mean = n->arg.reduction == CDDP_REDUCE_MEAN);
}
