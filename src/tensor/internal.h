/* tensor/internal.h: the step context, the tape node, and what the op families share.
 *
 * The tensor module's files, lowest first (no circle):
 *
 *   tensor.c        the context, tensor creation, the random generator
 *   kernels.c       kernels forward and backward share: GEMM, broadcasting, softmax rows
 *   dnnl.c          oneDNN's primitives (convolution), made once per shape (dnnl.h)
 *   vec.c           vectorised loops: exp, GELU, layer normalisation's rows, adds
 *   attn.c          the products of one head of causal self-attention
 *   tape.c          recording a node when gradients flow, the nodes' public accessors
 *   ops/<family>.c  each op's forward and backward side by side (linear, elementwise,
 *                   activation, loss, reduce, conv, pool, norm, dropout, shape, layout; metrics
 *                   are not differentiable)
 *   ops/dispatch.c  the backward of a node, from the op list (ops/list.h)
 *
 * Each op that records appends one node to the context's tape (a linked list in the arena,
 * newest first). A node holds the op, its output, up to four inputs, the op's scalar arguments
 * and an op-specific saved buffer (softmax probabilities, max pooling's argmax, dropout mask). What
 * a backward pass keeps (which nodes are needed, parameters' pending uses, the callbacks) is
 * autograd's, not the context's.
 */
#ifndef CDDP_TENSOR_INTERNAL_H
#define CDDP_TENSOR_INTERNAL_H

#include "cddp/core.h"
#include "cddp/tensor.h"
#include "tensor/ops/list.h"

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
        bool training; /* batch_norm: batch statistics (else the running ones) */
    } arg;
    void *saved;
};
typedef struct cddp__node cddp__node;

struct cddp_ctx {
    cddp_arena *arena;
    cddp__node *tape; /* newest node */
    int nnodes;       /* on the tape */
    cddp_rng rng;
    bool grad_enabled;
    cddp_error err;
    void *step_state; /* a higher layer's, for this step (autograd's backward) */
};

#define CDDP__FAILED(ctx) ((ctx)->err.code != CDDP_OK)

/* ---- tensor.c ---------------------------------------------------------------------------- */

/* Arena allocation that latches the failure into ctx. */
void *cddp__ctx_alloc(cddp_ctx *ctx, size_t bytes);
/* A tensor header in the arena (data NULL); shape checked. */
cddp_tensor *cddp__tensor_header(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape);
/* Aborts naming op unless t is float32 and row-major (_any: in any layout); _nchw: unless t is
 * row-major (see tensor.h's "Layouts"). */
void cddp__need_f32(const char *op, const cddp_tensor *t);
void cddp__need_f32_any(const char *op, const cddp_tensor *t);
void cddp__need_nchw(const char *op, const cddp_tensor *t);
/* Where element i (in row-major order) of t lies in its data, blocked or not. */
int64_t cddp__blocked_offset(const cddp_tensor *t, int64_t i);
/* A float32 scalar holding v. */
cddp_tensor *cddp__scalar(cddp_ctx *ctx, float v);

/* ---- tape.c ------------------------------------------------------------------------------ */

/* Whether an op on these inputs records a node (gradients enabled, an input requires one). */
bool cddp__will_record(const cddp_ctx *ctx, int n, cddp_tensor *const *in);
/* Records a node for op when gradients are enabled and an input requires one; marks out as
 * requiring a gradient. NULL when nothing was recorded (check ctx->err.code for a failure). */
