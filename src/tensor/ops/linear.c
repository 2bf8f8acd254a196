/* linear.c: matrix products (the device's gemm kernel: oneDNN's sgemm on the CPU): matmul with
 * optional transposes, and nn.Linear's y = x W^T + b. */
#include "tensor/internal.h"

#include <string.h>

/* C (M,N) = alpha op(A) op(B) + beta C on d, dense leading dimensions, in the context's precision:
 * a device that cannot multiply in it fails the context, saying why. */
bool cddp__computes(cddp_ctx *ctx, cddp__cdev *d) {
    cddp_error err = {0};
    if (ctx->compute == CDDP_F32 || d->q.dev->k->computes(ctx->compute, NULL, &err) == CDDP_OK)
        return true;
    cddp_ctx_fail(ctx, err.code, "%s: %s", d->q.dev->name, err.msg);
    return false;
}

static void gemm(cddp_ctx *ctx, cddp__cdev *d, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, const float *B, float beta, float *C) {
    if (!cddp__computes(ctx, d)) return;
    CDDP__K(&d->q, gemm, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .A = A,
            .lda = ta ? M : K, .B = B, .ldb = tb ? K : N, .beta = beta, .C = C, .ldc = N,
            .compute = ctx->compute);
}

cddp_tensor *cddp_matmul(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b, bool ta, bool tb) {
    if (CDDP__FAILED(ctx) || !a || !b) return NULL;
    cddp__need_f32("matmul", a);
    cddp__need_f32("matmul", b);
    CDDP_CHECK(a->ndim == 2 && b->ndim == 2, "matmul needs 2-D tensors, got %s and %s",
               CDDP__SHAPE(a), CDDP__SHAPE(b));
    int64_t M = ta ? a->shape[1] : a->shape[0], K = ta ? a->shape[0] : a->shape[1];
    int64_t Kb = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    CDDP_CHECK(K == Kb, "matmul: inner sizes differ: %s%s x %s%s", CDDP__SHAPE(a), ta ? "^T" : "",
               CDDP__SHAPE(b), tb ? "^T" : "");
    cddp__cdev *d = CDDP__ON(ctx, "matmul", a, b);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 2, (int64_t[]){M, N});
    if (!out) return NULL;
    gemm(ctx, d, ta, tb, M, N, K, 1.0f, a->data, b->data, 0.0f, out->data);
    cddp__node *n;
    if (!cddp__record_op(ctx, CDDP_OP_MATMUL, out, 2, (cddp_tensor *[]){a, b}, &n)) return NULL;
    if (n) {
        n->arg.mm.ta = ta;
        n->arg.mm.tb = tb;
    }
    return out;
}

void cddp__matmul_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *out = n->out;
    const float *dy = out->grad;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    /* C = op(A) op(B): dop(A) = dC op(B)^T and dop(B) = op(A)^T dC. For a stored transpose
     * the gradient of the stored matrix is the transpose of those, which swaps the roles of
     * the factors; each call below writes the stored layout directly, accumulating. */
    cddp_tensor *A = n->in[0], *B = n->in[1];
    bool ta = n->arg.mm.ta, tb = n->arg.mm.tb;
    int64_t M = out->shape[0], N = out->shape[1];
    int64_t K = ta ? A->shape[0] : A->shape[1];
    if (!d) return;
    if (A->requires_grad) {
        float *dA = cddp_grad_buffer(ctx, A);
        if (!dA) return;
        if (!ta) /* dA (M,K) = dC (M,N) . op(B)^T */
            gemm(ctx, d, false, !tb, M, K, N, 1.0f, dy, B->data, 1.0f, dA);
        else /* dA (K,M) = op(B) (K,N) . dC^T */
            gemm(ctx, d, tb, true, K, M, N, 1.0f, B->data, dy, 1.0f, dA);
    }
    if (B->requires_grad) {
        float *dB = cddp_grad_buffer(ctx, B);
        if (!dB) return;
        if (!tb) /* dB (K,N) = op(A)^T (K,M) . dC */
            gemm(ctx, d, !ta, false, K, N, M, 1.0f, A->data, dy, 1.0f, dB);
        else /* dB (N,K) = dC^T (N,M) . op(A) */
            gemm(ctx, d, true, ta, N, K, M, 1.0f, dy, A->data, 1.0f, dB);
    }
}

/* ---- linear in mixed precision ------------------------------------------------------------ */

/* On a device whose gemm takes bf16 operands (gemm_takes_bf16), mixed precision's linear rounds
 * each operand once for its three products instead of once per product: x and W in the forward,
 * kept for the backward's two products, and the output's gradient once for both, its column sums
 * (the bias's gradient) taken in the same pass; the bias is added by the forward's product. The
 * numbers are those of the float32 operands given to the gemm kernel in bf16 (it rounds them the
 * same way), with one less pass over the output each way. An x that its op rounded as it wrote it
 * (x->own.half: layer norm, GELU, attention; cddp__half_for) is not rounded again. (The 6-layer GPT
 * in bf16 on one Zen 4 core: the roundings and the bias passes had taken 7 % of its step.) Its
 * saved state is cddp__linear_saved (internal.h). */

