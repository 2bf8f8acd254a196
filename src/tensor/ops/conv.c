/* conv.c: 2-D convolution as im2col + one GEMM over the whole batch. */
#include "tensor/internal.h"

#include <string.h>

cddp_tensor *cddp_conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b, int stride,
                         int padding) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    cddp__need_f32("conv2d", x);
    cddp__need_f32("conv2d", w);
    CDDP_CHECK(x->ndim == 4 && w->ndim == 4 && x->shape[1] == w->shape[1],
               "conv2d: input %s does not fit weight %s (want (N,C,H,W) and (O,C,KH,KW))",
               CDDP__SHAPE(x), CDDP__SHAPE(w));
    CDDP_CHECK(stride >= 1 && padding >= 0, "conv2d: stride %d, padding %d", stride, padding);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], KH = w->shape[2], KW = w->shape[3];
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == O, "conv2d: bias %s for weight %s",
                   CDDP__SHAPE(b), CDDP__SHAPE(w));
    CDDP_CHECK(H + 2 * padding >= KH && W + 2 * padding >= KW,
               "conv2d: kernel %s is larger than the padded input %s", CDDP__SHAPE(w),
               CDDP__SHAPE(x));
    int64_t OH = (H + 2 * padding - KH) / stride + 1, OW = (W + 2 * padding - KW) / stride + 1;
    int64_t ckk = C * KH * KW, plane = OH * OW;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){N, O, OH, OW});
    if (!out) return NULL;
    cddp_tensor *in[3] = {x, w, b};
    /* The whole batch's columns side by side, cols (C*KH*KW, N*OH*OW), make the convolution one
     * large GEMM, ycols (O, N*OH*OW) = w (O, C*KH*KW) . cols, which is then scattered into the
     * (N,O,OH,OW) output. Recording keeps cols for backward. */
    int64_t ld = N * plane;
    float *cols = cddp__ctx_alloc(ctx, (size_t)(ckk * ld) * sizeof(float));
    float *ycols = cddp__ctx_alloc(ctx, (size_t)(O * ld) * sizeof(float));
    if (!cols || !ycols) return NULL;
    for (int64_t n = 0; n < N; n++)
        cddp__im2col(cddp_f32(x) + n * C * H * W, C, H, W, KH, KW, stride, padding, OH, OW, ld,
                     cols + n * plane);
    cddp__gemm(false, false, O, ld, ckk, 1.0f, w->data, cols, 0.0f, ycols);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            float *dst = cddp_f32(out) + (n * O + o) * plane;
            const float *src = ycols + o * ld + n * plane;
            float bias = b ? cddp_f32(b)[o] : 0.0f;
            for (int64_t p = 0; p < plane; p++) dst[p] = src[p] + bias;
        }
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_CONV2D, out, b ? 3 : 2, in, &node)) return NULL;
    if (node) {
        node->arg.conv.stride = stride;
        node->arg.conv.padding = padding;
        node->saved = cols;
    }
    return out;
}

void cddp__conv2d_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *out = n->out, *x = n->in[0];
    const float *dy = out->grad;
    /* Forward was ycols (O, N*P) = W cols (C*KH*KW, N*P) + b, with P = OH*OW. So with dy
     * gathered into the same (O, N*P) layout: dW += dycols cols^T, db += row sums of dycols,
     * dcols = W^T dycols, and col2im adds each sample's dcols back into dx. */
    cddp_tensor *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], Wd = x->shape[3];
    int64_t O = W->shape[0], KH = W->shape[2], KW = W->shape[3];
    int64_t OH = out->shape[2], OW = out->shape[3], plane = OH * OW, ckk = C * KH * KW;
    int64_t ld = N * plane;
    int stride = n->arg.conv.stride, pad = n->arg.conv.padding;
    const float *cols = n->saved;
    float *gw = W->requires_grad ? cddp_grad_buffer(ctx, W) : NULL;
    float *gb = b && b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
    float *gx = x->requires_grad ? cddp_grad_buffer(ctx, x) : NULL;
    float *dyc = cddp__ctx_alloc(ctx, (size_t)(O * ld) * sizeof(float));
    float *dcols = gx ? cddp__ctx_alloc(ctx, (size_t)(ckk * ld) * sizeof(float)) : NULL;
    if (CDDP__FAILED(ctx)) return;
    for (int64_t s = 0; s < N; s++)
        for (int64_t o = 0; o < O; o++)
            memcpy(dyc + o * ld + s * plane, dy + (s * O + o) * plane,
                   (size_t)plane * sizeof(float));
    if (gw) cddp__gemm(false, true, O, ckk, ld, 1.0f, dyc, cols, 1.0f, gw);
    if (gb)
        for (int64_t o = 0; o < O; o++) {
            double acc = 0.0;
            for (int64_t p = 0; p < ld; p++) acc += dyc[o * ld + p];
            gb[o] += (float)acc;
        }
    if (gx) {
        cddp__gemm(true, false, ckk, ld, O, 1.0f, W->data, dyc, 0.0f, dcols);
        for (int64_t s = 0; s < N; s++)
            cddp__col2im(dcols + s * plane, C, H, Wd, KH, KW, stride, pad, OH, OW, ld,
                         gx + s * C * H * Wd);
    }
}
