/* flash.cu: the CUDA device's causal self-attention by rows (flash_attention and its backward,
 * tensor/kernels.h; the CPU's reference is src/tensor/cpu/attn_rows.c), in bf16 on the tensor
 * cores, for heads of 32 or 64.
 *
 * A block of 4 warps takes 64 queries (or 64 keys) of one head, each warp 16 rows of them. The
 * float32 q, k, v (unless the op has them in bf16 already: qkv16) and the output's gradient are
 * first rounded to bf16 (by to_bf16 and flash_dot_k, into the step's scratch: the tiles' values,
 * which every product took rounded anyway); the kernels then copy tiles of them into shared memory
 * with cp.async, two stages deep, so that the next block's tiles come while this one's are
 * multiplied. Every product is the tensor cores' mma.sync m16n8k16 (bf16 operands, float32 sums),
 * its operands loaded from the tiles by ldmatrix. A warp's scores, weights and their gradients stay
 * in its registers: the float32 accumulators of one product, rounded in pairs, are the operands of
 * the next (the layouts of the PTX ISA's m16n8k16: a thread holds rows g and g + 8, g its lane / 4,
 * columns 2 (lane % 4) and the one after, of each 8 columns). Only the diagonal block is masked:
 * below it every key comes before every query.
 *
 *   forward   per key block: S = q k^T, the online softmax (each row's running maximum m and sum
 *             l, the output's rows rescaled when m grows), O += P v with P the unnormalised
 *             weights rounded to bf16; at the end out = O / l, lse = m + log l.
 *   backward  D = rowsum(dout out), dout rounded in the same pass (flash_dot_k); then two
 *             kernels, each summing in a fixed order (no atomics: the same gradients every
 *             run): per key block, over the query blocks at or below the diagonal,
 *             dv += P^T dout and dk += dS^T q; per query block, over the key blocks up to the
 *             diagonal, dq += dS k; with P = exp(S - lse) and dS = P (dout v^T - D) made again
 *             in each.
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

/* cp.async: 16 bytes from global to shared memory, of which `bytes` (16, or 0: zeros) are read;
 * a group of them committed, and a wait until all but the last n groups have landed. */
__device__ void copy16(bf16 *dst, const bf16 *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes)
                 : "memory");
}
__device__ void commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ void wait_landed() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Rows row0.. of a head's (T, D) bf16 slice (rows ld apart) into a tile (rows D + 8 apart), by
 * cp.async (nothing waits here); rows past T are zeros. */
template <int D>
__device__ void copy_tile(bf16 *tile, const bf16 *src, int64_t ld, int64_t row0, int64_t T) {
    constexpr int CH = D / 8, PER = ROWS * CH / THREADS; /* 16-byte pieces: of a row, a thread's */
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int i = threadIdx.x + k * THREADS, r = i / CH, c = i % CH * 8;
        bool in = row0 + r < T;
        copy16(tile + r * LD<D> + c, in ? src + (row0 + r) * ld + c : src, in ? 16 : 0);
    }
}

/* The block's warp's first row of the block's 64. */
__device__ int warp_row0() {
    return threadIdx.x / 32 * 16;
}

