/* elementwise.c: add, sub, mul and div with NumPy broadcasting, and scale.
 *
 * A binary op's backward walks the output's elements and adds each one's term into the input
 * element it came from, so a dimension that was stretched sums its contributions. */
#include "tensor/internal.h"

#include <string.h>

/* The broadcast of a and b into out: their shapes right-aligned into 4-D, strides 0 along the
 * dimensions that stretch. */
static void bcast_init(cddp__bcast *bc, const cddp_tensor *a, const cddp_tensor *b,
                       const cddp_tensor *out) {
    int64_t ea[4], eb[4];
    for (int d = 0; d < 4; d++) {
        int ia = d - (4 - a->ndim), ib = d - (4 - b->ndim), io = d - (4 - out->ndim);
        ea[d] = ia >= 0 ? a->shape[ia] : 1;
        eb[d] = ib >= 0 ? b->shape[ib] : 1;
        bc->shape[d] = io >= 0 ? out->shape[io] : 1;
    }
    int64_t sa = 1, sb = 1;
    for (int d = 3; d >= 0; d--) {
        bc->sa[d] = ea[d] == 1 ? 0 : sa;
        bc->sb[d] = eb[d] == 1 ? 0 : sb;
        sa *= ea[d];
        sb *= eb[d];
    }
    bc->same = a->numel == out->numel && b->numel == out->numel;
}

static cddp__binop binop(cddp__op op) {
    switch (op) {
    case CDDP_OP_ADD:
        return CDDP__ADD;
    case CDDP_OP_SUB:
        return CDDP__SUB;
    case CDDP_OP_MUL:
        return CDDP__MUL;
    case CDDP_OP_DIV:
        return CDDP__DIV;
    default:
        CDDP_PANIC("op %d is not a binary elementwise op", (int)op);
    }
}

static cddp_tensor *binary(cddp_ctx *ctx, cddp__op op, cddp_tensor *a, cddp_tensor *b) {
    if (CDDP__FAILED(ctx) || !a || !b) return NULL;
    cddp__need_f32_any("elementwise op", a);
    cddp__need_f32_any("elementwise op", b);
    /* Blocked tensors meet only their like: the same elements in the same places. */
    CDDP_CHECK((!a->block && !b->block) || (a->block == b->block && a->ndim == b->ndim &&
                                            !memcmp(a->shape, b->shape, sizeof a->shape)),
               "elementwise op on %s (blocked by %d) and %s (blocked by %d): a tensor in the "
               "channel-blocked layout takes part only with one of its own shape and layout; "
               "convert with cddp_to_nchw first",
               CDDP__SHAPE(a), a->block, CDDP__SHAPE(b), b->block);
    int nd = CDDP_MAX(a->ndim, b->ndim);
    int64_t shape[CDDP_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        int ia = d - (nd - a->ndim), ib = d - (nd - b->ndim);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        CDDP_CHECK(sa == sb || sa == 1 || sb == 1, "cannot broadcast %s with %s", CDDP__SHAPE(a),
                   CDDP__SHAPE(b));
        shape[d] = sa == 1 ? sb : sa;
    }
    cddp__cdev *d = CDDP__ON(ctx, "elementwise op", a, b);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, nd, shape);
    if (!out) return NULL;
    out->block = a->block;
    cddp__bcast bc;
    bcast_init(&bc, a, b, out);
    CDDP__K(&d->q, binary, .op = binop(op), .bc = bc, .a = a->data, .b = b->data, .z = out->data,
            .n = out->numel);
    if (!cddp__record_op(ctx, op, out, 2, (cddp_tensor *[]){a, b}, NULL)) return NULL;
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

/* z = x + y of one shape (a transformer's residual stream): both gradients are dz. dz is dead
 * after this backward (tape.c releases it), so an input that has no gradient yet, in z's layout,
 * takes dz's memory itself instead of a copy (the other input, if it wants one, gets the copy,
 * queued before anything can add to that memory), or, where a linear layer in bf16 made it and
 * reads it so, dz rounded (cddp__input_grad_half). */
static bool same_shape_add_backward(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n) {
    cddp_tensor *a = n->in[0], *b = n->in[1], *z = n->out;
    if (n->op != CDDP_OP_ADD || a->numel != z->numel || b->numel != z->numel) return false;
    float *dz = z->grad;
    for (int k = 0; k < 2; k++) {
        cddp_tensor *t = n->in[k];
        if (!t->requires_grad) continue;
        /* a linear layer in bf16 made t just before (a block's output projection): t's gradient
         * rounded as that layer's backward would round it, its bias's gradient on the way */
        cddp__node *made = NULL;
        uint16_t *half = t->node && cddp__op_is_linear(t->node->op)
                             ? cddp__input_grad_half(ctx, n, k, &made)
                             : NULL;
        if (half) {
            int64_t cols = t->shape[t->ndim - 1];
            CDDP__K(&d->q, to_bf16, .dst = half, .src = dz, .rows = t->numel / cols, .cols = cols,
                    .ld = cols, .colsum = cddp__linear_bias_grad(ctx, made));
            continue;
        }
        if (z->grad && !t->grad && !t->is_param && !z->retain_grad && t->block == z->block &&
            t->device == z->device) {
            t->grad = dz; /* moved: z no longer has it */
            z->grad = NULL;
            continue;
        }
        bool assign;
        float *g = cddp_grad_buffer_assign(ctx, t, &assign);
        if (g) CDDP__K(&d->q, accumulate, .dst = g, .src = dz, .n = t->numel, .assign = assign);
    }
    return true;
}

/* d(in) for a broadcast binary op: the kernel walks out's elements, adding each term to the input
 * element it came from, so a stretched dimension sums its contributions. */
static void binary_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (!d || same_shape_add_backward(ctx, d, n)) return;
    cddp_tensor *a = n->in[0], *b = n->in[1];
    float *da = a->requires_grad ? cddp_grad_buffer(ctx, a) : NULL;
    float *db = b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
    if (CDDP__FAILED(ctx)) return;
    cddp__bcast bc;
    bcast_init(&bc, a, b, n->out);
    CDDP__K(&d->q, binary_grad, .op = binop(n->op), .bc = bc, .dz = n->out->grad, .a = a->data,
            .b = b->data, .da = da, .db = db);
}

void cddp__add_backward(cddp_ctx *ctx, cddp__node *n) {
    binary_backward(ctx, n);
}
void cddp__sub_backward(cddp_ctx *ctx, cddp__node *n) {
    binary_backward(ctx, n);
}
void cddp__mul_backward(cddp_ctx *ctx, cddp__node *n) {
    binary_backward(ctx, n);
}
void cddp__div_backward(cddp_ctx *ctx, cddp__node *n) {
    binary_backward(ctx, n);
}

cddp_tensor *cddp_scale(cddp_ctx *ctx, cddp_tensor *x, float s) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32_any("scale", x);
    cddp__cdev *d = CDDP__ON(ctx, "scale", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    out->block = x->block;
    CDDP__K(&d->q, scale, .y = out->data, .x = x->data, .s = s, .n = x->numel, .add = false);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_SCALE, out, 1, &x, &node)) return NULL;
    if (node) node->arg.scalar = s;
    return out;
}

/* y = s x: dx = s dy */
void cddp__scale_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (dx && d)
        CDDP__K(&d->q, scale, .y = dx, .x = n->out->grad, .s = n->arg.scalar, .n = n->in[0]->numel,
                .add = true);
}
