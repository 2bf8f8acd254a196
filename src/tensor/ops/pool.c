/* pool.c: 2-D max pooling (backward sends each window's gradient to its maximum), the same of a
 * ReLU's output in one pass (relu_max_pool2d: a Sequential's ReLU + MaxPool2d), average pooling
 * and adaptive average pooling.
 *
 * cddp's own loops, not oneDNN's: on cddp's plain (N,C,H,W) layout oneDNN 2.6 pools with its
 * reference kernel (2x2 max pooling of 64x16x28x28: 13.3 ms forward against 0.4 ms here, with
 * vec.c's loop), and its fast kernels want a blocked layout that would cost a reorder each way.
 * oneDNN's max pooling also drops NaNs, which PyTorch's (and cddp's) propagate. */
#include "tensor/internal.h"

#include <math.h>
#include <string.h>

/* The window of output oh (and likewise ow) clipped to the input: rows [*h0, *h1). */
static void window(int64_t o, int stride, int padding, int kernel, int64_t H, int64_t *h0,
                   int64_t *h1) {
    int64_t a = o * stride - padding;
    *h1 = CDDP_MIN(a + kernel, H);
    *h0 = CDDP_MAX(a, 0);
}

/* The output of a pooling of x (checked, as name): (N,C,OH,OW); *stride 0 becomes the kernel. */
static cddp_tensor *pooled_output(cddp_ctx *ctx, const char *name, cddp_tensor *x, int kernel,
                                  int *stride, int padding) {
    cddp__need_f32(name, x);
    CDDP_CHECK(x->ndim == 4, "%s needs (N,C,H,W), got %s", name, CDDP__SHAPE(x));
    if (*stride <= 0) *stride = kernel;
    CDDP_CHECK(kernel >= 1 && padding >= 0 && padding <= kernel / 2,
               "%s: kernel %d, padding %d (padding must be at most half the kernel)", name, kernel,
               padding);
    int64_t H = x->shape[2], W = x->shape[3];
    CDDP_CHECK(H + 2 * padding >= kernel && W + 2 * padding >= kernel,
               "%s: kernel %d is larger than the padded input %s", name, kernel, CDDP__SHAPE(x));
    int64_t OH = (H + 2 * padding - kernel) / *stride + 1;
    int64_t OW = (W + 2 * padding - kernel) / *stride + 1;
    return cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){x->shape[0], x->shape[1], OH, OW});
}

/* Max pooling of x, or with relu of max(x, 0) (a NaN counting as 0, as cddp_relu makes it),
 * recorded as op. */
static cddp_tensor *max_pool(cddp_ctx *ctx, cddp__op op, const char *name, cddp_tensor *x,
                             int kernel, int stride, int padding, bool relu) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp_tensor *out = pooled_output(ctx, name, x, kernel, &stride, padding);
    if (!out) return NULL;
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = out->shape[2], OW = out->shape[3];
    bool rec = cddp__will_record(ctx, 1, &x);
    int32_t *arg = rec ? cddp__ctx_alloc(ctx, (size_t)out->numel * sizeof(int32_t)) : NULL;
    if (rec && !arg) return NULL;
    if (kernel == 2 && stride == 2 && padding == 0) {
        /* the common case, with the general loop's results, in vec.c's vectorised loop */
        cddp__max_pool2x2(cddp_f32(x), N * C, H, W, OH, OW, cddp_f32(out), arg, relu);
        goto pooled;
    }
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *src = cddp_f32(x) + nc * H * W;
        float *dst = cddp_f32(out) + nc * OH * OW;
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
                if (arg) arg[nc * OH * OW + oh * OW + ow] = (int32_t)best;
            }
        }
    }
pooled:;
    cddp__node *node;
    if (!cddp__record_op(ctx, op, out, 1, &x, &node)) return NULL;
    if (node) {
        node->arg.pool.kernel = kernel;
        node->arg.pool.stride = stride;
        node->arg.pool.padding = padding;
        node->saved = arg;
    }
    return out;
}

cddp_tensor *cddp_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride, int padding) {
    return max_pool(ctx, CDDP_OP_MAX_POOL2D, "max_pool2d", x, kernel, stride, padding, false);
}

cddp_tensor *cddp_relu_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride,
                                  int padding) {
    return max_pool(ctx, CDDP_OP_RELU_MAX_POOL2D, "relu_max_pool2d", x, kernel, stride, padding,
                    true);
}

/* Each window's gradient goes to the element that was its maximum; with relu only where that
 * maximum is positive (the ReLU's gradient there, 0 elsewhere). */
