/* metrics.c: argmax and accuracy: what evaluation reads off logits (not differentiable). */
#include "tensor/internal.h"

static int64_t row_argmax(const float *a, int64_t C) {
    int64_t best = 0;
    for (int64_t j = 1; j < C; j++)
        if (a[j] > a[best]) best = j;
    return best;
}

cddp_tensor *cddp_argmax(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("argmax", x);
    CDDP_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] > 0, "argmax of an empty last dimension");
    int64_t C = x->shape[x->ndim - 1];
    cddp_tensor *out = cddp_empty(ctx, CDDP_I64, x->ndim - 1, x->shape);
    if (!out) return NULL;
    for (int64_t r = 0; r < out->numel; r++)
        ((int64_t *)out->data)[r] = row_argmax(cddp_f32(x) + r * C, C);
    return out;
}

int64_t cddp_count_correct(const cddp_tensor *logits, const cddp_tensor *labels) {
    cddp__need_f32("count_correct", logits);
    CDDP_CHECK(logits->ndim == 2 && labels->ndim == 1 && labels->shape[0] == logits->shape[0] &&
                   (labels->dtype == CDDP_I32 || labels->dtype == CDDP_I64),
               "count_correct: logits %s and labels %s (want (N,C) float32 and (N) integers)",
               CDDP__SHAPE(logits), CDDP__SHAPE(labels));
    int64_t N = logits->shape[0], C = logits->shape[1], correct = 0;
    for (int64_t i = 0; i < N && C > 0; i++)
        correct += row_argmax(cddp_f32(logits) + i * C, C) == cddp__label(labels, i);
    return correct;
}

double cddp_accuracy(const cddp_tensor *logits, const cddp_tensor *labels) {
    int64_t n = logits->ndim >= 1 ? logits->shape[0] : 0;
    return n ? (double)cddp_count_correct(logits, labels) / (double)n : 0.0;
}
