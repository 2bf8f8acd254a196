/* recompute.c: activation checkpointing (cddp_recompute): a segment of the forward run without
 * keeping what it computes inside, run again in backward.
 *
 * Forward: the segment runs on the context's scratch (cddp_ctx_scratch: an arena of its own), on
 * x wrapped there, recording its tape there, so that the parameters it reads are known; its output
 * is copied into ctx, and ctx records one node, out = segment(x), that read those parameters
 * (cddp_record_function). The scratch is then free again: of the segment, ctx keeps x and out, and
 * the scratch holds at most one segment's work at a time.
 * Backward (that node's): the scratch reset, its generator where the forward's was (a dropout
 * draws the same mask), the segment run again on x wrapped as a leaf that requires a gradient;
 * then a backward on the scratch from its output, seeded with the gradient that reached out. The
 * parameters' gradients land in their models' blocks as in any backward, x's is added to x's
 * gradient in ctx. That inner backward fires no ready hook: the node counts as one use of each of
 * the segment's parameters in the outer backward, which fires their hooks once it passed the node
 * (backward.c).
 */
#include "autograd/internal.h"

#include "cddp/internal/device.h"

#include <string.h>

typedef struct segment {
    cddp_segment_fn fn;
    void *user;
    cddp_rng rng; /* the context's generator before the segment ran */
} segment;

/* x on s: its data wrapped (no copy), a leaf that requires a gradient when grad is set. */
static cddp_tensor *wrapped(cddp_ctx *s, cddp_tensor *x, bool grad) {
    cddp_tensor *w = cddp_wrap(s, x->dtype, x->ndim, x->shape, x->data);
    if (w) w->block = x->block;
    return w && grad ? cddp_requires_grad(s, w) : w;
}

/* The parameters that s's tape read, each once, into the arena of ctx (*n of them). */
static cddp_tensor **params_of(cddp_ctx *ctx, cddp_ctx *s, int *n) {
    int cap = 0;
    for (cddp_node *k = cddp_ctx_tape(s); k; k = cddp_node_prev(k)) cap += cddp_node_num_inputs(k);
    cddp_error e = {0};
    cddp_tensor **p = cddp_arena_alloc(cddp_ctx_arena(ctx), sizeof *p * (size_t)(cap + 1), &e);
    if (!p) {
        cddp_ctx_fail(ctx, e.code, "%s", e.msg);
        return NULL;
    }
    *n = 0;
    for (cddp_node *k = cddp_ctx_tape(s); k; k = cddp_node_prev(k))
        for (int i = 0; i < cddp_node_num_inputs(k); i++) {
            cddp_tensor *t = cddp_node_input(k, i);
            if (!t || !t->is_param) continue;
            bool seen = false;
            for (int j = 0; j < *n && !seen; j++) seen = p[j] == t;
            if (!seen) p[(*n)++] = t;
        }
    return p;
}

static void backward(void *user, cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *out) {
    const segment *g = user;
    cddp_ctx *s = cddp_ctx_scratch(ctx);
    if (!s) return;
    cddp_ctx_reset(s);
    cddp_ctx_set_grad_enabled(s, true);
    *cddp_ctx_rng(s) = g->rng;
    bool grad = x->requires_grad;
    cddp_tensor *xs = wrapped(s, x, grad), *ys = xs ? g->fn(g->user, s, xs) : NULL;
    if (!ys || cddp__backward_from(s, ys, out->grad) != CDDP_OK) {
        cddp_ctx_fail(ctx, cddp_ctx_status(s) ? cddp_ctx_status(s) : CDDP_ENOMEM,
                      "a checkpointed segment run again in backward: %s", cddp_ctx_error(s));
        return;
    }
    bool assign = false; /* x's first gradient: copied, so that its bits are the segment's */
    float *dx = grad && xs->grad ? cddp_grad_buffer_assign(ctx, x, &assign) : NULL;
    if (dx && assign)
        cddp_device_copy(x->device, dx, xs->grad, (size_t)x->numel * sizeof(float), NULL);
    else if (dx)
        cddp_device_accumulate(x->device, dx, xs->grad, (size_t)x->numel);
    cddp_ctx_reset(s); /* what the segment made there is not needed any more */
}

cddp_tensor *cddp_recompute(cddp_ctx *ctx, cddp_segment_fn fn, void *user, cddp_tensor *x) {
    if (!x || cddp_ctx_failed(ctx)) return NULL;
    cddp_ctx *s = cddp_ctx_scratch(ctx);
    segment *g = s ? cddp_arena_alloc(cddp_ctx_arena(ctx), sizeof *g, NULL) : NULL;
    if (!g) {
        if (s) cddp_ctx_fail(ctx, CDDP_ENOMEM, "out of memory for a checkpointed segment");
        return NULL;
    }
    *g = (segment){fn, user, *cddp_ctx_rng(ctx)};
    cddp_ctx_reset(s);
    *cddp_ctx_rng(s) = g->rng;
    bool grad = cddp_ctx_grad_enabled(ctx); /* without: only the copy of its output, as with */
    cddp_ctx_set_grad_enabled(s, grad);
    cddp_tensor *xs = wrapped(s, x, x->requires_grad), *ys = xs ? fn(user, s, xs) : NULL;
    if (!ys || cddp_ctx_failed(s)) {
        cddp_ctx_fail(ctx, cddp_ctx_status(s) ? cddp_ctx_status(s) : CDDP_ENOMEM,
                      "a checkpointed segment: %s", cddp_ctx_error(s));
        return NULL;
    }
    *cddp_ctx_rng(ctx) = *cddp_ctx_rng(s); /* the draws a segment made, as if made here */
    int nparams = 0;
    cddp_tensor **params = NULL;
    if (grad && !(params = params_of(ctx, s, &nparams))) return NULL;
    cddp_tensor *out = cddp_empty(ctx, ys->dtype, ys->ndim, ys->shape);
    if (!out) return NULL;
    out->block = ys->block;
    if (cddp_device_copy(out->device, out->data, ys->data,
                         (size_t)ys->numel * cddp_dtype_size(ys->dtype), NULL) != CDDP_OK) {
        cddp_ctx_fail(ctx, CDDP_EIO, "a checkpointed segment: cannot copy its output");
        return NULL;
    }
    cddp_ctx_reset(s);
    cddp_ctx_set_grad_enabled(s, true);
    return grad ? cddp_record_function(ctx, out, x, params, nparams, backward, g) : out;
}
