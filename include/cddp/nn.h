/* cddp/nn.h: models: named parameters in one flat block, and Sequential stacks of modules.
 *
 * A model owns two contiguous float32 blocks of the same layout, one for parameter values and one
 * for their gradients; each named parameter is a tensor viewing its range of both (llm.c style).
 * State that is not trained but belongs to the model (BatchNorm's running statistics) lives in
 * buffers: named tensors in a third flat block, saved in checkpoints with the parameters,
 * broadcast by DistributedDataParallel, never touched by optimizers.
 * So an optimizer updates one array, a checkpoint writes ranges of it, and DistributedDataParallel
 * reduces ranges of the gradient block with no packing copies.
 *
 * Building a model has two phases. First declare: add modules (Linear, Conv2d, ...) to the
 * sequence and/or raw parameters with their initialisers. Then cddp_model_build allocates the
 * blocks and initialises every parameter, in declaration order, from one seed: the same seed
 * gives bit-identical weights in every process. Names follow PyTorch's state_dict: a module added
 * as "fc1" owns "fc1.weight" and "fc1.bias"; a module added with a NULL name is named after its
 * position in the sequence ("0.weight", "2.bias"), as in nn.Sequential.
 */
#ifndef CDDP_NN_H
#define CDDP_NN_H

#include "cddp/autograd.h"
#include "cddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cddp_module_kind {
    CDDP_MODULE_LINEAR,
    CDDP_MODULE_CONV2D,
    CDDP_MODULE_MAX_POOL2D,
    CDDP_MODULE_RELU,
    CDDP_MODULE_GELU,
    CDDP_MODULE_TANH,
    CDDP_MODULE_SIGMOID,
    CDDP_MODULE_DROPOUT,
    CDDP_MODULE_FLATTEN,
    CDDP_MODULE_BATCH_NORM,
} cddp_module_kind;

/* A module description; make one with the cddp_nn_* constructors below. */
typedef struct cddp_module {
    cddp_module_kind kind;
    int64_t in, out;             /* Linear: features; Conv2d: channels */
    int kernel, stride, padding; /* Conv2d and MaxPool2d */
    float p;                     /* Dropout probability */
    bool bias;                   /* Linear and Conv2d: has a bias; BatchNorm: affine */
    float momentum, eps;         /* BatchNorm */
} cddp_module;

/* PyTorch's defaults: bias on; Linear and Conv2d weights and biases drawn from
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5)). */
static inline cddp_module cddp_nn_linear(int64_t in, int64_t out) {
    return (cddp_module){.kind = CDDP_MODULE_LINEAR, .in = in, .out = out, .bias = true};
}
static inline cddp_module cddp_nn_conv2d(int64_t in, int64_t out, int kernel, int stride,
                                         int padding) {
    return (cddp_module){.kind = CDDP_MODULE_CONV2D,
                         .in = in,
                         .out = out,
                         .kernel = kernel,
                         .stride = stride,
                         .padding = padding,
                         .bias = true};
}
/* stride 0 means stride = kernel, as in PyTorch. */
static inline cddp_module cddp_nn_max_pool2d(int kernel, int stride) {
    return (cddp_module){.kind = CDDP_MODULE_MAX_POOL2D, .kernel = kernel, .stride = stride};
}
static inline cddp_module cddp_nn_relu(void) {
    return (cddp_module){.kind = CDDP_MODULE_RELU};
}
static inline cddp_module cddp_nn_gelu(void) {
    return (cddp_module){.kind = CDDP_MODULE_GELU};
}
static inline cddp_module cddp_nn_tanh(void) {
    return (cddp_module){.kind = CDDP_MODULE_TANH};
}
static inline cddp_module cddp_nn_sigmoid(void) {
    return (cddp_module){.kind = CDDP_MODULE_SIGMOID};
}
static inline cddp_module cddp_nn_dropout(float p) {
    return (cddp_module){.kind = CDDP_MODULE_DROPOUT, .p = p};
}
static inline cddp_module cddp_nn_flatten(void) {
    return (cddp_module){.kind = CDDP_MODULE_FLATTEN};
}
/* BatchNorm1d/2d over `features` channels of (N,C) or (N,C,H,W) input, PyTorch's defaults
 * (momentum 0.1, eps 1e-5, affine): parameters "weight" (ones) and "bias" (zeros), buffers
 * "running_mean" (zeros) and "running_var" (ones), updated in training mode and used in
 * evaluation mode (see cddp_batch_norm). */
static inline cddp_module cddp_nn_batch_norm(int64_t features) {
    return (cddp_module){.kind = CDDP_MODULE_BATCH_NORM,
                         .in = features,
                         .out = features,
                         .bias = true,
                         .momentum = 0.1f,
                         .eps = 1e-5f};
}

/* How a raw parameter starts. */
typedef enum cddp_init_kind {
    CDDP_INIT_CONSTANT, /* every element = a (zero-initialised struct: zeros) */
    CDDP_INIT_UNIFORM,  /* U(a, b) */
    CDDP_INIT_NORMAL,   /* N(mean a, std b) */
} cddp_init_kind;

