/* transformer.c: the CPU's kernels for layer normalisation and causal self-attention (vec.c's
 * rows, attn.c's products; tensor/kernels.h says what each computes), and attention with a
 * key/value cache for generation. */
#include "tensor/cpu/cpu.h"

#include <math.h>
#include <string.h>

/* C copies of v in scratch: the weight (ones) or bias (zeros) of a LayerNorm without them. */
static const float *unit(cddp__kq *q, int64_t C, float v) {
    float *u = cddp__kq_scratch(q, (size_t)C * sizeof(float));
    for (int64_t i = 0; u && i < C; i++) u[i] = v;
    return u;
}

/* Rows lo..hi, with y16 16 at a time, each block rounded while it is in cache. */
static void layer_norm_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_layer_norm *a = ((void **)arg)[0];
    const float *w = ((void **)arg)[1], *b = ((void **)arg)[2];
    int64_t C = a->C, step = a->y16 ? 16 : hi - lo;
    for (int64_t r = lo; r < hi; r += step) {
        int64_t n = hi - r < step ? hi - r : step;
        cddp__layer_norm_rows(a->x + r * C, w, b, a->y + r * C, a->mean + r, a->rstd + r, n, C,
                              a->eps);
        if (a->y16) cddp__to_bf16_rows(a->y16 + r * C, C, a->y + r * C, C, n, C);
    }
}

/* The rows split across the math threads. */
void cddp__cpu_layer_norm(cddp__kq *q, const cddp__k_layer_norm *a) {
    const float *w = a->w ? a->w : unit(q, a->C, 1.0f);
    const float *b = a->b ? a->b : unit(q, a->C, 0.0f);
    if (!w || !b) return;
    int parts = cddp__cpu_parts(a->rows * a->C, CDDP__CPU_GRAIN);
    if (parts > a->rows / 16) parts = a->rows / 16 > 1 ? (int)(a->rows / 16) : 1;
    cddp__cpu_split(a->rows, 16, parts, layer_norm_part,
                    (void *[]){(void *)a, (void *)w, (void *)b});
}

/* Rows lo..hi of dx, with a part's scratch. */
static void layer_norm_dx_part(int64_t lo, int64_t hi, int part, void *arg) {
    const cddp__k_layer_norm_grad *a = ((void **)arg)[0];
    const float *w = ((void **)arg)[1];
    float *scratch = (float *)((void **)arg)[2] + (size_t)part * 2 * cddp__up16((size_t)a->C);
    int64_t C = a->C;
    cddp__layer_norm_grad(a->x + lo * C, w, a->dy + lo * C, a->mean + lo, a->rstd + lo,
                          a->dx + lo * C, a->assign, hi - lo, C, scratch);
}

/* Columns lo..hi of dw and db, over every row. */
static void layer_norm_w_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_layer_norm_grad *a = arg;
    cddp__layer_norm_wgrad(a->x + lo, a->dy + lo, a->mean, a->rstd, a->dw ? a->dw + lo : NULL,
                           a->db ? a->db + lo : NULL, a->rows, hi - lo, a->C);
}

/* With h = (x - mean) rstd and y = w h + b, per row of C features:
 * db += dy, dw += dy h, and, as mean and rstd depend on x,
 * dx += rstd (w dy - mean(w dy) - h mean(w dy h)).
 * dx by rows, dw and db by columns, each split across the math threads. */
void cddp__cpu_layer_norm_grad(cddp__kq *q, const cddp__k_layer_norm_grad *a) {
    int64_t C = a->C;
    if (a->dx) {
        int parts = cddp__cpu_row_parts(a->rows, C);
        float *scratch =
            cddp__kq_scratch(q, (size_t)parts * 2 * cddp__up16((size_t)C) * sizeof(float));
        const float *w = a->w ? a->w : unit(q, C, 1.0f);
        if (!scratch || !w) return;
        cddp__cpu_split(a->rows, 1, parts, layer_norm_dx_part,
                        (void *[]){(void *)a, (void *)w, scratch});
    }
    if (a->dw || a->db) {
        cddp__cpu_split_cols(a->rows, C, layer_norm_w_part, a);
    }
}

