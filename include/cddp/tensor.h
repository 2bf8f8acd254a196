/* cddp/tensor.h: tensors, the step context, random numbers and the differentiable ops.
 *
 * A tensor is float32, int32 or int64 (bfloat16 is stored, for mixed precision to come), up to
 * 4-D, contiguous and row-major (one exception, which no program meets unless it asks: a 4-D
 * activation may be kept in oneDNN's channel-blocked layout, see "Layouts" below), on a device
 * (device.h: the CPU unless a program asks for another). Tensors made by ops live in a context's
 * step arena on their device and stay valid until cddp_ctx_reset; parameter tensors belong to a
 * model (nn.h) and are views into its flat parameter and gradient blocks.
 *
 * Ops take the context first and return a new tensor. When gradients are enabled and an input
 * requires a gradient, the op also records a node on the context's tape so that
 * cddp_backward (autograd.h) can run it in reverse. Errors that depend on data (a label out of
 * range, the arena running out) latch in the context: the op returns NULL, every later op given
 * NULL or run on a failed context returns NULL too, and cddp_ctx_status/cddp_ctx_error say what
 * happened, so a training loop checks once per step. Shape mismatches are programmer errors and
 * abort with file:line and both shapes.
 */
#ifndef CDDP_TENSOR_H
#define CDDP_TENSOR_H

#include "cddp/core.h"
#include "cddp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cddp_dtype {
    CDDP_F32 = 0,
    CDDP_I32 = 1,
    CDDP_I64 = 2,
    CDDP_BF16 = 3, /* bfloat16: float32's top 16 bits (rounded to nearest even) */
    CDDP_F16 = 4,  /* IEEE half, as files store it (safetensors' F16): read into float32; no op or
                    * tensor computes in it */
} cddp_dtype;

/* "float32", "int32", "int64", "bfloat16", "float16" */
CDDP_API const char *cddp_dtype_name(cddp_dtype dtype);
CDDP_API size_t cddp_dtype_size(cddp_dtype dtype);

#define CDDP_MAX_DIMS 4

typedef struct cddp_tensor cddp_tensor;
/* A recorded op on the context's tape (opaque; see "The tape" below). */
typedef struct cddp__node cddp_node;

/* Called once per backward, the moment param's gradient is final (see autograd.h). */
typedef void (*cddp_ready_hook)(void *user, cddp_tensor *param);

/* The fields are read-only for users; ops and the model own them. */
struct cddp_tensor {
    cddp_dtype dtype;
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    int64_t numel;
    void *data;          /* numel elements of dtype */
    float *grad;         /* float32, numel; NULL until a gradient reaches a non-parameter;
                            an op's output's is released by its backward (cddp_retain_grad) */
    bool requires_grad;  /* gradients flow to this tensor */
    bool retain_grad;    /* an op's output keeps its gradient after backward */
    bool is_param;       /* a model parameter: grad is persistent and accumulates (+=) */
    int param_index;     /* index in its model, -1 for other tensors */
    const char *name;    /* parameter name, NULL for other tensors */
    cddp_node *node;     /* the op that made it (its grad_fn), NULL for leaves */
    int block;           /* 0: row-major; else a 4-D float32 tensor in the channel-blocked layout of
                            blocks of this many channels (see "Layouts"); grad in the same layout */
    cddp_device *device; /* where data and grad are (device.h) */
    /* The library's own, not for programs (they change without notice): mixed precision's
     * 16-bit copies and the ready hook (set it with cddp_tensor_set_ready_hook). */
    struct cddp__tensor_own {
        /* NULL, or numel bf16 values: data rounded by the op that wrote it, for mixed
         * precision's products (a linear layer reads them instead of rounding data) */
        void *half;
        /* NULL, or numel bf16 values: the whole gradient, rounded by the one op that made it,
         * for the bf16 products of the op that made this tensor (a convolution's backward reads
         * them instead of rounding grad); grad is then NULL */
        void *grad_half;
        cddp_ready_hook ready_hook; /* autograd calls it when the gradient is final */
        void *ready_user;
    } own;
};

/* t's data as floats. The host may read them directly only on a host-accessible device (the
 * CPU); elsewhere read with cddp_get, cddp_item or a copy (cddp_to, cddp_device_download). */
static inline float *cddp_f32(const cddp_tensor *t) {
    return (float *)t->data;
}

/* Shape arguments are (ndim, const int64_t *shape); CDDP_SHAPE(2, 3) spells both. */
#define CDDP_SHAPE(...)                                                                            \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]) {                 \
        __VA_ARGS__                                                                                \
    }

