/* elementwise.c: add, sub, mul and div with NumPy broadcasting, and scale.
 *
 * A binary op's backward walks the output's elements and adds each one's term into the input
 * element it came from, so a dimension that was stretched sums its contributions. */
#include "tensor/internal.h"

#include <string.h>

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
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, nd, shape);
    if (!out) return NULL;
    out->block = a->block;
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

/* d(in) for a broadcast binary op: walks out's elements, adding each term to the right input
 * element, so a stretched dimension sums its contributions. */
/* z = x + y of one shape (a transformer's residual stream): both gradients are dz. */
static bool same_shape_add_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *a = n->in[0], *b = n->in[1];
    if (n->op != CDDP_OP_ADD || a->numel != n->out->numel || b->numel != n->out->numel)
        return false;
    for (int k = 0; k < 2; k++) {
        cddp_tensor *t = n->in[k];
        bool assign;
        float *d = t->requires_grad ? cddp_grad_buffer_assign(ctx, t, &assign) : NULL;
        if (d && assign)
            memcpy(d, n->out->grad, (size_t)t->numel * sizeof(float));
        else if (d)
            cddp__add_into(d, n->out->grad, t->numel);
    }
    return true;
}

static void binary_backward(cddp_ctx *ctx, cddp__node *n) {
    if (same_shape_add_backward(ctx, n)) return;
    const float *dy = n->out->grad;
    cddp_tensor *a = n->in[0], *b = n->in[1];
    const float *x = a->data, *y = b->data;
    float *da = a->requires_grad ? cddp_grad_buffer(ctx, a) : NULL;
    float *db = b->requires_grad ? cddp_grad_buffer(ctx, b) : NULL;
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
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    if (!out) return NULL;
    out->block = x->block;
    const float *a = x->data;
    float *y = out->data;
    for (int64_t i = 0; i < x->numel; i++) y[i] = s * a[i];
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_SCALE, out, 1, &x, &node)) return NULL;
    if (node) node->arg.scalar = s;
    return out;
}

/* y = s x: dx = s dy */
void cddp__scale_backward(cddp_ctx *ctx, cddp__node *n) {
    float *dx = cddp__input_grad(ctx, n);
    const float *dy = n->out->grad;
    if (dx)
        for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += n->arg.scalar * dy[i];
}
