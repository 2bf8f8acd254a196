/* shape.c: views: reshape and flatten share their input's data; a view's backward routes its
 * gradient back to the source, element for element. And to_dtype, a copy in another dtype
 * (float32 <-> bf16), whose gradient goes back the same way. */
#include "tensor/internal.h"

/* A view of x with another shape. */
static cddp_tensor *view(cddp_ctx *ctx, cddp_tensor *x, int ndim, const int64_t *shape) {
    cddp__need_nchw("reshape", x);
    cddp__cdev *d = CDDP__ON(ctx, "reshape", x);
    cddp_tensor *t = d ? cddp__tensor_header(ctx, d, x->dtype, ndim, shape) : NULL;
    if (!t) return NULL;
    t->data = x->data;
    if (!cddp__record(ctx, CDDP_OP_RESHAPE, t, 1, &x) && ctx->err.code) return NULL;
    return t;
}

cddp_tensor *cddp_reshape(cddp_ctx *ctx, cddp_tensor *x, int ndim, const int64_t *shape) {
    if (!x) return NULL;
    int64_t s[CDDP_MAX_DIMS], known = 1;
    int infer = -1;
    CDDP_CHECK(ndim >= 1 && ndim <= CDDP_MAX_DIMS, "reshape to %d dimensions", ndim);
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1) {
            CDDP_CHECK(infer < 0, "reshape: only one dimension may be -1");
            infer = i;
        } else {
            CDDP_CHECK(s[i] >= 0, "reshape: dimension %d is %lld", i, (long long)s[i]);
            known *= s[i];
        }
    }
    if (infer >= 0) {
        CDDP_CHECK(known > 0 && x->numel % known == 0,
                   "reshape: cannot infer dimension %d of a tensor with %lld elements", infer,
                   (long long)x->numel);
        s[infer] = x->numel / known;
        known *= s[infer];
    }
    CDDP_CHECK(known == x->numel, "reshape: %lld elements cannot take a shape of %lld",
               (long long)x->numel, (long long)known);
    return view(ctx, x, ndim, s);
}

cddp_tensor *cddp_flatten(cddp_ctx *ctx, cddp_tensor *x) {
    if (!x) return NULL;
    CDDP_CHECK(x->ndim >= 1, "flatten needs a batch dimension");
    int64_t n = x->shape[0];
    return view(ctx, x, 2, (int64_t[]){n, n ? x->numel / n : 0});
}

/* A view: the same elements in the same order, so dx += dy. Where x has no gradient yet and
 * neither keeps its own (no parameter, nothing retained or hooked), the view's gradient becomes
 * x's instead of being copied: it is dead once this backward ran, and released here otherwise
 * (the GPT's classifier in float32: 16,384 x 50,304 floats a step for GPT-2, read and written). */
void cddp__reshape_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0], *out = n->out;
    if (cddp__gradient_free(x) && out->grad && !out->retain_grad) {
        x->grad = out->grad;
        out->grad = NULL;
        return;
    }
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (dx && d)
        CDDP__K(&d->q, accumulate, .dst = dx, .src = out->grad, .n = x->numel, .assign = assign);
}

cddp_tensor *cddp_to_dtype(cddp_ctx *ctx, cddp_tensor *x, cddp_dtype dtype) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    CDDP_CHECK((dtype == CDDP_F32 || dtype == CDDP_BF16) &&
                   (x->dtype == CDDP_F32 || x->dtype == CDDP_BF16),
               "to_dtype: %s to %s (float32 and bfloat16 convert into each other)",
               cddp_dtype_name(x->dtype), cddp_dtype_name(dtype));
    if (x->dtype == dtype) return x;
    cddp__cdev *d = CDDP__ON(ctx, "to_dtype", x);
    cddp_tensor *out = cddp__empty(d, dtype, x->ndim, x->shape);
    if (!out) return NULL;
    out->block = x->block;
    bool widen = dtype == CDDP_F32;
    if (x->numel > 0)
        CDDP__K(&d->q, cast16, .h = widen ? x->data : out->data, .f = widen ? out->data : x->data,
                .n = x->numel, .f16 = false, .widen = widen, .scale = 1.0f);
    if (!cddp__record_op(ctx, CDDP_OP_TO_DTYPE, out, 1, &x, NULL)) return NULL;
    return out;
}

void cddp__to_dtype_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp__reshape_backward(ctx, n);
}
