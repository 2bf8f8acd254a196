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

void cddp__cpu_layer_norm(cddp__kq *q, const cddp__k_layer_norm *a) {
    const float *w = a->w ? a->w : unit(q, a->C, 1.0f);
    const float *b = a->b ? a->b : unit(q, a->C, 0.0f);
    if (!w || !b) return;
    cddp__layer_norm_rows(a->x, w, b, a->y, a->mean, a->rstd, a->rows, a->C, a->eps);
}

/* With h = (x - mean) rstd and y = w h + b, per row of C features:
 * db += dy, dw += dy h, and, as mean and rstd depend on x,
 * dx += rstd (w dy - mean(w dy) - h mean(w dy h)). */
void cddp__cpu_layer_norm_grad(cddp__kq *q, const cddp__k_layer_norm_grad *a) {
    float *scratch = cddp__kq_scratch(q, 2 * (size_t)a->C * sizeof(float));
    const float *w = a->w ? a->w : unit(q, a->C, 1.0f);
    if (!scratch || !w) return;
    cddp__layer_norm_grad(a->x, w, a->dy, a->mean, a->rstd, a->dx, a->assign, a->dw, a->db, a->rows,
                          a->C, scratch);
}

/* Row t of P (T long): softmax of s[0..t] (the scores of positions up to t), zeros after. */
static void causal_softmax_row(float *s, int64_t t, int64_t T) {
    float sum = cddp__exp_shifted(s, cddp__max(s, t + 1), s, t + 1);
    cddp__scale_into(s, 1.0f / sum, t + 1);
    memset(s + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
}

/* Per batch element b and head h, with q, k, v the head's (T, HS) slices of qkv (rows 3C apart)
 * and o its slice of out (rows C apart):
 *   P = causal softmax(q k^T / sqrt(HS)),  o = P v   (attn.c's loops, the masked half skipped). */
void cddp__cpu_attention(cddp__kq *q, const cddp__k_attention *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    float *kt = cddp__kq_scratch(q, (size_t)(HS * T) * sizeof(float));
    if (!kt) return;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *qh = a->qkv + b * T * 3 * C + h * HS, *k = qh + C, *v = qh + 2 * C;
            float *ph = a->p + (b * NH + h) * T * T;
            cddp__attn_transpose(k, 3 * C, T, HS, kt);
            cddp__attn_scores(qh, 3 * C, kt, T, HS, scale, ph);
            for (int64_t t = 0; t < T; t++) causal_softmax_row(ph + t * T, t, T);
            cddp__attn_mix(ph, v, 3 * C, T, HS, 1.0f, a->out + b * T * C + h * HS, C, false);
        }
}

/* With do the head's slice of the output's gradient:
 *   dv += P^T do;  dP = do v^T;  dS = P * (dP - rowsum(dP * P))  (the softmax's backward, zero
 *   above the diagonal since P is);  dq += dS k / sqrt(HS);  dk += dS^T q / sqrt(HS). */
void cddp__cpu_attention_grad(cddp__kq *q, const cddp__k_attention_grad *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    float *ds = cddp__kq_scratch(q, (size_t)(T * T) * sizeof(float));
    float *vt = cddp__kq_scratch(q, (size_t)(HS * T) * sizeof(float));
    if (!ds || !vt) return;
    bool acc = !a->assign;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *qh = a->qkv + b * T * 3 * C + h * HS, *k = qh + C, *v = qh + 2 * C;
            float *dq = a->dqkv + b * T * 3 * C + h * HS, *dk = dq + C, *dv = dq + 2 * C;
            const float *ph = a->p + (b * NH + h) * T * T;
            const float *dout = a->dout + b * T * C + h * HS;
            cddp__attn_mix_t(ph, dout, C, T, HS, 1.0f, dv, 3 * C, acc);
            cddp__attn_transpose(v, 3 * C, T, HS, vt);
            cddp__attn_scores(dout, C, vt, T, HS, 1.0f, ds);
            for (int64_t t = 0; t < T; t++) {
                const float *pr = ph + t * T;
                float *dr = ds + t * T;
                float dot = cddp__dot(dr, pr, t + 1);
                for (int64_t j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - dot);
                memset(dr + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
            }
            cddp__attn_mix(ds, k, 3 * C, T, HS, scale, dq, 3 * C, acc);
            cddp__attn_mix_t(ds, qh, 3 * C, T, HS, scale, dk, 3 * C, acc);
        }
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