/* Random numbers: xoshiro256** seeded through splitmix64. Two generators seeded alike produce
 * the same stream on every machine, which is how every rank draws identical initial weights. */
typedef struct cddp_rng {
    uint64_t s[4];
} cddp_rng;

CDDP_API void cddp_rng_seed(cddp_rng *rng, uint64_t seed);
CDDP_API uint64_t cddp_rng_next(cddp_rng *rng);
CDDP_API float cddp_rng_uniform(cddp_rng *rng);              /* [0, 1) with 24 random bits */
CDDP_API double cddp_rng_normal(cddp_rng *rng);              /* standard normal (Box-Muller) */
CDDP_API uint64_t cddp_rng_below(cddp_rng *rng, uint64_t n); /* uniform in [0, n), unbiased */

/* The step context: arena, tape, random generator and the no-grad switch. */
typedef struct cddp_ctx cddp_ctx;

typedef struct cddp_ctx_options {
    size_t arena_initial_bytes; /* 0: 16 MiB */
    size_t arena_max_bytes;     /* 0: CDDP_ARENA_MB (per device the context uses) */
    uint64_t seed;              /* seeds the context's generator (dropout, random tensors) */
    cddp_device *device;        /* where the tensors it creates live; NULL: the CPU */
    /* The precision of its matrix products (matmul, linear; the GPT's projections): CDDP_F32 (0,
     * the default), or CDDP_BF16 for mixed precision: the operands rounded to bf16 and their
     * products added in float32 into float32 results, as PyTorch's autocast to bfloat16 computes
     * them, on the processor's bf16 units (AVX512-BF16, AMX, a GPU's tensor cores); parameters,
     * gradients, optimizer state and every other op stay float32. A device that cannot (a CPU
     * without AVX512-BF16 or AMX) fails the context's products with the reason
     * (cddp_device_computes says so beforehand). */
    cddp_dtype compute;
} cddp_ctx_options;

/* Whether the device multiplies matrices in dtype (a context's compute: CDDP_F32, CDDP_BF16):
 * CDDP_OK with *how (when not NULL) a line for the log saying on what ("bf16 products on
 * AVX512-BF16 (oneDNN's avx512_core_bf16)"), or CDDP_EUNSUPPORTED with err saying why not. */
CDDP_API int cddp_device_computes(cddp_device *dev, cddp_dtype dtype, const char **how,
                                  cddp_error *err);

/* opts may be NULL for defaults (seed 0). NULL when out of memory. */
CDDP_API cddp_ctx *cddp_ctx_create(const cddp_ctx_options *opts);
CDDP_API void cddp_ctx_destroy(cddp_ctx *ctx);
/* Ends a step: waits for the context's work on its devices, then releases every tensor made since
 * the last reset, the tape, and a latched error. */
CDDP_API void cddp_ctx_reset(cddp_ctx *ctx);
/* The first error of the step (CDDP_OK: none), after waiting for the context's queued work (a
 * device that runs kernels later reports their failures then). */
CDDP_API int cddp_ctx_status(const cddp_ctx *ctx);
CDDP_API const char *cddp_ctx_error(const cddp_ctx *ctx);
/* Whether an error has latched so far, without waiting for queued work (a loop's cheap check; a
 * kernel's failure shows once the work is waited for, in cddp_ctx_status). */
CDDP_API bool cddp_ctx_failed(const cddp_ctx *ctx);
/* The context's device (cddp_ctx_options.device). */
CDDP_API cddp_device *cddp_ctx_device(const cddp_ctx *ctx);
/* The precision of the context's products (cddp_ctx_options.compute), and setting it for the
 * products made from now on (evaluation in float32, say); returns the old one. */
