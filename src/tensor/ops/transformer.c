/* transformer.c: the ops a GPT needs beyond the rest: embedding lookup, layer normalisation,
 * GELU with the tanh approximation, and causal self-attention fused into one op (as llm.c
 * writes it: no (B, NH, T, HS) copies of the heads, the scores' GEMMs read each head in place
 * in the (B, T, 3C) projection).
 */
#include "tensor/internal.h"

#include <math.h>
#include <string.h>

/* ---- embedding --------------------------------------------------------------------------- */

/* Aborts unless ids are integers; fails the context (returning false) on an id outside [0, V). */
static bool check_ids(cddp_ctx *ctx, const cddp_tensor *ids, int64_t V, const char *op) {
    CDDP_CHECK(ids->dtype == CDDP_I32 || ids->dtype == CDDP_I64, "%s: ids must be int32 or int64",
               op);
    for (int64_t i = 0; i < ids->numel; i++) {
        int64_t id = cddp__label(ids, i);
        if (id < 0 || id >= V) {
            cddp_ctx_fail(ctx, CDDP_ERANGE,
                          "%s: id %lld at position %lld is out of range for %lld rows (ids must "
                          "be in [0, %lld])",
                          op, (long long)id, (long long)i, (long long)V, (long long)(V - 1));
            return false;
        }
    }
    return true;
}

cddp_tensor *cddp_embedding(cddp_ctx *ctx, cddp_tensor *ids, cddp_tensor *table) {
    if (CDDP__FAILED(ctx) || !ids || !table) return NULL;
    cddp__need_f32("embedding", table);
    CDDP_CHECK(table->ndim == 2 && ids->ndim < CDDP_MAX_DIMS,
               "embedding: table %s must be (V,C) and ids at most %d-D, got %s", CDDP__SHAPE(table),
               CDDP_MAX_DIMS - 1, CDDP__SHAPE(ids));
    int64_t V = table->shape[0], C = table->shape[1];
    if (!check_ids(ctx, ids, V, "embedding")) return NULL;
    int64_t shape[CDDP_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    shape[ids->ndim] = C;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, ids->ndim + 1, shape);
    if (!out) return NULL;
    for (int64_t i = 0; i < ids->numel; i++)
        memcpy(cddp_f32(out) + i * C, cddp_f32(table) + cddp__label(ids, i) * C,
               (size_t)C * sizeof(float));
    if (!cddp__record_op(ctx, CDDP_OP_EMBEDDING, out, 2, (cddp_tensor *[]){table, ids}, NULL))
        return NULL;
    return out;
}

/* Each position's gradient row is added into its id's row of the table, positions in order:
 * the same ids give the same sums in the same order, whatever the machine. */
void cddp__embedding_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *table = n->in[0], *ids = n->in[1];
    float *dt = cddp__input_grad(ctx, n);
    if (!dt) return;
    int64_t C = table->shape[1];
    const float *dy = n->out->grad;
    for (int64_t i = 0; i < ids->numel; i++)
        cddp__add_into(dt + cddp__label(ids, i) * C, dy + i * C, C);
}

/* ---- layer norm -------------------------------------------------------------------------- */

/* C copies of v in the arena: the weight (ones) or bias (zeros) of a LayerNorm without them. */
static const float *unit(cddp_ctx *ctx, int64_t C, float v) {
    float *u = cddp__ctx_alloc(ctx, (size_t)C * sizeof(float));
    for (int64_t i = 0; u && i < C; i++) u[i] = v;
    return u;
}

