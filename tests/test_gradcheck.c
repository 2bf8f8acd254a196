/* test_gradcheck.c: every op's backward against central finite differences.
 *
 * For each op, 30 cases with random shapes and arguments. A case builds the op on fresh inputs,
 * reduces the output to a scalar L = sum(out * R) with a fixed random R (so that every output
 * element carries a different weight), and compares dL/dx from cddp_backward with
 * (L(x + h) - L(x - h)) / 2h, computed in double from the op's output, for up to 40 elements of
 * each differentiable input. Inputs stay away from kinks (ReLU at 0, ties in max-pooling, small
 * denominators) by construction, so a mismatch is a wrong gradient, not a non-differentiable
 * point. Tolerance: |numeric - analytic| <= 2e-3 + 1e-2 |analytic| with h = 1e-2 in float32.
 *
 * Half the cases of the ops that take channel-blocked tensors (conv2d, batch_norm, relu, scale,
 * add, adaptive_avg_pool2d; tensor.h's "Layouts") run on them: their inputs are given whole
 * blocks of channels and reordered by cddp_to_blocked, their output back by cddp_to_nchw, so the
 * check covers the blocked forward, the blocked backward and both reorders' backward.
 *
 * The cases run on the test device (helpers.h): their inputs are copied there from the host for
 * every evaluation, and the outputs and gradients copied back.
 *
 * Every op of the library's list (src/tensor/ops/list.h) is checked here or named in
 * `elsewhere` below with the test that checks its gradient (a fused op against its parts, bit for
 * bit; a cast; a copy between devices): a new op fails test_every_op_is_checked until it is one
 * or the other.
 */
#include "helpers.h"
#include "tensor/ops/list.h"

enum {
    OP_MATMUL,
    OP_LINEAR,
    OP_GELU_TANH_LINEAR,
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_SCALE,
    OP_RELU,
    OP_GELU,
    OP_TANH,
    OP_SIGMOID,
    OP_SOFTMAX,
    OP_LOG_SOFTMAX,
    OP_CROSS_ENTROPY,
    OP_MSE,
    OP_SUM,
    OP_MEAN,
    OP_CONV2D,
    OP_MAX_POOL2D,
    OP_DROPOUT,
    OP_RESHAPE,
    OP_BATCH_NORM,
    OP_EMBEDDING,
    OP_LAYER_NORM,
    OP_GELU_TANH,
    OP_ATTENTION,
    OP_AVG_POOL2D,
    OP_ADAPTIVE_AVG_POOL2D,
    OP_RELU_MAX_POOL2D,
    OP_RMS_NORM,
    OP_SILU_MUL,
    OP_ROPE,
    OP_QKV_PACK,
    OP_COUNT
};

static const char *op_names[OP_COUNT] = {"matmul",
                                         "linear",
                                         "gelu_tanh_linear",
                                         "add",
                                         "sub",
                                         "mul",
                                         "div",
                                         "scale",
                                         "relu",
                                         "gelu",
                                         "tanh",
                                         "sigmoid",
                                         "softmax",
                                         "log_softmax",
                                         "cross_entropy",
                                         "mse_loss",
                                         "sum",
                                         "mean",
                                         "conv2d",
                                         "max_pool2d",
                                         "dropout",
                                         "reshape",
                                         "batch_norm",
                                         "embedding",
                                         "layer_norm",
                                         "gelu_tanh",
                                         "attention",
                                         "avg_pool2d",
                                         "adaptive_avg_pool2d",
                                         "relu_max_pool2d",
                                         "rms_norm",
                                         "silu_mul",
                                         "rope",
                                         "qkv_pack"};

#define CASES   30
#define MAX_IN  3
#define H       1e-2f
#define CHECKED 40

typedef struct gc_case {
    int op, nin;
    int ndim[MAX_IN];
    int64_t shape[MAX_IN][4];
    float *data[MAX_IN];
    int64_t labels[64];
    bool ta, tb, bias;
    int stride, pad, kernel, groups;
    float s;
    cddp_reduction red;
    float running[2][16]; /* batch_norm in evaluation: mean, var */
    bool blocked;         /* run in the channel-blocked layout */
} gc_case;

static cddp_ctx *ctx;
static cddp_rng rng;

static int64_t rnd(int64_t lo, int64_t hi) { /* inclusive */
    return lo + (int64_t)cddp_rng_below(&rng, (uint64_t)(hi - lo + 1));
}