template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_forward_k(const bf16 *qkv, float *out, float *lse, uint16_t *out16, int64_t T, int64_t C,
                    int64_t NH, float scale) {
    /* two stages of (k, v): block kb's in stage kb % 2 while the next one's come; q at first
     * in stage 1 */
    __shared__ __align__(16) bf16 tiles[2][2][ROWS * LD<D>];
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t qb = gridDim.x - 1 - blockIdx.x, i0 = qb * ROWS + warp_row0();
    const bf16 *x = qkv + b * T * ld + h * D;
    copy_tile<D>(tiles[1][0], x, ld, qb * ROWS, T);
    copy_tile<D>(tiles[0][0], x + C, ld, 0, T);
    copy_tile<D>(tiles[0][1], x + 2 * C, ld, 0, T);
    commit();
    wait_landed<0>();
    __syncthreads();
    uint32_t qa[D / 16][4];
    rows_of<D>(qa, tiles[1][0]);
    float o[D / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float scale2 = scale * LOG2E; /* m: of the scores times log2 e; l: this thread's part */
    for (int64_t kb = 0; kb <= qb; kb++) {
        int cur = (int)(kb & 1);
        __syncthreads(); /* the other stage read (q, or the block before last's k and v) */
        if (kb < qb) {
            copy_tile<D>(tiles[cur ^ 1][0], x + C, ld, (kb + 1) * ROWS, T);
            copy_tile<D>(tiles[cur ^ 1][1], x + 2 * C, ld, (kb + 1) * ROWS, T);
        }
        commit();         /* (an empty group after the last block) */
        wait_landed<1>(); /* this block's k and v */
        __syncthreads();
        float s[NT][4];
        times_rows<D>(s, qa, tiles[cur][0]);
        /* keys after the query only on the diagonal; below it every key of the block is at or
         * before every query of the block (and before T). Rows past T are zeros and not stored. */
        bool diag = kb == qb;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                bool after = diag && col_of(n, e) > warp_row0() + row_of(e);
                s[n][e] = after ? -INFINITY : s[n][e] * scale2;
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
        add_times<D>(o, s, tiles[cur][1]);
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

/* D[row] = dout_row . out_row, a warp per (batch element, head, query) row; and the row of dout
 * rounded to bf16 into g16 (B, T, C) for the kernels' tiles, in the same pass. */
__global__ void flash_dot_k(const float *out, const float *dout, float *dsum, bf16 *g16, int64_t T,
                            int64_t C, int64_t NH, int64_t rows) {
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= rows) return;
    int64_t bh = w / T, i = w % T, b = bh / NH, h = bh % NH, HS = C / NH,
            at = (b * T + i) * C + h * HS;
    float s = 0.0f;
    for (int64_t c = lane; c < HS; c += 32) {
        float g = dout[at + c];
        s += out[at + c] * g;
        g16[at + c] = __float2bfloat16_rn(g);
    }
    s = warp_sum(s);
    if (lane == 0) dsum[w] = s;
}

/* Shared memory of both backward kernels: two stages of tiles, (q, dout) or (k, v), and the 64
 * queries' lse (times log2 e) and D. */
template <int D> struct bwd_tiles {
    bf16 tiles[2][2][ROWS * LD<D>];
    float lse[ROWS], dsum[ROWS];
};
static_assert(THREADS == 2 * ROWS, "a thread per query's lse and one per its D");

/* This thread's part of queries row0..'s lse (times log2 e) and D, from a head's (lse_h, dsum_h):
 * threads 0..63 the lse, 64..127 the D; 0 past T. Loaded early, stored in the tiles (put_stat)
 * once the last block's are read. */
__device__ float query_stat(const float *lse_h, const float *dsum_h, int64_t row0, int64_t T) {
    int r = threadIdx.x % ROWS;
    if (row0 + r >= T) return 0.0f;
    return threadIdx.x < ROWS ? lse_h[row0 + r] * LOG2E : dsum_h[row0 + r];
}
template <int D> __device__ void put_stat(bwd_tiles<D> &t, float v) {
    (threadIdx.x < ROWS ? t.lse : t.dsum)[threadIdx.x % ROWS] = v;
}

/* The weights P = exp(S - lse) (into s) and their gradient dS = P (dP - D) (into dp) of a
 * warp's 16 x 64 tile: queries are its rows and keys its columns, or (keys_rows) the other way
 * round; on the diagonal block (diag) the keys after a query are masked. lse and dsum by query of
 * the block. A query past T has q, dout, lse and D zero: its P is 1 and its dS 0, and nothing of
 * its row is stored (dq) or added (its dout row and dS are zeros: dk, dv). */
__device__ void weights(float (&s)[NT][4], float (&dp)[NT][4], bool keys_rows, bool diag,
                        const float *lse, const float *dsum, float scale2) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = warp_row0() + row_of(e), c = col_of(n, e), qi = keys_rows ? c : r;
            bool after = diag && (keys_rows ? r > c : c > r);
            float p = after ? 0.0f : exp2f(s[n][e] * scale2 - lse[qi]);
            s[n][e] = p;
            dp[n][e] = p * (dp[n][e] - dsum[qi]);
        }
}

/* dk and dv of 64 keys, over the query blocks from the diagonal down: (q, dout) of block qb in
 * stage (qb - kb + 1) % 2 while the next block's come. */
