/* transformer.c: the ops a GPT needs beyond the rest: embedding lookup, layer normalisation,
 * GELU with the tanh approximation, and causal self-attention fused into one op (as llm.c
 * writes it: no (B, NH, T, HS) copies of the heads; the device reads each head in place in the
 * (B, T, 3C) projection).
 */
#include "tensor/internal.h"

#include <string.h>

/* ---- embedding --------------------------------------------------------------------------- */

cddp_tensor *cddp_embedding(cddp_ctx *ctx, cddp_tensor *ids, cddp_tensor *table) {
    if (CDDP__FAILED(ctx) || !ids || !table) return NULL;
    cddp__need_f32("embedding", table);
    CDDP_CHECK(table->ndim == 2 && ids->ndim < CDDP_MAX_DIMS,
               "embedding: table %s must be (V,C) and ids at most %d-D, got %s", CDDP__SHAPE(table),
               CDDP_MAX_DIMS - 1, CDDP__SHAPE(ids));
    CDDP_CHECK(ids->dtype == CDDP_I32 || ids->dtype == CDDP_I64,
               "embedding: ids must be int32 or int64");
    int64_t V = table->shape[0], C = table->shape[1];
    cddp__cdev *d = CDDP__ON(ctx, "embedding", ids, table);
    if (!d) return NULL;
    CDDP__K(&d->q, check_ids, .ids = ids->data, .dtype = ids->dtype, .n = ids->numel, .limit = V,
            .fmt = "embedding: id %lld at position %lld is out of range for %lld rows (ids must be "
                   "in [0, %lld])");
    if (CDDP__FAILED(ctx)) return NULL;
    int64_t shape[CDDP_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    shape[ids->ndim] = C;
    cddp_tensor *out = cddp__empty(d, CDDP_F32, ids->ndim + 1, shape);
    if (!out) return NULL;
    CDDP__K(&d->q, embedding, .table = table->data, .ids = ids->data, .dtype = ids->dtype,
            .out = out->data, .n = ids->numel, .V = V, .C = C);
    if (!cddp__record_op(ctx, CDDP_OP_EMBEDDING, out, 2, (cddp_tensor *[]){table, ids}, NULL))
        return NULL;
    return out;
}

/* Each position's gradient row is added into its id's row of the table, positions in order:
 * the same ids give the same sums in the same order, whatever the machine. */
void cddp__embedding_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *table = n->in[0], *ids = n->in[1];
    float *dt = cddp__input_grad(ctx, n);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (!dt || !d) return;
    CDDP__K(&d->q, embedding_grad, .dtable = dt, .ids = ids->data, .dtype = ids->dtype,
            .dy = n->out->grad, .n = ids->numel, .V = table->shape[0], .C = table->shape[1]);
}

/* ---- layer norm -------------------------------------------------------------------------- */

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
    cddp__cdev *d = CDDP__ON(ctx, "layer_norm", x, weight, bias);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    float *stats = out ? cddp__dalloc(d, 2 * (size_t)rows * sizeof(float)) : NULL; /* mean, 1/std */
    uint16_t *half = cddp__half_for(ctx, d, out);
    if (!stats || CDDP__FAILED(ctx)) return NULL;
    CDDP__K(&d->q, layer_norm, .x = x->data, .w = weight ? weight->data : NULL,
            .b = bias ? bias->data : NULL, .y = out->data, .mean = stats, .rstd = stats + rows,
            .rows = rows, .C = C, .eps = eps, .y16 = half);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_LAYER_NORM, out, 3, (cddp_tensor *[]){x, weight, bias},
                         &node))
        return NULL;
    if (node) node->saved = stats;
    return out;
}

