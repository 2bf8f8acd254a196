/* lanes.c: batch normalisation's loops over channel-blocked blocks (oneDNN's nChwBc), in float32
 * and in bf16, vectorised as vec.c's loops are (compiled alike: CMakeLists.txt, CDDP_SIMD_CLONES);
 * norm.c's kernels call them. */
#include "tensor/cpu/cpu.h"

#include <stdint.h>
#include <string.h>

#define CLONES CDDP_SIMD_CLONES

/* ---- batch normalisation over channels in blocks of B (oneDNN's nChwBc) ------------------------
 * A block holds P positions of B channels side by side, x[p B + k]; the per-channel values (m, s,
 * ...) are the block's B. Each sum runs in 4 accumulators of B lanes, one for every fourth
 * position (a plane's sum in float, as cddp__sum's 8 lanes), added into doubles at the end. The
 * loops are written for any B, and instantiated for 16 and 8, which the compiler then vectorises
 * lane by lane. Activations in bf16 (half, a constant in each instance): x, y and r read as bf16
 * and widened in the loop (exact, so the same float32 arithmetic and the same bits), y written
 * rounded to nearest even (VAL, cddp__round_bf16_lanes). */
#define MAX_BLOCK 16

/* element i of v: float32, or (half) bf16 widened */
#define VAL(v, half, i) ((half) ? cddp__bf16_widen((v).h[i]) : (v).f[i])

enum { LANE_SUM, LANE_SQ_DEV };

/* out[k] += sum_p of: x (LANE_SUM), (x - m)^2 (LANE_SQ_DEV). */
static inline __attribute__((always_inline)) void lane_sums(int what, cddp__vals x, bool half,
                                                            const float *restrict m, int64_t P,
                                                            int64_t B, double *restrict out) {
    float acc[4][MAX_BLOCK] = {{0}};
    float mk[MAX_BLOCK] = {0};
    if (what != LANE_SUM) memcpy(mk, m, (size_t)B * sizeof(float));
    int64_t p = 0;
#define TERM(v, q, k)                                                                              \
    (what == LANE_SUM ? VAL(v, half, (q)*B + (k))                                                  \
                      : (VAL(v, half, (q)*B + (k)) - mk[k]) * (VAL(v, half, (q)*B + (k)) - mk[k]))
    for (; p + 4 <= P; p += 4)
        for (int u = 0; u < 4; u++)
            for (int64_t k = 0; k < B; k++) acc[u][k] += TERM(x, p + u, k);
    for (; p < P; p++)
        for (int64_t k = 0; k < B; k++) acc[0][k] += TERM(x, p, k);
#undef TERM
    for (int64_t k = 0; k < B; k++)
        out[k] += (double)((acc[0][k] + acc[1][k]) + (acc[2][k] + acc[3][k]));
}

/* The call with B a constant the compiler sees: 16, 8, or any other (not vectorised). */
#define BY_BLOCK(B, call_with)                                                                     \
    do {                                                                                           \
        CDDP_CHECK((B) >= 1 && (B) <= MAX_BLOCK, "a block of %lld channels", (long long)(B));      \
        if ((B) == 16)                                                                             \
            call_with(16);                                                                         \
        else if ((B) == 8)                                                                         \
            call_with(8);                                                                          \
        else                                                                                       \
            call_with(B);                                                                          \
    } while (0)

/* lane_sums of what (a constant where it is inlined), one instance per B and dtype */
static inline __attribute__((always_inline)) void sums(int what, cddp__vals x, const float *m,
                                                       int64_t P, int64_t B, double *out) {
#define CALL(b)                                                                                    \
    do {                                                                                           \
        if (x.h)                                                                                   \
            lane_sums(what, x, true, m, P, b, out);                                                \
        else                                                                                       \
            lane_sums(what, x, false, m, P, b, out);                                               \
    } while (0)
    BY_BLOCK(B, CALL);
#undef CALL
}

CLONES void cddp__lanes_sum(cddp__vals x, int64_t P, int64_t B, double *out) {
    sums(LANE_SUM, x, NULL, P, B, out);
}