template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_dkv_k(const bf16 *qkv, const bf16 *dout, const float *lse, const float *dsum, float *dqkv,
                int64_t T, int64_t C, int64_t NH, float scale, bool assign) {
    __shared__ __align__(16) bwd_tiles<D> t;
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t kb = blockIdx.x, blocks = (T + ROWS - 1) / ROWS, j0 = kb * ROWS + warp_row0();
    const bf16 *x = qkv + b * T * ld + h * D, *g = dout + b * T * C + h * D;
    const float *lse_h = lse + bh * T, *dsum_h = dsum + bh * T;
    copy_tile<D>(t.tiles[0][0], x + C, ld, kb * ROWS, T);
    copy_tile<D>(t.tiles[0][1], x + 2 * C, ld, kb * ROWS, T);
    copy_tile<D>(t.tiles[1][0], x, ld, kb * ROWS, T);
    copy_tile<D>(t.tiles[1][1], g, C, kb * ROWS, T);
    commit();
    float stat = query_stat(lse_h, dsum_h, kb * ROWS, T);
    wait_landed<0>();
    __syncthreads();
    uint32_t ka[D / 16][4], va[D / 16][4];
    rows_of<D>(ka, t.tiles[0][0]);
    rows_of<D>(va, t.tiles[0][1]);
    float dk[D / 8][4] = {}, dv[D / 8][4] = {}, scale2 = scale * LOG2E;
    for (int64_t qb = kb; qb < blocks; qb++) {
        int cur = (int)((qb - kb + 1) & 1);
        __syncthreads(); /* the other stage (k and v at first) and the last block's lse, D read */
        put_stat(t, stat);
        if (qb + 1 < blocks) {
            copy_tile<D>(t.tiles[cur ^ 1][0], x, ld, (qb + 1) * ROWS, T);
            copy_tile<D>(t.tiles[cur ^ 1][1], g, C, (qb + 1) * ROWS, T);
            stat = query_stat(lse_h, dsum_h, (qb + 1) * ROWS, T);
        }
        commit();
        wait_landed<1>(); /* this block's q and dout */
        __syncthreads();
        const bf16 *qs = t.tiles[cur][0], *gs = t.tiles[cur][1];
        float st[NT][4], dpt[NT][4]; /* S^T and dP^T: keys by queries */
        times_rows<D>(st, ka, qs);
        times_rows<D>(dpt, va, gs);
        weights(st, dpt, true, qb == kb, t.lse, t.dsum, scale2);
        add_times<D>(dv, st, gs);
        add_times<D>(dk, dpt, qs);
    }
    float *dx = dqkv + b * T * ld + h * D;
    put_rows<D>(dx + C, ld, dk, j0, T, scale, assign);
    put_rows<D>(dx + 2 * C, ld, dv, j0, T, 1.0f, assign);
}

/* dq of 64 queries, over the key blocks up to the diagonal: (k, v) of block kb in stage kb % 2
 * while the next block's come; q and dout at first in stage 1. */
template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_dq_k(const bf16 *qkv, const bf16 *dout, const float *lse, const float *dsum, float *dqkv,
               int64_t T, int64_t C, int64_t NH, float scale, bool assign) {
    __shared__ __align__(16) bwd_tiles<D> t;
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t qb = gridDim.x - 1 - blockIdx.x, i0 = qb * ROWS + warp_row0();
    const bf16 *x = qkv + b * T * ld + h * D, *g = dout + b * T * C + h * D;
    copy_tile<D>(t.tiles[1][0], x, ld, qb * ROWS, T);
    copy_tile<D>(t.tiles[1][1], g, C, qb * ROWS, T);
    copy_tile<D>(t.tiles[0][0], x + C, ld, 0, T);
    copy_tile<D>(t.tiles[0][1], x + 2 * C, ld, 0, T);
    commit();
    put_stat(t, query_stat(lse + bh * T, dsum + bh * T, qb * ROWS, T));
    wait_landed<0>();
    __syncthreads();
    uint32_t qa[D / 16][4], ga[D / 16][4];
    rows_of<D>(qa, t.tiles[1][0]);
    rows_of<D>(ga, t.tiles[1][1]);
    float dq[D / 8][4] = {}, scale2 = scale * LOG2E;
    for (int64_t kb = 0; kb <= qb; kb++) {
        int cur = (int)(kb & 1);
        __syncthreads(); /* the other stage read (q and dout, or the block before last's k, v) */
        if (kb < qb) {
            copy_tile<D>(t.tiles[cur ^ 1][0], x + C, ld, (kb + 1) * ROWS, T);
            copy_tile<D>(t.tiles[cur ^ 1][1], x + 2 * C, ld, (kb + 1) * ROWS, T);
        }
        commit();
        wait_landed<1>(); /* this block's k and v */
        __syncthreads();
        const bf16 *ks = t.tiles[cur][0];
        float s[NT][4], dp[NT][4];
        times_rows<D>(s, qa, ks);
        times_rows<D>(dp, ga, t.tiles[cur][1]);
        weights(s, dp, false, kb == qb, t.lse, t.dsum, scale2);
        add_times<D>(dq, dp, ks);
    }
    put_rows<D>(dqkv + b * T * ld + h * D, ld, dq, i0, T, scale, assign);
}

