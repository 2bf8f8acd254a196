/* pool.c: the CPU's pooling kernels: max pooling (with a ReLU before it where asked), average
 * pooling and adaptive average pooling, forward and backward.
 *
 * cddp's own loops, not oneDNN's: on cddp's plain (N,C,H,W) layout oneDNN 2.6 pools with its
 * reference kernel (2x2 max pooling of 64x16x28x28: 13.3 ms forward against 0.4 ms here, with
 * vec.c's loop), and its fast kernels want a blocked layout that would cost a reorder each way.
 * oneDNN's max pooling also drops NaNs, which PyTorch's (and cddp's) propagate. */
#include "tensor/cpu/cpu.h"

#include <math.h>
#include <string.h>

/* The window of output oh (and likewise ow) clipped to the input: rows [*h0, *h1). */
static void window(int64_t o, int stride, int padding, int kernel, int64_t H, int64_t *h0,
                   int64_t *h1) {
    int64_t a = o * stride - padding;
    *h1 = CDDP_MIN(a + kernel, H);
    *h0 = CDDP_MAX(a, 0);
}

void cddp__cpu_max_pool(cddp__kq *q, const cddp__k_max_pool *a) {
    (void)q;
    int64_t H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    int kernel = a->kernel, stride = a->stride, padding = a->padding;
    bool relu = a->relu;
    if (kernel == 2 && stride == 2 && padding == 0) {
        /* the common case, with the general loop's results, in vec.c's vectorised loop */
        cddp__max_pool2x2(a->x, a->planes, H, W, OH, OW, a->y, a->arg, relu);
        return;
    }
    for (int64_t nc = 0; nc < a->planes; nc++) {
        const float *src = a->x + nc * H * W;
        float *dst = a->y + nc * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            /* The window's rows and columns clipped to the input, so the scan needs no checks;
             * padding <= kernel / 2 guarantees every window holds at least one element. */
            int64_t h0, h1;
            window(oh, stride, padding, kernel, H, &h0, &h1);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0, w1;
                window(ow, stride, padding, kernel, W, &w0, &w1);
                int64_t best = h0 * W + w0;
                float m = src[best];
                if (relu) m = m > 0.0f ? m : 0.0f;
                for (int64_t ih = h0; ih < h1 && !isnan(m); ih++)
                    for (int64_t iw = w0; iw < w1; iw++) {
                        float v = src[ih * W + iw];
                        if (relu) v = v > 0.0f ? v : 0.0f;
                        if (v > m || isnan(v)) { /* NaN wins and stays, as in PyTorch */
                            m = v;
                            best = ih * W + iw;
                            if (isnan(v)) break;
                        }
                    }
                dst[oh * OW + ow] = m;
                if (a->arg) a->arg[nc * OH * OW + oh * OW + ow] = (int32_t)best;
            }
        }
    }
}

/* Each window's gradient goes to the element that was its maximum; with y (a ReLU's pooling)
 * only where that maximum is positive (the ReLU's gradient there, 0 elsewhere). */
void cddp__cpu_max_pool_grad(cddp__kq *q, const cddp__k_max_pool_grad *a) {
    (void)q;
    int64_t H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    const float *dy = a->dy, *y = a->y;
    float *dx = a->dx;
    if (a->assign && a->kernel == 2 && a->stride == 2 && a->padding == 0) {
        /* windows that tile the plane: each written whole, no zeroing first */
        cddp__max_pool2x2_grad(a->arg, dy, y, dx, a->planes, H, W, OH, OW);
        return;
    }
    if (a->assign) memset(dx, 0, (size_t)(a->planes * H * W) * sizeof(float));
    for (int64_t nc = 0; nc < a->planes; nc++)
        for (int64_t p = 0; p < OH * OW; p++) {
            int64_t o = nc * OH * OW + p;
            if (!y || y[o] > 0.0f) dx[nc * H * W + a->arg[o]] += dy[o];
        }
}