CDDP_API cddp_dtype cddp_ctx_compute(const cddp_ctx *ctx);
CDDP_API cddp_dtype cddp_ctx_set_compute(cddp_ctx *ctx, cddp_dtype dtype);
/* Waits until the context's work on every device has run; returns cddp_ctx_status. */
CDDP_API int cddp_ctx_synchronize(cddp_ctx *ctx);
/* Latches an error into the context (first one wins), for code built on top of the ops. */
CDDP_API int cddp_ctx_fail(cddp_ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CDDP_API cddp_rng *cddp_ctx_rng(cddp_ctx *ctx);
CDDP_API cddp_arena *cddp_ctx_arena(cddp_ctx *ctx);
/* Turns recording on or off (off = evaluation: no tape, no saved values); returns the old value. */
CDDP_API bool cddp_ctx_set_grad_enabled(cddp_ctx *ctx, bool enabled);
CDDP_API bool cddp_ctx_grad_enabled(const cddp_ctx *ctx);

/* Creation, on the context's device. Tensors live in the arena until the next reset. */
CDDP_API cddp_tensor *cddp_empty(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape);
CDDP_API cddp_tensor *cddp_zeros(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape);
CDDP_API cddp_tensor *cddp_ones(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape);
/* Copies numel elements of dtype from data. */
CDDP_API cddp_tensor *cddp_from_data(cddp_ctx *ctx, cddp_dtype dtype, int ndim,
                                     const int64_t *shape, const void *data);
/* Host memory (numel elements of dtype at data) as a tensor on the context's device: on the CPU a
 * view of it (cddp_wrap: the caller keeps it alive and unchanged until reset), elsewhere a copy
 * (cddp_from_data: the caller may reuse it at once). For a batch a program made itself. */
CDDP_API cddp_tensor *cddp_from_host(cddp_ctx *ctx, cddp_dtype dtype, int ndim,
                                     const int64_t *shape, void *data);
/* Wraps caller memory (of the context's device) without copying; the caller keeps it alive and
 * unchanged until reset. */
CDDP_API cddp_tensor *cddp_wrap(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape,
                                void *data);
CDDP_API cddp_tensor *cddp_uniform(cddp_ctx *ctx, int ndim, const int64_t *shape, float lo,
                                   float hi, cddp_rng *rng);
CDDP_API cddp_tensor *cddp_normal(cddp_ctx *ctx, int ndim, const int64_t *shape, float mean,
                                  float std, cddp_rng *rng);
/* Fill an existing float32 tensor (for initialising parameters). */
CDDP_API void cddp_fill(cddp_tensor *t, float value);
CDDP_API void cddp_fill_uniform(cddp_tensor *t, float lo, float hi, cddp_rng *rng);
CDDP_API void cddp_fill_normal(cddp_tensor *t, float mean, float std, cddp_rng *rng);
/* Marks a leaf tensor as needing a gradient (its grad appears after backward). */
CDDP_API cddp_tensor *cddp_requires_grad(cddp_ctx *ctx, cddp_tensor *t);
/* Keeps the gradient of t, an op's output, readable after backward (PyTorch's retain_grad): by
 * default backward releases an intermediate's gradient once the op that made t has used it, and
 * reuses its memory for the step's later gradients (t->grad is NULL again). Returns t. */
CDDP_API cddp_tensor *cddp_retain_grad(cddp_tensor *t);
/* Element i (in row-major order, whatever the layout) as double, whatever the dtype; on a device
 * that queues its work, after that work has run (the host waits). */
CDDP_API double cddp_get(const cddp_tensor *t, int64_t i);
/* The value of a one-element tensor (a loss), as cddp_get(t, 0): PyTorch's item(). */
CDDP_API double cddp_item(const cddp_tensor *t);

/* x on dev: x itself when it is there, else a copy there (allocated in the context's arena on
 * dev), differentiable: the copy's gradient is added to x's on x's device (PyTorch's x.to(dev)).
 * A copy to the host waits for x's device; one from the host returns once x may change. */
CDDP_API cddp_tensor *cddp_to(cddp_ctx *ctx, cddp_tensor *x, cddp_device *dev);

/* x in dtype, CDDP_F32 or CDDP_BF16 (rounded to nearest even; widened back exactly), a
 * differentiable copy in x's layout; x itself when it is in dtype already. Its gradient, as every
 * gradient, is float32 and passes through unchanged (PyTorch's x.to(torch.bfloat16)).
 * Activations in bf16: in mixed precision (cddp_ctx_options.compute = CDDP_BF16) the
 * convolutions (cddp_conv2d, cddp_conv2d_groups, cddp_conv2d_blocked) and batch normalisations
 * (cddp_batch_norm, ..._relu, ..._add_relu, whose residual may be either) take a bf16 input and
 * return their output in bf16, half the bytes for what reads it next; they compute as with the
 * input widened and round their output. Other ops refuse bf16 tensors: widen them first.
 * cddp_nn_resnet keeps its activations so in mixed precision with CDDP_BF16_ACTIVATIONS=1. */
CDDP_API cddp_tensor *cddp_to_dtype(cddp_ctx *ctx, cddp_tensor *x, cddp_dtype dtype);

/* Views: share data with x. One dimension of reshape may be -1 (inferred). */
CDDP_API cddp_tensor *cddp_reshape(cddp_ctx *ctx, cddp_tensor *x, int ndim, const int64_t *shape);
/* (N, ...) -> (N, prod(...)), as nn.Flatten(). */
CDDP_API cddp_tensor *cddp_flatten(cddp_ctx *ctx, cddp_tensor *x);

typedef enum cddp_reduction {
    CDDP_REDUCE_MEAN = 0,
    CDDP_REDUCE_SUM = 1,
} cddp_reduction;

/* Matrix product of 2-D tensors: op(a) (M,K) x op(b) (K,N) -> (M,N), op = transpose when the
 * flag is set. Runs on oneDNN's sgemm. */
CDDP_API cddp_tensor *cddp_matmul(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b, bool trans_a,
                                  bool trans_b);
/* x (..., in) . w (out, in)^T + b (out) -> (..., out): every leading dimension of x is a row
 * (a (B, T, C) sequence takes one GEMM); b may be NULL. */
CDDP_API cddp_tensor *cddp_linear(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b);

/* Elementwise with NumPy broadcasting (shapes aligned at the right; size-1 dims stretch). */
CDDP_API cddp_tensor *cddp_add(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b);
CDDP_API cddp_tensor *cddp_sub(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b);
CDDP_API cddp_tensor *cddp_mul(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b);
CDDP_API cddp_tensor *cddp_div(cddp_ctx *ctx, cddp_tensor *a, cddp_tensor *b);
CDDP_API cddp_tensor *cddp_scale(cddp_ctx *ctx, cddp_tensor *x, float s);

CDDP_API cddp_tensor *cddp_relu(cddp_ctx *ctx, cddp_tensor *x);
/* GELU with the exact erf form, as PyTorch's default. */
CDDP_API cddp_tensor *cddp_gelu(cddp_ctx *ctx, cddp_tensor *x);
CDDP_API cddp_tensor *cddp_tanh(cddp_ctx *ctx, cddp_tensor *x);
CDDP_API cddp_tensor *cddp_sigmoid(cddp_ctx *ctx, cddp_tensor *x);
/* Along the last dimension, with the row maximum subtracted first (no overflow). */
CDDP_API cddp_tensor *cddp_softmax(cddp_ctx *ctx, cddp_tensor *x);
CDDP_API cddp_tensor *cddp_log_softmax(cddp_ctx *ctx, cddp_tensor *x);

/* logits (N,C) float32, labels (N) int32 or int64 in [0,C) -> scalar. A label out of range
 * fails the context with a message naming the sample, the label and C. */
CDDP_API cddp_tensor *cddp_cross_entropy(cddp_ctx *ctx, cddp_tensor *logits, cddp_tensor *labels,
                                         cddp_reduction reduction);
/* pred and target of the same shape -> scalar mean or sum of squared differences. */
CDDP_API cddp_tensor *cddp_mse_loss(cddp_ctx *ctx, cddp_tensor *pred, cddp_tensor *target,
                                    cddp_reduction reduction);
CDDP_API cddp_tensor *cddp_sum(cddp_ctx *ctx, cddp_tensor *x);  /* all elements -> scalar */
CDDP_API cddp_tensor *cddp_mean(cddp_ctx *ctx, cddp_tensor *x); /* all elements -> scalar */

/* x (N,C,H,W), w (O,C,KH,KW), b (O) or NULL -> (N,O,OH,OW), OH = (H + 2p - KH) / stride + 1,
 * zero padding p on every side. Runs on oneDNN (its forward, backward-data and backward-weights
 * primitives, made once per shape). */
CDDP_API cddp_tensor *cddp_conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                  int stride, int padding);
/* cddp_conv2d in groups: the C input channels split into `groups` equal parts, each convolved
 * with its O / groups filters; w (O, C/groups, KH, KW), groups dividing C and O (PyTorch's
 * Conv2d groups). groups 1 is cddp_conv2d. */
