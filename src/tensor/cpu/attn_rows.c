/* attn_rows.c: causal self-attention by rows (flash_attention and its backward, tensor/kernels.h):
 * the reference the CUDA device's flash kernels are tested against, and what the emulated device
 * runs where the CUDA device would run them (so CI takes the GPU's path through the op). Plain
 * loops, one query at a time; the CPU device itself keeps the weights (attends_by_rows: never),
 * its attention kernels being faster for the contexts it trains.
 *
 * Per batch element b and head h, with q, k, v the head's (T, HS) slices of qkv (in bf16 rounded
 * once, into scratch) and s_j = q_i k_j / sqrt(HS) for j <= i:
 *   forward:  m = max s, e_j = exp(s_j - m), l = sum e, lse_i = m + log l,
 *             o_i = sum e_j v_j / l
 *   backward: D_i = dout_i out_i, p_j = exp(s_j - lse_i), dP_j = dout_i v_j,
 *             dS_j = p_j (dP_j - D_i); dv_j += p_j dout_i, dq_i += dS_j k_j / sqrt(HS),
 *             dk_j += dS_j q_i / sqrt(HS)
 * In bf16, e (forward) and p, dout, dS (backward) are rounded where they enter a product. */
#include "tensor/cpu/cpu.h"

#include <math.h>

static float rounded(float x, bool bf16) {
    return bf16 ? cddp__bf16_rounded(x) : x;
}

/* A head's (T, HS) slice (rows ld apart) into dst (dense), rounded in bf16. */
static void head_copy(float *dst, const float *src, int64_t ld, int64_t T, int64_t HS, bool bf16) {
    if (bf16) {
        cddp__bf16_round_rows(dst, src, ld, T, HS);
        return;
    }
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * HS, src + t * ld, (size_t)HS * sizeof(float));
}

/* Head h of batch element b's q, k and v (dense, into w: 3 T HS floats): from qkv16 where the
 * kernel has it (already rounded: widened), else from qkv. */
static void head_qkv(float *w, const float *qkv, const uint16_t *qkv16, int64_t b, int64_t h,
                     int64_t T, int64_t C, int64_t HS, bool bf16) {
    int64_t at = b * T * 3 * C + h * HS;
    for (int part = 0; part < 3; part++) {
        float *dst = w + part * T * HS;
        if (!qkv16) {
            head_copy(dst, qkv + at + part * C, 3 * C, T, HS, bf16);
            continue;
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t d = 0; d < HS; d++)
                dst[t * HS + d] = cddp__bf16_widen(qkv16[at + part * C + t * 3 * C + d]);
    }
}

void cddp__cpu_flash_attention(cddp__kq *q, const cddp__k_flash_attention *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    bool bf16 = a->compute == CDDP_BF16;
    float *w = cddp__kq_scratch(q, (size_t)(3 * T * HS + T) * sizeof(float));
    if (!w) return;
    float *qh = w, *kh = qh + T * HS, *vh = kh + T * HS, *e = vh + T * HS;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            head_qkv(w, a->qkv, a->qkv16, b, h, T, C, HS, bf16);
            for (int64_t i = 0; i < T; i++) {
                float m = -INFINITY, l = 0.0f;
                for (int64_t j = 0; j <= i; j++) {
                    e[j] = scale * cddp__dot(qh + i * HS, kh + j * HS, HS);
                    m = fmaxf(m, e[j]);
                }
                for (int64_t j = 0; j <= i; j++) {
                    e[j] = expf(e[j] - m);
                    l += e[j];
                    e[j] = rounded(e[j], bf16);
                }
                float *o = a->out + (b * T + i) * C + h * HS;
                for (int64_t d = 0; d < HS; d++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j <= i; j++) acc += e[j] * vh[j * HS + d];
                    o[d] = acc / l;
                }
                a->lse[(b * NH + h) * T + i] = m + logf(l);
            }
        }
    if (a->out16) cddp__to_bf16_rows(a->out16, C, a->out, C, B * T, C);
}

/* Stores (assign) or adds a head's dense (T, HS) gradient into its slice of dqkv. */
static void head_put(float *dst, int64_t ld, const float *src, int64_t T, int64_t HS, bool assign) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < HS; d++)
            dst[t * ld + d] = assign ? src[t * HS + d] : dst[t * ld + d] + src[t * HS + d];
}

void cddp__cpu_flash_attention_grad(cddp__kq *q, const cddp__k_flash_attention_grad *a) {
    int64_t B = a->B, T = a->T, C = a->C, NH = a->NH, HS = C / NH;
    bool bf16 = a->compute == CDDP_BF16;
    float *w = cddp__kq_scratch(q, (size_t)(7 * T * HS) * sizeof(float));
    if (!w) return;
    float *qh = w, *kh = qh + T * HS, *vh = kh + T * HS, *gh = vh + T * HS, *dq = gh + T * HS,
          *dk = dq + T * HS, *dv = dk + T * HS;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            head_qkv(w, a->qkv, a->qkv16, b, h, T, C, HS, bf16);
            head_copy(gh, a->dout + b * T * C + h * HS, C, T, HS, bf16);
            memset(dq, 0, (size_t)(3 * T * HS) * sizeof(float));
            for (int64_t i = 0; i < T; i++) {
                const float *gi = a->dout + (b * T + i) * C + h * HS,
                            *oi = a->out + (b * T + i) * C + h * HS;
                float D = cddp__dot(gi, oi, HS), lse = a->lse[(b * NH + h) * T + i];
                for (int64_t j = 0; j <= i; j++) {
                    float p = expf(scale * cddp__dot(qh + i * HS, kh + j * HS, HS) - lse);
                    float ds = p * (cddp__dot(gh + i * HS, vh + j * HS, HS) - D);
                    float p16 = rounded(p, bf16), ds16 = rounded(ds, bf16) * scale;
                    for (int64_t d = 0; d < HS; d++) {
                        dv[j * HS + d] += p16 * gh[i * HS + d];
                        dq[i * HS + d] += ds16 * kh[j * HS + d];
                        dk[j * HS + d] += ds16 * qh[i * HS + d];
                    }
                }
            }
            float *dx = a->dqkv + b * T * 3 * C + h * HS;
            head_put(dx, 3 * C, dq, T, HS, a->assign);
            head_put(dx + C, 3 * C, dk, T, HS, a->assign);
            head_put(dx + 2 * C, 3 * C, dv, T, HS, a->assign);
        }
}

bool cddp__cpu_attends_by_rows(int64_t B, int64_t T, int64_t NH, int64_t HS, cddp_dtype compute) {
    (void)B, (void)T, (void)NH, (void)HS, (void)compute;
    return false;
}

bool cddp__gpu_attends_by_rows(int64_t B, int64_t T, int64_t NH, int64_t HS, cddp_dtype compute) {
    return compute == CDDP_BF16 && (HS == 32 || HS == 64) && T > 0 && B * NH <= 65535;
}
