/* ops.c: the forward half of every differentiable op, and tape recording.
 *
 * Each op checks shapes (a mismatch is a programmer error and aborts naming both shapes),
 * allocates its output in the arena, computes, and records a node when gradients flow through it.
 * What an op saves for backward is chosen so that backward needs no recomputation: softmax-like
 * ops keep their output, cross-entropy its probabilities, conv2d its im2col columns, pooling the
 * index of each window's maximum, dropout its mask, batch_norm each channel's mean and 1/std.
 */
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SHAPE(t) cddp_shape_str((t)->ndim, (t)->shape, (char[64]){0}, 64)

static void need_f32(const char *op, const cddp_tensor *t) {
    CDDP_CHECK(t->dtype == CDDP_F32, "%s needs float32 input, got %s", op,
               cddp_dtype_name(t->dtype));
}

static bool any_requires_grad(int n, cddp_tensor *const *in) {
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad) return true;
    return false;
}

static bool will_record(const cddp_ctx *ctx, int n, cddp_tensor *const *in) {
    return ctx->grad_enabled && any_requires_grad(n, in);
}

cddp__node *cddp__record(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
                         cddp_tensor *const *in) {
    if (!will_record(ctx, nin, in)) return NULL;
    cddp__node *n = cddp__ctx_alloc(ctx, sizeof *n);
    if (!n) return NULL;
    memset(n, 0, sizeof *n);
    n->op = op;
    n->nin = nin;
    n->out = out;
    for (int i = 0; i < nin; i++) n->in[i] = in[i];
    n->prev = ctx->tape;
    ctx->tape = n;
    out->node = n;
    out->requires_grad = true;
    return n;
}

/* Records and reports whether the op may return out (false: an allocation failed). */
static bool record(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin, cddp_tensor *const *in,
                   cddp__node **node) {
    cddp__node *n = cddp__record(ctx, op, out, nin, in);
    if (node) *node = n;
    return n || ctx->err.code == CDDP_OK;
}

#define FAILED(ctx) CDDP__FAILED(ctx)

cddp_tensor *cddp_matmul(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b, bool ta, bool tb) {
    if (FAILED(ctx) || !a || !b) return NULL;
    need_f32("matmul", a);
    need_f32("matmul", b);
    CDDP_CHECK(a->ndim == 2 && b->ndim == 2, "matmul needs 2-D tensors, got %s and %s", SHAPE(a),
               SHAPE(b));
    int64_t M = ta ? a->shape[1] : a->shape[0], K = ta ? a->shape[0] : a->shape[1];
    int64_t Kb = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    CDDP_CHECK(K == Kb, "matmul: inner sizes differ: %s%s x %s%s", SHAPE(a), ta ? "^T" : "",
               SHAPE(b), tb ? "^T" : "");
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 2, (int64_t[]){M, N});
    if (!out) return NULL;
    cddp__gemm(ta, tb, M, N, K, 1.0f, a->data, b->data, 0.0f, out->data);
    cddp__node *n;
    if (!record(ctx, CDDP_OP_MATMUL, out, 2, (cddp_tensor *[]){a, b}, &n)) return NULL;
    if (n) {
        n->arg.mm.ta = ta;
        n->arg.mm.tb = tb;
    }
    return out;
}

cddp_tensor *cddp_linear(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b) {
    if (FAILED(ctx) || !x || !w) return NULL;
    need_f32("linear", x);
    need_f32("linear", w);
    CDDP_CHECK(x->ndim == 2 && w->ndim == 2 && x->shape[1] == w->shape[1],
               "linear: input %s does not fit weight %s (want (N,in) and (out,in))", SHAPE(x),
               SHAPE(w));
    int64_t N = x->shape[0], in = x->shape[1], outf = w->shape[0];
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == outf, "linear: bias %s for weight %s", SHAPE(b),
                   SHAPE(w));
    cddp_tensor *y = cddp_empty(ctx, CDDP_F32, 2, (int64_t[]){N, outf});
    if (!y) return NULL;
    float *yd = y->data;
    if (b)
        for (int64_t i = 0; i < N; i++) memcpy(yd + i * outf, b->data, (size_t)outf * 4);
    cddp__gemm(false, true, N, outf, in, 1.0f, x->data, w->data, b ? 1.0f : 0.0f, yd);
    if (!record(ctx, CDDP_OP_LINEAR, y, b ? 3 : 2, (cddp_tensor *[]){x, w, b}, NULL)) return NULL;
    return y;
}

