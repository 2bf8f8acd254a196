/* optim.cu: the CUDA device's kernels of one family: the optimizers' updates (SGD, AdamW) and the
 * sum of squares of gradient clipping. The kernels first, then their launchers (common.cuh says
 * how both are written). */
#include "tensor/cuda/common.cuh"

static __global__ void sgd_k(float *p, const float *grad, float *buf, int64_t n,
                             cddp_sgd_hparams h) {
    const float damp = 1.0f - h.dampening, wd = h.weight_decay;
    FOR_EACH(i, n) {
        if (!buf) {
            p[i] -= wd == 0.0f ? h.lr * grad[i] : h.lr * (grad[i] + wd * p[i]);
            continue;
        }
        float b =
            h.first ? grad[i] + wd * p[i] : h.momentum * buf[i] + damp * (grad[i] + wd * p[i]);
        buf[i] = b;
        p[i] -= h.nesterov ? h.lr * (grad[i] + wd * p[i] + h.momentum * b) : h.lr * b;
    }
}

void cddp__cuda_sgd(cddp__kq *q, const cddp__k_sgd *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    sgd_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->g, a->buf, a->n, a->h);
    LAUNCHED(q, "sgd");
}

static __global__ void adamw_k(float *p, const float *grad, float *m, float *v, int64_t n,
                               cddp_adamw_hparams h) {
    FOR_EACH(i, n) {
        float g = grad[i], pi = p[i] * h.decay;
        float mi = m[i] * h.beta1 + (1.0f - h.beta1) * g;
        float vi = v[i] * h.beta2 + (1.0f - h.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - h.step_size * (mi / (sqrtf(vi) / h.bc2_sqrt + h.eps));
    }
}

void cddp__cuda_adamw(cddp__kq *q, const cddp__k_adamw *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    adamw_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->g, a->m, a->v, a->n, a->h);
    LAUNCHED(q, "adamw");
}

/* Lion: the sign of the interpolated momentum (sign(0) = 0), then the momentum's update */
static __global__ void lion_k(float *p, const float *grad, float *m, int64_t n,
                              cddp_lion_hparams h) {
    FOR_EACH(i, n) {
        float g = grad[i], c = h.beta1 * m[i] + (1.0f - h.beta1) * g;
        float sign = (float)(c > 0.0f) - (float)(c < 0.0f);
        p[i] = p[i] * h.decay - h.lr * sign;
        m[i] = h.beta2 * m[i] + (1.0f - h.beta2) * g;
    }
}

void cddp__cuda_lion(cddp__kq *q, const cddp__k_lion *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    lion_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->g, a->m, a->n, a->h);
    LAUNCHED(q, "lion");
}

/* sum_squares in two steps, each in a fixed order: every block's sum of its elements (a grid-stride
 * walk) into part, then one block's sum of those */
static __global__ void sum_squares_k(const float *x, double *part, int64_t n) {
    double s = 0;
    FOR_EACH(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void sum_parts_k(const double *part, double *out) {
    double s = block_sum(part[threadIdx.x]);
    if (threadIdx.x == 0) out[0] = s;
}

void cddp__cuda_sum_squares(cddp__kq *q, const cddp__k_sum_squares *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    double *part = cddp__cuda_partials(q);
    sum_squares_k<<<CDDP__CUDA_PARTIALS, THREADS, 0, s>>>(a->x, part, a->n);
    sum_parts_k<<<1, CDDP__CUDA_PARTIALS, 0, s>>>(part, a->out);
    LAUNCHED(q, "sum_squares");
}
