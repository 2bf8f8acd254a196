/* activation.c: the CPU's kernels for the activations, softmax, GELU's tanh form and the losses,
 * with each backward's derivation beside it (tensor/kernels.h says what each computes). */
#include "tensor/cpu/cpu.h"

#include <math.h>

/* The elementwise kernels split their values across the math threads (a part's start on a
 * multiple of 16: the vector loops' blocks as on one thread), the row kernels their rows. */

static void unary_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_unary *k = arg;
    const float *a = k->x + lo;
    float *y = k->y + lo;
    int64_t n = hi - lo;
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

void cddp__cpu_unary(cddp__kq *q, const cddp__k_unary *k) {
    (void)q;
    cddp__cpu_split_values(k->n, unary_part, k);
}

/* dx (+)= f'(x) dy:
 *   relu: dy where the output is positive (0 at the kink, as PyTorch)
 *   gelu: dy (Phi(x) + x phi(x))
 *   tanh: dy (1 - y^2)
 *   sigmoid: dy y (1 - y) */
static void unary_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_unary_grad *k = arg;
    const float *dy = k->dy + lo, *y = k->y ? k->y + lo : NULL, *a = k->x ? k->x + lo : NULL;
    float *dx = k->dx + lo;
    int64_t n = hi - lo;
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

void cddp__cpu_unary_grad(cddp__kq *q, const cddp__k_unary_grad *k) {
    (void)q;
    cddp__cpu_split_values(k->n, unary_grad_part, k);
}

static void softmax_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_softmax *a = arg;
    cddp__softmax_rows(a->x + lo * a->C, a->y + lo * a->C, hi - lo, a->C, a->log);
}

void cddp__cpu_softmax(cddp__kq *q, const cddp__k_softmax *a) {
    (void)q;
    cddp__cpu_split_rows(a->rows, a->C, softmax_part, a);
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy), per row. */
static void softmax_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_softmax_grad *a = arg;
    int64_t C = a->C;
    bool lg = a->log;
    for (int64_t r = lo; r < hi; r++) {
        const float *yr = a->y + r * C, *gr = a->dy + r * C;
        float *xr = a->dx + r * C;
        double s = 0.0;
        for (int64_t j = 0; j < C; j++) s += lg ? gr[j] : gr[j] * yr[j];
        for (int64_t j = 0; j < C; j++)
            xr[j] += lg ? gr[j] - expf(yr[j]) * (float)s : yr[j] * (gr[j] - (float)s);
    }
}

void cddp__cpu_softmax_grad(cddp__kq *q, const cddp__k_softmax_grad *a) {
    (void)q;
    cddp__cpu_split_rows(a->rows, a->C, softmax_grad_part, a);
}

enum { GELU_STEP = 4096 };

/* Values lo..hi, with y16 GELU_STEP at a time, each block rounded while it is in cache (without
 * y, made in the part's scratch). */
static void gelu_tanh_part(int64_t lo, int64_t hi, int part, void *arg) {
    const cddp__k_gelu_tanh *a = ((void **)arg)[0];
    float *tmp = ((void **)arg)[1];
    int64_t step = a->y16 ? GELU_STEP : hi - lo;
    for (int64_t i = lo; i < hi; i += step) {
        int64_t n = hi - i < step ? hi - i : step;
        float *y = a->y ? a->y + i : tmp + (size_t)part * GELU_STEP;
        cddp__gelu_tanh_rows(a->x + i, y, n);
        if (a->y16) cddp__bf16_narrow_n(a->y16 + i, y, n);
    }
}

/* Split across the math threads in parts of whole blocks. */
void cddp__cpu_gelu_tanh(cddp__kq *q, const cddp__k_gelu_tanh *a) {
    int parts = cddp__cpu_parts(a->n, GELU_STEP);
    float *tmp = a->y ? NULL : cddp__kq_scratch(q, (size_t)parts * GELU_STEP * sizeof(float));
    if (!a->y && !tmp) return;
    cddp__cpu_split(a->n, GELU_STEP, parts, gelu_tanh_part, (void *[]){(void *)a, tmp});
}

/* Values lo..hi of dx; with dx16, columns lo..hi of every row: made a row's part at a time in the
 * part's scratch, rounded, and added to the column sums. */
static void gelu_tanh_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    const cddp__k_gelu_tanh_grad *a = ((void **)arg)[0];
    if (!a->dx16) {
        cddp__gelu_tanh_grad(a->x + lo, a->dy + lo, a->dx + lo, hi - lo, a->assign);
        return;
    }
    int64_t C = a->cols;
    float *row = (float *)((void **)arg)[1] + (size_t)part * cddp__up16((size_t)C);
    for (int64_t i = 0; i < a->n; i += C) {
        cddp__gelu_tanh_grad(a->x + i + lo, a->dy + i + lo, row, hi - lo, true);
        cddp__bf16_narrow_n(a->dx16 + i + lo, row, hi - lo);
        if (a->colsum) cddp__add_into(a->colsum + lo, row, hi - lo);
    }
}

