/* kernels.cu: the CUDA device's kernels (cuda.h lists them; tensor/kernels.h says what each
 * computes, the CPU's in src/tensor/cpu/ are the reference). Each is a __global__ function and
 * its launcher, which queues it on the device's stream and reports a failed launch through the
 * kernel's queue. Elementwise kernels walk their elements with a grid-stride loop; reductions
 * (a loss, a sum, a norm) run in one block of 1024 threads, in double, in a fixed order, so that
 * a result does not depend on the launch; a softmax or a row's loss takes a block per row. */
#include "tensor/cuda/cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

/* The sum of a warp's values v, in double, the same in every lane and every time. */
__device__ double warp_sum(double v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A softmax's row statistics: the largest value m and the sum of exp(x - m), kept by each thread
 * as it reads (rescaled when m grows), then merged across the block in a fixed order. */
struct lse_part {
    float m;
    double s;
};

__device__ lse_part merge(lse_part a, lse_part b) {
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return a;
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ lse_part with(lse_part p, float v) {
    if (v == -INFINITY) return p;
    if (v > p.m) p.s *= expf(p.m - v), p.m = v;
    p.s += expf(v - p.m);
    return p;
}

/* The block's merged statistics (every thread's p), in every thread. */
__device__ lse_part block_lse(lse_part p) {
    __shared__ float pm[32];
    __shared__ double ps[32];
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int round = 0; round < 2; round++) {
        for (int o = 16; o > 0; o /= 2) /* each pair merges the same two: every lane agrees */
            p = merge(p,
                      {__shfl_xor_sync(0xffffffffu, p.m, o), __shfl_xor_sync(0xffffffffu, p.s, o)});
        if (round == 1) break;
        if (lane == 0) pm[w] = p.m, ps[w] = p.s;
        __syncthreads();
        p = lane < (int)(blockDim.x / 32) ? lse_part{pm[lane], ps[lane]} : lse_part{-INFINITY, 0.0};
    }
    __syncthreads(); /* pm and ps free for the next call */
    return p;
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

__global__ void scale_k(float *y, const float *x, float s, int64_t n, bool add) {
    FOR_EACH(i, n) y[i] = add ? y[i] + s * x[i] : s * x[i];
}

/* f rounded to bf16 (to nearest even), as the host's to_bf16 rounds it */
__device__ uint16_t bf16_of(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* rounded to nearest even by the intrinsics, as the host's conversions round */
__global__ void cast16_k(uint16_t *h, float *f, int64_t n, bool f16, bool widen, float scale) {
    FOR_EACH(i, n) {
        if (widen)
            f[i] = (f16 ? __half2float(__ushort_as_half(h[i]))
                        : __bfloat162float(__ushort_as_bfloat16(h[i]))) *
                   scale;
        else
            h[i] = f16 ? __half_as_ushort(__float2half_rn(f[i])) : bf16_of(f[i]);
    }
}

/* dst (rows, cols, dense) = src (rows ld apart) rounded to bf16 */
__global__ void to_bf16_k(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld) {
    FOR_EACH(i, rows * cols) dst[i] = bf16_of(src[i / cols * ld + i % cols]);
}

/* The same for dense rows, 4 values a thread (n4 float4's, src 16-byte and dst 8-byte aligned):
 * no division per element, one 16-byte load and one 8-byte store. */
__global__ void to_bf16_dense_k(uint2 *dst, const float4 *src, int64_t n4) {
    FOR_EACH(i, n4) {
        float4 v = src[i];
        dst[i] = make_uint2(bf16_of(v.x) | (uint32_t)bf16_of(v.y) << 16,
                            bf16_of(v.z) | (uint32_t)bf16_of(v.w) << 16);
    }
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

/* A row's statistics (lse_part) in one reading by a block, merged in every thread; 16 bytes at a
 * time where the row is (vec: the classifier's 50,304 columns). */
__device__ lse_part row_lse(const float *a, int64_t C, bool vec) {
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
__global__ void softmax_k(const float *x, float *y, int64_t C, bool log_) {
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

/* A block per row: its largest value m and ls, the log of its sum of exp(x - m), into stats. */
__global__ void cross_entropy_stats_k(const float *x, float *stats, int64_t C) {
    const float *a = x + blockIdx.x * C;
    lse_part p = row_lse(a, C, C % 4 == 0 && (uintptr_t)a % 16 == 0);
    if (threadIdx.x == 0) {
        stats[2 * blockIdx.x] = p.m;
        stats[2 * blockIdx.x + 1] = logf((float)p.s);
    }
}

/* loss = -sum_i logp[i, label_i] (/ N), logp = (x - m) - ls; one block, in double */
__global__ void nll_k(const float *logits, const float *stats, const void *labels, cddp_dtype dtype,
                      float *loss, int64_t N, int64_t C, bool mean) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        int64_t l = index_at(labels, dtype, i); /* one out of range was reported by check_ids */
        if (l >= 0 && l < C) s -= (logits[i * C + l] - stats[2 * i]) - stats[2 * i + 1];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) loss[0] = (float)(mean ? s / (double)N : s);
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
__global__ void cross_entropy_grad_k(ce_dx f, float *dx, bool assign, uint16_t *dx16) {
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

/* The embedding's backward by rows: the positions grouped by id, in order, then a thread per
 * (id, column) adds its positions' gradients in that order (the CPU's order, without atomics).
 * count[v]: how many positions hold id v (ids outside [0, V) were reported, and are skipped). */
__global__ void id_count_k(const void *ids, cddp_dtype dtype, int64_t n, int64_t V, int *count) {
    FOR_EACH(i, n) {
        int64_t id = index_at(ids, dtype, i);
        if (id >= 0 && id < V) atomicAdd(&count[id], 1);
    }
}

/* start[v] = the positions with ids before v (an exclusive scan of count, one block: each thread
 * a run of ids, then the runs' totals), start[V] = all of them */
__global__ void id_scan_k(const int *count, int *start, int64_t V) {
    __shared__ int run[REDUCE];
    int64_t per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per;
    int64_t hi = lo + per < V ? lo + per : V;
    int t = 0;
    for (int64_t v = lo; v < hi; v++) t += count[v];
    run[threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (unsigned k = 0; k < blockDim.x; k++) {
            int c = run[k];
            run[k] = acc;
            acc += c;
        }
        start[V] = acc;
    }
    __syncthreads();
    int acc = run[threadIdx.x];
    for (int64_t v = lo; v < hi; v++) {
        start[v] = acc;
        acc += count[v];
    }
}

/* pos[start[id] + (the positions before i with the same id)] = i: positions grouped by id, each
 * group in order */
__global__ void id_place_k(const void *ids, cddp_dtype dtype, int64_t n, int64_t V,
                           const int *start, int *pos) {
    FOR_EACH(i, n) {
        int64_t id = index_at(ids, dtype, i);
        if (id < 0 || id >= V) continue;
        int before = 0;
        for (int64_t j = 0; j < i; j++) before += index_at(ids, dtype, j) == id;
        pos[start[id] + before] = (int)i;
    }
}

__global__ void embedding_rows_k(float *dtable, const int *start, const int *pos, const float *dy,
                                 int64_t V, int64_t C) {
    FOR_EACH(k, V * C) {
        int64_t v = k / C, c = k % C;
        int a = start[v], b = start[v + 1];
        if (a == b) continue;
        float s = dtable[k];
        for (int j = a; j < b; j++) s += dy[(int64_t)pos[j] * C + c];
        dtable[k] = s;
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

/* sum_squares in two steps, each in a fixed order: every block's sum of its elements (a grid-stride
 * walk) into part, then one block's sum of those */
__global__ void sum_squares_k(const float *x, double *part, int64_t n) {
    double s = 0;
    FOR_EACH(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void sum_parts_k(const double *part, double *out) {
    double s = block_sum(part[threadIdx.x]);
    if (threadIdx.x == 0) out[0] = s;
}

/* Column sums in two steps, each in a fixed order, the rows cut into chunks: a block of
 * COLS columns x LANES row lanes sums one chunk (lane y its rows y, y + LANES, ..., then the
 * lanes in order) into part[chunk][column]; then a thread per column adds the chunks' sums, in
 * order, to dst. F gives element (r, c) of what is summed; S stores it as it goes, where the pass
 * also writes what it sums (rounded to bf16: bf16_store), so that the elements are made once. */
constexpr int COLS = 32, LANES = 8;

struct no_store {
    __device__ void operator()(int64_t, int64_t, float) const {}
};
/* element (r, c) rounded into dst, rows of cols, dense */
struct bf16_store {
    uint16_t *dst;
    int64_t cols;
    __device__ void operator()(int64_t r, int64_t c, float v) const {
        dst[r * cols + c] = bf16_of(v);
    }
};

template <typename F, typename S>
__global__ void colsum_part_k(F f, S store, int64_t rows, int64_t cols, int64_t chunk,
                              float *part) {
    __shared__ float acc[LANES][COLS + 1];
    int64_t c = (int64_t)blockIdx.x * COLS + threadIdx.x, r0 = (int64_t)blockIdx.y * chunk;
    int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s = 0.0f;
    if (c < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += LANES) {
            float v = f(r, c);
            store(r, c, v);
            s += v;
        }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
        for (int y = 0; y < LANES; y++) t += acc[y][threadIdx.x];
        part[blockIdx.y * cols + c] = t;
    }
}

/* Two column sums in one pass (layer norm's dw and db: dy read once), each as colsum_part_k
 * sums it, into part (f's) and part2 (g's). */
template <typename F, typename G>
__global__ void colsum_pair_part_k(F f, G g, int64_t rows, int64_t cols, int64_t chunk, float *part,
                                   float *part2) {
    __shared__ float acc[2][LANES][COLS + 1];
    int64_t c = (int64_t)blockIdx.x * COLS + threadIdx.x, r0 = (int64_t)blockIdx.y * chunk;
    int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float s = 0.0f, s2 = 0.0f;
    if (c < cols)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += LANES) {
            s += f(r, c);
            s2 += g(r, c);
        }
    acc[0][threadIdx.y][threadIdx.x] = s;
    acc[1][threadIdx.y][threadIdx.x] = s2;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f, t2 = 0.0f;
        for (int y = 0; y < LANES; y++) t += acc[0][y][threadIdx.x], t2 += acc[1][y][threadIdx.x];
        part[blockIdx.y * cols + c] = t;
        part2[blockIdx.y * cols + c] = t2;
    }
}

template <typename F, typename S>
__global__ void colsum_serial_k(F f, S store, int64_t rows, int64_t cols, float *dst) {
    FOR_EACH(c, cols) {
        float s = dst[c];
        for (int64_t r = 0; r < rows; r++) {
            float v = f(r, c);
            store(r, c, v);
            s += v;
        }
        dst[c] = s;
    }
}

__global__ void colsum_total_k(const float *part, int64_t parts, int64_t cols, float *dst) {
    FOR_EACH(c, cols) {
        float s = dst[c];
        for (int64_t k = 0; k < parts; k++) s += part[k * cols + c];
        dst[c] = s;
    }
}

/* what the column sums add: rows of src (ss apart); layer norm's dy h, and dy */
struct src_rows {
    const float *src;
    int64_t ss;
    __device__ float operator()(int64_t r, int64_t c) const {
        return src[r * ss + c];
    }
};
struct dy_h {
    const float *x, *dy, *mean, *rstd;
    int64_t C;
    __device__ float operator()(int64_t r, int64_t c) const {
        return dy[r * C + c] * ((x[r * C + c] - mean[r]) * rstd[r]);
    }
};

/* ---- broadcast arithmetic ---------------------------------------------------------------- */

__device__ float binop_of(cddp__binop op, float x, float y) {
    switch (op) {
    case CDDP__ADD:
        return x + y;
    case CDDP__SUB:
        return x - y;
    case CDDP__MUL:
        return x * y;
    default:
        return x / y;
    }
}

/* Output element i's offsets into a and b: its coordinates in bc's 4-D shape times the strides. */
__device__ void offsets(const cddp__bcast &bc, int64_t i, int64_t *ia, int64_t *ib) {
    *ia = 0;
    *ib = 0;
    for (int d = 3; d >= 0; d--) {
        int64_t c = i % bc.shape[d];
        i /= bc.shape[d];
        *ia += c * bc.sa[d];
        *ib += c * bc.sb[d];
    }
}

__global__ void binary_k(cddp__binop op, cddp__bcast bc, const float *a, const float *b, float *z,
                         int64_t n) {
    FOR_EACH(i, n) {
        int64_t ia = i, ib = i;
        if (!bc.same) offsets(bc, i, &ia, &ib);
        z[i] = binop_of(op, a[ia], b[ib]);
    }
}

/* The term output i adds to a's (of_b: b's) gradient. */
__device__ float binary_term(cddp__binop op, bool of_b, float dz, float x, float y) {
    switch (op) {
    case CDDP__ADD:
        return dz;
    case CDDP__SUB:
        return of_b ? -dz : dz;
    case CDDP__MUL:
        return of_b ? dz * x : dz * y;
    default:
        return of_b ? -(dz * x / (y * y)) : dz / y;
    }
}

/* One input's gradient (of_b: b's, else a's), a thread per element of that input: it adds the
 * terms of every output element that read it, in the outputs' order (the CPU's), with no atomics.
 * The input's own dimensions are those with a stride (or of length 1); the others stretched. */
__global__ void binary_grad_k(cddp__binop op, cddp__bcast bc, bool of_b, const float *dz,
                              const float *a, const float *b, float *dst, int64_t elems) {
    const int64_t *st = of_b ? bc.sb : bc.sa;
    FOR_EACH(k, elems) {
        if (bc.same) {
            dst[k] += binary_term(op, of_b, dz[k], a[k], b[k]);
            continue;
        }
        int64_t c[4], span[4], r = k, at = 0;
        for (int d = 3; d >= 0; d--) {
            bool stretched = st[d] == 0 && bc.shape[d] > 1;
            span[d] = stretched ? bc.shape[d] : 1;
            c[d] = stretched ? 0 : r % bc.shape[d];
            if (!stretched) r /= bc.shape[d];
            at += c[d] * st[d];
        }
        float acc = dst[at];
        for (int64_t e0 = 0; e0 < span[0]; e0++)
            for (int64_t e1 = 0; e1 < span[1]; e1++)
                for (int64_t e2 = 0; e2 < span[2]; e2++)
                    for (int64_t e3 = 0; e3 < span[3]; e3++) {
                        int64_t d0 = c[0] + e0, d1 = c[1] + e1, d2 = c[2] + e2, d3 = c[3] + e3;
                        int64_t i = ((d0 * bc.shape[1] + d1) * bc.shape[2] + d2) * bc.shape[3] + d3;
                        int64_t ia = d0 * bc.sa[0] + d1 * bc.sa[1] + d2 * bc.sa[2] + d3 * bc.sa[3];
                        int64_t ib = d0 * bc.sb[0] + d1 * bc.sb[1] + d2 * bc.sb[2] + d3 * bc.sb[3];
                        acc += binary_term(op, of_b, dz[i], a[ia], b[ib]);
                    }
        dst[at] = acc;
    }
}

/* ---- the transformer's kernels ----------------------------------------------------------- */

constexpr float GELU_K = 0.7978845608028654f; /* sqrt(2 / pi) */
constexpr float GELU_C = 0.044715f;

/* y = GELU(x) (tanh form) where y is not NULL, and y16 rounded where it is not */
__global__ void gelu_tanh_k(const float *x, float *y, int64_t n, uint16_t *y16) {
    FOR_EACH(i, n) {
        float v = x[i], th = tanhf(GELU_K * (v + GELU_C * v * v * v)), r = 0.5f * v * (1.0f + th);
        if (y) y[i] = r;
        if (y16) y16[i] = bf16_of(r);
    }
}

/* GELU'(x) dy, the slope made from x again */
__device__ float gelu_grad_of(float v, float g) {
    float th = tanhf(GELU_K * (v + GELU_C * v * v * v));
    return g * (0.5f * (1.0f + th) +
                0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * v * v));
}

/* GELU's input gradient as the column sums read it (the linear layer's bias gradient) */
struct gelu_dx {
    const float *x, *dy;
    int64_t C;
    __device__ float operator()(int64_t r, int64_t c) const {
        return gelu_grad_of(x[r * C + c], dy[r * C + c]);
    }
};

/* dx = GELU'(x) dy (add: dx +=), or (dx16 not NULL) dx16 = it rounded */
__global__ void gelu_tanh_grad_k(float *dx, const float *x, const float *dy, int64_t n, bool add,
                                 uint16_t *dx16) {
    FOR_EACH(i, n) {
        float g = gelu_grad_of(x[i], dy[i]);
        if (dx16)
            dx16[i] = bf16_of(g);
        else
            dx[i] = add ? dx[i] + g : g;
    }
}

/* Layer norm's forward takes a warp per row (a GPT's rows of 768 stay in cache between its three
 * passes: 1.7x faster than a block per row for GPT-2 on the H200), WARP_ROWS rows to a block; its
 * backward a block per row (a warp per row was 2.2x slower there). */
constexpr int WARP_ROWS = THREADS / 32;

/* A row's mean and 1/std (sums in double), then the row. */
__global__ void layer_norm_k(const float *x, const float *w, const float *b, float *y, float *mean,
                             float *rstd, int64_t rows, int64_t C, float eps, uint16_t *y16) {
    int64_t r = (int64_t)blockIdx.x * WARP_ROWS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float *xr = x + r * C;
    float *yr = y + r * C;
    double s = 0;
    for (int64_t j = lane; j < C; j += 32) s += xr[j];
    float m = (float)(warp_sum(s) / (double)C);
    double v = 0;
    for (int64_t j = lane; j < C; j += 32) {
        double d = (double)(xr[j] - m);
        v += d * d;
    }
    float rs = 1.0f / sqrtf((float)(warp_sum(v) / (double)C) + eps);
    for (int64_t j = lane; j < C; j += 32) {
        yr[j] = (xr[j] - m) * rs * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
        if (y16) y16[r * C + j] = bf16_of(yr[j]);
    }
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}

/* dx, a block per row: with h = (x - mean) rstd and g = w dy, rstd (g - mean(g) - h mean(g h)) */
__global__ void layer_norm_dx_k(const float *x, const float *w, const float *dy, const float *mean,
                                const float *rstd, float *dx, bool assign, int64_t C) {
    int64_t r = blockIdx.x;
    const float *xr = x + r * C, *gr = dy + r * C;
    float *dr = dx + r * C, m = mean[r], s = rstd[r];
    double sg = 0, sgh = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        float h = (xr[j] - m) * s, g = gr[j] * (w ? w[j] : 1.0f);
        sg += g;
        sgh += (double)g * h;
    }
    float mg = (float)(block_sum(sg) / (double)C), mgh = (float)(block_sum(sgh) / (double)C);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        float h = (xr[j] - m) * s, g = gr[j] * (w ? w[j] : 1.0f);
        float v = s * (g - mg - h * mgh);
        dr[j] = assign ? v : dr[j] + v;
    }
}

/* ---- Llama's kernels (the CPU's in tensor/cpu/llama.c) ----------------------------------- */

/* RMSNorm, a warp per row as layer_norm_k: 1/rms (the sum of squares in double), then the row */
__global__ void rms_norm_k(const float *x, const float *w, float *y, float *rstd, int64_t rows,
                           int64_t C, float eps) {
    int64_t r = (int64_t)blockIdx.x * WARP_ROWS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float *xr = x + r * C;
    double ss = 0;
    for (int64_t j = lane; j < C; j += 32) ss += (double)xr[j] * xr[j];
    float rs = (float)(1.0 / sqrt(warp_sum(ss) / (double)C + (double)eps));
    for (int64_t j = lane; j < C; j += 32) y[r * C + j] = xr[j] * rs * (w ? w[j] : 1.0f);
    if (lane == 0) rstd[r] = rs;
}

/* dx, a block per row: with h = x rstd and g = w dy, rstd (g - h mean(g h)) */
__global__ void rms_norm_dx_k(const float *x, const float *w, const float *dy, const float *rstd,
                              float *dx, bool assign, int64_t C) {
    int64_t r = blockIdx.x;
    const float *xr = x + r * C, *gr = dy + r * C;
    float *dr = dx + r * C, s = rstd[r];
    double sgh = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        sgh += (double)(gr[j] * (w ? w[j] : 1.0f)) * (xr[j] * s);
    float m = (float)(block_sum(sgh) / (double)C);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        float v = s * (gr[j] * (w ? w[j] : 1.0f) - xr[j] * s * m);
        dr[j] = assign ? v : dr[j] + v;
    }
}

/* dy h, for RMSNorm's weight gradient (column sums) */
struct rms_dy_h {
    const float *x, *dy, *rstd;
    int64_t C;
    __device__ float operator()(int64_t r, int64_t c) const {
        return dy[r * C + c] * (x[r * C + c] * rstd[r]);
    }
};

__device__ float sigmoid_of(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* y = silu(g) u */
__global__ void silu_mul_k(const float *g, const float *u, float *y, int64_t n) {
    FOR_EACH(i, n) y[i] = g[i] * sigmoid_of(g[i]) * u[i];
}

/* dg = dy u s (1 + g (1 - s)), du = dy g s, each stored (assign) or added, each may be NULL */
__global__ void silu_mul_grad_k(const float *g, const float *u, const float *dy, float *dg,
                                bool assign_g, float *du, bool assign_u, int64_t n) {
    FOR_EACH(i, n) {
        float v = g[i], s = sigmoid_of(v), d = dy[i];
        if (dg) {
            float e = d * u[i] * s * (1.0f + v * (1.0f - s));
            dg[i] = assign_g ? e : dg[i] + e;
        }
        if (du) {
            float e = d * v * s;
            du[i] = assign_u ? e : du[i] + e;
        }
    }
}

/* Rotary positions, a thread per pair (row r, head h, i < D/2): the pair (i, i + D/2) turned by
 * (pos0 + r mod T) inv_freq[i] (float32, as the CPU's), or by minus it (inverse) */
__global__ void rope_k(const float *x, float *y, const float *inv_freq, int64_t rows, int64_t T,
                       int64_t H, int64_t D, int64_t pos0, bool inverse, bool assign) {
    int64_t half = D / 2;
    FOR_EACH(k, rows * H * half) {
        int64_t i = k % half, h = k / half % H, r = k / (half * H);
        float angle = (float)(pos0 + r % T) * inv_freq[i], c = cosf(angle), sn = sinf(angle);
        if (inverse) sn = -sn;
        const float *xr = x + r * H * D + h * D;
        float *yr = y + r * H * D + h * D;
        float y1 = xr[i] * c - xr[i + half] * sn, y2 = xr[i + half] * c + xr[i] * sn;
        yr[i] = assign ? y1 : yr[i] + y1;
        yr[i + half] = assign ? y2 : yr[i + half] + y2;
    }
}

/* qkv rows (3 H D): q, then k and v with kv head h / (H / KV) in head h's place */
__global__ void qkv_pack_k(const float *q, const float *k, const float *v, float *qkv,
                           int64_t rows, int64_t H, int64_t KV, int64_t D) {
    int64_t C = H * D, KVC = KV * D, rep = H / KV;
    FOR_EACH(e, rows * 3 * C) {
        int64_t r = e / (3 * C), j = e % (3 * C), part = j / C, c = j % C;
        const float *src = part == 0 ? q + r * C + c
                                     : (part == 1 ? k : v) + r * KVC + c / D / rep * D + c % D;
        qkv[e] = *src;
    }
}

/* dq from dqkv, and dk, dv each the sum of its heads' gradients in head order */
__global__ void qkv_pack_grad_k(const float *dqkv, float *dq, float *dk, float *dv, bool aq,
                                bool ak, bool av, int64_t rows, int64_t H, int64_t KV, int64_t D) {
    int64_t C = H * D, KVC = KV * D, rep = H / KV, W = C + 2 * KVC;
    FOR_EACH(e, rows * W) {
        int64_t r = e / W, j = e % W;
        const float *d = dqkv + r * 3 * C;
        if (j < C) {
            if (dq) dq[r * C + j] = aq ? d[j] : dq[r * C + j] + d[j];
            continue;
        }
        bool is_v = j >= C + KVC;
        int64_t c = j - C - (is_v ? KVC : 0), g = c / D, i = c % D;
        float *dst = is_v ? dv : dk;
        if (!dst) continue;
        float s = 0;
        for (int64_t h = g * rep; h < (g + 1) * rep; h++) s += d[(is_v ? 2 : 1) * C + h * D + i];
        float *o = dst + r * KVC + c;
        *o = (is_v ? av : ak) ? s : *o + s;
    }
}

/* Causal attention's softmax, a block per row of T scores (row r: query r % T): the softmax of its
 * first r % T + 1 values, zeros after (sums in double). */
__global__ void causal_softmax_k(float *s, int64_t T) {
    float *row = s + blockIdx.x * T;
    int64_t t = blockIdx.x % T;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    double sum = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) {
        row[j] = expf(row[j] - m);
        sum += row[j];
    }
    float inv = 1.0f / (float)block_sum(sum);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? row[j] * inv : 0.0f;
}

/* Its backward, a block per row, in place: d (dP on entry) becomes p (dP - sum(dP p)) on the
 * row's first r % T + 1 values, zeros after (the sum in double). */
__global__ void causal_softmax_grad_k(const float *p, float *d, int64_t T) {
    const float *pr = p + blockIdx.x * T;
    float *dr = d + blockIdx.x * T;
    int64_t t = blockIdx.x % T;
    double s = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) s += dr[j] * pr[j];
    float dot = (float)block_sum(s);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
        dr[j] = j <= t ? pr[j] * (dr[j] - dot) : 0.0f;
}

/* Generation: the new positions' keys and values into the cache (B, L, 2C) at past.. */
__global__ void kv_store_k(const float *qkv, float *cache, int64_t B, int64_t T, int64_t C,
                           int64_t past, int64_t L) {
    FOR_EACH(i, B * T * 2 * C) {
        int64_t c = i % (2 * C), bt = i / (2 * C), t = bt % T, b = bt / T;
        cache[(b * L + past + t) * 2 * C + c] = qkv[(b * T + t) * 3 * C + C + c];
    }
}

/* A block per (batch element, new position t, head): the query against the cached keys 0..past+t
 * (scores in shared memory), their softmax, the values mixed by it. */
__global__ void attn_cached_k(const float *qkv, const float *cache, float *out, int64_t T,
                              int64_t C, int64_t NH, int64_t past, int64_t L) {
    extern __shared__ float sc[];
    int64_t h = blockIdx.x % NH, bt = blockIdx.x / NH, t = bt % T, b = bt / T, HS = C / NH;
    int64_t i = past + t;
    const float *q = qkv + (b * T + t) * 3 * C + h * HS, *kv = cache + b * L * 2 * C;
    float scale = rsqrtf((float)HS), m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
        const float *k = kv + j * 2 * C + h * HS;
        float dot = 0.0f;
        for (int64_t d = 0; d < HS; d++) dot += q[d] * k[d];
        sc[j] = scale * dot;
        m = fmaxf(m, sc[j]);
    }
    m = block_max(m);
    double sum = 0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
        sc[j] = expf(sc[j] - m);
        sum += sc[j];
    }
    float total = (float)block_sum(sum); /* its __syncthreads also orders sc's writes */
    for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
        float o = 0.0f;
        for (int64_t j = 0; j <= i; j++) o += sc[j] / total * kv[j * 2 * C + C + h * HS + d];
        out[(b * T + t) * C + h * HS + d] = o;
    }
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------------ */