static cddp_tensor *binary(cddp_ctx *ctx, cddp__op op, cddp_tensor *a, cddp_tensor *b) {
    if (FAILED(ctx) || !a || !b) return NULL;
    need_f32("elementwise op", a);
    need_f32("elementwise op", b);
    int nd = CDDP_MAX(a->ndim, b->ndim);
    int64_t shape[CDDP_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        int ia = d - (nd - a->ndim), ib = d - (nd - b->ndim);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        CDDP_CHECK(sa == sb || sa == 1 || sb == 1, "cannot broadcast %s with %s", SHAPE(a),
                   SHAPE(b));
        shape[d] = sa == 1 ? sb : sa;
    }
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, nd, shape);
    if (!out) return NULL;
    const float *x = a->data, *y = b->data;
    float *z = out->data;
    cddp__bcast bc;
    cddp__bcast_init(&bc, a, b, out);
    switch (op) {
    case CDDP_OP_ADD:
        if (bc.same)
            for (int64_t i = 0; i < out->numel; i++) z[i] = x[i] + y[i];
        else
            CDDP__BCAST_FOR(&bc, i, ia, ib, z[i] = x[ia] + y[ib]);
        break;
    case CDDP_OP_SUB:
        if (bc.same)
            for (int64_t i = 0; i < out->numel; i++) z[i] = x[i] - y[i];
        else
            CDDP__BCAST_FOR(&bc, i, ia, ib, z[i] = x[ia] - y[ib]);
        break;
    case CDDP_OP_MUL:
        if (bc.same)
            for (int64_t i = 0; i < out->numel; i++) z[i] = x[i] * y[i];
        else
            CDDP__BCAST_FOR(&bc, i, ia, ib, z[i] = x[ia] * y[ib]);
        break;
    case CDDP_OP_DIV:
        if (bc.same)
            for (int64_t i = 0; i < out->numel; i++) z[i] = x[i] / y[i];
        else
            CDDP__BCAST_FOR(&bc, i, ia, ib, z[i] = x[ia] / y[ib]);
        break;
    default:
        CDDP_PANIC("binary: op %d is not elementwise", (int)op);
    }
    if (!record(ctx, op, out, 2, (cddp_tensor *[]){a, b}, NULL)) return NULL;
    return out;
}

cddp_tensor *cddp_add(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b) {
    return binary(ctx, CDDP_OP_ADD, a, b);
}
cddp_tensor *cddp_sub(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b) {
    return binary(ctx, CDDP_OP_SUB, a, b);
}
cddp_tensor *cddp_mul(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b) {
    return binary(ctx, CDDP_OP_MUL, a, b);
}
cddp_tensor *cddp_div(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b) {
    return binary(ctx, CDDP_OP_DIV, a, b);
}

static cddp_tensor *unary(cddp_ctx *ctx, cddp__op op, cddp_tensor *x, float s) {
    if (FAILED(ctx) || !x) return NULL;
    need_f32("elementwise op", x);
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    const float *a = x->data;
    float *y = out->data;
    int64_t n = x->numel;
    switch (op) {
    case CDDP_OP_SCALE:
        for (int64_t i = 0; i < n; i++) y[i] = s * a[i];
        break;
    case CDDP_OP_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = a[i] > 0.0f ? a[i] : 0.0f;
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
    cddp__node *node;
    if (!record(ctx, op, out, 1, &x, &node)) return NULL;
    if (node) node->arg.scalar = s;
    return out;
}

cddp_tensor *cddp_scale(cddp_ctx *ctx, cddp_tensor *x, float s) {
    return unary(ctx, CDDP_OP_SCALE, x, s);
}
cddp_tensor *cddp_relu(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_RELU, x, 0);
}
cddp_tensor *cddp_gelu(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_GELU, x, 0);
}
cddp_tensor *cddp_tanh(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_TANH, x, 0);
}
cddp_tensor *cddp_sigmoid(cddp_ctx *ctx, cddp_tensor *x) {
    return unary(ctx, CDDP_OP_SIGMOID, x, 0);
}