CDDP_API cddp_tensor *cddp_conv2d_groups(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                         cddp_tensor *b, int stride, int padding, int groups);
/* x (N,C,H,W) -> (N,C,OH,OW), OH = (H + 2p - kernel) / stride + 1 (stride 0: the kernel);
 * padding at most half the kernel, counting as -infinity. A NaN in a window is its maximum. */
CDDP_API cddp_tensor *cddp_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride,
                                      int padding);
/* cddp_max_pool2d(cddp_relu(x), ...) in one pass, without the ReLU's tensor: the same values and
 * gradients (where windows overlap and x has another use, a gradient's terms are added in
 * another order). A Sequential runs a ReLU followed by a MaxPool2d as this. */
CDDP_API cddp_tensor *cddp_relu_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride,
                                           int padding);
/* cddp_relu_max_pool2d(cddp_conv2d_groups(x, w, b, stride, padding, groups), pool_kernel,
 * pool_stride, pool_padding) as one op: the same values and gradients. With 2x2 pooling of stride
 * 2 the convolution's output never leaves oneDNN's layout (nor is it kept for the backward), which
 * saves two reorders of it per step; any other pooling runs as the two ops. A Sequential runs a
 * Conv2d followed by a ReLU and a MaxPool2d as this. */
CDDP_API cddp_tensor *cddp_conv2d_relu_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                                  cddp_tensor *b, int stride, int padding,
                                                  int groups, int pool_kernel, int pool_stride,
                                                  int pool_padding);