/* Every window divides by kernel * kernel, padding included (PyTorch's count_include_pad). */
void cddp__cpu_avg_pool(cddp__kq *q, const cddp__k_avg_pool *a) {
    (void)q;
    int64_t H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    int kernel = a->kernel, stride = a->stride, padding = a->padding;
    float inv = 1.0f / (float)(kernel * kernel);
    for (int64_t nc = 0; nc < a->planes; nc++) {
        const float *src = a->x + nc * H * W;
        float *dst = a->y + nc * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0, h1;
            window(oh, stride, padding, kernel, H, &h0, &h1);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0, w1;
                window(ow, stride, padding, kernel, W, &w0, &w1);
                float s = 0;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) s += src[ih * W + iw];
                dst[oh * OW + ow] = s * inv;
            }
        }
    }
}

void cddp__cpu_avg_pool_grad(cddp__kq *q, const cddp__k_avg_pool_grad *a) {
    (void)q;
    int64_t H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    int kernel = a->kernel, stride = a->stride, padding = a->padding;
    float inv = 1.0f / (float)(kernel * kernel);
    for (int64_t nc = 0; nc < a->planes; nc++) {
        const float *dy = a->dy + nc * OH * OW;
        float *d = a->dx + nc * H * W;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t h0, h1;
            window(oh, stride, padding, kernel, H, &h0, &h1);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0, w1;
                window(ow, stride, padding, kernel, W, &w0, &w1);
                float g = dy[oh * OW + ow] * inv;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++) d[ih * W + iw] += g;
            }
        }
    }
}

/* ---- adaptive average pooling --------------------------------------------------------------
 * Output cell i of a dimension of n inputs and m outputs averages inputs [floor(i n / m),
 * ceil((i + 1) n / m)), PyTorch's windows. */

static int64_t lo(int64_t i, int64_t n, int64_t m) {
    return i * n / m;
}

static int64_t hi(int64_t i, int64_t n, int64_t m) {
    return ((i + 1) * n + m - 1) / m;
}

/* Adaptive average pooling walks x as blocks of B channels side by side (its layout's block, or 1
 * when row-major), every channel of a block at once at each position: a channel's sum runs in the
 * same order either way, and B channels' sums in lanes are not one long chain of dependent adds.
 * (The ResNet's global pooling of (64, 64, 7, 7) blocked by 16 had taken 1 % of its step.) */
#define POOL_LANES 16

void cddp__cpu_adaptive_pool(cddp__kq *q, const cddp__k_adaptive_pool *a) {
    (void)q;
    int64_t C = a->C, H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    int64_t B = CDDP_MAX(a->x_block, 1), G = C / B;
    CDDP_CHECK(B <= POOL_LANES, "adaptive_avg_pool2d: a block of %lld channels", (long long)B);
    for (int64_t ng = 0; ng < a->N * G; ng++) {
        const float *src = a->x + ng * H * W * B;
        float *dst = a->y + ng * B * OH * OW; /* channel (ng / G) C + (ng % G) B + k */
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = lo(oh, H, OH), h1 = hi(oh, H, OH);
                int64_t w0 = lo(ow, W, OW), w1 = hi(ow, W, OW);
                double s[POOL_LANES] = {0};
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++)
                        for (int64_t k = 0; k < B; k++) s[k] += src[(h * W + w) * B + k];
                double area = (double)((h1 - h0) * (w1 - w0));
                for (int64_t k = 0; k < B; k++) dst[(k * OH + oh) * OW + ow] = (float)(s[k] / area);
            }
    }
}

void cddp__cpu_adaptive_pool_grad(cddp__kq *q, const cddp__k_adaptive_pool_grad *a) {
    (void)q;
    int64_t C = a->C, H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    int64_t B = CDDP_MAX(a->x_block, 1), G = C / B;
    CDDP_CHECK(B <= POOL_LANES, "adaptive_avg_pool2d: a block of %lld channels", (long long)B);
    for (int64_t ng = 0; ng < a->N * G; ng++) {
        const float *dy = a->dy + ng * B * OH * OW;
        float *d = a->dx + ng * H * W * B;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = lo(oh, H, OH), h1 = hi(oh, H, OH);
                int64_t w0 = lo(ow, W, OW), w1 = hi(ow, W, OW);
                float g[POOL_LANES];
                for (int64_t k = 0; k < B; k++)
                    g[k] = dy[(k * OH + oh) * OW + ow] / (float)((h1 - h0) * (w1 - w0));
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++)
                        for (int64_t k = 0; k < B; k++) d[(h * W + w) * B + k] += g[k];
            }
    }
}