CLONES void cddp__lanes_sq_dev(cddp__vals x, const float *m, int64_t P, int64_t B, double *out) {
    sums(LANE_SQ_DEV, x, m, P, B, out);
}

/* Batch normalisation's two backward sums in one pass: out_s[k] += sum_p g, out_t[k] += sum_p
 * g (x - m), g the gradient dy, or (y not NULL: a ReLU's output) dy where y > 0 and +0 elsewhere,
 * written over dy (store 1) or into g_out (store 2) on the way. The mask is a bitwise and, not a
 * choice, so that the compiler contracts g (x - m) alike with and without it: batch_norm_relu's
 * gradients are then the bits of relu's backward followed by batch_norm's (test_ops). Four
 * accumulators of B lanes each way, as lane_sums. */
static inline __attribute__((always_inline)) void
lane_grad_sums(float *restrict dy, bool relu, cddp__vals y, cddp__vals x, bool half,
               const float *restrict m, float *restrict g_out, int store, int64_t P, int64_t B,
               double *restrict out_s, double *restrict out_t) {
    float s[4][MAX_BLOCK] = {{0}}, t[4][MAX_BLOCK] = {{0}}, mk[MAX_BLOCK];
    memcpy(mk, m, (size_t)B * sizeof(float));
#define STEP(q, u)                                                                                 \
    for (int64_t k = 0; k < B; k++) {                                                              \
        int64_t i = (q)*B + k;                                                                     \
        float g = dy[i];                                                                           \
        if (relu) {                                                                                \
            uint32_t bits;                                                                         \
            memcpy(&bits, &g, 4);                                                                  \
            bits &= VAL(y, half, i) > 0.0f ? 0xffffffffu : 0u;                                     \
            memcpy(&g, &bits, 4);                                                                  \
        }                                                                                          \
        if (store == 1) dy[i] = g;                                                                 \
        if (store == 2) g_out[i] = g;                                                              \
        s[u][k] += g;                                                                              \
        t[u][k] += g * (VAL(x, half, i) - mk[k]);                                                  \
    }
    int64_t p = 0;
    for (; p + 4 <= P; p += 4)
        for (int u = 0; u < 4; u++) STEP(p + u, u)
    for (; p < P; p++) STEP(p, 0)
#undef STEP
    for (int64_t k = 0; k < B; k++) {
        out_s[k] += (double)((s[0][k] + s[1][k]) + (s[2][k] + s[3][k]));
        out_t[k] += (double)((t[0][k] + t[1][k]) + (t[2][k] + t[3][k]));
    }
}

/* one instance per case: half, and the ReLU's mask with where it goes */
#define GRAD_SUMS(half, bb)                                                                        \
    do {                                                                                           \
        if (relu && g_out == dy)                                                                   \
            lane_grad_sums(dy, true, y, x, half, m, NULL, 1, P, bb, out_s, out_t);                 \
        else if (relu && g_out)                                                                    \
            lane_grad_sums(dy, true, y, x, half, m, g_out, 2, P, bb, out_s, out_t);                \
        else if (relu)                                                                             \
            lane_grad_sums(dy, true, y, x, half, m, NULL, 0, P, bb, out_s, out_t);                 \
        else                                                                                       \
            lane_grad_sums(dy, false, y, x, half, m, NULL, 0, P, bb, out_s, out_t);                \
    } while (0)

CLONES void cddp__lanes_grad_sums(float *dy, cddp__vals y, cddp__vals x, const float *m,
                                  float *g_out, int64_t P, int64_t B, double *out_s,
                                  double *out_t) {
    bool relu = y.f || y.h;
#define CALL(bb)                                                                                   \
    do {                                                                                           \
        if (x.h)                                                                                   \
            GRAD_SUMS(true, bb);                                                                   \
        else                                                                                       \
            GRAD_SUMS(false, bb);                                                                  \
    } while (0)
    BY_BLOCK(B, CALL);
#undef CALL
}
#undef GRAD_SUMS

