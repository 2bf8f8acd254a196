/* tensor/cuda/lt.h: cuBLASLt, opened at run time (lt.c) for the CUDA device's GEMMs (gemm.c).
 *
 * cuBLASLt is opened (dlopen) when the first GPU is, so that a cddp built with the toolkit needs
 * none of its libraries until a program asks for a GPU, and a machine without it is told which
 * library is missing. */
#ifndef CDDP_TENSOR_CUDA_LT_H
#define CDDP_TENSOR_CUDA_LT_H

#include "tensor/cuda/cuda.h"

#include <cublasLt.h>

/* The cuBLASLt functions cddp calls, by their names. */
#define CDDP__LT_FUNCTIONS(X)                                                                      \
    X(cublasLtCreate)                                                                              \
    X(cublasLtMatmulDescCreate)                                                                    \
    X(cublasLtMatmulDescDestroy)                                                                   \
    X(cublasLtMatmulDescSetAttribute)                                                              \
    X(cublasLtMatrixLayoutCreate)                                                                  \
    X(cublasLtMatrixLayoutDestroy)                                                                 \
    X(cublasLtMatrixLayoutSetAttribute)                                                            \
    X(cublasLtMatmulPreferenceCreate)                                                              \
    X(cublasLtMatmulPreferenceDestroy)                                                             \
    X(cublasLtMatmulPreferenceSetAttribute)                                                        \
    X(cublasLtMatmulAlgoGetHeuristic)                                                              \
    X(cublasLtMatmul)

typedef struct cddp__cuda_lt {
#define CDDP__LT_POINTER(name) __typeof__(&name) name;
    CDDP__LT_FUNCTIONS(CDDP__LT_POINTER)
#undef CDDP__LT_POINTER
    cublasLtHandle_t handle;
} cddp__cuda_lt;

/* cuBLASLt, loaded and started on the first call (cddp__cuda_lt_init, in cuda.h, says why not);
 * NULL when it could not be. */
const cddp__cuda_lt *cddp__cuda_lt_get(void);

#endif
