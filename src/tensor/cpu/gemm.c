/* gemm.c: float32 GEMM (for the gemm kernel, matmul.c, and the loops' own products), softmax rows.
 *
 * GEMM runs on oneDNN's sgemm, with one thread or several: its kernels are chosen for the machine
 * when it runs (AVX-512 where there is one), and in a process of several threads oneDNN's
 * convolutions and the GEMMs share one OpenMP pool, where OpenBLAS's own pool spun between calls
 * and took the cores from oneDNN's threads. With one thread, on a machine with AVX-512 (3 rounds
 * each, against OpenBLAS 0.3.21's SkylakeX kernels): a 4-layer GPT 16.5k -> 19.3k tokens/s
 * (backward 28 -> 22 ms per step), the MLP 33.4k -> 37.3k samples/s, the CNN 13.0k -> 13.4k; on
 * an AVX2 machine the two were level. OpenBLAS runs a product only if oneDNN refuses it (it
 * returns an error rather than compute, e.g. out of memory for its packing buffers). */
#include "tensor/cpu/cpu.h"

#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <string.h>

void cddp__gemm_ld(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        /* BLAS leaves C untouched when K is 0 only if beta is 1; make beta apply. */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    sigset_t old;
    cddp__cpu_shield(&old);
    dnnl_status_t s =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    cddp__cpu_unshield(&old);
    if (s == dnnl_success) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta,
                C, (blasint)ldc);
}

void cddp__gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                const float *B, float beta, float *C) {
    cddp__gemm_ld(ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}

void cddp__softmax_rows(const float *x, float *y, int64_t rows, int64_t C, bool take_log) {
    for (int64_t r = 0; r < rows; r++) {
        const float *a = x + r * C;
        float *b = y + r * C;
        float m = cddp__max(a, C);
        float sum = cddp__exp_shifted(a, m, b, C);
        if (take_log) {
            /* (a - m) is exact for nearby values; subtracting m + log(sum) at once would round
             * at the magnitude of m. */
            float ls = logf(sum);
            for (int64_t j = 0; j < C; j++) b[j] = (a[j] - m) - ls;
        } else {
            cddp__scale_into(b, 1.0f / sum, C);
        }
    }
}
