/* tensor/kernels.h: every kernel a device runs, once: its arguments and the table that holds a
 * device's implementation of each.
 *
 * A kernel is the part of an op that touches tensor data: an op (src/tensor/ops/) checks shapes,
 * allocates its output and records its node, then calls its device's kernel through the table,
 * `CDDP__K(q, relu, .x = ..., .y = ..., .n = ...)`, never asking which device that is. Each
 * kernel's arguments are listed once, as F(type, name) entries of a CDDP__KA_<name> list; the
 * list makes the argument struct (cddp__k_<name>) and lets a device that runs kernels later, on
 * its own queue (the emulated device), copy a call and find the device pointers in it. Pointers
 * in a kernel's arguments are device memory of the kernel's device, or NULL where an argument
 * says it may be; nothing else a kernel reads may hold a device pointer it did not make itself.
 *
 * Kernels return nothing: they run in queue order on their device, maybe after the call returned.
 * A kernel that finds bad data (a label out of range) reports it through its queue
 * (cddp__kq_fail), and the op's context latches the first such error. Scratch memory a kernel
 * needs beyond its arguments comes from cddp__kq_scratch: the step arena of the context that
 * called it, valid until that context resets.
 *
 * Unless a kernel says otherwise, `assign` means the kernel stores into its output gradient (a
 * fresh buffer), and without it adds (a gradient that has other contributions).
 *
 * Adding a kernel: its CDDP__KA_ list and one K() line below, then its implementation on every
 * device (src/tensor/cpu/ first: the others are tested against it).
 */
#ifndef CDDP_TENSOR_KERNELS_H
#define CDDP_TENSOR_KERNELS_H

#include "cddp/tensor.h"
#include "cddp/internal/device.h"

/* ---- shared argument types ----------------------------------------------------------------- */

/* Broadcast iteration (elementwise ops): the shapes right-aligned into 4-D; strides 0 along
 * stretched dimensions. */
typedef struct cddp__bcast {
    int64_t shape[4];
    int64_t sa[4], sb[4];
    bool same; /* a, b and out have one shape: index i everywhere */
} cddp__bcast;

/* A 2-D convolution's shape: x (N,C,H,W) in x_block's layout, w (O,C/groups,KH,KW), the output
 * (N,O,OH,OW) in out_block's (0: row-major; else channel-blocked, tensor.h's "Layouts"). compute:
 * the precision of its products, as the gemm kernel's (CDDP_BF16: x, w and the output's gradient
 * rounded to bf16, the sums in float32 into float32 results). */
typedef struct cddp__conv_geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW;
    int stride, pad, groups;
    int x_block, out_block;
    bool bias;  /* b given */
    bool train; /* the forward is for training: keep what the backward needs */
    cddp_dtype compute;
} cddp__conv_geom;

/* The arithmetic of the binary and unary elementwise kernels. */
typedef enum cddp__binop { CDDP__ADD, CDDP__SUB, CDDP__MUL, CDDP__DIV } cddp__binop;
typedef enum cddp__unop { CDDP__RELU, CDDP__GELU, CDDP__TANH, CDDP__SIGMOID } cddp__unop;

/* Element i of an int32 or int64 tensor's data (labels, token ids) as int64. */
static inline int64_t cddp__index_at(const void *ids, cddp_dtype dtype, int64_t i) {
    return dtype == CDDP_I64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
}

/* ---- the arguments of each kernel ---------------------------------------------------------- */

/* The argument lists and the kernel list below are laid out by hand: clang-format reflows these
 * macro bodies differently on every pass. */
/* clang-format off */

/* n elements of `size` bytes (1, 2, 4 or 8) set to the low bytes of `bits` */
#define CDDP__KA_fill(F) F(void *, dst) F(int64_t, n) F(int, size) F(uint64_t, bits)
/* dst = src (assign) or dst += src, n floats */
#define CDDP__KA_accumulate(F) F(float *, dst) F(const float *, src) F(int64_t, n) F(bool, assign)
/* for each row i < rows: dst[i dst_stride ..][:cols] += src[i src_stride ..][:cols] (a stride
 * of 0 repeats one row: a bias added to every row, a bias's gradient summed over them) */
#define CDDP__KA_add_rows(F)                                                                       \
    F(float *, dst)                                                                                \
    F(const float *, src) F(int64_t, rows) F(int64_t, cols) F(int64_t, dst_stride)                 \
        F(int64_t, src_stride)
