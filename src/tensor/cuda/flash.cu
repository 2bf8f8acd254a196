/* flash.cu: the CUDA device's causal self-attention by rows (flash_attention and its backward,
 * tensor/kernels.h; the CPU's reference is src/tensor/cpu/attn_rows.c), in bf16 on the tensor
 * cores, for heads of 32 or 64.
 *
 * A block of 4 warps takes 64 queries (or 64 keys) of one head, each warp 16 rows of them. Tiles
 * of q, k, v and the output's gradient are read from float32 memory and rounded to bf16 into
 * shared memory; every product is the tensor cores' mma.sync m16n8k16 (bf16 operands, float32
 * sums), its operands loaded from those tiles by ldmatrix. A warp's scores, weights and their
 * gradients stay in its registers: the float32 accumulators of one product, rounded in pairs,
 * are the operands of the next (the layouts of the PTX ISA's m16n8k16: a thread holds rows g and
 * g + 8, g its lane / 4, columns 2 (lane % 4) and the one after, of each 8 columns).
 *
 *   forward   per key block: S = q k^T, the online softmax (each row's running maximum m and sum
 *             l, the output's rows rescaled when m grows), O += P v with P the unnormalised
 *             weights rounded to bf16; at the end out = O / l, lse = m + log l.
 *   backward  D = rowsum(dout out) (flash_dot_k); then two kernels, each summing in a fixed
 *             order (no atomics: the same gradients every run): per key block, over the query
 *             blocks at or below the diagonal, dv += P^T dout and dk += dS^T q; per query block,
 *             over the key blocks up to the diagonal, dq += dS k; with P = exp(S - lse) and
 *             dS = P (dout v^T - D) made again in each.
 * Blocks run heaviest first (the most blocks along the diagonal). */
#include "tensor/cuda/cuda.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

namespace {

using bf16 = __nv_bfloat16;

constexpr int ROWS = 64;         /* queries or keys per block */
constexpr int WARPS = ROWS / 16; /* each 16 rows */
constexpr int THREADS = WARPS * 32;
constexpr int NT = ROWS / 8; /* a warp's 16 x 64 scores: 8 tiles of 16 x 8 */
constexpr unsigned FULL = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f; /* exponentials as exp2f: scores times log2(e) */
constexpr float LN2 = 0.6931471805599453f;

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

/* The largest (the sum) of a row's values across the 4 threads that hold it. */
__device__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL, v, 2));
}
__device__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL, v, 1);
    return v + __shfl_xor_sync(FULL, v, 2);
}

/* Two floats rounded to bf16, the first in the low half: a register of an mma operand. */
__device__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* ldmatrix .x4: four 8 x 8 bf16 matrices, lanes 8m..8m+7 naming matrix m's rows; trans: each
 * transposed. */
__device__ void ldsm(uint32_t (&r)[4], const bf16 *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row)));
}
__device__ void ldsm_t(uint32_t (&r)[4], const bf16 *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(row)));
}

/* c (16 x 8, float32) += a (16 x 16, bf16) b (16 x 8, bf16) */
__device__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Tiles in shared memory: bf16 rows of D + 8 (16-byte rows for ldmatrix, no bank conflicts). */
template <int D> constexpr int LD = D + 8;

/* The a operand of rows row0..row0+15, columns col0..col0+15 of a tile. */
template <int D> __device__ void load_a(uint32_t (&a)[4], const bf16 *tile, int row0, int col0) {
    int l = threadIdx.x % 32;
    ldsm(a, tile + (row0 + l % 16) * LD<D> + col0 + l / 16 * 8);
}

/* The b operands of two tiles of 8 columns, n0.. and n0 + 8.., of B^T where B's columns are the
 * tile's rows n0..n0+15 (B = the tile^T: scores q k^T take k's rows), over k0..k0+15: b[0], b[1]
 * the first's, b[2], b[3] the second's. */
template <int D> __device__ void load_bt(uint32_t (&b)[4], const bf16 *tile, int n0, int k0) {
    int l = threadIdx.x % 32;
    ldsm(b, tile + (n0 + l % 8 + l / 16 * 8) * LD<D> + k0 + l / 8 % 2 * 8);
}