static void max_pool_backward(cddp_ctx *ctx, cddp__node *n, bool relu) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp_tensor *out = n->out, *x = n->in[0];
    const float *dy = out->grad, *y = relu ? cddp_f32(out) : NULL;
    if (!dx) return;
    const int32_t *arg = n->saved;
    int64_t H = x->shape[2], W = x->shape[3], OH = out->shape[2], OW = out->shape[3];
    int64_t planes = x->shape[0] * x->shape[1];
    if (assign && n->arg.pool.kernel == 2 && n->arg.pool.stride == 2 && n->arg.pool.padding == 0) {
        /* windows that tile the plane: each written whole, no zeroing first */
        cddp__max_pool2x2_grad(arg, dy, y, dx, planes, H, W, OH, OW);
        return;
    }
    if (assign) memset(dx, 0, (size_t)x->numel * sizeof(float));
    for (int64_t nc = 0; nc < planes; nc++)
        for (int64_t p = 0; p < OH * OW; p++) {
            int64_t o = nc * OH * OW + p;
            if (!y || y[o] > 0.0f) dx[nc * H * W + arg[o]] += dy[o];
        }
}

void cddp__max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    max_pool_backward(ctx, n, false);
}

void cddp__relu_max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    max_pool_backward(ctx, n, true);
}

/* ---- average pooling ----------------------------------------------------------------------
 * Every window divides by kernel * kernel, padding included (PyTorch's count_include_pad). */

cddp_tensor *cddp_avg_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride, int padding) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp_tensor *out = pooled_output(ctx, "avg_pool2d", x, kernel, &stride, padding);
    if (!out) return NULL;
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = out->shape[2], OW = out->shape[3];
    float inv = 1.0f / (float)(kernel * kernel);
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *src = cddp_f32(x) + nc * H * W;
        float *dst = cddp_f32(out) + nc * OH * OW;
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
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_AVG_POOL2D, out, 1, &x, &node)) return NULL;
    if (node) {
        node->arg.pool.kernel = kernel;
        node->arg.pool.stride = stride;
        node->arg.pool.padding = padding;
    }
    return out;
}

void cddp__avg_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    if (!dx) return;
    cddp_tensor *out = n->out, *x = n->in[0];
    int kernel = n->arg.pool.kernel, stride = n->arg.pool.stride, padding = n->arg.pool.padding;
    int64_t H = x->shape[2], W = x->shape[3], OH = out->shape[2], OW = out->shape[3];
    float inv = 1.0f / (float)(kernel * kernel);
    for (int64_t nc = 0; nc < x->shape[0] * x->shape[1]; nc++) {
        const float *dy = out->grad + nc * OH * OW;
        float *d = dx + nc * H * W;
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

/* Where plane nc (image n, channel c) of x starts, and how far apart its elements lie: row-major
 * or channel-blocked (tensor.h's "Layouts"), where the plane's elements are a block's lane. */
static int64_t plane_at(const cddp_tensor *x, int64_t nc, int64_t *step) {
    *step = CDDP_MAX(x->block, 1);
    return cddp__blocked_offset(x, nc * x->shape[2] * x->shape[3]);
}

cddp_tensor *cddp_adaptive_avg_pool2d(cddp_ctx *ctx, cddp_tensor *x, int64_t OH, int64_t OW) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("adaptive_avg_pool2d", x); /* its output row-major */
    CDDP_CHECK(x->ndim == 4 && OH >= 1 && OW >= 1 && x->shape[2] >= 1 && x->shape[3] >= 1,
               "adaptive_avg_pool2d: input %s to %lldx%lld (want (N,C,H,W) with H, W >= 1 and an "
               "output of at least 1x1)",
               CDDP__SHAPE(x), (long long)OH, (long long)OW);
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){x->shape[0], x->shape[1], OH, OW});
    if (!out) return NULL;
    for (int64_t nc = 0; nc < NC; nc++) {
        int64_t step;
        const float *src = cddp_f32(x) + plane_at(x, nc, &step);
        float *dst = cddp_f32(out) + nc * OH * OW;
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
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_ADAPTIVE_AVG_POOL2D, out, 1, &x, &node)) return NULL;
    return out;
}

void cddp__adaptive_avg_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    if (!dx) return;
    cddp_tensor *out = n->out, *x = n->in[0];
    int64_t NC = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = out->shape[2], OW = out->shape[3];
    for (int64_t nc = 0; nc < NC; nc++) {
        int64_t step;
        const float *dy = out->grad + nc * OH * OW;
        float *d = dx + plane_at(x, nc, &step);
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