static float rndf(float lo, float hi) {
    return lo + (hi - lo) * cddp_rng_uniform(&rng);
}

static int64_t numel(const gc_case *c, int i) {
    int64_t n = 1;
    for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
    return n;
}

static void set_shape(gc_case *c, int i, int nd, int64_t a, int64_t b, int64_t d2, int64_t d3) {
    int64_t s[4] = {a, b, d2, d3};
    c->ndim[i] = nd;
    memcpy(c->shape[i], s, sizeof s);
}

/* Broadcast-compatible shapes for a and b, right-aligned, 1 to 4 dimensions. */
static void broadcast_shapes(gc_case *c) {
    int nd = (int)rnd(1, 4);
    int na = (int)rnd(1, nd), nb = rnd(0, 1) ? nd : (int)rnd(1, nd);
    if (na < nd && nb < nd) na = nd;
    c->ndim[0] = na;
    c->ndim[1] = nb;
    for (int d = 0; d < nd; d++) {
        int64_t s = rnd(1, 3);
        int ia = d - (nd - na), ib = d - (nd - nb);
        if (ia >= 0) c->shape[0][ia] = rnd(0, 3) ? s : 1;
        if (ib >= 0) c->shape[1][ib] = rnd(0, 3) ? s : 1;
        if (ia >= 0 && ib >= 0 && c->shape[0][ia] == 1 && c->shape[1][ib] == 1 && s > 1)
            c->shape[0][ia] = s;
    }
}

static void any_shape(gc_case *c, int i) {
    c->ndim[i] = (int)rnd(1, 4);
    for (int d = 0; d < c->ndim[i]; d++) c->shape[i][d] = rnd(1, 4);
}

/* batch_norm's weight and bias (C), and running statistics for evaluation. */
static void batch_norm_params(gc_case *c, int64_t C) {
    set_shape(c, 1, 1, C, 0, 0, 0);
    set_shape(c, 2, 1, C, 0, 0, 0);
    for (int64_t k = 0; k < C; k++) {
        c->running[0][k] = rndf(-0.5f, 0.5f);
        c->running[1][k] = rndf(0.5f, 1.5f);
    }
}

/* Turns a case of an op that takes channel-blocked tensors into one whose channels are whole
 * blocks of B (the machine's), to be run blocked. */
static void make_blocked(gc_case *c, int64_t B) {
    int64_t N = rnd(1, 2), Hh = rnd(1, 3), Ww = rnd(1, 3);
    switch (c->op) {
    case OP_CONV2D: { /* B channels per group in, B per group out */
        int64_t C = B * c->groups;
        Hh = rnd(c->kernel, 5);
        Ww = rnd(c->kernel, 5);
        set_shape(c, 0, 4, N, C, Hh, Ww);
        set_shape(c, 1, 4, C, B, c->kernel, c->kernel);
        set_shape(c, 2, 1, C, 0, 0, 0);
        break;
    }
    case OP_BATCH_NORM:
        set_shape(c, 0, 4, N + 1, B, Hh, Ww);
        batch_norm_params(c, B);
        break;
    case OP_ADAPTIVE_AVG_POOL2D:
        c->shape[0][1] = B;
        break;
    case OP_ADD: /* one shape: blocked tensors do not broadcast */
        set_shape(c, 0, 4, N, B, Hh, Ww);
        set_shape(c, 1, 4, N, B, Hh, Ww);
        break;
    case OP_RELU:
    case OP_SCALE:
        set_shape(c, 0, 4, N, 2 * B, Hh, Ww);
        break;
    default:
        return;
    }
    c->blocked = true;
}

