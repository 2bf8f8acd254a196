/* llama.c: the ops of Llama-family transformers (cddp/tensor.h): RMSNorm, SwiGLU's gate and rotary
 * position embeddings, as Hugging Face's LlamaRMSNorm, silu(gate) * up and apply_rotary_pos_emb
 * (rotate_half) compute them, each with its backward.
 *
 * RMSNorm keeps each row's 1/rms for its backward (one float a row). Rotary positions are a
 * rotation of each pair of a head's features, so the backward is the same kernel turning the
 * other way; the op keeps nothing but its arguments. Grouped-query attention (fewer key/value
 * heads than query heads) packs q, k and v into the (B, T, 3C) rows the attention ops take, each
 * key/value head repeated for the query heads that share it, as Hugging Face's repeat_kv does:
 * the fused attention kernels serve it as they are, at the cost of the repeated copies (an
 * attention that reads the shared heads in place would save them). */
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

/* ---- grouped-query attention's packing ----------------------------------------------------- */

typedef struct pack_saved {
    int64_t n_head, n_kv_head;
} pack_saved;

cddp_tensor *cddp_qkv_pack(cddp_ctx *ctx, cddp_tensor *q, cddp_tensor *k, cddp_tensor *v,
                           int64_t n_head, int64_t n_kv_head) {
    if (CDDP__FAILED(ctx) || !q || !k || !v) return NULL;
    cddp__need_f32("qkv_pack", q);
    cddp__need_f32("qkv_pack", k);
    cddp__need_f32("qkv_pack", v);
    CDDP_CHECK(n_head >= 1 && n_kv_head >= 1 && n_head % n_kv_head == 0 && q->ndim >= 1 &&
                   q->shape[q->ndim - 1] % n_head == 0,
               "qkv_pack: q %s is not (..., n_head D) with n_head %lld a multiple of n_kv_head "
               "%lld",
               CDDP__SHAPE(q), (long long)n_head, (long long)n_kv_head);
    int64_t D = q->shape[q->ndim - 1] / n_head, rows = q->numel / (n_head * D);
    for (int i = 0; i < 2; i++) {
        const cddp_tensor *t = i ? v : k;
        bool fits = t->ndim == q->ndim && t->shape[t->ndim - 1] == n_kv_head * D &&
                    !memcmp(t->shape, q->shape, sizeof(int64_t) * (size_t)(q->ndim - 1));
        CDDP_CHECK(fits, "qkv_pack: %s %s is not q %s's rows of n_kv_head %lld heads of %lld",
                   i ? "v" : "k", CDDP__SHAPE(t), CDDP__SHAPE(q), (long long)n_kv_head,
                   (long long)D);
    }
    int64_t shape[CDDP_MAX_DIMS];
    memcpy(shape, q->shape, sizeof shape);
    shape[q->ndim - 1] = 3 * n_head * D;
    cddp__cdev *d = CDDP__ON(ctx, "qkv_pack", q, k, v);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, q->ndim, shape);
    pack_saved *sv = out ? cddp__ctx_alloc(ctx, sizeof *sv) : NULL;
    if (!sv || CDDP__FAILED(ctx)) return NULL;
    CDDP__K(&d->q, qkv_pack, .q = q->data, .k = k->data, .v = v->data, .qkv = out->data,
            .rows = rows, .H = n_head, .KV = n_kv_head, .D = D);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_QKV_PACK, out, 3, (cddp_tensor *[]){q, k, v}, &node))
        return NULL;
    if (node) {
        *sv = (pack_saved){n_head, n_kv_head};
        node->saved = sv;
    }
    return out;
}

void cddp__qkv_pack_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    const pack_saved *sv = n->saved;
    bool aq = false, ak = false, av = false;
    float *dq = cddp__input_grad_assign(ctx, n, &aq);
    float *dk = k->requires_grad ? cddp_grad_buffer_assign(ctx, k, &ak) : NULL;
    float *dv = v->requires_grad ? cddp_grad_buffer_assign(ctx, v, &av) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (CDDP__FAILED(ctx) || !d || (!dq && !dk && !dv)) return;
    int64_t D = q->shape[q->ndim - 1] / sv->n_head;
    CDDP__K(&d->q, qkv_pack_grad, .dqkv = n->out->grad, .dq = dq, .dk = dk, .dv = dv,
            .assign_q = aq, .assign_k = ak, .assign_v = av, .rows = q->numel / (sv->n_head * D),
            .H = sv->n_head, .KV = sv->n_kv_head, .D = D);
}
