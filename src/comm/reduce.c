/* reduce.c: the reduction kernels every transport and algorithm shares, and the 16-bit
 * conversions by the collectives' dtype (core's cddp_half_to_f32 and cddp_half_from_f32).
 *
 * One place computes what a reduction means: dst op= src for 4- and 8-byte types, the mean as a
 * sum divided once at the end, and bfloat16/float16 accumulated in float32 and rounded once
 * (to nearest even). A transport or an algorithm that reduces calls these, so every path gives
 * the same bits for the same inputs in the same order.
 */
#include "comm/internal.h"

#include <string.h>

size_t cddp_comm_dtype_size(cddp_comm_dtype d) {
    switch (d) {
    case CDDP_COMM_F32:
    case CDDP_COMM_I32:
        return 4;
    case CDDP_COMM_F64:
    case CDDP_COMM_I64:
        return 8;
    case CDDP_COMM_BF16:
    case CDDP_COMM_F16:
        return 2;
    }
    return 0;
}

const char *cddp_comm_dtype_name(cddp_comm_dtype d) {
    static const char *n[] = {"float32", "float64", "int32", "int64", "bfloat16", "float16"};
    return (unsigned)d < CDDP_ARRAY_LEN(n) ? n[d] : "unknown";
}

const char *cddp_comm_op_name(cddp_comm_op op) {
    static const char *n[] = {"sum", "mean", "min", "max", "product"};
    return (unsigned)op < CDDP_ARRAY_LEN(n) ? n[op] : "unknown";
}

bool cddp__comm_is_half(cddp_comm_dtype dt) {
    return dt == CDDP_COMM_BF16 || dt == CDDP_COMM_F16;
}

/* ---- 16-bit conversions: core's (cddp_half_to_f32), by the collectives' dtype ------------ */

void cddp_comm_to_f32(cddp_comm_dtype dt, const void *src, float *dst, int64_t n) {
    cddp_half_to_f32(src, dst, n, dt != CDDP_COMM_BF16);
}

void cddp_comm_from_f32(cddp_comm_dtype dt, const float *src, void *dst, int64_t n) {
    cddp_half_from_f32(src, dst, n, dt != CDDP_COMM_BF16);
}

/* ---- combining --------------------------------------------------------------------------- */