/* Random arguments and inputs for one case of op. */
static void make_case(gc_case *c, int op) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->nin = 1;
    c->red = rnd(0, 1) ? CDDP_REDUCE_SUM : CDDP_REDUCE_MEAN;
    switch (op) {
    case OP_MATMUL: {
        int64_t M = rnd(1, 6), K = rnd(1, 6), N = rnd(1, 6);
        c->ta = rnd(0, 1);
        c->tb = rnd(0, 1);
        c->nin = 2;
        set_shape(c, 0, 2, c->ta ? K : M, c->ta ? M : K, 0, 0);
        set_shape(c, 1, 2, c->tb ? N : K, c->tb ? K : N, 0, 0);
        break;
    }
    case OP_LINEAR: /* (N, in), or (B, T, in): every leading dimension a row */
    case OP_GELU_TANH_LINEAR: {
        int64_t N = rnd(1, 5), in = rnd(1, 6), out = rnd(1, 5);
        c->bias = rnd(0, 1);
        c->nin = c->bias ? 3 : 2;
        if (rnd(0, 1))
            set_shape(c, 0, 2, N, in, 0, 0);
        else
            set_shape(c, 0, 3, rnd(1, 3), N, in, 0);
        set_shape(c, 1, 2, out, in, 0, 0);
        set_shape(c, 2, 1, out, 0, 0, 0);
        break;
    }
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
        c->nin = 2;
        broadcast_shapes(c);
        break;
    case OP_CROSS_ENTROPY:
        set_shape(c, 0, 2, rnd(1, 6), rnd(2, 7), 0, 0);
        for (int64_t i = 0; i < c->shape[0][0]; i++) c->labels[i] = rnd(0, c->shape[0][1] - 1);
        break;
    case OP_MSE:
        c->nin = 2;
        any_shape(c, 0);
        c->ndim[1] = c->ndim[0];
        memcpy(c->shape[1], c->shape[0], sizeof c->shape[0]);
        break;
    case OP_CONV2D: { /* ta: the output is conv(x) + conv(x), so backward adds into gradients */
        c->kernel = (int)rnd(1, 3);
        c->stride = (int)rnd(1, 2);
        c->pad = (int)rnd(0, 2);
        c->bias = rnd(0, 1);
        c->ta = rnd(0, 1);
        c->groups = (int)rnd(1, 2);
        c->nin = c->bias ? 3 : 2;
        /* Channels per group: a few, or 8 and more, where oneDNN takes its blocked kernels. */
        int64_t per = rnd(0, 2) ? rnd(1, 3) : rnd(8, 9), O = c->groups * rnd(1, rnd(0, 1) ? 3 : 9);
        int64_t Hh = rnd(c->kernel, 6), Ww = rnd(c->kernel, 6);
        set_shape(c, 0, 4, rnd(1, 2), per * c->groups, Hh, Ww);
        set_shape(c, 1, 4, O, per, c->kernel, c->kernel);
        set_shape(c, 2, 1, O, 0, 0, 0);
        break;
    }
    case OP_ADAPTIVE_AVG_POOL2D: /* to stride x pad: any size, larger than the input too */
        c->stride = (int)rnd(1, 4);
        c->pad = (int)rnd(1, 4);
        set_shape(c, 0, 4, rnd(1, 2), rnd(1, 3), rnd(1, 7), rnd(1, 7));
        break;
    case OP_MAX_POOL2D:
    case OP_RELU_MAX_POOL2D:
    case OP_AVG_POOL2D:
        c->kernel = (int)rnd(1, 3);
        c->stride = (int)rnd(1, 3);
        c->pad = (int)rnd(0, c->kernel / 2);
        set_shape(c, 0, 4, rnd(1, 2), rnd(1, 3), rnd(c->kernel, 6), rnd(c->kernel, 6));
        break;
    case OP_BATCH_NORM: { /* ta: training (batch statistics), else the running ones */
        int64_t N = rnd(2, 4), C = rnd(1, 4);
        c->ta = rnd(0, 1);
        c->nin = 3;
        if (rnd(0, 1))
            set_shape(c, 0, 4, N, C, rnd(1, 3), rnd(1, 3));
        else
            set_shape(c, 0, 2, N + 2, C, 0, 0);
        batch_norm_params(c, C);
        break;
    }
    case OP_EMBEDDING: { /* the table; ids (B, T) with repeats, so rows gather several */
        int64_t V = rnd(1, 6), C = rnd(1, 5), B = rnd(1, 3), T = rnd(1, 6);
        set_shape(c, 0, 2, V, C, 0, 0);
        c->stride = (int)B;
        c->kernel = (int)T;
        for (int64_t i = 0; i < B * T; i++) c->labels[i] = rnd(0, V - 1);
        break;
    }
    case OP_LAYER_NORM: { /* x (..., C); weight and bias, or neither (bias false) */
        int nd = (int)rnd(1, 3);
        int64_t C = rnd(2, 6);
        c->bias = rnd(0, 3) != 0;
        c->nin = c->bias ? 3 : 1;
        set_shape(c, 0, nd, nd == 1 ? C : rnd(1, 3), nd == 2 ? C : rnd(1, 3), C, 0);
        set_shape(c, 1, 1, C, 0, 0, 0);
        set_shape(c, 2, 1, C, 0, 0, 0);
        break;
    }
    case OP_ATTENTION: { /* qkv (B, T, 3 * n_head * HS) */
        int64_t B = rnd(1, 2), T = rnd(1, 5), NH = rnd(1, 3), HS = rnd(1, 3);
        c->kernel = (int)NH;
        set_shape(c, 0, 3, B, T, 3 * NH * HS, 0);
        break;
    }
    case OP_RMS_NORM: { /* x (..., C); a weight or none (bias false) */
        int nd = (int)rnd(1, 3);
        int64_t C = rnd(2, 7);
        c->bias = rnd(0, 3) != 0;
        c->nin = c->bias ? 2 : 1;
        set_shape(c, 0, nd, nd == 1 ? C : rnd(1, 3), nd == 2 ? C : rnd(1, 3), C, 0);
        set_shape(c, 1, 1, C, 0, 0, 0);
        break;
    }
    case OP_SILU_MUL: /* the gate and the values, of one shape */
        c->nin = 2;
        any_shape(c, 0);
        c->ndim[1] = c->ndim[0];
        memcpy(c->shape[1], c->shape[0], sizeof c->shape[0]);
        break;
    case OP_ROPE: { /* x (B, T, NH D) from position pos0; D/2 frequencies (a constant) */
        int64_t B = rnd(1, 2), T = rnd(1, 5), NH = rnd(1, 3), D = 2 * rnd(1, 4);
        c->kernel = (int)NH;
        c->stride = (int)rnd(0, 9);
        for (int64_t i = 0; i < D / 2; i++) c->running[0][i] = rndf(0.05f, 1.5f);
        set_shape(c, 0, 3, B, T, NH * D, 0);
        break;
    }
    case OP_QKV_PACK: { /* q (B, T, NH D), k and v (B, T, KV D), then the attention */
        int64_t B = rnd(1, 2), T = rnd(1, 4), KV = rnd(1, 2), NH = KV * rnd(1, 3), D = rnd(1, 3);
        c->kernel = (int)NH;
        c->stride = (int)KV;
        c->nin = 3;
        set_shape(c, 0, 3, B, T, NH * D, 0);
        set_shape(c, 1, 3, B, T, KV * D, 0);
        set_shape(c, 2, 3, B, T, KV * D, 0);
        break;
    }
    case OP_SCALE:
        c->s = rndf(-3, 3);
        any_shape(c, 0);
        break;
    case OP_DROPOUT:
        c->s = rndf(0.1f, 0.8f);
        any_shape(c, 0);
        break;
    default:
        any_shape(c, 0);
        break;
    }
    int B = cddp_blocked_size();
    if (B && rnd(0, 1)) make_blocked(c, B);
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel(c, i);
        c->data[i] = malloc(sizeof(float) * (size_t)n);
        for (int64_t k = 0; k < n; k++) {
            float v = rndf(-1, 1);
            if (op == OP_RELU) v = (v < 0 ? -1.0f : 1.0f) * rndf(0.05f, 1.0f); /* no kink */
            if (op == OP_DIV && i == 1) v = (rnd(0, 1) ? 1.0f : -1.0f) * rndf(1.0f, 2.0f);
            if (op == OP_RMS_NORM && i == 0) /* no row near 0, where 1/rms bends */
                v = (v < 0 ? -1.0f : 1.0f) * rndf(0.3f, 1.0f);
            c->data[i][k] = v;
        }
    }
    if (op == OP_LAYER_NORM) { /* rows spread out: a near-constant row's std is a kink */
        int64_t C = c->shape[1][0];
        for (int64_t row = 0; row < numel(c, 0) / C; row++) {
            float *x = c->data[0] + row * C; /* 0.6 apart, +-0.25, in shuffled order */
            for (int64_t k = 0; k < C; k++) x[k] = 0.6f * (float)k + 0.25f * x[k];
            for (int64_t k = C - 1; k > 0; k--) {
                int64_t j = rnd(0, k);
                float t = x[k];
                x[k] = x[j];
                x[j] = t;
            }
        }
    }
    if (op == OP_BATCH_NORM) {
        /* Each channel's values spread out as layer_norm's rows: a channel whose few values
         * (as few as 2) nearly agree has a tiny variance, and its normalisation bends within h. */
        int64_t N = c->shape[0][0], C = c->shape[0][1];
        int64_t P = c->ndim[0] == 4 ? c->shape[0][2] * c->shape[0][3] : 1;
        float *x = c->data[0];
        for (int64_t ch = 0; ch < C; ch++) {
            int64_t M = N * P;
            for (int64_t k = 0; k < M; k++) { /* value k of the channel: image k / P, place k % P */
                float *v = &x[(k / P * C + ch) * P + k % P];
                *v = 0.6f * (float)k + 0.25f * *v - 0.3f * (float)M;
            }
            for (int64_t k = M - 1; k > 0; k--) {
                int64_t j = rnd(0, k);
                float *a = &x[(k / P * C + ch) * P + k % P], *b = &x[(j / P * C + ch) * P + j % P];
                float t = *a;
                *a = *b;
                *b = t;
            }
        }
    }
    if (op == OP_MAX_POOL2D || op == OP_RELU_MAX_POOL2D) {
        /* Distinct values 0.05 apart, shuffled: no window has a near tie; none within 0.025 of
         * the ReLU's kink. */
        int64_t n = numel(c, 0);
        for (int64_t k = 0; k < n; k++) c->data[0][k] = 0.05f * (float)k - 1.025f;
        for (int64_t k = n - 1; k > 0; k--) {
            int64_t j = rnd(0, k);
            float t = c->data[0][k];
            c->data[0][k] = c->data[0][j];
            c->data[0][j] = t;
        }
    }
}