#define LAUNCHED(q, what) cddp__cuda_failed(q, cudaGetLastError(), what)

/* dst[c] += sum over rows of f(r, c) (column sums), each element stored by store as it is made:
 * in two steps where there are enough rows for them and the caller's context has scratch for the
 * chunks' sums, else a thread per column adds every row in order (false: failed, reported
 * through q). */
template <typename F, typename S = no_store>
static bool colsum(cddp__kq *q, cudaStream_t s, F f, int64_t rows, int64_t cols, float *dst,
                   const char *what, S store = S()) {
    int64_t chunk = 64;
    while ((rows + chunk - 1) / chunk > 65535) chunk *= 2;
    int64_t parts = (rows + chunk - 1) / chunk;
    if (parts < 4 || !q->scratch) {
        colsum_serial_k<<<blocks(cols), THREADS, 0, s>>>(f, store, rows, cols, dst);
        return !LAUNCHED(q, what);
    }
    float *part = (float *)cddp__kq_scratch(q, (size_t)(parts * cols) * sizeof(float));
    if (!part) return false;
    dim3 grid((unsigned)((cols + COLS - 1) / COLS), (unsigned)parts), block(COLS, LANES);
    colsum_part_k<<<grid, block, 0, s>>>(f, store, rows, cols, chunk, part);
    colsum_total_k<<<blocks(cols), THREADS, 0, s>>>(part, parts, cols, dst);
    return !LAUNCHED(q, what);
}

