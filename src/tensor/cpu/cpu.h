/* tensor/cpu/cpu.h: the CPU device's kernels and the loops they share.
 *
 * The CPU device's files, lowest first (no circle):
 *
 *   vec.c        vectorised loops: exp, GELU, layer normalisation's rows, batch normalisation's
 *                sums on planes, ReLU, pooling, adds
 *   lanes.c      batch normalisation's loops on channel-blocked blocks, float32 and bf16
 *   attn.c       the products of one head of causal self-attention
 *   attn_bf16.c  the same in bf16, on AVX512-BF16
 *   attn_rows.c  attention by rows (flash_attention): the reference for the CUDA device's kernels
 *   gemm.c       GEMM (oneDNN's sgemm, OpenBLAS where oneDNN refuses), softmax rows
 *   dnnl.c       oneDNN's primitives (convolution, bf16 products), made once per shape (dnnl.h)
 *   matmul.c     the gemm kernel: float32 on gemm.c, bf16 on oneDNN's matmul
 *   <family>.c   the kernels of tensor/kernels.h, by op family (basic, activation, loss,
 *                transformer, norm, pool, conv)
 *   device.c     the device: memory, its queue (the calling thread), the kernel table
 *   par.c        a kernel's work split across the math threads
 *
 * Every kernel is called on the calling thread and has finished when it returns (its parts, where
 * it is split, on the math threads too).
 */
#ifndef CDDP_TENSOR_CPU_H
#define CDDP_TENSOR_CPU_H

#include "tensor/device.h"

#include <signal.h>
#include <string.h>

/* ---- the kernels (tensor/kernels.h) -------------------------------------------------------- */

/* par.c: a kernel's work split across the process's math threads (OpenMP's pool, oneDNN's).
 * cddp__cpu_parts: how many parts n units of work make: the math threads, at most n / grain (parts
 * of at least grain units), 1 inside a part. cddp__cpu_split runs fn(lo, hi, part, arg) over
 * [0, n) in that many contiguous parts, each on a thread of its own (part < parts: for a scratch
 * buffer per part), each but the first starting on a multiple of align; with 1 part, fn(0, n, 0,
 * arg) on the calling thread. A kernel so split computes each output element as a single call
 * over [0, n) would, so that its results do not depend on the number of threads: rows, heads or
 * elements that are independent of one another (align a multiple of the vector loops' width
 * where they are elements), never the terms of one sum. */
typedef void (*cddp__cpu_part)(int64_t lo, int64_t hi, int part, void *arg);
/* n rounded up to a multiple of 16: a part's share of scratch, so that each part's starts on 64
 * bytes (floats) */
static inline size_t cddp__up16(size_t n) {
    return (n + 15) / 16 * 16;
}
int cddp__cpu_parts(int64_t n, int64_t grain);
/* The values a part of an elementwise or row kernel takes at least (fewer cost more to hand to a
 * thread than they save), and the parts of rows of cols values: of at least that many values, at
 * most one a row. */
#define CDDP__CPU_GRAIN 16384
int cddp__cpu_row_parts(int64_t rows, int64_t cols);
/* The parts of the columns of rows of cols values, for a kernel that sums over the rows (column
 * sums: each part its columns over every row, in order): of at least that many values, and at
 * least 64 columns each. */
int cddp__cpu_col_parts(int64_t rows, int64_t cols);
/* The three usual splits, without scratch per part: n values (parts of CDDP__CPU_GRAIN, starting
 * on multiples of 16), rows of cols values (cddp__cpu_row_parts), and the columns of rows of cols
 * values (cddp__cpu_col_parts, starting on multiples of 16). */
void cddp__cpu_split_values(int64_t n, cddp__cpu_part fn, const void *arg);
void cddp__cpu_split_rows(int64_t rows, int64_t cols, cddp__cpu_part fn, const void *arg);
void cddp__cpu_split_cols(int64_t rows, int64_t cols, cddp__cpu_part fn, const void *arg);
void cddp__cpu_split(int64_t n, int64_t align, int parts, cddp__cpu_part fn, void *arg);
/* Around every call into oneDNN (gemm.c, dnnl.c): the asynchronous signals blocked on the calling
 * thread (its mask before in *old), and put back (par.c says why). */
void cddp__cpu_shield(sigset_t *old);
void cddp__cpu_unshield(const sigset_t *old);

