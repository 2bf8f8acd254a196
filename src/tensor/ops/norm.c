/* norm.c: batch normalisation over every dimension but the channels, as PyTorch's
 * BatchNorm1d/2d, in training (batch statistics, running statistics updated) and evaluation; on
 * row-major tensors and on channel-blocked ones (tensor.h's "Layouts").
 *
 * Both layouts are seen as blocks: image n's group g of B channels is a block of P = H W
 * positions, B values side by side at each (row-major: B = 1, a group is a channel and a block
 * its plane); the device's kernels walk them (the CPU's in cpu/norm.c).
 *
 * batch_norm_relu is relu(batch_norm(x)) in one pass each way: each block is rectified right after
 * it is normalised, while it is in cache, and in the backward the output's gradient is masked a
 * block at a time (where the output is positive) into a block of scratch that the batch
 * normalisation's loops read as its gradient: no ReLU tensor, no pass of its own, and the same
 * values and gradients as the two ops. batch_norm_add_relu, relu(batch_norm(x) + r) (a residual
 * block's end), adds r's block before rectifying it, and gives r the masked gradient: r takes the
 * output's gradient buffer itself, masked in place, where r has no gradient yet and the output's
 * is released after this backward (a ResNet's shortcut), else block by block in the first
 * backward pass. No sum tensor, no pass for the sum or its gradient.
 *
 * x and r may be bf16 (activations in bf16, as a ResNet in mixed precision keeps them): the
 * kernels widen each value as they read it and compute in float32; the output is then bf16 too,
 * its values rounded to nearest even, and the backward reads the bf16 input and output. */
#include "tensor/internal.h"

#include <string.h>

/* x's layout as blocks: N images of G groups of B channels, P positions each. */
typedef struct blocks {
    int64_t N, C, P, B, G;
} blocks;

static blocks blocks_of(const cddp_tensor *x) {
    int64_t B = CDDP_MAX(x->block, 1), C = x->shape[1];
    return (blocks){.N = x->shape[0],
                    .C = C,
                    .P = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1,
                    .B = B,
                    .G = C / B};
}

/* op: batch_norm, batch_norm_relu, or batch_norm_add_relu with the residual r. */
static cddp_tensor *batch_norm(cddp_ctx *ctx, cddp__op op, cddp_tensor *x, cddp_tensor *r,
                               cddp_tensor *weight, cddp_tensor *bias, cddp_tensor *running_mean,
                               cddp_tensor *running_var, bool training, float momentum, float eps) {
    if (CDDP__FAILED(ctx) || !x || (op == CDDP_OP_BATCH_NORM_ADD_RELU && !r)) return NULL;
    bool relu = op != CDDP_OP_BATCH_NORM;
    const char *name = !relu ? "batch_norm" : r ? "batch_norm_add_relu" : "batch_norm_relu";
    if (x->dtype != CDDP_BF16) cddp__need_f32_any(name, x);
    if (r) {
        if (r->dtype != CDDP_BF16) cddp__need_f32_any(name, r);
        CDDP_CHECK(r->ndim == x->ndim && !memcmp(r->shape, x->shape, sizeof x->shape) &&
                       r->block == x->block,
                   "batch_norm_add_relu: the residual %s (blocked by %d) is not of x's shape %s "
                   "and layout (blocked by %d)",
                   CDDP__SHAPE(r), r->block, CDDP__SHAPE(x), x->block);
    }
    CDDP_CHECK((x->ndim == 2 || x->ndim == 4) && x->shape[0] > 0,
               "batch_norm needs (N,C) or (N,C,H,W) with N > 0, got %s", CDDP__SHAPE(x));
    blocks v = blocks_of(x);
    int64_t C = v.C, M = v.N * v.P;
    cddp_tensor *per_c[4] = {weight, bias, running_mean, running_var};
    for (int i = 0; i < 4; i++)
        if (per_c[i])
            CDDP_CHECK(per_c[i]->dtype == CDDP_F32 && per_c[i]->numel == C,
                       "batch_norm: %s %s does not fit %lld channels",
                       (const char *[]){"weight", "bias", "running_mean", "running_var"}[i],
                       CDDP__SHAPE(per_c[i]), (long long)C);
    CDDP_CHECK(training || (running_mean && running_var),
               "batch_norm in evaluation needs the running statistics");
    CDDP_CHECK(!training || M > 1,
               "batch_norm in training needs more than one value per "
               "channel, got %s",
               CDDP__SHAPE(x));
    cddp__cdev *d = CDDP__ON(ctx, name, x, r, weight, bias, running_mean, running_var);
    cddp_tensor *out = cddp__empty(d, x->dtype, x->ndim, x->shape);
    float *stats = out ? cddp__dalloc(d, 2 * (size_t)C * sizeof(float)) : NULL; /* mean, 1/std */
    if (!stats) return NULL;
    out->block = x->block;
    CDDP__K(&d->q, batch_norm, .x = cddp__f32_data(x), .x16 = cddp__bf16_data(x),
            .r = cddp__f32_data(r), .r16 = cddp__bf16_data(r), .w = weight ? weight->data : NULL,
            .b = bias ? bias->data : NULL, .rmean = running_mean ? running_mean->data : NULL,
            .rvar = running_var ? running_var->data : NULL, .y = cddp__f32_data(out),
            .y16 = cddp__bf16_data(out), .stats = stats, .N = v.N, .C = C, .P = v.P, .B = v.B,
            .training = training, .relu = relu, .momentum = momentum, .eps = eps);
    cddp_tensor *in[4] = {x, weight, bias, r};
    cddp__node *node;
    if (!cddp__record_op(ctx, op, out, r ? 4 : 3, in, &node)) return NULL;
    if (node) {
        node->arg.training = training;
        node->saved = stats;
    }
    return out;
}