/* dst[c] += the column sums of f and dst2[c] += g's, in one pass where colsum would take two
 * steps (the same sums as two colsum calls), else as two colsum calls. */
template <typename F, typename G>
static bool colsum_pair(cddp__kq *q, cudaStream_t s, F f, G g, int64_t rows, int64_t cols,
                        float *dst, float *dst2, const char *what) {
    int64_t chunk = 64;
    while ((rows + chunk - 1) / chunk > 65535) chunk *= 2;
    int64_t parts = (rows + chunk - 1) / chunk;
    if (parts < 4 || !q->scratch)
        return colsum(q, s, f, rows, cols, dst, what) && colsum(q, s, g, rows, cols, dst2, what);
    float *part = (float *)cddp__kq_scratch(q, (size_t)(2 * parts * cols) * sizeof(float));
    if (!part) return false;
    dim3 grid((unsigned)((cols + COLS - 1) / COLS), (unsigned)parts), block(COLS, LANES);
    colsum_pair_part_k<<<grid, block, 0, s>>>(f, g, rows, cols, chunk, part, part + parts * cols);
    colsum_total_k<<<blocks(cols), THREADS, 0, s>>>(part, parts, cols, dst);
    colsum_total_k<<<blocks(cols), THREADS, 0, s>>>(part + parts * cols, parts, cols, dst2);
    return !LAUNCHED(q, what);
}

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
    if (a->dst_stride == 0) {
        colsum(q, s, src_rows{a->src, a->src_stride}, a->rows, a->cols, a->dst, "add_rows");
        return;
    }
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