typedef struct cddp_init {
    cddp_init_kind kind;
    float a, b;
} cddp_init;

typedef struct cddp_model cddp_model;

/* NULL when out of memory. */
CDDP_API cddp_model *cddp_model_create(void);
CDDP_API void cddp_model_destroy(cddp_model *m);
/* The message of the model's last failure. */
CDDP_API const char *cddp_model_error(const cddp_model *m);

/* Declaration phase (before build). name may be NULL (position in the sequence); names must be
 * unique. Fails with CDDP_EINVAL on a bad description or a duplicate name, CDDP_ESTATE after
 * build. */
CDDP_API int cddp_model_add(cddp_model *m, const char *name, cddp_module module);
/* A parameter for a custom forward; *index (if not NULL) receives its index. */
CDDP_API int cddp_model_add_param(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                                  cddp_init init, int *index);

/* A buffer (state that is not trained) for a custom forward, every element = init;
 * *index (if not NULL) receives its index. Names are unique across parameters and buffers. */
CDDP_API int cddp_model_add_buffer(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                                   float init, int *index);

/* Allocates the flat blocks, initialises the parameters from seed and zeroes the gradients. */
CDDP_API int cddp_model_build(cddp_model *m, uint64_t seed);

CDDP_API int cddp_model_num_params(const cddp_model *m);
/* The i-th parameter, in declaration order (0 <= i < num_params). */
CDDP_API cddp_tensor *cddp_model_param(const cddp_model *m, int i);
/* The parameter with this name, or NULL. */
CDDP_API cddp_tensor *cddp_model_find(const cddp_model *m, const char *name);
/* Total parameter elements, and the flat value and gradient blocks (numel floats each). */
CDDP_API size_t cddp_model_numel(const cddp_model *m);
CDDP_API float *cddp_model_data(const cddp_model *m);
CDDP_API float *cddp_model_grad(const cddp_model *m);
/* Buffers, in declaration order, and their flat block (buffer_numel floats). */
CDDP_API int cddp_model_num_buffers(const cddp_model *m);
CDDP_API cddp_tensor *cddp_model_buffer(const cddp_model *m, int i);
CDDP_API cddp_tensor *cddp_model_find_buffer(const cddp_model *m, const char *name);
CDDP_API size_t cddp_model_buffer_numel(const cddp_model *m);
CDDP_API float *cddp_model_buffer_data(const cddp_model *m);
/* Offset, in elements, of parameter i in the flat blocks. */
CDDP_API size_t cddp_model_param_offset(const cddp_model *m, int i);
/* Moves the gradient block into block (numel floats, 64-byte aligned, owned by the caller, who
 * keeps it alive until the model is destroyed or the block is moved again), copying the current
 * gradients; block NULL moves them back into memory of the model's own. Every parameter's grad
 * follows. DistributedDataParallel uses it to place the gradients where the transport reads
 * them in place. CDDP_ENOMEM (nothing changed) when the model cannot allocate. */
CDDP_API int cddp_model_set_grad_block(cddp_model *m, float *block);
/* Sets every gradient to zero (gradients accumulate across backward calls until then). */
CDDP_API void cddp_model_zero_grad(cddp_model *m);
/* Training mode (the default) enables dropout and BatchNorm's batch statistics; evaluation mode
 * disables dropout and normalises with the running statistics. */
CDDP_API void cddp_model_set_training(cddp_model *m, bool training);
CDDP_API bool cddp_model_training(const cddp_model *m);
/* Sets the gradient-ready hook of every parameter (see autograd.h). */
CDDP_API void cddp_model_set_ready_hook(cddp_model *m, cddp_ready_hook hook, void *user);

/* Step events, for observers such as DistributedDataParallel (its timeline, and the buffer
 * broadcast before each forward): the start of cddp_model_forward, and the start and end of an
 * optimizer step on this model. A custom forward notifies CDDP_EVENT_FORWARD itself first. */
typedef enum cddp_model_event {
    CDDP_EVENT_FORWARD,
    CDDP_EVENT_OPTIM_BEGIN,
    CDDP_EVENT_OPTIM_END,
} cddp_model_event;
typedef void (*cddp_model_event_hook)(void *user, cddp_model *m, cddp_model_event event);
/* One observer per model; NULL clears it. */
CDDP_API void cddp_model_set_event_hook(cddp_model *m, cddp_model_event_hook hook, void *user);
/* Calls the observer, if any (optimizers call it around their step). */
CDDP_API void cddp_model_notify(cddp_model *m, cddp_model_event event);

/* Runs the module sequence on x. Shape mismatches abort (programmer error); data errors latch in
 * ctx. The model must be built and have modules. */
CDDP_API cddp_tensor *cddp_model_forward(cddp_model *m, cddp_ctx *ctx, cddp_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
