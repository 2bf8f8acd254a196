/* llama.c: the CPU's kernels for Llama's pieces (tensor/kernels.h): RMSNorm, SwiGLU's gate and
 * rotary positions, each with its backward; and grouped-query attention's packing of q, k and v
 * for the attention kernels.
 *
 * Rows (RMSNorm, rotary) and elements (the gate) are independent, so each kernel splits them
 * across the math threads and gives the same bits at any thread count; RMSNorm's weight gradient
 * sums over rows, so it is split by columns instead, each column summed over every row in order.
 * Sums of squares are in double: a row of 4096 float32 squares summed in float32 loses digits
 * the reference keeps.
 */
#include "tensor/cpu/cpu.h"

#include <math.h>
#include <string.h>

/* ---- RMSNorm -------------------------------------------------------------------------------- */

static void rms_norm_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_rms_norm *a = arg;
    int64_t C = a->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->x + r * C;
        float *y = a->y + r * C;
        double ss = 0;
        for (int64_t i = 0; i < C; i++) ss += (double)x[i] * x[i];
        float rstd = (float)(1.0 / sqrt(ss / (double)C + (double)a->eps));
        a->rstd[r] = rstd;
        for (int64_t i = 0; i < C; i++) y[i] = x[i] * rstd * (a->w ? a->w[i] : 1.0f);
    }
}

void cddp__cpu_rms_norm(cddp__kq *q, const cddp__k_rms_norm *a) {
    (void)q;
    cddp__cpu_split_rows(a->rows, a->C, rms_norm_part, a);
}

/* With h = x rstd and y = w h per row of C: dh = w dy and, as rstd depends on x,
 * dx = rstd (dh - h mean(dh h)). */
static void rms_norm_dx_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_rms_norm_grad *a = arg;
    int64_t C = a->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->x + r * C, *dy = a->dy + r * C;
        float *dx = a->dx + r * C, rstd = a->rstd[r];
        double dot = 0; /* mean over the row of dh h */
        for (int64_t i = 0; i < C; i++)
            dot += (double)(dy[i] * (a->w ? a->w[i] : 1.0f)) * (x[i] * rstd);
        float m = (float)(dot / (double)C);
        for (int64_t i = 0; i < C; i++) {
            float g = rstd * (dy[i] * (a->w ? a->w[i] : 1.0f) - x[i] * rstd * m);
            dx[i] = a->assign ? g : dx[i] + g;
        }
    }
}

/* dw += sum over rows of dy h, columns lo..hi. */
static void rms_norm_dw_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_rms_norm_grad *a = arg;
    for (int64_t i = lo; i < hi; i++) {
        double s = 0;
        for (int64_t r = 0; r < a->rows; r++)
            s += (double)a->dy[r * a->C + i] * (a->x[r * a->C + i] * a->rstd[r]);
        a->dw[i] += (float)s;
    }
}

void cddp__cpu_rms_norm_grad(cddp__kq *q, const cddp__k_rms_norm_grad *a) {
    (void)q;
    if (a->dx) cddp__cpu_split_rows(a->rows, a->C, rms_norm_dx_part, a);
    if (a->dw) cddp__cpu_split_cols(a->rows, a->C, rms_norm_dw_part, a);
}

/* ---- SwiGLU's gate -------------------------------------------------------------------------- */

static float sigmoid(float v) {
    return 1.0f / (1.0f + expf(-v));
}

static void silu_mul_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_silu_mul *a = arg;
    for (int64_t i = lo; i < hi; i++) a->y[i] = a->g[i] * sigmoid(a->g[i]) * a->u[i];
}

void cddp__cpu_silu_mul(cddp__kq *q, const cddp__k_silu_mul *a) {
    (void)q;
    cddp__cpu_split_values(a->n, silu_mul_part, a);
}

/* y = g s(g) u: dy/du = g s(g); dy/dg = u s(g) (1 + g (1 - s(g))). */
static void silu_mul_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_silu_mul_grad *a = arg;
    for (int64_t i = lo; i < hi; i++) {
        float g = a->g[i], s = sigmoid(g), dy = a->dy[i];
        if (a->dg) {
            float d = dy * a->u[i] * s * (1.0f + g * (1.0f - s));
            a->dg[i] = a->assign_g ? d : a->dg[i] + d;
        }
        if (a->du) {
            float d = dy * g * s;
            a->du[i] = a->assign_u ? d : a->du[i] + d;
        }
    }
}