void cddp__layer_norm_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0], *weight = n->in[1], *bias = n->in[2];
    int64_t C = x->shape[x->ndim - 1], rows = x->numel / C;
    bool assign;
    float *dx = cddp__input_grad_assign(ctx, n, &assign);
    float *dw = weight && weight->requires_grad ? cddp_grad_buffer(ctx, weight) : NULL;
    float *db = bias && bias->requires_grad ? cddp_grad_buffer(ctx, bias) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if (CDDP__FAILED(ctx) || !d) return;
    const float *stats = n->saved;
    CDDP__K(&d->q, layer_norm_grad, .x = x->data, .w = weight ? weight->data : NULL,
            .dy = n->out->grad, .mean = stats, .rstd = stats + rows, .dx = dx, .assign = assign,
            .dw = dw, .db = db, .rows = rows, .C = C);
}

/* ---- GELU, tanh approximation ------------------------------------------------------------ */

/* The backward makes the slope from x again (which the graph keeps) rather than the forward
 * writing it for the backward to read: one array less written and kept (the 6-layer GPT in bf16
 * on the CPU: 1253 -> 1139 MB at its peak). */
cddp_tensor *cddp_gelu_tanh(cddp_ctx *ctx, cddp_tensor *x) {
    if (CDDP__FAILED(ctx) || !x) return NULL;
    cddp__need_f32("gelu_tanh", x);
    cddp__cdev *d = CDDP__ON(ctx, "gelu_tanh", x);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, x->ndim, x->shape);
    uint16_t *half = cddp__half_for(ctx, d, out);
    if (!out || CDDP__FAILED(ctx)) return NULL;
    CDDP__K(&d->q, gelu_tanh, .x = x->data, .y = out->data, .n = x->numel, .y16 = half);
    if (!cddp__record_op(ctx, CDDP_OP_GELU_TANH, out, 1, &x, NULL)) return NULL;
    return out;
}

/* For a linear layer in bf16 before it (the GPT's MLP), the input's gradient rounded as that
 * layer's backward would round it, row by row in cache, and its bias's gradient on the way
 * (cddp__input_grad_half): a pass over the gradient less, and half its bytes written. */
void cddp__gelu_tanh_backward(cddp_ctx *ctx, cddp__node *n) {
    bool assign = true;
    cddp_tensor *x = n->in[0];
    cddp__node *made = NULL;
    uint16_t *dx16 = cddp__input_grad_half(ctx, n, 0, &made);
    float *dx = dx16 ? NULL : cddp__input_grad_assign(ctx, n, &assign);
    float *colsum = dx16 ? cddp__linear_bias_grad(ctx, made) : NULL;
    cddp__cdev *d = cddp__node_dev(ctx, n);
    if ((!dx && !dx16) || !d || CDDP__FAILED(ctx)) return;
    CDDP__K(&d->q, gelu_tanh_grad, .x = x->data, .dy = n->out->grad, .dx = dx, .n = x->numel,
            .assign = assign, .dx16 = dx16, .colsum = colsum, .cols = x->shape[x->ndim - 1]);
}

/* ---- GELU, then linear ------------------------------------------------------------------- */

/* In mixed precision one node: GELU's output is made only rounded, for the product (its float32
 * values, which nothing else reads, are never written: GPT-2's MLP, 16,384 x 3,072 floats a
 * layer), and kept for the weight's gradient as linear keeps its input's rounding. Otherwise the
 * two ops. The numbers are those of cddp_gelu_tanh then cddp_linear. */
cddp_tensor *cddp_gelu_tanh_linear(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    int64_t shape[CDDP_MAX_DIMS], in = w->shape[1], N = in ? x->numel / in : 0, outf = w->shape[0];
    cddp__cdev *d = cddp__linear_on(ctx, "gelu_tanh_linear", x, w, b, shape);
    if (!d) return NULL;
    if (!(N && in && outf && cddp__takes_bf16(ctx, d)))
        return cddp_linear(ctx, cddp_gelu_tanh(ctx, x), w, b);
    cddp_tensor *y = cddp__empty(d, CDDP_F32, x->ndim, shape);
    uint16_t *g16 = y ? cddp__dalloc(d, (size_t)x->numel * sizeof(uint16_t)) : NULL;
    if (!g16) return NULL;
    CDDP__K(&d->q, gelu_tanh, .x = x->data, .y = NULL, .n = x->numel, .y16 = g16);
    return cddp__linear_bf16(ctx, d, CDDP_OP_GELU_TANH_LINEAR, x, g16, w, b, y);
}

