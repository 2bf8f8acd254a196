/* kernels.cu: the CUDA device's kernels (cuda.h lists them; tensor/kernels.h says what each
 * computes, the CPU's in src/tensor/cpu/ are the reference). Each is a __global__ function and
 * its launcher, which queues it on the device's stream and reports a failed launch through the
 * kernel's queue. Elementwise kernels walk their elements with a grid-stride loop; reductions
 * (a loss, a sum, a norm) run in one block of 1024 threads, in double, in a fixed order, so that
 * a result does not depend on the launch; a softmax or a row's loss takes a block per row. */
#include "tensor/cuda/cuda.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int THREADS = 256;
constexpr int REDUCE = 1024;

/* Blocks for n elements with a grid-stride loop. */
unsigned blocks(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

#define FOR_EACH(i, n)                                                                             \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)

__device__ int64_t index_at(const void *ids, cddp_dtype dtype, int64_t i) {
    return dtype == CDDP_I64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
}

/* The sum of a block's values v (every thread's), in double, the same order every time; the
 * result in thread 0. */
__device__ double block_sum(double v) {
    __shared__ double part[REDUCE];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    double total = part[0];
    __syncthreads();
    return total;
}

/* The largest of a block's values v (every thread's). */
__device__ float block_max(float v) {
    __shared__ float part[REDUCE];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
        __syncthreads();
    }
    float m = part[0];
    __syncthreads();
    return m;
}

__global__ void fill_k(void *dst, int64_t n, int size, uint64_t bits) {
    FOR_EACH(i, n) {
        switch (size) {
        case 1:
            ((uint8_t *)dst)[i] = (uint8_t)bits;
            break;
        case 2:
            ((uint16_t *)dst)[i] = (uint16_t)bits;
            break;
        case 4:
            ((uint32_t *)dst)[i] = (uint32_t)bits;
            break;
        default:
            ((uint64_t *)dst)[i] = bits;
        }
    }
}

__global__ void accumulate_k(float *dst, const float *src, int64_t n, bool assign) {
    FOR_EACH(i, n) dst[i] = assign ? src[i] : dst[i] + src[i];
}

/* dst rows of their own: element by element */
__global__ void add_rows_k(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ds,
                           int64_t ss) {
    FOR_EACH(i, rows * cols) {
        int64_t r = i / cols, c = i % cols;
        dst[r * ds + c] += src[r * ss + c];
    }
}

/* one dst row (stride 0): a thread per column adds every row, in order */
__global__ void sum_rows_k(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ss) {
    FOR_EACH(c, cols) {
        float s = dst[c];
        for (int64_t r = 0; r < rows; r++) s += src[r * ss + c];
        dst[c] = s;
    }
}

__global__ void scale_k(float *y, const float *x, float s, int64_t n, bool add) {
    FOR_EACH(i, n) y[i] = add ? y[i] + s * x[i] : s * x[i];
}

__global__ void mul_k(float *y, const float *a, const float *b, int64_t n, bool add) {
    FOR_EACH(i, n) y[i] = add ? y[i] + a[i] * b[i] : a[i] * b[i];
}

__device__ float unary_of(cddp__unop op, float x) {
    switch (op) {
    case CDDP__RELU:
        return x > 0.0f ? x : 0.0f; /* a NaN counts as 0, as on the CPU */
    case CDDP__GELU:
        return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    case CDDP__TANH:
        return tanhf(x);
    default:
        return 1.0f / (1.0f + expf(-x));
    }
}

__global__ void unary_k(cddp__unop op, const float *x, float *y, int64_t n) {
    FOR_EACH(i, n) y[i] = unary_of(op, x[i]);
}

__global__ void unary_grad_k(cddp__unop op, const float *x, const float *y, const float *dy,
                             float *dx, int64_t n, bool assign) {
    FOR_EACH(i, n) {
        float g;
        switch (op) {
        case CDDP__RELU:
            g = y[i] > 0.0f ? dy[i] : 0.0f;
            break;
        case CDDP__GELU: {
            float a = x[i], cdf = 0.5f * (1.0f + erff(a * (float)M_SQRT1_2));
            float pdf = expf(-0.5f * a * a) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
            g = dy[i] * (cdf + a * pdf);
            break;
        }
        case CDDP__TANH:
            g = dy[i] * (1.0f - y[i] * y[i]);
            break;
        default:
            g = dy[i] * y[i] * (1.0f - y[i]);
        }
        dx[i] = assign ? g : dx[i] + g;
    }
}