#define CDDP__CPU_DECL(name) void cddp__cpu_##name(cddp__kq *q, const cddp__k_##name *a);
CDDP_KERNEL_LIST(CDDP__CPU_DECL)
#undef CDDP__CPU_DECL
int cddp__cpu_blocked_size(void);
bool cddp__cpu_conv_pool_fuses(const cddp__conv_geom *g);
/* conv.c: whether conv2d_grad of g takes dy16 (in bf16 on the processor's bf16 units) */
bool cddp__cpu_conv_grad_takes_bf16(const cddp__conv_geom *g);
/* attn_rows.c: whether attention runs by rows: never on the CPU (cddp__kernels.attends_by_rows) */
bool cddp__cpu_attends_by_rows(int64_t B, int64_t T, int64_t NH, int64_t HS, cddp_dtype compute);
/* matmul.c: whether the gemm kernel multiplies in dtype here (cddp__kernels.computes); that it
 * takes bf16 operands and a bias (cddp__kernels.gemm_takes_bf16: always); whether bf16 products
 * run on the processor's bf16 units (else, when allowed, they are emulated: their
 * operands rounded by cddp__bf16_round, to nearest even, and multiplied in float32). */
int cddp__cpu_computes(cddp_dtype dtype, const char **how, cddp_error *err);
bool cddp__cpu_gemm_takes_bf16(void);
bool cddp__cpu_bf16_native(void);
void cddp__bf16_round(float *dst, const float *src, int64_t n);
/* (rows, cols) floats, rows ld apart, rounded to bf16: into dst as float32 (dense), or as bf16
 * with rows ldd apart (with AVX512-BF16's conversion where the processor has it). */
void cddp__bf16_round_rows(float *dst, const float *src, int64_t ld, int64_t rows, int64_t cols);
void cddp__to_bf16_rows(uint16_t *dst, int64_t ldd, const float *src, int64_t ld, int64_t rows,
                        int64_t cols);
/* n floats rounded to bf16 into dst, as cddp__round_bf16 rounds them (AVX512-BF16's conversion, or
 * AVX2's integer lanes, where the processor has them) */
void cddp__bf16_narrow_n(uint16_t *dst, const float *src, int64_t n);
/* x rounded to bf16, to nearest with ties to even; a NaN stays a (quiet) NaN. */
static inline uint16_t cddp__round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* The same without the branch, so that a loop calling it vectorises: both results made, one kept.
 */
static inline uint16_t cddp__round_bf16_lanes(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t even = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : even);
}
/* A bf16 value as float32 (exact). */
static inline float cddp__bf16_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* x rounded to bf16 (cddp__round_bf16) and widened back: the value a bf16 product reads. */
static inline float cddp__bf16_rounded(float x) {
    return cddp__bf16_widen(cddp__round_bf16(x));
}
/* The answers to cddp__kernels' questions, for a table of the CPU's kernels (the CPU's, and the
 * emulated device's, which runs them). */
#define CDDP__CPU_QUESTIONS                                                                        \
    .blocked_size = cddp__cpu_blocked_size, .conv_pool_fuses = cddp__cpu_conv_pool_fuses,          \
    .computes = cddp__cpu_computes, .gemm_takes_bf16 = cddp__cpu_gemm_takes_bf16,                  \
    .conv_grad_takes_bf16 = cddp__cpu_conv_grad_takes_bf16

/* ---- vec.c: vectorised loops -------------------------------------------------------------- */

/* n bf16 values as float32 (exact); n floats rounded to bf16 and widened back (cddp__bf16_rounded;
 * dst may be src) */
void cddp__bf16_widen_n(float *dst, const uint16_t *src, int64_t n);
void cddp__bf16_round_n(float *dst, const float *src, int64_t n);

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

/* ---- lanes.c: batch normalisation's loops over a block of P positions of B channels side by
 * side (x[p B + k], B at most 16), per channel k: out[k] += sum_p x, or (x - m[k])^2; y = (x -
 * m[k]) s[k] + b[k], with r (else none) + r, with relu max(that, 0), in one pass; dx += k[j] (d -
 * a[j] - (x - m[j]) b[j]) (= when assign). */
/* A block's values as those loops read them: float32 (f) or bf16 (h, widened exactly in the
 * loop), the other NULL (both NULL: none). */
typedef struct cddp__vals {
    const float *f;
    const uint16_t *h;
} cddp__vals;
void cddp__lanes_sum(cddp__vals x, int64_t P, int64_t B, double *out);
void cddp__lanes_sq_dev(cddp__vals x, const float *m, int64_t P, int64_t B, double *out);
/* batch normalisation's backward sums of a block, dy masked by y > 0 (y not none; y and x of one
 * dtype) and stored into g_out (when not NULL; it may be dy) on the way: out_s += sum g, out_t +=
 * sum g (x - m) */
