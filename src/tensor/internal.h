/* tensor/internal.h: the step context, the tape node, and what the op families share.
 *
 * The tensor module's files, lowest first (no circle):
 *
 *   device.c, devices.c  the device interface's shared calls, and the list of device kinds
 *                        (device.h; the kernels' table is kernels.h)
 *   cpu/, ...       the devices: their memory, queues and kernels (cpu/cpu.h lists the CPU's)
 *   tensor.c        the context (its arena and queue on each device it uses), tensor creation,
 *                   the random generator
 *   tape.c          recording a node when gradients flow, the nodes' public accessors
 *   ops/<family>.c  each op's forward and backward side by side (linear, elementwise,
 *                   activation, loss, reduce, conv, pool, norm, dropout, shape, layout, device;
 *                   metrics are not differentiable): checks, allocation and recording, the
 *                   arithmetic in the kernels of the tensors' device
 *   ops/dispatch.c  the backward of a node, from the op list (ops/list.h)
 *
 * Each op that records appends one node to the context's tape (a linked list in the arena,
 * newest first). A node holds the op, its output, up to four inputs, the op's scalar arguments
 * and an op-specific saved buffer (softmax probabilities, max pooling's argmax, dropout mask). What
 * a backward pass keeps (which nodes are needed, parameters' pending uses, the callbacks) is
 * autograd's, not the context's.
 *
 * Memory: tensor headers, nodes and what the host reads stay in the context's arena (host
 * memory); tensor data and saved buffers come from the arena of the tensors' device in the
 * context (cddp__cdev; on the CPU the two are one arena).
 */
#ifndef CDDP_TENSOR_INTERNAL_H
#define CDDP_TENSOR_INTERNAL_H

#include "cddp/core.h"
#include "cddp/tensor.h"
#include "tensor/device.h"
#include "tensor/ops/list.h"

#include <pthread.h>

typedef enum cddp__op {
#define CDDP__OP_ENUM(NAME, name) CDDP_OP_##NAME,
    CDDP_OP_LIST(CDDP__OP_ENUM)
#undef CDDP__OP_ENUM
        CDDP_OP_COUNT
} cddp__op;

struct cddp__node {
    cddp__op op;
    int index; /* the node's place on the tape: 0 for the first recorded in this step */
    int nin;
    cddp_tensor *out;
    cddp_tensor *in[4];
    struct cddp__node *prev; /* the node recorded before this one */
    union {
        struct {
            bool ta, tb;
        } mm;
        float scalar;
        cddp_reduction reduction;
        struct {
            int stride, padding, groups;
        } conv;
        struct {
            int kernel, stride, padding;
        } pool;
        struct {
            bool training;           /* batch statistics (else the running ones) */
            struct cddp_comm *group; /* sync batch normalisation's ranks (NULL: this one's) */
        } bn;
        struct { /* cddp_record_function: its backward, and the parameters it read (inputs too) */
            cddp_function_backward backward;
            void *user;
            cddp_tensor **params;
            int nparams;
        } fn;
    } arg;
    void *saved;
};
typedef struct cddp__node cddp__node;

/* A released gradient's arena memory, and how many a context keeps per device for reuse
 * (tape.c). */
typedef struct cddp__spare {
    float *p;
    size_t bytes;
} cddp__spare;
#define CDDP__SPARE_GRADS 64

/* A context's state on one device: the device's step arena and the queue its kernels run with.
 * Kernels that run later (a device that is not in order) report failures into `late`, which the
 * context takes into its own error when it waits for them. */
typedef struct cddp__cdev {
    cddp_ctx *ctx;
    cddp__kq q;
    cddp_arena *arena; /* on the CPU: the context's own arena */
    pthread_mutex_t lock;
    cddp_error late;
    void *reuse; /* cddp__dreuse's */
    size_t reuse_bytes;
    cddp__spare spare[CDDP__SPARE_GRADS]; /* released gradients, for the step's next ones */
    int nspare;
} cddp__cdev;

#define CDDP__CTX_DEVICES 4

