/* attn.c: the products of causal self-attention for one head, written for its shapes.
 *
 * A head's matrices are small (T x HS, T x T: 64 x 32 and 64 x 64 in nanoGPT's CPU recipe), and
 * half of every T x T matrix is masked. A BLAS call per product pays its packing and dispatch for
 * each of them and computes the masked half too; these loops skip it and need no call. Each
 * product is computed in 8 x 8 tiles of the output whose 64 sums stay in registers (the compiler
 * keeps the inner 8 as one AVX2 vector, or two SSE ones), reading one row of 8 inputs and 8
 * broadcast scalars per step of the inner dimension.
 *
 * The three shapes a head needs (every "w" is lower-triangular, zero above its diagonal):
 *   scores: s[t][j] = scale sum_d a[t][d] bt[d][j], for the tiles on or below the diagonal
 *   mix:    o[t][d] = sum_{j <= t} w[t][j] x[j][d]        (P V, dS K)
 *   mix_t:  o[j][d] = sum_{t >= j} w[t][j] x[t][d]        (P^T dO, dS^T Q)
 * where a and x are rows of the (B, T, 3C) projection (row stride ld) and o is stored or, with
 * accumulate, added.
 */
#include "tensor/cpu/cpu.h"

#include <string.h>

#define TILE   8
#define CLONES CDDP_SIMD_CLONES

/* 8 floats as one value: one AVX2 register, or two SSE ones (GCC's and Clang's vector types). */
typedef float v8 __attribute__((vector_size(32)));

/* v8 v = x[0..8) (unaligned). A macro: a function returning a vector would take another ABI in
 * the baseline build. */
#define LOAD8(v, x) memcpy(&(v), (x), sizeof(v8))

static inline int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

CLONES void cddp__attn_scores(const float *a, int64_t lda, const float *bt, int64_t T, int64_t HS,
                              float scale, float *s) {
    for (int64_t i0 = 0; i0 < T; i0 += TILE) {
        int64_t ni = min64(TILE, T - i0);
        for (int64_t j0 = 0; j0 < i0 + ni; j0 += TILE) {
            int64_t nj = min64(TILE, T - j0);
            float acc[TILE][TILE] = {{0}};
            if (ni == TILE && nj == TILE) {
                v8 va[TILE] = {0};
                for (int64_t d = 0; d < HS; d++) {
                    v8 b;
                    LOAD8(b, bt + d * T + j0);
#pragma GCC unroll 8
                    for (int r = 0; r < TILE; r++) va[r] += b * a[(i0 + r) * lda + d];
                }
                memcpy(acc, va, sizeof acc);
            } else {
                for (int64_t d = 0; d < HS; d++)
                    for (int64_t r = 0; r < ni; r++)
                        for (int64_t c = 0; c < nj; c++)
                            acc[r][c] += a[(i0 + r) * lda + d] * bt[d * T + j0 + c];
            }
            for (int64_t r = 0; r < ni; r++)
                for (int64_t c = 0; c < nj; c++) s[(i0 + r) * T + j0 + c] = scale * acc[r][c];
        }
    }
}

CLONES void cddp__attn_mix(const float *w, const float *x, int64_t ldx, int64_t T, int64_t HS,
                           float scale, float *o, int64_t ldo, bool accumulate) {
    for (int64_t t0 = 0; t0 < T; t0 += TILE) {
        int64_t nt = min64(TILE, T - t0), jend = t0 + nt; /* w[t][j] = 0 for j > t */
        for (int64_t d0 = 0; d0 < HS; d0 += TILE) {
            int64_t nd = min64(TILE, HS - d0);
            float acc[TILE][TILE] = {{0}};
            if (nt == TILE && nd == TILE) {
                v8 va[TILE] = {0};
                for (int64_t j = 0; j < jend; j++) {
                    v8 xv;
                    LOAD8(xv, x + j * ldx + d0);
#pragma GCC unroll 8
                    for (int r = 0; r < TILE; r++) va[r] += xv * w[(t0 + r) * T + j];
                }
                memcpy(acc, va, sizeof acc);
            } else {
                for (int64_t j = 0; j < jend; j++)
                    for (int64_t r = 0; r < nt; r++)
                        for (int64_t c = 0; c < nd; c++)
                            acc[r][c] += w[(t0 + r) * T + j] * x[j * ldx + d0 + c];
            }
            for (int64_t r = 0; r < nt; r++) {
                float *orow = o + (t0 + r) * ldo + d0;
                if (accumulate)
                    for (int64_t c = 0; c < nd; c++) orow[c] += scale * acc[r][c];
                else
                    for (int64_t c = 0; c < nd; c++) orow[c] = scale * acc[r][c];
            }
        }
    }
}

CLONES void cddp__attn_mix_t(const float *w, const float *x, int64_t ldx, int64_t T, int64_t HS,
                             float scale, float *o, int64_t ldo, bool accumulate) {
    for (int64_t j0 = 0; j0 < T; j0 += TILE) {
        int64_t nj = min64(TILE, T - j0);
        for (int64_t d0 = 0; d0 < HS; d0 += TILE) {
            int64_t nd = min64(TILE, HS - d0);
            float acc[TILE][TILE] = {{0}};
            if (nj == TILE && nd == TILE) {
                v8 va[TILE] = {0};
                for (int64_t t = j0; t < T; t++) { /* w[t][j] = 0 for t < j */
                    v8 xv;
                    LOAD8(xv, x + t * ldx + d0);
                    const float *wr = w + t * T + j0;
#pragma GCC unroll 8
                    for (int r = 0; r < TILE; r++) va[r] += xv * wr[r];
                }
                memcpy(acc, va, sizeof acc);
            } else {
                for (int64_t t = j0; t < T; t++)
                    for (int64_t r = 0; r < nj; r++)
                        for (int64_t c = 0; c < nd; c++)
                            acc[r][c] += w[t * T + j0 + r] * x[t * ldx + d0 + c];
            }
            for (int64_t r = 0; r < nj; r++) {
                float *orow = o + (j0 + r) * ldo + d0;
                if (accumulate)
                    for (int64_t c = 0; c < nd; c++) orow[c] += scale * acc[r][c];
                else
                    for (int64_t c = 0; c < nd; c++) orow[c] = scale * acc[r][c];
            }
        }
    }
}

/* In blocks of 8 rows, so that each store writes 8 neighbours. */
CLONES void cddp__attn_transpose(const float *x, int64_t ldx, int64_t T, int64_t HS, float *xt) {
    int64_t t0 = 0;
    for (; t0 + TILE <= T; t0 += TILE)
        for (int64_t d = 0; d < HS; d++) {
            float col[TILE];
#pragma GCC unroll 8
            for (int r = 0; r < TILE; r++) col[r] = x[(t0 + r) * ldx + d];
            memcpy(xt + d * T + t0, col, sizeof col);
        }
    for (int64_t t = t0; t < T; t++)
        for (int64_t d = 0; d < HS; d++) xt[d * T + t] = x[t * ldx + d];
}