/* Average pooling, shaped as cddp_max_pool2d; the padding counts as zeros in every window's
 * kernel x kernel (PyTorch's AvgPool2d, count_include_pad). */
CDDP_API cddp_tensor *cddp_avg_pool2d(cddp_ctx *ctx, cddp_tensor *x, int kernel, int stride,
                                      int padding);
/* x (N,C,H,W) -> (N,C,OH,OW): output cell (i, j) averages rows [floor(i H / OH), ceil((i+1) H /
 * OH)) and the columns alike (PyTorch's AdaptiveAvgPool2d); (1, 1) is global average pooling. */
CDDP_API cddp_tensor *cddp_adaptive_avg_pool2d(cddp_ctx *ctx, cddp_tensor *x, int64_t OH,
                                               int64_t OW);
/* Zeroes each element with probability p and scales the rest by 1/(1-p), drawing from the
 * context's generator; the identity when !training or p == 0. */
CDDP_API cddp_tensor *cddp_dropout(cddp_ctx *ctx, cddp_tensor *x, float p, bool training);

/* ---- Layouts ---------------------------------------------------------------------------
 * A convolution runs fastest with its activations in oneDNN's channel-blocked layout (nChw16c on
 * a CPU with AVX-512, nChw8c on one with AVX2: the channels in blocks of B side by side, so that
 * element (n, c, h, w) of an (N,C,H,W) tensor lies at ((n C/B + c/B) H + h) W B + w B + c % B).
 * Run on plain tensors, each convolution reorders its input into that layout and its output out
 * of it, forward and backward. A network of convolutions, batch normalisations, ReLUs and sums
 * (a ResNet) can instead keep its activations blocked from one convolution to the next: a tensor
 * whose `block` is B > 0 holds its elements in that layout (and its gradient too), and
 *
 *   cddp_conv2d, cddp_conv2d_groups      take it and return their output blocked alike
 *   cddp_conv2d_blocked                  returns its output blocked whatever its input
 *   cddp_batch_norm, cddp_batch_norm_relu, cddp_batch_norm_add_relu, cddp_relu, cddp_gelu,
 *   cddp_tanh, cddp_sigmoid, cddp_scale  return their output blocked alike
 *   cddp_add, cddp_sub, cddp_mul, cddp_div  take two blocked tensors of one shape
 *   cddp_adaptive_avg_pool2d, cddp_sum, cddp_mean, cddp_to_nchw   return a plain tensor
 *
 * Every other op aborts, naming cddp_to_nchw, when given a blocked tensor: no op reads one as if it
 * were plain. Only channel counts that are a multiple of B are blocked (no padding lanes), so a
 * blocked tensor has numel elements like any other; cddp_to_blocked leaves other tensors plain.
 * A tensor's values and gradients do not depend on its layout beyond the order of a sum's terms
 * (batch normalisation's statistics). cddp_nn_resnet keeps its activations blocked this way. */

/* B of this machine's blocked layout (16 or 8, what oneDNN's convolutions prefer), or 0 when
 * oneDNN prefers no channel-blocked layout (or CDDP_BLOCKED=0 turns it off): then
 * cddp_to_blocked and cddp_conv2d_blocked return plain tensors. */
CDDP_API int cddp_blocked_size(void);
/* The same for the convolutions of dev (0 on a device whose convolutions take plain tensors). */
CDDP_API int cddp_blocked_size_on(cddp_device *dev);
/* x (N,C,H,W) float32 in the blocked layout, a differentiable copy; x itself when it is already
 * blocked, when C is not a multiple of cddp_blocked_size() or when that is 0. */