static cddp_tensor *forward_op(gc_case *c, cddp_tensor **in) {
    switch (c->op) {
    case OP_MATMUL:
        return cddp_matmul(ctx, in[0], in[1], c->ta, c->tb);
    case OP_LINEAR:
        return cddp_linear(ctx, in[0], in[1], c->bias ? in[2] : NULL);
    case OP_GELU_TANH_LINEAR:
        return cddp_gelu_tanh_linear(ctx, in[0], in[1], c->bias ? in[2] : NULL);
    case OP_ADD:
        return cddp_add(ctx, in[0], in[1]);
    case OP_SUB:
        return cddp_sub(ctx, in[0], in[1]);
    case OP_MUL:
        return cddp_mul(ctx, in[0], in[1]);
    case OP_DIV:
        return cddp_div(ctx, in[0], in[1]);
    case OP_SCALE:
        return cddp_scale(ctx, in[0], c->s);
    case OP_RELU:
        return cddp_relu(ctx, in[0]);
    case OP_GELU:
        return cddp_gelu(ctx, in[0]);
    case OP_TANH:
        return cddp_tanh(ctx, in[0]);
    case OP_SIGMOID:
        return cddp_sigmoid(ctx, in[0]);
    case OP_SOFTMAX:
        return cddp_softmax(ctx, in[0]);
    case OP_LOG_SOFTMAX:
        return cddp_log_softmax(ctx, in[0]);
    case OP_CROSS_ENTROPY: {
        cddp_tensor *y = cddp_from_data(ctx, CDDP_I64, 1, c->shape[0], c->labels);
        return cddp_cross_entropy(ctx, in[0], y, c->red);
    }
    case OP_MSE:
        return cddp_mse_loss(ctx, in[0], in[1], c->red);
    case OP_SUM:
        return cddp_sum(ctx, in[0]);
    case OP_MEAN:
        return cddp_mean(ctx, in[0]);
    case OP_CONV2D: {
        cddp_tensor *y = cddp_conv2d_groups(ctx, in[0], in[1], c->bias ? in[2] : NULL, c->stride,
                                            c->pad, c->groups);
        return c->ta ? cddp_add(ctx, y,
                                cddp_conv2d_groups(ctx, in[0], in[1], c->bias ? in[2] : NULL,
                                                   c->stride, c->pad, c->groups))
                     : y;
    }
    case OP_MAX_POOL2D:
        return cddp_max_pool2d(ctx, in[0], c->kernel, c->stride, c->pad);
    case OP_RELU_MAX_POOL2D:
        return cddp_relu_max_pool2d(ctx, in[0], c->kernel, c->stride, c->pad);
    case OP_AVG_POOL2D:
        return cddp_avg_pool2d(ctx, in[0], c->kernel, c->stride, c->pad);
    case OP_ADAPTIVE_AVG_POOL2D:
        return cddp_adaptive_avg_pool2d(ctx, in[0], c->stride, c->pad);
    case OP_DROPOUT:
        cddp_rng_seed(cddp_ctx_rng(ctx), 99); /* the same mask at every evaluation */
        return cddp_dropout(ctx, in[0], c->s, true);
    case OP_RESHAPE:
        return cddp_flatten(ctx, cddp_reshape(ctx, in[0], CDDP_SHAPE(-1)));
    case OP_BATCH_NORM: {
        cddp_tensor *rm = NULL, *rv = NULL;
        if (!c->ta) {
            rm = cddp_from_data(ctx, CDDP_F32, 1, &c->shape[0][1], c->running[0]);
            rv = cddp_from_data(ctx, CDDP_F32, 1, &c->shape[0][1], c->running[1]);
        }
        return cddp_batch_norm(ctx, in[0], in[1], in[2], rm, rv, c->ta, 0.1f, 1e-5f);
    }
    case OP_EMBEDDING: {
        cddp_tensor *ids =
            cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(c->stride, c->kernel), (void *)c->labels);
        return cddp_embedding(ctx, ids, in[0]);
    }
    case OP_LAYER_NORM:
        return cddp_layer_norm(ctx, in[0], c->bias ? in[1] : NULL, c->bias ? in[2] : NULL, 1e-5f);
    case OP_GELU_TANH:
        return cddp_gelu_tanh(ctx, in[0]);
    case OP_ATTENTION:
        return cddp_attention(ctx, in[0], c->kernel);
    case OP_RMS_NORM:
        return cddp_rms_norm(ctx, in[0], c->bias ? in[1] : NULL, 1e-5f);
    case OP_SILU_MUL:
        return cddp_silu_mul(ctx, in[0], in[1]);
    case OP_ROPE: {
        int64_t half = c->shape[0][2] / c->kernel / 2;
        cddp_tensor *freq = cddp_from_data(ctx, CDDP_F32, 1, &half, c->running[0]);
        return cddp_rope(ctx, in[0], freq, c->kernel, c->stride);
    }
    case OP_QKV_PACK: /* through the attention, which reads every packed value */
        return cddp_attention(ctx, cddp_qkv_pack(ctx, in[0], in[1], in[2], c->kernel, c->stride),
                              c->kernel);
    }
    return NULL;
}

