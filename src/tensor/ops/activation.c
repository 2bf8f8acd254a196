/* activation.c: relu, gelu (erf), tanh, sigmoid, and softmax and log_softmax over the last
 * dimension, each with its backward (the derivations beside the device's kernels). */
#include "tensor/internal.h"

static cddp__unop unop(cddp__op op) {
    switch (op) {
    case CDDP_OP_RELU:
        return CDDP__RELU;
    case CDDP_OP_GELU:
        return CDDP__GELU;
    case CDDP_OP_TANH:
        return CDDP__TANH;
    case CDDP_OP_SIGMOID:
        return CDDP__SIGMOID;
    default:
        CDDP_PANIC("op %d is not a unary elementwise op", (int)op);
    }
}

static cddp_tensor *unary(cddp_ctx *ctx, cddp__op op, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("elementwise op", x);
    cddp__cdev *d = CDDP__ON(ctx, "elementwise op", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    out->block = x->block; /* elementwise: any layout */
    CDDP__K(&d->q, unary, .op = unop(op), .x = x->data, .y = out->data, .n = x->numel);
    if (!cddp__record_op(ctx, op, out, 1, &x, NULL)) return NULL;
    return out;
}

cddp_tensor *cddp_relu(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_RELU, x);
}
cddp_tensor *cddp_gelu(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_GELU, x);
}
cddp_tensor *cddp_tanh(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_TANH, x);
}
cddp_tensor *cddp_sigmoid(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_SIGMOID, x);
}

/* dx (+)= f'(x) dy: ReLU's gradient stored into a fresh buffer, the others added. */
static void unary_backward(cddp_ctx *ctx, cddp__node *n, bool may_assign) {
    bool assign = false;
    float *dx = may_assign ? cddp__input_grad_assign(ctx, n, &assign) : cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (dx && d)
        CDDP__K(&d->q, unary_grad, .op = unop(n->op), .x = n->in[0]->data, .y = n->out->data,
                .dy = n->out->grad, .dx = dx, .n = n->in[0]->numel, .assign = assign);
}

void cddp__relu_backward(cddp_ctx *ctx, cddp__node *n) {
    unary_backward(ctx, n, true);
}

void cddp__gelu_backward(cddp_ctx *ctx, cddp__node *n) {
    unary_backward(ctx, n, false);
}

void cddp__tanh_backward(cddp_ctx *ctx, cddp__node *n) {
    unary_backward(ctx, n, false);
}

void cddp__sigmoid_backward(cddp_ctx *ctx, cddp__node *n) {
    unary_backward(ctx, n, false);
}

static cddp_tensor *softmax_op(cddp_ctx *ctx, cddp_tensor *x, bool take_log) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32(take_log ? "log_softmax" : "softmax", x);
    CDDP_CHECK(x->ndim >= 1, "softmax needs at least one dimension");
    cddp__cdev *d = CDDP__ON(ctx, "softmax", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    int64_t C = x->shape[x->ndim - 1];
    CDDP__K(&d->q, softmax, .x = x->data, .y = out->data, .rows = C ? x->numel / C : 0, .C = C,
            .log = take_log);
    if (!cddp__record_op(ctx, take_log ? CDDP_OP_LOG_SOFTMAX : CDDP_OP_SOFTMAX, out, 1, &x, NULL))
        return NULL;
    return out;
}

cddp_tensor *cddp_softmax(cddp_ctx *ctx, cddp_tensor *x) {
    return softmax_op(ctx, x, false);
}
cddp_tensor *cddp_log_softmax(cddp_ctx *ctx, cddp_tensor *x) {
    return softmax_op(ctx, x, true);
}

static void softmax_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    cddp_tensor *x = n->in[0];
    if (!dx || !d) return;
    int64_t C = x->shape[x->ndim - 1];
    CDDP__K(&d->q, softmax_grad, .y = n->out->data, .dy = n->out->grad, .dx = dx,
            .rows = C ? x->numel / C : 0, .C = C, .log = n->op == CDDP_OP_LOG_SOFTMAX);
}

void cddp__softmax_backward(cddp_ctx *ctx, cddp__node *n) {
    softmax_backward(ctx, n);
}

void cddp__log_softmax_backward(cddp_ctx *ctx, cddp__node *n) {
    softmax_backward(ctx, n);
}
