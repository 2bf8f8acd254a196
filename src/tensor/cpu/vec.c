/* vec.c: the elementwise loops a transformer spends its time in outside the GEMMs: exp (for
 * softmax and cross-entropy), GELU with its tanh, layer normalisation's rows, and adding into a
 * gradient; and a CNN's: batch normalisation's sums and input gradient, ReLU, 2x2 max pooling (with
 * a ReLU before it), and the dot products of a convolution's weight gradient.
 *
 * Each is written as a plain loop the compiler vectorises, with an exp of its own (a Cephes-style
 * polynomial: exp(x) = 2^k p(r), |r| <= ln 2 / 2, within 2 ulp of expf over the float range)
 * because libm's expf and tanhf are calls the compiler cannot vectorise, and they were half of
 * a GPT step's time. On x86-64 each function is compiled twice (target_clones): for AVX2 + FMA
 * (x86-64-v3) and for the baseline the library is built for, and the loader picks the one the
 * machine runs, so one binary is fast on new machines and still runs on old ones.
 */
#include "tensor/cpu/cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define CLONES CDDP_SIMD_CLONES

/* exp(x) for x in float's range; below -87.3 it returns about 1e-38 instead of a subnormal,
 * above 88.3 about 2e38 instead of infinity. */
static inline float vexp(float x) {
    x = x > 88.3f ? 88.3f : x;
    x = x < -87.3f ? -87.3f : x;
    /* k = round(x / ln 2) by the 1.5 * 2^23 trick, which vectorises everywhere */
    float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693359375f + k * 2.12194440e-4f; /* ln 2 in two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* k is within [-126, 127] for any x but NaN, whose k is NaN too: converting that to an integer
     * is undefined, so k is clamped first (a NaN goes to -127); p is NaN then, and so is the
     * result, as exp(NaN) should be. */
    k = k > -127.0f ? k : -127.0f;
    k = k < 128.0f ? k : 128.0f;
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Sums and maxima in 8 lanes, which the compiler keeps in vector registers (a plain float
 * reduction may not be reordered, so it would not vectorise), then across the lanes: the order
 * is fixed, so results do not depend on the vector width. They may differ in the last bits between
 * the clones (CLONES): the AVX2 one fuses multiply-adds that the baseline cannot (of 23 checks of
 * these loops on random data, 13 differed between x86-64-v2 and v3). */
#define LANES 8

static inline float sum_lanes(const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += x[i];
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* sum (x - a)(y - b): with a and b constant 0, a plain dot product (x - 0 is x, and the
 * compiler drops the subtraction); with y = x and b = a, the squared deviation */
static inline float dot_dev_lanes(const float *x, float a, const float *y, float b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += (x[i + j] - a) * (y[i + j] - b);
    for (int j = 0; i < n; i++, j++) acc[j] += (x[i] - a) * (y[i] - b);
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

static inline float sq_dev_lanes(const float *x, float m, int64_t n) {
    return dot_dev_lanes(x, m, x, m, n);
}

static inline float dot_lanes(const float *x, const float *y, int64_t n) {
    return dot_dev_lanes(x, 0.0f, y, 0.0f, n);
}

CLONES float cddp__sum(const float *x, int64_t n) {
    return sum_lanes(x, n);
}

CLONES float cddp__sq_dev(const float *x, float m, int64_t n) {
    return sq_dev_lanes(x, m, n);
}

CLONES void cddp__normalize(const float *x, float m, float s, float b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) * s + b;
}

CLONES float cddp__dot(const float *x, const float *y, int64_t n) {
    return dot_lanes(x, y, n);
}

CLONES float cddp__dot_dev(const float *d, const float *x, float m, int64_t n) {
    return dot_dev_lanes(d, 0.0f, x, m, n);
}

CLONES void cddp__norm_grad_into(float *restrict dx, const float *restrict d,
                                 const float *restrict x, float k, float a, float m, float b,
                                 int64_t n, bool assign) {
    if (assign)
        for (int64_t i = 0; i < n; i++) dx[i] = k * (d[i] - a - (x[i] - m) * b);
    else
        for (int64_t i = 0; i < n; i++) dx[i] += k * (d[i] - a - (x[i] - m) * b);
}

CLONES float cddp__exp_shifted(const float *x, float shift, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = vexp(x[i] - shift);
    return sum_lanes(y, n);
}

CLONES float cddp__max(const float *x, int64_t n) {
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = -INFINITY;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; i < n; i++, j++) acc[j] = x[i] > acc[j] ? x[i] : acc[j];
    float m = -INFINITY;
    for (int j = 0; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

CLONES void cddp__scale_into(float *y, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= s;
}

CLONES void cddp__bf16_widen_n(float *restrict dst, const uint16_t *restrict src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

/* cddp__bf16_rounded, vectorised; dst may be src */
CLONES void cddp__bf16_round_n(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t w = (uint32_t)cddp__round_bf16_lanes(src[i]) << 16;
        memcpy(dst + i, &w, sizeof w);
    }
}

CLONES void cddp__add_into(float *restrict acc, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

CLONES void cddp__add_softmax_scaled(float *y, const float *x, float m, float ls, float g,
                                     int64_t n, bool assign) {
    if (assign)
        for (int64_t i = 0; i < n; i++) y[i] = g * vexp((x[i] - m) - ls);
    else
        for (int64_t i = 0; i < n; i++) y[i] += g * vexp((x[i] - m) - ls);
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* tanh(u) = 1 - 2 / (exp(2u) + 1), u = k (x + 0.044715 x^3) */
static inline float gelu_th(float v) {
    return 1.0f - 2.0f / (vexp(2.0f * GELU_K * (v + GELU_C * v * v * v)) + 1.0f);
}

CLONES void cddp__gelu_tanh_rows(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + gelu_th(x[i]));
}

/* The slope 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx from x again: the forward then writes
 * one array, not two, and the backward reads two, as it would the slope; the tanh is paid twice
 * (the forward: 0.95 ns a value on a Zen 4 core in AVX2), which the 6-layer GPT's step did not
 * show. */
CLONES void cddp__gelu_tanh_grad(const float *x, const float *dy, float *dx, int64_t n,
                                 bool assign) {
#define SLOPE(v, th)                                                                               \
    (0.5f * (1.0f + (th)) +                                                                        \
     0.5f * (v) * (1.0f - (th) * (th)) * GELU_K * (1.0f + 3.0f * GELU_C * (v) * (v)))
    if (assign)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * SLOPE(x[i], gelu_th(x[i]));
    else
        for (int64_t i = 0; i < n; i++) dx[i] += dy[i] * SLOPE(x[i], gelu_th(x[i]));
#undef SLOPE
}

/* Rows of C features: y = (x - mean) rstd w + b; w and b are never NULL (the op passes ones and
 * zeros for a LayerNorm without them). */
CLONES void cddp__layer_norm_rows(const float *x, const float *w, const float *b, float *y,
                                  float *mean, float *rstd, int64_t rows, int64_t C, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        float m = sum_lanes(xr, C) / (float)C;
        float s = 1.0f / sqrtf(sq_dev_lanes(xr, m, C) / (float)C + eps);
        for (int64_t i = 0; i < C; i++) yr[i] = (xr[i] - m) * s * w[i] + b[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* With h = (x - mean) rstd and g = w dy, per row: dx = rstd (g - mean(g) - h mean(g h)) (stored
 * when assign, else added); w is never NULL. scratch holds 2 C floats (a row's h and g). */
CLONES void cddp__layer_norm_grad(const float *x, const float *w, const float *dy,
                                  const float *mean, const float *rstd, float *dx, bool assign,
                                  int64_t rows, int64_t C, float *scratch) {
    float *h = scratch, *g = scratch + C;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C, *gr = dy + r * C;
        float m = mean[r], s = rstd[r];
        for (int64_t i = 0; i < C; i++) {
            h[i] = (xr[i] - m) * s;
            g[i] = gr[i] * w[i];
        }
        float mean_g = sum_lanes(g, C) / (float)C, mean_gh = dot_lanes(g, h, C) / (float)C;
        float *dr = dx + r * C;
        if (assign)
            for (int64_t i = 0; i < C; i++) dr[i] = s * (g[i] - mean_g - h[i] * mean_gh);
        else
            for (int64_t i = 0; i < C; i++) dr[i] += s * (g[i] - mean_g - h[i] * mean_gh);
    }
}

/* Over the rows, in order, C columns of rows ld apart: db += dy, dw += dy (x - mean) rstd (either
 * may be NULL). */
CLONES void cddp__layer_norm_wgrad(const float *x, const float *dy, const float *mean,
                                   const float *rstd, float *dw, float *db, int64_t rows, int64_t C,
                                   int64_t ld) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ld, *gr = dy + r * ld;
        float m = mean[r], s = rstd[r];
        if (db)
            for (int64_t i = 0; i < C; i++) db[i] += gr[i];
        if (dw)
            for (int64_t i = 0; i < C; i++) dw[i] += gr[i] * ((xr[i] - m) * s);
    }
}

CLONES void cddp__relu(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

CLONES void cddp__relu_grad(const float *y, const float *dy, float *dx, int64_t n, bool assign) {
    if (assign)
        for (int64_t i = 0; i < n; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    else
        for (int64_t i = 0; i < n; i++) {
            float g = dy[i]; /* loaded unconditionally, so the choice is a select */
            dx[i] += y[i] > 0.0f ? g : 0.0f;
        }
}

/* One step of a window's scan: v (at k) replaces the maximum m (at *at) when larger, or when it
 * is the window's first NaN (a NaN maximum stays). The masks are integers, each from one
 * comparison, which is the form the compiler turns into vector selects. */
static inline float take_max(float m, float v, int32_t k, int32_t *at) {
    int32_t larger = -(int32_t)(v > m), v_nan = -(int32_t)(v != v), m_num = -(int32_t)(m == m);
    int32_t t = larger | (v_nan & m_num);
    *at = (*at & ~t) | (k & t);
    return t ? v : m;
}

/* Pooling rows are short (14 and 7 outputs in the example CNN), too short for a vectorised loop
 * with a scalar remainder: a row is cut into blocks of a fixed width (8, or 4 under 8 outputs),
 * the last one moved back to end with the row, so that it overlaps the one before (each output is
 * a function of its window alone, so writing one twice writes the same value). The blocks are
 * simd loops of a constant count. */
#define SIMD          _Pragma("omp simd")
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static int64_t block_width(int64_t n) {
    return n >= 8 ? 8 : n >= 4 ? 4 : 1;
}

ALWAYS_INLINE float relu_if(float v, bool relu) {
    return relu ? (v > 0.0f ? v : 0.0f) : v;
}

/* outputs [i, i + n) of a row: rows r0 and r1 of the input (with relu, their max(x, 0)), base
 * the plane index of r0 */
ALWAYS_INLINE void pool_block(const float *restrict r0, const float *restrict r1, float *restrict y,
                              int32_t *restrict arg, int32_t base, int32_t w, int64_t i, int n,
                              bool relu) {
    SIMD for (int k = 0; k < n; k++) {
        int64_t j = i + k;
        int32_t at = 0;
        float m = relu_if(r0[2 * j], relu);
        m = take_max(m, relu_if(r0[2 * j + 1], relu), 1, &at);
        m = take_max(m, relu_if(r1[2 * j], relu), w, &at);
        m = take_max(m, relu_if(r1[2 * j + 1], relu), w + 1, &at);
        y[j] = m;
        if (arg) arg[j] = base + 2 * (int32_t)j + at;
    }
}

/* with y (a ReLU's pooling), the gradient only where y is positive */
ALWAYS_INLINE void pool_grad_block(const int32_t *restrict arg, const float *restrict dy,
                                   const float *restrict y, float *restrict d0, float *restrict d1,
                                   int32_t base, int32_t w, int64_t i, int n) {
    SIMD for (int k = 0; k < n; k++) {
        int64_t j = i + k;
        int32_t at = arg[j] - base - 2 * (int32_t)j;
        float g = y && !(y[j] > 0.0f) ? 0.0f : dy[j];
        d0[2 * j] = at == 0 ? g : 0.0f;
        d0[2 * j + 1] = at == 1 ? g : 0.0f;
        d1[2 * j] = at == w ? g : 0.0f;
        d1[2 * j + 1] = at == w + 1 ? g : 0.0f;
    }
}

/* BLOCKS(n, L, STEP): STEP(i, L) over [0, n) in blocks of L, the last one ending at n */
#define BLOCKS(n, L, STEP)                                                                         \
    for (int64_t i_ = 0; i_ < (n); i_ += (L)) {                                                    \
        int64_t at_ = i_ + (L) <= (n) ? i_ : (n) - (L);                                            \
        if ((L) == 8)                                                                              \
            STEP(at_, 8);                                                                          \
        else if ((L) == 4)                                                                         \
            STEP(at_, 4);                                                                          \
        else                                                                                       \
            STEP(at_, 1);                                                                          \
    }

ALWAYS_INLINE void max_pool2x2_planes(const float *restrict x, int64_t planes, int64_t H, int64_t W,
                                      int64_t OH, int64_t OW, float *restrict y,
                                      int32_t *restrict arg, bool relu) {
    int64_t L = block_width(OW);
    for (int64_t nc = 0; nc < planes; nc++)
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *r0 = x + nc * H * W + 2 * oh * W;
            int64_t o = (nc * OH + oh) * OW;
            int32_t base = (int32_t)(2 * oh * W), w = (int32_t)W;
#define STEP(i, n) pool_block(r0, r0 + W, y + o, arg ? arg + o : NULL, base, w, i, n, relu)
            BLOCKS(OW, L, STEP)
#undef STEP
        }
}

CLONES void cddp__max_pool2x2(const float *x, int64_t planes, int64_t H, int64_t W, int64_t OH,
                              int64_t OW, float *y, int32_t *arg, bool relu) {
    /* each case its own loop, the conditions constant inside */
    if (arg && relu)
        max_pool2x2_planes(x, planes, H, W, OH, OW, y, arg, true);
    else if (arg)
        max_pool2x2_planes(x, planes, H, W, OH, OW, y, arg, false);
    else if (relu)
        max_pool2x2_planes(x, planes, H, W, OH, OW, y, NULL, true);
    else
        max_pool2x2_planes(x, planes, H, W, OH, OW, y, NULL, false);
}

ALWAYS_INLINE void max_pool2x2_grad_planes(const int32_t *restrict arg, const float *restrict dy,
                                           const float *restrict y, float *restrict dx,
                                           int64_t planes, int64_t H, int64_t W, int64_t OH,
                                           int64_t OW) {
    int64_t L = block_width(OW);
    for (int64_t nc = 0; nc < planes; nc++) {
        float *d = dx + nc * H * W;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t o = (nc * OH + oh) * OW;
            float *d0 = d + 2 * oh * W, *d1 = d0 + W;
            int32_t base = (int32_t)(2 * oh * W), w = (int32_t)W;
#define STEP(i, n) pool_grad_block(arg + o, dy + o, y ? y + o : NULL, d0, d1, base, w, i, n)
            BLOCKS(OW, L, STEP)
#undef STEP
            if (W & 1) d0[W - 1] = d1[W - 1] = 0.0f; /* an odd last column is in no window */
        }
        if (H & 1) memset(d + (H - 1) * W, 0, (size_t)W * sizeof(float)); /* nor an odd last row */
    }
}

CLONES void cddp__max_pool2x2_grad(const int32_t *arg, const float *dy, const float *y, float *dx,
                                   int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW) {
    if (y)
        max_pool2x2_grad_planes(arg, dy, y, dx, planes, H, W, OH, OW);
    else
        max_pool2x2_grad_planes(arg, dy, NULL, dx, planes, H, W, OH, OW);
}

/* Pooling on a layout with channels innermost (oneDNN's blocked ones): the vector runs across the
 * B channels of a group, which are contiguous, so each window is 4 vector loads and 3 compares; a
 * row of outputs is gathered in a (W/2, B) tile and written out to the plain planes one channel at
 * a time (a transposition inside L1). The maxima's places go through a second tile as floats,
 * narrowed to int8 a row at a time (and widened so for the gradient): int8 inside the loop over 8
 * lanes made GCC split it into pairs of lanes and spill, at 2.6 times the time (the
 * gradient's 1.2). B is a constant in the common cases (16, AVX-512's; 8, AVX2's). */
ALWAYS_INLINE void relu_pool_lanes(const float *restrict x, const cddp__lanes *l, int64_t B,
                                   int64_t N, int64_t C, int64_t H, int64_t W, float *restrict y,
                                   int8_t *restrict code, bool keep, float *restrict t) {
    int64_t OH = H / 2, OW = W / 2, G = (C + B - 1) / B, sW = l->sW, sH = l->sH;
    float *restrict tc = t + OW * B;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++)
            for (int64_t oh = 0; oh < OH; oh++) {
                const float *r0 = x + n * l->sN + g * l->sG + 2 * oh * sH;
                for (int64_t ow = 0; ow < OW; ow++) {
                    const float *a = r0 + 2 * ow * sW, *b = a + sW, *c = a + sH, *d = c + sW;
                    SIMD for (int64_t k = 0; k < B; k++) {
                        /* max(x, 0) has no NaN; the first of equals wins: a pair's left one,
                         * the top pair */
                        float v0 = relu_if(a[k], true), v1 = relu_if(b[k], true);
                        float v2 = relu_if(c[k], true), v3 = relu_if(d[k], true);
                        float top = v1 > v0 ? v1 : v0, bottom = v3 > v2 ? v3 : v2;
                        float m = bottom > top ? bottom : top;
                        t[ow * B + k] = m;
                        if (keep) {
                            float at_top = v1 > v0 ? 1.0f : 0.0f, at_bottom = v3 > v2 ? 3.0f : 2.0f;
                            tc[ow * B + k] = m > 0.0f ? (bottom > top ? at_bottom : at_top) : -1.0f;
                        }
                    }
                }
                if (keep) {
                    int8_t *cd = code + ((n * G + g) * OH + oh) * OW * B;
                    SIMD for (int64_t i = 0; i < OW * B; i++) cd[i] = (int8_t)(int32_t)tc[i];
                }
                int64_t nl = CDDP_MIN(B, C - g * B);
                for (int64_t k = 0; k < nl; k++) {
                    float *out = y + ((n * C + g * B + k) * OH + oh) * OW;
                    for (int64_t ow = 0; ow < OW; ow++) out[ow] = t[ow * B + k];
                }
            }
}

CLONES void cddp__relu_pool2x2_lanes(const float *x, const cddp__lanes *l, int64_t N, int64_t C,
                                     int64_t H, int64_t W, float *y, int8_t *code, float *tile) {
    /* each case its own loop, the conditions constant inside: 16 lanes (AVX-512's blocks), 8
     * (AVX2's), any other */
    if (l->B == 16 && code)
        relu_pool_lanes(x, l, 16, N, C, H, W, y, code, true, tile);
    else if (l->B == 16)
        relu_pool_lanes(x, l, 16, N, C, H, W, y, NULL, false, tile);
    else if (l->B == 8 && code)
        relu_pool_lanes(x, l, 8, N, C, H, W, y, code, true, tile);
    else if (l->B == 8)
        relu_pool_lanes(x, l, 8, N, C, H, W, y, NULL, false, tile);
    else if (code)
        relu_pool_lanes(x, l, l->B, N, C, H, W, y, code, true, tile);
    else
        relu_pool_lanes(x, l, l->B, N, C, H, W, y, NULL, false, tile);
}

/* v where keep, else 0, by a mask (GCC turns a select with 0 into masked stores and branches) */
static inline float keep_if(float v, bool keep) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u &= -(uint32_t)keep;
    memcpy(&v, &u, sizeof v);
    return v;
}

ALWAYS_INLINE void relu_pool_lanes_grad(const int8_t *restrict code, const float *restrict dy,
                                        const cddp__lanes *l, int64_t B, int64_t N, int64_t C,
                                        int64_t H, int64_t W, float *restrict dx,
                                        float *restrict t) {
    int64_t OH = H / 2, OW = W / 2, G = (C + B - 1) / B, sW = l->sW, sH = l->sH;
    float *restrict tc = t + OW * B; /* a row's places, as floats (see relu_pool_lanes) */
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            float *plane = dx + n * l->sN + g * l->sG;
            int64_t nl = CDDP_MIN(B, C - g * B);
            if (nl < B) memset(t, 0, (size_t)(OW * B) * sizeof(float)); /* padding lanes get 0 */
            for (int64_t oh = 0; oh < OH; oh++) {
                for (int64_t k = 0; k < nl; k++) {
                    const float *in = dy + ((n * C + g * B + k) * OH + oh) * OW;
                    for (int64_t ow = 0; ow < OW; ow++) t[ow * B + k] = in[ow];
                }
                const int8_t *cd = code + ((n * G + g) * OH + oh) * OW * B;
                SIMD for (int64_t i = 0; i < OW * B; i++) tc[i] = (float)cd[i];
                float *r0 = plane + 2 * oh * sH;
                for (int64_t ow = 0; ow < OW; ow++) {
                    float *restrict a = r0 + 2 * ow * sW, *restrict b = a + sW;
                    float *restrict c = a + sH, *restrict d = c + sW;
                    SIMD for (int64_t k = 0; k < B; k++) {
                        float at = tc[ow * B + k], v = t[ow * B + k];
                        a[k] = keep_if(v, at == 0.0f);
                        b[k] = keep_if(v, at == 1.0f);
                        c[k] = keep_if(v, at == 2.0f);
                        d[k] = keep_if(v, at == 3.0f);
                    }
                }
                if (W & 1) /* an odd last column is in no window */
                    for (int64_t k = 0; k < B; k++)
                        r0[(W - 1) * sW + k] = r0[sH + (W - 1) * sW + k] = 0;
            }
            if (H & 1) /* nor an odd last row */
                for (int64_t w = 0; w < W; w++)
                    for (int64_t k = 0; k < B; k++) plane[(H - 1) * sH + w * sW + k] = 0.0f;
        }
}

CLONES void cddp__relu_pool2x2_lanes_grad(const int8_t *code, const float *dy, const cddp__lanes *l,
                                          int64_t N, int64_t C, int64_t H, int64_t W, float *dx,
                                          float *tile) {
    if (l->B == 16)
        relu_pool_lanes_grad(code, dy, l, 16, N, C, H, W, dx, tile);
    else if (l->B == 8)
        relu_pool_lanes_grad(code, dy, l, 8, N, C, H, W, dx, tile);
    else
        relu_pool_lanes_grad(code, dy, l, l->B, N, C, H, W, dx, tile);
}

/* out[k] += sum_j y[j] x[off[k] + j] for 8 offsets at once, j < n: y is read once for all 8, and
 * the 8 sums (8 lanes each) are independent chains, so the multiply-adds do not wait on each
 * other's latency. Lanes are added in a fixed order. */
ALWAYS_INLINE void dot8_offsets(const float *restrict y, const float *restrict x,
                                const int64_t *off, int64_t n, double *out) {
    float acc[8][LANES] = {{0}};
    const float *xs[8];
    for (int k = 0; k < 8; k++) xs[k] = x + off[k];
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < 8; k++)
            SIMD for (int l = 0; l < LANES; l++) acc[k][l] += y[j + l] * xs[k][j + l];
    for (int k = 0; k < 8; k++) {
        float s = 0.0f;
        for (int l = 0; l < LANES; l++) s += acc[k][l];
        for (int64_t i = j; i < n; i++) s += y[i] * xs[k][i];
        out[k] += s;
    }
}

CLONES void cddp__dot_offsets(const float *y, const float *x, const int64_t *off, int64_t k,
                              int64_t n, double *out) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) dot8_offsets(y, x, off + i, n, out + i);
    for (; i < k; i++) out[i] += dot_lanes(y, x + off[i], n);
}
