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
 * its values rounded to nearest even, and the backward reads the bf16 input and output.
 *
 * Sync batch normalisation (a group of ranks, in training) runs each kernel in two phases: the
 * per-channel sums first (the forward's means and squared deviations, the backward's two gradient
 * sums), then, once every rank's are gathered and combined in rank order, the rest with the whole
 * batch's. */
#include "cddp/comm.h"
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

/* Every rank's per-channel sums combined (sync batch normalisation): sums (2 C doubles, d's
 * memory) holds this rank's, over m values a channel: with stats, each channel's mean and squared
 * deviations from it, combined as Chan, Golub and LeVeque's parallel variance; else two plain sums.
 * The ranks' are gathered and combined in rank order, so every rank gets the same bits; sums then
 * holds the whole batch's, and *count its values a channel. false: failed (latched in ctx, with the
 * group's words). */
static bool combine_ranks(cddp_ctx *ctx, cddp__cdev *d, cddp_comm *group, double *sums, int64_t C,
                          int64_t m, bool stats, int64_t *count) {
    int world = cddp_comm_size(group);
    size_t per = 1 + 2 * (size_t)C;
    double *mine = cddp_malloc(per * (size_t)(world + 1) * sizeof(double)), *all = mine + per;
    if (!mine) return cddp_ctx_fail(ctx, CDDP_ENOMEM, "sync batch norm: out of memory"), false;
    cddp_error err = {0};
    mine[0] = (double)m;
    int rc = d->q.dev->ops->download(d->q.dev, d->q.queue, mine + 1, sums,
                                     2 * (size_t)C * sizeof(double), &err);
    if (rc == CDDP_OK)
        rc = cddp_comm_allgather(group, mine, all, (int64_t)per, CDDP_COMM_F64, -1, &err);
    if (rc == CDDP_OK) {
        double *a = mine + 1, *b = a + C, n = 0.0;
        memset(a, 0, 2 * (size_t)C * sizeof(double));
        for (int r = 0; r < world; r++) {
            const double *o = all + (size_t)r * per, k = o[0];
            if (stats && k > 0.0) {
                double total = n + k;
                for (int64_t c = 0; c < C; c++) {
                    double delta = o[1 + c] - a[c];
                    a[c] += delta * k / total;
                    b[c] += o[1 + C + c] + delta * delta * n * k / total;
                }
            } else if (!stats) {
                for (int64_t c = 0; c < C; c++) a[c] += o[1 + c], b[c] += o[1 + C + c];
            }
            n += k;
        }
        *count = (int64_t)n;
        cddp__upload(d, sums, a, 2 * (size_t)C * sizeof(double));
    }
    cddp_free(mine);
    if (rc != CDDP_OK) cddp_ctx_fail(ctx, rc, "sync batch norm: %s", err.msg);
    return rc == CDDP_OK && !CDDP__FAILED(ctx);
}

/* Whether batch normalisation in training on group takes every rank's batch. */
static bool synced(const cddp_comm *group, bool training) {
    return group && training && cddp_comm_size(group) > 1;
}

/* op: batch_norm, batch_norm_relu, or batch_norm_add_relu with the residual r; group: sync. */
static cddp_tensor *batch_norm(cddp_ctx *ctx, cddp__op op, cddp_tensor *x, cddp_tensor *r,
                               cddp_tensor *weight, cddp_tensor *bias, cddp_tensor *running_mean,
                               cddp_tensor *running_var, bool training, float momentum, float eps,
                               cddp_comm *group) {
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
    bool sync = synced(group, training); /* then the ranks' values together must be more than 1 */
    CDDP_CHECK(!training || M > 1 || sync,
               "batch_norm in training needs more than one value per "
               "channel, got %s",
               CDDP__SHAPE(x));
    cddp__cdev *d = CDDP__ON(ctx, name, x, r, weight, bias, running_mean, running_var);
    cddp_tensor *out = cddp__empty(d, x->dtype, x->ndim, x->shape);
    float *stats = out ? cddp__dalloc(d, 2 * (size_t)C * sizeof(float)) : NULL; /* mean, 1/std */
    double *sums = sync && stats ? cddp__dalloc(d, 2 * (size_t)C * sizeof(double)) : NULL;
    if (!stats || (sync && !sums)) return NULL;
    out->block = x->block;
    int64_t count = 0;
    for (int phase = sync ? 1 : 0; phase <= (sync ? 2 : 0); phase++) {
        if (phase == 2 && !combine_ranks(ctx, d, group, sums, C, M, true, &count)) return NULL;
        if (phase == 2 && count < 2)
            return cddp_ctx_fail(ctx, CDDP_ESHAPE,
                                 "sync batch_norm in training needs more than one value per "
                                 "channel over all ranks, got %lld",
                                 (long long)count),
                   NULL;
        CDDP__K(&d->q, batch_norm, .x = cddp__f32_data(x), .x16 = cddp__bf16_data(x),
                .r = cddp__f32_data(r), .r16 = cddp__bf16_data(r),
                .w = weight ? weight->data : NULL, .b = bias ? bias->data : NULL,
                .rmean = running_mean ? running_mean->data : NULL,
                .rvar = running_var ? running_var->data : NULL, .y = cddp__f32_data(out),
                .y16 = cddp__bf16_data(out), .stats = stats, .N = v.N, .C = C, .P = v.P, .B = v.B,
                .training = training, .relu = relu, .momentum = momentum, .eps = eps,
                .phase = phase, .sums = sums, .count = count);
    }
    cddp_tensor *in[4] = {x, weight, bias, r};
    cddp__node *node;
    if (!cddp__record_op(ctx, op, out, r ? 4 : 3, in, &node)) return NULL;
    if (node) {
        node->arg.bn.training = training;
        node->arg.bn.group = sync ? group : NULL;
        node->saved = stats;
    }
    return out;
}