/* y = s x (add: y += s x); y may be x */
#define CDDP__KA_scale(F) F(float *, y) F(const float *, x) F(float, s) F(int64_t, n) F(bool, add)
/* y = a b elementwise (add: y += a b) */
#define CDDP__KA_mul(F)                                                                            \
    F(float *, y) F(const float *, a) F(const float *, b) F(int64_t, n) F(bool, add)

/* Row-major C = alpha op(A) op(B) + beta C; A stored (M,K) or, ta, (K,M); B (K,N) or, tb,
 * (N,K); leading dimensions those of the stored matrices. compute: CDDP_F32, or CDDP_BF16 (the
 * operands rounded to bf16, their products added in float32: mixed precision's products; only
 * where the device's `computes` says so).
 * Only where the device's gemm_takes_bf16 says so (else NULL): A16 (B16), with compute CDDP_BF16,
 * is the operand already rounded by to_bf16, stored as A (B) would be but densely (lda: its
 * stored columns), used instead of A (B), which may then be NULL; bias (N floats) is added to
 * every row of C, as C = op(A) op(B) + bias + beta C (alpha 1).
 * batch (0 or 1: one product): that many products of one shape, the i-th of A + i stride_a and
 * B + i stride_b into C + i stride_c (strides in floats); not with A16, B16 or bias. */
#define CDDP__KA_gemm(F)                                                                           \
    F(bool, ta)                                                                                    \
    F(bool, tb) F(int64_t, M) F(int64_t, N) F(int64_t, K) F(float, alpha) F(const float *, A)      \
        F(int64_t, lda) F(const float *, B) F(int64_t, ldb) F(float, beta) F(float *, C)           \
            F(int64_t, ldc) F(cddp_dtype, compute) F(const uint16_t *, A16)                        \
                F(const uint16_t *, B16) F(const float *, bias) F(int64_t, batch)                  \
                    F(int64_t, stride_a) F(int64_t, stride_b) F(int64_t, stride_c)
/* dst (rows, cols, dense) = src (rows ld apart) rounded to bf16, to nearest even (the operands of
 * gemm's A16 and B16); with colsum (else NULL), colsum[c] += src's column sums, in float32 and
 * rows in order (a linear's bias gradient, in the pass that rounds its output's gradient) */
#define CDDP__KA_to_bf16(F)                                                                        \
    F(uint16_t *, dst)                                                                             \
    F(const float *, src) F(int64_t, rows) F(int64_t, cols) F(int64_t, ld) F(float *, colsum)

/* 16-bit floats for the wire (DDP's bf16/fp16 compression): narrow, h = f rounded to nearest even
 * (bf16, or IEEE half with f16; a NaN stays a NaN); widen, f = scale h, n values */
#define CDDP__KA_cast16(F)                                                                         \
    F(uint16_t *, h) F(float *, f) F(int64_t, n) F(bool, f16) F(bool, widen) F(float, scale)

/* z = a op b over the broadcast bc, n outputs */
#define CDDP__KA_binary(F)                                                                         \
    F(cddp__binop, op)                                                                             \
    F(cddp__bcast, bc) F(const float *, a) F(const float *, b) F(float *, z) F(int64_t, n)
/* da += d(a op b)/da dz and db likewise (either may be NULL) */
#define CDDP__KA_binary_grad(F)                                                                    \
    F(cddp__binop, op)                                                                             \
    F(cddp__bcast, bc) F(const float *, dz) F(const float *, a) F(const float *, b) F(float *, da) \
        F(float *, db)
/* y = f(x) (GELU: the erf form) */
#define CDDP__KA_unary(F) F(cddp__unop, op) F(const float *, x) F(float *, y) F(int64_t, n)
/* dx (+)= f'(x) dy, from x or the output y */
#define CDDP__KA_unary_grad(F)                                                                     \
    F(cddp__unop, op)                                                                              \
    F(const float *, x) F(const float *, y) F(const float *, dy) F(float *, dx) F(int64_t, n)      \
        F(bool, assign)
/* softmax (or log_softmax) of each row of C */
#define CDDP__KA_softmax(F)                                                                        \
    F(const float *, x) F(float *, y) F(int64_t, rows) F(int64_t, C) F(bool, log)
/* in place, rows of T (a causal attention's scores, T queries of T keys each): row r becomes the
 * softmax of its first r % T + 1 values, zeros after */