/* Writes log_softmax (take_log)  or softmax of each row of length C. */
static void softmax_rows(const float *x, float *y, int64_t rows, int64_t C, bool take_log) {
    for (int64_t r = 0; r < rows; r++) {
        const float *a = x + r * C;
        float *b = y + r * C;
        float m = -INFINITY;
        for (int64_t j = 0; j < C; j++) m = a[j] > m ? a[j] : m;
        double sum = 0.0;
        for (int64_t j = 0; j < C; j++) sum += exp((double)(a[j] - m));
        if (take_log) {
            /* (a - m) is exact for nearby values; subtracting m + log(sum) at once would round
             * at the magnitude of m. */
            float ls = (float)log(sum);
            for (int64_t j = 0; j < C; j++) b[j] = (a[j] - m) - ls;
        } else {
            for (int64_t j = 0; j < C; j++) b[j] = (float)(exp((double)(a[j] - m)) / sum);
        }
    }
}

static cddp_tensor *softmax_op(cddp_ctx *ctx, cddp_tensor *x, bool take_log) {
    if (FAILED(ctx) || !x) return NULL;
    need_f32(take_log ? "log_softmax" : "softmax", x);
    CDDP_CHECK(x->ndim >= 1, "softmax needs at least one dimension");
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    int64_t C = x->shape[x->ndim - 1];
    softmax_rows(x->data, out->data, C ? x->numel / C : 0, C, take_log);
    if (!record(ctx, take_log ? CDDP_OP_LOG_SOFTMAX : CDDP_OP_SOFTMAX, out, 1, &x, NULL))
        return NULL;
    return out;
}

cddp_tensor *cddp_softmax(cddp_ctx *ctx, cddp_tensor *x) {
    return softmax_op(ctx, x, false);
}
cddp_tensor *cddp_log_softmax(cddp_ctx *ctx, cddp_tensor *x) {
    return softmax_op(ctx, x, true);
}

static cddp_tensor *scalar(cddp_ctx *ctx, float v) {
    cddp_tensor *t = cddp_empty(ctx, CDDP_F32, 0, NULL);
    if (t) cddp_f32(t)[0] = v;
    return t;
}

cddp_tensor *cddp_cross_entropy(cddp_ctx *ctx, cddp_tensor *logits, cddp_tensor *labels,
                                cddp_reduction reduction) {
    if (FAILED(ctx) || !logits || !labels) return NULL;
    need_f32("cross_entropy", logits);
    CDDP_CHECK(labels->dtype == CDDP_I32 || labels->dtype == CDDP_I64,
               "cross_entropy labels must be int32 or int64, got %s",
               cddp_dtype_name(labels->dtype));
    CDDP_CHECK(logits->ndim == 2 && labels->ndim == 1 && labels->shape[0] == logits->shape[0],
               "cross_entropy: logits %s and labels %s (want (N,C) and (N))", SHAPE(logits),
               SHAPE(labels));
    int64_t N = logits->shape[0], C = logits->shape[1];
    for (int64_t i = 0; i < N; i++) {
        int64_t y = cddp__label(labels, i);
        if (y < 0 || y >= C) {
            cddp_ctx_fail(ctx, CDDP_ERANGE,
                          "cross_entropy: label %lld of sample %lld is out of range for %lld "
                          "classes (labels must be in [0, %lld])",
                          (long long)y, (long long)i, (long long)C, (long long)(C - 1));
            return NULL;
        }
    }
    /* The log-probabilities are kept: backward needs softmax = exp(logp). */
    float *logp = cddp__ctx_alloc(ctx, (size_t)(N * C) * sizeof(float));
    if (!logp) return NULL;
    softmax_rows(logits->data, logp, N, C, true);
    double loss = 0.0;
    for (int64_t i = 0; i < N; i++) loss -= logp[i * C + cddp__label(labels, i)];
    if (reduction == CDDP_REDUCE_MEAN) loss /= (double)N;
    cddp_tensor *out = scalar(ctx, (float)loss);
    if (!out) return NULL;
    cddp__node *n;
    if (!record(ctx, CDDP_OP_CROSS_ENTROPY, out, 2, (cddp_tensor *[]){logits, labels}, &n))
        return NULL;
    if (n) {
        n->arg.reduction = reduction;
        n->saved = logp;
    }
    return out;
}