void cddp__cuda_cast16(cddp__kq *q, const cddp__k_cast16 *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    cast16_k<<<blocks(a->n), THREADS, 0, s>>>(a->h, a->f, a->n, a->f16, a->widen, a->scale);
    LAUNCHED(q, "cast16");
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
    cross_entropy_stats_k<<<(unsigned)a->N, REDUCE, 0, s>>>(a->logits, a->stats, a->C);
    nll_k<<<1, REDUCE, 0, s>>>(a->logits, a->stats, a->labels, a->dtype, a->loss, a->N, a->C,
                               a->mean);
    LAUNCHED(q, "cross_entropy");
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

/* With scratch (the caller's context) and ids that fit an int: the positions grouped by id first
 * (embedding_rows_k); else a thread per column walks every position. */
void cddp__cuda_embedding_grad(cddp__kq *q, const cddp__k_embedding_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n * a->C == 0) return;
    if (q->scratch && a->n < INT32_MAX && a->V < INT32_MAX) {
        int *count = (int *)cddp__kq_scratch(q, (size_t)(2 * (a->V + 1) + a->n) * sizeof(int));
        if (!count) return;
        int *start = count + a->V + 1, *pos = start + a->V + 1;
        if (cddp__cuda_failed(q, cudaMemsetAsync(count, 0, (size_t)a->V * sizeof(int), s),
                              "embedding_grad's counts"))
            return;
        id_count_k<<<blocks(a->n), THREADS, 0, s>>>(a->ids, a->dtype, a->n, a->V, count);
        id_scan_k<<<1, REDUCE, 0, s>>>(count, start, a->V);
        id_place_k<<<blocks(a->n), THREADS, 0, s>>>(a->ids, a->dtype, a->n, a->V, start, pos);
        embedding_rows_k<<<blocks(a->V * a->C), THREADS, 0, s>>>(a->dtable, start, pos, a->dy, a->V,
                                                                 a->C);
        LAUNCHED(q, "embedding_grad");
        return;
    }
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
    double *part = cddp__cuda_partials(q);
    sum_squares_k<<<CDDP__CUDA_PARTIALS, THREADS, 0, s>>>(a->x, part, a->n);
    sum_parts_k<<<1, CDDP__CUDA_PARTIALS, 0, s>>>(part, a->out);
    LAUNCHED(q, "sum_squares");
}

