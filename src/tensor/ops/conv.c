/* conv.c: 2-D convolution (strided, zero-padded, grouped), and a convolution followed by a ReLU
 * and 2x2 max pooling as one op (a CNN's usual layer). The device does the arithmetic (the CPU on
 * oneDNN, cpu/conv.c), in the context's precision (cddp_ctx_options.compute) as a matrix product
 * would; what the backward needs beyond the inputs stays with the node, kept by the device's
 * forward kernel (on the CPU: the input reordered for oneDNN, the fused pooling's maxima). */
#include "tensor/internal.h"

#include <string.h>

/* Checks a convolution's arguments (as op) and returns its shape, output row-major. x may be in
 * bf16 (its caller says where that is allowed). */
static cddp__conv_geom conv_check(const char *op, const cddp_tensor *x, const cddp_tensor *w,
                                  const cddp_tensor *b, int stride, int pad, int groups) {
    if (x->dtype != CDDP_BF16) cddp__need_f32_any(op, x);
    cddp__need_f32(op, w);
    CDDP_CHECK(groups >= 1 && x->ndim == 4 && w->ndim == 4 && x->shape[1] % groups == 0 &&
                   w->shape[0] % groups == 0 && x->shape[1] == w->shape[1] * groups,
               "%s: input %s does not fit weight %s in %d groups (want (N,C,H,W) and "
               "(O,C/groups,KH,KW), groups dividing C and O)",
               op, CDDP__SHAPE(x), CDDP__SHAPE(w), groups);
    CDDP_CHECK(stride >= 1 && pad >= 0, "%s: stride %d, padding %d", op, stride, pad);
    int64_t H = x->shape[2], W = x->shape[3], KH = w->shape[2], KW = w->shape[3];
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == w->shape[0], "%s: bias %s for weight %s", op,
                   CDDP__SHAPE(b), CDDP__SHAPE(w));
    CDDP_CHECK(H + 2 * pad >= KH && W + 2 * pad >= KW,
               "%s: kernel %s is larger than the padded input %s", op, CDDP__SHAPE(w),
               CDDP__SHAPE(x));
    return (cddp__conv_geom){.N = x->shape[0],
                             .C = x->shape[1],
                             .H = H,
                             .W = W,
                             .O = w->shape[0],
                             .KH = KH,
                             .KW = KW,
                             .OH = (H + 2 * pad - KH) / stride + 1,
                             .OW = (W + 2 * pad - KW) / stride + 1,
                             .stride = stride,
                             .pad = pad,
                             .groups = groups,
                             .x_block = x->block,
                             .bias = b != NULL};
}

/* Keeps the convolution's arguments with its node, and a slot of device memory where the forward
 * kernel leaves its state for the backward (both kernels run in queue order, so the slot's
 * content is the device's to write and read). False on a failure. */
static bool record_conv(cddp__cdev *d, cddp__node *node, const cddp__conv_geom *g) {
    if (!node) return true;
    node->arg.conv.stride = g->stride;
    node->arg.conv.padding = g->pad;
    node->arg.conv.groups = g->groups;
    node->saved = cddp__dalloc(d, sizeof(void *));
    return node->saved != NULL;
}

/* The convolution, its output blocked by out_block channels (0: plain), in x's dtype: a bf16 x
 * (activations in bf16, mixed precision only) gives a bf16 output. */
static cddp_tensor *conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                           int stride, int padding, int groups, int out_block) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    cddp__conv_geom g = conv_check("conv2d", x, w, b, stride, padding, groups);
    CDDP_CHECK(x->dtype != CDDP_BF16 || ctx->compute == CDDP_BF16,
               "conv2d: a bfloat16 input needs mixed precision (cddp_ctx_options.compute = "
               "CDDP_BF16); widen it with cddp_to_dtype(ctx, x, CDDP_F32) to convolve in float32");
    if (w->shape[0] % CDDP_MAX(out_block, 1)) out_block = 0;
    g.out_block = out_block;
    cddp__cdev *d = CDDP__ON(ctx, "conv2d", x, w, b);
    if (!d || !cddp__computes(ctx, d)) return NULL;
    g.compute = ctx->compute;
    cddp_tensor *out = cddp__empty(d, x->dtype, 4, (int64_t[]){g.N, g.O, g.OH, g.OW});
    if (!out) return NULL;
    out->block = out_block;
    cddp_tensor *in[3] = {x, w, b};
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_CONV2D, out, b ? 3 : 2, in, &node)) return NULL;
    if (!record_conv(d, node, &g)) return NULL;
    g.train = node != NULL;
    if (out->numel > 0)
        CDDP__K(&d->q, conv2d, .x = cddp__f32_data(x), .x16 = cddp__bf16_data(x), .w = w->data,
                .b = b ? b->data : NULL, .y = cddp__f32_data(out), .y16 = cddp__bf16_data(out),
                .g = g, .state = node ? node->saved : NULL);
    return CDDP__FAILED(ctx) ? NULL : out;
}

cddp_tensor *cddp_conv2d_groups(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                int stride, int padding, int groups) {
    return conv2d(ctx, x, w, b, stride, padding, groups, x ? x->block : 0);
}

cddp_tensor *cddp_conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b, int stride,
                         int padding) {
    return cddp_conv2d_groups(ctx, x, w, b, stride, padding, 1);
}

cddp_tensor *cddp_conv2d_blocked(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                 int stride, int padding, int groups) {
    return conv2d(ctx, x, w, b, stride, padding, groups, x ? cddp_blocked_size_on(x->device) : 0);
}

