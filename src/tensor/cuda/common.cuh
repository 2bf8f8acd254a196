/* common.cuh: what the CUDA device's kernel files (basic.cu, loss.cu, embedding.cu, optim.cu,
 * broadcast.cu, transformer.cu, llama.cu, attention.cu; cuda.h lists the kernels, tensor/kernels.h
 * says what each computes, the CPU's in src/tensor/cpu/ are the reference) share. Each kernel is a
 * __global__ function in its file's anonymous namespace, and its launcher, below it in the same
 * file, queues it on the device's stream and reports a failed launch through the kernel's queue
 * (LAUNCHED). Elementwise kernels walk their elements with a grid-stride loop (FOR_EACH);
 * reductions (a loss, a sum, a norm) run in one block of 1024 threads, in double, in a fixed
 * order, so that a result does not depend on the launch; a softmax or a row's loss takes a block
 * per row; column sums go through colsum. */
#ifndef CDDP_TENSOR_CUDA_COMMON_CUH
#define CDDP_TENSOR_CUDA_COMMON_CUH

#include "tensor/cuda/cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int THREADS = 256;
constexpr int REDUCE = 1024;
/* Kernels that take a warp per row (layer norm's and RMSNorm's forward): rows to a block. */
constexpr int WARP_ROWS = THREADS / 32;

/* Blocks for n elements with a grid-stride loop. */
inline unsigned blocks(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

#define FOR_EACH(i, n)                                                                             \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)

inline __device__ int64_t index_at(const void *ids, cddp_dtype dtype, int64_t i) {
    return dtype == CDDP_I64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
}

/* The sum of a block's values v (every thread's), in double, the same order every time; the
 * result in thread 0. */
inline __device__ double block_sum(double v) {
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
inline __device__ float block_max(float v) {
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
inline __device__ double warp_sum(double v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A softmax's row statistics: the largest value m and the sum of exp(x - m), kept by each thread
 * as it reads (rescaled when m grows), then merged across the block in a fixed order. */
struct lse_part {
    float m;
    double s;
};

inline __device__ lse_part merge(lse_part a, lse_part b) {
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return a;
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

inline __device__ lse_part with(lse_part p, float v) {
    if (v == -INFINITY) return p;
    if (v > p.m) p.s *= expf(p.m - v), p.m = v;
    p.s += expf(v - p.m);
    return p;
}

/* The block's merged statistics (every thread's p), in every thread. */
inline __device__ lse_part block_lse(lse_part p) {
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

/* f rounded to bf16 (to nearest even), as the host's to_bf16 rounds it */
inline __device__ uint16_t bf16_of(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
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

template <int = 0> /* a template: defined in every file that launches it */
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

} // namespace

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

#endif