#define CDDP__KA_causal_softmax(F) F(float *, s) F(int64_t, rows) F(int64_t, T)
/* its backward, in place: with p its rows' output, row r of d (dP on entry) becomes
 * p (dP - sum(dP p)) on its first r % T + 1 values, zeros after */
#define CDDP__KA_causal_softmax_grad(F)                                                            \
    F(const float *, p) F(float *, d) F(int64_t, rows) F(int64_t, T)
/* dx += the softmax's (log_softmax's) input gradient, from its output y */
#define CDDP__KA_softmax_grad(F)                                                                   \
    F(const float *, y)                                                                            \
    F(const float *, dy) F(float *, dx) F(int64_t, rows) F(int64_t, C) F(bool, log)

/* Fails the queue (CDDP_ERANGE) at the first of the n ids (int32 or int64) outside [0, limit),
 * with fmt's message: fmt takes the id, its position, limit and limit - 1 (four long longs). */
#define CDDP__KA_check_ids(F)                                                                      \
    F(const void *, ids) F(cddp_dtype, dtype) F(int64_t, n) F(int64_t, limit) F(const char *, fmt)
/* loss[0] = -sum_i logp[i, label_i] (/ N when mean), logp = log_softmax(logits) (N,C) row by row
 * as (x - m) - ls, with m the row's largest value and ls the log of its sum of exp(x - m); stats
 * (2 N floats) keeps each row's m and ls, from which the backward makes the softmax again (the
 * log-probabilities are never stored: the GPT-2 classifier's would be 16,384 x 50,304 floats) */
#define CDDP__KA_cross_entropy(F)                                                                  \
    F(const float *, logits)                                                                       \
    F(const void *, labels) F(cddp_dtype, dtype) F(float *, stats) F(float *, loss) F(int64_t, N)  \
        F(int64_t, C) F(bool, mean)
/* dlogits (+)= (exp(logp) - onehot) dy[0] (/ N), logp made from the logits and the forward's
 * stats as the forward made it; or (dx16 given, dx NULL; only where gemm_takes_bf16 says so)
 * stored rounded to bf16 as to_bf16 rounds it, its column sums added into colsum (may be NULL) as
 * to_bf16 adds them: for the linear layer that made the logits (grad_half) */
#define CDDP__KA_cross_entropy_grad(F)                                                             \
    F(const float *, logits)                                                                       \
    F(const float *, stats) F(const void *, labels) F(cddp_dtype, dtype) F(const float *, dy)      \
        F(float *, dx) F(int64_t, N) F(int64_t, C) F(bool, mean) F(bool, assign)                   \
            F(uint16_t *, dx16) F(float *, colsum)
/* loss[0] = sum (p - t)^2 (/ n) */
#define CDDP__KA_mse(F)                                                                            \
    F(const float *, p) F(const float *, t) F(float *, loss) F(int64_t, n) F(bool, mean)
/* dp += 2 (p - t) dy[0] (/ n), dt -= the same (either may be NULL) */
#define CDDP__KA_mse_grad(F)                                                                       \
    F(const float *, p)                                                                            \
    F(const float *, t) F(const float *, dy) F(float *, dp) F(float *, dt) F(int64_t, n)           \
        F(bool, mean)
/* out[0] = sum x (/ n when mean), summed in double */
#define CDDP__KA_sum(F) F(const float *, x) F(float *, out) F(int64_t, n) F(bool, mean)
/* dx += dy[0] (/ n) */
#define CDDP__KA_sum_grad(F) F(const float *, dy) F(float *, dx) F(int64_t, n) F(bool, mean)
/* out[r] = the index of row r's first maximum; or, with labels, count[0] = how many rows' argmax
 * is their label */
#define CDDP__KA_argmax(F)                                                                         \
    F(const float *, x)                                                                            \
    F(int64_t *, out) F(const void *, labels) F(cddp_dtype, dtype) F(int64_t *, count)             \
        F(int64_t, rows) F(int64_t, C)

/* (N,C,H,W) between row-major and blocked by B (into: into the blocked layout); dst += with add */
#define CDDP__KA_reorder(F)                                                                        \
    F(const float *, src)                                                                          \
    F(float *, dst) F(int64_t, N) F(int64_t, C) F(int64_t, P) F(int64_t, B) F(bool, into)          \
        F(bool, add)