/* The product's backward into GELU's output's gradient (memory of the step's released
 * gradients, given back after), then GELU's backward from it: to x's gradient, or, for the
 * linear layer in bf16 that made x, rounded with its bias's column sums (cddp__input_grad_half),
 * as the two ops' backward would. */
void cddp__gelu_tanh_linear_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp__cdev *d = cddp__node_dev(ctx, n);
    cddp_tensor *x = n->in[0];
    const uint16_t *dy = d ? cddp__linear_grad_rounded(ctx, d, n) : NULL;
    if (!dy) return;
    float *dg = x->requires_grad ? cddp__grad_scratch(d, x->numel) : NULL;
    if (x->requires_grad && !dg) return;
    cddp__linear_products_backward(ctx, d, n, dy, dg, true);
    if (!dg) return;
    bool assign = true;
    cddp__node *made = NULL;
    uint16_t *dx16 = cddp__input_grad_half(ctx, n, 0, &made);
    float *dx = dx16 ? NULL : cddp__input_grad_assign(ctx, n, &assign);
    float *colsum = dx16 ? cddp__linear_bias_grad(ctx, made) : NULL;
    if ((dx || dx16) && !CDDP__FAILED(ctx))
        CDDP__K(&d->q, gelu_tanh_grad, .x = x->data, .dy = dg, .dx = dx, .n = x->numel,
                .assign = assign, .dx16 = dx16, .colsum = colsum, .cols = x->shape[x->ndim - 1]);
    cddp__grad_scratch_release(d, dg, x->numel);
}

/* ---- causal self-attention --------------------------------------------------------------- */

/* The op's arguments, kept for backward: the heads, and the attention weights P (B, NH, T, T)
 * of every head, zero above the diagonal; or, attending by rows, each query's log-sum-exp lse
 * (B, NH, T) from which the backward makes P again. */
typedef struct attention_saved {
    int n_head;
    float *p, *lse;
} attention_saved;

/* Whether d attends by rows (flash_attention) for this shape. */
static bool by_rows(cddp_ctx *ctx, cddp__cdev *d, int64_t B, int64_t T, int64_t C, int n_head) {
    return cddp_knob_int(CDDP_KNOB_FLASH_ATTENTION) &&
           d->q.dev->k->attends_by_rows(B, T, n_head, C / n_head, ctx->compute);
}

/* Per batch element b and head h, with q, k, v the head's (T, HS) slices of qkv (rows 3C apart)
 * and o its slice of out (rows C apart): P = causal softmax(q k^T / sqrt(HS)), o = P v. */
cddp_tensor *cddp_attention(cddp_ctx *ctx, cddp_tensor *qkv, int n_head) {
    if (CDDP__FAILED(ctx) || !qkv) return NULL;
    cddp__need_f32("attention", qkv);
    CDDP_CHECK(qkv->ndim == 3 && n_head > 0 && qkv->shape[2] % (3 * (int64_t)n_head) == 0,
               "attention: qkv %s must be (B,T,3C) with C a multiple of %d heads", CDDP__SHAPE(qkv),
               n_head);
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    cddp__cdev *d = CDDP__ON(ctx, "attention", qkv);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 3, (int64_t[]){B, T, C});
    bool rows = out && by_rows(ctx, d, B, T, C, n_head);
    size_t saved = (size_t)(B * n_head * T * (rows ? 1 : T)) * sizeof(float);
    float *p = out ? cddp__dalloc(d, saved) : NULL;
    attention_saved *sv = cddp__ctx_alloc(ctx, sizeof *sv);
    uint16_t *half = cddp__half_for(ctx, d, out);
    if (!p || !sv || !cddp__computes(ctx, d) || CDDP__FAILED(ctx)) return NULL;
    if (rows)
        CDDP__K(&d->q, flash_attention, .qkv = qkv->data, .out = out->data, .lse = p, .B = B,
                .T = T, .C = C, .NH = n_head, .compute = ctx->compute, .out16 = half);
    else
        CDDP__K(&d->q, attention, .qkv = qkv->data, .out = out->data, .p = p, .B = B, .T = T,
                .C = C, .NH = n_head, .compute = ctx->compute, .out16 = half);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_ATTENTION, out, 1, &qkv, &node)) return NULL;
    if (node) {
        *sv = (attention_saved){n_head, rows ? NULL : p, rows ? p : NULL};
        node->saved = sv;
    }
    return out;
}