cddp_tensor *cddp_layer_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, cddp_tensor *bias,
                             float eps) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("layer_norm", x);
    CDDP_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] > 0, "layer_norm of %s", CDDP__SHAPE(x));
    int64_t C = x->shape[x->ndim - 1], rows = x->numel / C;
    cddp_tensor *per_c[2] = {weight, bias};
    for (int i = 0; i < 2; i++)
        if (per_c[i])
            CDDP_CHECK(per_c[i]->dtype == CDDP_F32 && per_c[i]->numel == C,
                       "layer_norm: %s %s does not fit %lld features", i ? "bias" : "weight",
                       CDDP__SHAPE(per_c[i]), (long long)C);
    CDDP_CHECK(eps > 0, "layer_norm: eps %g must be positive", (double)eps);
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *stats = cddp__ctx_alloc(ctx, 2 * (size_t)rows * sizeof(float)); /* mean, 1/std */
    if (!out || !stats) return NULL;
    const float *w = weight ? cddp_f32(weight) : unit(ctx, C, 1.0f);
    const float *b = bias ? cddp_f32(bias) : unit(ctx, C, 0.0f);
    if (!w || !b) return NULL;
    cddp__layer_norm_rows(cddp_f32(x), w, b, cddp_f32(out), stats, stats + rows, rows, C, eps);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_LAYER_NORM, out, 3, (cddp_tensor *[]){x, weight, bias},
                         &node))
        return NULL;
    if (node) node->saved = stats;
    return out;
}

/* With h = (x - mean) rstd and y = w h + b, per row of C features:
 * db += dy, dw += dy h, and, as mean and rstd depend on x,
 * dx += rstd (w dy - mean(w dy) - h mean(w dy h)). */
void cddp__layer_norm_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0], *weight = n->in[1], *bias = n->in[2];
    int64_t C = x->shape[x->ndim - 1], rows = x->numel / C;
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    float *dw = weight && weight->requires_grad ? cddp_grad_buffer(ctx, weight) : NULL;
    float *db = bias && bias->requires_grad ? cddp_grad_buffer(ctx, bias) : NULL;
    float *scratch = cddp__ctx_alloc(ctx, 2 * (size_t)C * sizeof(float));
    if (CDDP__FAILED(ctx)) return;
    const float *stats = n->saved, *w = weight ? cddp_f32(weight) : unit(ctx, C, 1.0f);
    if (!w) return;
    cddp__layer_norm_grad(cddp_f32(x), w, n->out->grad, stats, stats + rows, dx, assign, dw, db,
                          rows, C, scratch);
}

/* ---- GELU, tanh approximation ------------------------------------------------------------ */

/* tanh's values are kept for the backward (the forward's costliest part). */
cddp_tensor *cddp_gelu_tanh(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("gelu_tanh", x);
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, x->ndim, x->shape);
    float *t = cddp__ctx_alloc(ctx, (size_t)x->numel * sizeof(float));
    if (!out || !t) return NULL;
    cddp__gelu_tanh_rows(x->data, out->data, t, x->numel);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_GELU_TANH, out, 1, &x, &node)) return NULL;
    if (node) node->saved = t;
    return out;
}

/* y = x/2 (1 + tanh(u)), u = k (x + 0.044715 x^3):
 * dy/dx = (1 + tanh(u))/2 + x/2 (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2). */
void cddp__gelu_tanh_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    if (!dx) return;
    cddp__gelu_tanh_grad(n->in[0]->data, n->saved, n->out->grad, dx, n->in[0]->numel, assign);
}

/* ---- causal self-attention --------------------------------------------------------------- */

/* The op's arguments, kept for backward: the heads, and the attention weights P (B, NH, T, T)
 * of every head, zero above the diagonal. */
typedef struct attention_saved {
    int n_head;
    float *p;
} attention_saved;

