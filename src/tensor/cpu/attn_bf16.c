/* attn_bf16.c: attn.c's products of causal self-attention in bf16, for mixed precision on a
 * processor with AVX512-BF16 (cddp__cpu_bf16_native): the operands rounded to bf16 (to nearest
 * even), their products added in float32, as the bf16 GEMMs do.
 *
 * vdpbf16ps adds, in each of 16 float32 lanes, the products of a pair of bf16 values of one
 * operand with a pair of the other, the pairs running along the sum's index. So the operands are
 * packed first, each as one of three layouts of 32-bit words (a pair: the first value in the low
 * half), for a (rows, cols) float32 matrix m whose rows are ld apart:
 *
 *   rows   word [r][p] = (m[r][2p], m[r][2p+1]): each row in bf16, cols rounded up to even
 *   pairs  word [q][c] = (m[2q][c], m[2q+1][c]): rows 2q and 2q+1 side by side; (rows + 1) / 2
 *          rows of UP32(cols) words
 *   cols   word [p][r] = (m[r][2p], m[r][2p+1]): the pairs of each row, transposed; (cols + 1) / 2
 *          rows of UP32(rows) words
 *
 * (padding is zero). An output tile keeps 8 rows x 32 columns of sums in 16 registers, and each
 * step of the sum's index loads 2 vectors of 16 pairs and broadcasts 8 pairs of the other operand.
 * The packing costs a pass over each matrix (of a lower-triangular P or dS only the half the
 * products read: the _causal packs); the products skip the tiles above the diagonal as attn.c's
 * do, and every output tile is 8 of the output's rows by 32 of its columns, stored in place. */
#include "tensor/cpu/cpu.h"

#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static inline int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* The low n (at most 16, at least 0) lanes. */
static inline __mmask16 lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

void cddp__bf16_pack_rows(uint32_t *dst, const float *m, int64_t ld, int64_t rows, int64_t cols) {
    int64_t P = (cols + 1) / 2;
    cddp__to_bf16_rows((uint16_t *)dst, 2 * P, m, ld, rows, cols);
    if (cols % 2) /* the zero that pads an odd row */
        for (int64_t r = 0; r < rows; r++) ((uint16_t *)dst)[r * 2 * P + cols] = 0;
}

/* cddp__bf16_pack_pairs; with causal, of each pair row q only its columns below 2q + 8 (rounded
 * up to 16), for cddp__bf16_pack_pairs_causal. */
TGT static void pack_pairs(uint32_t *dst, const float *m, int64_t ld, int64_t rows, int64_t cols,
                           bool causal) {
    int64_t W = (cols + 31) / 32 * 32;
    /* word 2i of the 32: row 2q's column i, word 2i + 1: row 2q + 1's */
    static const uint16_t order[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                       21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    __m512i idx = _mm512_loadu_si512(order);
    for (int64_t q = 0; q < (rows + 1) / 2; q++) {
        const float *r0 = m + 2 * q * ld, *r1 = 2 * q + 1 < rows ? r0 + ld : NULL;
        int64_t end = causal ? min64(W, (2 * q + 8 + 15) / 16 * 16) : W;
        for (int64_t c = 0; c < end; c += 16) {
            __mmask16 k = lanes(cols - c);
            __m256bh a = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, r0 + c));
            __m256bh b =
                _mm512_cvtneps_pbh(r1 ? _mm512_maskz_loadu_ps(k, r1 + c) : _mm512_setzero_ps());
            __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)a), (__m256i)b, 1);
            _mm512_storeu_si512(dst + q * W + c, _mm512_permutexvar_epi16(idx, ab));
        }
    }
}

void cddp__bf16_pack_pairs(uint32_t *dst, const float *m, int64_t ld, int64_t rows, int64_t cols) {
    pack_pairs(dst, m, ld, rows, cols, false);
}

/* mix_t's tile of output rows j0..j0+7 reads pair rows q >= j0 / 2 at columns j0..j0+7: pair row q
 * is read at columns below 2q + 8 alone. */
void cddp__bf16_pack_pairs_causal(uint32_t *dst, const float *m, int64_t T) {
    pack_pairs(dst, m, T, T, T, true);
}

/* mix's tile of rows t0..t0+7 reads their words below (t0 + 8) / 2: each row is rounded up to the
 * end of its tile alone (the zeros above the diagonal up to there are m's). */
void cddp__bf16_pack_rows_causal(uint32_t *dst, const float *m, int64_t T) {
    int64_t P = (T + 1) / 2;
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
        int64_t n = min64(8, T - t0), c = min64(T, t0 + 8);
        cddp__to_bf16_rows((uint16_t *)(dst + t0 * P), 2 * P, m + t0 * T, T, n, c);
        if (c % 2) /* the zero that pads an odd row */
            for (int64_t r = 0; r < n; r++) ((uint16_t *)dst)[(t0 + r) * 2 * P + c] = 0;
    }
}

/* 16 rows at a time: each row's pairs into tmp (as pack_rows packs them), then word p of the 16
 * rows gathered into row p of dst; the scalar loop where a row has over 512 columns. */
