/* norm.c: batch normalisation over every dimension but the channels, as PyTorch's
 * BatchNorm1d/2d, in training (batch statistics, running statistics updated) and evaluation; on
 * row-major tensors and on channel-blocked ones (tensor.h's "Layouts").
 *
 * Both layouts are walked as blocks: image n's group g of B channels is a block of P = H W
 * positions, B values side by side at each (row-major: B = 1, a group is a channel and a block
 * its plane). A group's blocks over the batch are summed, normalised and differentiated together,
 * while they are in cache: a row-major channel's planes, or a blocked group's B channels at once.
 * Each block's sums are taken in float lanes and added across blocks in double.
 *
 * batch_norm_relu is relu(batch_norm(x)) in one pass each way: each block is rectified right after
 * it is normalised, while it is in cache, and in the backward the output's gradient is masked a
 * block at a time (where the output is positive) into a block of scratch that the batch
 * normalisation's loops read as its gradient: no ReLU tensor, no pass of its own, and the same
 * values and gradients as the two ops. batch_norm_add_relu, relu(batch_norm(x) + r) (a residual
 * block's end), adds r's block before rectifying it, and gives r the masked gradient block by
 * block in the first backward pass: no sum tensor, no pass for the sum or its gradient. */
#include "tensor/internal.h"

#include <math.h>
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

/* The offset of block (n, g). */
static int64_t at(const blocks *v, int64_t n, int64_t g) {
    return (n * v->G + g) * v->B * v->P;
}

/* A block's loops (cddp__lanes_*, with a plane's own loops when B is 1); per-channel values are
 * the group's B. */
static void block_sum(const blocks *v, const float *x, double *out) {
    if (v->B == 1)
        *out += cddp__sum(x, v->P);
    else
        cddp__lanes_sum(x, v->P, v->B, out);
}

static void block_sq_dev(const blocks *v, const float *x, const float *m, double *out) {
    if (v->B == 1)
        *out += cddp__sq_dev(x, *m, v->P);
    else
        cddp__lanes_sq_dev(x, m, v->P, v->B, out);
}

static void block_dot_dev(const blocks *v, const float *d, const float *x, const float *m,
                          double *out) {
    if (v->B == 1)
        *out += cddp__dot_dev(d, x, *m, v->P);
    else
        cddp__lanes_dot_dev(d, x, m, v->P, v->B, out);
}

static void block_normalize(const blocks *v, const float *x, const float *m, const float *s,
                            const float *b, float *y) {
    if (v->B == 1)
        cddp__normalize(x, *m, *s, *b, y, v->P);
    else
        cddp__lanes_normalize(x, m, s, b, y, v->P, v->B);
}

static void block_norm_grad(const blocks *v, float *dx, const float *d, const float *x,
                            const float *k, const float *a, const float *m, const float *b,
                            bool assign) {
    if (v->B == 1)
        cddp__norm_grad_into(dx, d, x, *k, *a, *m, *b, v->P, assign);
    else
        cddp__lanes_norm_grad_into(dx, d, x, k, a, m, b, v->P, v->B, assign);
}

/* The gradient a block's batch normalisation receives: d, or (relu) d where the block's output y
 * is positive, 0 elsewhere, written into scratch. */
static const float *block_grad(const blocks *v, const float *d, const float *y, bool relu,
                               float *scratch) {
    if (!relu) return d;
    cddp__relu_grad(y, d, scratch, v->B * v->P, true);
    return scratch;
}

