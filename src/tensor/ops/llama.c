/* llama.c: the ops of Llama-family transformers (cddp/tensor.h): RMSNorm, SwiGLU's gate and rotary
 * position embeddings, as Hugging Face's LlamaRMSNorm, silu(gate) * up and apply_rotary_pos_emb
 * (rotate_half) compute them, each with its backward.
 *
 * RMSNorm keeps each row's 1/rms for its backward (one float a row). Rotary positions are a
 * rotation of each pair of a head's features, so the backward is the same kernel turning the
 * other way; the op keeps nothing but its arguments. */
#include "tensor/internal.h"

#include <string.h>

/* ---- RMSNorm ------------------------------------------------------------------------------- */

cddp_tensor *cddp_rms_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, float eps) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("rms_norm", x);
    CDDP_CHECK(x->ndim >= 1 && x->numel > 0, "rms_norm: x %s has no features", CDDP__SHAPE(x));
    int64_t C = x->shape[x->ndim - 1], rows = x->numel / C;
    CDDP_CHECK(!weight || (weight->dtype == CDDP_F32 && weight->numel == C),
               "rms_norm: weight %s does not fit %lld features", weight ? CDDP__SHAPE(weight) : "",
               (long long)C);
    CDDP_CHECK(eps > 0, "rms_norm: eps %g must be positive", (double)eps);
    cddp__cdev *d = CDDP__ON(ctx, "rms_norm", x, weight);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    float *rstd = out ? cddp__dalloc(d, (size_t)rows * sizeof(float)) : NULL;
    if (!rstd || CDDP__FAILED(ctx)) return NULL;
    CDDP__K(&d->q, rms_norm, .x = x->data, .w = weight ? weight->data : NULL, .y = out->data,
            .rstd = rstd, .rows = rows, .C = C, .eps = eps);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_RMS_NORM, out, 2, (cddp_tensor *[]){x, weight}, &node))
        return NULL;
    if (node) node->saved = rstd;
    return out;
}

void cddp__rms_norm_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0], *weight = n->in[1];
    int64_t C = x->shape[x->ndim - 1], rows = x->numel / C;
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    float *dw = weight && weight->requires_grad ? cddp_grad_buffer(ctx, weight) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (CDDP__FAILED(ctx) || !d) return;
    CDDP__K(&d->q, rms_norm_grad, .x = x->data, .w = weight ? weight->data : NULL,
            .dy = n->out->grad, .rstd = n->saved, .dx = dx, .assign = assign, .dw = dw,
            .rows = rows, .C = C);
}

/* ---- SwiGLU's gate ------------------------------------------------------------------------- */

cddp_tensor *cddp_silu_mul(cddp_ctx *ctx, cddp_tensor *g, cddp_tensor *u) {
    if (CDDP__FAILED(ctx) || !g || !u) return NULL;
    cddp__need_f32("silu_mul", g);
    cddp__need_f32("silu_mul", u);
    CDDP_CHECK(g->ndim == u->ndim && !memcmp(g->shape, u->shape, sizeof(int64_t) * (size_t)g->ndim),
               "silu_mul: the gate %s and the values %s must have one shape", CDDP__SHAPE(g),
               CDDP__SHAPE(u));
    cddp__cdev *d = CDDP__ON(ctx, "silu_mul", g, u);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, g->ndim, g->shape);
    if (!out || CDDP__FAILED(ctx)) return NULL;
    CDDP__K(&d->q, silu_mul, .g = g->data, .u = u->data, .y = out->data, .n = g->numel);
    if (!cddp__record_op(ctx, CDDP_OP_SILU_MUL, out, 2, (cddp_tensor *[]){g, u}, NULL)) return NULL;
    return out;
}

void cddp__silu_mul_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *g = n->in[0], *u = n->in[1];
    bool assign_g = false, assign_u = false;
    float *dg = cddp__input_grad_assign(ctx, n, &assign_g);
    float *du = u->requires_grad ? cddp_grad_buffer_assign(ctx, u, &assign_u) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (CDDP__FAILED(ctx) || !d || (!dg && !du)) return;
    CDDP__K(&d->q, silu_mul_grad, .g = g->data, .u = u->data, .dy = n->out->grad, .dg = dg,
            .assign_g = assign_g, .du = du, .assign_u = assign_u, .n = g->numel);
}

/* ---- rotary position embeddings ------------------------------------------------------------ */

typedef struct rope_saved {
    int64_t n_head, pos0;
} rope_saved;

cddp_tensor *cddp_rope(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *inv_freq, int64_t n_head,
                       int64_t pos0) {
    if (CDDP__FAILED(ctx) || !x || !inv_freq) return NULL;
    cddp__need_f32("rope", x);
    cddp__need_f32("rope", inv_freq);
    CDDP_CHECK(x->ndim >= 2 && n_head >= 1 && x->shape[x->ndim - 1] % (2 * n_head) == 0,
               "rope: x %s is not (..., T, n_head x D) with n_head %lld and D even", CDDP__SHAPE(x),
               (long long)n_head);
    int64_t T = x->shape[x->ndim - 2], D = x->shape[x->ndim - 1] / n_head;
    CDDP_CHECK(inv_freq->numel == D / 2, "rope: inv_freq %s is not D/2 = %lld frequencies",
               CDDP__SHAPE(inv_freq), (long long)(D / 2));
    CDDP_CHECK(pos0 >= 0, "rope: the first position %lld is negative", (long long)pos0);
    CDDP_CHECK(!inv_freq->requires_grad, "rope: inv_freq takes no gradient (a constant of the "
                                         "model: build it without requires_grad)");
    cddp__cdev *d = CDDP__ON(ctx, "rope", x, inv_freq);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    rope_saved *sv = out ? cddp__ctx_alloc(ctx, sizeof *sv) : NULL;
    if (!sv || CDDP__FAILED(ctx)) return NULL;
    CDDP__K(&d->q, rope, .x = x->data, .y = out->data, .inv_freq = inv_freq->data,
            .rows = x->numel / (n_head * D), .T = T, .H = n_head, .D = D, .pos0 = pos0,
            .inverse = false, .assign = true);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_ROPE, out, 2, (cddp_tensor *[]){x, inv_freq}, &node))
        return NULL;
    if (node) {
        *sv = (rope_saved){n_head, pos0};
        node->saved = sv;
    }
    return out;
}

void cddp__rope_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0];
    const rope_saved *sv = n->saved;
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (CDDP__FAILED(ctx) || !d || !dx) return;
    int64_t D = x->shape[x->ndim - 1] / sv->n_head;
    CDDP__K(&d->q, rope, .x = n->out->grad, .y = dx, .inv_freq = n->in[1]->data,
            .rows = x->numel / (sv->n_head * D), .T = x->shape[x->ndim - 2], .H = sv->n_head,
            .D = D, .pos0 = sv->pos0, .inverse = true, .assign = assign);
}
