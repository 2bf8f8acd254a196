/* tensor/cuda/cuda.h: the CUDA device: NVIDIA GPUs, when cddp is built with the toolkit.
 *
 *   device.c    the kind (the driver asked how many GPUs there are), memory, copies, the
 *               device's stream and events, and data errors a kernel found (check_ids)
 *   gemm.c      the gemm kernel on cuBLASLt
 *   lt.c        cuBLASLt, loaded when the first device opens (dlopen: a build with CUDA runs, on
 *               the CPU, on machines without the libraries)
 *   common.cuh  what the kernel files share: block reductions, the column sums, LAUNCHED
 *   basic.cu, loss.cu, embedding.cu, optim.cu, broadcast.cu, transformer.cu, llama.cu,
 *   attention.cu  the other kernels by family, each __global__ function followed by its launcher
 *               on the stream
 *   flash.cu    attention by rows (flash attention) in bf16 on the tensor cores
 *
 * The kernels it has so far are CDDP_CUDA_KERNELS below (what the MLP, the seeds' programs, the
 * GPT and their optimizers need; tests/house/check_house.py holds the list to the launchers the
 * files define, cddp__cuda_NAME), and attention as batched products on its gemm
 * (tensor/attn_products.c); an op whose kernel it lacks fails its context naming the kernel
 * (CDDP_EUNSUPPORTED). tests/gpu/device_check.c tests every kernel against the CPU's, run by
 * scripts/gpu/check.sh on a GPU.
 */
#ifndef CDDP_TENSOR_CUDA_H
#define CDDP_TENSOR_CUDA_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" { /* the .cu files are C++: the tensor library's declarations are C's */
#endif

#include "tensor/device.h"

/* clang-format off */
#define CDDP_CUDA_KERNELS(K)                                                                       \
    K(fill) K(accumulate) K(add_rows) K(scale) K(cast16) K(mul) K(unary) K(unary_grad) K(softmax)  \
    K(softmax_grad) K(check_ids) K(cross_entropy) K(cross_entropy_grad) K(mse) K(mse_grad) K(sum)  \
    K(sum_grad) K(argmax) K(embedding) K(embedding_grad) K(sgd) K(adamw) K(lion) K(sum_squares)    \
    K(gemm) K(binary) K(binary_grad) K(layer_norm) K(layer_norm_grad) K(gelu_tanh)                 \
    K(gelu_tanh_grad)                                                                              \
    K(causal_softmax) K(causal_softmax_grad) K(attention_cached) K(to_bf16) K(flash_attention)    \
    K(flash_attention_grad) K(rms_norm) K(rms_norm_grad) K(silu_mul) K(silu_mul_grad) K(rope)      \
    K(qkv_pack) K(qkv_pack_grad)
/* clang-format on */

#define CDDP__CUDA_DECL(name) void cddp__cuda_##name(cddp__kq *q, const cddp__k_##name *a);
CDDP_CUDA_KERNELS(CDDP__CUDA_DECL)
#undef CDDP__CUDA_DECL

/* The stream q's kernels go on (the device's own), the device made current on this thread. */
cudaStream_t cddp__cuda_enter(const cddp__kq *q);
/* Reports a launch that failed (a CUDA error) through q: false when err is cudaSuccess. */
bool cddp__cuda_failed(cddp__kq *q, cudaError_t err, const char *what);

/* A kernel's data check (check_ids): the device's slot for the first bad value found, and a check
 * number to put there; the device formats the message (fmt, limit) when it is next waited for. */
typedef struct cddp__cuda_check {
    int64_t *slot; /* device memory: {check number, position, value} */
    int64_t number;
} cddp__cuda_check;
cddp__cuda_check cddp__cuda_check_begin(cddp__kq *q, const char *fmt, int64_t limit);

/* The device's memory for the blocks' sums of sum_squares (its callers take turns: device.c's
 * slot lock), CDDP__CUDA_PARTIALS doubles. */
#define CDDP__CUDA_PARTIALS 512
double *cddp__cuda_partials(const cddp__kq *q);

/* lt.c: loads cuBLASLt (once), for gemm.c; CDDP_OK or err saying what is missing. */
int cddp__cuda_lt_init(cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
