/* pool.c: 2-D max pooling (backward sends each window's gradient to its maximum), the same of a
 * ReLU's output in one pass (relu_max_pool2d: a Sequential's ReLU + MaxPool2d), average pooling
 * and adaptive average pooling. */
#include "tensor/internal.h"

/* The output of a pooling of x (checked, as name) on d: (N,C,OH,OW); *stride 0 becomes the
 * kernel. */
static cddp_tensor *pooled_output(cddp__cdev *d, const char *name, cddp_tensor *x, int kernel,
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
    return cddp__empty(d, CDDP_F32, 4, (int64_t[]){x->shape[0], x->shape[1], OH, OW});
}

static void record_pool(cddp__node *node, int kernel, int stride, int padding, void *saved) {
    if (!node) return;
    node->arg.pool.kernel = kernel;
    node->arg.pool.stride = stride;
    node->arg.pool.padding = padding;
    node->saved = saved;
}

/* Max pooling of x, or with relu of max(x, 0) (a NaN counting as 0, as cddp_relu makes it),
 * recorded as op. */
static cddp_tensor *max_pool(cddp_ctx *ctx, cddp__op op, const char *name, cddp_tensor *x,
                             int kernel, int stride, int padding, bool relu) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__cdev *d = CDDP__ON(ctx, name, x);
    cddp_tensor *out = d ? pooled_output(d, name, x, kernel, &stride, padding) : NULL;
    if (!out) return NULL;
    bool rec = cddp__will_record(ctx, 1, &x);
    int32_t *arg = rec ? cddp__dalloc(d, (size_t)out->numel * sizeof(int32_t)) : NULL;
    if (rec && !arg) return NULL;
    CDDP__K(&d->q, max_pool, .x = x->data, .y = out->data, .arg = arg,
            .planes = x->shape[0] * x->shape[1], .H = x->shape[2], .W = x->shape[3],
            .OH = out->shape[2], .OW = out->shape[3], .kernel = kernel, .stride = stride,
            .padding = padding, .relu = relu);
    cddp__node *node;
    if (!cddp__record_op(ctx, op, out, 1, &x, &node)) return NULL;
    record_pool(node, kernel, stride, padding, arg);
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

static void max_pool_backward(cddp_ctx *ctx, cddp__node *n, bool relu) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    cddp_tensor *out = n->out, *x = n->in[0];
    if (!dx || !d) return;
    CDDP__K(&d->q, max_pool_grad, .arg = n->saved, .dy = out->grad,
            .y = relu ? cddp_f32(out) : NULL, .dx = dx, .planes = x->shape[0] * x->shape[1],
            .H = x->shape[2], .W = x->shape[3], .OH = out->shape[2], .OW = out->shape[3],
            .kernel = n->arg.pool.kernel, .stride = n->arg.pool.stride,
            .padding = n->arg.pool.padding, .assign = assign);
}

void cddp__max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    max_pool_backward(ctx, n, false);
}

void cddp__relu_max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    max_pool_backward(ctx, n, true);
}

cddp_tensor *cddp_avg_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride, int padding) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__cdev *d = CDDP__ON(ctx, "avg_pool2d", x);
    cddp_tensor *out = d ? pooled_output(d, "avg_pool2d", x, kernel, &stride, padding) : NULL;
    if (!out) return NULL;
    CDDP__K(&d->q, avg_pool, .x = x->data, .y = out->data, .planes = x->shape[0] * x->shape[1],
            .H = x->shape[2], .W = x->shape[3], .OH = out->shape[2], .OW = out->shape[3],
            .kernel = kernel, .stride = stride, .padding = padding);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_AVG_POOL2D, out, 1, &x, &node)) return NULL;
    record_pool(node, kernel, stride, padding, NULL);
    return out;
}

void cddp__avg_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    cddp_tensor *out = n->out, *x = n->in[0];
    if (!dx || !d) return;
    CDDP__K(&d->q, avg_pool_grad, .dy = out->grad, .dx = dx, .planes = x->shape[0] * x->shape[1],
            .H = x->shape[2], .W = x->shape[3], .OH = out->shape[2], .OW = out->shape[3],
            .kernel = n->arg.pool.kernel, .stride = n->arg.pool.stride,
            .padding = n->arg.pool.padding);
}

cddp_tensor *cddp_adaptive_avg_pool2d(cddp_ctx *ctx, cddp_tensor *x, int64_t OH, int64_t OW) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("adaptive_avg_pool2d", x); /* its output row-major */
    CDDP_CHECK(x->ndim == 4 && OH >= 1 && OW >= 1 && x->shape[2] >= 1 && x->shape[3] >= 1,
               "adaptive_avg_pool2d: input %s to %lldx%lld (want (N,C,H,W) with H, W >= 1 and an "
               "output of at least 1x1)",
               CDDP__SHAPE(x), (long long)OH, (long long)OW);
    cddp__cdev *d = CDDP__ON(ctx, "adaptive_avg_pool2d", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 4, (int64_t[]){x->shape[0], x->shape[1], OH, OW});
    if (!out) return NULL;
    CDDP__K(&d->q, adaptive_pool, .x = x->data, .y = out->data, .N = x->shape[0], .C = x->shape[1],
            .H = x->shape[2], .W = x->shape[3], .OH = OH, .OW = OW, .x_block = x->block);
    if (!cddp__record_op(ctx, CDDP_OP_ADAPTIVE_AVG_POOL2D, out, 1, &x, NULL)) return NULL;
    return out;
}

void cddp__adaptive_avg_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    cddp_tensor *out = n->out, *x = n->in[0];
    if (!dx || !d) return;
    CDDP__K(&d->q, adaptive_pool_grad, .dy = out->grad, .dx = dx, .N = x->shape[0],
            .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .OH = out->shape[2],
            .OW = out->shape[3], .x_block = x->block);
}