struct cddp_ctx {
    cddp_arena *arena;
    cddp__node *tape; /* newest node */
    int nnodes;       /* on the tape */
    cddp_rng rng;
    bool grad_enabled;
    cddp_error err;
    void *step_state;                   /* a higher layer's, for this step (autograd's backward) */
    cddp__cdev *dev[CDDP__CTX_DEVICES]; /* dev[0]: the context's device; the others as used */
    int ndev;
    cddp_dtype compute;       /* of the products (cddp_ctx_options.compute) */
    cddp_ctx_options options; /* as created, for its scratch */
    cddp_ctx *scratch;        /* cddp_ctx_scratch's, made on first use */
};

#define CDDP__FAILED(ctx) ((ctx)->err.code != CDDP_OK)

/* ---- tensor.c ---------------------------------------------------------------------------- */

/* Host arena allocation that latches the failure into ctx. */
void *cddp__ctx_alloc(cddp_ctx *ctx, size_t bytes);
/* The context's state on dev, made on first use; NULL (the failure latched) when it cannot be. */
cddp__cdev *cddp__ctx_dev(cddp_ctx *ctx, cddp_device *dev);
/* The device the n tensors (NULL ones skipped) are on, as the context's state there: aborts naming
 * op and both devices when two differ; with none given, the context's device. NULL when the
 * context failed. */
cddp__cdev *cddp__on(cddp_ctx *ctx, const char *op, int n, cddp_tensor *const *in);
#define CDDP__ON(ctx, op, ...)                                                                     \
    cddp__on(ctx, op, (int)(sizeof((cddp_tensor *[]){__VA_ARGS__}) / sizeof(cddp_tensor *)),       \
             (cddp_tensor *[]){__VA_ARGS__})
/* The state of the device node n's output is on. */
cddp__cdev *cddp__node_dev(cddp_ctx *ctx, const cddp__node *n);
/* The precision d's products run in for the context (its compute); when d cannot multiply in it,
 * fails the context saying why and returns false. */
bool cddp__computes(cddp_ctx *ctx, cddp__cdev *d);
/* Device arena memory (64-byte aligned, uninitialised) that latches a failure; _zero: zeroed. */
void *cddp__dalloc(cddp__cdev *d, size_t bytes);
void *cddp__dalloc_zero(cddp__cdev *d, size_t bytes);
/* ops/linear.c: for an op whose output usually feeds a linear layer, out->own.half allocated when
 * the context multiplies in bf16 on a device whose gemm takes bf16 operands (the op's kernel then
 * writes it); NULL otherwise, or when out of memory (the failure latched). */
uint16_t *cddp__half_for(cddp_ctx *ctx, cddp__cdev *d, cddp_tensor *out);
/* grad_half.c: for node n's backward, the memory of its k-th input x's gradient in bf16
 * (x->own.grad_half, set) when n makes the whole of it and the op that made x reads it so
 * (cddp__takes_grad_half): x is no parameter, keeps no gradient, has no ready hook and no gradient
 * yet, is n's input once, and no op ran between x's and n (whose backward would add to it after
 * n's); else NULL (then, or when out of memory, the failure latched, n makes x->grad as usual). x
 * may be reached through reshapes made just before n, each free of a gradient as x: then the memory
 * is that of the reshaped tensor's gradient, in the same order. *made (made may be NULL) is the
 * node that made the tensor whose gradient it is. The numbers are those of the float32 gradient
 * rounded by the products (to nearest even), with a pass less over it. */
uint16_t *cddp__input_grad_half(cddp_ctx *ctx, cddp__node *n, int k, cddp__node **made);
/* grad_half.c: whether x's gradient is still to be made, by one op, and kept by nobody: x wants
 * one, is no parameter, keeps no gradient, has no hook, and nothing of it is made yet. */
bool cddp__gradient_free(const cddp_tensor *x);
/* grad_half.c: whether node made's backward reads its output's gradient in bf16: a convolution in
 * mixed precision on a device whose conv2d_grad takes dy16 (ops/conv.c), a linear layer whose
 * products take bf16 operands (ops/linear.c: its bias's gradient, the column sums of the output's,
 * then comes from the op that makes grad_half: cddp__linear_bias_grad). */