/* Row t of P (T long): softmax of s[0..t] (the scores of positions up to t), zeros after. */
static void causal_softmax_row(float *s, int64_t t, int64_t T) {
    float sum = cddp__exp_shifted(s, cddp__max(s, t + 1), s, t + 1);
    cddp__scale_into(s, 1.0f / sum, t + 1);
    memset(s + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}

void cddp__cpu_causal_softmax(cddp__kq *q, const cddp__k_causal_softmax *a) {
    (void)q;
    for (int64_t r = 0; r < a->rows; r++) causal_softmax_row(a->s + r * a->T, r % a->T, a->T);
}

/* Words for a (rows, cols) matrix packed as rows, pairs or cols (attn_bf16.c). */
static size_t rows_words(int64_t rows, int64_t cols) {
    return (size_t)(rows * ((cols + 1) / 2));
}
static size_t pairs_words(int64_t rows, int64_t cols) {
    return (size_t)((rows + 1) / 2 * ((cols + 31) / 32 * 32));
}

/* How a kernel multiplies: float32, bf16 on the bf16 units, or bf16's numbers in float32. */
typedef enum { IN_F32, IN_BF16, IN_BF16_EMULATED } products;

static products products_of(cddp_dtype compute) {
    if (compute != CDDP_BF16) return IN_F32;
    return cddp__cpu_bf16_native() ? IN_BF16 : IN_BF16_EMULATED;
}

/* A kernel's heads split across the math threads: each part takes a run of the B x NH (batch
 * element, head) pairs, with scratch of its own (floats and words, each part's 64-byte aligned). */
typedef struct {
    const void *a;
    products in;
    float *f;
    uint32_t *w;
    size_t nf, nw; /* each part's, rounded up to 16 */
} heads;

/* Scratch of nf floats and nw words for each of parts parts (false: out of memory, latched). */
static bool heads_scratch(cddp__kq *q, heads *h, int parts, size_t nf, size_t nw) {
    h->nf = cddp__up16(nf), h->nw = cddp__up16(nw);
    h->f = h->nf ? cddp__kq_scratch(q, (size_t)parts * h->nf * sizeof(float)) : NULL;
    h->w = h->nw ? cddp__kq_scratch(q, (size_t)parts * h->nw * 4) : NULL;
    return (!h->nf || h->f) && (!h->nw || h->w);
}

static void attention_heads(int64_t lo, int64_t hi, int part, void *arg) {
    const heads *hd = arg;
    const cddp__k_attention *a = hd->a;
    int64_t T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    products in = hd->in;
    float *kt = hd->f + (size_t)part * hd->nf;
    uint32_t *w = hd->w ? hd->w + (size_t)part * hd->nw : NULL;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bh = lo; bh < hi; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        const float *qh = a->qkv + b * T * 3 * C + h * HS, *k = qh + C, *v = qh + 2 * C;
        float *ph = a->p + (b * NH + h) * T * T, *o = a->out + b * T * C + h * HS;
        if (in == IN_BF16) {
            uint32_t *qa = w, *kb = qa + rows_words(T, HS), *vx = kb + pairs_words(HS, T),
                     *pw = vx + pairs_words(T, HS);
            cddp__bf16_pack_rows(qa, qh, 3 * C, T, HS);
            cddp__bf16_pack_cols(kb, k, 3 * C, T, HS);
            cddp__attn_scores_bf16(qa, kb, T, HS, scale, ph);
            for (int64_t t = 0; t < T; t++) causal_softmax_row(ph + t * T, t, T);
            cddp__bf16_pack_rows_causal(pw, ph, T);
            cddp__bf16_pack_pairs(vx, v, 3 * C, T, HS);
            cddp__attn_mix_bf16(pw, vx, T, HS, 1.0f, o, C, false);
            continue;
        }
        int64_t ld = 3 * C;
        const float *pm = ph;
        if (in == IN_BF16_EMULATED) {
            float *r = (float *)w;
            cddp__bf16_round_rows(r, qh, 3 * C, T, HS);
            cddp__bf16_round_rows(r + T * HS, k, 3 * C, T, HS);
            cddp__bf16_round_rows(r + 2 * T * HS, v, 3 * C, T, HS);
            qh = r, k = r + T * HS, v = r + 2 * T * HS, ld = HS;
        }
        cddp__attn_transpose(k, ld, T, HS, kt);
        cddp__attn_scores(qh, ld, kt, T, HS, scale, ph);
        for (int64_t t = 0; t < T; t++) causal_softmax_row(ph + t * T, t, T);
        if (in == IN_BF16_EMULATED) {
            float *pr = (float *)w + 3 * T * HS;
            cddp__bf16_round_rows(pr, ph, T, T, T);
            pm = pr;
        }
        cddp__attn_mix(pm, v, ld, T, HS, 1.0f, o, C, false);
    }
}

/* The rows of batch elements lo..hi of out rounded into out16. */
static void attention_out16(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_attention *a = arg;
    int64_t T = a->T, C = a->C;
    cddp__to_bf16_rows(a->out16 + lo * T * C, C, a->out + lo * T * C, C, (hi - lo) * T, C);
}

