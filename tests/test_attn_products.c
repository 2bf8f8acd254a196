/* test_attn_products.c: causal attention as batched products (tensor/attn_products.c, what the
 * CUDA device runs) against the CPU's attention kernels, run on the CPU's own gemm (its batch),
 * causal_softmax and causal_softmax_grad: the outputs, the weights P and the gradient dqkv, stored
 * and added, in float32 and in bf16 (the same operands rounded): within 1e-6 of the largest value
 * (the same products, some summed in another order; 5e-8 here); in bf16 the output's copy for the
 * next product (out16) is its output rounded to nearest even. */
#include "tensor/internal.h"

#include <cddp/cddp.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct shape {
    int64_t B, T, C, NH;
} shape;

static float *rand_buf(cddp_ctx *ctx, int64_t n, cddp_rng *rng) {
    float *p = cddp_arena_alloc(cddp_ctx_arena(ctx), (size_t)n * sizeof(float), NULL);
    for (int64_t i = 0; i < n; i++) p[i] = 2 * cddp_rng_uniform(rng) - 1;
    return p;
}

/* The largest |a - b| over the largest |b|. */
static double rel_err(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

static void compare(const shape *s, cddp_dtype compute, double bound) {
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    assert_non_null(ctx);
    cddp__kq *q = &cddp__ctx_dev(ctx, cddp_device_get("cpu", NULL))->q;
    cddp_rng rng;
    cddp_rng_seed(&rng, 7 + (uint64_t)s->T);
    int64_t B = s->B, T = s->T, C = s->C, NH = s->NH, nq = B * T * 3 * C, no = B * T * C,
            np = B * NH * T * T;
    float *qkv = rand_buf(ctx, nq, &rng), *dout = rand_buf(ctx, no, &rng);
    float *out[2], *p[2], *dqkv[2][2];
    for (int k = 0; k < 2; k++) {
        out[k] = rand_buf(ctx, no, &rng); /* overwritten */
        p[k] = rand_buf(ctx, np, &rng);
    }
    float *start = rand_buf(ctx, nq, &rng); /* what an added gradient is added to */
    for (int k = 0; k < 2; k++)
        for (int add = 0; add < 2; add++) {
            dqkv[k][add] = rand_buf(ctx, nq, &rng);
            if (add)
                for (int64_t i = 0; i < nq; i++) dqkv[k][add][i] = start[i];
        }
    uint16_t *out16 = compute == CDDP_BF16 ? cddp_arena_alloc(cddp_ctx_arena(ctx),
                                                              (size_t)no * sizeof(uint16_t), NULL)
                                           : NULL;
    cddp__k_attention fw = {
        .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH, .compute = compute, .out16 = NULL};
    cddp__k_attention_grad bw = {
        .qkv = qkv, .dout = dout, .B = B, .T = T, .C = C, .NH = NH, .compute = compute};
    for (int k = 0; k < 2; k++) {
        fw.out = out[k], fw.p = p[k];
        if (k == 0)
            q->dev->k->attention(q, &fw);
        else {
            cddp__k_attention with16 = fw; /* the products also round their output */
            with16.out16 = out16;
            cddp__attention_by_products(q, &with16);
        }
        bw.p = p[k];
        for (int add = 0; add < 2; add++) {
            bw.dqkv = dqkv[k][add], bw.assign = !add;
            if (k == 0)
                q->dev->k->attention_grad(q, &bw);
            else
                cddp__attention_grad_by_products(q, &bw);
        }
    }
    assert_int_equal(cddp_ctx_status(ctx), CDDP_OK);
    double e[4] = {rel_err(out[1], out[0], no), rel_err(p[1], p[0], np),
                   rel_err(dqkv[1][0], dqkv[0][0], nq), rel_err(dqkv[1][1], dqkv[0][1], nq)};
    for (int i = 0; i < 4; i++) {
        if (e[i] > bound)
            print_error("T %lld, %s: error %d (out, P, dqkv stored, added) is %g > %g\n",
                        (long long)T, cddp_dtype_name(compute), i, e[i], bound);
        assert_true(e[i] <= bound);
    }
    for (int64_t i = 0; out16 && i < no; i++) { /* to nearest even (no NaN here) */
        uint32_t u;
        memcpy(&u, &out[1][i], sizeof u);
        assert_int_equal(out16[i], (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    /* P is causal: zeros above the diagonal, rows summing to 1 */
    for (int64_t r = 0; r < B * NH * T; r++) {
        double sum = 0;
        for (int64_t j = 0; j < T; j++) {
            float v = p[1][r * T + j];
            if (j > r % T) assert_true(v == 0.0f);
            sum += v;
        }
        assert_true(fabs(sum - 1) < 1e-5);
    }
    cddp_ctx_destroy(ctx);
}

static void test_float32(void **state) {
    (void)state;
    compare(&(shape){2, 16, 96, 3}, CDDP_F32, 1e-6);
    compare(&(shape){3, 67, 128, 2}, CDDP_F32, 1e-6);
}

static void test_bf16(void **state) {
    (void)state;
    compare(&(shape){2, 16, 96, 3}, CDDP_BF16, 1e-6);
    compare(&(shape){3, 67, 128, 2}, CDDP_BF16, 1e-6);
}

/* By rows (flash_attention, the CPU's reference for the CUDA device's): the output and dqkv,
 * stored and added, against the CPU's attention kernels within `bound` of the largest value, and
 * each query's log-sum-exp that of its scaled scores (in double) within 1e-5. In float32 the
 * sums differ in order only (bound 1e-5); in bf16 the weights are rounded before their division by
 * the row's sum instead of after (kernels.h), a bf16 step of each weight (bound 1e-2). */
static void compare_rows(const shape *s, cddp_dtype compute, double bound) {
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    assert_non_null(ctx);
    cddp__kq *q = &cddp__ctx_dev(ctx, cddp_device_get("cpu", NULL))->q;
    cddp_rng rng;
    cddp_rng_seed(&rng, 9 + (uint64_t)s->T);
    int64_t B = s->B, T = s->T, C = s->C, NH = s->NH, HS = C / NH, nq = B * T * 3 * C,
            no = B * T * C;
    float *qkv = rand_buf(ctx, nq, &rng), *dout = rand_buf(ctx, no, &rng);
    float *p = rand_buf(ctx, B * NH * T * T, &rng), *lse = rand_buf(ctx, B * NH * T, &rng);
    float *out[2] = {rand_buf(ctx, no, &rng), rand_buf(ctx, no, &rng)};
    float *start = rand_buf(ctx, nq, &rng), *dqkv[2][2];
    for (int k = 0; k < 2; k++)
        for (int add = 0; add < 2; add++) {
            dqkv[k][add] = rand_buf(ctx, nq, &rng);
            if (add) memcpy(dqkv[k][add], start, (size_t)nq * sizeof(float));
        }
    cddp__k_attention fw = {
        .qkv = qkv, .out = out[0], .p = p, .B = B, .T = T, .C = C, .NH = NH, .compute = compute};
    cddp__k_flash_attention rw = {.qkv = qkv,
                                  .out = out[1],
                                  .lse = lse,
                                  .B = B,
                                  .T = T,
                                  .C = C,
                                  .NH = NH,
                                  .compute = compute};
    cddp__k_attention_grad bw = {
        .qkv = qkv, .p = p, .dout = dout, .B = B, .T = T, .C = C, .NH = NH, .compute = compute};
    cddp__k_flash_attention_grad rbw = {.qkv = qkv,
                                        .out = out[1],
                                        .lse = lse,
                                        .dout = dout,
                                        .B = B,
                                        .T = T,
                                        .C = C,
                                        .NH = NH,
                                        .compute = compute};
    q->dev->k->attention(q, &fw);
    q->dev->k->flash_attention(q, &rw);
    for (int add = 0; add < 2; add++) {
        bw.dqkv = dqkv[0][add], rbw.dqkv = dqkv[1][add];
        bw.assign = rbw.assign = !add;
        q->dev->k->attention_grad(q, &bw);
        q->dev->k->flash_attention_grad(q, &rbw);
    }
    assert_int_equal(cddp_ctx_status(ctx), CDDP_OK);
    double e[3] = {rel_err(out[1], out[0], no), rel_err(dqkv[1][0], dqkv[0][0], nq),
                   rel_err(dqkv[1][1], dqkv[0][1], nq)};
    for (int i = 0; i < 3; i++) {
        print_message("T %lld, %s by rows: error %d (out, dqkv stored, added) %.3g\n", (long long)T,
                      cddp_dtype_name(compute), i, e[i]);
        assert_true(e[i] <= bound);
    }
    double lse_bound = compute == CDDP_BF16 ? 1e-2 : 1e-5; /* bf16: of rounded q and k */
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *qi = qkv + (b * T + i) * 3 * C + h * HS;
                double sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const float *kj = qkv + (b * T + j) * 3 * C + C + h * HS;
                    double dot = 0;
                    for (int64_t d = 0; d < HS; d++) dot += (double)qi[d] * kj[d];
                    sum += exp(dot / sqrt((double)HS));
                }
                assert_true(fabs(lse[(b * NH + h) * T + i] - log(sum)) <= lse_bound);
            }
    cddp_ctx_destroy(ctx);
}

static void test_by_rows(void **state) {
    (void)state;
    compare_rows(&(shape){2, 67, 128, 2}, CDDP_F32, 1e-5); /* heads of 64, T past a block */
    compare_rows(&(shape){1, 130, 96, 3}, CDDP_F32, 1e-5); /* heads of 32 */
    compare_rows(&(shape){2, 67, 128, 2}, CDDP_BF16, 1e-2);
    compare_rows(&(shape){1, 130, 96, 3}, CDDP_BF16, 1e-2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float32),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_by_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