cddp_tensor *cddp_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, cddp_tensor *bias,
                             cddp_tensor *running_mean, cddp_tensor *running_var, bool training,
                             float momentum, float eps) {
    return batch_norm(ctx, CDDP_OP_BATCH_NORM, x, NULL, weight, bias, running_mean, running_var,
                      training, momentum, eps);
}

cddp_tensor *cddp_batch_norm_relu(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight,
                                  cddp_tensor *bias, cddp_tensor *running_mean,
                                  cddp_tensor *running_var, bool training, float momentum,
                                  float eps) {
    return batch_norm(ctx, CDDP_OP_BATCH_NORM_RELU, x, NULL, weight, bias, running_mean,
                      running_var, training, momentum, eps);
}

cddp_tensor *cddp_batch_norm_add_relu(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *residual,
                                      cddp_tensor *weight, cddp_tensor *bias,
                                      cddp_tensor *running_mean, cddp_tensor *running_var,
                                      bool training, float momentum, float eps) {
    return batch_norm(ctx, CDDP_OP_BATCH_NORM_ADD_RELU, x, residual, weight, bias, running_mean,
                      running_var, training, momentum, eps);
}

static void batch_norm_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0], *r = n->nin > 3 ? n->in[3] : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (!d) return;
    float *dy = n->out->grad;
    bool dy_free = !n->out->retain_grad, rassign = false;
    float *dr = NULL;
    if (r && r->requires_grad && !r->grad && !r->is_param && r != x && dy_free) {
        /* r's gradient is the output's masked, all of it: the kernel masks the output's gradient
         * in place (dy_free), so r takes that buffer, which the output no longer holds (nor
         * releases), instead of a copy of it. */
        r->grad = dy;
        n->out->grad = NULL;
    } else if (r && r->requires_grad) {
        /* The residual's gradient (the masked one) first: when r is x, dx is then added to it. */
        dr = cddp_grad_buffer_assign(ctx, r, &rassign);
    }
    if (dr && r == x && rassign) { /* dx's blocks may come before r's: both add */
        CDDP__K(&d->q, fill, .dst = dr, .n = r->numel, .size = (int)sizeof(float));
        rassign = false;
    }
    bool assign = true; /* dx stored, not added, when x had no gradient yet */
    /* the whole of x's gradient, in bf16 for the convolution that made x, where it reads it so */
    uint16_t *dx16 = cddp__input_grad_half(ctx, n, 0, NULL);
    float *dx = dx16 ? NULL : cddp__input_grad_assign(ctx, n, &assign);
    cddp_tensor *g = n->in[1], *b = n->in[2];
    float *gg = g && g->requires_grad ? cddp_grad_buffer(ctx, g) : NULL;
    float *gb = b && b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
    if (CDDP__FAILED(ctx)) return;
    blocks v = blocks_of(x);
    CDDP__K(&d->q, batch_norm_grad, .x = cddp__f32_data(x), .x16 = cddp__bf16_data(x),
            .y = cddp__f32_data(n->out), .y16 = cddp__bf16_data(n->out), .dy = dy,
            .w = g ? g->data : NULL, .stats = n->saved, .dx = dx, .assign = assign, .dr = dr,
            .rassign = rassign, .dw = gg, .db = gb, .N = v.N, .C = v.C, .P = v.P, .B = v.B,
            .training = n->arg.training, .relu = n->op != CDDP_OP_BATCH_NORM, .dy_free = dy_free,
            .dx16 = dx16);
}

void cddp__batch_norm_backward(cddp_ctx *ctx, cddp__node *n) {
    batch_norm_backward(ctx, n);
}

void cddp__batch_norm_relu_backward(cddp_ctx *ctx, cddp__node *n) {
    batch_norm_backward(ctx, n);
}

void cddp__batch_norm_add_relu_backward(cddp_ctx *ctx, cddp__node *n) {
    batch_norm_backward(ctx, n);
}