cddp_tensor *cddp_mse_loss(cddp_ctx *ctx, cddp_tensor *pred, cddp_tensor *target,
                           cddp_reduction reduction) {
    if (FAILED(ctx) || !pred || !target) return NULL;
    need_f32("mse_loss", pred);
    need_f32("mse_loss", target);
    CDDP_CHECK(pred->numel == target->numel && pred->ndim == target->ndim &&
                   memcmp(pred->shape, target->shape, sizeof(int64_t) * (size_t)pred->ndim) == 0,
               "mse_loss: prediction %s and target %s differ in shape", SHAPE(pred), SHAPE(target));
    const float *p = pred->data, *t = target->data;
    double s = 0.0;
    for (int64_t i = 0; i < pred->numel; i++) s += (double)(p[i] - t[i]) * (double)(p[i] - t[i]);
    if (reduction == CDDP_REDUCE_MEAN) s /= (double)pred->numel;
    cddp_tensor *out = scalar(ctx, (float)s);
    if (!out) return NULL;
    cddp__node *n;
    if (!record(ctx, CDDP_OP_MSE, out, 2, (cddp_tensor *[]){pred, target}, &n)) return NULL;
    if (n) n->arg.reduction = reduction;
    return out;
}

static cddp_tensor *reduce_all(cddp_ctx *ctx, cddp_tensor *x, cddp__op op) {
    if (FAILED(ctx) || !x) return NULL;
    need_f32(op == CDDP_OP_SUM ? "sum" : "mean", x);
    double s = 0.0;
    for (int64_t i = 0; i < x->numel; i++) s += cddp_f32(x)[i];
    if (op == CDDP_OP_MEAN) s /= (double)x->numel;
    cddp_tensor *out = scalar(ctx, (float)s);
    if (!out || !record(ctx, op, out, 1, &x, NULL)) return NULL;
    return out;
}

cddp_tensor *cddp_sum(cddp_ctx *ctx, cddp_tensor *x) {
    return reduce_all(ctx, x, CDDP_OP_SUM);
}
cddp_tensor *cddp_mean(cddp_ctx *ctx, cddp_tensor *x) {
    return reduce_all(ctx, x, CDDP_OP_MEAN);
}