TGT void cddp__bf16_pack_cols(uint32_t *dst, const float *m, int64_t ld, int64_t rows,
                              int64_t cols) {
    int64_t W = (rows + 31) / 32 * 32, P = (cols + 1) / 2;
    for (int64_t p = 0; p < P; p++) memset(dst + p * W + rows, 0, (size_t)(W - rows) * 4);
    if (P > 256) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t p = 0; p < P; p++) {
                uint32_t hi = 2 * p + 1 < cols ? cddp__round_bf16(m[r * ld + 2 * p + 1]) : 0;
                dst[p * W + r] = cddp__round_bf16(m[r * ld + 2 * p]) | hi << 16;
            }
        return;
    }
    uint32_t tmp[16 * 256];
    __m512i at =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32((int)P));
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        int64_t n = min64(16, rows - r0);
        cddp__bf16_pack_rows(tmp, m + r0 * ld, ld, n, cols);
        if (n < 16) memset(tmp + n * P, 0, (size_t)((16 - n) * P) * 4);
        __mmask16 k = lanes(W - r0);
        for (int64_t p = 0; p < P; p++)
            _mm512_mask_storeu_epi32(dst + p * W + r0, k, _mm512_i32gather_epi32(at, tmp + p, 4));
    }
}

/* One 8 x 32 tile of a product: acc[r] = sum over k < n of bcast[r][k bstride] . v[k vstride ..
 * + 32] (a pair of bf16 broadcast against 32 lanes of pairs), then scaled into rows r < nr of o
 * (ld apart), columns c < nc: stored, or added when accumulate. Inlined, so that the 16 sums
 * stay in registers. */
TGT static inline __attribute__((always_inline)) void
tile(const uint32_t *const bcast[8], int64_t bstride, const uint32_t *v, int64_t vstride, int64_t n,
     float scale, float *o, int64_t ld, int64_t nr, int64_t nc, bool accumulate) {
    __m512 acc[8][2];
    for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k++) {
        __m512bh v0 = (__m512bh)_mm512_loadu_si512(v + k * vstride);
        __m512bh v1 = (__m512bh)_mm512_loadu_si512(v + k * vstride + 16);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)bcast[r][k * bstride]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], b, v0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], b, v1);
        }
    }
    __m512 s = _mm512_set1_ps(scale);
    __mmask16 m0 = lanes(nc), m1 = lanes(nc - 16);
    for (int64_t r = 0; r < nr; r++) {
        float *row = o + r * ld;
        __m512 v0 = _mm512_mul_ps(acc[r][0], s), v1 = _mm512_mul_ps(acc[r][1], s);
        if (accumulate) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row + 16));
        }
        _mm512_mask_storeu_ps(row, m0, v0);
        _mm512_mask_storeu_ps(row + 16, m1, v1);
    }
}

TGT void cddp__attn_scores_bf16(const uint32_t *a, const uint32_t *b, int64_t T, int64_t HS,
                                float scale, float *s) {
    int64_t P = (HS + 1) / 2, W = (T + 31) / 32 * 32;
    for (int64_t i0 = 0; i0 < T; i0 += 8) {
        int64_t ni = min64(8, T - i0);
        const uint32_t *ar[8];
        for (int r = 0; r < 8; r++) ar[r] = a + min64(i0 + r, T - 1) * P;
        for (int64_t j0 = 0; j0 < i0 + ni; j0 += 32)
            tile(ar, 1, b + j0, W, P, scale, s + i0 * T + j0, T, ni, min64(32, T - j0), false);
    }
}

TGT void cddp__attn_mix_bf16(const uint32_t *w, const uint32_t *x, int64_t T, int64_t HS,
                             float scale, float *o, int64_t ldo, bool accumulate) {
    int64_t Q = (T + 1) / 2, W = (HS + 31) / 32 * 32;
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
        int64_t nt = min64(8, T - t0), qend = (t0 + nt + 1) / 2; /* w[t][j] = 0 for j > t */
        const uint32_t *wr[8];
        for (int r = 0; r < 8; r++) wr[r] = w + min64(t0 + r, T - 1) * Q;
        for (int64_t d0 = 0; d0 < HS; d0 += 32)
            tile(wr, 1, x + d0, W, qend, scale, o + t0 * ldo + d0, ldo, nt, min64(32, HS - d0),
                 accumulate);
    }
}

TGT void cddp__attn_mix_t_bf16(const uint32_t *w, const uint32_t *x, int64_t T, int64_t HS,
                               float scale, float *o, int64_t ldo, bool accumulate) {
    int64_t Q = (T + 1) / 2, WT = (T + 31) / 32 * 32, WD = (HS + 31) / 32 * 32;
    /* a tile's rows are 8 of o's rows j, broadcast from w's pairs (its column j), its lanes 32 of
     * o's columns d; the sum runs over the pairs of t >= j0 (w[t][j] = 0 for t < j) */
    for (int64_t j0 = 0; j0 < T; j0 += 8) {
        int64_t q0 = j0 / 2;
        const uint32_t *wr[8];
        for (int r = 0; r < 8; r++) wr[r] = w + q0 * WT + min64(j0 + r, T - 1);
        for (int64_t d0 = 0; d0 < HS; d0 += 32)
            tile(wr, WT, x + q0 * WD + d0, WD, Q - q0, scale, o + j0 * ldo + d0, ldo,
                 min64(8, T - j0), min64(32, HS - d0), accumulate);
    }
}
