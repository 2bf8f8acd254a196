/* backward.c: reverse-mode differentiation over the tape, and gradient-ready hooks.
 *
 * The walk has three passes over the tape, newest node first:
 *  1. mark the nodes the loss depends on (a node is needed when its output feeds a needed node);
 *  2. count, for every parameter, its uses by needed nodes (`pending`);
 *  3. run each needed node's backward, which adds into its inputs' grads; after a node, every
 *     parameter it used loses one pending use, and a parameter reaching zero fires its hook.
 * Because the tape is in execution order, the reverse walk sees a node only after every node that
 * consumed its output, so a gradient is complete when its node runs.
 *
 * Each op's backward, in the switch below, takes dy (the output's gradient) and adds the input
 * gradients; the derivations are in the comments beside each case.
 */
#include "cddp/autograd.h"
#include "tensor/internal.h"

#include <math.h>
#include <string.h>

/* The context whose backward runs on this thread, for cddp_backward_queue_callback. */
static _Thread_local cddp_ctx *current;

int cddp_backward_queue_callback(cddp_backward_callback fn, void *user) {
    if (!current) return CDDP_ESTATE;
    if (current->ncallbacks == (int)(sizeof current->callbacks / sizeof current->callbacks[0]))
        return CDDP_ENOMEM;
    current->callbacks[current->ncallbacks].fn = fn;
    current->callbacks[current->ncallbacks].user = user;
    current->ncallbacks++;
    return CDDP_OK;
}

/* Runs the queued callbacks, all of them even after a failure (each may own waits that must
 * end); the first failure is the backward's. */
static int run_callbacks(cddp_ctx *ctx) {
    int rc = CDDP_OK;
    for (int i = 0; i < ctx->ncallbacks; i++) {
        cddp_error e = {0};
        int st = ctx->callbacks[i].fn(ctx->callbacks[i].user, ctx, &e);
        if (st != CDDP_OK && rc == CDDP_OK) rc = cddp_ctx_fail(ctx, st, "%s", cddp_error_msg(&e));
    }
    ctx->ncallbacks = 0;
    return rc;
}

double cddp_backward_start_time(const cddp_ctx *ctx) {
    return ctx->backward_t0;
}

void cddp_tensor_set_ready_hook(cddp_tensor *t, cddp_ready_hook hook, void *user) {
    t->ready_hook = hook;
    t->ready_user = user;
}

/* d(in) for a broadcast binary op: walks out's elements, adding each term to the right input
 * element, so a stretched dimension sums its contributions. */
static void binary_backward(cddp_ctx *ctx, cddp__node *n, const float *dy) {
    cddp_tensor *a = n->in[0], *b = n->in[1];
    const float *x = a->data, *y = b->data;
    float *da = a->requires_grad ? cddp__ensure_grad(ctx, a) : NULL;
    float *db = b->requires_grad ? cddp__ensure_grad(ctx, b) : NULL;
    if (CDDP__FAILED(ctx)) return;
    cddp__bcast bc;
    cddp__bcast_init(&bc, a, b, n->out);
    switch (n->op) {
    case CDDP_OP_ADD: /* z = x + y: dx = dz, dy = dz */
        CDDP__BCAST_FOR(&bc, i, ia, ib, {
            if (da) da[ia] += dy[i];
            if (db) db[ib] += dy[i];
        });
        break;
    case CDDP_OP_SUB: /* z = x - y: dx = dz, dy = -dz */
        CDDP__BCAST_FOR(&bc, i, ia, ib, {
            if (da) da[ia] += dy[i];
            if (db) db[ib] -= dy[i];
        });
        break;
    case CDDP_OP_MUL: /* z = x * y: dx = dz * y, dy = dz * x */
        CDDP__BCAST_FOR(&bc, i, ia, ib, {
            if (da) da[ia] += dy[i] * y[ib];
            if (db) db[ib] += dy[i] * x[ia];
        });
        break;
    case CDDP_OP_DIV: /* z = x / y: dx = dz / y, dy = -dz * x / y^2 */
        CDDP__BCAST_FOR(&bc, i, ia, ib, {
            if (da) da[ia] += dy[i] / y[ib];
            if (db) db[ib] -= dy[i] * x[ia] / (y[ib] * y[ib]);
        });
        break;
    default:
        CDDP_PANIC("binary_backward: op %d", (int)n->op);
    }
}

/* The two hottest elementwise backwards of an MLP, on buffers that never overlap (a gradient
 * and a node's output or its gradient), written so that they vectorise without branches. */