void cddp__cpu_silu_mul_grad(cddp__kq *q, const cddp__k_silu_mul_grad *a) {
    (void)q;
    cddp__cpu_split_values(a->n, silu_mul_grad_part, a);
}

/* ---- rotary positions ----------------------------------------------------------------------- */

/* Each row's heads: (x1, x2) = (x[i], x[i + D/2]) -> (x1 cos - x2 sin, x2 cos + x1 sin), the
 * angle pos inv_freq[i] computed in float32 as the reference computes it; the inverse turns by
 * minus the angle, which is the forward's transpose: the backward. */
static void rope_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_rope *a = arg;
    int64_t D = a->D, half = D / 2, width = a->H * D;
    for (int64_t r = lo; r < hi; r++) {
        float pos = (float)(a->pos0 + r % a->T);
        for (int64_t i = 0; i < half; i++) {
            float angle = pos * a->inv_freq[i], c = cosf(angle);
            float s = a->inverse ? -sinf(angle) : sinf(angle);
            for (int64_t h = 0; h < a->H; h++) {
                const float *x = a->x + r * width + h * D;
                float *y = a->y + r * width + h * D;
                float y1 = x[i] * c - x[i + half] * s, y2 = x[i + half] * c + x[i] * s;
                y[i] = a->assign ? y1 : y[i] + y1;
                y[i + half] = a->assign ? y2 : y[i + half] + y2;
            }
        }
    }
}

void cddp__cpu_rope(cddp__kq *q, const cddp__k_rope *a) {
    (void)q;
    cddp__cpu_split_rows(a->rows, a->H * a->D, rope_part, a);
}

/* ---- grouped-query attention's packing ------------------------------------------------------ */

static void qkv_pack_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_qkv_pack *a = arg;
    int64_t D = a->D, C = a->H * D, KVC = a->KV * D, rep = a->H / a->KV;
    for (int64_t r = lo; r < hi; r++) {
        float *out = a->qkv + r * 3 * C;
        memcpy(out, a->q + r * C, (size_t)C * sizeof(float));
        for (int64_t h = 0; h < a->H; h++) {
            memcpy(out + C + h * D, a->k + r * KVC + h / rep * D, (size_t)D * sizeof(float));
            memcpy(out + 2 * C + h * D, a->v + r * KVC + h / rep * D, (size_t)D * sizeof(float));
        }
    }
}

void cddp__cpu_qkv_pack(cddp__kq *q, const cddp__k_qkv_pack *a) {
    (void)q;
    cddp__cpu_split_rows(a->rows, 3 * a->H * a->D, qkv_pack_part, a);
}

/* dk (or dv) of one row: each kv head the sum of its heads' gradients, in head order. */
static void kv_grad(const float *d, float *dkv, bool assign, int64_t H, int64_t KV, int64_t D) {
    int64_t rep = H / KV;
    for (int64_t g = 0; g < KV; g++)
        for (int64_t i = 0; i < D; i++) {
            float s = 0;
            for (int64_t h = g * rep; h < (g + 1) * rep; h++) s += d[h * D + i];
            dkv[g * D + i] = assign ? s : dkv[g * D + i] + s;
        }
}

static void qkv_pack_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_qkv_pack_grad *a = arg;
    int64_t D = a->D, C = a->H * D, KVC = a->KV * D;
    for (int64_t r = lo; r < hi; r++) {
        const float *d = a->dqkv + r * 3 * C;
        for (int64_t i = 0; a->dq && i < C; i++)
            a->dq[r * C + i] = a->assign_q ? d[i] : a->dq[r * C + i] + d[i];
        if (a->dk) kv_grad(d + C, a->dk + r * KVC, a->assign_k, a->H, a->KV, D);
        if (a->dv) kv_grad(d + 2 * C, a->dv + r * KVC, a->assign_v, a->H, a->KV, D);
    }
}

void cddp__cpu_qkv_pack_grad(cddp__kq *q, const cddp__k_qkv_pack_grad *a) {
    (void)q;
    cddp__cpu_split_rows(a->rows, 3 * a->H * a->D, qkv_pack_grad_part, a);
}