/* y = x/2 (1 + tanh(u)), u = k (x + 0.044715 x^3):
 * dy/dx = (1 + tanh(u))/2 + x/2 (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2).
 * Split across the math threads: the values, or with dx16 (and the column sums) the columns. */
void cddp__cpu_gelu_tanh_grad(cddp__kq *q, const cddp__k_gelu_tanh_grad *a) {
    if (!a->dx16) {
        cddp__cpu_split_values(a->n, gelu_tanh_grad_part, (void *[]){(void *)a, NULL});
        return;
    }
    int64_t C = a->cols;
    int parts = cddp__cpu_col_parts(a->n / C, C);
    float *row = cddp__kq_scratch(q, (size_t)parts * cddp__up16((size_t)C) * sizeof(float));
    if (!row) return;
    cddp__cpu_split(C, 16, parts, gelu_tanh_grad_part, (void *[]){(void *)a, row});
}

/* Rows lo..hi: m, ls (the row's log-sum-exp less m, exp(x - m) summed in the part's scratch) and
 * the label's -((x - m) - ls) into terms, as softmax_rows makes log_softmax. */
static void cross_entropy_part(int64_t lo, int64_t hi, int part, void *arg) {
    const cddp__k_cross_entropy *a = ((void **)arg)[0];
    double *terms = ((void **)arg)[1];
    int64_t C = a->C;
    float *row = (float *)((void **)arg)[2] + (size_t)part * cddp__up16((size_t)C);
    for (int64_t i = lo; i < hi; i++) {
        const float *x = a->logits + i * C;
        float m = cddp__max(x, C), ls = logf(cddp__exp_shifted(x, m, row, C));
        a->stats[2 * i] = m;
        a->stats[2 * i + 1] = ls;
        /* a label outside [0, C) was reported by check_ids, which a queue runs before this */
        int64_t l = cddp__index_at(a->labels, a->dtype, i);
        terms[i] = l >= 0 && l < C ? -(double)((x[l] - m) - ls) : 0.0;
    }
}

/* The rows split across the math threads; the loss their terms added in row order. */
void cddp__cpu_cross_entropy(cddp__kq *q, const cddp__k_cross_entropy *a) {
    int64_t N = a->N, C = a->C;
    int parts = cddp__cpu_row_parts(N, C);
    float *row = cddp__kq_scratch(q, (size_t)parts * cddp__up16((size_t)C) * sizeof(float));
    double *terms = cddp__kq_scratch(q, (size_t)N * sizeof(double));
    if (!row || !terms) return;
    cddp__cpu_split(N, 1, parts, cross_entropy_part, (void *[]){(void *)a, terms, row});
    double loss = 0.0;
    for (int64_t i = 0; i < N; i++) loss += terms[i];
    if (a->mean) loss /= (double)N;
    a->loss[0] = (float)loss;
}

/* Rows lo..hi of dlogits; with dx16, columns lo..hi of every row, made a row's part at a time in
 * the part's scratch, rounded and added to the column sums. */
static void cross_entropy_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    const cddp__k_cross_entropy_grad *a = ((void **)arg)[0];
    int64_t N = a->N, C = a->C;
    float g = a->dy[0] / (a->mean ? (float)N : 1.0f);
    if (!a->dx16) {
        for (int64_t i = lo; i < hi; i++) {
            float *d = a->dx + i * C;
            const float *s = a->stats + 2 * i;
            cddp__add_softmax_scaled(d, a->logits + i * C, s[0], s[1], g, C, a->assign);
            int64_t l = cddp__index_at(a->labels, a->dtype, i);
            if (l >= 0 && l < C) d[l] -= g;
        }
        return;
    }
    float *row = (float *)((void **)arg)[1] + (size_t)part * cddp__up16((size_t)C);
    for (int64_t i = 0; i < N; i++) {
        const float *s = a->stats + 2 * i;
        cddp__add_softmax_scaled(row, a->logits + i * C + lo, s[0], s[1], g, hi - lo, true);
        int64_t l = cddp__index_at(a->labels, a->dtype, i);
        if (l >= lo && l < hi) row[l - lo] -= g;
        cddp__bf16_narrow_n(a->dx16 + i * C + lo, row, hi - lo);
        if (a->colsum) cddp__add_into(a->colsum + lo, row, hi - lo);
    }
}

/* loss = -sum_i logp[i, y_i] (/ N): dlogits[i, j] = (p[i, j] - [j = y_i]) g (/ N), p = exp(logp).
 * Split across the math threads: the rows, or with dx16 (and the column sums) the columns. */
void cddp__cpu_cross_entropy_grad(cddp__kq *q, const cddp__k_cross_entropy_grad *a) {
    int64_t N = a->N, C = a->C;
    if (!a->dx16) {
        cddp__cpu_split_rows(N, C, cross_entropy_grad_part, (void *[]){(void *)a});
        return;
    }
    int parts = cddp__cpu_col_parts(N, C);
    float *row = cddp__kq_scratch(q, (size_t)parts * cddp__up16((size_t)C) * sizeof(float));
    if (!row) return;
    cddp__cpu_split(C, 16, parts, cross_entropy_grad_part, (void *[]){(void *)a, row});
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