static void add_into(float *restrict acc, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

static void relu_backward(float *restrict dx, const float *restrict y, const float *restrict dy,
                          int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = dy[i]; /* loaded unconditionally, so the choice is a select */
        dx[i] += y[i] > 0.0f ? g : 0.0f;
    }
}

static void node_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *out = n->out, *x = n->in[0];
    const float *dy = out->grad;
    const float *y = out->data;
    float *dx = NULL;
    /* Unary ops and reductions: the one input's gradient, when it wants one. */
    if (n->op != CDDP_OP_MATMUL && n->op != CDDP_OP_LINEAR && n->op != CDDP_OP_CONV2D &&
        n->op != CDDP_OP_ADD && n->op != CDDP_OP_SUB && n->op != CDDP_OP_MUL &&
        n->op != CDDP_OP_DIV && n->op != CDDP_OP_MSE && x->requires_grad) {
        dx = cddp__ensure_grad(ctx, x);
        if (!dx) return;
    }
    int64_t numel = x->numel;
    const float *a = x->data;
    switch (n->op) {
    case CDDP_OP_RESHAPE: /* a view: the same elements in the same order */
        if (dx) add_into(dx, dy, numel);
        break;
    case CDDP_OP_MATMUL: {
        /* C = op(A) op(B): dop(A) = dC op(B)^T and dop(B) = op(A)^T dC. For a stored transpose
         * the gradient of the stored matrix is the transpose of those, which swaps the roles of
         * the factors; each call below writes the stored layout directly, accumulating. */
        cddp_tensor *A = n->in[0], *B = n->in[1];
        bool ta = n->arg.mm.ta, tb = n->arg.mm.tb;
        int64_t M = out->shape[0], N = out->shape[1];
        int64_t K = ta ? A->shape[0] : A->shape[1];
        if (A->requires_grad) {
            float *dA = cddp__ensure_grad(ctx, A);
            if (!dA) return;
            if (!ta) /* dA (M,K) = dC (M,N) . op(B)^T */
                cddp__gemm(false, !tb, M, K, N, 1.0f, dy, B->data, 1.0f, dA);
            else /* dA (K,M) = op(B) (K,N) . dC^T */
                cddp__gemm(tb, true, K, M, N, 1.0f, B->data, dy, 1.0f, dA);
        }
        if (B->requires_grad) {
            float *dB = cddp__ensure_grad(ctx, B);
            if (!dB) return;
            if (!tb) /* dB (K,N) = op(A)^T (K,M) . dC */
                cddp__gemm(!ta, false, K, N, M, 1.0f, A->data, dy, 1.0f, dB);
            else /* dB (N,K) = dC^T (N,M) . op(A) */
                cddp__gemm(true, ta, N, K, M, 1.0f, dy, A->data, 1.0f, dB);
        }
        break;
    }
    case CDDP_OP_LINEAR: {
        /* y = x W^T + b: dx = dy W, dW = dy^T x, db = column sums of dy. */
        cddp_tensor *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
        int64_t N = x->shape[0], in = x->shape[1], outf = W->shape[0];
        if (x->requires_grad) {
            float *gx = cddp__ensure_grad(ctx, x);
            if (!gx) return;
            cddp__gemm(false, false, N, in, outf, 1.0f, dy, W->data, 1.0f, gx);
        }
        if (W->requires_grad) {
            float *gw = cddp__ensure_grad(ctx, W);
            if (!gw) return;
            cddp__gemm(true, false, outf, in, N, 1.0f, dy, x->data, 1.0f, gw);
        }
        if (b && b->requires_grad) {
            float *gb = cddp__ensure_grad(ctx, b);
            if (!gb) return;
            for (int64_t i = 0; i < N; i++) add_into(gb, dy + i * outf, outf);
        }
        break;
    }
    case CDDP_OP_ADD:
    case CDDP_OP_SUB:
    case CDDP_OP_MUL:
    case CDDP_OP_DIV:
        binary_backward(ctx, n, dy);
        break;
    case CDDP_OP_SCALE: /* y = s x: dx = s dy */
        if (dx)
            for (int64_t i = 0; i < numel; i++) dx[i] += n->arg.scalar * dy[i];
        break;
    case CDDP_OP_RELU: /* dx = dy where the output is positive (0 at the kink, as PyTorch) */
        if (dx) relu_backward(dx, y, dy, numel);
        break;
    case CDDP_OP_GELU: /* y = x Phi(x): dy/dx = Phi(x) + x phi(x) */
        if (dx)
            for (int64_t i = 0; i < numel; i++) {
                float cdf = 0.5f * (1.0f + erff(a[i] * (float)M_SQRT1_2));
                float pdf = expf(-0.5f * a[i] * a[i]) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
                dx[i] += dy[i] * (cdf + a[i] * pdf);
            }
        break;
    case CDDP_OP_TANH: /* dy/dx = 1 - y^2 */
        if (dx)
            for (int64_t i = 0; i < numel; i++) dx[i] += dy[i] * (1.0f - y[i] * y[i]);
        break;
    case CDDP_OP_SIGMOID: /* dy/dx = y (1 - y) */
        if (dx)
            for (int64_t i = 0; i < numel; i++) dx[i] += dy[i] * y[i] * (1.0f - y[i]);
        break;
    case CDDP_OP_SOFTMAX:
    case CDDP_OP_LOG_SOFTMAX: {
        /* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy), per row. */
        if (!dx) break;
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
        break;
    }
    case CDDP_OP_CROSS_ENTROPY: {
        /* loss = -sum_i logp[i, y_i] (/ N): dlogits[i, j] = (p[i, j] - [j = y_i]) g (/ N). */
        if (!dx) break;
        const float *logp = n->saved;
        int64_t N = x->shape[0], C = x->shape[1];
        float g = dy[0] / (n->arg.reduction == CDDP_REDUCE_MEAN ? (float)N : 1.0f);
        for (int64_t i = 0; i < N; i++) {
            int64_t label = cddp__label(n->in[1], i);
            for (int64_t j = 0; j < C; j++)
                dx[i * C + j] += g * (expf(logp[i * C + j]) - (j == label ? 1.0f : 0.0f));
        }
        break;
    }
    case CDDP_OP_MSE: {
        /* loss = sum (p - t)^2 (/ n): dp = 2 (p - t) g (/ n), dt = -dp. */
        cddp_tensor *p = n->in[0], *t = n->in[1];
        float *dp = p->requires_grad ? cddp__ensure_grad(ctx, p) : NULL;
        float *dt = t->requires_grad ? cddp__ensure_grad(ctx, t) : NULL;
        if (CDDP__FAILED(ctx)) return;
        float g = 2.0f * dy[0];
        if (n->arg.reduction == CDDP_REDUCE_MEAN) g /= (float)p->numel;
        for (int64_t i = 0; i < p->numel; i++) {
            float d = g * (cddp_f32(p)[i] - cddp_f32(t)[i]);
            if (dp) dp[i] += d;
            if (dt) dt[i] -= d;
        }
        break;
    }
    case CDDP_OP_SUM:
    case CDDP_OP_MEAN: {
        /* sum: dx = g everywhere; mean: g / n. */
        if (!dx) break;
        float g = dy[0] / (n->op == CDDP_OP_MEAN ? (float)numel : 1.0f);
        for (int64_t i = 0; i < numel; i++) dx[i] += g;
        break;
    }
    case CDDP_OP_CONV2D: {
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
        float *gw = W->requires_grad ? cddp__ensure_grad(ctx, W) : NULL;
        float *gb = b && b->requires_grad ? cddp__ensure_grad(ctx, b) : NULL;
        float *gx = x->requires_grad ? cddp__ensure_grad(ctx, x) : NULL;
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
        break;
    }
    case CDDP_OP_BATCH_NORM: {
        /* With xh = (x - mean) inv and y = g xh + b, per channel over its M values:
         * db = sum dy, dg = sum dy xh; in training (mean and inv depend on x)
         * dx = g inv (dy - sum(dy) / M - xh sum(dy xh) / M), in evaluation dx = g inv dy. */
        cddp_tensor *g = n->in[1], *b = n->in[2];
        int64_t N = x->shape[0], C = x->shape[1];
        int64_t plane = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1, M = N * plane;
        const float *stats = n->saved, *xd = cddp_f32(x);
        float *gg = g && g->requires_grad ? cddp__ensure_grad(ctx, g) : NULL;
        float *gb = b && b->requires_grad ? cddp__ensure_grad(ctx, b) : NULL;
        if (CDDP__FAILED(ctx)) return;
        for (int64_t c = 0; c < C; c++) {
            float m = stats[c], inv = stats[C + c], gc = g ? cddp_f32(g)[c] : 1.0f;
            double sdy = 0.0, sdyxh = 0.0;
            for (int64_t s = 0; s < N; s++) {
                const float *p = xd + (s * C + c) * plane, *d = dy + (s * C + c) * plane;
                for (int64_t i = 0; i < plane; i++) {
                    sdy += d[i];
                    sdyxh += d[i] * (p[i] - m) * inv;
                }
            }
            if (gb) gb[c] += (float)sdy;
            if (gg) gg[c] += (float)sdyxh;
            if (!dx) continue;
            float k = gc * inv, mdy = n->arg.training ? (float)(sdy / (double)M) : 0.0f;
            float mdyxh = n->arg.training ? (float)(sdyxh / (double)M) : 0.0f;
            for (int64_t s = 0; s < N; s++) {
                const float *p = xd + (s * C + c) * plane, *d = dy + (s * C + c) * plane;
                float *q = dx + (s * C + c) * plane;
                for (int64_t i = 0; i < plane; i++)
                    q[i] += k * (d[i] - mdy - (p[i] - m) * inv * mdyxh);
            }
        }
        break;
    }
    case CDDP_OP_MAX_POOL2D: {
        /* Each window's gradient goes to the element that was its maximum. */
        if (!dx) break;
        const int32_t *arg = n->saved;
        int64_t plane_in = x->shape[2] * x->shape[3];
        int64_t plane_out = out->shape[2] * out->shape[3];
        for (int64_t nc = 0; nc < x->shape[0] * x->shape[1]; nc++)
            for (int64_t p = 0; p < plane_out; p++)
                dx[nc * plane_in + arg[nc * plane_out + p]] += dy[nc * plane_out + p];
        break;
    }
    case CDDP_OP_DROPOUT: /* y = x mask: dx = dy mask */
        if (dx)
            for (int64_t i = 0; i < numel; i++) dx[i] += dy[i] * ((const float *)n->saved)[i];
        break;
    }
}