/* n floats rounded to bf16 in the queue's scratch (the step's arena), for the kernels' tiles, by
 * the to_bf16 kernel; NULL when there is no scratch (reported). */
const bf16 *rounded(cddp__kq *q, const float *x, int64_t n) {
    uint16_t *r = (uint16_t *)cddp__kq_scratch(q, (size_t)n * sizeof(uint16_t));
    if (!r) return NULL;
    cddp__k_to_bf16 a = {};
    a.dst = r, a.src = x, a.rows = 1, a.cols = n, a.ld = n;
    cddp__cuda_to_bf16(q, &a); /* a failed launch is reported by it */
    return (const bf16 *)r;
}

template <int D>
void forward(cddp__kq *q, cudaStream_t s, const cddp__k_flash_attention *a, const bf16 *qkv) {
    dim3 grid((unsigned)((a->T + ROWS - 1) / ROWS), (unsigned)(a->B * a->NH));
    flash_forward_k<D><<<grid, THREADS, 0, s>>>(qkv, a->out, a->lse, a->out16, a->T, a->C, a->NH,
                                                1.0f / sqrtf((float)D));
    cddp__cuda_failed(q, cudaGetLastError(), "flash_attention");
}

template <int D>
void backward(cddp__kq *q, cudaStream_t s, const cddp__k_flash_attention_grad *a, const bf16 *qkv,
              const bf16 *dout, const float *dsum) {
    dim3 grid((unsigned)((a->T + ROWS - 1) / ROWS), (unsigned)(a->B * a->NH));
    float scale = 1.0f / sqrtf((float)D);
    flash_dkv_k<D><<<grid, THREADS, 0, s>>>(qkv, dout, a->lse, dsum, a->dqkv, a->T, a->C, a->NH,
                                            scale, a->assign);
    flash_dq_k<D><<<grid, THREADS, 0, s>>>(qkv, dout, a->lse, dsum, a->dqkv, a->T, a->C, a->NH,
                                           scale, a->assign);
    cddp__cuda_failed(q, cudaGetLastError(), "flash_attention_grad");
}

/* Whether the kernels take the shape (else the queue fails naming it). Any alignment of the
 * inputs is taken: the kernels read their bf16 copies (to_bf16, flash_dot_k). */
bool takes(cddp__kq *q, int64_t B, int64_t T, int64_t C, int64_t NH, cddp_dtype compute) {
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
    if (a->B * a->T == 0 || !takes(q, a->B, a->T, a->C, a->NH, a->compute)) return;
    const bf16 *qkv =
        a->qkv16 ? (const bf16 *)a->qkv16 : rounded(q, a->qkv, a->B * a->T * 3 * a->C);
    if (!qkv) return;
    if (a->C / a->NH == 64)
        forward<64>(q, s, a, qkv);
    else
        forward<32>(q, s, a, qkv);
}

void cddp__cuda_flash_attention_grad(cddp__kq *q, const cddp__k_flash_attention_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->B * a->T == 0 || !takes(q, a->B, a->T, a->C, a->NH, a->compute)) return;
    int64_t rows = a->B * a->NH * a->T;
    float *dsum = (float *)cddp__kq_scratch(q, (size_t)rows * sizeof(float));
    bf16 *dout =
        dsum ? (bf16 *)cddp__kq_scratch(q, (size_t)(a->B * a->T * a->C) * sizeof(bf16)) : NULL;
    if (!dout) return;
    flash_dot_k<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, s>>>(a->out, a->dout, dsum, dout,
                                                                    a->T, a->C, a->NH, rows);
    if (cddp__cuda_failed(q, cudaGetLastError(), "flash_attention_grad")) return;
    const bf16 *qkv =
        a->qkv16 ? (const bf16 *)a->qkv16 : rounded(q, a->qkv, a->B * a->T * 3 * a->C);
    if (!qkv) return;
    if (a->C / a->NH == 64)
        backward<64>(q, s, a, qkv, dout, dsum);
    else
        backward<32>(q, s, a, qkv, dout, dsum);
}
