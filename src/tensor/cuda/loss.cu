/* loss.cu: the CUDA device's kernels of one family: softmax, the losses (cross entropy, MSE), sums
 * and argmax. Each kernel is followed by its launcher (common.cuh says how both are written). */
#include "tensor/cuda/common.cuh"

/* A row's statistics (lse_part) in one reading by a block, merged in every thread; 16 bytes at a
 * time where the row is (vec: the classifier's 50,304 columns). */
static __device__ lse_part row_lse(const float *a, int64_t C, bool vec) {
    lse_part p = {-INFINITY, 0.0};
    if (vec)
        for (int64_t j = threadIdx.x; j < C / 4; j += blockDim.x) {
            float4 v = ((const float4 *)a)[j];
            p = with(with(with(with(p, v.x), v.y), v.z), v.w);
        }
    else
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) p = with(p, a[j]);
    return block_lse(p);
}

/* A block per row: the row's largest value and the sum of exp(x - max) in one reading, then the
 * row. */
static __global__ void softmax_k(const float *x, float *y, int64_t C, bool log_) {
    const float *a = x + blockIdx.x * C;
    float *b = y + blockIdx.x * C;
    bool vec = C % 4 == 0 && ((uintptr_t)a | (uintptr_t)b) % 16 == 0;
    lse_part p = row_lse(a, C, vec);
    float m = p.m, sum = (float)p.s, ls = logf(sum);
    auto out = [=](float v) { return log_ ? (v - m) - ls : expf(v - m) / sum; };
    if (vec)
        for (int64_t j = threadIdx.x; j < C / 4; j += blockDim.x) {
            float4 v = ((const float4 *)a)[j];
            ((float4 *)b)[j] = make_float4(out(v.x), out(v.y), out(v.z), out(v.w));
        }
    else
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) b[j] = out(a[j]);
}

void cddp__cuda_softmax(cddp__kq *q, const cddp__k_softmax *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    softmax_k<<<(unsigned)a->rows, REDUCE, 0, s>>>(a->x, a->y, a->C, a->log);
    LAUNCHED(q, "softmax");
}

static __global__ void softmax_grad_k(const float *y, const float *dy, float *dx, int64_t C,
                                      bool log_) {
    const float *yr = y + blockIdx.x * C, *gr = dy + blockIdx.x * C;
    float *xr = dx + blockIdx.x * C;
    double s = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += log_ ? gr[j] : gr[j] * yr[j];
    float t = (float)block_sum(s);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        xr[j] += log_ ? gr[j] - expf(yr[j]) * t : yr[j] * (gr[j] - t);
}

void cddp__cuda_softmax_grad(cddp__kq *q, const cddp__k_softmax_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    softmax_grad_k<<<(unsigned)a->rows, REDUCE, 0, s>>>(a->y, a->dy, a->dx, a->C, a->log);
    LAUNCHED(q, "softmax_grad");
}

/* The first bad id wins the slot: {check number, position, id}. */
static __global__ void check_ids_k(const void *ids, cddp_dtype dtype, int64_t n, int64_t limit,
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

void cddp__cuda_check_ids(cddp__kq *q, const cddp__k_check_ids *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    cddp__cuda_check c = cddp__cuda_check_begin(q, a->fmt, a->limit);
    check_ids_k<<<blocks(a->n), THREADS, 0, s>>>(a->ids, a->dtype, a->n, a->limit, c.slot,
                                                 c.number);
    LAUNCHED(q, "check_ids");
}

/* A block per row: its largest value m and ls, the log of its sum of exp(x - m), into stats. */
static __global__ void cross_entropy_stats_k(const float *x, float *stats, int64_t C) {
    const float *a = x + blockIdx.x * C;
    lse_part p = row_lse(a, C, C % 4 == 0 && (uintptr_t)a % 16 == 0);
    if (threadIdx.x == 0) {
        stats[2 * blockIdx.x] = p.m;
        stats[2 * blockIdx.x + 1] = logf((float)p.s);
    }
}

/* loss = -sum_i logp[i, label_i] (/ N), logp = (x - m) - ls; one block, in double */
static __global__ void nll_k(const float *logits, const float *stats, const void *labels,
                             cddp_dtype dtype, float *loss, int64_t N, int64_t C, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        int64_t l = index_at(labels, dtype, i); /* one out of range was reported by check_ids */
        if (l >= 0 && l < C) s -= (logits[i * C + l] - stats[2 * i]) - stats[2 * i + 1];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) loss[0] = (float)(mean ? s / (double)N : s);
}

void cddp__cuda_cross_entropy(cddp__kq *q, const cddp__k_cross_entropy *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->N == 0) return;
    cross_entropy_stats_k<<<(unsigned)a->N, REDUCE, 0, s>>>(a->logits, a->stats, a->C);
    nll_k<<<1, REDUCE, 0, s>>>(a->logits, a->stats, a->labels, a->dtype, a->loss, a->N, a->C,
                               a->mean);
    LAUNCHED(q, "cross_entropy");
}

/* Element (r, c) of the logits' gradient: (exp(logp) - onehot(label)) g, g = dy[0] (/ N), read
 * on the device (the loss's gradient is device memory) */
