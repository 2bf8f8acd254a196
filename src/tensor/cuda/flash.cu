/* flash.cu: the CUDA device's causal self-attention by rows (flash_attention and its backward,
 * tensor/kernels.h; the CPU's reference is src/tensor/cpu/attn_rows.c), in bf16 on the tensor
 * cores (WMMA's 16x16x16 products, float32 sums), for heads of 32 or 64.
 *
 * A block of 4 warps takes 64 queries (or 64 keys) of one head; each warp 16 rows of them. Tiles
 * of q, k, v and the output's gradient are read from float32 memory, rounded to bf16 into shared
 * memory, and multiplied there: a warp's products go through shared memory (scores, weights),
 * where its rows are its own, so only the tiles' loads need the whole block.
 *
 *   forward   per key block: S = q k^T, the online softmax (each row's running maximum m and sum
 *             l in registers, the output's rows rescaled when m grows), O += P v with P the
 *             unnormalised weights rounded to bf16; at the end out = O / l, lse = m + log l.
 *   backward  D = rowsum(dout out) (flash_dot_k); then two kernels, each summing in a fixed
 *             order (no atomics: the same gradients every run): per key block, over the query
 *             blocks at or below the diagonal, dv += P^T dout and dk += dS^T q; per query block,
 *             over the key blocks up to the diagonal, dq += dS k; with P = exp(S - lse) and
 *             dS = P (dout v^T - D) made again in each.
 * Blocks run heaviest first (the most blocks along the diagonal). */
#include "tensor/cuda/cuda.h"

#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int ROWS = 64;         /* queries or keys per block */
constexpr int WARPS = ROWS / 16; /* each 16 rows */
constexpr int THREADS = WARPS * 32;
constexpr int LDS = ROWS + 4; /* float tiles of scores (16-row fragments 32-byte aligned) */
constexpr int LDP = ROWS + 8; /* bf16 tiles of weights */
constexpr unsigned FULL = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f; /* exponentials as exp2f: scores times log2(e) */
constexpr float LN2 = 0.6931471805599453f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
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

/* A warp's 16 rows of a (64, 64) tile: out = a (16 rows of its tile, D wide) b^T (b: 64 rows of
 * D), both bf16 tiles with rows D + 8 apart, stored as floats with rows LDS apart. */
template <int D> __device__ void rows_times_t(float *out, const bf16 *a, const bf16 *b) {
    for (int n = 0; n < ROWS / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < D / 16; k++) {
            FragA fa;
            FragBt fb;
            wmma::load_matrix_sync(fa, a + k * 16, D + 8);
            wmma::load_matrix_sync(fb, b + n * 16 * (D + 8) + k * 16, D + 8);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, LDS, wmma::mem_row_major);
    }
}

/* acc[n] += a (16 rows of a bf16 tile, 64 wide, rows LDP apart) b (64 rows of D, rows D + 8
 * apart), column block n of D/16. */
