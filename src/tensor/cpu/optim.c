/* optim.c: the CPU's kernels for the optimizers' updates and the gradient norm's sum (the rules
 * are written out in cddp/device.h). One straight loop per configuration: the per-element branches
 * of a general loop would keep the compiler from vectorising, and these passes over the whole
 * model run every step. */
#include "tensor/cpu/cpu.h"

#include <math.h>

static void sgd_loop(float *restrict p, const float *restrict grad, float *restrict buf, int64_t n,
                     const cddp_sgd_hparams *h) {
    const float lr = h->lr, mom = h->momentum, damp = 1.0f - h->dampening, wd = h->weight_decay;
    if (!buf) {
        if (wd == 0.0f)
            for (int64_t i = 0; i < n; i++) p[i] -= lr * grad[i];
        else
            for (int64_t i = 0; i < n; i++) p[i] -= lr * (grad[i] + wd * p[i]);
        return;
    }
    if (h->first) /* PyTorch starts the buffer as a copy of the first gradient */
        for (int64_t i = 0; i < n; i++) buf[i] = grad[i] + wd * p[i];
    else
        for (int64_t i = 0; i < n; i++) buf[i] = mom * buf[i] + damp * (grad[i] + wd * p[i]);
    if (h->nesterov)
        for (int64_t i = 0; i < n; i++) p[i] -= lr * (grad[i] + wd * p[i] + mom * buf[i]);
    else
        for (int64_t i = 0; i < n; i++) p[i] -= lr * buf[i];
}

/* Each update's values split across the math threads (a part's start on a multiple of 16: the
 * vector loops' blocks as on one thread). */
static void sgd_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_sgd *a = arg;
    sgd_loop(a->p + lo, a->g + lo, a->buf ? a->buf + lo : NULL, hi - lo, &a->h);
}

void cddp__cpu_sgd(cddp__kq *q, const cddp__k_sgd *a) {
    (void)q;
    cddp__cpu_split_values(a->n, sgd_part, a);
}

/* The update loop, vectorised (see CDDP_SIMD_CLONES). */
CDDP_SIMD_CLONES static void adamw_loop(float *restrict p, const float *restrict grad, int64_t n,
                                        float *restrict m, float *restrict v, float b1, float b2,
                                        float eps, float step_size, float bc2_sqrt, float decay) {
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        p[i] *= decay;
        m[i] = m[i] * b1 + (1.0f - b1) * g;
        v[i] = v[i] * b2 + (1.0f - b2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * (m[i] / denom);
    }
}

static void adamw_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_adamw *a = arg;
    const cddp_adamw_hparams *h = &a->h;
    adamw_loop(a->p + lo, a->g + lo, hi - lo, a->m + lo, a->v + lo, h->beta1, h->beta2, h->eps,
               h->step_size, h->bc2_sqrt, h->decay);
}

void cddp__cpu_adamw(cddp__kq *q, const cddp__k_adamw *a) {
    (void)q;
    cddp__cpu_split_values(a->n, adamw_part, a);
}

/* Lion's update loop, vectorised: the sign as two comparisons (sign(0) = 0). */
CDDP_SIMD_CLONES static void lion_loop(float *restrict p, const float *restrict grad, int64_t n,
                                       float *restrict m, float lr, float b1, float b2,
                                       float decay) {
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i], c = b1 * m[i] + (1.0f - b1) * g;
        float sign = (float)(c > 0.0f) - (float)(c < 0.0f);
        p[i] = p[i] * decay - lr * sign;
        m[i] = b2 * m[i] + (1.0f - b2) * g;
    }
}

static void lion_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_lion *a = arg;
    const cddp_lion_hparams *h = &a->h;
    lion_loop(a->p + lo, a->g + lo, hi - lo, a->m + lo, h->lr, h->beta1, h->beta2, h->decay);
}

void cddp__cpu_lion(cddp__kq *q, const cddp__k_lion *a) {
    (void)q;
    cddp__cpu_split_values(a->n, lion_part, a);
}

/* The sum of squares in double, in 8 lanes that vectorise (the order is fixed: the same result
 * on every machine and rank). */
CDDP_SIMD_CLONES static double sum_squares(const float *g, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)g[i + j] * (double)g[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)g[i] * (double)g[i];
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

void cddp__cpu_sum_squares(cddp__kq *q, const cddp__k_sum_squares *a) {
    (void)q;
    a->out[0] = sum_squares(a->x, a->n);
}