CDDP_API cddp_tensor *cddp_to_blocked(cddp_ctx *ctx, cddp_tensor *x);
/* x row-major, a differentiable copy when x is blocked; x itself when it is plain. */
CDDP_API cddp_tensor *cddp_to_nchw(cddp_ctx *ctx, cddp_tensor *x);
/* cddp_conv2d_groups whose output is in the blocked layout (when O is a multiple of
 * cddp_blocked_size(); plain otherwise): the first convolution of a network that keeps its
 * activations blocked, written there by oneDNN directly. */
CDDP_API cddp_tensor *cddp_conv2d_blocked(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                          cddp_tensor *b, int stride, int padding, int groups);

/* Batch normalisation of x (N,C) or (N,C,H,W) over every dimension but C, as PyTorch's
 * BatchNorm1d/2d: y = (x - mean) / sqrt(var + eps) * weight + bias (weight and bias (C), either
 * may be NULL). training: mean and var are the batch's (var biased), and running_mean and
 * running_var (C, float32, not differentiated; either may be NULL) move toward them by momentum,
 * the variance unbiased: r = (1 - momentum) r + momentum stat. Otherwise the running statistics
 * are used and left alone. */
CDDP_API cddp_tensor *cddp_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight,
                                      cddp_tensor *bias, cddp_tensor *running_mean,
                                      cddp_tensor *running_var, bool training, float momentum,
                                      float eps);
/* cddp_relu(cddp_batch_norm(...)) as one op: the same values and gradients, each block of the
 * output rectified while it is in cache, without the ReLU's tensor or its passes over the data. A
 * Sequential runs a BatchNorm followed by a ReLU as this, and so does the ResNet. */
CDDP_API cddp_tensor *cddp_batch_norm_relu(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight,
                                           cddp_tensor *bias, cddp_tensor *running_mean,
                                           cddp_tensor *running_var, bool training, float momentum,
                                           float eps);
/* cddp_relu(cddp_add(cddp_batch_norm(x, ...), residual)) as one op, residual of x's shape and
 * layout (the end of a ResNet's basic block): the same values and gradients, the residual added to
 * each normalised block before it is rectified, without the sum's tensor or passes of its own. */
CDDP_API cddp_tensor *cddp_batch_norm_add_relu(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *residual,
                                               cddp_tensor *weight, cddp_tensor *bias,
                                               cddp_tensor *running_mean, cddp_tensor *running_var,
                                               bool training, float momentum, float eps);

typedef struct cddp_comm cddp_comm; /* cddp/comm.h */
/* Batch normalisation whose batch is every rank's of group (PyTorch's SyncBatchNorm): in
 * training the mean and variance are those of all the ranks' batches together (gathered in the
 * forward: each rank's count, mean and squared deviations per channel, combined in rank order, so
 * every rank normalises with the same numbers), the running statistics move toward them, and the
 * backward gathers each channel's two gradient sums the same way for x's gradient; the weight's
 * and bias's gradients are this rank's own, which DistributedDataParallel then averages. The
 * ranks' batches may differ in size. With residual (then relu must be true):
 * cddp_batch_norm_add_relu's op; else with relu cddp_batch_norm_relu's, without it
 * cddp_batch_norm's. A collective on group in the forward and in the backward of training: every
 * rank calls it in the same order (not beside DistributedDataParallel's join, whose joined ranks
 * stop calling it). group NULL or of one rank, or evaluation: the plain op, no communication.
 * A failed collective latches in ctx with the group's words. */
CDDP_API cddp_tensor *cddp_sync_batch_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *residual,
                                           bool relu, cddp_tensor *weight, cddp_tensor *bias,
                                           cddp_tensor *running_mean, cddp_tensor *running_var,
                                           bool training, float momentum, float eps,
                                           cddp_comm *group);

/* ---- the tape --------------------------------------------------------------------------
 * What an op records when gradients flow, for autograd's backward (and anything else that walks
 * the graph). Nodes live in the context's arena until cddp_ctx_reset. */

/* The newest node (NULL: nothing recorded since the last reset), and how many there are. */
CDDP_API cddp_node *cddp_ctx_tape(const cddp_ctx *ctx);
CDDP_API int cddp_ctx_tape_length(const cddp_ctx *ctx);
/* The node recorded before n (NULL for the first), and n's place: 0 for the first. */
CDDP_API cddp_node *cddp_node_prev(const cddp_node *n);
CDDP_API int cddp_node_index(const cddp_node *n);
/* n's op ("linear"), its output and its inputs (an input may be NULL: an absent bias). */
CDDP_API const char *cddp_node_op(const cddp_node *n);
CDDP_API cddp_tensor *cddp_node_output(const cddp_node *n);
CDDP_API int cddp_node_num_inputs(const cddp_node *n);
CDDP_API cddp_tensor *cddp_node_input(const cddp_node *n, int i);
/* Runs n's backward: adds to the gradients of its inputs that require one, from its output's
 * gradient (which must exist), then releases that gradient unless the output is a parameter or
 * retains it (cddp_retain_grad): no later node reads it, and its memory serves the step's next
 * gradients. Data errors (the arena running out) latch in ctx. */