/* A block per row: the row's largest value, the sum of exp(x - max), then the row. */
__global__ void softmax_k(const float *x, float *y, int64_t C, bool log_) {
    const float *a = x + blockIdx.x * C;
    float *b = y + blockIdx.x * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, a[j]);
    m = block_max(m);
    double s = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(a[j] - m);
    float sum = (float)block_sum(s);
    float ls = logf(sum);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        b[j] = log_ ? (a[j] - m) - ls : expf(a[j] - m) / sum;
}

__global__ void softmax_grad_k(const float *y, const float *dy, float *dx, int64_t C, bool log_) {
    const float *yr = y + blockIdx.x * C, *gr = dy + blockIdx.x * C;
    float *xr = dx + blockIdx.x * C;
    double s = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += log_ ? gr[j] : gr[j] * yr[j];
    float t = (float)block_sum(s);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        xr[j] += log_ ? gr[j] - expf(yr[j]) * t : yr[j] * (gr[j] - t);
}

/* The first bad id wins the slot: {check number, position, id}. */
__global__ void check_ids_k(const void *ids, cddp_dtype dtype, int64_t n, int64_t limit,
                            int64_t *slot, int64_t number) {
    FOR_EACH(i, n) {
        int64_t id = index_at(ids, dtype, i);
        if ((id < 0 || id >= limit) &&
            atomicCAS((unsigned long long *)slot, 0ull, (unsigned long long)number) == 0ull) {
            slot[1] = i;
            slot[2] = id;
        }
    }
}

/* loss = -sum_i logp[i, label_i] (/ N), one block, in double */
__global__ void nll_k(const float *logp, const void *labels, cddp_dtype dtype, float *loss,
                      int64_t N, int64_t C, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        int64_t l = index_at(labels, dtype, i); /* one out of range was reported by check_ids */
        if (l >= 0 && l < C) s -= logp[i * C + l];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) loss[0] = (float)(mean ? s / (double)N : s);
}

__global__ void cross_entropy_grad_k(const float *logp, const void *labels, cddp_dtype dtype,
                                     const float *dy, float *dx, int64_t N, int64_t C, bool mean,
                                     bool assign) {
    float g = dy[0] / (mean ? (float)N : 1.0f);
    FOR_EACH(k, N * C) {
        int64_t i = k / C, j = k % C;
        float v = g * expf(logp[k]);
        if (j == index_at(labels, dtype, i)) v -= g;
        dx[k] = assign ? v : dx[k] + v;
    }
}

__global__ void mse_k(const float *p, const float *t, float *loss, int64_t n, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = (double)(p[i] - t[i]);
        s += d * d;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) loss[0] = (float)(mean ? s / (double)n : s);
}

__global__ void mse_grad_k(const float *p, const float *t, const float *dy, float *dp, float *dt,
                           int64_t n, bool mean) {
    float g = 2.0f * dy[0];
    if (mean) g /= (float)n;
    FOR_EACH(i, n) {
        float d = g * (p[i] - t[i]);
        if (dp) dp[i] += d;
        if (dt) dt[i] -= d;
    }
}

__global__ void sum_k(const float *x, float *out, int64_t n, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = (float)(mean ? s / (double)n : s);
}

__global__ void sum_grad_k(const float *dy, float *dx, int64_t n, bool mean) {
    float g = dy[0] / (mean ? (float)n : 1.0f);
    FOR_EACH(i, n) dx[i] += g;
}

__global__ void argmax_k(const float *x, int64_t *out, const void *labels, cddp_dtype dtype,
                         int64_t *count, int64_t rows, int64_t C) {
    FOR_EACH(r, rows) {
        const float *a = x + r * C;
        int64_t best = 0;
        for (int64_t j = 1; j < C; j++)
            if (a[j] > a[best]) best = j;
        if (out) out[r] = best;
        if (labels && best == index_at(labels, dtype, r))
            atomicAdd((unsigned long long *)count, 1ull);
    }
}

