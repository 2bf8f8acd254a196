/* attn_products.c: causal self-attention as batched matrix products and row softmaxes on a
 * device's own kernels (its gemm with a batch, causal_softmax and causal_softmax_grad), with the
 * attention and attention_grad kernels' arguments and results (kernels.h), for a device whose
 * matrix products are its fastest kernels (the CUDA device's are cuBLASLt's).
 *
 * Per batch element b, the heads are one batch of products: head h's q, k and v are (T, HS)
 * matrices with rows 3C floats apart, HS floats from head to head, its slice of out (T, HS) with
 * rows C apart, and its weights P (T, T) T*T floats from head to head. The products cover the
 * whole (T, T) square; the causal softmax zeroes what lies above the diagonal, and so does its
 * backward, whose P is zero there. In bf16 (compute) the gemm rounds each product's operands, as
 * the CPU's attention kernels round q, k, v, P, the output's gradient and dS. */
#include "tensor/device.h"

#include <math.h>

/* Batched products of one batch element's heads: C_h (+)= alpha op(A_h) op(B_h), h < NH. */
typedef struct heads {
    int64_t NH, M, N, K;
    cddp_dtype compute;
} heads;

static void products(cddp__kq *q, const heads *h, bool ta, bool tb, float alpha, const float *A,
                     int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta,
                     float *C, int64_t ldc, int64_t sc) {
    CDDP__K(q, gemm, .ta = ta, .tb = tb, .M = h->M, .N = h->N, .K = h->K, .alpha = alpha, .A = A,
            .lda = lda, .B = B, .ldb = ldb, .beta = beta, .C = C, .ldc = ldc, .compute = h->compute,
            .batch = h->NH, .stride_a = sa, .stride_b = sb, .stride_c = sc);
}

/* S = q k^T / sqrt(HS) into P, P = causal softmax(S), out = P v (and out16 rounded). */
void cddp__attention_by_products(cddp__kq *q, const cddp__k_attention *a) {
    int64_t T = a->T, C = a->C, NH = a->NH, HS = C / NH, TT = T * T;
    float scale = 1.0f / sqrtf((float)HS);
    heads scores = {NH, T, T, HS, a->compute}, mix = {NH, T, HS, T, a->compute};
    for (int64_t b = 0; b < a->B; b++) {
        const float *x = a->qkv + b * T * 3 * C;
        products(q, &scores, false, true, scale, x, 3 * C, HS, x + C, 3 * C, HS, 0.0f,
                 a->p + b * NH * TT, T, TT);
    }
    CDDP__K(q, causal_softmax, .s = a->p, .rows = a->B * NH * T, .T = T);
    for (int64_t b = 0; b < a->B; b++) {
        const float *x = a->qkv + b * T * 3 * C;
        products(q, &mix, false, false, 1.0f, a->p + b * NH * TT, T, TT, x + 2 * C, 3 * C, HS, 0.0f,
                 a->out + b * T * C, C, HS);
    }
    if (a->out16) /* for the projection after it (mixed precision's linear) */
        CDDP__K(q, to_bf16, .dst = a->out16, .src = a->out, .rows = a->B * T, .cols = C, .ld = C);
}

/* With do the output's gradient: dv (+)= P^T do; dP = do v^T; dS = P (dP - rowsum(dP P)) (the
 * softmax's backward, in dP's place, only where P is not zero); dq (+)= dS k / sqrt(HS);
 * dk (+)= dS^T q / sqrt(HS). dP, then dS, takes B NH T T floats of scratch. */
void cddp__attention_grad_by_products(cddp__kq *q, const cddp__k_attention_grad *a) {
    int64_t T = a->T, C = a->C, NH = a->NH, HS = C / NH, TT = T * T, n = a->B * NH * TT;
    float *ds = cddp__kq_scratch(q, (size_t)n * sizeof(float));
    if (!ds) return;
    float scale = 1.0f / sqrtf((float)HS), beta = a->assign ? 0.0f : 1.0f;
    heads tall = {NH, T, HS, T, a->compute}, square = {NH, T, T, HS, a->compute};
    for (int64_t b = 0; b < a->B; b++) {
        const float *x = a->qkv + b * T * 3 * C, *g = a->dout + b * T * C;
        float *dx = a->dqkv + b * T * 3 * C;
        products(q, &tall, true, false, 1.0f, a->p + b * NH * TT, T, TT, g, C, HS, beta, dx + 2 * C,
                 3 * C, HS);
        products(q, &square, false, true, 1.0f, g, C, HS, x + 2 * C, 3 * C, HS, 0.0f,
                 ds + b * NH * TT, T, TT);
    }
    CDDP__K(q, causal_softmax_grad, .p = a->p, .d = ds, .rows = a->B * NH * T, .T = T);
    for (int64_t b = 0; b < a->B; b++) {
        const float *x = a->qkv + b * T * 3 * C, *d = ds + b * NH * TT;
        float *dx = a->dqkv + b * T * 3 * C;
        products(q, &tall, false, false, scale, d, T, TT, x + C, 3 * C, HS, beta, dx, 3 * C, HS);
        products(q, &tall, true, false, scale, d, T, TT, x, 3 * C, HS, beta, dx + C, 3 * C, HS);
    }
}