/* The same where B is the tile itself: rows k0..k0+15, columns n0..n0+15 (P v takes v's rows). */
template <int D> __device__ void load_b(uint32_t (&b)[4], const bf16 *tile, int k0, int n0) {
    int l = threadIdx.x % 32;
    ldsm_t(b, tile + (k0 + l % 8 + l / 8 % 2 * 8) * LD<D> + n0 + l / 16 * 8);
}

/* s (a warp's 16 x 64) = a (its 16 rows, D/16 operands) times the tile's 64 rows transposed. */
template <int D>
__device__ void times_rows(float (&s)[NT][4], const uint32_t (&a)[D / 16][4], const bf16 *tile) {
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < D / 16; k++)
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t b[4];
            load_bt<D>(b, tile, n * 8, k * 16);
            mma(s[n], a[k], b[0], b[1]);
            mma(s[n + 1], a[k], b[2], b[3]);
        }
}

/* acc (16 x D) += w (16 x 64, float32, rounded here) times the tile (64 rows of D). */
template <int D>
__device__ void add_times(float (&acc)[D / 8][4], const float (&w)[NT][4], const bf16 *tile) {
#pragma unroll
    for (int k = 0; k < NT / 2; k++) {
        uint32_t a[4] = {pack(w[2 * k][0], w[2 * k][1]), pack(w[2 * k][2], w[2 * k][3]),
                         pack(w[2 * k + 1][0], w[2 * k + 1][1]),
                         pack(w[2 * k + 1][2], w[2 * k + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            uint32_t b[4];
            load_b<D>(b, tile, k * 16, n * 8);
            mma(acc[n], a, b[0], b[1]);
            mma(acc[n + 1], a, b[2], b[3]);
        }
    }
}

/* A warp's D/16 a operands of its 16 rows of a tile. */
template <int D> __device__ void rows_of(uint32_t (&a)[D / 16][4], const bf16 *tile) {
    int warp = threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < D / 16; k++) load_a<D>(a[k], tile, warp * 16, k * 16);
}

/* Element e of accumulator tile n: its row in the warp's 16 (g or g + 8) and column of 64. */
__device__ int row_of(int e) {
    return threadIdx.x % 32 / 4 + (e >= 2 ? 8 : 0);
}
__device__ int col_of(int n, int e) {
    return n * 8 + threadIdx.x % 4 * 2 + (e & 1);
}

/* acc (a warp's 16 rows of D, times s) into rows row0.. of a head's slice (rows ld apart),
 * stored (assign) or added; rows past T left alone. */
template <int D>
__device__ void put_rows(float *dst, int64_t ld, const float (&acc)[D / 8][4], int64_t row0,
                         int64_t T, float s, bool assign) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int64_t r = row0 + row_of(2 * h);
        if (r >= T) continue;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            float2 *to = (float2 *)(dst + r * ld + col_of(n, 0));
            float2 v = make_float2(acc[n][2 * h] * s, acc[n][2 * h + 1] * s);
            if (!assign) v.x += to->x, v.y += to->y;
            *to = v;
        }
    }
}

/* Rows row0.. of N heads' (T, D) slices (src[t], rows ld[t] floats apart, 16-byte aligned)
 * rounded into bf16 tiles dst[t] (rows D + 8 apart); rows past T are zeros. Every load is issued
 * before the first is used (16 bytes each): one trip to memory per call, not one per element. */
template <int D, int N>
__device__ void load_tiles(bf16 *const (&dst)[N], const float *const (&src)[N],
                           const int64_t (&ld)[N], int64_t row0, int64_t T) {
    constexpr int PER = ROWS * D / 4 / THREADS; /* float4s of a tile per thread */
    float4 v[N][PER];
#pragma unroll
    for (int t = 0; t < N; t++)
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int i = threadIdx.x + k * THREADS, r = i / (D / 4), c = i % (D / 4) * 4;
            v[t][k] = row0 + r < T ? *(const float4 *)(src[t] + (row0 + r) * ld[t] + c)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
    for (int t = 0; t < N; t++)
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int i = threadIdx.x + k * THREADS, r = i / (D / 4), c = i % (D / 4) * 4;
            __nv_bfloat162 *to = (__nv_bfloat162 *)(dst[t] + r * (D + 8) + c);
            to[0] = __floats2bfloat162_rn(v[t][k].x, v[t][k].y);
            to[1] = __floats2bfloat162_rn(v[t][k].z, v[t][k].w);
        }
}

