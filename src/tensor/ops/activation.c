/* activation.c: relu, gelu (erf), tanh, sigmoid, and softmax and log_softmax over the last
 * dimension, each with its backward (derivations beside each). */
#include "tensor/internal.h"

#include <math.h>

static cddp_tensor *unary(cddp_ctx *ctx, cddp__op op, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("elementwise op", x);
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    out->block = x->block; /* elementwise: any layout */
    const float *a = x->data;
    float *y = out->data;
    int64_t n = x->numel;
    switch (op) {
    case CDDP_OP_RELU:
        cddp__relu(a, y, n);
        break;
    case CDDP_OP_GELU:
        for (int64_t i = 0; i < n; i++) y[i] = 0.5f * a[i] * (1.0f + erff(a[i] * (float)M_SQRT1_2));
        break;
    case CDDP_OP_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = tanhf(a[i]);
        break;
    case CDDP_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-a[i]));
        break;
    default:
        CDDP_PANIC("unary: op %d is not elementwise", (int)op);
    }
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

/* dx = dy where the output is positive (0 at the kink, as PyTorch) */
void cddp__relu_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    if (dx) cddp__relu_grad(n->out->data, n->out->grad, dx, n->in[0]->numel, assign);
}

void cddp__gelu_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    const float *dy = n->out->grad, *y = n->out->data, *a = n->in[0]->data;
    int64_t numel = n->in[0]->numel;
    (void)y, (void)a;
    if (dx)
        for (int64_t i = 0; i < numel; i++) {
            float cdf = 0.5f * (1.0f + erff(a[i] * (float)M_SQRT1_2));
            float pdf = expf(-0.5f * a[i] * a[i]) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
            dx[i] += dy[i] * (cdf + a[i] * pdf);
        }
}

void cddp__tanh_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    const float *dy = n->out->grad, *y = n->out->data, *a = n->in[0]->data;
    int64_t numel = n->in[0]->numel;
    (void)y, (void)a;
    if (dx)
        for (int64_t i = 0; i < numel; i++) dx[i] += dy[i] * (1.0f - y[i] * y[i]);
}

void cddp__sigmoid_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    const float *dy = n->out->grad, *y = n->out->data, *a = n->in[0]->data;
    int64_t numel = n->in[0]->numel;
    (void)y, (void)a;
    if (dx)
        for (int64_t i = 0; i < numel; i++) dx[i] += dy[i] * y[i] * (1.0f - y[i]);
}

static cddp_tensor *softmax_op(cddp_ctx *ctx, cddp_tensor *x, bool take_log) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32(take_log ? "log_softmax" : "softmax", x);
    CDDP_CHECK(x->ndim >= 1, "softmax needs at least one dimension");
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    int64_t C = x->shape[x->ndim - 1];
    cddp__softmax_rows(x->data, out->data, C ? x->numel / C : 0, C, take_log);
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
    cddp_tensor *x = n->in[0];
    const float *dy = n->out->grad, *y = n->out->data;
    int64_t numel = x->numel;
    /* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy), per row. */
    if (!dx) return;
    int64_t C = x->shape[x->ndim - 1], rows = C ? numel / C : 0;
    bool lg = n->op == CDDP_OP_LOG_SOFTMAX;
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * C, *gr = dy + r * C;
        float *xr = dx + r * C;
        double s = 0.0;
        for (int64_t j = 0; j < C; j++) s += lg ? gr[j] : gr[j] * yr[j];
        for (int64_t j = 0; j < C; j++)
            xr[j] += lg ? gr[j] - expf(yr[j]) * (float)s : yr[j] * (gr[j] - (float)s);
    }
}

void cddp__softmax_backward(cddp_ctx *ctx, cddp__node *n) {
    softmax_backward(ctx, n);
}

void cddp__log_softmax_backward(cddp_ctx *ctx, cddp__node *n) {
    softmax_backward(ctx, n);
}