/* The op, on its inputs in the blocked layout when the case is blocked (its output back in the
 * row-major one). */
static cddp_tensor *forward(gc_case *c, cddp_tensor **in) {
    if (!c->blocked) return forward_op(c, in);
    cddp_tensor *b[MAX_IN];
    for (int i = 0; i < c->nin; i++) {
        bool blocks = i == 0 || c->op == OP_ADD; /* the activations, not weights */
        b[i] = blocks ? cddp_to_blocked(ctx, in[i]) : in[i];
        if (blocks) assert_int_equal(b[i]->block, cddp_blocked_size());
    }
    cddp_tensor *out = forward_op(c, b);
    assert_int_equal(out->block, c->op == OP_ADAPTIVE_AVG_POOL2D ? 0 : cddp_blocked_size());
    return cddp_to_nchw(ctx, out);
}

/* Builds the case; returns L = sum(out * R) in double. With grads, also back-propagates L and
 * copies each input's gradient into grads[i]. */
static double evaluate(gc_case *c, const float *R, float **grads) {
    cddp_ctx_reset(ctx);
    host_release();
    cddp_tensor *in[MAX_IN];
    for (int i = 0; i < c->nin; i++) {
        in[i] = cddp_from_data(ctx, CDDP_F32, c->ndim[i], c->shape[i], c->data[i]);
        if (grads) cddp_requires_grad(ctx, in[i]);
    }
    cddp_tensor *out = forward(c, in);
    assert_non_null(out);
    double L = 0.0;
    const float *oh = HOST(out);
    for (int64_t k = 0; k < out->numel; k++) L += (double)oh[k] * R[k];
    if (grads) {
        cddp_tensor *r = cddp_from_data(ctx, CDDP_F32, out->ndim, out->shape, (void *)R);
        cddp_tensor *loss = cddp_sum(ctx, cddp_mul(ctx, out, r));
        assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
        for (int i = 0; i < c->nin; i++) {
            int64_t n = numel(c, i);
            if (in[i]->grad)
                memcpy(grads[i], HOST_GRAD(in[i]), sizeof(float) * (size_t)n);
            else
                memset(grads[i], 0, sizeof(float) * (size_t)n);
        }
    }
    return L;
}