bool cddp__takes_grad_half(cddp_ctx *ctx, const cddp__node *made);
bool cddp__conv2d_takes_grad_half(cddp_ctx *ctx, const cddp__node *made);
bool cddp__linear_takes_grad_half(cddp_ctx *ctx, const cddp__node *made);
/* The gradient buffer of the linear node made's bias, where it has one that wants it; else NULL. */
float *cddp__linear_bias_grad(cddp_ctx *ctx, const cddp__node *made);
/* ops/linear.c, for the ops built on linear's products (cddp_gelu_tanh_linear): linear's argument
 * checks, naming op (aborts), the output's shape into shape (CDDP_MAX_DIMS) and the device of the
 * inputs (CDDP__ON); whether d's
 * products in ctx take bf16 operands (mixed precision, a gemm that takes them); y = x16 W^T + b in
 * bf16 recorded as node op of inputs x, w, b with x16 and W rounded kept (x16 NULL: x's
 * x->own.half, or x rounded here); for such a node's backward, its output's gradient as the
 * products read it (NULL: out of memory, latched), then dx = dy W (stored when assign, else added;
 * dx NULL: none) and W's gradient dW += dy^T x16. */
cddp__cdev *cddp__linear_on(cddp_ctx *ctx, const char *op, cddp_tensor *x, cddp_tensor *w,
                            cddp_tensor *b, int64_t *shape);
bool cddp__takes_bf16(cddp_ctx *ctx, cddp__cdev *d);
cddp_tensor *cddp__linear_bf16(cddp_ctx *ctx, cddp__cdev *d, cddp__op op, cddp_tensor *x,
                               uint16_t *x16, cddp_tensor *w, cddp_tensor *b, cddp_tensor *y);
const uint16_t *cddp__linear_grad_rounded(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n);
/* A linear layer's part of an op that holds one (its node's in[0..2] x, W, b; its saved state
 * starting with cddp__linear_saved: the backward's products read it): the product y = x W^T + b
 * (N rows of W's out features, float32) queued in bf16 without recording an op, x16 and W rounded
 * into *sv (false: out of memory, latched); and the backward's rounding of that output's gradient
 * dy, its column sums added to the bias's gradient (NULL: out of memory, latched). */
typedef struct cddp__linear_saved {
    uint16_t *x, *w; /* (N, in) and (outf, in), rounded to bf16 */
} cddp__linear_saved;
bool cddp__linear_bf16_product(cddp_ctx *ctx, cddp__cdev *d, cddp_tensor *x, uint16_t *x16,
                               cddp_tensor *w, cddp_tensor *b, float *y, cddp__linear_saved *sv);
const uint16_t *cddp__linear_round_grad(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n,
                                        const float *dy);
void cddp__linear_products_backward(cddp_ctx *ctx, cddp__cdev *d, cddp__node *n, const uint16_t *dy,
                                    float *dx, bool assign);
/* Whether op is a linear layer's product: linear, or GELU then linear (cddp_gelu_tanh_linear). */
static inline bool cddp__op_is_linear(cddp__op op) {
    return op == CDDP_OP_LINEAR || op == CDDP_OP_GELU_TANH_LINEAR;
}
/* Zeroes bytes of d's memory at p, in queue order; false (the failure latched) when it cannot. */
bool cddp__dzero(cddp__cdev *d, void *p, size_t bytes);
/* Device memory d keeps for the context outside the arena (at least bytes, grown as needed), for
 * an op's temporary that only the kernels it queues before its next call read (a device runs its
 * kernels in order); NULL (the failure latched) when out of memory. */
void *cddp__dreuse(cddp__cdev *d, size_t bytes);
/* A tensor header in the host arena (data NULL) on d's device (d NULL: the context's); shape
 * checked. */
cddp_tensor *cddp__tensor_header(cddp_ctx *ctx, cddp__cdev *d, cddp_dtype dtype, int ndim,
                                 const int64_t *shape);