CDDP_API void cddp_node_backward(cddp_ctx *ctx, cddp_node *n);
/* t's gradient: a parameter's view of its model's gradient block, else zeroed arena memory made
 * on first use (valid until reset). NULL when the arena ran out (latched in ctx). */
CDDP_API float *cddp_grad_buffer(cddp_ctx *ctx, cddp_tensor *t);
/* t's gradient for a backward that writes every element of it: when t has no gradient yet, arena
 * memory that is not zeroed, with *assign set (the backward stores its values: "=", or a GEMM
 * with beta 0); otherwise cddp_grad_buffer's, with *assign cleared (the backward adds). Saves
 * zeroing a buffer only to add into it once. */
CDDP_API float *cddp_grad_buffer_assign(cddp_ctx *ctx, cddp_tensor *t, bool *assign);
/* Adds v to every element of t's gradient (made zeroed on first use), on t's device: how a
 * backward is seeded (d loss / d loss = 1). CDDP_OK, or the context's failure. */
CDDP_API int cddp_grad_add(cddp_ctx *ctx, cddp_tensor *t, float v);
/* A function of one input whose backward is the caller's (PyTorch's autograd.Function): records
 * on ctx's tape that out was computed from x (the caller computed it, without recording: with
 * gradients disabled, or on another context) and read params (nparams parameters: each counts as
 * one use by this node, so that their ready hooks fire after its backward). The node's backward
 * calls backward(user, ctx, x, out), out's gradient in out->grad (float32), to add x's into
 * cddp_grad_buffer(ctx, x) (when x requires one) and the parameters' into theirs. Nothing is
 * recorded when gradients are disabled or neither x nor a parameter requires a gradient.
 * Returns out (NULL when the arena ran out: latched in ctx). Activation checkpointing
 * (autograd.h) records its segments so. */
typedef void (*cddp_function_backward)(void *user, cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *out);
CDDP_API cddp_tensor *cddp_record_function(cddp_ctx *ctx, cddp_tensor *out, cddp_tensor *x,
                                           cddp_tensor *const *params, int nparams,
                                           cddp_function_backward backward, void *user);
/* A second context on ctx's device, with its compute type and arena options, made on first call
 * (NULL, latched in ctx, when it cannot be) and destroyed with ctx: for work whose results do not
 * stay in ctx (activation checkpointing runs its segments there). Its reset is its user's. */
CDDP_API cddp_ctx *cddp_ctx_scratch(cddp_ctx *ctx);
/* A pointer that a layer built on tensors may keep for the current step (autograd keeps its
 * backward's state there, in the arena); cddp_ctx_reset sets it to NULL. */
CDDP_API void **cddp_ctx_step_state(cddp_ctx *ctx);

/* ---- transformers ---------------------------------------------------------------------- */

/* ids (...) int32 or int64 in [0, V), table (V, C) -> (..., C): row ids[i] of the table for
 * every position. An id out of range fails the context naming it. Backward adds each position's
 * gradient into its id's row, positions in order (deterministic). */
CDDP_API cddp_tensor *cddp_embedding(cddp_ctx *ctx, cddp_tensor *ids, cddp_tensor *table);
/* Layer normalisation over the last dimension (C), as PyTorch's LayerNorm: y = (x - mean) /
 * sqrt(var + eps) * weight + bias, the variance biased; weight and bias (C) may be NULL. */
CDDP_API cddp_tensor *cddp_layer_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight,
                                      cddp_tensor *bias, float eps);
/* GELU with the tanh approximation (PyTorch's approximate="tanh", GPT-2's):
 * x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
CDDP_API cddp_tensor *cddp_gelu_tanh(cddp_ctx *ctx, cddp_tensor *x);
/* cddp_linear(ctx, cddp_gelu_tanh(ctx, x), w, b) as one op, the same numbers (a transformer's MLP
 * after its first layer): in mixed precision on a device whose products take bf16 operands, GELU's
 * output is made only rounded to bf16 for the product, never in float32, which nothing else would
 * read (GPT-2's MLP: 16,384 x 3,072 floats a layer written and kept); otherwise the two ops. */