cddp_tensor *cddp_conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b, int stride,
                         int padding) {
    if (FAILED(ctx) || !x || !w) return NULL;
    need_f32("conv2d", x);
    need_f32("conv2d", w);
    CDDP_CHECK(x->ndim == 4 && w->ndim == 4 && x->shape[1] == w->shape[1],
               "conv2d: input %s does not fit weight %s (want (N,C,H,W) and (O,C,KH,KW))", SHAPE(x),
               SHAPE(w));
    CDDP_CHECK(stride >= 1 && padding >= 0, "conv2d: stride %d, padding %d", stride, padding);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], KH = w->shape[2], KW = w->shape[3];
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == O, "conv2d: bias %s for weight %s", SHAPE(b),
                   SHAPE(w));
    CDDP_CHECK(H + 2 * padding >= KH && W + 2 * padding >= KW,
               "conv2d: kernel %s is larger than the padded input %s", SHAPE(w), SHAPE(x));
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
    if (!record(ctx, CDDP_OP_CONV2D, out, b ? 3 : 2, in, &node)) return NULL;
    if (node) {
        node->arg.conv.stride = stride;
        node->arg.conv.padding = padding;
        node->saved = cols;
    }
    return out;
}

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
    if (FAILED(ctx) || !x) return NULL;
    need_f32("max_pool2d", x);
    CDDP_CHECK(x->ndim == 4, "max_pool2d needs (N,C,H,W), got %s", SHAPE(x));
    if (stride <= 0) stride = kernel;
    CDDP_CHECK(kernel >= 1 && padding >= 0 && padding <= kernel / 2,
               "max_pool2d: kernel %d, padding %d (padding must be at most half the kernel)",
               kernel, padding);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    CDDP_CHECK(H + 2 * padding >= kernel && W + 2 * padding >= kernel,
               "max_pool2d: kernel %d is larger than the padded input %s", kernel, SHAPE(x));
    int64_t OH = (H + 2 * padding - kernel) / stride + 1;
    int64_t OW = (W + 2 * padding - kernel) / stride + 1;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){N, C, OH, OW});
    if (!out) return NULL;
    bool rec = will_record(ctx, 1, &x);
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
    if (!record(ctx, CDDP_OP_MAX_POOL2D, out, 1, &x, &node)) return NULL;
    if (node) {
        node->arg.pool.kernel = kernel;
        node->arg.pool.stride = stride;
        node->arg.pool.padding = padding;
        node->saved = arg;
    }
    return out;
}

cddp_tensor *cddp_dropout(cddp_ctx *ctx, cddp_tensor *x, float p, bool training) {
    if (FAILED(ctx) || !x) return NULL;
    need_f32("dropout", x);
    CDDP_CHECK(p >= 0.0f && p <= 1.0f, "dropout probability %g is not in [0, 1]", (double)p);
    if (!training || p == 0.0f) return x;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *mask = cddp__ctx_alloc(ctx, (size_t)x->numel * sizeof(float));
    if (!out || !mask) return NULL;
    float keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (int64_t i = 0; i < x->numel; i++) {
        mask[i] = cddp_rng_uniform(&ctx->rng) < p ? 0.0f : keep;
        cddp_f32(out)[i] = cddp_f32(x)[i] * mask[i];
    }
    cddp__node *node;
    if (!record(ctx, CDDP_OP_DROPOUT, out, 1, &x, &node)) return NULL;
    if (node) node->saved = mask;
    return out;
}

static int64_t row_argmax(const float *a, int64_t C) {
    int64_t best = 0;
    for (int64_t j = 1; j < C; j++)
        if (a[j] > a[best]) best = j;
    return best;
}

cddp_tensor *cddp_argmax(cddp_ctx *ctx, cddp_tensor *x) {
    if (FAILED(ctx) || !x) return NULL;
    need_f32("argmax", x);
    CDDP_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] > 0, "argmax of an empty last dimension");
    int64_t C = x->shape[x->ndim - 1];
    cddp_tensor *out = cddp_empty(ctx, CDDP_I64, x->ndim - 1, x->shape);
    if (!out) return NULL;
    for (int64_t r = 0; r < out->numel; r++)
        ((int64_t *)out->data)[r] = row_argmax(cddp_f32(x) + r * C, C);
    return out;
}

int64_t cddp_count_correct(const cddp_tensor *logits, const cddp_tensor *labels) {
    need_f32("count_correct", logits);
    CDDP_CHECK(logits->ndim == 2 && labels->ndim == 1 && labels->shape[0] == logits->shape[0] &&
                   (labels->dtype == CDDP_I32 || labels->dtype == CDDP_I64),
               "count_correct: logits %s and labels %s (want (N,C) float32 and (N) integers)",
               SHAPE(logits), SHAPE(labels));
    int64_t N = logits->shape[0], C = logits->shape[1], correct = 0;
    for (int64_t i = 0; i < N && C > 0; i++)
        correct += row_argmax(cddp_f32(logits) + i * C, C) == cddp__label(labels, i);
    return correct;
}

