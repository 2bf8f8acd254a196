/* gemm.c: the CUDA device's gemm kernel on cuBLASLt (opened at run time: lt.c).
 *
 * The products are float32 with float32 accumulation (CUBLAS_COMPUTE_32F: no TF32), the CPU's
 * results to rounding.
 *
 * cuBLASLt is column-major and cddp row-major: a row-major (M,N) matrix C is the column-major
 * (N,M) matrix C^T, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the stored B as
 * cuBLASLt's first operand, transposed when tb, the stored A as its second, transposed when ta. */
#include "tensor/cuda/lt.h"

#include <pthread.h>

#define WORKSPACE (32u << 20)

/* A workspace for cuBLASLt on each GPU (made on first use, kept). */
static void *workspace[16];
static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;

static void *workspace_of(const cddp_device *dev) {
    pthread_mutex_lock(&ws_lock);
    void **w = &workspace[dev->index % 16];
    if (!*w && cudaMalloc(w, WORKSPACE) != cudaSuccess) *w = NULL;
    void *p = *w;
    pthread_mutex_unlock(&ws_lock);
    return p;
}

void cddp__cuda_gemm(cddp__kq *q, const cddp__k_gemm *a) {
    cudaStream_t stream = cddp__cuda_enter(q);
    if (a->M == 0 || a->N == 0) return;
    if (a->K == 0) { /* C = beta C: a scale (BLAS leaves C alone for beta 1, unread for 0) */
        if (a->beta == 1.0f) return;
        for (int64_t i = 0; i < a->M; i++) {
            if (a->beta == 0.0f)
                CDDP__K(q, fill, .dst = a->C + i * a->ldc, .n = a->N, .size = 4, .bits = 0);
            else
                CDDP__K(q, scale, .y = a->C + i * a->ldc, .x = a->C + i * a->ldc, .s = a->beta,
                        .n = a->N);
        }
        return;
    }
    const cddp__cuda_lt *lt = cddp__cuda_lt_get(); /* loaded when the device opened */
    if (!lt) {
        cddp__kq_fail(q, CDDP_EUNSUPPORTED, "%s: cuBLASLt is not loaded", q->dev->name);
        return;
    }
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t ta = a->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = a->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    void *ws = workspace_of(q->dev);
    size_t ws_bytes = ws ? WORKSPACE : 0;
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    /* first operand: the stored B, (N, K) column-major when not tb, else (K, N) */
    bool ok =
        lt->cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
        lt->cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == 0 &&
        lt->cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == 0 &&
        lt->cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, (uint64_t)(a->tb ? a->K : a->N),
                                       (uint64_t)(a->tb ? a->N : a->K), a->ldb) == 0 &&
        lt->cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, (uint64_t)(a->ta ? a->M : a->K),
                                       (uint64_t)(a->ta ? a->K : a->M), a->lda) == 0 &&
        lt->cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)a->N, (uint64_t)a->M, a->ldc) ==
            0 &&
        lt->cublasLtMatmulPreferenceCreate(&pref) == 0 &&
        lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws_bytes, sizeof ws_bytes) == 0 &&
        lt->cublasLtMatmulAlgoGetHeuristic(lt->handle, op, la, lb, lc, lc, pref, 1, &best,
                                           &found) == 0 &&
        found > 0;
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (ok)
        s = lt->cublasLtMatmul(lt->handle, op, &a->alpha, a->B, la, a->A, lb, &a->beta, a->C, lc,
                               a->C, lc, &best.algo, ws, ws_bytes, stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        cddp__kq_fail(q, CDDP_EIO,
                      "%s: cuBLASLt cannot multiply (%lld,%lld)x(%lld,%lld) (status %d%s)",
                      q->dev->name, (long long)a->M, (long long)a->K, (long long)a->K,
                      (long long)a->N, (int)s, ok ? "" : ", no algorithm for the shape");
    if (pref) lt->cublasLtMatmulPreferenceDestroy(pref);
    if (lc) lt->cublasLtMatrixLayoutDestroy(lc);
    if (lb) lt->cublasLtMatrixLayoutDestroy(lb);
    if (la) lt->cublasLtMatrixLayoutDestroy(la);
    if (op) lt->cublasLtMatmulDescDestroy(op);
}