/* An id outside [0, V) was reported by check_ids (at the device's next synchronize): its rows are
 * skipped here, never read or written out of the table. */
__global__ void embedding_k(const float *table, const void *ids, cddp_dtype dtype, float *out,
                            int64_t n, int64_t V, int64_t C) {
    FOR_EACH(k, n * C) {
        int64_t id = index_at(ids, dtype, k / C);
        out[k] = id >= 0 && id < V ? table[id * C + k % C] : 0.0f;
    }
}

/* a thread per column, positions in order: the CPU's order, without atomics */
__global__ void embedding_grad_k(float *dtable, const void *ids, cddp_dtype dtype, const float *dy,
                                 int64_t n, int64_t V, int64_t C) {
    FOR_EACH(c, C) {
        for (int64_t i = 0; i < n; i++) {
            int64_t id = index_at(ids, dtype, i);
            if (id >= 0 && id < V) dtable[id * C + c] += dy[i * C + c];
        }
    }
}

__global__ void sgd_k(float *p, const float *grad, float *buf, int64_t n, cddp_sgd_hparams h) {
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

__global__ void adamw_k(float *p, const float *grad, float *m, float *v, int64_t n,
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

__global__ void sum_squares_k(const float *x, double *out, int64_t n) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = s;
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------------ */

#define LAUNCHED(q, what) cddp__cuda_failed(q, cudaGetLastError(), what)

void cddp__cuda_fill(cddp__kq *q, const cddp__k_fill *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    fill_k<<<blocks(a->n), THREADS, 0, s>>>(a->dst, a->n, a->size, a->bits);
    LAUNCHED(q, "fill");
}

void cddp__cuda_accumulate(cddp__kq *q, const cddp__k_accumulate *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    accumulate_k<<<blocks(a->n), THREADS, 0, s>>>(a->dst, a->src, a->n, a->assign);
    LAUNCHED(q, "accumulate");
}

void cddp__cuda_add_rows(cddp__kq *q, const cddp__k_add_rows *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->cols == 0) return;
    if (a->dst_stride == 0)
        sum_rows_k<<<blocks(a->cols), THREADS, 0, s>>>(a->dst, a->src, a->rows, a->cols,
                                                       a->src_stride);
    else
        add_rows_k<<<blocks(a->rows * a->cols), THREADS, 0, s>>>(a->dst, a->src, a->rows, a->cols,
                                                                 a->dst_stride, a->src_stride);
    LAUNCHED(q, "add_rows");
}

void cddp__cuda_scale(cddp__kq *q, const cddp__k_scale *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    scale_k<<<blocks(a->n), THREADS, 0, s>>>(a->y, a->x, a->s, a->n, a->add);
    LAUNCHED(q, "scale");
}

void cddp__cuda_mul(cddp__kq *q, const cddp__k_mul *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    mul_k<<<blocks(a->n), THREADS, 0, s>>>(a->y, a->a, a->b, a->n, a->add);
    LAUNCHED(q, "mul");
}

void cddp__cuda_unary(cddp__kq *q, const cddp__k_unary *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    unary_k<<<blocks(a->n), THREADS, 0, s>>>(a->op, a->x, a->y, a->n);
    LAUNCHED(q, "unary");
}

void cddp__cuda_unary_grad(cddp__kq *q, const cddp__k_unary_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    unary_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->op, a->x, a->y, a->dy, a->dx, a->n, a->assign);
    LAUNCHED(q, "unary_grad");
}

void cddp__cuda_softmax(cddp__kq *q, const cddp__k_softmax *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    softmax_k<<<(unsigned)a->rows, REDUCE, 0, s>>>(a->x, a->y, a->C, a->log);
    LAUNCHED(q, "softmax");
}

void cddp__cuda_softmax_grad(cddp__kq *q, const cddp__k_softmax_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    softmax_grad_k<<<(unsigned)a->rows, REDUCE, 0, s>>>(a->y, a->dy, a->dx, a->C, a->log);
    LAUNCHED(q, "softmax_grad");
}