/* out[i] = table[ids[i]] (a table of V rows of C; check_ids checked the ids before, and as a device
 * may report that only later, a GPU's kernels skip an id outside [0, V) rather than read past the
 * table) */
#define CDDP__KA_embedding(F)                                                                      \
    F(const float *, table)                                                                        \
    F(const void *, ids) F(cddp_dtype, dtype) F(float *, out) F(int64_t, n) F(int64_t, V)          \
        F(int64_t, C)
/* dtable[ids[i]] += dy[i], positions in order */
#define CDDP__KA_embedding_grad(F)                                                                 \
    F(float *, dtable)                                                                             \
    F(const void *, ids) F(cddp_dtype, dtype) F(const float *, dy) F(int64_t, n) F(int64_t, V)     \
        F(int64_t, C)
/* LayerNorm over rows of C (w, b NULL: ones, zeros), each row's mean and 1/std kept */
#define CDDP__KA_layer_norm(F)                                                                     \
    F(const float *, x)                                                                            \
    F(const float *, w) F(const float *, b) F(float *, y) F(float *, mean) F(float *, rstd)        \
        F(int64_t, rows) F(int64_t, C) F(float, eps) F(uint16_t *, y16)
/* its gradients: dx (stored when assign), dw and db added (each may be NULL; w NULL: ones) */
#define CDDP__KA_layer_norm_grad(F)                                                                \
    F(const float *, x)                                                                            \
    F(const float *, w) F(const float *, dy) F(const float *, mean) F(const float *, rstd)         \
        F(float *, dx) F(bool, assign) F(float *, dw) F(float *, db) F(int64_t, rows)              \
            F(int64_t, C)
/* layer_norm's y16, gelu_tanh's and attention's out16 (may be NULL; only where the device's
 * gemm_takes_bf16 says so): the output rounded to bf16 as to_bf16 rounds it, as well, for the
 * linear layer it feeds in mixed precision (cddp_tensor.own.half) */
/* y = GELU(x), tanh approximation (y may be NULL when y16 is given: only the rounded copy is
 * made, for a product that reads nothing else of it); the gradient dx = GELU'(x) dy, the slope
 * made from x again, or (dx16 given, dx NULL; only where gemm_takes_bf16 says so) stored rounded
 * to bf16 as to_bf16 rounds it, rows of cols values, their column sums added into colsum (may be
 * NULL) as to_bf16 adds them: for the linear layer that made x (grad_half) */
#define CDDP__KA_gelu_tanh(F)                                                                      \
    F(const float *, x) F(float *, y) F(int64_t, n) F(uint16_t *, y16)
#define CDDP__KA_gelu_tanh_grad(F)                                                                 \
    F(const float *, x) F(const float *, dy) F(float *, dx) F(int64_t, n) F(bool, assign)          \
        F(uint16_t *, dx16) F(float *, colsum) F(int64_t, cols)
/* Llama's pieces. RMSNorm over rows of C: y = x rstd w, rstd = 1/sqrt(mean(x^2) + eps) kept per
 * row (w NULL: ones); its gradients: dx (stored when assign, else added) and dw added (may be
 * NULL) */
#define CDDP__KA_rms_norm(F)                                                                       \
    F(const float *, x) F(const float *, w) F(float *, y) F(float *, rstd) F(int64_t, rows)        \
        F(int64_t, C) F(float, eps)
#define CDDP__KA_rms_norm_grad(F)                                                                  \
    F(const float *, x) F(const float *, w) F(const float *, dy) F(const float *, rstd)            \
        F(float *, dx) F(bool, assign) F(float *, dw) F(int64_t, rows) F(int64_t, C)
/* SwiGLU's gate, y = silu(g) u elementwise; its gradients dg and du (each may be NULL; stored
 * when its assign, else added) */
#define CDDP__KA_silu_mul(F) F(const float *, g) F(const float *, u) F(float *, y) F(int64_t, n)
#define CDDP__KA_silu_mul_grad(F)                                                                  \
    F(const float *, g) F(const float *, u) F(const float *, dy) F(float *, dg) F(bool, assign_g)   \
        F(float *, du) F(bool, assign_u) F(int64_t, n)
/* Rotary positions (Llama's, Hugging Face's rotate_half layout): rows of x (B T rows of H heads
 * of D), row r at position pos0 + r mod T, each head's pair (i, i + D/2) turned by the angle
 * position inv_freq[i] (float32, as the reference computes it), or by minus it (inverse: the
 * backward, dx from dy); into y, stored (assign) or added */