/* x (rows, cols) rounded on d, into arena memory, or for a value the op's next kernels alone
 * read (temporary), into the context's reused memory; NULL (the failure latched) when out of
 * memory. */
static uint16_t *rounded(cddp__cdev *d, const float *x, int64_t rows, int64_t cols, float *colsum,
                         bool temporary) {
    size_t bytes = (size_t)(rows * cols) * sizeof(uint16_t);
    uint16_t *h = temporary ? cddp__dreuse(d, bytes) : cddp__dalloc(d, bytes);
    if (h)
        CDDP__K(&d->q, to_bf16, .dst = h, .src = x, .rows = rows, .cols = cols, .ld = cols,
                .colsum = colsum);
    return h;
}

/* Whether d's products in ctx take bf16 operands (mixed precision, and a gemm that takes them). */
bool cddp__takes_bf16(cddp_ctx *ctx, cddp__cdev *d) {
    return ctx->compute == CDDP_BF16 && d->q.dev->k->gemm_takes_bf16();
}

uint16_t *cddp__half_for(cddp_ctx *ctx, cddp__cdev *d, cddp_tensor *out) {
    if (!out || !cddp__takes_bf16(ctx, d)) return NULL;
    return out->own.half = cddp__dalloc(d, (size_t)out->numel * sizeof(uint16_t));
}

bool cddp__linear_bf16_product(cddp_ctx *ctx, cddp__cdev *d, cddp_tensor *x, uint16_t *x16,
                               cddp_tensor *w, cddp_tensor *b, float *y, cddp__linear_saved *sv) {
    int64_t in = w->shape[1], N = x->numel / in, outf = w->shape[0];
    if (!x16) x16 = x->own.half ? x->own.half : rounded(d, x->data, N, in, NULL, false);
    uint16_t *w16 = x16 ? rounded(d, w->data, outf, in, NULL, false) : NULL;
    if (!w16 || CDDP__FAILED(ctx)) return false;
    CDDP__K(&d->q, gemm, .ta = false, .tb = true, .M = N, .N = outf, .K = in, .alpha = 1.0f,
            .lda = in, .ldb = in, .beta = 0.0f, .C = y, .ldc = outf, .compute = CDDP_BF16,
            .A16 = x16, .B16 = w16, .bias = b ? b->data : NULL);
    *sv = (cddp__linear_saved){x16, w16};
    return true;
}

/* y = x W^T + b in bf16, recorded as op (LINEAR, or GELU_TANH_LINEAR, whose x16 is GELU's output
 * rounded: then x is GELU's input) with x16 and W rounded kept for the backward; x16 NULL: x's
 * rounded copy where its op made one (x->own.half), else rounded here. */
cddp_tensor *cddp__linear_bf16(cddp_ctx *ctx, cddp__cdev *d, cddp__op op, cddp_tensor *x,
                               uint16_t *x16, cddp_tensor *w, cddp_tensor *b, cddp_tensor *y) {
    if (!cddp__computes(ctx, d)) return NULL;
    cddp__linear_saved *sv = cddp__ctx_alloc(ctx, sizeof *sv);
    if (!sv || !cddp__linear_bf16_product(ctx, d, x, x16, w, b, y->data, sv)) return NULL;
    cddp__node *n;
    if (!cddp__record_op(ctx, op, y, b ? 3 : 2, (cddp_tensor *[]){x, w, b}, &n)) return NULL;
    if (n) n->saved = sv;
    return y;
}

/* The op after a linear layer in bf16 that makes the whole of its output's gradient may hand it
 * over rounded (grad_half: GELU's backward), with its column sums added to the bias's. */
bool cddp__linear_takes_grad_half(cddp_ctx *ctx, const cddp__node *made) {
    cddp__cdev *d = cddp__node_dev(ctx, made);
    return made->saved && made->out->numel > 0 && d && cddp__takes_bf16(ctx, d);
}

float *cddp__linear_bias_grad(cddp_ctx *ctx, const cddp__node *made) {
    cddp_tensor *b = made->nin > 2 ? made->in[2] : NULL;
    return b && b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
}

const uint16_t *cddp__linear_round_grad(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n,
                                        const float *dy) {
    cddp_tensor *b = n->nin > 2 ? n->in[2] : NULL, *W = n->in[1];
    int64_t outf = W->shape[0], N = n->in[0]->numel / W->shape[1];
    float *gb = b && b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
    if (b && b->requires_grad && !gb) return NULL;
    return rounded(d, dy, N, outf, gb, true);
}

/* The output's gradient as the backward's products read it: rounded by the op after (grad_half,
 * its column sums in the bias's gradient already), or rounded here with them; NULL (the failure
 * latched) when out of memory. */
const uint16_t *cddp__linear_grad_rounded(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n) {
    if (n->out->own.grad_half) return n->out->own.grad_half;
    return cddp__linear_round_grad(ctx, d, n, n->out->grad);
}