double cddp_accuracy(const cddp_tensor *logits, const cddp_tensor *labels) {
    int64_t n = logits->ndim >= 1 ? logits->shape[0] : 0;
    return n ? (double)cddp_count_correct(logits, labels) / (double)n : 0.0;
}

cddp_tensor *cddp_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, cddp_tensor *bias,
                             cddp_tensor *running_mean, cddp_tensor *running_var, bool training,
                             float momentum, float eps) {
    if (FAILED(ctx) || !x) return NULL;
    need_f32("batch_norm", x);
    CDDP_CHECK((x->ndim == 2 || x->ndim == 4) && x->shape[0] > 0,
               "batch_norm needs (N,C) or (N,C,H,W) with N > 0, got %s", SHAPE(x));
    int64_t N = x->shape[0], C = x->shape[1], plane = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1;
    int64_t M = N * plane;
    cddp_tensor *per_c[4] = {weight, bias, running_mean, running_var};
    for (int i = 0; i < 4; i++)
        if (per_c[i])
            CDDP_CHECK(per_c[i]->dtype == CDDP_F32 && per_c[i]->numel == C,
                       "batch_norm: %s %s does not fit %lld channels",
                       (const char *[]){"weight", "bias", "running_mean", "running_var"}[i],
                       SHAPE(per_c[i]), (long long)C);
    CDDP_CHECK(training || (running_mean && running_var),
               "batch_norm in evaluation needs the running statistics");
    CDDP_CHECK(!training || M > 1,
               "batch_norm in training needs more than one value per "
               "channel, got %s",
               SHAPE(x));
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *stats = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(float)); /* mean, 1/std */
    if (!out || !stats) return NULL;
    const float *xd = cddp_f32(x);
    float *y = cddp_f32(out);
    for (int64_t c = 0; c < C; c++) {
        double mean, var;
        if (training) {
            double s = 0.0, ss = 0.0;
            for (int64_t n = 0; n < N; n++) {
                const float *p = xd + (n * C + c) * plane;
                for (int64_t i = 0; i < plane; i++) s += p[i];
            }
            mean = s / (double)M;
            for (int64_t n = 0; n < N; n++) {
                const float *p = xd + (n * C + c) * plane;
                for (int64_t i = 0; i < plane; i++) ss += (p[i] - mean) * (p[i] - mean);
            }
            var = ss / (double)M;
            if (running_mean)
                cddp_f32(running_mean)[c] =
                    (1.0f - momentum) * cddp_f32(running_mean)[c] + momentum * (float)mean;
            if (running_var)
                cddp_f32(running_var)[c] = (1.0f - momentum) * cddp_f32(running_var)[c] +
                                           momentum * (float)(ss / (double)(M - 1));
        } else {
            mean = cddp_f32(running_mean)[c];
            var = cddp_f32(running_var)[c];
        }
        float m = (float)mean, inv = (float)(1.0 / sqrt(var + (double)eps));
        stats[c] = m;
        stats[C + c] = inv;
        float g = weight ? cddp_f32(weight)[c] : 1.0f, b = bias ? cddp_f32(bias)[c] : 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float *p = xd + (n * C + c) * plane;
            float *q = y + (n * C + c) * plane;
            for (int64_t i = 0; i < plane; i++) q[i] = (p[i] - m) * inv * g + b;
        }
    }
    cddp_tensor *in[3] = {x, weight, bias};
    cddp__node *node;
    if (!record(ctx, CDDP_OP_BATCH_NORM, out, 3, in, &node)) return NULL;
    if (node) {
        node->arg.training = training;
        node->saved = stats;
    }
    return out;
}