/* cddp_empty on d's device. */
cddp_tensor *cddp__empty(cddp__cdev *d, cddp_dtype dtype, int ndim, const int64_t *shape);
/* Aborts naming op unless t is float32 and row-major (_any: in any layout); _nchw: unless t is
 * row-major (see tensor.h's "Layouts"). */
void cddp__need_f32(const char *op, const cddp_tensor *t);
void cddp__need_f32_any(const char *op, const cddp_tensor *t);
void cddp__need_nchw(const char *op, const cddp_tensor *t);
/* t's data for a kernel's float32 argument (x) or its bf16 one (x16, activations in bf16): NULL for
 * the other dtype, or when there is no t. */
static inline float *cddp__f32_data(const cddp_tensor *t) {
    return t && t->dtype == CDDP_F32 ? (float *)t->data : NULL;
}
static inline uint16_t *cddp__bf16_data(const cddp_tensor *t) {
    return t && t->dtype == CDDP_BF16 ? (uint16_t *)t->data : NULL;
}
/* Where element i (in row-major order) of t lies in its data, blocked or not. */
int64_t cddp__blocked_offset(const cddp_tensor *t, int64_t i);
/* Host memory holding n bytes for the host to fill and then cddp__upload into dst on d: dst
 * itself where the host may write d's memory, else a host arena buffer. */
void *cddp__staging(cddp__cdev *d, void *dst, size_t n);
/* Makes dst hold the n bytes at src (from cddp__staging; nothing to do when src is dst). */
void cddp__upload(cddp__cdev *d, void *dst, const void *src, size_t n);

/* ---- tape.c ------------------------------------------------------------------------------ */

/* Whether an op on these inputs records a node (gradients enabled, an input requires one). */
bool cddp__will_record(const cddp_ctx *ctx, int n, cddp_tensor *const *in);
/* Records a node for op when gradients are enabled and an input requires one; marks out as
 * requiring a gradient. NULL when nothing was recorded (check ctx->err.code for a failure). */
cddp__node *cddp__record(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
                         cddp_tensor *const *in);
/* The node itself, whatever its inputs require: cddp__record's, and a node whose op decides for
 * itself whether it records (cddp_record_function). NULL when the arena ran out. */
cddp__node *cddp__record_node(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
                              cddp_tensor *const *in);
/* cddp__record for an op that returns out: false when the recording failed; *node (may be
 * NULL) receives the node or NULL. */
bool cddp__record_op(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin, cddp_tensor *const *in,
                     cddp__node **node);
/* The gradient buffer of the node's first input when it wants one: zeroed arena memory for a
 * tensor, the parameter's block for a parameter; NULL when it wants none or on a failure. */
float *cddp__input_grad(cddp_ctx *ctx, cddp__node *n);
/* The same through cddp_grad_buffer_assign. */
float *cddp__input_grad_assign(cddp_ctx *ctx, cddp__node *n, bool *assign);
/* After its node's backward: t's gradient released for the step's next ones (t->grad NULL),
 * unless t is a parameter, a leaf or retains it (cddp_retain_grad). */
void cddp__release_grad(cddp_ctx *ctx, cddp_tensor *t);
/* tape.c: gradient memory of numel floats (uninitialised) for a value inside one op's backward (a
 * fused op's intermediate), from the released gradients as cddp_grad_buffer's, and given back to
 * them; NULL (the failure latched) when out of memory. */
float *cddp__grad_scratch(cddp__cdev *d, int64_t numel);
void cddp__grad_scratch_release(cddp__cdev *d, float *p, int64_t numel);

/* ---- ops/dispatch.c: each op's backward (cddp__name_backward, from the list) ------------- */

#define CDDP__OP_BACKWARD(NAME, name) void cddp__##name##_backward(cddp_ctx *ctx, cddp__node *n);
CDDP_OP_LIST(CDDP__OP_BACKWARD)
#undef CDDP__OP_BACKWARD

#define CDDP__SHAPE(t) cddp_shape_str((t)->ndim, (t)->shape, (char[64]){0}, 64)

#endif