template <int D> __device__ void rows_times(FragC *acc, const bf16 *a, const bf16 *b) {
    for (int k = 0; k < ROWS / 16; k++) {
        FragA fa;
        wmma::load_matrix_sync(fa, a + k * 16, LDP);
        for (int n = 0; n < D / 16; n++) {
            FragB fb;
            wmma::load_matrix_sync(fb, b + k * 16 * (D + 8) + n * 16, D + 8);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

/* Shared memory, carved in order: each piece a multiple of 32 bytes. */
struct carve {
    unsigned char *at;
    template <typename T> __device__ T *take(int count) {
        T *p = (T *)at;
        at += count * sizeof(T);
        return p;
    }
};

template <int D> constexpr size_t tile_bytes() {
    return (size_t)ROWS * (D + 8) * sizeof(bf16);
}

template <int D> constexpr size_t forward_bytes() {
    return 3 * tile_bytes<D>() + ROWS * LDP * sizeof(bf16) + ROWS * LDS * sizeof(float) +
           ROWS * (D + 4) * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_forward_k(const float *qkv, float *out, float *lse, uint16_t *out16, int64_t T, int64_t C,
                    int64_t NH, float scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    carve sh{smem};
    bf16 *qs = sh.take<bf16>(ROWS * (D + 8)), *ks = sh.take<bf16>(ROWS * (D + 8)),
         *vs = sh.take<bf16>(ROWS * (D + 8)), *ps = sh.take<bf16>(ROWS * LDP);
    float *ss = sh.take<float>(ROWS * LDS), *os = sh.take<float>(ROWS * (D + 4));
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t qb = gridDim.x - 1 - blockIdx.x, i0 = qb * ROWS;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *x = qkv + b * T * ld + h * D;
    load_tiles<D, 1>({qs}, {x}, {ld}, i0, T);
    for (int i = threadIdx.x; i < ROWS * (D + 4); i += THREADS) os[i] = 0.0f;
    float m[16], l[16]; /* the warp's rows' running maximum (of scores times log2 e) and sum */
    float scale2 = scale * LOG2E;
#pragma unroll
    for (int r = 0; r < 16; r++) m[r] = -INFINITY, l[r] = 0.0f;
    bf16 *pw = ps + warp * 16 * LDP;
    float *sw = ss + warp * 16 * LDS, *ow = os + warp * 16 * (D + 4);
    for (int64_t kb = 0; kb <= qb; kb++) {
        int64_t j0 = kb * ROWS;
        __syncthreads(); /* the last block's k and v read (and q, os ready) */
        load_tiles<D, 2>({ks, vs}, {x + C, x + 2 * C}, {ld, ld}, j0, T);
        __syncthreads();
        rows_times_t<D>(sw, qs + warp * 16 * (D + 8), ks);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < 16; r++) {
            int64_t i = i0 + warp * 16 + r, ja = j0 + lane, jb = ja + 32;
            float sa = ja <= i && ja < T ? sw[r * LDS + lane] * scale2 : -INFINITY;
            float sb = jb <= i && jb < T ? sw[r * LDS + lane + 32] * scale2 : -INFINITY;
            float mn = fmaxf(m[r], warp_max(fmaxf(sa, sb)));
            float shift = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet */
            float pa = exp2f(sa - shift), pb = exp2f(sb - shift), alpha = exp2f(m[r] - shift);
            pw[r * LDP + lane] = __float2bfloat16_rn(pa);
            pw[r * LDP + lane + 32] = __float2bfloat16_rn(pb);
            l[r] = l[r] * alpha + warp_sum(pa + pb);
            m[r] = mn;
            for (int c = lane; c < D; c += 32) ow[r * (D + 4) + c] *= alpha;
        }
        __syncwarp();
        FragC acc[D / 16];
        for (int n = 0; n < D / 16; n++)
            wmma::load_matrix_sync(acc[n], ow + n * 16, D + 4, wmma::mem_row_major);
        rows_times<D>(acc, pw, vs);
        for (int n = 0; n < D / 16; n++)
            wmma::store_matrix_sync(ow + n * 16, acc[n], D + 4, wmma::mem_row_major);
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < 16; r++) {
        int64_t i = i0 + warp * 16 + r;
        if (i >= T) break;
        float inv = 1.0f / l[r];
        for (int c = lane; c < D; c += 32) {
            float v = ow[r * (D + 4) + c] * inv;
            int64_t at = (b * T + i) * C + h * D + c;
            out[at] = v;
            if (out16) out16[at] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
        }
        if (lane == 0) lse[bh * T + i] = (m[r] + log2f(l[r])) * LN2;
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

/* The weights and their gradient for a warp's 16 rows of a (64, 64) tile, from the scores s and
 * dP (floats, rows LDS apart), into bf16 tiles p16 (may be NULL) and ds16 (rows LDP apart).
 * Query i, key j of element (r, c): keys_rows says the rows are keys (dk, dv's kernel) or queries
 * (dq's); lse (times log2 e) and dsum are the 64 queries' of the block. */
__device__ void weights(const float *s, const float *dp, bf16 *p16, bf16 *ds16, int64_t row0,
                        int64_t col0, bool keys_rows, const float *lse, const float *dsum,
                        int64_t T, float scale) {
    int lane = threadIdx.x % 32;
    float scale2 = scale * LOG2E;
    for (int r = 0; r < 16; r++)
        for (int c = lane; c < ROWS; c += 32) {
            int64_t a = row0 + r, e = col0 + c;
            int64_t i = keys_rows ? e : a, j = keys_rows ? a : e;
            int qi = keys_rows ? c : (int)(a - row0) + (int)(threadIdx.x / 32) * 16;
            float p = j <= i && i < T ? exp2f(s[r * LDS + c] * scale2 - lse[qi]) : 0.0f;
            float ds = p * (dp[r * LDS + c] - dsum[qi]);
            if (p16) p16[r * LDP + c] = __float2bfloat16_rn(p);
            ds16[r * LDP + c] = __float2bfloat16_rn(ds);
        }
}

/* A warp's 16 rows of a head's gradient (acc, D/16 fragments) times s into dqkv's slice (rows 3C
 * apart), stored (assign) or added, through stage (16 rows, LDS apart) */
template <int D>
__device__ void put_rows(float *dst, int64_t ld, FragC *acc, float *stage, int64_t row0, int64_t T,
                         float s, bool assign) {
    int lane = threadIdx.x % 32;
    for (int n = 0; n < D / 16; n++)
        wmma::store_matrix_sync(stage + n * 16, acc[n], LDS, wmma::mem_row_major);
    __syncwarp();
    for (int r = 0; r < 16 && row0 + r < T; r++)
        for (int c = lane; c < D; c += 32) {
            float v = stage[r * LDS + c] * s, *to = dst + (row0 + r) * ld + c;
            *to = assign ? v : *to + v;
        }
    __syncwarp();
}

template <int D> constexpr size_t backward_bytes() {
    return 4 * tile_bytes<D>() + 2 * ROWS * LDS * sizeof(float) + 2 * ROWS * LDP * sizeof(bf16) +
           2 * ROWS * sizeof(float);
}

/* The tiles both backward kernels use. */
template <int D> struct bwd_tiles {
    bf16 *qs, *gs, *ks, *vs, *p16, *ds16;
    float *s, *dp, *lse, *dsum;
    __device__ explicit bwd_tiles(unsigned char *smem) {
        carve sh{smem};
        qs = sh.take<bf16>(ROWS * (D + 8)), gs = sh.take<bf16>(ROWS * (D + 8));
        ks = sh.take<bf16>(ROWS * (D + 8)), vs = sh.take<bf16>(ROWS * (D + 8));
        s = sh.take<float>(ROWS * LDS), dp = sh.take<float>(ROWS * LDS);
        p16 = sh.take<bf16>(ROWS * LDP), ds16 = sh.take<bf16>(ROWS * LDP);
        lse = sh.take<float>(ROWS), dsum = sh.take<float>(ROWS);
    }
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

/* dk and dv of 64 keys, over the query blocks from the diagonal down. */
template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_dkv_k(const float *qkv, const float *dout, const float *lse, const float *dsum,
                float *dqkv, int64_t T, int64_t C, int64_t NH, float scale, bool assign) {
    extern __shared__ __align__(128) unsigned char smem[];
    bwd_tiles<D> t(smem);
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t kb = blockIdx.x, j0 = kb * ROWS, blocks = (T + ROWS - 1) / ROWS;
    int warp = threadIdx.x / 32;
    const float *x = qkv + b * T * ld + h * D, *g = dout + b * T * C + h * D;
    load_tiles<D, 2>({t.ks, t.vs}, {x + C, x + 2 * C}, {ld, ld}, j0, T);
    FragC dk[D / 16], dv[D / 16];
    for (int n = 0; n < D / 16; n++)
        wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
    float *sw = t.s + warp * 16 * LDS, *dpw = t.dp + warp * 16 * LDS;
    bf16 *pw = t.p16 + warp * 16 * LDP, *dsw = t.ds16 + warp * 16 * LDP;
    for (int64_t qb = kb; qb < blocks; qb++) {
        int64_t i0 = qb * ROWS;
        __syncthreads(); /* the last block's q and dout read */
        t.load_queries(x, ld, g, C, lse + bh * T, dsum + bh * T, i0, T);
        __syncthreads();
        rows_times_t<D>(sw, t.ks + warp * 16 * (D + 8), t.qs);  /* S^T: keys by queries */
        rows_times_t<D>(dpw, t.vs + warp * 16 * (D + 8), t.gs); /* dP^T */
        __syncwarp();
        weights(sw, dpw, pw, dsw, j0 + warp * 16, i0, true, t.lse, t.dsum, T, scale);
        __syncwarp();
        rows_times<D>(dv, pw, t.gs);
        rows_times<D>(dk, dsw, t.qs);
    }
    float *dx = dqkv + b * T * ld + h * D;
    put_rows<D>(dx + C, ld, dk, sw, j0 + warp * 16, T, scale, assign);
    put_rows<D>(dx + 2 * C, ld, dv, sw, j0 + warp * 16, T, 1.0f, assign);
}

/* dq of 64 queries, over the key blocks up to the diagonal. */
template <int D>
__global__ void __launch_bounds__(THREADS)
    flash_dq_k(const float *qkv, const float *dout, const float *lse, const float *dsum,
               float *dqkv, int64_t T, int64_t C, int64_t NH, float scale, bool assign) {
    extern __shared__ __align__(128) unsigned char smem[];
    bwd_tiles<D> t(smem);
    int64_t bh = blockIdx.y, b = bh / NH, h = bh % NH, ld = 3 * C;
    int64_t qb = gridDim.x - 1 - blockIdx.x, i0 = qb * ROWS;
    int warp = threadIdx.x / 32;
    const float *x = qkv + b * T * ld + h * D, *g = dout + b * T * C + h * D;
    t.load_queries(x, ld, g, C, lse + bh * T, dsum + bh * T, i0, T);
    FragC dq[D / 16];
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
    float *sw = t.s + warp * 16 * LDS, *dpw = t.dp + warp * 16 * LDS;
    bf16 *dsw = t.ds16 + warp * 16 * LDP;
    for (int64_t kb = 0; kb <= qb; kb++) {
        int64_t j0 = kb * ROWS;
        __syncthreads(); /* the last block's k and v read (and the queries loaded) */
        load_tiles<D, 2>({t.ks, t.vs}, {x + C, x + 2 * C}, {ld, ld}, j0, T);
        __syncthreads();
        rows_times_t<D>(sw, t.qs + warp * 16 * (D + 8), t.ks);
        rows_times_t<D>(dpw, t.gs + warp * 16 * (D + 8), t.vs);
        __syncwarp();
        weights(sw, dpw, NULL, dsw, i0 + warp * 16, j0, false, t.lse, t.dsum, T, scale);
        __syncwarp();
        rows_times<D>(dq, dsw, t.ks);
    }
    put_rows<D>(dqkv + b * T * ld + h * D, ld, dq, sw, i0 + warp * 16, T, scale, assign);
}

/* Launches kernel with `bytes` of shared memory (past the 48 KiB a launch gets unasked). */
template <typename K, typename... A>
bool launch(cddp__kq *q, K kernel, dim3 grid, size_t bytes, cudaStream_t s, const char *what,
            A... args) {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (cddp__cuda_failed(q, e, what)) return false;
    kernel<<<grid, THREADS, bytes, s>>>(args...);
    return !cddp__cuda_failed(q, cudaGetLastError(), what);
}

template <int D> void forward(cddp__kq *q, cudaStream_t s, const cddp__k_flash_attention *a) {
    dim3 grid((unsigned)((a->T + ROWS - 1) / ROWS), (unsigned)(a->B * a->NH));
    launch(q, flash_forward_k<D>, grid, forward_bytes<D>(), s, "flash_attention", a->qkv, a->out,
           a->lse, a->out16, a->T, a->C, a->NH, 1.0f / sqrtf((float)D));
}

template <int D>
void backward(cddp__kq *q, cudaStream_t s, const cddp__k_flash_attention_grad *a, float *dsum) {
    dim3 grid((unsigned)((a->T + ROWS - 1) / ROWS), (unsigned)(a->B * a->NH));
    float scale = 1.0f / sqrtf((float)D);
    if (launch(q, flash_dkv_k<D>, grid, backward_bytes<D>(), s, "flash_attention_grad", a->qkv,
               a->dout, a->lse, (const float *)dsum, a->dqkv, a->T, a->C, a->NH, scale, a->assign))
        launch(q, flash_dq_k<D>, grid, backward_bytes<D>(), s, "flash_attention_grad", a->qkv,
               a->dout, a->lse, (const float *)dsum, a->dqkv, a->T, a->C, a->NH, scale, a->assign);
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
