/* loss.c: cross-entropy over (N, C) logits with integer labels, and the mean squared error. */
#include "tensor/internal.h"

#include <math.h>
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
    for (int64_t i = 0; i < N; i++) {
        int64_t y = cddp__label(labels, i);
        if (y < 0 || y >= C) {
            cddp_ctx_fail(ctx, CDDP_ERANGE,
                          "cross_entropy: label %lld of sample %lld is out of range for %lld "
                          "classes (labels must be in [0, %lld])",
                          (long long)y, (long long)i, (long long)C, (long long)(C - 1));
            return NULL;
        }
    }
    /* The log-probabilities are kept: backward needs softmax = exp(logp). */
    float *logp = cddp__ctx_alloc(ctx, (size_t)(N * C) * sizeof(float));
    if (!logp) return NULL;
    cddp__softmax_rows(logits->data, logp, N, C, true);
    double loss = 0.0;
    for (int64_t i = 0; i < N; i++) loss -= logp[i * C + cddp__label(labels, i)];
    if (reduction == CDDP_REDUCE_MEAN) loss /= (double)N;
    cddp_tensor *out = cddp__scalar(ctx, (float)loss);
    if (!out) return NULL;
    cddp__node *n;
    if (!cddp__record_op(ctx, CDDP_OP_CROSS_ENTROPY, out, 2, (cddp_tensor *[]){logits, labels}, &n))
        return NULL;
    if (n) {
        n->arg.reduction = reduction;
        n->saved = logp;
    }
    return out;
}

void cddp__cross_entropy_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp_tensor *x = n->in[0];
    const float *dy = n->out->grad;
    /* loss = -sum_i logp[i, y_i] (/ N): dlogits[i, j] = (p[i, j] - [j = y_i]) g (/ N). */
    if (!dx) return;
    const float *logp = n->saved;
    int64_t N = x->shape[0], C = x->shape[1];
    float g = dy[0] / (n->arg.reduction == CDDP_REDUCE_MEAN ? (float)N : 1.0f);
    for (int64_t i = 0; i < N; i++) {
        cddp__add_exp_scaled(dx + i * C, logp + i * C, g, C, assign);
        dx[i * C + cddp__label(n->in[1], i)] -= g;
    }
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
    const float *p = pred->data, *t = target->data;
    double s = 0.0;
    for (int64_t i = 0; i < pred->numel; i++) s += (double)(p[i] - t[i]) * (double)(p[i] - t[i]);
    if (reduction == CDDP_REDUCE_MEAN) s /= (double)pred->numel;
    cddp_tensor *out = cddp__scalar(ctx, (float)s);
    if (!out) return NULL;
    cddp__node *n;
    if (!cddp__record_op(ctx, CDDP_OP_MSE, out, 2, (cddp_tensor *[]){pred, target}, &n))
        return NULL;
    if (n) n->arg.reduction = reduction;
    return out;
}

void cddp__mse_backward(cddp_ctx *ctx, cddp__node *n) {
    const float *dy = n->out->grad;
    /* loss = sum (p - t)^2 (/ n): dp = 2 (p - t) g (/ n), dt = -dp. */
    cddp_tensor *p = n->in[0], *t = n->in[1];
    float *dp = p->requires_grad ? cddp_grad_buffer(ctx, p) : NULL;
    float *dt = t->requires_grad ? cddp_grad_buffer(ctx, t) : NULL;
    if (CDDP__FAILED(ctx)) return;
    float g = 2.0f * dy[0];
    if (n->arg.reduction == CDDP_REDUCE_MEAN) g /= (float)p->numel;
    for (int64_t i = 0; i < p->numel; i++) {
        float d = g * (cddp_f32(p)[i] - cddp_f32(t)[i]);
        if (dp) dp[i] += d;
        if (dt) dt[i] -= d;
    }
}
