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

/* Where plane (n, c) of an (N,C,H,W) tensor starts, and how far apart its elements lie: row-major
 * (block 0) or channel-blocked (tensor.h's "Layouts"), where the plane's elements are a block's
 * lane. */
static int64_t plane_at(int64_t n, int64_t c, int64_t C, int64_t P, int block, int64_t *step) {
    *step = CDDP_MAX(block, 1);
    if (!block) return (n * C + c) * P;
    return ((n * (C / block) + c / block) * P) * block + c % block;
}

void cddp__cpu_adaptive_pool(cddp__kq *q, const cddp__k_adaptive_pool *a) {
    (void)q;
    int64_t C = a->C, H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    for (int64_t nc = 0; nc < a->N * C; nc++) {
        int64_t step;
        const float *src = a->x + plane_at(nc / C, nc % C, C, H * W, a->x_block, &step);
        float *dst = a->y + nc * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = lo(oh, H, OH), h1 = hi(oh, H, OH);
                int64_t w0 = lo(ow, W, OW), w1 = hi(ow, W, OW);
                double s = 0;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) s += src[(h * W + w) * step];
                dst[oh * OW + ow] = (float)(s / (double)((h1 - h0) * (w1 - w0)));
            }
    }
}

void cddp__cpu_adaptive_pool_grad(cddp__kq *q, const cddp__k_adaptive_pool_grad *a) {
    (void)q;
    int64_t C = a->C, H = a->H, W = a->W, OH = a->OH, OW = a->OW;
    for (int64_t nc = 0; nc < a->N * C; nc++) {
        int64_t step;
        const float *dy = a->dy + nc * OH * OW;
        float *d = a->dx + plane_at(nc / C, nc % C, C, H * W, a->x_block, &step);
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t h0 = lo(oh, H, OH), h1 = hi(oh, H, OH);
                int64_t w0 = lo(ow, W, OW), w1 = hi(ow, W, OW);
                float g = dy[oh * OW + ow] / (float)((h1 - h0) * (w1 - w0));
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) d[(h * W + w) * step] += g;
            }
    }
}
