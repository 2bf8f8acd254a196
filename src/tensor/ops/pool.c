/* pool.c: 2-D max pooling; backward sends each window's gradient to its maximum. */
#include "tensor/internal.h"

#include <math.h>

/* The common 2x2, stride 2, unpadded pooling, with the general loop's results (the first
 * maximum in row-major window order wins; a NaN wins and stays) in straight-line code. */
static void pool2x2(const float *x, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                    float *y, int32_t *arg) {
    for (int64_t nc = 0; nc < planes; nc++) {
        const float *src = x + nc * H * W;
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *r0 = src + 2 * oh * W, *r1 = r0 + W;
            float *dst = y + (nc * OH + oh) * OW;
            int32_t *ai = arg ? arg + (nc * OH + oh) * OW : NULL;
            for (int64_t ow = 0; ow < OW; ow++) {
                float v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
                int best;
                if (isnan(v[0]) || isnan(v[1]) || isnan(v[2]) || isnan(v[3])) {
                    best = isnan(v[0]) ? 0 : isnan(v[1]) ? 1 : isnan(v[2]) ? 2 : 3;
                } else {
                    /* Pairwise selects, no data-dependent branches; strict > keeps the first
                     * of equal values. */
                    int i01 = v[1] > v[0], i23 = 2 + (v[3] > v[2]);
                    best = v[i23] > v[i01] ? i23 : i01;
                }
                dst[ow] = v[best];
                if (ai) ai[ow] = (int32_t)((2 * oh + (best >> 1)) * W + 2 * ow + (best & 1));
            }
        }
    }
}

cddp_tensor *cddp_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride, int padding) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("max_pool2d", x);
    CDDP_CHECK(x->ndim == 4, "max_pool2d needs (N,C,H,W), got %s", CDDP__SHAPE(x));
    if (stride <= 0) stride = kernel;
    CDDP_CHECK(kernel >= 1 && padding >= 0 && padding <= kernel / 2,
               "max_pool2d: kernel %d, padding %d (padding must be at most half the kernel)",
               kernel, padding);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    CDDP_CHECK(H + 2 * padding >= kernel && W + 2 * padding >= kernel,
               "max_pool2d: kernel %d is larger than the padded input %s", kernel, CDDP__SHAPE(x));
    int64_t OH = (H + 2 * padding - kernel) / stride + 1;
    int64_t OW = (W + 2 * padding - kernel) / stride + 1;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){N, C, OH, OW});
    if (!out) return NULL;
    bool rec = cddp__will_record(ctx, 1, &x);
    int32_t *arg = rec ? cddp__ctx_alloc(ctx, (size_t)out->numel * sizeof(int32_t)) : NULL;
    if (rec && !arg) return NULL;
    if (kernel == 2 && stride == 2 && padding == 0) {
        pool2x2(cddp_f32(x), N * C, H, W, OH, OW, cddp_f32(out), arg);
        goto pooled;
    }
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *src = cddp_f32(x) + nc * H * W;
        float *dst = cddp_f32(out) + nc * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            /* The window's rows and columns clipped to the input, so the scan needs no checks;
             * padding <= kernel / 2 guarantees every window holds at least one element. */
            int64_t h0 = oh * stride - padding, h1 = CDDP_MIN(h0 + kernel, H);
            h0 = CDDP_MAX(h0, 0);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t w0 = ow * stride - padding, w1 = CDDP_MIN(w0 + kernel, W);
                w0 = CDDP_MAX(w0, 0);
                int64_t best = h0 * W + w0;
                float m = src[best];
                for (int64_t ih = h0; ih < h1 && !isnan(m); ih++)
                    for (int64_t iw = w0; iw < w1; iw++) {
                        float v = src[ih * W + iw];
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
    if (!cddp__record_op(ctx, CDDP_OP_MAX_POOL2D, out, 1, &x, &node)) return NULL;
    if (node) {
        node->arg.pool.kernel = kernel;
        node->arg.pool.stride = stride;
        node->arg.pool.padding = padding;
        node->saved = arg;
    }
    return out;
}

void cddp__max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp_tensor *out = n->out, *x = n->in[0];
    const float *dy = out->grad;
    /* Each window's gradient goes to the element that was its maximum. */
    if (!dx) return;
    const int32_t *arg = n->saved;
    int64_t plane_in = x->shape[2] * x->shape[3];
    int64_t plane_out = out->shape[2] * out->shape[3];
    for (int64_t nc = 0; nc < x->shape[0] * x->shape[1]; nc++)
        for (int64_t p = 0; p < plane_out; p++)
            dx[nc * plane_in + arg[nc * plane_out + p]] += dy[nc * plane_out + p];
}