/* Drops one pending use of each parameter input of n, firing hooks that reach zero. */
static void release_inputs(cddp__node *n) {
    for (int i = 0; i < n->nin; i++) {
        cddp_tensor *p = n->in[i];
        if (!p || !p->is_param || !p->requires_grad) continue;
        if (--p->pending == 0 && p->ready_hook) p->ready_hook(p->ready_user, p);
    }
}

int cddp_backward(cddp_ctx *ctx, cddp_tensor *loss) {
    if (ctx->err.code != CDDP_OK) return ctx->err.code;
    if (!loss) return cddp_ctx_fail(ctx, CDDP_EINVAL, "backward: the loss is NULL");
    if (loss->numel != 1 || loss->dtype != CDDP_F32)
        return cddp_ctx_fail(ctx, CDDP_EINVAL,
                             "backward: the loss must be one float32 element, it has %lld of %s",
                             (long long)loss->numel, cddp_dtype_name(loss->dtype));
    if (!loss->requires_grad || !loss->node)
        return cddp_ctx_fail(ctx, CDDP_ESTATE,
                             "backward: the loss does not depend on any parameter; was it "
                             "computed with gradients disabled?");
    if (ctx->backward_done)
        return cddp_ctx_fail(ctx, CDDP_ESTATE,
                             "backward already ran on this step's tape; call cddp_ctx_reset "
                             "before the next forward");
    ctx->backward_done = true;
    ctx->backward_t0 = cddp_now_s();
    ctx->ncallbacks = 0;

    /* Pass 1 and 2: mark needed nodes and count parameter uses. */
    for (cddp__node *n = ctx->tape; n; n = n->prev) {
        n->needed = false;
        for (int i = 0; i < n->nin; i++)
            if (n->in[i]) n->in[i]->pending = 0;
    }
    loss->node->needed = true;
    for (cddp__node *n = ctx->tape; n; n = n->prev) {
        if (!n->needed) continue;
        for (int i = 0; i < n->nin; i++) {
            cddp_tensor *t = n->in[i];
            if (!t) continue;
            if (t->node) t->node->needed = true;
            if (t->is_param && t->requires_grad) t->pending++;
        }
    }

    /* Pass 3: seed d(loss) = 1 and run the needed nodes in reverse. */
    float *seed = cddp__ensure_grad(ctx, loss);
    if (!seed) return ctx->err.code;
    seed[0] += 1.0f;
    current = ctx;
    for (cddp__node *n = ctx->tape; n; n = n->prev) {
        if (!n->needed) continue;
        if (n->out->grad) node_backward(ctx, n);
        if (ctx->err.code != CDDP_OK) break;
        release_inputs(n);
    }
    current = NULL;
    int rc = run_callbacks(ctx);
    return ctx->err.code != CDDP_OK ? ctx->err.code : rc;
}