#define CDDP__KA_rope(F)                                                                           \
    F(const float *, x) F(float *, y) F(const float *, inv_freq) F(int64_t, rows) F(int64_t, T)    \
        F(int64_t, H) F(int64_t, D) F(int64_t, pos0) F(bool, inverse) F(bool, assign)
/* Grouped-query attention's inputs packed for the attention kernels: rows of q (H heads of D), k
 * and v (KV heads of D each) into qkv rows (3 H D): q, then k and v with kv head h / (H / KV) in
 * head h's place (Hugging Face's repeat_kv); the backward (grad) from dqkv: dq, and dk, dv summed
 * over the heads that share a kv head, each stored (assign) or added, each may be NULL */
#define CDDP__KA_qkv_pack(F)                                                                       \
    F(const float *, q) F(const float *, k) F(const float *, v) F(float *, qkv) F(int64_t, rows)   \
        F(int64_t, H) F(int64_t, KV) F(int64_t, D)
#define CDDP__KA_qkv_pack_grad(F)                                                                  \
    F(const float *, dqkv) F(float *, dq) F(float *, dk) F(float *, dv) F(bool, assign_q)           \
        F(bool, assign_k) F(bool, assign_v) F(int64_t, rows) F(int64_t, H) F(int64_t, KV)           \
            F(int64_t, D)
/* causal self-attention of qkv (B,T,3C) in NH heads into out (B,T,C), the weights into p
 * (B,NH,T,T); compute as gemm's (in bf16: q, k, v and the weights rounded for the products) */
#define CDDP__KA_attention(F)                                                                      \
    F(const float *, qkv)                                                                          \
    F(float *, out) F(float *, p) F(int64_t, B) F(int64_t, T) F(int64_t, C) F(int64_t, NH)         \
        F(cddp_dtype, compute) F(uint16_t *, out16)
/* causal self-attention with a key/value cache (generation): the keys and values of qkv (B,T,3C),
 * the projections of positions past..past+T-1, are copied into cache (B,L,2C) at those positions,
 * and each query attends to the cache's rows up to its own, into out (B,T,C) */
#define CDDP__KA_attention_cached(F)                                                               \
    F(const float *, qkv)                                                                          \
    F(float *, cache) F(float *, out) F(int64_t, B) F(int64_t, T) F(int64_t, C) F(int64_t, NH)     \
        F(int64_t, past) F(int64_t, L)
/* dqkv from dout (every element written: stored when assign, else added); compute: as the
 * forward's (in bf16 also dout and the weights' gradient rounded for the products) */
#define CDDP__KA_attention_grad(F)                                                                 \
    F(const float *, qkv)                                                                          \
    F(const float *, p) F(const float *, dout) F(float *, dqkv) F(int64_t, B) F(int64_t, T)        \
        F(int64_t, C) F(int64_t, NH) F(bool, assign) F(cddp_dtype, compute)

/* The same attention by rows (flash attention: a query's scores, softmax and mix in one pass
 * over the keys, never storing the weights): instead of P, each query's log-sum-exp of its scaled
 * scores into lse (B,NH,T); the weights are made again from it by the backward. Only where the
 * device's attends_by_rows says so. In bf16 (compute) q, k, v and the weights are rounded for the
 * products as attention's; the weights before they are divided by their sum (a row's sum and the
 * division stay float32). qkv16 (else NULL): q, k, v already rounded, (B,T,3C) in bf16, read
 * instead of qkv (then NULL: the qkv projection that made them, cddp_qkv_attention). */
#define CDDP__KA_flash_attention(F)                                                                \
    F(const float *, qkv)                                                                          \
    F(float *, out) F(float *, lse) F(int64_t, B) F(int64_t, T) F(int64_t, C) F(int64_t, NH)       \
        F(cddp_dtype, compute) F(uint16_t *, out16) F(const uint16_t *, qkv16)
/* its backward from the forward's out and lse: dqkv as attention_grad's (with D = rowsum(dout
 * out) for each query, dS = P (dP - D)); in bf16 also dout and dS rounded for the products; qkv16
 * as the forward's */