/* Row t of P (T long): softmax of s[0..t] (the scores of positions up to t), zeros after. */
static void causal_softmax_row(float *s, int64_t t, int64_t T) {
    float sum = cddp__exp_shifted(s, cddp__max(s, t + 1), s, t + 1);
    cddp__scale_into(s, 1.0f / sum, t + 1);
    memset(s + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}

/* Per batch element b and head h, with q, k, v the head's (T, HS) slices of qkv (rows 3C apart)
 * and o its slice of out (rows C apart):
 *   P = causal softmax(q k^T / sqrt(HS)),  o = P v   (attn.c's loops, the masked half skipped). */
cddp_tensor *cddp_attention(cddp_ctx *ctx, cddp_tensor *qkv, int n_head) {
    if (CDDP__FAILED(ctx) || !qkv) return NULL;
    cddp__need_f32("attention", qkv);
    CDDP_CHECK(qkv->ndim == 3 && n_head > 0 && qkv->shape[2] % (3 * (int64_t)n_head) == 0,
               "attention: qkv %s must be (B,T,3C) with C a multiple of %d heads", CDDP__SHAPE(qkv),
               n_head);
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, HS = C / n_head;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 3, (int64_t[]){B, T, C});
    float *p = cddp__ctx_alloc(ctx, (size_t)(B * n_head * T * T) * sizeof(float));
    float *kt = cddp__ctx_alloc(ctx, (size_t)(HS * T) * sizeof(float));
    attention_saved *sv = cddp__ctx_alloc(ctx, sizeof *sv);
    if (!out || !p || !kt || !sv) return NULL;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < n_head; h++) {
            const float *q = cddp_f32(qkv) + b * T * 3 * C + h * HS, *k = q + C, *v = q + 2 * C;
            float *ph = p + (b * n_head + h) * T * T;
            cddp__attn_transpose(k, 3 * C, T, HS, kt);
            cddp__attn_scores(q, 3 * C, kt, T, HS, scale, ph);
            for (int64_t t = 0; t < T; t++) causal_softmax_row(ph + t * T, t, T);
            cddp__attn_mix(ph, v, 3 * C, T, HS, 1.0f, cddp_f32(out) + b * T * C + h * HS, C, false);
        }
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_ATTENTION, out, 1, &qkv, &node)) return NULL;
    if (node) {
        *sv = (attention_saved){n_head, p};
        node->saved = sv;
    }
    return out;
}

/* With do the head's slice of the output's gradient:
 *   dv += P^T do;  dP = do v^T;  dS = P * (dP - rowsum(dP * P))  (the softmax's backward, zero
 *   above the diagonal since P is);  dq += dS k / sqrt(HS);  dk += dS^T q / sqrt(HS).
 * Every element of dqkv is written once per call, so a new gradient buffer is stored into rather
 * than zeroed and added to. */
void cddp__attention_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *qkv = n->in[0];
    bool assign;
    float *dqkv = cddp__input_grad_assign(ctx, n, &assign);
    const attention_saved *sv = n->saved;
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, NH = sv->n_head;
    int64_t HS = C / NH;
    float *ds = cddp__ctx_alloc(ctx, (size_t)(T * T) * sizeof(float));
    float *vt = cddp__ctx_alloc(ctx, (size_t)(HS * T) * sizeof(float));
    if (!dqkv || !ds || !vt) return;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *q = cddp_f32(qkv) + b * T * 3 * C + h * HS, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + b * T * 3 * C + h * HS, *dk = dq + C, *dv = dq + 2 * C;
            const float *ph = sv->p + (b * NH + h) * T * T;
            const float *dout = n->out->grad + b * T * C + h * HS;
            cddp__attn_mix_t(ph, dout, C, T, HS, 1.0f, dv, 3 * C, !assign);
            cddp__attn_transpose(v, 3 * C, T, HS, vt);
            cddp__attn_scores(dout, C, vt, T, HS, 1.0f, ds);
            for (int64_t t = 0; t < T; t++) {
                const float *pr = ph + t * T;
                float *dr = ds + t * T;
                float dot = cddp__dot(dr, pr, t + 1);
                for (int64_t j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - dot);
                memset(dr + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
            }
            cddp__attn_mix(ds, k, 3 * C, T, HS, scale, dq, 3 * C, !assign);
            cddp__attn_mix_t(ds, q, 3 * C, T, HS, scale, dk, 3 * C, !assign);
        }
}