struct ce_dx {
    const float *x, *stats;
    const void *labels;
    cddp_dtype dtype;
    const float *dy;
    float div; /* N for a mean, else 1 */
    int64_t C;
    __device__ float at(float v, int64_t r, int64_t c, int64_t label, float g) const {
        return g * expf((v - stats[2 * r]) - stats[2 * r + 1]) - (c == label ? g : 0.0f);
    }
    __device__ float operator()(int64_t r, int64_t c) const {
        return at(x[r * C + c], r, c, index_at(labels, dtype, r), dy[0] / div);
    }
};

/* A block per row: the logits' gradient stored (assign), added, or (dx16) stored rounded to bf16;
 * 16 bytes of logits at a time where the rows allow. */
static __global__ void cross_entropy_grad_k(ce_dx f, float *dx, bool assign, uint16_t *dx16) {
    int64_t r = blockIdx.x, C = f.C, label = index_at(f.labels, f.dtype, r);
    float g = f.dy[0] / f.div;
    const float *a = f.x + r * C;
    float *d = dx16 ? nullptr : dx + r * C;
    uint16_t *h = dx16 ? dx16 + r * C : nullptr;
    bool vec =
        C % 4 == 0 && (uintptr_t)a % 16 == 0 && (h ? (uintptr_t)h % 8 : (uintptr_t)d % 16) == 0;
    if (vec)
        for (int64_t j = threadIdx.x; j < C / 4; j += blockDim.x) {
            float4 v = ((const float4 *)a)[j];
            int64_t c = 4 * j;
            float4 e = make_float4(f.at(v.x, r, c, label, g), f.at(v.y, r, c + 1, label, g),
                                   f.at(v.z, r, c + 2, label, g), f.at(v.w, r, c + 3, label, g));
            if (h) {
                ((ushort4 *)h)[j] =
                    make_ushort4(bf16_of(e.x), bf16_of(e.y), bf16_of(e.z), bf16_of(e.w));
            } else if (assign) {
                ((float4 *)d)[j] = e;
            } else {
                float4 o = ((float4 *)d)[j];
                ((float4 *)d)[j] = make_float4(o.x + e.x, o.y + e.y, o.z + e.z, o.w + e.w);
            }
        }
    else
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            float e = f.at(a[j], r, j, label, g);
            if (h)
                h[j] = bf16_of(e);
            else
                d[j] = assign ? e : d[j] + e;
        }
}

void cddp__cuda_cross_entropy_grad(cddp__kq *q, const cddp__k_cross_entropy_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->N * a->C == 0) return;
    ce_dx f = {a->logits, a->stats, a->labels, a->dtype, a->dy, a->mean ? (float)a->N : 1.0f, a->C};
    if (a->dx16 && a->colsum) { /* made, rounded and summed in one pass */
        colsum(q, s, f, a->N, a->C, a->colsum, "cross_entropy_grad", bf16_store{a->dx16, a->C});
        return;
    }
    cross_entropy_grad_k<<<(unsigned)a->N, REDUCE, 0, s>>>(f, a->dx, a->assign, a->dx16);
    LAUNCHED(q, "cross_entropy_grad");
}

static __global__ void mse_k(const float *p, const float *t, float *loss, int64_t n, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = (double)(p[i] - t[i]);
        s += d * d;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) loss[0] = (float)(mean ? s / (double)n : s);
}

void cddp__cuda_mse(cddp__kq *q, const cddp__k_mse *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    mse_k<<<1, REDUCE, 0, s>>>(a->p, a->t, a->loss, a->n, a->mean);
    LAUNCHED(q, "mse");
}

static __global__ void mse_grad_k(const float *p, const float *t, const float *dy, float *dp,
                                  float *dt, int64_t n, bool mean) {
    float g = 2.0f * dy[0];
    if (mean) g /= (float)n;
    FOR_EACH(i, n) {
        float d = g * (p[i] - t[i]);
        if (dp) dp[i] += d;
        if (dt) dt[i] -= d;
    }
}

void cddp__cuda_mse_grad(cddp__kq *q, const cddp__k_mse_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    mse_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->p, a->t, a->dy, a->dp, a->dt, a->n, a->mean);
    LAUNCHED(q, "mse_grad");
}

static __global__ void sum_k(const float *x, float *out, int64_t n, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = (float)(mean ? s / (double)n : s);
}

void cddp__cuda_sum(cddp__kq *q, const cddp__k_sum *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    sum_k<<<1, REDUCE, 0, s>>>(a->x, a->out, a->n, a->mean);
    LAUNCHED(q, "sum");
}

static __global__ void sum_grad_k(const float *dy, float *dx, int64_t n, bool mean) {
    float g = dy[0] / (mean ? (float)n : 1.0f);
    FOR_EACH(i, n) dx[i] += g;
}

void cddp__cuda_sum_grad(cddp__kq *q, const cddp__k_sum_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    sum_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->dy, a->dx, a->n, a->mean);
    LAUNCHED(q, "sum_grad");
}

static __global__ void argmax_k(const float *x, int64_t *out, const void *labels, cddp_dtype dtype,
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