cddp__node *cddp__record(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
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

/* ---- ops/dispatch.c: each op's backward (cddp__name_backward, from the list) ------------- */

#define CDDP__OP_BACKWARD(NAME, name) void cddp__##name##_backward(cddp_ctx *ctx, cddp__node *n);
CDDP_OP_LIST(CDDP__OP_BACKWARD)
#undef CDDP__OP_BACKWARD

/* ---- vec.c: vectorised loops -------------------------------------------------------------- */

/* y = exp(x - shift), returning the sum of y. */
float cddp__exp_shifted(const float *x, float shift, float *y, int64_t n);
/* sum x[i], and sum (x[i] - m)^2, in 8 lanes (float) */
float cddp__sum(const float *x, int64_t n);
float cddp__sq_dev(const float *x, float m, int64_t n);
/* y = (x - m) s + b */
void cddp__normalize(const float *x, float m, float s, float b, float *y, int64_t n);
/* sum x[i] y[i], and sum d[i] (x[i] - m) */
float cddp__dot(const float *x, const float *y, int64_t n);
float cddp__dot_dev(const float *d, const float *x, float m, int64_t n);
/* dx[i] += k (d[i] - a - (x[i] - m) b) (= when assign): batch normalisation's input gradient */
void cddp__norm_grad_into(float *dx, const float *d, const float *x, float k, float a, float m,
                          float b, int64_t n, bool assign);
/* Batch normalisation's loops over a block of P positions of B channels side by side (x[p B + k],
 * B at most 16), per channel k: out[k] += sum_p x, (x - m[k])^2, or d (x - m[k]); y = (x - m[k])
 * s[k] + b[k]; dx += k[j] (d - a[j] - (x - m[j]) b[j]) (= when assign). */
void cddp__lanes_sum(const float *x, int64_t P, int64_t B, double *out);
void cddp__lanes_sq_dev(const float *x, const float *m, int64_t P, int64_t B, double *out);
void cddp__lanes_dot_dev(const float *d, const float *x, const float *m, int64_t P, int64_t B,
                         double *out);
void cddp__lanes_normalize(const float *x, const float *m, const float *s, const float *b, float *y,
                           int64_t P, int64_t B);
void cddp__lanes_norm_grad_into(float *dx, const float *d, const float *x, const float *k,
                                const float *a, const float *m, const float *b, int64_t P,
                                int64_t B, bool assign);
/* out[i] += sum_j y[j] x[off[i] + j] (j < n) for the k offsets, 8 at a time in one pass over y */
void cddp__dot_offsets(const float *y, const float *x, const int64_t *off, int64_t k, int64_t n,
                       double *out);
/* The largest of x[0..n) (-inf for n = 0). */
float cddp__max(const float *x, int64_t n);
void cddp__scale_into(float *y, float s, int64_t n);
/* acc += x */
void cddp__add_into(float *restrict acc, const float *restrict x, int64_t n);
/* y = max(x, 0); dx += dy where y > 0 (dx = when assign, 0 elsewhere) */
void cddp__relu(const float *x, float *y, int64_t n);
void cddp__relu_grad(const float *y, const float *dy, float *dx, int64_t n, bool assign);
/* 2x2, stride 2, unpadded max pooling of planes (H,W) planes into (OH,OW) ones (with relu, of
 * max(x, 0), a NaN counting as 0): the maxima into y and, when arg is not NULL, each one's index
 * in its plane; the first maximum in row-major window order wins, a NaN wins and stays. Its
 * gradient written into every element of dx: dy at each window's maximum (with y, a ReLU's
 * pooling, only where y is positive), 0 elsewhere (an odd last row or column too). */
void cddp__max_pool2x2(const float *x, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                       float *y, int32_t *arg, bool relu);
void cddp__max_pool2x2_grad(const int32_t *arg, const float *dy, const float *y, float *dx,
                            int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW);
/* A 4-D (N,C,H,W) layout with the channels innermost in groups of B: element (n, c, h, w) at
 * n sN + (c / B) sG + h sH + w sW + c % B. oneDNN's blocked nChw16c is B 16, sW 16; NHWC one group
 * of B = C; cddp's plain NCHW B 1, sG H W, sW 1. */
typedef struct cddp__lanes {
    int64_t B, sN, sG, sH, sW;
} cddp__lanes;
/* max(x, 0) max-pooled 2x2 with stride 2, x (N,C,H,W) in layout l with B > 1, into y (N,C,H/2,W/2)
 * plain: cddp__max_pool2x2's values. With code (N, groups, H/2, W/2, B int8), each maximum's
 * place in its window (0..3 in row-major order, the first of equals) or -1 where it is 0. Its
 * gradient, into every element of dx (layout l, padding lanes too): dy (plain, the shape of y) at
 * each window's maximum where that is positive, 0 elsewhere. tile: B (W / 2) floats of scratch. */
void cddp__relu_pool2x2_lanes(const float *x, const cddp__lanes *l, int64_t N, int64_t C, int64_t H,
                              int64_t W, float *y, int8_t *code, float *tile);
void cddp__relu_pool2x2_lanes_grad(const int8_t *code, const float *dy, const cddp__lanes *l,
                                   int64_t N, int64_t C, int64_t H, int64_t W, float *dx,
                                   float *tile);
/* y += g exp(x), or y = g exp(x) when assign */
void cddp__add_exp_scaled(float *y, const float *x, float g, int64_t n, bool assign);
/* y = GELU(x) with the tanh approximation, keeping tanh's value in t for the gradient;
 * dx += dy GELU'(x) (dx = when assign). */
void cddp__gelu_tanh_rows(const float *x, float *y, float *t, int64_t n);
void cddp__gelu_tanh_grad(const float *x, const float *t, const float *dy, float *dx, int64_t n,
                          bool assign);
/* LayerNorm over rows of C (w and b never NULL), keeping each row's mean and 1/std; and its
 * gradients (dx, dw, db may each be NULL; dx stored when assign, else added; scratch: 2 C
 * floats). */
void cddp__layer_norm_rows(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t rows, int64_t C, float eps);
void cddp__layer_norm_grad(const float *x, const float *w, const float *dy, const float *mean,
                           const float *rstd, float *dx, bool assign, float *dw, float *db,
                           int64_t rows, int64_t C, float *scratch);

/* ---- attn.c: one head of causal self-attention (see there) --------------------------------- */

/* s[t][j] = scale sum_d a[t][d] bt[d][j] on and below the diagonal (tiles above it untouched). */
void cddp__attn_scores(const float *a, int64_t lda, const float *bt, int64_t T, int64_t HS,
                       float scale, float *s);
/* o[t][d] (+)= scale sum_{j <= t} w[t][j] x[j][d], w (T, T) zero above its diagonal. */
void cddp__attn_mix(const float *w, const float *x, int64_t ldx, int64_t T, int64_t HS, float scale,
                    float *o, int64_t ldo, bool accumulate);
/* o[j][d] (+)= scale sum_{t >= j} w[t][j] x[t][d]. */
void cddp__attn_mix_t(const float *w, const float *x, int64_t ldx, int64_t T, int64_t HS,
                      float scale, float *o, int64_t ldo, bool accumulate);
/* xt (HS, T) = x (T, HS, rows ldx apart) transposed. */
void cddp__attn_transpose(const float *x, int64_t ldx, int64_t T, int64_t HS, float *xt);

/* ---- kernels.c --------------------------------------------------------------------------- */

/* Row-major C = alpha * op(A) op(B) + beta * C, with A stored (M,K) or (K,M) when ta, B stored
 * (K,N) or (N,K) when tb. Leading dimensions are those of the stored matrices. */
void cddp__gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                const float *B, float beta, float *C);

/* cddp__gemm with explicit leading dimensions (row strides, in floats) of the stored A, B and C:
 * for matrices that are slices of a wider one (a head of an attention's qkv). */
void cddp__gemm_ld(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* Writes log_softmax (take_log) or softmax of each row of length C. */
void cddp__softmax_rows(const float *x, float *y, int64_t rows, int64_t C, bool take_log);

/* acc[i] += x[i] for buffers that never overlap (vectorises without branches). */

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

#define CDDP__SHAPE(t) cddp_shape_str((t)->ndim, (t)->shape, (char[64]){0}, 64)

#endif
