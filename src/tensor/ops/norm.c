/* norm.c: batch normalisation over every dimension but the channels, as PyTorch's
 * BatchNorm1d/2d, in training (batch statistics, running statistics updated) and evaluation. */
#include "tensor/internal.h"

#include <math.h>

cddp_tensor *cddp_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, cddp_tensor *bias,
                             cddp_tensor *running_mean, cddp_tensor *running_var, bool training,
                             float momentum, float eps) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("batch_norm", x);
    CDDP_CHECK((x->ndim == 2 || x->ndim == 4) && x->shape[0] > 0,
               "batch_norm needs (N,C) or (N,C,H,W) with N > 0, got %s", CDDP__SHAPE(x));
    int64_t N = x->shape[0], C = x->shape[1], plane = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1;
    int64_t M = N * plane;
    cddp_tensor *per_c[4] = {weight, bias, running_mean, running_var};
    for (int i = 0; i < 4; i++)
        if (per_c[i])
            CDDP_CHECK(per_c[i]->dtype == CDDP_F32 && per_c[i]->numel == C,
                       "batch_norm: %s %s does not fit %lld channels",
                       (const char *[]){"weight", "bias", "running_mean", "running_var"}[i],
                       CDDP__SHAPE(per_c[i]), (long long)C);
    CDDP_CHECK(training || (running_mean && running_var),
               "batch_norm in evaluation needs the running statistics");
    CDDP_CHECK(!training || M > 1,
               "batch_norm in training needs more than one value per "
               "channel, got %s",
               CDDP__SHAPE(x));
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *stats = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(float)); /* mean, 1/std */
    if (!out || !stats) return NULL;
    const float *xd = cddp_f32(x);
    float *y = cddp_f32(out);
    for (int64_t c = 0; c < C; c++) {
        double mean, var;
        if (training) {
            /* Each plane summed in float lanes (vectorised), the planes in double. */
            double s = 0.0, ss = 0.0;
            for (int64_t n = 0; n < N; n++) s += cddp__sum(xd + (n * C + c) * plane, plane);
            mean = s / (double)M;
            for (int64_t n = 0; n < N; n++)
                ss += cddp__sq_dev(xd + (n * C + c) * plane, (float)mean, plane);
            var = ss / (double)M;
            if (running_mean)
                cddp_f32(running_mean)[c] =
                    (1.0f - momentum) * cddp_f32(running_mean)[c] + momentum * (float)mean;
            if (running_var)
                cddp_f32(running_var)[c] = (1.0f - momentum) * cddp_f32(running_var)[c] +
                                           momentum * (float)(ss / (double)(M - 1));
        } else {
            mean = cddp_f32(running_mean)[c];
            var = cddp_f32(running_var)[c];
        }
        float m = (float)mean, inv = (float)(1.0 / sqrt(var + (double)eps));
        stats[c] = m;
        stats[C + c] = inv;
        float g = weight ? cddp_f32(weight)[c] : 1.0f, b = bias ? cddp_f32(bias)[c] : 0.0f;
        for (int64_t n = 0; n < N; n++)
            cddp__normalize(xd + (n * C + c) * plane, m, inv * g, b, y + (n * C + c) * plane,
                            plane);
    }
    cddp_tensor *in[3] = {x, weight, bias};
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_BATCH_NORM, out, 3, in, &node)) return NULL;
    if (node) {
        node->arg.training = training;
        node->saved = stats;
    }
    return out;
}

void cddp__batch_norm_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp_tensor *x = n->in[0];
    const float *dy = n->out->grad;
    /* With xh = (x - mean) inv and y = g xh + b, per channel over its M values:
     * db = sum dy, dg = sum dy xh; in training (mean and inv depend on x)
     * dx = g inv (dy - sum(dy) / M - xh sum(dy xh) / M), in evaluation dx = g inv dy. */
    cddp_tensor *g = n->in[1], *b = n->in[2];
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t plane = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1, M = N * plane;
    const float *stats = n->saved, *xd = cddp_f32(x);
    float *gg = g && g->requires_grad ? cddp_grad_buffer(ctx, g) : NULL;
    float *gb = b && b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
    if (CDDP__FAILED(ctx)) return;
    for (int64_t c = 0; c < C; c++) {
        float m = stats[c], inv = stats[C + c], gc = g ? cddp_f32(g)[c] : 1.0f;
        double sdy = 0.0, sdyxh = 0.0; /* a plane's sums in 8 float lanes, the planes' in double */
        for (int64_t s = 0; s < N; s++) {
            const float *p = xd + (s * C + c) * plane, *d = dy + (s * C + c) * plane;
            sdy += cddp__sum(d, plane);
            sdyxh += cddp__dot_dev(d, p, m, plane);
        }
        sdyxh *= inv;
        if (gb) gb[c] += (float)sdy;
        if (gg) gg[c] += (float)sdyxh;
        if (!dx) continue;
        float k = gc * inv, mdy = n->arg.training ? (float)(sdy / (double)M) : 0.0f;
        float mdyxh = n->arg.training ? (float)(sdyxh / (double)M) : 0.0f;
        for (int64_t s = 0; s < N; s++) {
            const float *p = xd + (s * C + c) * plane, *d = dy + (s * C + c) * plane;
            cddp__norm_grad_into(dx + (s * C + c) * plane, d, p, k, mdy, m, inv * mdyxh, plane);
        }
    }
}