void cddp__lanes_grad_sums(float *dy, cddp__vals y, cddp__vals x, const float *m, float *g_out,
                           int64_t P, int64_t B, double *out_s, double *out_t);
/* into y, or (x in bf16) into y16 rounded to nearest even; r float32, or bf16 with a bf16 x */
void cddp__lanes_normalize(cddp__vals x, const float *m, const float *s, const float *b,
                           cddp__vals r, bool relu, float *y, uint16_t *y16, int64_t P, int64_t B);
void cddp__lanes_norm_grad_into(float *dx, const float *d, cddp__vals x, const float *k,
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
 * each window's maximum where that is positive, 0 elsewhere. tile: B W floats of scratch. */
void cddp__relu_pool2x2_lanes(const float *x, const cddp__lanes *l, int64_t N, int64_t C, int64_t H,
                              int64_t W, float *y, int8_t *code, float *tile);
void cddp__relu_pool2x2_lanes_grad(const int8_t *code, const float *dy, const cddp__lanes *l,
                                   int64_t N, int64_t C, int64_t H, int64_t W, float *dx,
                                   float *tile);
/* y += g exp((x - m) - ls), or y = when assign: g times a row's softmax, from its largest value m
 * and the log ls of its sum of exp(x - m) (cross-entropy's gradient) */
void cddp__add_softmax_scaled(float *y, const float *x, float m, float ls, float g, int64_t n,
                              bool assign);
/* y = GELU(x) with the tanh approximation, keeping its slope GELU'(x) in s for the gradient;
 * dx += s dy (dx = when assign). */
void cddp__gelu_tanh_rows(const float *x, float *y, int64_t n);
void cddp__gelu_tanh_grad(const float *x, const float *dy, float *dx, int64_t n, bool assign);
/* LayerNorm over rows of C (w and b never NULL), keeping each row's mean and 1/std; the input's
 * gradient (stored when assign, else added; scratch: 2 C floats); and the weight's and bias's
 * (either may be NULL), added over the rows in order, for C columns of rows ld apart. */
void cddp__layer_norm_rows(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t rows, int64_t C, float eps);
void cddp__layer_norm_grad(const float *x, const float *w, const float *dy, const float *mean,
                           const float *rstd, float *dx, bool assign, int64_t rows, int64_t C,
                           float *scratch);
void cddp__layer_norm_wgrad(const float *x, const float *dy, const float *mean, const float *rstd,
                            float *dw, float *db, int64_t rows, int64_t C, int64_t ld);

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

/* ---- attn_bf16.c: the same products in bf16 (AVX512-BF16 only; see there) ---------------- */

/* Float32 (rows, cols), rows ld apart, packed as bf16 pairs: along its rows (rows x (cols+1)/2
 * words), of neighbouring rows ((rows+1)/2 x UP32(cols)), of each row transposed ((cols+1)/2 x
 * UP32(rows)); UP32 rounds up to a multiple of 32. */
void cddp__bf16_pack_rows(uint32_t *dst, const float *m, int64_t ld, int64_t rows, int64_t cols);
void cddp__bf16_pack_pairs(uint32_t *dst, const float *m, int64_t ld, int64_t rows, int64_t cols);
void cddp__bf16_pack_cols(uint32_t *dst, const float *m, int64_t ld, int64_t rows, int64_t cols);
/* A lower-triangular (T, T) matrix (attention's P, dS; rows T apart) packed as rows for
 * attn_mix_bf16 or as pairs for attn_mix_t_bf16, in those layouts, but only the words they read:
 * about half. */
void cddp__bf16_pack_rows_causal(uint32_t *dst, const float *m, int64_t T);
void cddp__bf16_pack_pairs_causal(uint32_t *dst, const float *m, int64_t T);
/* attn.c's three products on packed operands: a (T, HS) packed as rows, bt as the columns of the
 * (T, HS) it is the transpose of; w (T, T) as rows (mix) or pairs (mix_t), x (T, HS) as pairs;
 * s's tiles reaching the diagonal are written (some columns above it too). */
void cddp__attn_scores_bf16(const uint32_t *a, const uint32_t *bt, int64_t T, int64_t HS,
                            float scale, float *s);
void cddp__attn_mix_bf16(const uint32_t *w, const uint32_t *x, int64_t T, int64_t HS, float scale,
                         float *o, int64_t ldo, bool accumulate);
void cddp__attn_mix_t_bf16(const uint32_t *w, const uint32_t *x, int64_t T, int64_t HS, float scale,
                           float *o, int64_t ldo, bool accumulate);

/* ---- gemm.c ------------------------------------------------------------------------------ */

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

#endif