/* half, the residual's kind (0 none, 1 float32, 2 bf16) and relu are constants where it is
 * inlined: one loop per case, the residual's sum and the rectification in the pass that
 * normalises (they were two more passes over the block). */
static inline __attribute__((always_inline)) void
lane_normalize(cddp__vals x, bool half, const float *restrict m, const float *restrict s,
               const float *restrict b, cddp__vals r, int rk, bool relu, float *restrict y,
               uint16_t *restrict y16, int64_t P, int64_t B) {
    for (int64_t p = 0; p < P; p++)
        for (int64_t k = 0; k < B; k++) {
            float v = (VAL(x, half, p * B + k) - m[k]) * s[k] + b[k];
            if (rk) v += VAL(r, rk == 2, p * B + k);
            v = relu ? (v > 0.0f ? v : 0.0f) : v;
            if (half)
                y16[p * B + k] = cddp__round_bf16_lanes(v);
            else
                y[p * B + k] = v;
        }
}

#define NORMALIZE(half, rk, bb)                                                                    \
    do {                                                                                           \
        if (relu)                                                                                  \
            lane_normalize(x, half, m, s, b, r, rk, true, y, y16, P, bb);                          \
        else                                                                                       \
            lane_normalize(x, half, m, s, b, r, rk, false, y, y16, P, bb);                         \
    } while (0)

CLONES void cddp__lanes_normalize(cddp__vals x, const float *m, const float *s, const float *b,
                                  cddp__vals r, bool relu, float *y, uint16_t *y16, int64_t P,
                                  int64_t B) {
    /* a bf16 x writes y16, with a residual of either dtype; a float32 one y, its residual float32
     */
#define CALL(bb)                                                                                   \
    do {                                                                                           \
        if (x.h && r.h)                                                                            \
            NORMALIZE(true, 2, bb);                                                                \
        else if (x.h && r.f)                                                                       \
            NORMALIZE(true, 1, bb);                                                                \
        else if (x.h)                                                                              \
            NORMALIZE(true, 0, bb);                                                                \
        else if (r.f)                                                                              \
            NORMALIZE(false, 1, bb);                                                               \
        else                                                                                       \
            NORMALIZE(false, 0, bb);                                                               \
    } while (0)
    CDDP_CHECK(!x.h == !y16 && !(r.h && !x.h), "lanes_normalize: mixed dtypes");
    BY_BLOCK(B, CALL);
#undef CALL
}
#undef NORMALIZE

static inline __attribute__((always_inline)) void
lane_norm_grad(float *restrict dx, const float *restrict d, cddp__vals x, bool half,
               const float *restrict k, const float *restrict a, const float *restrict m,
               const float *restrict b, int64_t P, int64_t B, bool assign) {
    for (int64_t p = 0; p < P; p++)
        for (int64_t j = 0; j < B; j++) {
            float g = k[j] * (d[p * B + j] - a[j] - (VAL(x, half, p * B + j) - m[j]) * b[j]);
            dx[p * B + j] = assign ? g : dx[p * B + j] + g;
        }
}

CLONES void cddp__lanes_norm_grad_into(float *dx, const float *d, cddp__vals x, const float *k,
                                       const float *a, const float *m, const float *b, int64_t P,
                                       int64_t B, bool assign) {
    /* each case its own loop, half and the store or the add constant inside */
#define CALL(bb)                                                                                   \
    do {                                                                                           \
        if (x.h && assign)                                                                         \
            lane_norm_grad(dx, d, x, true, k, a, m, b, P, bb, true);                               \
        else if (x.h)                                                                              \
            lane_norm_grad(dx, d, x, true, k, a, m, b, P, bb, false);                              \
        else if (assign)                                                                           \
            lane_norm_grad(dx, d, x, false, k, a, m, b, P, bb, true);                              \
        else                                                                                       \
            lane_norm_grad(dx, d, x, false, k, a, m, b, P, bb, false);                             \
    } while (0)
    BY_BLOCK(B, CALL);
#undef CALL
}