/* op: batch_norm, batch_norm_relu, or batch_norm_add_relu with the residual r. */
static cddp_tensor *batch_norm(cddp_ctx *ctx, cddp__op op, cddp_tensor *x, cddp_tensor *r,
                               cddp_tensor *weight, cddp_tensor *bias, cddp_tensor *running_mean,
                               cddp_tensor *running_var, bool training, float momentum, float eps) {
    if (CDDP__FAILED(ctx) || !x || (op == CDDP_OP_BATCH_NORM_ADD_RELU && !r)) return NULL;
    bool relu = op != CDDP_OP_BATCH_NORM;
    const char *name = !relu ? "batch_norm" : r ? "batch_norm_add_relu" : "batch_norm_relu";
    cddp__need_f32_any(name, x);
    if (r) {
        cddp__need_f32_any(name, r);
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
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *stats = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(float)); /* mean, 1/std */
    float *sb = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(float));    /* scale, shift */
    double *acc = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(double));
    if (!out || !stats || !sb || !acc) return NULL;
    out->block = x->block;
    const float *xd = cddp_f32(x);
    float *y = cddp_f32(out), *mean = stats, *inv = stats + C, *scale = sb, *shift = sb + C;
    for (int64_t g = 0; g < v.G; g++) {
        int64_t c0 = g * v.B;
        double *s = acc + c0, *ss = acc + C + c0;
        for (int64_t k = 0; k < v.B; k++) s[k] = ss[k] = 0.0;
        if (training) {
            for (int64_t n = 0; n < v.N; n++) block_sum(&v, xd + at(&v, n, g), s);
            for (int64_t k = 0; k < v.B; k++) mean[c0 + k] = (float)(s[k] / (double)M);
            for (int64_t n = 0; n < v.N; n++) block_sq_dev(&v, xd + at(&v, n, g), mean + c0, ss);
        }
        for (int64_t c = c0; c < c0 + v.B; c++) {
            double var;
            if (training) {
                var = ss[c - c0] / (double)M;
                if (running_mean)
                    cddp_f32(running_mean)[c] = (1.0f - momentum) * cddp_f32(running_mean)[c] +
                                                momentum * (float)(s[c - c0] / (double)M);
                if (running_var)
                    cddp_f32(running_var)[c] = (1.0f - momentum) * cddp_f32(running_var)[c] +
                                               momentum * (float)(ss[c - c0] / (double)(M - 1));
            } else {
                mean[c] = cddp_f32(running_mean)[c];
                var = cddp_f32(running_var)[c];
            }
            inv[c] = (float)(1.0 / sqrt(var + (double)eps));
            scale[c] = inv[c] * (weight ? cddp_f32(weight)[c] : 1.0f);
            shift[c] = bias ? cddp_f32(bias)[c] : 0.0f;
        }
        for (int64_t n = 0; n < v.N; n++) {
            float *yb = y + at(&v, n, g);
            block_normalize(&v, xd + at(&v, n, g), mean + c0, scale + c0, shift + c0, yb);
            if (r) cddp__add_into(yb, cddp_f32(r) + at(&v, n, g), v.B * v.P);
            if (relu) cddp__relu(yb, yb, v.B * v.P);
        }
    }
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
    /* The residual's gradient (the masked one) first: when r is x, dx is then added to it. */
    bool rassign = false;
    float *dr = r && r->requires_grad ? cddp_grad_buffer_assign(ctx, r, &rassign) : NULL;
    if (dr && r == x && rassign) { /* dx's blocks may come before r's: both add */
        memset(dr, 0, (size_t)r->numel * sizeof(float));
        rassign = false;
    }
    bool assign; /* dx stored, not added, when x had no gradient yet */
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    const float *dy = n->out->grad, *y = cddp_f32(n->out);
    bool relu = n->op != CDDP_OP_BATCH_NORM;
    /* With xh = (x - mean) inv and y = g xh + b, per channel over its M values:
     * db = sum dy, dg = sum dy xh; in training (mean and inv depend on x)
     * dx = g inv (dy - sum(dy) / M - xh sum(dy xh) / M), in evaluation dx = g inv dy. */
    cddp_tensor *g = n->in[1], *b = n->in[2];
    blocks v = blocks_of(x);
    int64_t C = v.C, M = v.N * v.P;
    const float *stats = n->saved, *xd = cddp_f32(x), *mean = stats, *inv = stats + C;
    float *gg = g && g->requires_grad ? cddp_grad_buffer(ctx, g) : NULL;
    float *gb = b && b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
    double *acc = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(double));
    float *coef = cddp__ctx_alloc(ctx, 3 * (size_t)C * sizeof(float)); /* dx's k, a and b */
    float *scratch = relu ? cddp__ctx_alloc(ctx, (size_t)(v.B * v.P) * sizeof(float)) : NULL;
    if (CDDP__FAILED(ctx) || !acc || !coef || (relu && !scratch)) return;
    float *ck = coef, *ca = coef + C, *cb = coef + 2 * C;
    for (int64_t grp = 0; grp < v.G; grp++) {
        int64_t c0 = grp * v.B;
        double *sdy = acc + c0, *sdyxh = acc + C + c0;
        for (int64_t k = 0; k < v.B; k++) sdy[k] = sdyxh[k] = 0.0;
        for (int64_t s = 0; s < v.N; s++) {
            const float *d = block_grad(&v, dy + at(&v, s, grp), y + at(&v, s, grp), relu, scratch);
            if (dr && rassign)
                memcpy(dr + at(&v, s, grp), d, (size_t)(v.B * v.P) * sizeof(float));
            else if (dr)
                cddp__add_into(dr + at(&v, s, grp), d, v.B * v.P);
            block_sum(&v, d, sdy);
            block_dot_dev(&v, d, xd + at(&v, s, grp), mean + c0, sdyxh);
        }
        for (int64_t c = c0; c < c0 + v.B; c++) {
            double sx = sdyxh[c - c0] * inv[c];
            if (gb) gb[c] += (float)sdy[c - c0];
            if (gg) gg[c] += (float)sx;
            float mdyxh = n->arg.training ? (float)(sx / (double)M) : 0.0f;
            ck[c] = (g ? cddp_f32(g)[c] : 1.0f) * inv[c];
            ca[c] = n->arg.training ? (float)(sdy[c - c0] / (double)M) : 0.0f;
            cb[c] = inv[c] * mdyxh;
        }
        if (!dx) continue;
        for (int64_t s = 0; s < v.N; s++) {
            const float *d = block_grad(&v, dy + at(&v, s, grp), y + at(&v, s, grp), relu, scratch);
            block_norm_grad(&v, dx + at(&v, s, grp), d, xd + at(&v, s, grp), ck + c0, ca + c0,
                            mean + c0, cb + c0, assign);
        }
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