template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_forward_k(const float *qkv, float *out, float *lse, uint16_t *out16, int64_t T, int64_t C,
                    int64_t NH, float scale) {
    __shared__ __align__(16) bf16 qs[ROWS * LD<D>], ks[ROWS * LD<D>], vs[ROWS * LD<D>];
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t qb = gridDim.x - 1 - blockIdx.x, i0 = qb * ROWS + threadIdx.x / 32 * 16;
    const float *x = qkv + b * T * ld + h * D;
    load_tiles<D, 1>({qs}, {x}, {ld}, qb * ROWS, T);
    __syncthreads();
    uint32_t qa[D / 16][4];
    rows_of<D>(qa, qs);
    float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float scale2 = scale * LOG2E; /* m: of the scores times log2 e; l: this thread's part */
    for (int64_t kb = 0; kb <= qb; kb++) {
        int64_t j0 = kb * ROWS;
        __syncthreads(); /* the last block's k and v read */
        load_tiles<D, 2>({ks, vs}, {x + C, x + 2 * C}, {ld, ld}, j0, T);
        __syncthreads();
        float s[NT][4];
        times_rows<D>(s, qa, ks);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t i = i0 + row_of(e), j = j0 + col_of(n, e);
                s[n][e] = j <= i && j < T ? s[n][e] * scale2 : -INFINITY;
                mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
            }
        float shift[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mn = fmaxf(m[r], quad_max(mx[r]));
            shift[r] = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet */
            alpha[r] = exp2f(m[r] - shift[r]);
            m[r] = mn;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = exp2f(s[n][e] - shift[e / 2]);
                l[e / 2] += s[n][e];
            }
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[n][e] *= alpha[e / 2];
        add_times<D>(o, s, vs);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
        int64_t i = i0 + row_of(2 * r);
        if (i >= T) continue;
        if (threadIdx.x % 4 == 0) lse[bh * T + i] = (m[r] + log2f(l[r])) * LN2;
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[n][2 * r] /= l[r], o[n][2 * r + 1] /= l[r];
    }
    float *y = out + b * T * C + h * D;
    put_rows<D>(y, C, o, i0, T, 1.0f, true);
    if (out16)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int64_t i = i0 + row_of(2 * r);
            if (i >= T) continue;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                *(uint32_t *)(out16 + (b * T + i) * C + h * D + col_of(n, 0)) =
                    pack(o[n][2 * r], o[n][2 * r + 1]);
        }
}

/* D[row] = dout_row . out_row, a warp per (batch element, head, query) row. */
__global__ void flash_dot_k(const float *out, const float *dout, float *dsum, int64_t T, int64_t C,
                            int64_t NH, int64_t rows) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= rows) return;
    int64_t bh = w / T, i = w % T, b = bh / NH, h = bh % NH, HS = C / NH;
    const float *o = out + (b * T + i) * C + h * HS, *g = dout + (b * T + i) * C + h * HS;
    float s = 0.0f;
    for (int64_t c = lane; c < HS; c += 32) s += o[c] * g[c];
    s = warp_sum(s);
    if (lane == 0) dsum[w] = s;
}

/* The tiles both backward kernels use, and the block's 64 queries' lse (times log2 e) and D. */
template <int D> struct bwd_tiles {
    bf16 qs[ROWS * LD<D>], gs[ROWS * LD<D>], ks[ROWS * LD<D>], vs[ROWS * LD<D>];
    float lse[ROWS], dsum[ROWS];
    /* q and dout's rows i0.. and their lse and D */
    __device__ void load_queries(const float *x, int64_t ld, const float *g, int64_t C,
                                 const float *lse_h, const float *dsum_h, int64_t i0, int64_t T) {
        load_tiles<D, 2>({qs, gs}, {x, g}, {ld, C}, i0, T);
        for (int r = threadIdx.x; r < ROWS; r += THREADS) {
            lse[r] = i0 + r < T ? lse_h[i0 + r] * LOG2E : 0.0f;
            dsum[r] = i0 + r < T ? dsum_h[i0 + r] : 0.0f;
        }
    }
};