/* cddp_qkv_attention's state for its backward: the linear layer's (first: its products read it),
 * q, k, v rounded to bf16 (B, T, 3C) and each query's log-sum-exp (B, n_head, T). */
typedef struct qkv_attention_saved {
    cddp__linear_saved linear;
    uint16_t *qkv16;
    float *lse;
    int n_head;
} qkv_attention_saved;

/* In mixed precision, attending by rows: the product into memory reused by the next op (not
 * kept), rounded to bf16 once for the attention's tiles and kept for its backward, instead of
 * q, k, v kept in float32 and rounded again by the backward. */
cddp_tensor *cddp_qkv_attention(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                int n_head) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    int64_t shape[CDDP_MAX_DIMS], in = w->shape[1], outf = w->shape[0];
    cddp__cdev *d = cddp__linear_on(ctx, "qkv_attention", x, w, b, shape);
    if (!d) return NULL;
    CDDP_CHECK(x->ndim == 3 && n_head > 0 && outf % (3 * (int64_t)n_head) == 0,
               "qkv_attention: x %s must be (B,T,in) and weight %s (3C,in) with C a multiple of "
               "%d heads",
               CDDP__SHAPE(x), CDDP__SHAPE(w), n_head);
    int64_t B = x->shape[0], T = x->shape[1], C = outf / 3, N = B * T;
    if (!(N && in && cddp__takes_bf16(ctx, d) && by_rows(ctx, d, B, T, C, n_head)))
        return cddp_attention(ctx, cddp_linear(ctx, x, w, b), n_head);
    cddp_tensor *out = cddp__empty(d, CDDP_F32, 3, (int64_t[]){B, T, C});
    qkv_attention_saved *sv = out ? cddp__ctx_alloc(ctx, sizeof *sv) : NULL;
    uint16_t *qkv16 = sv ? cddp__dalloc(d, (size_t)(N * outf) * sizeof(uint16_t)) : NULL;
    float *lse = qkv16 ? cddp__dalloc(d, (size_t)(B * n_head * T) * sizeof(float)) : NULL;
    uint16_t *half = lse ? cddp__half_for(ctx, d, out) : NULL;
    float *qkv = half ? cddp__dreuse(d, (size_t)(N * outf) * sizeof(float)) : NULL;
    if (!qkv || !cddp__computes(ctx, d) ||
        !cddp__linear_bf16_product(ctx, d, x, NULL, w, b, qkv, &sv->linear))
        return NULL;
    CDDP__K(&d->q, to_bf16, .dst = qkv16, .src = qkv, .rows = N, .cols = outf, .ld = outf);
    CDDP__K(&d->q, flash_attention, .qkv16 = qkv16, .out = out->data, .lse = lse, .B = B, .T = T,
            .C = C, .NH = n_head, .compute = ctx->compute, .out16 = half);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_QKV_ATTENTION, out, b ? 3 : 2, (cddp_tensor *[]){x, w, b},
                         &node))
        return NULL;
    if (node) {
        sv->qkv16 = qkv16, sv->lse = lse, sv->n_head = n_head;
        node->saved = sv;
    }
    return out;
}

/* The attention's backward into q, k and v's gradient (memory of the step's released
 * gradients, given back after), then the linear layer's from it, as the two ops' backward. */