void cddp__cuda_check_ids(cddp__kq *q, const cddp__k_check_ids *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    cddp__cuda_check c = cddp__cuda_check_begin(q, a->fmt, a->limit);
    check_ids_k<<<blocks(a->n), THREADS, 0, s>>>(a->ids, a->dtype, a->n, a->limit, c.slot,
                                                 c.number);
    LAUNCHED(q, "check_ids");
}

void cddp__cuda_cross_entropy(cddp__kq *q, const cddp__k_cross_entropy *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->N == 0) return;
    softmax_k<<<(unsigned)a->N, REDUCE, 0, s>>>(a->logits, a->logp, a->C, true);
    nll_k<<<1, REDUCE, 0, s>>>(a->logp, a->labels, a->dtype, a->loss, a->N, a->C, a->mean);
    LAUNCHED(q, "cross_entropy");
}

void cddp__cuda_cross_entropy_grad(cddp__kq *q, const cddp__k_cross_entropy_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->N * a->C == 0) return;
    cross_entropy_grad_k<<<blocks(a->N * a->C), THREADS, 0, s>>>(
        a->logp, a->labels, a->dtype, a->dy, a->dx, a->N, a->C, a->mean, a->assign);
    LAUNCHED(q, "cross_entropy_grad");
}

void cddp__cuda_mse(cddp__kq *q, const cddp__k_mse *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    mse_k<<<1, REDUCE, 0, s>>>(a->p, a->t, a->loss, a->n, a->mean);
    LAUNCHED(q, "mse");
}

void cddp__cuda_mse_grad(cddp__kq *q, const cddp__k_mse_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    mse_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->t, a->dy, a->dp, a->dt, a->n, a->mean);
    LAUNCHED(q, "mse_grad");
}

void cddp__cuda_sum(cddp__kq *q, const cddp__k_sum *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    sum_k<<<1, REDUCE, 0, s>>>(a->x, a->out, a->n, a->mean);
    LAUNCHED(q, "sum");
}

void cddp__cuda_sum_grad(cddp__kq *q, const cddp__k_sum_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    sum_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->dy, a->dx, a->n, a->mean);
    LAUNCHED(q, "sum_grad");
}

void cddp__cuda_argmax(cddp__kq *q, const cddp__k_argmax *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->count &&
        cddp__cuda_failed(q, cudaMemsetAsync(a->count, 0, sizeof(int64_t), s), "argmax's count"))
        return;
    if (a->rows == 0) return;
    argmax_k<<<blocks(a->rows), THREADS, 0, s>>>(a->x, a->out, a->labels, a->dtype, a->count,
                                                 a->rows, a->C);
    LAUNCHED(q, "argmax");
}

void cddp__cuda_embedding(cddp__kq *q, const cddp__k_embedding *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n * a->C == 0) return;
    embedding_k<<<blocks(a->n * a->C), THREADS, 0, s>>>(a->table, a->ids, a->dtype, a->out, a->n,
                                                        a->V, a->C);
    LAUNCHED(q, "embedding");
}

void cddp__cuda_embedding_grad(cddp__kq *q, const cddp__k_embedding_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n * a->C == 0) return;
    embedding_grad_k<<<blocks(a->C), THREADS, 0, s>>>(a->dtable, a->ids, a->dtype, a->dy, a->n,
                                                      a->V, a->C);
    LAUNCHED(q, "embedding_grad");
}

void cddp__cuda_sgd(cddp__kq *q, const cddp__k_sgd *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    sgd_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->g, a->buf, a->n, a->h);
    LAUNCHED(q, "sgd");
}

void cddp__cuda_adamw(cddp__kq *q, const cddp__k_adamw *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    adamw_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->g, a->m, a->v, a->n, a->h);
    LAUNCHED(q, "adamw");
}

void cddp__cuda_sum_squares(cddp__kq *q, const cddp__k_sum_squares *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    sum_squares_k<<<1, REDUCE, 0, s>>>(a->x, a->out, a->n);
    LAUNCHED(q, "sum_squares");
}
