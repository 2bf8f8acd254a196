/* gemm.c: the CUDA device's gemm kernel on cuBLASLt (opened at run time: lt.c).
 *
 * The products are float32 with float32 accumulation (CUBLAS_COMPUTE_32F: no TF32), the CPU's
 * results to rounding; with compute CDDP_BF16 the float32 operands are rounded to bf16 for the
 * tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF), the sums float32, or the operands come rounded
 * already (A16 and B16, to_bf16's: half the bytes to read, and bf16 kernels at their rate), and a
 * bias is added by the product's epilogue (CUBLASLT_EPILOGUE_BIAS) instead of a pass of its own.
 *
 * cuBLASLt is column-major and cddp row-major: a row-major (M,N) matrix C is the column-major
 * (N,M) matrix C^T, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the stored B as
 * cuBLASLt's first operand, transposed when tb, the stored A as its second, transposed when ta.
 *
 * A product's plan (its descriptors and the algorithm cuBLASLt's heuristic picked) is made once per
 * shape and kept: a training step multiplies the same shapes every time, and asking the heuristic
 * costs more than a small product. The heuristic is told how the pointers are aligned (it assumes
 * 256 bytes otherwise; a view into a tensor may be aligned to 4), so the alignment is part of the
 * shape. A batch of products (attention's heads) is one call: the layouts' batch count and
 * strides. */
#include "tensor/cuda/lt.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

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

/* One product's plan; `used` once made. */
typedef struct plan {
    bool used, ok;
    int dev;
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    int64_t batch, stride[3]; /* a batch of products (batch > 1): A's, B's and C's strides */
    uint32_t align[3];        /* of A, B, C (and of their strides in a batch) */
    cddp_dtype compute; /* float32, or bf16 on the tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF) */
    bool half;          /* the operands bf16 in memory (A16, B16) */
    bool bias;          /* a bias added by the epilogue */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t ws_bytes;
} plan;

#define PLANS 512 /* distinct shapes kept; past that, a plan is made for each call */
static plan plans[PLANS];
static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;

static uint32_t alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t n = 4;
    while (n < 256 && !(a & (2 * n - 1))) n *= 2;
    return n;
}

static bool same_shape(const plan *p, const plan *k) {
    return p->dev == k->dev && p->ta == k->ta && p->tb == k->tb && p->M == k->M && p->N == k->N &&
           p->K == k->K && p->lda == k->lda && p->ldb == k->ldb && p->ldc == k->ldc &&
           p->compute == k->compute && p->half == k->half && p->bias == k->bias &&
           p->batch == k->batch && !memcmp(p->stride, k->stride, sizeof p->stride) &&
           !memcmp(p->align, k->align, sizeof p->align);
}

static void unmake(const cddp__cuda_lt *lt, plan *p) {
    if (p->lc) lt->cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) lt->cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) lt->cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) lt->cublasLtMatmulDescDestroy(p->op);
    p->op = NULL, p->la = p->lb = p->lc = NULL;
}

/* A layout made one of a batch of `count` matrices `stride` floats apart. */
static bool batched(const cddp__cuda_lt *lt, cublasLtMatrixLayout_t l, int64_t count,
                    int64_t stride) {
    int32_t n = (int32_t)count;
    return lt->cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                                sizeof n) == 0 &&
           lt->cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof stride) == 0;
}

/* Fills p's descriptors and algorithm (p->ok says whether cuBLASLt has one for the shape). */
static void make(const cddp__cuda_lt *lt, plan *p, size_t ws_bytes) {
    cublasOperation_t ta = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    p->ws_bytes = ws_bytes;
    cublasComputeType_t type = p->half                   ? CUBLAS_COMPUTE_32F
                               : p->compute == CDDP_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                         : CUBLAS_COMPUTE_32F;
    cudaDataType_t in = p->half ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtEpilogue_t epilogue = p->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    /* first operand: the stored B, (N, K) column-major when not tb, else (K, N); its alignment is
     * B's, cuBLASLt's "A" */
    p->ok =
        lt->cublasLtMatmulDescCreate(&p->op, type, CUDA_R_32F) == 0 &&
        lt->cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
            0 &&
        lt->cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
            0 &&
        lt->cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof epilogue) == 0 &&
        lt->cublasLtMatrixLayoutCreate(&p->la, in, (uint64_t)(p->tb ? p->K : p->N),
                                       (uint64_t)(p->tb ? p->N : p->K), p->ldb) == 0 &&
        lt->cublasLtMatrixLayoutCreate(&p->lb, in, (uint64_t)(p->ta ? p->M : p->K),
                                       (uint64_t)(p->ta ? p->K : p->M), p->lda) == 0 &&
        lt->cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)p->N, (uint64_t)p->M,
                                       p->ldc) == 0 &&
        (p->batch <= 1 || (batched(lt, p->la, p->batch, p->stride[1]) &&
                           batched(lt, p->lb, p->batch, p->stride[0]) &&
                           batched(lt, p->lc, p->batch, p->stride[2]))) &&
        lt->cublasLtMatmulPreferenceCreate(&pref) == 0 &&
        lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws_bytes, sizeof ws_bytes) == 0 &&
        lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &p->align[1], sizeof p->align[1]) == 0 &&
        lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &p->align[0], sizeof p->align[0]) == 0 &&
        lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &p->align[2], sizeof p->align[2]) == 0 &&
        lt->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &p->align[2], sizeof p->align[2]) == 0 &&
        lt->cublasLtMatmulAlgoGetHeuristic(lt->handle, p->op, p->la, p->lb, p->lc, p->lc, pref, 1,
                                           &best, &found) == 0 &&
        found > 0;
    if (pref) lt->cublasLtMatmulPreferenceDestroy(pref);
    if (p->ok) p->algo = best.algo;
}