/* The weights P = exp(S - lse) (into s) and their gradient dS = P (dP - D) (into dp) of a
 * warp's 16 x 64 tile, masked to i >= j, i < T: queries i and keys j are the rows (from row0)
 * and columns (from col0), or (keys_rows) the other way round; lse and dsum by query of the
 * block. */
__device__ void weights(float (&s)[NT][4], float (&dp)[NT][4], int64_t row0, int64_t col0,
                        bool keys_rows, const float *lse, const float *dsum, int64_t T,
                        float scale2) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = row_of(e), c = col_of(n, e);
            int64_t i = keys_rows ? col0 + c : row0 + r, j = keys_rows ? row0 + r : col0 + c;
            int qi = keys_rows ? c : (int)(threadIdx.x / 32 * 16) + r;
            float p = j <= i && i < T ? exp2f(s[n][e] * scale2 - lse[qi]) : 0.0f;
            s[n][e] = p;
            dp[n][e] = p * (dp[n][e] - dsum[qi]);
        }
}

/* dk and dv of 64 keys, over the query blocks from the diagonal down. */
template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_dkv_k(const float *qkv, const float *dout, const float *lse, const float *dsum,
                float *dqkv, int64_t T, int64_t C, int64_t NH, float scale, bool assign) {
    __shared__ __align__(16) bwd_tiles<D> t;
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t kb = blockIdx.x, blocks = (T + ROWS - 1) / ROWS, j0 = kb * ROWS + threadIdx.x / 32 * 16;
    const float *x = qkv + b * T * ld + h * D, *g = dout + b * T * C + h * D;
    load_tiles<D, 2>({t.ks, t.vs}, {x + C, x + 2 * C}, {ld, ld}, kb * ROWS, T);
    __syncthreads();
    uint32_t ka[D / 16][4], va[D / 16][4];
    rows_of<D>(ka, t.ks);
    rows_of<D>(va, t.vs);
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};
    for (int64_t qb = kb; qb < blocks; qb++) {
        __syncthreads(); /* the last block's q and dout read */
        t.load_queries(x, ld, g, C, lse + bh * T, dsum + bh * T, qb * ROWS, T);
        __syncthreads();
        float st[NT][4], dpt[NT][4]; /* S^T and dP^T: keys by queries */
        times_rows<D>(st, ka, t.qs);
        times_rows<D>(dpt, va, t.gs);
        weights(st, dpt, j0, qb * ROWS, true, t.lse, t.dsum, T, scale * LOG2E);
        add_times<D>(dv, st, t.gs);
        add_times<D>(dk, dpt, t.qs);
    }
    float *dx = dqkv + b * T * ld + h * D;
    put_rows<D>(dx + C, ld, dk, j0, T, scale, assign);
    put_rows<D>(dx + 2 * C, ld, dv, j0, T, 1.0f, assign);
}

/* dq of 64 queries, over the key blocks up to the diagonal. */
template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_dq_k(const float *qkv, const float *dout, const float *lse, const float *dsum,
               float *dqkv, int64_t T, int64_t C, int64_t NH, float scale, bool assign) {
    __shared__ __align__(16) bwd_tiles<D> t;
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t qb = gridDim.x - 1 - blockIdx.x, i0 = qb * ROWS + threadIdx.x / 32 * 16;
    const float *x = qkv + b * T * ld + h * D, *g = dout + b * T * C + h * D;
    t.load_queries(x, ld, g, C, lse + bh * T, dsum + bh * T, qb * ROWS, T);
    __syncthreads();
    uint32_t qa[D / 16][4], ga[D / 16][4];
    rows_of<D>(qa, t.qs);
    rows_of<D>(ga, t.gs);
    float dq[D / 8][4] = {};
    for (int64_t kb = 0; kb <= qb; kb++) {
        __syncthreads(); /* the last block's k and v read */
        load_tiles<D, 2>({t.ks, t.vs}, {x + C, x + 2 * C}, {ld, ld}, kb * ROWS, T);
        __syncthreads();
        float s[NT][4], dp[NT][4];
        times_rows<D>(s, qa, t.ks);
        times_rows<D>(dp, ga, t.vs);
        weights(s, dp, i0, kb * ROWS, false, t.lse, t.dsum, T, scale * LOG2E);
        add_times<D>(dq, dp, t.ks);
    }
    put_rows<D>(dqkv + b * T * ld + h * D, ld, dq, i0, T, scale, assign);
}