#define CDDP__KA_flash_attention_grad(F)                                                           \
    F(const float *, qkv)                                                                          \
    F(const float *, out) F(const float *, lse) F(const float *, dout) F(float *, dqkv)           \
        F(int64_t, B) F(int64_t, T) F(int64_t, C) F(int64_t, NH) F(bool, assign)                   \
            F(cddp_dtype, compute) F(const uint16_t *, qkv16)

/* Batch normalisation (norm.c's blocks: N images of C channels in groups of B, P positions each),
 * relu(bn(x) + r) with relu and r (r may be NULL); stats: mean and 1/std (2 C). In training the
 * batch's statistics, and rmean/rvar (either may be NULL) move by momentum; else rmean/rvar's.
 * Activations in bf16: x16 for x, r16 for r (widened exactly), y16 for y (rounded to nearest
 * even), each with its float32 pointer NULL. The statistics of several processes' batches (sync
 * batch normalisation, training): phase 1 only writes each channel's mean and sum of squared
 * deviations from it (sums: 2 C doubles, device memory); phase 2 then normalises with those of
 * the whole batch in sums, count values per channel (phase 0: both at once, from this batch). */
#define CDDP__KA_batch_norm(F)                                                                     \
    F(const float *, x)                                                                            \
    F(const float *, r) F(const float *, w) F(const float *, b) F(float *, rmean) F(float *, rvar) \
        F(float *, y) F(float *, stats) F(int64_t, N) F(int64_t, C) F(int64_t, P) F(int64_t, B)    \
            F(bool, training) F(bool, relu) F(float, momentum) F(float, eps)                       \
                F(const uint16_t *, x16) F(const uint16_t *, r16) F(uint16_t *, y16) F(int, phase) \
                    F(double *, sums) F(int64_t, count)
/* its gradients: dx (stored when assign), dr (the residual's, stored when rassign), dw and db
 * added; each may be NULL. dy is the output's gradient, y the output (for relu); with dy_free and
 * relu the kernel leaves dy masked where y is 0 (the gradient is the op's after this backward:
 * the residual's gradient, or released). dx16 (then dx is NULL): x's gradient stored rounded to
 * bf16 (to nearest even) instead, for a convolution's backward (conv_grad_takes_bf16). x16, y16:
 * x and y in bf16 (as the forward's). Sync batch normalisation: phase 1 does all but dx, and
 * writes each channel's sum of the (masked) gradient and of its products with x's deviations
 * from the mean (sums: 2 C doubles); phase 2 makes dx from the whole batch's sums in sums, count
 * values per channel (phase 0: all of it, from this batch). */
#define CDDP__KA_batch_norm_grad(F)                                                                \
    F(const float *, x)                                                                            \
    F(const float *, y) F(float *, dy) F(const float *, w) F(const float *, stats)                 \
        F(float *, dx) F(bool, assign) F(float *, dr) F(bool, rassign) F(float *, dw)              \
            F(float *, db) F(int64_t, N) F(int64_t, C) F(int64_t, P) F(int64_t, B)                 \
                F(bool, training) F(bool, relu) F(bool, dy_free) F(uint16_t *, dx16)       \
                    F(const uint16_t *, x16) F(const uint16_t *, y16) F(int, phase)        \
                        F(double *, sums) F(int64_t, count)

/* Max pooling of planes (H,W) into (OH,OW) (relu: of max(x, 0)); arg (may be NULL): each
 * maximum's index in its plane. */
#define CDDP__KA_max_pool(F)                                                                       \
    F(const float *, x)                                                                            \
    F(float *, y) F(int32_t *, arg) F(int64_t, planes) F(int64_t, H) F(int64_t, W) F(int64_t, OH)  \
        F(int64_t, OW) F(int, kernel) F(int, stride) F(int, padding) F(bool, relu)
/* dx gets each window's gradient at its maximum (with y, a ReLU's pooling: where y > 0) */
#define CDDP__KA_max_pool_grad(F)                                                                  \
    F(const int32_t *, arg)                                                                        \
    F(const float *, dy) F(const float *, y) F(float *, dx) F(int64_t, planes) F(int64_t, H)       \
        F(int64_t, W) F(int64_t, OH) F(int64_t, OW) F(int, kernel) F(int, stride) F(int, padding)  \
            F(bool, assign)
/* Average pooling (padding counts as zeros); its gradient (added) */
#define CDDP__KA_avg_pool(F)                                                                       \
    F(const float *, x)                                                                            \
    F(float *, y) F(int64_t, planes) F(int64_t, H) F(int64_t, W) F(int64_t, OH) F(int64_t, OW)     \
        F(int, kernel) F(int, stride) F(int, padding)
