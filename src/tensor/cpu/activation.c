/* activation.c: the CPU's kernels for the activations, softmax, GELU's tanh form and the losses,
 * with each backward's derivation beside it (tensor/kernels.h says what each computes). */
#include "tensor/cpu/cpu.h"

#include <math.h>

void cddp__cpu_unary(cddp__kq *q, const cddp__k_unary *k) {
    (void)q;
    const float *a = k->x;
    float *y = k->y;
    int64_t n = k->n;
    switch (k->op) {
    case CDDP__RELU:
        cddp__relu(a, y, n);
        break;
    case CDDP__GELU:
        for (int64_t i = 0; i < n; i++) y[i] = 0.5f * a[i] * (1.0f + erff(a[i] * (float)M_SQRT1_2));
        break;
    case CDDP__TANH:
        for (int64_t i = 0; i < n; i++) y[i] = tanhf(a[i]);
        break;
    case CDDP__SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-a[i]));
        break;
    }
}

/* dx (+)= f'(x) dy:
 *   relu: dy where the output is positive (0 at the kink, as PyTorch)
 *   gelu: dy (Phi(x) + x phi(x))
 *   tanh: dy (1 - y^2)
 *   sigmoid: dy y (1 - y) */
void cddp__cpu_unary_grad(cddp__kq *q, const cddp__k_unary_grad *k) {
    (void)q;
    const float *dy = k->dy, *y = k->y, *a = k->x;
    float *dx = k->dx;
    int64_t n = k->n;
    bool assign = k->assign;
    switch (k->op) {
    case CDDP__RELU:
        cddp__relu_grad(y, dy, dx, n, assign);
        break;
    case CDDP__GELU:
        for (int64_t i = 0; i < n; i++) {
            float cdf = 0.5f * (1.0f + erff(a[i] * (float)M_SQRT1_2));
            float pdf = expf(-0.5f * a[i] * a[i]) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
            float g = dy[i] * (cdf + a[i] * pdf);
            dx[i] = assign ? g : dx[i] + g;
        }
        break;
    case CDDP__TANH:
        for (int64_t i = 0; i < n; i++) {
            float g = dy[i] * (1.0f - y[i] * y[i]);
            dx[i] = assign ? g : dx[i] + g;
        }
        break;
    case CDDP__SIGMOID:
        for (int64_t i = 0; i < n; i++) {
            float g = dy[i] * y[i] * (1.0f - y[i]);
            dx[i] = assign ? g : dx[i] + g;
        }
        break;
    }
}

void cddp__cpu_softmax(cddp__kq *q, const cddp__k_softmax *a) {
    (void)q;
    cddp__softmax_rows(a->x, a->y, a->rows, a->C, a->log);
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy), per row. */
void cddp__cpu_softmax_grad(cddp__kq *q, const cddp__k_softmax_grad *a) {
    (void)q;
    int64_t C = a->C;
    bool lg = a->log;
    for (int64_t r = 0; r < a->rows; r++) {
        const float *yr = a->y + r * C, *gr = a->dy + r * C;
        float *xr = a->dx + r * C;
        double s = 0.0;
        for (int64_t j = 0; j < C; j++) s += lg ? gr[j] : gr[j] * yr[j];
        for (int64_t j = 0; j < C; j++)
            xr[j] += lg ? gr[j] - expf(yr[j]) * (float)s : yr[j] * (gr[j] - (float)s);
    }
}

/* With y16, 4096 values at a time, each block rounded while it is in cache (without y, made in
 * scratch). */
void cddp__cpu_gelu_tanh(cddp__kq *q, const cddp__k_gelu_tanh *a) {
    enum { STEP = 4096 };
    int64_t step = a->y16 ? STEP : a->n;
    float *tmp = a->y ? NULL : cddp__kq_scratch(q, STEP * sizeof(float));
    if (!a->y && !tmp) return;
    for (int64_t i = 0; i < a->n; i += step) {
        int64_t n = a->n - i < step ? a->n - i : step;
        float *y = a->y ? a->y + i : tmp;
        cddp__gelu_tanh_rows(a->x + i, y, n);
        if (a->y16) cddp__bf16_narrow_n(a->y16 + i, y, n);
    }
}

