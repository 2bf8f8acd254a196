/* tensor/internal.h: the tape node, the op list, and kernels shared by forward and backward.
 *
 * Each op that records appends one node to the context's tape (a linked list in the arena,
 * newest first). A node holds the op, its output, up to three inputs, the op's scalar arguments
 * and an op-specific saved buffer (softmax probabilities, im2col columns, pooling argmax,
 * dropout mask). autograd/backward.c turns a node back into gradients with one switch.
 */
#ifndef CDDP_TENSOR_INTERNAL_H
#define CDDP_TENSOR_INTERNAL_H

#include "cddp/core.h"
#include "cddp/tensor.h"

typedef enum cddp__op {
    CDDP_OP_RESHAPE,
    CDDP_OP_MATMUL,
    CDDP_OP_LINEAR,
    CDDP_OP_ADD,
    CDDP_OP_SUB,
    CDDP_OP_MUL,
    CDDP_OP_DIV,
    CDDP_OP_SCALE,
    CDDP_OP_RELU,
    CDDP_OP_GELU,
    CDDP_OP_TANH,
    CDDP_OP_SIGMOID,
    CDDP_OP_SOFTMAX,
    CDDP_OP_LOG_SOFTMAX,
    CDDP_OP_CROSS_ENTROPY,
    CDDP_OP_MSE,
    CDDP_OP_SUM,
    CDDP_OP_MEAN,
    CDDP_OP_CONV2D,
    CDDP_OP_MAX_POOL2D,
    CDDP_OP_DROPOUT,
    CDDP_OP_BATCH_NORM,
} cddp__op;

typedef struct cddp__node {
    cddp__op op;
    bool needed; /* the loss depends on it (set by backward) */
    int nin;
    cddp_tensor *out;
    cddp_tensor *in[3];
    struct cddp__node *prev; /* the node recorded before this one */
    union {
        struct {
            bool ta, tb;
        } mm;
        float scalar;
        cddp_reduction reduction;
        struct {
            int stride, padding;
        } conv;
        struct {
            int kernel, stride, padding;
        } pool;
        bool training; /* batch_norm: batch statistics (else the running ones) */
    } arg;
    void *saved;
} cddp__node;

struct cddp_ctx {
    cddp_arena *arena;
    cddp__node *tape; /* newest node */
    cddp_rng rng;
    bool grad_enabled;
    bool backward_done;
    cddp_error err;
    double backward_t0; /* when the last backward began (cddp_now_s) */
    /* callbacks queued during the running backward (cddp_backward_queue_callback) */
    int ncallbacks;
    struct {
        int (*fn)(void *, cddp_ctx *, cddp_error *);
        void *user;
    } callbacks[8];
};

/* Records a node for op when gradients are enabled and an input requires one; marks out as
 * requiring a gradient. NULL when nothing was recorded (check ctx->err.code for a failure). */
cddp__node *cddp__record(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
                         cddp_tensor *const *in);

#define CDDP__FAILED(ctx) ((ctx)->err.code != CDDP_OK)

/* Arena allocation that latches the failure into ctx. */
void *cddp__ctx_alloc(cddp_ctx *ctx, size_t bytes);
/* Zeroed float buffer for t->grad when t is not a parameter; the parameter's block otherwise. */
float *cddp__ensure_grad(cddp_ctx *ctx, cddp_tensor *t);

/* Row-major C = alpha * op(A) op(B) + beta * C, with A stored (M,K) or (K,M) when ta, B stored
 * (K,N) or (N,K) when tb. Leading dimensions are those of the stored matrices. */
void cddp__gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                const float *B, float beta, float *C);

/* im2col for one sample: x (C,H,W) -> col (C*KH*KW rows of OH*OW), rows ld floats apart, so a
 * batch's columns can sit side by side in one (C*KH*KW, N*OH*OW) matrix; zero padding.
 * col2im adds such columns back into x. */
void cddp__im2col(const float *x, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                  int stride, int pad, int64_t OH, int64_t OW, int64_t ld, float *col);
void cddp__col2im(const float *col, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                  int stride, int pad, int64_t OH, int64_t OW, int64_t ld, float *x);

/* Broadcast iteration: maps each output element to the flat index of a and of b. The shapes are
 * right-aligned into 4-D; strides are 0 along stretched dimensions. */
typedef struct cddp__bcast {
    int64_t shape[4];
    int64_t sa[4], sb[4];
    bool same; /* a, b and out have one shape: index i everywhere */
} cddp__bcast;

void cddp__bcast_init(cddp__bcast *bc, const cddp_tensor *a, const cddp_tensor *b,
                      const cddp_tensor *out);
#define CDDP__BCAST_FOR(bc, i, ia, ib, body)                                                       \
    do {                                                                                           \
        int64_t i = 0;                                                                             \
        for (int64_t d0 = 0; d0 < (bc)->shape[0]; d0++)                                            \
            for (int64_t d1 = 0; d1 < (bc)->shape[1]; d1++)                                        \
                for (int64_t d2 = 0; d2 < (bc)->shape[2]; d2++)                                    \
                    for (int64_t d3 = 0; d3 < (bc)->shape[3]; d3++, i++) {                         \
                        int64_t ia = d0 * (bc)->sa[0] + d1 * (bc)->sa[1] + d2 * (bc)->sa[2] +      \
                                     d3 * (bc)->sa[3];                                             \
                        int64_t ib = d0 * (bc)->sb[0] + d1 * (bc)->sb[1] + d2 * (bc)->sb[2] +      \
                                     d3 * (bc)->sb[3];                                             \
                        body;                                                                      \
                    }                                                                              \
    } while (0)

/* Label i as int64 from an int32 or int64 tensor. */
static inline int64_t cddp__label(const cddp_tensor *t, int64_t i) {
    return t->dtype == CDDP_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

#endif
