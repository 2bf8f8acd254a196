/* layout.c: a 4-D tensor into oneDNN's channel-blocked layout and back (tensor.h's "Layouts"),
 * each the other's backward.
 *
 * With B channels a block, an (N,C,H,W) tensor's block (n, g) holds channels g B .. g B + B - 1
 * of image n, position by position: B values side by side for each of the H W positions. Going
 * into the layout is a transposition of each block, (B, H W) -> (H W, B); coming out the reverse.
 * A ResNet meets these only where it begins or where a program asks: its convolutions write and
 * read the blocked layout themselves. */
#include "tensor/internal.h"

/* dst (+)= src between the layouts of a tensor of shape (into the blocked layout when into) */
static void reorder(cddp__cdev *d, const float *src, float *dst, const int64_t *shape, int64_t B,
                    bool into, bool add) {
    CDDP__K(&d->q, reorder, .src = src, .dst = dst, .N = shape[0], .C = shape[1],
            .P = shape[2] * shape[3], .B = B, .into = into, .add = add);
}

static cddp_tensor *relayout(cddp_ctx *ctx, cddp__op op, cddp_tensor *x, int block) {
    cddp__cdev *d = CDDP__ON(ctx, "to_blocked", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 4, x->shape);
    if (!out) return NULL;
    out->block = block;
    bool into = block != 0;
    reorder(d, x->data, out->data, x->shape, into ? block : x->block, into, false);
    if (!cddp__record_op(ctx, op, out, 1, &x, NULL)) return NULL;
    return out;
}

int cddp_blocked_size(void) {
    return cddp_blocked_size_on(cddp_device_cpu());
}

int cddp_blocked_size_on(cddp_device *dev) {
    return cddp_knob_int(CDDP_KNOB_BLOCKED) ? dev->k->blocked_size() : 0;
}

cddp_tensor *cddp_to_blocked(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("to_blocked", x);
    int B = cddp_blocked_size_on(x->device);
    if (x->block || B == 0 || x->ndim != 4 || x->shape[1] % B) return x;
    return relayout(ctx, CDDP_OP_TO_BLOCKED, x, B);
}

cddp_tensor *cddp_to_nchw(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    if (!x->block) return x;
    cddp__need_f32_any("to_nchw", x);
    return relayout(ctx, CDDP_OP_TO_NCHW, x, 0);
}

/* The gradient comes back through the reverse reorder. */
static void relayout_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (!dx || !d) return;
    cddp_tensor *x = n->in[0];
    bool into = x->block != 0; /* the gradient goes back into x's layout */
    reorder(d, n->out->grad, dx, x->shape, into ? x->block : n->out->block, into, !assign);
}

void cddp__to_blocked_backward(cddp_ctx *ctx, cddp__node *n) {
    relayout_backward(ctx, n);
}

void cddp__to_nchw_backward(cddp_ctx *ctx, cddp__node *n) {
    relayout_backward(ctx, n);
}