#define CDDP__KA_avg_pool_grad(F)                                                                  \
    F(const float *, dy)                                                                           \
    F(float *, dx) F(int64_t, planes) F(int64_t, H) F(int64_t, W) F(int64_t, OH) F(int64_t, OW)    \
        F(int, kernel) F(int, stride) F(int, padding)
/* Adaptive average pooling of x (N,C,H,W) in x_block's layout into y (N,C,OH,OW) row-major; its
 * gradient added into dx (x's layout) */
#define CDDP__KA_adaptive_pool(F)                                                                  \
    F(const float *, x)                                                                            \
    F(float *, y) F(int64_t, N) F(int64_t, C) F(int64_t, H) F(int64_t, W) F(int64_t, OH)           \
        F(int64_t, OW) F(int, x_block)
#define CDDP__KA_adaptive_pool_grad(F)                                                             \
    F(const float *, dy)                                                                           \
    F(float *, dx) F(int64_t, N) F(int64_t, C) F(int64_t, H) F(int64_t, W) F(int64_t, OH)          \
        F(int64_t, OW) F(int, x_block)

/* Convolution (g): y = x * w + b (b may be NULL). *state (state NULL: nothing kept; else a slot
 * of device memory) receives what the backward needs, kept in the step arena. In bf16 (g's
 * compute), x16 may stand for x and y16 for y (activations in bf16; the float32 pointer NULL). */
#define CDDP__KA_conv2d(F)                                                                         \
    F(const float *, x)                                                                            \
    F(const float *, w) F(const float *, b) F(float *, y) F(cddp__conv_geom, g) F(void **, state)  \
        F(const uint16_t *, x16) F(uint16_t *, y16)
/* Its gradients from dy (g's output layout), or from dy16, the same rounded to bf16 (only where
 * conv_grad_takes_bf16 says so; dy is then NULL): each of dx, dw, db may be NULL, else stored (its
 * *_assign) or added; state: the forward's slot; x16: x in bf16 (as the forward's). */
#define CDDP__KA_conv2d_grad(F)                                                                    \
    F(const float *, x)                                                                            \
    F(const float *, w) F(const float *, dy) F(float *, dx) F(bool, dx_assign) F(float *, dw)      \
        F(bool, dw_assign) F(float *, db) F(bool, db_assign) F(cddp__conv_geom, g)                 \
            F(void **, state) F(const uint16_t *, dy16) F(const uint16_t *, x16)
/* relu and 2x2 max pooling (stride 2) of the convolution, into y (N,O,OH/2,OW/2) row-major: only
 * where the device says it fuses (conv_pool_fuses) */
#define CDDP__KA_conv2d_relu_pool(F)                                                               \
    F(const float *, x)                                                                            \
    F(const float *, w) F(const float *, b) F(float *, y) F(cddp__conv_geom, g) F(void **, state)
/* its gradients from dy (the pooled output's), as conv2d_grad */
#define CDDP__KA_conv2d_relu_pool_grad(F)                                                          \
    F(const float *, x)                                                                            \
    F(const float *, w) F(const float *, dy) F(float *, dx) F(bool, dx_assign) F(float *, dw)      \
        F(bool, dw_assign) F(float *, db) F(bool, db_assign) F(cddp__conv_geom, g)                 \
            F(void **, state)

/* The optimizers' updates of n elements of a flat block (device.h's cddp_device_sgd,
 * cddp_device_adamw and cddp_device_lion say what each computes; buf NULL: SGD without momentum),
 * and the sum of squares of one (in double, in 8 lanes of a fixed order: the same on every device
 * and rank). */
#define CDDP__KA_sgd(F)                                                                            \
    F(float *, p) F(const float *, g) F(float *, buf) F(int64_t, n) F(cddp_sgd_hparams, h)
#define CDDP__KA_adamw(F)                                                                          \
    F(float *, p)                                                                                  \
    F(const float *, g) F(float *, m) F(float *, v) F(int64_t, n) F(cddp_adamw_hparams, h)
#define CDDP__KA_lion(F)                                                                           \
    F(float *, p) F(const float *, g) F(float *, m) F(int64_t, n) F(cddp_lion_hparams, h)