/* The kept plan for k's shape, made on first use; or NULL when every slot is taken (then the
 * caller makes one of its own). */
static const plan *plan_for(const cddp__cuda_lt *lt, const plan *k, size_t ws_bytes) {
    uint64_t h = 1469598103934665603ull;
    const int64_t v[] = {k->dev,       k->ta,        k->tb,      k->M,     k->N,
                         k->K,         k->lda,       k->ldb,     k->ldc,   k->align[0],
                         k->align[1],  k->align[2],  k->compute, k->batch, k->stride[0],
                         k->stride[1], k->stride[2], k->half,    k->bias};
    for (size_t i = 0; i < CDDP_ARRAY_LEN(v); i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    const plan *found = NULL;
    pthread_mutex_lock(&plans_lock);
    for (int probe = 0; probe < PLANS && !found; probe++) {
        plan *p = &plans[(h + (uint64_t)probe) % PLANS];
        if (p->used && same_shape(p, k)) {
            found = p;
        } else if (!p->used) {
            *p = *k;
            make(lt, p, ws_bytes);
            p->used = true;
            found = p;
        }
    }
    pthread_mutex_unlock(&plans_lock);
    return found;
}

void cddp__cuda_gemm(cddp__kq *q, const cddp__k_gemm *a) {
    bool half = a->A16 || a->B16;
    CDDP_CHECK(!half || (a->A16 && a->B16 && a->compute == CDDP_BF16 && a->batch <= 1),
               "%s: a product with bf16 operands takes both rounded (A16 and B16), compute bf16 "
               "and no batch",
               q->dev->name);
    CDDP_CHECK(!a->bias || (a->alpha == 1.0f && a->batch <= 1),
               "%s: a product's bias goes with alpha 1 and no batch", q->dev->name);
    CDDP_CHECK(a->batch <= 1 || a->K > 0, "%s: a batch of products with K = 0", q->dev->name);
    cudaStream_t stream = cddp__cuda_enter(q);
    if (a->M == 0 || a->N == 0) return;
    if (a->K == 0 && a->bias) { /* C = bias + beta C: as the CPU's, a case no product makes */
        cddp__kq_fail(q, CDDP_EINVAL, "%s: a product with K = 0 and a bias", q->dev->name);
        return;
    }
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
    void *ws = workspace_of(q->dev);
    size_t ws_bytes = ws ? WORKSPACE : 0;
    plan key = {.dev = q->dev->index,
                .ta = a->ta,
                .tb = a->tb,
                .M = a->M,
                .N = a->N,
                .K = a->K,
                .lda = a->lda,
                .ldb = a->ldb,
                .ldc = a->ldc,
                .batch = a->batch > 1 ? a->batch : 1,
                .compute = a->compute,
                .half = half,
                .bias = a->bias != NULL};
    const void *A = half ? (const void *)a->A16 : a->A, *B = half ? (const void *)a->B16 : a->B;
    const float *at[3] = {A, B, a->C};
    int64_t stride[3] = {a->stride_a, a->stride_b, a->stride_c};
    for (int i = 0; i < 3; i++) {
        key.stride[i] = key.batch > 1 ? stride[i] : 0;
        uint32_t by_ptr = alignment(at[i]), by_stride = alignment(at[i] + key.stride[i]);
        key.align[i] = by_ptr < by_stride ? by_ptr : by_stride; /* every matrix of the batch's */
    }
    const plan *p = plan_for(lt, &key, ws_bytes);
    if (!p) { /* the table is full: a plan for this call alone */
        make(lt, &key, ws_bytes);
        p = &key;
    }
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (p->ok) {
        /* the bias pointer is the call's: set on the plan's descriptor and read by the call, one
         * caller at a time */
        if (a->bias) pthread_mutex_lock(&plans_lock);
        if (!a->bias ||
            (s = lt->cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &a->bias, sizeof a->bias)) == 0)
            s = lt->cublasLtMatmul(lt->handle, p->op, &a->alpha, B, p->la, A, p->lb, &a->beta, a->C,
                                   p->lc, a->C, p->lc, &p->algo, ws, p->ws_bytes, stream);
        if (a->bias) pthread_mutex_unlock(&plans_lock);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        cddp__kq_fail(q, CDDP_EIO,
                      "%s: cuBLASLt cannot multiply (%lld,%lld)x(%lld,%lld) (status %d%s)",
                      q->dev->name, (long long)a->M, (long long)a->K, (long long)a->K,
                      (long long)a->N, (int)s, p->ok ? "" : ", no algorithm for the shape");
    if (p == &key) unmake(lt, &key);
}