void cddp__cuda_binary(cddp__kq *q, const cddp__k_binary *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    binary_k<<<blocks(a->n), THREADS, 0, s>>>(a->op, a->bc, a->a, a->b, a->z, a->n);
    LAUNCHED(q, "binary");
}

/* The elements of an input of the broadcast whose strides are st: its dimensions that stretch
 * count once. */
static int64_t input_elems(const cddp__bcast *bc, const int64_t *st) {
    int64_t n = 1;
    for (int d = 0; d < 4; d++)
        if (st[d] != 0 || bc->shape[d] == 1) n *= bc->shape[d];
    return n;
}

void cddp__cuda_binary_grad(cddp__kq *q, const cddp__k_binary_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->bc.shape[0] * a->bc.shape[1] * a->bc.shape[2] * a->bc.shape[3];
    if (n == 0) return;
    for (int of_b = 0; of_b < 2; of_b++) {
        float *dst = of_b ? a->db : a->da;
        if (!dst) continue;
        int64_t e = a->bc.same ? n : input_elems(&a->bc, of_b ? a->bc.sb : a->bc.sa);
        binary_grad_k<<<blocks(e), THREADS, 0, s>>>(a->op, a->bc, of_b, a->dz, a->a, a->b, dst, e);
        if (LAUNCHED(q, "binary_grad")) return;
    }
}