void cddp__qkv_attention_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp__cdev *d = cddp__node_dev(ctx, n);
    const qkv_attention_saved *sv = n->saved;
    cddp_tensor *x = n->in[0];
    int64_t B = x->shape[0], T = x->shape[1], outf = n->in[1]->shape[0], N = B * T;
    float *dqkv = d ? cddp__grad_scratch(d, N * outf) : NULL;
    if (!dqkv) return;
    CDDP__K(&d->q, flash_attention_grad, .qkv16 = sv->qkv16, .out = n->out->data, .lse = sv->lse,
            .dout = n->out->grad, .dqkv = dqkv, .B = B, .T = T, .C = outf / 3, .NH = sv->n_head,
            .assign = true, .compute = ctx->compute);
    const uint16_t *dy = cddp__linear_round_grad(ctx, d, n, dqkv);
    bool assign = false;
    float *dx = dy && x->requires_grad ? cddp_grad_buffer_assign(ctx, x, &assign) : NULL;
    if (dy && (dx || !x->requires_grad)) cddp__linear_products_backward(ctx, d, n, dy, dx, assign);
    cddp__grad_scratch_release(d, dqkv, N * outf);
}

/* The attention of new positions past..past+T-1 against a cache of the earlier ones' projections
 * (see tensor.h). No gradient: it is for generation, with gradients off. */
cddp_tensor *cddp_attention_cached(cddp_ctx *ctx, cddp_tensor *qkv, int n_head, cddp_tensor *cache,
                                   int64_t past) {
    if (CDDP__FAILED(ctx) || !qkv || !cache) return NULL;
    cddp__need_f32("attention_cached", qkv);
    cddp__need_f32("attention_cached", cache);
    CDDP_CHECK(qkv->ndim == 3 && n_head > 0 && qkv->shape[2] % (3 * (int64_t)n_head) == 0,
               "attention_cached: qkv %s must be (B,T,3C) with C a multiple of %d heads",
               CDDP__SHAPE(qkv), n_head);
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    CDDP_CHECK(cache->ndim == 3 && cache->shape[0] == B && cache->shape[2] == 2 * C,
               "attention_cached: the cache %s must be (B,L,2C) for qkv %s", CDDP__SHAPE(cache),
               CDDP__SHAPE(qkv));
    CDDP_CHECK(past >= 0 && past + T <= cache->shape[1],
               "attention_cached: positions %lld..%lld do not fit a cache of %lld positions",
               (long long)past, (long long)(past + T - 1), (long long)cache->shape[1]);
    CDDP_CHECK(!cddp_ctx_grad_enabled(ctx),
               "attention_cached computes no gradient: call it with gradients off "
               "(cddp_ctx_set_grad_enabled(ctx, false))");
    cddp__cdev *d = CDDP__ON(ctx, "attention_cached", qkv, cache);
    cddp_tensor *out = d ? cddp__empty(d, CDDP_F32, 3, (int64_t[]){B, T, C}) : NULL;
    if (!out) return NULL;
    CDDP__K(&d->q, attention_cached, .qkv = qkv->data, .cache = cache->data, .out = out->data,
            .B = B, .T = T, .C = C, .NH = n_head, .past = past, .L = cache->shape[1]);
    return out;
}

/* Every element of dqkv is written once per call, so a new gradient buffer is stored into rather
 * than zeroed and added to. */
void cddp__attention_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *qkv = n->in[0];
    bool assign;
    float *dqkv = cddp__input_grad_assign(ctx, n, &assign);
    cddp__cdev *d = cddp__node_dev(ctx, n);
    const attention_saved *sv = n->saved;
    if (!dqkv || !d) return;
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    if (sv->lse)
        CDDP__K(&d->q, flash_attention_grad, .qkv = qkv->data, .out = n->out->data, .lse = sv->lse,
                .dout = n->out->grad, .dqkv = dqkv, .B = B, .T = T, .C = C, .NH = sv->n_head,
                .assign = assign, .compute = ctx->compute);
    else
        CDDP__K(&d->q, attention_grad, .qkv = qkv->data, .p = sv->p, .dout = n->out->grad,
                .dqkv = dqkv, .B = B, .T = T, .C = C, .NH = sv->n_head, .assign = assign,
                .compute = ctx->compute);
}