CDDP_API cddp_tensor *cddp_gelu_tanh_linear(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                            cddp_tensor *b);
/* Llama's pieces, as Hugging Face's LlamaRMSNorm, LlamaMLP and apply_rotary_pos_emb compute them
 * (the CPU and the emulated device; CUDA's kernels are written, and tests/gpu/device_check.c
 * compares them with the CPU's on a GPU, which has not run yet).
 * RMSNorm over the last dimension (C): y = x / sqrt(mean(x^2) + eps) * weight (C, or NULL: ones).
 */
CDDP_API cddp_tensor *cddp_rms_norm(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *weight, float eps);
/* SwiGLU's gate: silu(g) u = g sigmoid(g) u elementwise, g and u of one shape (the gate and up
 * projections, before the down projection). */
CDDP_API cddp_tensor *cddp_silu_mul(cddp_ctx *ctx, cddp_tensor *g, cddp_tensor *u);
/* Rotary position embeddings: x (..., T, n_head D), position pos0 + t at row t, each head's
 * features i and i + D/2 (i < D/2, rotate_half's pairs) turned by the angle position inv_freq[i]
 * (computed in float32); inv_freq (D/2) is a constant of the model (theta^(-2i/D), or Llama 3's
 * rescaled ones) and takes no gradient. pos0 > 0: the positions after a key/value cache's. */
CDDP_API cddp_tensor *cddp_rope(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *inv_freq,
                                int64_t n_head, int64_t pos0);
/* Grouped-query attention's inputs, packed for cddp_attention: q (..., n_head D), k and v
 * (..., n_kv_head D), n_head a multiple of n_kv_head (1: multi-query) -> (..., 3 n_head D), the
 * queries, then the keys and values with key/value head h / (n_head / n_kv_head) in head h's
 * place (Hugging Face's repeat_kv). The backward sums the shared heads' gradients. */
CDDP_API cddp_tensor *cddp_qkv_pack(cddp_ctx *ctx, cddp_tensor *q, cddp_tensor *k, cddp_tensor *v,
                                    int64_t n_head, int64_t n_kv_head);
/* Causal self-attention, fused: qkv (B, T, 3C) holds each position's query, key and value side
 * by side (nanoGPT's c_attn output), C split into n_head heads of C / n_head. Per head,
 * softmax(q k^T / sqrt(C / n_head)) with every position's future masked, times v; the heads side
 * by side -> (B, T, C). Keeps the attention weights (B * n_head * T * T floats) for backward. */
CDDP_API cddp_tensor *cddp_attention(cddp_ctx *ctx, cddp_tensor *qkv, int n_head);
/* cddp_attention(ctx, cddp_linear(ctx, x, w, b), n_head) as one op, the same numbers (a GPT
 * block's c_attn and attention): x (B, T, in), w (3C, in). In mixed precision, where the device
 * attends by rows (a GPU), q, k and v are kept only rounded to bf16, as the attention reads them,
 * never in float32 (GPT-2: 16,384 x 2,304 floats a layer); otherwise the two ops. */
CDDP_API cddp_tensor *cddp_qkv_attention(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                         cddp_tensor *b, int n_head);
/* Causal self-attention for generation, with a key/value cache: qkv (B, T, 3C) holds the
 * projections of positions past..past+T-1 of each sequence; their keys and values are stored into
 * cache (B, L, 2C: a position's key, then its value), whose positions 0..past-1 hold the earlier
 * ones' (from earlier calls on the same cache), and each new position
 * attends to the positions up to its own, so a token costs one position, not the whole prefix.
 * Returns (B, T, C), as cddp_attention would for the whole sequence's last T positions. No
 * gradient: gradients must be off (cddp_ctx_set_grad_enabled); past + T must fit L. */
CDDP_API cddp_tensor *cddp_attention_cached(cddp_ctx *ctx, cddp_tensor *qkv, int n_head,
                                            cddp_tensor *cache, int64_t past);

/* Index of the largest element along the last dimension (first one on ties) -> int64 tensor
 * with the last dimension removed. Not differentiable. */
CDDP_API cddp_tensor *cddp_argmax(cddp_ctx *ctx, cddp_tensor *x);
/* How many rows of logits (N,C) have their argmax equal to the label (N). */
CDDP_API int64_t cddp_count_correct(const cddp_tensor *logits, const cddp_tensor *labels);
/* count_correct / N (0 for N = 0). */
CDDP_API double cddp_accuracy(const cddp_tensor *logits, const cddp_tensor *labels);

#ifdef __cplusplus
}
#endif
#endif