void cddp__cuda_to_bf16(cddp__kq *q, const cddp__k_to_bf16 *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->cols == 0) return;
    if (a->colsum) { /* rounded in the pass that sums the columns: src read once */
        colsum(q, s, src_rows{a->src, a->ld}, a->rows, a->cols, a->colsum, "to_bf16",
               bf16_store{a->dst, a->cols});
        return;
    }
    int64_t n = a->rows * a->cols;
    if ((a->ld == a->cols || a->rows == 1) && n % 4 == 0 && (uintptr_t)a->src % 16 == 0 &&
        (uintptr_t)a->dst % 8 == 0)
        to_bf16_dense_k<<<blocks(n / 4), THREADS, 0, s>>>((uint2 *)a->dst, (const float4 *)a->src,
                                                          n / 4);
    else
        to_bf16_k<<<blocks(n), THREADS, 0, s>>>(a->dst, a->src, a->rows, a->cols, a->ld);
    LAUNCHED(q, "to_bf16");
}

void cddp__cuda_layer_norm(cddp__kq *q, const cddp__k_layer_norm *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    unsigned grid = (unsigned)((a->rows + WARP_ROWS - 1) / WARP_ROWS);
    layer_norm_k<<<grid, THREADS, 0, s>>>(a->x, a->w, a->b, a->y, a->mean, a->rstd, a->rows, a->C,
                                          a->eps, a->y16);
    LAUNCHED(q, "layer_norm");
}