cddp_tensor *cddp_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, cddp_tensor *bias,
                             cddp_tensor *running_mean, cddp_tensor *running_var, bool training,
                             float momentum, float eps) {
    return batch_norm(ctx, CDDP_OP_BATCH_NORM, x, NULL, weight, bias, running_mean, running_var,
                      training, momentum, eps, NULL);
}

cddp_tensor *cddp_batch_norm_relu(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight,
                                  cddp_tensor *bias, cddp_tensor *running_mean,
                                  cddp_tensor *running_var, bool training, float momentum,
                                  float eps) {
    return batch_norm(ctx, CDDP_OP_BATCH_NORM_RELU, x, NULL, weight, bias, running_mean,
                      running_var, training, momentum, eps, NULL);
}

cddp_tensor *cddp_batch_norm_add_relu(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *residual,
                                      cddp_tensor *weight, cddp_tensor *bias,
                                      cddp_tensor *running_mean, cddp_tensor *running_var,
                                      bool training, float momentum, float eps) {
    return batch_norm(ctx, CDDP_OP_BATCH_NORM_ADD_RELU, x, residual, weight, bias, running_mean,
                      running_var, training, momentum, eps, NULL);
}

cddp_tensor *cddp_sync_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *residual, bool relu,
                                  cddp_tensor *weight, cddp_tensor *bias, cddp_tensor *running_mean,
                                  cddp_tensor *running_var, bool training, float momentum,
                                  float eps, cddp_comm *group) {
    CDDP_CHECK(!residual || relu, "cddp_sync_batch_norm: a residual needs relu (the residual "
                                  "block's end: relu(batch_norm(x) + residual))");
    cddp__op op = residual ? CDDP_OP_BATCH_NORM_ADD_RELU
                  : relu   ? CDDP_OP_BATCH_NORM_RELU
                           : CDDP_OP_BATCH_NORM;
    return batch_norm(ctx, op, x, residual, weight, bias, running_mean, running_var, training,
                      momentum, eps, group);
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
    blocks v = blocks_of(x);
    cddp_comm *group = n->arg.bn.group;
    double *sums = group ? cddp__dalloc(d, 2 * (size_t)v.C * sizeof(double)) : NULL;
    if (CDDP__FAILED(ctx)) return;
    int64_t count = 0;
    for (int phase = group ? 1 : 0; phase <= (group ? 2 : 0); phase++) {
        if (phase == 2 && !combine_ranks(ctx, d, group, sums, v.C, v.N * v.P, false, &count))
            return;
        CDDP__K(&d->q, batch_norm_grad, .x = cddp__f32_data(x), .x16 = cddp__bf16_data(x),
                .y = cddp__f32_data(n->out), .y16 = cddp__bf16_data(n->out), .dy = dy,
                .w = g ? g->data : NULL, .stats = n->saved, .dx = dx, .assign = assign, .dr = dr,
                .rassign = rassign, .dw = gg, .db = gb, .N = v.N, .C = v.C, .P = v.P, .B = v.B,
                .training = n->arg.bn.training, .relu = n->op != CDDP_OP_BATCH_NORM,
                .dy_free = dy_free, .dx16 = dx16, .phase = phase, .sums = sums, .count = count);
    }
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