static void check_op(int op) {
    int checked = 0, blocked = 0;
    for (int k = 0; k < CASES; k++) {
        gc_case c;
        make_case(&c, op);
        /* R has the output's size, which a grad-free evaluation tells. */
        cddp_ctx_reset(ctx);
        cddp_tensor *probe_in[MAX_IN];
        for (int i = 0; i < c.nin; i++)
            probe_in[i] = cddp_from_data(ctx, CDDP_F32, c.ndim[i], c.shape[i], c.data[i]);
        int64_t out_n = forward(&c, probe_in)->numel;
        float *R = malloc(sizeof(float) * (size_t)out_n);
        for (int64_t j = 0; j < out_n; j++) R[j] = rndf(-1, 1);
        float *grads[MAX_IN];
        for (int i = 0; i < c.nin; i++) grads[i] = malloc(sizeof(float) * (size_t)numel(&c, i));
        evaluate(&c, R, grads);
        for (int i = 0; i < c.nin; i++) {
            int64_t n = numel(&c, i);
            for (int t = 0; t < CHECKED && t < n; t++) {
                int64_t e = n <= CHECKED ? t : rnd(0, n - 1);
                float keep = c.data[i][e];
                c.data[i][e] = keep + H;
                double up = evaluate(&c, R, NULL);
                c.data[i][e] = keep - H;
                double down = evaluate(&c, R, NULL);
                c.data[i][e] = keep;
                double num = (up - down) / (2.0 * H), ana = grads[i][e];
                if (!(fabs(num - ana) <= 2e-3 + 1e-2 * fabs(ana)))
                    fail_msg("%s case %d%s: d/d input%d[%lld] analytic %.6g, numeric %.6g",
                             op_names[op], k, c.blocked ? " (blocked)" : "", i, (long long)e, ana,
                             num);
                checked++;
            }
        }
        blocked += c.blocked;
        for (int i = 0; i < c.nin; i++) {
            free(grads[i]);
            free(c.data[i]);
        }
        free(R);
    }
    assert_true(checked >= CASES); /* every case compared something */
    bool takes_blocked = op == OP_CONV2D || op == OP_BATCH_NORM || op == OP_ADAPTIVE_AVG_POOL2D ||
                         op == OP_ADD || op == OP_RELU || op == OP_SCALE;
    if (takes_blocked && cddp_blocked_size()) assert_true(blocked >= 5 && blocked <= CASES - 5);
}