template <int D> void forward(cddp__kq *q, cudaStream_t s, const cddp__k_flash_attention *a) {
    dim3 grid((unsigned)((a->T + ROWS - 1) / ROWS), (unsigned)(a->B * a->NH));
    flash_forward_k<D><<<grid, THREADS, 0, s>>>(a->qkv, a->out, a->lse, a->out16, a->T, a->C, a->NH,
                                                1.0f / sqrtf((float)D));
    cddp__cuda_failed(q, cudaGetLastError(), "flash_attention");
}

template <int D>
void backward(cddp__kq *q, cudaStream_t s, const cddp__k_flash_attention_grad *a, float *dsum) {
    dim3 grid((unsigned)((a->T + ROWS - 1) / ROWS), (unsigned)(a->B * a->NH));
    float scale = 1.0f / sqrtf((float)D);
    flash_dkv_k<D><<<grid, THREADS, 0, s>>>(a->qkv, a->dout, a->lse, dsum, a->dqkv, a->T, a->C,
                                            a->NH, scale, a->assign);
    flash_dq_k<D><<<grid, THREADS, 0, s>>>(a->qkv, a->dout, a->lse, dsum, a->dqkv, a->T, a->C,
                                           a->NH, scale, a->assign);
    cddp__cuda_failed(q, cudaGetLastError(), "flash_attention_grad");
}

/* Whether the kernels take the shape and the tensors (16-byte aligned: their loads are float4's;
 * else the queue fails naming it). */
bool takes(cddp__kq *q, int64_t B, int64_t T, int64_t C, int64_t NH, cddp_dtype compute,
           const float *a, const float *b) {
    if (((uintptr_t)a | (uintptr_t)b) % 16) {
        cddp__kq_fail(q, CDDP_EUNSUPPORTED,
                      "%s: attention by rows reads tensors aligned to 16 bytes, not %p and %p",
                      q->dev->name, (const void *)a, (const void *)b);
        return false;
    }
    if (cddp__gpu_attends_by_rows(B, T, NH, C / NH, compute)) return true;
    cddp__kq_fail(q, CDDP_EUNSUPPORTED,
                  "%s: attention by rows takes bf16 heads of 32 or 64, at most 65535 heads in all, "
                  "not %lld x %lld heads of %lld in %s",
                  q->dev->name, (long long)B, (long long)NH, (long long)(C / NH),
                  cddp_dtype_name(compute));
    return false;
}

} // namespace

void cddp__cuda_flash_attention(cddp__kq *q, const cddp__k_flash_attention *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->B * a->T == 0 || !takes(q, a->B, a->T, a->C, a->NH, a->compute, a->qkv, a->qkv)) return;
    if (a->C / a->NH == 64)
        forward<64>(q, s, a);
    else
        forward<32>(q, s, a);
}

void cddp__cuda_flash_attention_grad(cddp__kq *q, const cddp__k_flash_attention_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->B * a->T == 0 || !takes(q, a->B, a->T, a->C, a->NH, a->compute, a->qkv, a->dout)) return;
    int64_t rows = a->B * a->NH * a->T;
    float *dsum = (float *)cddp__kq_scratch(q, (size_t)rows * sizeof(float));
    if (!dsum) return;
    flash_dot_k<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, s>>>(a->out, a->dout, dsum, a->T,
                                                                    a->C, a->NH, rows);
    if (cddp__cuda_failed(q, cudaGetLastError(), "flash_attention_grad")) return;
    if (a->C / a->NH == 64)
        backward<64>(q, s, a, dsum);
    else
        backward<32>(q, s, a, dsum);
}