/* Per batch element b and head h, with q, k, v the head's (T, HS) slices of qkv (rows 3C apart)
 * and o its slice of out (rows C apart):
 *   P = causal softmax(q k^T / sqrt(HS)),  o = P v   (attn.c's loops, the masked half skipped;
 *   in bf16 attn_bf16.c's, q, k, P and v rounded). The heads split across the math threads. */
void cddp__cpu_attention(cddp__kq *q, const cddp__k_attention *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    heads hd = {.a = a, .in = products_of(a->compute)};
    /* bf16: q, k, v and P packed; emulated: q, k, v and P rounded */
    size_t words = rows_words(T, HS) + 2 * pairs_words(HS, T) + pairs_words(T, HS) +
                   rows_words(T, T) + 4 * (size_t)(T * HS) + (size_t)(T * T);
    int parts = cddp__cpu_parts(B * NH, 1);
    if (!heads_scratch(q, &hd, parts, (size_t)(HS * T), hd.in == IN_F32 ? 0 : words)) return;
    cddp__cpu_split(B * NH, 1, parts, attention_heads, &hd);
    if (a->out16) cddp__cpu_split(B, 1, cddp__cpu_parts(B, 1), attention_out16, (void *)a);
}

/* Row r of d (T long, dP on entry, query t = r % T) becomes P * (dP - rowsum(dP * P)) up to t,
 * zeros after (P is). */
static void softmax_grad_rows(float *d, const float *p, int64_t rows, int64_t T) {
    for (int64_t r = 0; r < rows; r++) {
        float *dr = d + r * T;
        const float *pr = p + r * T;
        int64_t t = r % T;
        float dot = cddp__dot(dr, pr, t + 1);
        for (int64_t j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - dot);
        memset(dr + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
    }
}

void cddp__cpu_causal_softmax_grad(cddp__kq *q, const cddp__k_causal_softmax_grad *a) {
    (void)q;
    softmax_grad_rows(a->d, a->p, a->rows, a->T);
}

/* One head's gradients in bf16 on the bf16 units: attn_bf16.c's products, each operand packed
 * (rounded) once for each layout it is read in; w: the packs' words. */
static void head_grad_bf16(const float *qh, const float *ph, const float *dout, float *dq,
                           int64_t T, int64_t C, int64_t HS, bool acc, float *ds, uint32_t *w) {
    const float *k = qh + C, *v = qh + 2 * C;
    float scale = 1.0f / sqrtf((float)HS);
    uint32_t *wp = w, *x = wp + pairs_words(T, T), *da = x + pairs_words(T, HS),
             *vb = da + rows_words(T, HS);
    cddp__bf16_pack_pairs_causal(wp, ph, T); /* dv += P^T do */
    cddp__bf16_pack_pairs(x, dout, C, T, HS);
    cddp__attn_mix_t_bf16(wp, x, T, HS, 1.0f, dq + 2 * C, 3 * C, acc);
    cddp__bf16_pack_rows(da, dout, C, T, HS); /* dP = do v^T */
    cddp__bf16_pack_cols(vb, v, 3 * C, T, HS);
    cddp__attn_scores_bf16(da, vb, T, HS, 1.0f, ds);
    softmax_grad_rows(ds, ph, T, T);
    cddp__bf16_pack_rows_causal(wp, ds, T); /* dq += dS k / sqrt(HS) */
    cddp__bf16_pack_pairs(x, k, 3 * C, T, HS);
    cddp__attn_mix_bf16(wp, x, T, HS, scale, dq, 3 * C, acc);
    cddp__bf16_pack_pairs_causal(wp, ds, T); /* dk += dS^T q / sqrt(HS) */
    cddp__bf16_pack_pairs(x, qh, 3 * C, T, HS);
    cddp__attn_mix_t_bf16(wp, x, T, HS, scale, dq + C, 3 * C, acc);
}

static void attention_grad_heads(int64_t lo, int64_t hi, int part, void *arg) {
    const heads *hd = arg;
    const cddp__k_attention_grad *a = hd->a;
    int64_t T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    products in = hd->in;
    float *ds = hd->f + (size_t)part * hd->nf,
          *vt = ds + cddp__up16((size_t)(T * T)); /* v^T: attn.c's */
    uint32_t *w = hd->w ? hd->w + (size_t)part * hd->nw : NULL;
    bool acc = !a->assign;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bh = lo; bh < hi; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        const float *qh = a->qkv + b * T * 3 * C + h * HS, *k = qh + C, *v = qh + 2 * C;
        float *dq = a->dqkv + b * T * 3 * C + h * HS, *dk = dq + C, *dv = dq + 2 * C;
        const float *ph = a->p + (b * NH + h) * T * T;
        const float *dout = a->dout + b * T * C + h * HS, *pm = ph;
        if (in == IN_BF16) {
            head_grad_bf16(qh, ph, dout, dq, T, C, HS, acc, ds, w);
            continue;
        }
        int64_t ld = 3 * C, ldo = C;
        float *r = (float *)w;
        if (in == IN_BF16_EMULATED) {
            cddp__bf16_round_rows(r, qh, 3 * C, T, HS);
            cddp__bf16_round_rows(r + T * HS, k, 3 * C, T, HS);
            cddp__bf16_round_rows(r + 2 * T * HS, v, 3 * C, T, HS);
            cddp__bf16_round_rows(r + 3 * T * HS, dout, C, T, HS);
            cddp__bf16_round_rows(r + 4 * T * HS, ph, T, T, T);
            qh = r, k = r + T * HS, v = r + 2 * T * HS, dout = r + 3 * T * HS;
            pm = r + 4 * T * HS, ld = ldo = HS;
        }
        cddp__attn_mix_t(pm, dout, ldo, T, HS, 1.0f, dv, 3 * C, acc);
        cddp__attn_transpose(v, ld, T, HS, vt);
        cddp__attn_scores(dout, ldo, vt, T, HS, 1.0f, ds);
        softmax_grad_rows(ds, ph, T, T);
        if (in == IN_BF16_EMULATED) cddp__bf16_round_rows(ds, ds, T, T, T);
        cddp__attn_mix(ds, k, ld, T, HS, scale, dq, 3 * C, acc);
        cddp__attn_mix_t(ds, qh, ld, T, HS, scale, dk, 3 * C, acc);
    }
}

