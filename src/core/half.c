/* half.c: 16-bit floats (bfloat16 and IEEE half) to float32 and back, on the bits: what DDP's
 * compressed buckets, the checkpoints' and NumPy's 16-bit arrays and the CPU's conversion kernels
 * all round with (cddp/core.h). */
#include "cddp/core.h"

#include <string.h>

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* IEEE half precision by hand, on the bits: no compiler's half type, whose conversions are
 * library calls that not every toolchain links (clang 14 wants compiler-rt's; the fuzzing build)
 * and slower than this. NaNs come out quiet; float32 to half rounds to nearest even. */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) /* infinity, NaN */
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    else if (exp) /* normal: rebias the exponent (127 - 15) */
        u = sign | ((exp + 112) << 23) | (man << 13);
    else { /* zero, subnormal: man * 2^-24, exact in float32 */
        float f = (float)man * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: infinity */
    if (a >= 0x38800000u) { /* a normal half (2^-14 and up): rebias, round off 13 bits */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = a >> 23; /* a subnormal half, in units of 2^-24; below 2^-25: zero */
    if (e < 102) return sign;
    uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e; /* value = m * 2^(e - 150) */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

void cddp_half_to_f32(const uint16_t *src, float *dst, int64_t n, bool f16) {
    if (!f16)
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

void cddp_half_from_f32(const float *src, uint16_t *dst, int64_t n, bool f16) {
    if (!f16)
        for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}