/* The gradient buffers of a convolution node's inputs that want one, with whether each is fresh;
 * false on a failure. */
static bool conv_grads(cddp_ctx *ctx, cddp__node *n, float **dx, bool *dx_assign, float **dw,
                       bool *dw_assign, float **db, bool *db_assign) {
    cddp_tensor *x = n->in[0], *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    *dx_assign = *dw_assign = *db_assign = false;
    *dx = x->requires_grad ? cddp_grad_buffer_assign(ctx, x, dx_assign) : NULL;
    *dw = W->requires_grad ? cddp_grad_buffer_assign(ctx, W, dw_assign) : NULL;
    *db = b && b->requires_grad ? cddp_grad_buffer_assign(ctx, b, db_assign) : NULL;
    return !CDDP__FAILED(ctx);
}

/* The node's convolution shape, its output in out_block's layout, in the context's precision. */
static cddp__conv_geom node_geom(const cddp_ctx *ctx, const cddp__node *n, int out_block) {
    cddp__conv_geom g = conv_check("conv2d", n->in[0], n->in[1], n->nin > 2 ? n->in[2] : NULL,
                                   n->arg.conv.stride, n->arg.conv.padding, n->arg.conv.groups);
    g.out_block = out_block;
    g.train = true;
    g.compute = ctx->compute;
    return g;
}

bool cddp__conv2d_takes_grad_half(cddp_ctx *ctx, const cddp__node *made) {
    if (ctx->compute != CDDP_BF16 || made->out->numel == 0) return false;
    cddp__cdev *d = cddp__node_dev(ctx, made);
    cddp__conv_geom g = node_geom(ctx, made, made->out->block);
    return d && d->q.dev->k->conv_grad_takes_bf16(&g);
}

/* The output's gradient as the op after it made it: float32 (grad), or in bf16 (grad_half,
 * where cddp__takes_grad_half said so: batch normalisation's backward writes it so). */
void cddp__conv2d_backward(cddp_ctx *ctx, cddp__node *n) {
    if (n->out->numel == 0) return;
    float *dx, *dw, *db;
    bool xa, wa, ba;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (!d || !cddp__computes(ctx, d) || !conv_grads(ctx, n, &dx, &xa, &dw, &wa, &db, &ba)) return;
    CDDP__K(&d->q, conv2d_grad, .x = cddp__f32_data(n->in[0]), .x16 = cddp__bf16_data(n->in[0]),
            .w = n->in[1]->data, .dy = n->out->own.grad_half ? NULL : n->out->grad,
            .dy16 = n->out->own.grad_half, .dx = dx, .dx_assign = xa, .dw = dw, .dw_assign = wa,
            .db = db, .db_assign = ba, .g = node_geom(ctx, n, n->out->block), .state = n->saved);
}

/* ---- convolution, ReLU and 2x2 max pooling in one op ---------------------------------------
 * Where the device runs the three as one kernel (the CPU: when oneDNN's convolution writes its
 * output with the channels innermost), the convolution's output never becomes a tensor; otherwise
 * the op is cddp_conv2d_groups followed by cddp_relu_max_pool2d. */

cddp_tensor *cddp_conv2d_relu_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                         cddp_tensor *b, int stride, int padding, int groups,
                                         int pool_kernel, int pool_stride, int pool_padding) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    cddp__need_f32_any("conv2d_relu_max_pool2d", x);
    cddp__conv_geom g = conv_check("conv2d_relu_max_pool2d", x, w, b, stride, padding, groups);
    cddp__cdev *d = CDDP__ON(ctx, "conv2d_relu_max_pool2d", x, w, b);
    if (!d || !cddp__computes(ctx, d)) return NULL;
    g.compute = ctx->compute;
    cddp_tensor *in[3] = {x, w, b};
    g.train = cddp__will_record(ctx, b ? 3 : 2, in);
    bool fuse = pool_kernel == 2 && (pool_stride == 2 || pool_stride <= 0) && pool_padding == 0 &&
                g.OH >= 2 && g.OW >= 2 && g.N * g.O > 0;
    if (!fuse || !d->q.dev->k->conv_pool_fuses(&g))
        return cddp_relu_max_pool2d(
            ctx, cddp_to_nchw(ctx, cddp_conv2d_groups(ctx, x, w, b, stride, padding, groups)),
            pool_kernel, pool_stride, pool_padding);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 4, (int64_t[]){g.N, g.O, g.OH / 2, g.OW / 2});
    if (!out) return NULL;
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_CONV2D_RELU_MAX_POOL2D, out, b ? 3 : 2, in, &node) ||
        !record_conv(d, node, &g))
        return NULL;
    CDDP__K(&d->q, conv2d_relu_pool, .x = x->data, .w = w->data, .b = b ? b->data : NULL,
            .y = out->data, .g = g, .state = node ? node->saved : NULL);
    return CDDP__FAILED(ctx) ? NULL : out;
}

void cddp__conv2d_relu_max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx, *dw, *db;
    bool xa, wa, ba;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (!d || !cddp__computes(ctx, d) || !conv_grads(ctx, n, &dx, &xa, &dw, &wa, &db, &ba)) return;
    CDDP__K(&d->q, conv2d_relu_pool_grad, .x = n->in[0]->data, .w = n->in[1]->data,
            .dy = n->out->grad, .dx = dx, .dx_assign = xa, .dw = dw, .dw_assign = wa, .db = db,
            .db_assign = ba, .g = node_geom(ctx, n, 0), .state = n->saved);
}