#define GC_TEST(name, op)                                                                          \
    static void test_grad_##name(void **state) {                                                   \
        (void)state;                                                                               \
        check_op(op);                                                                              \
    }
GC_TEST(matmul, OP_MATMUL)
GC_TEST(linear, OP_LINEAR)
GC_TEST(gelu_tanh_linear, OP_GELU_TANH_LINEAR)
GC_TEST(add, OP_ADD)
GC_TEST(sub, OP_SUB)
GC_TEST(mul, OP_MUL)
GC_TEST(div, OP_DIV)
GC_TEST(scale, OP_SCALE)
GC_TEST(relu, OP_RELU)
GC_TEST(gelu, OP_GELU)
GC_TEST(tanh, OP_TANH)
GC_TEST(sigmoid, OP_SIGMOID)
GC_TEST(softmax, OP_SOFTMAX)
GC_TEST(log_softmax, OP_LOG_SOFTMAX)
GC_TEST(cross_entropy, OP_CROSS_ENTROPY)
GC_TEST(mse_loss, OP_MSE)
GC_TEST(sum, OP_SUM)
GC_TEST(mean, OP_MEAN)
GC_TEST(conv2d, OP_CONV2D)
GC_TEST(max_pool2d, OP_MAX_POOL2D)
GC_TEST(relu_max_pool2d, OP_RELU_MAX_POOL2D)
GC_TEST(avg_pool2d, OP_AVG_POOL2D)
GC_TEST(adaptive_avg_pool2d, OP_ADAPTIVE_AVG_POOL2D)
GC_TEST(dropout, OP_DROPOUT)
GC_TEST(reshape, OP_RESHAPE)
GC_TEST(batch_norm, OP_BATCH_NORM)
GC_TEST(embedding, OP_EMBEDDING)
GC_TEST(layer_norm, OP_LAYER_NORM)
GC_TEST(gelu_tanh, OP_GELU_TANH)
GC_TEST(attention, OP_ATTENTION)
GC_TEST(rms_norm, OP_RMS_NORM)
GC_TEST(silu_mul, OP_SILU_MUL)
GC_TEST(rope, OP_ROPE)
GC_TEST(qkv_pack, OP_QKV_PACK)

static int setup(void **state) {
    (void)state;
    cddp_rng_seed(&rng, 2024);
    ctx = cddp_ctx_create(&(cddp_ctx_options){.device = test_device()});
    return ctx ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cddp_ctx_destroy(ctx);
    host_release();
    return 0;
}