/* y = x/2 (1 + tanh(u)), u = k (x + 0.044715 x^3):
 * dy/dx = (1 + tanh(u))/2 + x/2 (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2). */
void cddp__cpu_gelu_tanh_grad(cddp__kq *q, const cddp__k_gelu_tanh_grad *a) {
    if (!a->dx16) {
        cddp__gelu_tanh_grad(a->x, a->dy, a->dx, a->n, a->assign);
        return;
    }
    /* a row at a time, in cache: made, rounded, and its values added to the column sums */
    int64_t C = a->cols;
    float *row = cddp__kq_scratch(q, (size_t)C * sizeof(float));
    if (!row) return;
    for (int64_t i = 0; i < a->n; i += C) {
        cddp__gelu_tanh_grad(a->x + i, a->dy + i, row, C, true);
        cddp__bf16_narrow_n(a->dx16 + i, row, C);
        if (a->colsum) cddp__add_into(a->colsum, row, C);
    }
}

/* Row by row: m, ls (the row's log-sum-exp less m, exp(x - m) summed in scratch) and the label's
 * (x - m) - ls, as softmax_rows makes log_softmax. */
void cddp__cpu_cross_entropy(cddp__kq *q, const cddp__k_cross_entropy *a) {
    int64_t N = a->N, C = a->C;
    float *row = cddp__kq_scratch(q, (size_t)C * sizeof(float));
    if (!row) return;
    double loss = 0.0;
    for (int64_t i = 0; i < N; i++) {
        const float *x = a->logits + i * C;
        float m = cddp__max(x, C), ls = logf(cddp__exp_shifted(x, m, row, C));
        a->stats[2 * i] = m;
        a->stats[2 * i + 1] = ls;
        /* a label outside [0, C) was reported by check_ids, which a queue runs before this */
        int64_t l = cddp__index_at(a->labels, a->dtype, i);
        if (l >= 0 && l < C) loss -= (x[l] - m) - ls;
    }
    if (a->mean) loss /= (double)N;
    a->loss[0] = (float)loss;
}

/* loss = -sum_i logp[i, y_i] (/ N): dlogits[i, j] = (p[i, j] - [j = y_i]) g (/ N), p = exp(logp).
 * With dx16, a row at a time in cache: made, rounded, and added to the column sums. */
void cddp__cpu_cross_entropy_grad(cddp__kq *q, const cddp__k_cross_entropy_grad *a) {
    int64_t N = a->N, C = a->C;
    float g = a->dy[0] / (a->mean ? (float)N : 1.0f);
    float *row = a->dx16 ? cddp__kq_scratch(q, (size_t)C * sizeof(float)) : NULL;
    if (a->dx16 && !row) return;
    for (int64_t i = 0; i < N; i++) {
        float *d = a->dx16 ? row : a->dx + i * C;
        const float *s = a->stats + 2 * i;
        cddp__add_softmax_scaled(d, a->logits + i * C, s[0], s[1], g, C, a->assign || a->dx16);
        int64_t l = cddp__index_at(a->labels, a->dtype, i);
        if (l >= 0 && l < C) d[l] -= g;
        if (!a->dx16) continue;
        cddp__bf16_narrow_n(a->dx16 + i * C, row, C);
        if (a->colsum) cddp__add_into(a->colsum, row, C);
    }
}

void cddp__cpu_mse(cddp__kq *q, const cddp__k_mse *a) {
    (void)q;
    const float *p = a->p, *t = a->t;
    double s = 0.0;
    for (int64_t i = 0; i < a->n; i++) s += (double)(p[i] - t[i]) * (double)(p[i] - t[i]);
    if (a->mean) s /= (double)a->n;
    a->loss[0] = (float)s;
}

/* loss = sum (p - t)^2 (/ n): dp = 2 (p - t) g (/ n), dt = -dp. */
void cddp__cpu_mse_grad(cddp__kq *q, const cddp__k_mse_grad *a) {
    (void)q;
    float g = 2.0f * a->dy[0];
    if (a->mean) g /= (float)a->n;
    for (int64_t i = 0; i < a->n; i++) {
        float d = g * (a->p[i] - a->t[i]);
        if (a->dp) a->dp[i] += d;
        if (a->dt) a->dt[i] -= d;
    }
}