#define CDDP__KA_sum_squares(F) F(const float *, x) F(double *, out) F(int64_t, n)

/* ---- the table ----------------------------------------------------------------------------- */

/* K(name): every kernel, in the order above. */
#define CDDP_KERNEL_LIST(K)                                                                        \
    K(fill) K(accumulate) K(add_rows) K(scale) K(mul) K(gemm) K(to_bf16) K(cast16) K(binary)       \
    K(binary_grad) K(unary) K(unary_grad) K(softmax) K(causal_softmax)                            \
    K(causal_softmax_grad) K(softmax_grad)                                                         \
    K(check_ids) K(cross_entropy) K(cross_entropy_grad) K(mse) K(mse_grad) K(sum) K(sum_grad)      \
    K(argmax)                                                                                      \
    K(reorder) K(embedding) K(embedding_grad) K(layer_norm) K(layer_norm_grad) K(gelu_tanh)        \
    K(gelu_tanh_grad) K(rms_norm) K(rms_norm_grad) K(silu_mul) K(silu_mul_grad) K(rope)          \
    K(qkv_pack) K(qkv_pack_grad)                                                                   \
    K(attention) K(attention_cached) K(attention_grad) K(flash_attention)        \
    K(flash_attention_grad) K(batch_norm)                                                          \
    K(batch_norm_grad) K(max_pool) K(max_pool_grad) K(avg_pool) K(avg_pool_grad)                   \
    K(adaptive_pool) K(adaptive_pool_grad) K(conv2d) K(conv2d_grad) K(conv2d_relu_pool)            \
    K(conv2d_relu_pool_grad) K(sgd) K(adamw) K(lion) K(sum_squares)
/* clang-format on */

#define CDDP__KFIELD(type, name) type name;
#define CDDP__KSTRUCT(name)                                                                        \
    typedef struct cddp__k_##name {                                                                \
        CDDP__KA_##name(CDDP__KFIELD)                                                              \
    } cddp__k_##name;
CDDP_KERNEL_LIST(CDDP__KSTRUCT)
#undef CDDP__KSTRUCT

typedef struct cddp__kq cddp__kq;

typedef struct cddp__kernels {
#define CDDP__KSLOT(name) void (*name)(cddp__kq * q, const cddp__k_##name *a);
    CDDP_KERNEL_LIST(CDDP__KSLOT)
#undef CDDP__KSLOT
    /* Questions an op asks before it calls (answered at once, on the host, from shapes alone). */
    /* The channel block of the layout the device's convolutions prefer (tensor.h's "Layouts"), or
     * 0 for none. */
    int (*blocked_size)(void);
    /* Whether conv2d_relu_pool runs g fused (else the op runs the convolution and the pooling). */
    bool (*conv_pool_fuses)(const cddp__conv_geom *g);
    /* Whether the gemm kernel multiplies in dtype (its `compute`: CDDP_F32, CDDP_BF16): CDDP_OK
     * with *how saying on what (a line for the log), or CDDP_EUNSUPPORTED with err saying why. */
    int (*computes)(cddp_dtype dtype, const char **how, cddp_error *err);
    /* Whether the gemm kernel takes operands rounded by to_bf16 (A16, B16) and a bias: then
     * mixed precision's linear rounds each operand once for its three products. */
    bool (*gemm_takes_bf16)(void);
    /* Whether conv2d_grad of g reads its output's gradient rounded to bf16 (dy16) as its products
     * read it: then the op that makes the whole of that gradient may write it so (grad_half). */
    bool (*conv_grad_takes_bf16)(const cddp__conv_geom *g);
    /* Whether attention of B elements of T positions in NH heads of HS in compute runs by rows
     * (flash_attention, keeping each query's log-sum-exp) instead of attention (keeping the
     * (B,NH,T,T) weights). */
    bool (*attends_by_rows)(int64_t B, int64_t T, int64_t NH, int64_t HS, cddp_dtype compute);
} cddp__kernels;

/* The shapes the CUDA device's flash kernels take (bf16, heads of 32 or 64, at most 65535 heads
 * in all): its answer to attends_by_rows, and the emulated device's, which runs the CPU's
 * flash_attention there so that CI takes the GPU's path (src/tensor/cpu/attn_rows.c). */
bool cddp__gpu_attends_by_rows(int64_t B, int64_t T, int64_t NH, int64_t HS, cddp_dtype compute);

#endif