/* The ops whose gradients other tests check, and where. */
static const char *const elsewhere[][2] = {
    {"to_dtype", "test_bf16's test_bf16_to_dtype and the mixed-precision chains"},
    {"to_blocked", "the blocked half of this file's cases (conv2d, batch_norm, ...)"},
    {"to_nchw", "the blocked half of this file's cases"},
    {"to_device", "test_device's test_to_round_trip (values and gradient, bit for bit)"},
    {"conv2d_relu_max_pool2d", "test_ops: the fused op is its three parts, gradients included"},
    {"batch_norm_relu", "test_ops' test_batch_norm_relu_is_the_two_ops"},
    {"batch_norm_add_relu", "test_ops: the fused op is its parts, gradients included"},
    {"qkv_attention", "test_bf16's test_bf16_qkv_attention_fused (against linear + attention)"},
    {"function", "test_recompute: checkpointed segments against the same ops kept, bit for bit"},
};

/* This file's name for the op the list calls `name` (its own spelling where it differs). */
static const char *checked_as(const char *name) {
    return strcmp(name, "mse") == 0 ? "mse_loss" : name;
}

static void test_every_op_is_checked(void **state) {
    (void)state;
#define NAME(NAME_, name_) #name_,
    static const char *const listed[] = {CDDP_OP_LIST(NAME)};
#undef NAME
    int n = (int)(sizeof listed / sizeof *listed), here = 0, other = 0;
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int k = 0; k < OP_COUNT && !found; k++)
            found = strcmp(op_names[k], checked_as(listed[i])) == 0;
        here += found;
        for (size_t k = 0; k < sizeof elsewhere / sizeof *elsewhere && !found; k++)
            if (strcmp(elsewhere[k][0], listed[i]) == 0) found = true, other++;
        if (!found)
            fail_msg("op %s (src/tensor/ops/list.h) has no gradient check: add its cases here, or "
                     "name the test that checks it in `elsewhere`",
                     listed[i]);
    }
    /* and nothing named that the list no longer has */
    for (size_t k = 0; k < sizeof elsewhere / sizeof *elsewhere; k++) {
        bool listed_too = false;
        for (int i = 0; i < n && !listed_too; i++) listed_too = !strcmp(listed[i], elsewhere[k][0]);
        if (!listed_too) fail_msg("`elsewhere` names %s, which is not an op", elsewhere[k][0]);
    }
    assert_int_equal(here + other, n);
    assert_int_equal(here, OP_COUNT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_is_checked),
        cmocka_unit_test(test_grad_matmul),
        cmocka_unit_test(test_grad_linear),
        cmocka_unit_test(test_grad_gelu_tanh_linear),
        cmocka_unit_test(test_grad_add),
        cmocka_unit_test(test_grad_sub),
        cmocka_unit_test(test_grad_mul),
        cmocka_unit_test(test_grad_div),
        cmocka_unit_test(test_grad_scale),
        cmocka_unit_test(test_grad_relu),
        cmocka_unit_test(test_grad_gelu),
        cmocka_unit_test(test_grad_tanh),
        cmocka_unit_test(test_grad_sigmoid),
        cmocka_unit_test(test_grad_softmax),
        cmocka_unit_test(test_grad_log_softmax),
        cmocka_unit_test(test_grad_cross_entropy),
        cmocka_unit_test(test_grad_mse_loss),
        cmocka_unit_test(test_grad_sum),
        cmocka_unit_test(test_grad_mean),
        cmocka_unit_test(test_grad_conv2d),
        cmocka_unit_test(test_grad_max_pool2d),
        cmocka_unit_test(test_grad_relu_max_pool2d),
        cmocka_unit_test(test_grad_avg_pool2d),
        cmocka_unit_test(test_grad_adaptive_avg_pool2d),
        cmocka_unit_test(test_grad_dropout),
        cmocka_unit_test(test_grad_reshape),
        cmocka_unit_test(test_grad_batch_norm),
        cmocka_unit_test(test_grad_embedding),
        cmocka_unit_test(test_grad_layer_norm),
        cmocka_unit_test(test_grad_gelu_tanh),
        cmocka_unit_test(test_grad_attention),
        cmocka_unit_test(test_grad_rms_norm),
        cmocka_unit_test(test_grad_silu_mul),
        cmocka_unit_test(test_grad_rope),
        cmocka_unit_test(test_grad_qkv_pack),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
