/* layout.c: a 4-D tensor into oneDNN's channel-blocked layout and back (tensor.h's "Layouts"),
 * each the other's backward.
 *
 * With B channels a block, an (N,C,H,W) tensor's block (n, g) holds channels g B .. g B + B - 1
 * of image n, position by position: B values side by side for each of the H W positions. Going
 * into the layout is a transposition of each block, (B, H W) -> (H W, B); coming out the reverse.
 * A ResNet meets these only where it begins or where a program asks: its convolutions write and
 * read the blocked layout themselves. */
#include "tensor/dnnl.h"

#include <string.h>

/* dst = src (add: dst += src) from one layout into the other: into blocks when `into`, else out
 * of them; the tensor (N,C,H,W), B channels a block. */
static void reorder(const float *src, float *dst, const int64_t *shape, int64_t B, bool into,
                    bool add) {
    int64_t N = shape[0], G = shape[1] / B, P = shape[2] * shape[3];
    for (int64_t ng = 0; ng < N * G; ng++) {
        const float *s = src + ng * B * P;
        float *d = dst + ng * B * P;
        for (int64_t k = 0; k < B; k++) /* plain plane k of the block, blocked lane k */
            for (int64_t p = 0; p < P; p++) {
                int64_t plain = k * P + p, blocked = p * B + k;
                float v = s[into ? plain : blocked];
                float *to = &d[into ? blocked : plain];
                *to = add ? *to + v : v;
            }
    }
}

static cddp_tensor *relayout(cddp_ctx *ctx, cddp__op op, cddp_tensor *x, int block) {
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, x->shape);
    if (!out) return NULL;
    out->block = block;
    bool into = block != 0;
    reorder(x->data, out->data, x->shape, into ? block : x->block, into, false);
    if (!cddp__record_op(ctx, op, out, 1, &x, NULL)) return NULL;
    return out;
}

int cddp_blocked_size(void) {
    return cddp_knob_int(CDDP_KNOB_BLOCKED) ? cddp__dnnl_block() : 0;
}

cddp_tensor *cddp_to_blocked(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("to_blocked", x);
    int B = cddp_blocked_size();
    if (x->block || B == 0 || x->ndim != 4 || x->shape[1] % B) return x;
    return relayout(ctx, CDDP_OP_TO_BLOCKED, x, B);
}

cddp_tensor *cddp_to_nchw(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    if (!x->block) return x;
    return relayout(ctx, CDDP_OP_TO_NCHW, x, 0);
}

/* The gradient comes back through the reverse reorder. */
static void relayout_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    if (!dx) return;
    cddp_tensor *x = n->in[0];
    bool into = x->block != 0; /* the gradient goes back into x's layout */
    reorder(n->out->grad, dx, x->shape, into ? x->block : n->out->block, into, !assign);
}

void cddp__to_blocked_backward(cddp_ctx *ctx, cddp__node *n) {
    relayout_backward(ctx, n);
}

void cddp__to_nchw_backward(cddp_ctx *ctx, cddp__node *n) {
    relayout_backward(ctx, n);
}