void cddp__cuda_layer_norm_grad(cddp__kq *q, const cddp__k_layer_norm_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    if (a->dx)
        layer_norm_dx_k<<<(unsigned)a->rows, THREADS, 0, s>>>(a->x, a->w, a->dy, a->mean, a->rstd,
                                                              a->dx, a->assign, a->C);
    if (LAUNCHED(q, "layer_norm_grad")) return;
    dy_h dw_of = {a->x, a->dy, a->mean, a->rstd, a->C};
    src_rows db_of = {a->dy, a->C};
    if (a->dw && a->db) /* one pass over x and dy for both */
        colsum_pair(q, s, dw_of, db_of, a->rows, a->C, a->dw, a->db, "layer_norm_grad");
    else if (a->dw)
        colsum(q, s, dw_of, a->rows, a->C, a->dw, "layer_norm_grad");
    else if (a->db)
        colsum(q, s, db_of, a->rows, a->C, a->db, "layer_norm_grad");
}

void cddp__cuda_gelu_tanh(cddp__kq *q, const cddp__k_gelu_tanh *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    gelu_tanh_k<<<blocks(a->n), THREADS, 0, s>>>(a->x, a->y, a->n, a->y16);
    LAUNCHED(q, "gelu_tanh");
}

void cddp__cuda_gelu_tanh_grad(cddp__kq *q, const cddp__k_gelu_tanh_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    if (a->dx16 && a->colsum) { /* made, rounded and summed in one pass over x and dy */
        colsum(q, s, gelu_dx{a->x, a->dy, a->cols}, a->n / a->cols, a->cols, a->colsum,
               "gelu_tanh_grad", bf16_store{a->dx16, a->cols});
        return;
    }
    gelu_tanh_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->dx, a->x, a->dy, a->n, !a->assign,
                                                      a->dx16);
    LAUNCHED(q, "gelu_tanh_grad");
}