/* With do the head's slice of the output's gradient:
 *   dv += P^T do;  dP = do v^T;  dS = P * (dP - rowsum(dP * P))  (the softmax's backward, zero
 *   above the diagonal since P is);  dq += dS k / sqrt(HS);  dk += dS^T q / sqrt(HS). In bf16 the
 *   products' operands are rounded (q, k, v, P, do, dS); the softmax's backward stays float32.
 *   The heads split across the math threads. */
void cddp__cpu_attention_grad(cddp__kq *q, const cddp__k_attention_grad *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    heads hd = {.a = a, .in = products_of(a->compute)};
    size_t words = hd.in == IN_BF16 ? pairs_words(T, T) + pairs_words(T, HS) + rows_words(T, HS) +
                                          pairs_words(HS, T)
                                    : 4 * (size_t)(T * HS) + (size_t)(T * T);
    int parts = cddp__cpu_parts(B * NH, 1);
    size_t floats = cddp__up16((size_t)(T * T)) + (hd.in == IN_BF16 ? 0 : (size_t)(T * HS));
    if (!heads_scratch(q, &hd, parts, floats, hd.in == IN_F32 ? 0 : words)) return;
    cddp__cpu_split(B * NH, 1, parts, attention_grad_heads, &hd);
}

/* Per batch element b, head h and new position i = past + t: the scores of its query against the
 * cached keys 0..i, their softmax, and the values mixed by it. A query is one row (T = 1 once the
 * prompt is in), so these are dot products and scaled sums over the cache's rows, in the order
 * the full attention adds them (position by position). */
void cddp__cpu_attention_cached(cddp__kq *q, const cddp__k_attention_cached *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH, L = a->L, past = a->past;
    float *s = cddp__kq_scratch(q, (size_t)(past + T) * sizeof(float));
    if (!s) return;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++) {
        float *kv = a->cache + b * L * 2 * C; /* row j: position j's key, then its value */
        const float *qkv = a->qkv + b * T * 3 * C;
        for (int64_t t = 0; t < T; t++)
            memcpy(kv + (past + t) * 2 * C, qkv + t * 3 * C + C, 2 * (size_t)C * sizeof(float));
        for (int64_t t = 0; t < T; t++) {
            int64_t i = past + t;
            for (int64_t h = 0; h < NH; h++) {
                const float *qh = qkv + t * 3 * C + h * HS;
                for (int64_t j = 0; j <= i; j++)
                    s[j] = scale * cddp__dot(qh, kv + j * 2 * C + h * HS, HS);
                float sum = cddp__exp_shifted(s, cddp__max(s, i + 1), s, i + 1);
                float *o = a->out + (b * T + t) * C + h * HS;
                memset(o, 0, (size_t)HS * sizeof(float));
                for (int64_t j = 0; j <= i; j++) {
                    const float *v = kv + j * 2 * C + C + h * HS;
                    float w = s[j] / sum;
                    for (int64_t d = 0; d < HS; d++) o[d] += w * v[d];
                }
            }
        }
    }
}