/* dst[i] op= src[i] for n elements of type T (sum and mean add). */
#define REDUCE_LOOP(T, dst, src, n, op)                                                            \
    do {                                                                                           \
        T *d__ = (T *)(dst);                                                                       \
        const T *s__ = (const T *)(src);                                                           \
        switch (op) {                                                                              \
        case CDDP_COMM_SUM:                                                                        \
        case CDDP_COMM_MEAN:                                                                       \
            for (int64_t i = 0; i < (n); i++) d__[i] += s__[i];                                    \
            break;                                                                                 \
        case CDDP_COMM_PRODUCT:                                                                    \
            for (int64_t i = 0; i < (n); i++) d__[i] *= s__[i];                                    \
            break;                                                                                 \
        case CDDP_COMM_MIN:                                                                        \
            for (int64_t i = 0; i < (n); i++) d__[i] = s__[i] < d__[i] ? s__[i] : d__[i];          \
            break;                                                                                 \
        case CDDP_COMM_MAX:                                                                        \
            for (int64_t i = 0; i < (n); i++) d__[i] = s__[i] > d__[i] ? s__[i] : d__[i];          \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

void cddp_comm_combine(cddp_comm_dtype dt, cddp_comm_op op, void *dst, const void *src, int64_t n) {
    switch (dt) {
    case CDDP_COMM_F64:
        REDUCE_LOOP(double, dst, src, n, op);
        break;
    case CDDP_COMM_I32:
        REDUCE_LOOP(int32_t, dst, src, n, op);
        break;
    case CDDP_COMM_I64:
        REDUCE_LOOP(int64_t, dst, src, n, op);
        break;
    default:
        REDUCE_LOOP(float, dst, src, n, op);
        break;
    }
}

#define MEAN_LOOP(T, buf, n, W)                                                                    \
    do {                                                                                           \
        T *b__ = (T *)(buf);                                                                       \
        for (int64_t i = 0; i < (n); i++) b__[i] /= (T)(W);                                        \
    } while (0)

/* For a power of two, a floating-point multiply by 1 / W gives the quotient bit for bit (both
 * are the exact value, rounded once) at a fraction of a division's cost. */
void cddp_comm_divide(cddp_comm_dtype dt, void *buf, int64_t n, int W) {
    if ((W & (W - 1)) == 0 && (dt == CDDP_COMM_F32 || dt == CDDP_COMM_F64)) {
        if (dt == CDDP_COMM_F64) {
            double s = 1.0 / W, *b = buf;
            for (int64_t i = 0; i < n; i++) b[i] *= s;
        } else {
            float s = 1.0f / (float)W, *b = buf;
            for (int64_t i = 0; i < n; i++) b[i] *= s;
        }
        return;
    }
    switch (dt) {
    case CDDP_COMM_F64:
        MEAN_LOOP(double, buf, n, W);
        break;
    case CDDP_COMM_I32:
        MEAN_LOOP(int32_t, buf, n, W);
        break;
    case CDDP_COMM_I64:
        MEAN_LOOP(int64_t, buf, n, W);
        break;
    default:
        MEAN_LOOP(float, buf, n, W);
        break;
    }
}

/* ---- reducing many sources --------------------------------------------------------------- */

/* acc = (x + y) * s, in one pass: the first step of every float32 sum (s = 1, exact), and with
 * s = 1/2 the whole mean of two ranks (DDP's gradients on a pair). */
static void sum_f32(float *restrict acc, const float *x, const float *y, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] = (x[i] + y[i]) * s;
}

void cddp__comm_reduce_sources(cddp_comm_dtype dt, cddp_comm_op op, uint8_t *const *src, int W,
                               int64_t lo, int64_t n, uint8_t *const *dst, int ndst, float *acc,
                               void *tmp) {
    size_t es = cddp_comm_dtype_size(dt);
    bool half = cddp__comm_is_half(dt);
    for (int64_t at = 0; at < n; at += CDDP_COMM_RBLOCK) {
        int64_t m = CDDP_MIN(CDDP_COMM_RBLOCK, n - at);
        size_t first = (size_t)(lo + at) * es, bytes = (size_t)m * es;
        if (half) {
            float *wide = tmp;
            for (int r = 0; r < W; r++) {
                cddp_comm_to_f32(dt, src[r] + first, r == 0 ? acc : wide, m);
                if (r) cddp_comm_combine(CDDP_COMM_F32, op, acc, wide, m);
            }
            if (op == CDDP_COMM_MEAN) cddp_comm_divide(CDDP_COMM_F32, acc, m, W);
            cddp_comm_from_f32(dt, acc, dst[0] + (size_t)at * es, m);
            for (int k = 1; k < ndst; k++)
                memcpy(dst[k] + (size_t)at * es, dst[0] + (size_t)at * es, bytes);
            continue;
        }
        uint8_t *sum = tmp;
        if (dt == CDDP_COMM_F32 && (op == CDDP_COMM_SUM || op == CDDP_COMM_MEAN) && W > 1) {
            bool scaled = op == CDDP_COMM_MEAN && W == 2; /* the mean of 2: a multiply, exact */
            sum_f32((float *)sum, (const float *)(src[0] + first), (const float *)(src[1] + first),
                    scaled ? 0.5f : 1.0f, m);
            for (int r = 2; r < W; r++) cddp_comm_combine(dt, op, sum, src[r] + first, m);
            if (op == CDDP_COMM_MEAN && !scaled) cddp_comm_divide(dt, sum, m, W);
        } else {
            memcpy(sum, src[0] + first, bytes);
            for (int r = 1; r < W; r++) cddp_comm_combine(dt, op, sum, src[r] + first, m);
            if (op == CDDP_COMM_MEAN) cddp_comm_divide(dt, sum, m, W);
        }
        for (int k = 0; k < ndst; k++) memcpy(dst[k] + (size_t)at * es, sum, bytes);
    }
}