void cddp__cuda_rms_norm(cddp__kq *q, const cddp__k_rms_norm *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    unsigned grid = (unsigned)((a->rows + WARP_ROWS - 1) / WARP_ROWS);
    rms_norm_k<<<grid, THREADS, 0, s>>>(a->x, a->w, a->y, a->rstd, a->rows, a->C, a->eps);
    LAUNCHED(q, "rms_norm");
}

void cddp__cuda_rms_norm_grad(cddp__kq *q, const cddp__k_rms_norm_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    if (a->dx)
        rms_norm_dx_k<<<(unsigned)a->rows, THREADS, 0, s>>>(a->x, a->w, a->dy, a->rstd, a->dx,
                                                            a->assign, a->C);
    if (LAUNCHED(q, "rms_norm_grad")) return;
    if (a->dw)
        colsum(q, s, rms_dy_h{a->x, a->dy, a->rstd, a->C}, a->rows, a->C, a->dw, "rms_norm_grad");
}

void cddp__cuda_silu_mul(cddp__kq *q, const cddp__k_silu_mul *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    silu_mul_k<<<blocks(a->n), THREADS, 0, s>>>(a->g, a->u, a->y, a->n);
    LAUNCHED(q, "silu_mul");
}

void cddp__cuda_silu_mul_grad(cddp__kq *q, const cddp__k_silu_mul_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    silu_mul_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->g, a->u, a->dy, a->dg, a->assign_g, a->du,
                                                    a->assign_u, a->n);
    LAUNCHED(q, "silu_mul_grad");
}

void cddp__cuda_rope(cddp__kq *q, const cddp__k_rope *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->rows * a->H * (a->D / 2);
    if (n == 0) return;
    rope_k<<<blocks(n), THREADS, 0, s>>>(a->x, a->y, a->inv_freq, a->rows, a->T, a->H, a->D,
                                         a->pos0, a->inverse, a->assign);
    LAUNCHED(q, "rope");
}

void cddp__cuda_qkv_pack(cddp__kq *q, const cddp__k_qkv_pack *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->rows * 3 * a->H * a->D;
    if (n == 0) return;
    qkv_pack_k<<<blocks(n), THREADS, 0, s>>>(a->q, a->k, a->v, a->qkv, a->rows, a->H, a->KV, a->D);
    LAUNCHED(q, "qkv_pack");
}

void cddp__cuda_qkv_pack_grad(cddp__kq *q, const cddp__k_qkv_pack_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->rows * (a->H + 2 * a->KV) * a->D;
    if (n == 0) return;
    qkv_pack_grad_k<<<blocks(n), THREADS, 0, s>>>(a->dqkv, a->dq, a->dk, a->dv, a->assign_q,
                                                  a->assign_k, a->assign_v, a->rows, a->H, a->KV,
                                                  a->D);
    LAUNCHED(q, "qkv_pack_grad");
}

void cddp__cuda_causal_softmax(cddp__kq *q, const cddp__k_causal_softmax *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->T == 0) return;
    causal_softmax_k<<<(unsigned)a->rows, THREADS, 0, s>>>(a->s, a->T);
    LAUNCHED(q, "causal_softmax");
}

void cddp__cuda_causal_softmax_grad(cddp__kq *q, const cddp__k_causal_softmax_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->T == 0) return;
    causal_softmax_grad_k<<<(unsigned)a->rows, THREADS, 0, s>>>(a->p, a->d, a->T);
    LAUNCHED(q, "causal_softmax_grad");
}

void cddp__cuda_attention_cached(cddp__kq *q, const cddp__k_attention_cached *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->B * a->T;
    if (n == 0) return;
    size_t shared = (size_t)(a->past + a->T) * sizeof(float);
    if (shared > 48 * 1024) {
        cddp__kq_fail(q, CDDP_EUNSUPPORTED,
                      "%s: attention with a cache of %lld positions: the CUDA device's kernel "
                      "holds at most 12288",
                      q->dev->name, (long long)(a->past + a->T));
        return;
    }
    kv_store_k<<<blocks(n * 2 * a->C), THREADS, 0, s>>>(a->qkv, a->cache, a->B, a->T, a->C, a->past,
                                                        a->L);
    attn_cached_k<<<(unsigned)(n * a->NH), THREADS, shared, s>>>(a->qkv, a->cache, a->out, a->T,
                                                                 a->C, a->NH, a->past, a->L);
    LAUNCHED(q, "attention_cached");
}
