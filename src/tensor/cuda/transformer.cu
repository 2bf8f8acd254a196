/* transformer.cu: the CUDA device's kernels of one family: the GPT's own kernels: GELU (tanh form)
 * and layer norm. Each kernel is followed by its launcher (common.cuh says how both are written).
 */
#include "tensor/cuda/common.cuh"

/* ---- the transformer's kernels ----------------------------------------------------------- */

constexpr float GELU_K = 0.7978845608028654f; /* sqrt(2 / pi) */
constexpr float GELU_C = 0.044715f;

/* y = GELU(x) (tanh form) where y is not NULL, and y16 rounded where it is not */
static __global__ void gelu_tanh_k(const float *x, float *y, int64_t n, uint16_t *y16) {
    FOR_EACH(i, n) {
        float v = x[i], th = tanhf(GELU_K * (v + GELU_C * v * v * v)), r = 0.5f * v * (1.0f + th);
        if (y) y[i] = r;
        if (y16) y16[i] = bf16_of(r);
    }
}

void cddp__cuda_gelu_tanh(cddp__kq *q, const cddp__k_gelu_tanh *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    gelu_tanh_k<<<blocks(a->n), THREADS, 0, s>>>(a->x, a->y, a->n, a->y16);
    LAUNCHED(q, "gelu_tanh");
}

/* GELU'(x) dy, the slope made from x again */
static __device__ float gelu_grad_of(float v, float g) {
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
static __global__ void gelu_tanh_grad_k(float *dx, const float *x, const float *dy, int64_t n,
                                        bool add, uint16_t *dx16) {
    FOR_EACH(i, n) {
        float g = gelu_grad_of(x[i], dy[i]);
        if (dx16)
            dx16[i] = bf16_of(g);
        else
            dx[i] = add ? dx[i] + g : g;
    }
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

/* Layer norm's forward takes a warp per row (a GPT's rows of 768 stay in cache between its three
 * passes: 1.7x faster than a block per row for GPT-2 on the H200), WARP_ROWS rows to a block; its
 * backward a block per row (a warp per row was 2.2x slower there). */
/* A row's mean and 1/std (sums in double), then the row. */
static __global__ void layer_norm_k(const float *x, const float *w, const float *b, float *y,
                                    float *mean, float *rstd, int64_t rows, int64_t C, float eps,
                                    uint16_t *y16) {
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

void cddp__cuda_layer_norm(cddp__kq *q, const cddp__k_layer_norm *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->C == 0) return;
    unsigned grid = (unsigned)((a->rows + WARP_ROWS - 1) / WARP_ROWS);
    layer_norm_k<<<grid, THREADS, 0, s>>>(a->x, a->w, a->b, a->y, a->mean, a->rstd, a->rows, a->C,
                                          a->eps, a->y16);
    LAUNCHED(q, "layer_norm");
}

/* dx, a block per row: with h = (x - mean) rstd and g = w dy, rstd (g - mean(g) - h mean(g h)) */
static __global__ void layer_norm_dx_k(const float *x, const float *w, const float *dy,
                                       const float *mean, const float *rstd, float *dx, bool assign,
                                       int64_t C) {
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