/* dx (stored when assign, else added) = dy W, and W's gradient dW += dy^T x16, in bf16 */
void cddp__linear_products_backward(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n, const uint16_t *dy,
                                    float *dx, bool assign) {
    const cddp__linear_saved *sv = n->saved;
    cddp_tensor *W = n->in[1];
    int64_t in = W->shape[1], N = n->in[0]->numel / in, outf = W->shape[0];
    if (dx)
        CDDP__K(&d->q, gemm, .M = N, .N = in, .K = outf, .alpha = 1.0f, .lda = outf, .ldb = in,
                .beta = assign ? 0.0f : 1.0f, .C = dx, .ldc = in, .compute = CDDP_BF16, .A16 = dy,
                .B16 = sv->w);
    if (W->requires_grad) {
        float *gw = cddp_grad_buffer(ctx, W);
        if (!gw) return;
        CDDP__K(&d->q, gemm, .ta = true, .M = outf, .N = in, .K = N, .alpha = 1.0f, .lda = outf,
                .ldb = in, .beta = 1.0f, .C = gw, .ldc = in, .compute = CDDP_BF16, .A16 = dy,
                .B16 = sv->x);
    }
}

static void linear_bf16_backward(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n) {
    cddp_tensor *x = n->in[0];
    const uint16_t *dy = cddp__linear_grad_rounded(ctx, d, n);
    bool assign = false;
    float *gx = dy && x->requires_grad ? cddp_grad_buffer_assign(ctx, x, &assign) : NULL;
    if (dy && (gx || !x->requires_grad)) cddp__linear_products_backward(ctx, d, n, dy, gx, assign);
}

/* ---- linear ------------------------------------------------------------------------------- */

cddp__cdev *cddp__linear_on(cddp_ctx *ctx, const char *op, cddp_tensor *x, cddp_tensor *w,
                            cddp_tensor *b, int64_t *shape) {
    cddp__need_f32(op, x);
    cddp__need_f32(op, w);
    CDDP_CHECK(x->ndim >= 1 && w->ndim == 2 && x->shape[x->ndim - 1] == w->shape[1],
               "%s: input %s does not fit weight %s (want (...,in) and (out,in))", op,
               CDDP__SHAPE(x), CDDP__SHAPE(w));
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == w->shape[0], "%s: bias %s for weight %s", op,
                   CDDP__SHAPE(b), CDDP__SHAPE(w));
    memcpy(shape, x->shape, sizeof(int64_t) * CDDP_MAX_DIMS);
    shape[x->ndim - 1] = w->shape[0];
    return CDDP__ON(ctx, op, x, w, b);
}

cddp_tensor *cddp_linear(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    int64_t shape[CDDP_MAX_DIMS], in = w->shape[1], N = in ? x->numel / in : 0, outf = w->shape[0];
    cddp__cdev *d = cddp__linear_on(ctx, "linear", x, w, b, shape);
    cddp_tensor *y = cddp__empty(d, CDDP_F32, x->ndim, shape);
    if (!y) return NULL;
    if (N && in && outf && cddp__takes_bf16(ctx, d))
        return cddp__linear_bf16(ctx, d, CDDP_OP_LINEAR, x, NULL, w, b, y);
    /* the bias added to the product's rows while they are still in cache, not copied into y
     * first for the GEMM to read back (the GPT, one rank, 4 interleaved rounds: 20.1-20.5k ->
     * 20.8-21.3k tokens/s, its forward 14.3-14.6 -> 13.1-13.5 ms; the MLP and the CNN level) */
    gemm(ctx, d, false, true, N, outf, in, 1.0f, x->data, w->data, 0.0f, y->data);
    if (b)
        CDDP__K(&d->q, add_rows, .dst = y->data, .src = b->data, .rows = N, .cols = outf,
                .dst_stride = outf, .src_stride = 0);
    if (!cddp__record_op(ctx, CDDP_OP_LINEAR, y, b ? 3 : 2, (cddp_tensor *[]){x, w, b}, NULL))
        return NULL;
    return y;
}

void cddp__linear_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0];
    const float *dy = n->out->grad;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    /* y = x W^T + b: dx = dy W, dW = dy^T x, db = column sums of dy. */
    cddp_tensor *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    int64_t in = W->shape[1], N = in ? x->numel / in : 0, outf = W->shape[0];
    if (!d) return;
    if (n->saved) {
        linear_bf16_backward(ctx, d, n);
        return;
    }
    if (x->requires_grad) {
        bool assign;
        float *gx = cddp_grad_buffer_assign(ctx, x, &assign);
        if (!gx) return;
        gemm(ctx, d, false, false, N, in, outf, 1.0f, dy, W->data, assign ? 0.0f : 1.0f, gx);
    }
    if (W->requires_grad) {
        float *gw = cddp_grad_buffer(ctx, W);
        if (!gw) return;
        gemm(ctx, d, true, false, outf, in, N, 1.0f, dy, x->data, 1.0f, gw);
    }
    if (b && b->requires_grad) {
        float *gb = cddp_grad_buffer(ctx, b);
        if (!gb) return;
        CDDP__K(&d->q, add_rows, .dst = gb, .src = dy, .rows = N, .cols = outf, .dst_stride = 0,
                .src_stride = outf);
    }
}
