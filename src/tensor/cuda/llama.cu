/* llama.cu: the CUDA device's kernels of one family: Llama's kernels (the CPU's in
 * tensor/cpu/llama.c): RMSNorm, SwiGLU, rotary positions, grouped key/value heads. The kernels
 * first, then their launchers (common.cuh says how both are written). */
#include "tensor/cuda/common.cuh"

/* ---- Llama's kernels (the CPU's in tensor/cpu/llama.c) ----------------------------------- */

/* RMSNorm, a warp per row as layer_norm_k: 1/rms (the sum of squares in double), then the row */
static __global__ void rms_norm_k(const float *x, const float *w, float *y, float *rstd,
                                  int64_t rows, int64_t C, float eps) {
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

void cddp__cuda_rms_norm(cddp__kq *q, const cddp__k_rms_norm *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    unsigned grid = (unsigned)((a->rows + WARP_ROWS - 1) / WARP_ROWS);
    rms_norm_k<<<grid, THREADS, 0, s>>>(a->x, a->w, a->y, a->rstd, a->rows, a->C, a->eps);
    LAUNCHED(q, "rms_norm");
}

/* dx, a block per row: with h = x rstd and g = w dy, rstd (g - h mean(g h)) */
static __global__ void rms_norm_dx_k(const float *x, const float *w, const float *dy,
                                     const float *rstd, float *dx, bool assign, int64_t C) {
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

static __device__ float sigmoid_of(float v) {
    return 1.0f / (1.0f + expf(-v));
}

/* y = silu(g) u */
static __global__ void silu_mul_k(const float *g, const float *u, float *y, int64_t n) {
    FOR_EACH(i, n) y[i] = g[i] * sigmoid_of(g[i]) * u[i];
}

void cddp__cuda_silu_mul(cddp__kq *q, const cddp__k_silu_mul *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    silu_mul_k<<<blocks(a->n), THREADS, 0, s>>>(a->g, a->u, a->y, a->n);
    LAUNCHED(q, "silu_mul");
}

/* dg = dy u s (1 + g (1 - s)), du = dy g s, each stored (assign) or added, each may be NULL */
static __global__ void silu_mul_grad_k(const float *g, const float *u, const float *dy, float *dg,
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

void cddp__cuda_silu_mul_grad(cddp__kq *q, const cddp__k_silu_mul_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    silu_mul_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->g, a->u, a->dy, a->dg, a->assign_g, a->du,
                                                     a->assign_u, a->n);
    LAUNCHED(q, "silu_mul_grad");
}

/* Rotary positions, a thread per pair (row r, head h, i < D/2): the pair (i, i + D/2) turned by
 * (pos0 + r mod T) inv_freq[i] (float32, as the CPU's), or by minus it (inverse) */
static __global__ void rope_k(const float *x, float *y, const float *inv_freq, int64_t rows,
                              int64_t T, int64_t H, int64_t D, int64_t pos0, bool inverse,
                              bool assign) {
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

void cddp__cuda_rope(cddp__kq *q, const cddp__k_rope *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->rows * a->H * (a->D / 2);
    if (n == 0) return;
    rope_k<<<blocks(n), THREADS, 0, s>>>(a->x, a->y, a->inv_freq, a->rows, a->T, a->H, a->D,
                                         a->pos0, a->inverse, a->assign);
    LAUNCHED(q, "rope");
}

/* qkv rows (3 H D): q, then k and v with kv head h / (H / KV) in head h's place */
static __global__ void qkv_pack_k(const float *q, const float *k, const float *v, float *qkv,
                                  int64_t rows, int64_t H, int64_t KV, int64_t D) {
    int64_t C = H * D, KVC = KV * D, rep = H / KV;
    FOR_EACH(e, rows * 3 * C) {
        int64_t r = e / (3 * C), j = e % (3 * C), part = j / C, c = j % C;
        const float *src =
            part == 0 ? q + r * C + c : (part == 1 ? k : v) + r * KVC + c / D / rep * D + c % D;
        qkv[e] = *src;
    }
}

void cddp__cuda_qkv_pack(cddp__kq *q, const cddp__k_qkv_pack *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->rows * 3 * a->H * a->D;
    if (n == 0) return;
    qkv_pack_k<<<blocks(n), THREADS, 0, s>>>(a->q, a->k, a->v, a->qkv, a->rows, a->H, a->KV, a->D);
    LAUNCHED(q, "qkv_pack");
}

/* dq from dqkv, and dk, dv each the sum of its heads' gradients in head order */
static __global__ void qkv_pack_grad_k(const float *dqkv, float *dq, float *dk, float *dv, bool aq,
                                       bool ak, bool av, int64_t rows, int64_t H, int64_t KV,
                                       int64_t D) {
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

void cddp__cuda_qkv_pack_grad(cddp__kq *q, const cddp__k_qkv_pack_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->rows * (a->H + 2 * a->KV) * a->D;
    if (n == 0) return;
    qkv_pack_grad_k<<<blocks(n), THREADS, 0, s>>>(a->dqkv, a->dq, a->dk, a->dv, a->assign_q,
                                                  a->assign_k, a->assign_v, a->rows, a->H, a->KV,
                                                  a->D);
    LAUNCHED(q, "qkv_pack_grad");
}
