/* test_bf16.c: mixed precision's products (cddp_ctx_options.compute = CDDP_BF16) on the test
 * device (helpers.h): each op that multiplies in bf16 equals its float32 version run on the
 * bf16-rounded operands (within float32's rounding of the sums), and the float32 op on the
 * original ones within bf16's 1e-2. Where the processor has no bf16 units the products are the
 * emulation's (CDDP_BF16_EMULATE=1, set here), the same numbers: ctest runs this program a second
 * time with oneDNN kept from them (test_bf16_emulated), and then the log line says so. */
#include "helpers.h"
#include "tensor/internal.h"

static cddp_ctx *ctx, *lo; /* float32, and mixed precision */

static int setup(void **state) {
    (void)state;
    setenv("CDDP_BF16_EMULATE", "1", 0);
    ctx = cddp_ctx_create(&(cddp_ctx_options){.seed = 7, .device = test_device()});
    lo = cddp_ctx_create(
        &(cddp_ctx_options){.seed = 7, .device = test_device(), .compute = CDDP_BF16});
    return ctx && lo ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cddp_ctx_destroy(lo);
    cddp_ctx_destroy(ctx);
    host_release();
    return 0;
}

/* The path the device takes, emulated exactly when the test asks for it (DNNL_MAX_CPU_ISA). */
static void test_bf16_path(void **state) {
    (void)state;
    cddp_error err = {0};
    const char *how = NULL;
    assert_int_equal(cddp_device_computes(test_device(), CDDP_BF16, &how, &err), CDDP_OK);
    print_message("bf16 on %s: %s\n", cddp_device_name(test_device()), how);
    const char *isa = getenv("DNNL_MAX_CPU_ISA");
    if (isa && !strcmp(isa, "AVX512_CORE"))
        assert_non_null(strstr(how, "emulated (no AVX512-BF16 or AMX)"));
}

/* x rounded to bf16 (to nearest, ties to even), as a float. */
static float bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof u);
    return x;
}

/* Mixed precision's products (cddp_ctx_options.compute = CDDP_BF16): matmul in its four
 * orientations and linear's forward and gradients equal the products of the bf16-rounded operands
 * summed in float32 (within float32's rounding of the sums), and float32's within bf16's 1e-2;
 * the rest of the op (linear's bias) stays float32. On a processor without AVX512-BF16 or AMX the
 * products are the emulation's (CDDP_BF16_EMULATE), the same numbers. */
static void test_bf16_products(void **state) {
    (void)state;
    assert_int_equal(cddp_ctx_compute(lo), CDDP_BF16);
    cddp_rng r;
    cddp_rng_seed(&r, 3);
    for (int tr = 0; tr < 4; tr++) {
        bool ta = tr & 1, tb = tr & 2;
        int64_t M = 97 + tr, K = 300, N = 65;
        cddp_ctx_reset(ctx);
        cddp_ctx_reset(lo);
        float *ah = malloc(sizeof(float) * (size_t)(M * K)),
              *bh = malloc(sizeof(float) * (size_t)(K * N));
        for (int64_t i = 0; i < M * K; i++) ah[i] = 2 * cddp_rng_uniform(&r) - 1;
        for (int64_t i = 0; i < K * N; i++) bh[i] = 2 * cddp_rng_uniform(&r) - 1;
        const int64_t *as = ta ? (int64_t[]){K, M} : (int64_t[]){M, K};
        const int64_t *bs = tb ? (int64_t[]){N, K} : (int64_t[]){K, N};
        const float *c32 = HOST(cddp_matmul(ctx, cddp_from_data(ctx, CDDP_F32, 2, as, ah),
                                            cddp_from_data(ctx, CDDP_F32, 2, bs, bh), ta, tb));
        const float *c16 = HOST(cddp_matmul(lo, cddp_from_data(lo, CDDP_F32, 2, as, ah),
                                            cddp_from_data(lo, CDDP_F32, 2, bs, bh), ta, tb));
        double rounded = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)bf16(ah[ta ? k * M + i : i * K + k]) *
                               bf16(bh[tb ? j * K + k : k * N + j]);
                    s += p;
                    mag += fabs(p);
                }
                assert_close(c16[i * N + j], s, 0, 1e-6 * mag); /* float32 sums of exact products */
                assert_close(c16[i * N + j], c32[i * N + j], 0, 1e-2 * mag);
                rounded = fmax(rounded, fabs(c16[i * N + j] - c32[i * N + j]));
            }
        assert_true(rounded > 0); /* the operands were rounded */
        free(ah);
        free(bh);
    }
    /* linear: y = x W^T + b, its gradients from loss = sum(y * R) */
    int64_t N = 40, in = 70, out = 30;
    float *v[4];
    int64_t n[4] = {N * in, out * in, out, N * out};
    for (int t = 0; t < 4; t++) {
        v[t] = malloc(sizeof(float) * (size_t)n[t]);
        for (int64_t i = 0; i < n[t]; i++) v[t][i] = 2 * cddp_rng_uniform(&r) - 1;
    }
    const float *res[2][4];
    cddp_ctx *c2[2] = {ctx, lo};
    for (int p = 0; p < 2; p++) {
        cddp_ctx *c = c2[p];
        cddp_ctx_reset(c);
        cddp_tensor *x =
            cddp_requires_grad(c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(N, in), v[0]));
        cddp_tensor *w =
            cddp_requires_grad(c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(out, in), v[1]));
        cddp_tensor *b = cddp_requires_grad(c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(out), v[2]));
        cddp_tensor *y = cddp_linear(c, x, w, b);
        cddp_tensor *R = cddp_from_data(c, CDDP_F32, CDDP_SHAPE(N, out), v[3]);
        assert_int_equal(cddp_backward(c, cddp_sum(c, cddp_mul(c, y, R))), CDDP_OK);
        res[p][0] = HOST(y);
        res[p][1] = HOST_GRAD(x);
        res[p][2] = HOST_GRAD(w);
        res[p][3] = HOST_GRAD(b);
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < out; j++) {
            double s = v[2][j], mag = fabs(v[2][j]);
            for (int64_t k = 0; k < in; k++) {
                double p = (double)bf16(v[0][i * in + k]) * bf16(v[1][j * in + k]);
                s += p;
                mag += fabs(p);
            }
            assert_close(res[1][0][i * out + j], s, 0, 1e-6 * mag);
            assert_close(res[1][0][i * out + j], res[0][0][i * out + j], 0, 1e-2 * mag);
        }
    for (int g = 1; g < 4; g++) /* dx = R W, dW = R^T x (bf16 products), db = column sums of R */
        for (int64_t i = 0; i < n[g - 1]; i++)
            assert_close(res[1][g][i], res[0][g][i], 1e-2, g == 3 ? 0 : 2e-2);
    /* the gradients' products are those of the rounded operands: R with x's and W's roundings
     * (the forward's, which the device may keep for them) */
    for (int g = 1; g < 3; g++)
        for (int64_t i = 0; i < (g == 1 ? N : out); i++)
            for (int64_t j = 0; j < in; j++) {
                double s = 0, mag = 0;
                for (int64_t k = 0; k < (g == 1 ? out : N); k++) {
                    double p = g == 1 ? (double)bf16(v[3][i * out + k]) * bf16(v[1][k * in + j])
                                      : (double)bf16(v[3][k * out + i]) * bf16(v[0][k * in + j]);
                    s += p;
                    mag += fabs(p);
                }
                assert_close(res[1][g][i * in + j], s, 0, 1e-6 * mag);
            }
    for (int64_t j = 0; j < out; j++) assert_close(res[1][3][j], res[0][3][j], 1e-6, 1e-6);
    for (int t = 0; t < 4; t++) free(v[t]);
    /* evaluation in float32 on the same context, then back */
    assert_int_equal(cddp_ctx_set_compute(lo, CDDP_F32), CDDP_BF16);
    assert_int_equal(cddp_ctx_set_compute(lo, CDDP_BF16), CDDP_F32);
}

/* ---- convolutions --------------------------------------------------------------------------- */

/* A convolution's case: its shapes, and the op: the convolution on plain tensors, on blocked ones
 * (cddp_to_blocked, cddp_conv2d_blocked: a ResNet's), or with ReLU and 2x2 max pooling (a CNN's
 * layer, one kernel on the CPU). */
typedef struct conv_case {
    int64_t N, C, H, W, O;
    int kernel, stride, pad, groups;
    bool bias;
    enum { PLAIN, BLOCKED, FUSED } op;
} conv_case;

/* The case's output numel. */
static int64_t conv_out_n(const conv_case *k) {
    int64_t OH = (k->H + 2 * k->pad - k->kernel) / k->stride + 1,
            OW = (k->W + 2 * k->pad - k->kernel) / k->stride + 1;
    return k->op == FUSED ? k->N * k->O * (OH / 2) * (OW / 2) : k->N * k->O * OH * OW;
}

/* Runs the case in c on v (x, w, b, r): y and the gradients of x, w and b from loss = sum(y * r),
 * copied into out[0..3] (malloc'd, n[i] floats). */
static void conv_run(cddp_ctx *c, const conv_case *k, float *const v[4], float *out[4],
                     const int64_t n[4]) {
    cddp_ctx_reset(c);
    cddp_tensor *x = cddp_requires_grad(
        c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(k->N, k->C, k->H, k->W), v[0]));
    cddp_tensor *w = cddp_requires_grad(
        c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(k->O, k->C / k->groups, k->kernel, k->kernel),
                          v[1]));
    cddp_tensor *b =
        k->bias ? cddp_requires_grad(c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(k->O), v[2])) : NULL;
    cddp_tensor *y;
    if (k->op == FUSED)
        y = cddp_conv2d_relu_max_pool2d(c, x, w, b, k->stride, k->pad, k->groups, 2, 2, 0);
    else if (k->op == BLOCKED)
        y = cddp_to_nchw(
            c, cddp_conv2d_blocked(c, cddp_to_blocked(c, x), w, b, k->stride, k->pad, k->groups));
    else
        y = cddp_conv2d_groups(c, x, w, b, k->stride, k->pad, k->groups);
    assert_non_null(y);
    assert_int_equal(y->numel, n[3]);
    cddp_tensor *r = cddp_from_data(c, CDDP_F32, y->ndim, y->shape, v[3]);
    assert_int_equal(cddp_backward(c, cddp_sum(c, cddp_mul(c, y, r))), CDDP_OK);
    const float *got[4] = {HOST(y), HOST_GRAD(x), HOST_GRAD(w), b ? HOST_GRAD(b) : NULL};
    int64_t len[4] = {n[3], n[0], n[1], n[2]};
    for (int i = 0; i < 4; i++) {
        out[i] = calloc((size_t)len[i] + 1, sizeof(float));
        assert_non_null(out[i]);
        if (got[i]) memcpy(out[i], got[i], (size_t)len[i] * sizeof(float));
    }
}

/* The largest |a[i] - b[i]|, and the largest |b[i]| into *mag. */
static double max_diff(const float *a, const float *b, int64_t n, double *mag) {
    double d = 0;
    *mag = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        *mag = fmax(*mag, fabs((double)b[i]));
    }
    return d;
}

/* Convolutions in bf16: the output and the gradients of x, w and b equal float32's on the
 * bf16-rounded x, w and output gradient (within 1e-4 of the largest value: float32 sums in
 * another order), and float32's on the original values within 1e-2 (the output only, where max
 * pooling follows: its gradients go to the maxima, which rounding may move), but not within 1e-5
 * (they were rounded). The cases: one input channel (cddp's own loop for the weights' gradient), a
 * CNN's two layers fused with ReLU and pooling, 16 -> 32 channels, stride 2 with an output channel
 * count that is no multiple of the block, groups, a few input channels at stride 2 (oneDNN's plain
 * layouts), and blocked tensors as a ResNet keeps them (a 3x3 and a 1x1 stride-2 shortcut). */
static void test_bf16_convolutions(void **state) {
    (void)state;
    const conv_case cases[] = {
        {2, 1, 12, 12, 16, 3, 1, 1, 1, true, PLAIN},
        {2, 1, 12, 12, 16, 3, 1, 1, 1, true, FUSED},
        {2, 16, 12, 12, 32, 3, 1, 1, 1, true, FUSED},
        {2, 16, 10, 10, 32, 3, 1, 1, 1, true, PLAIN},
        {2, 16, 9, 9, 24, 3, 2, 1, 1, false, PLAIN},
        {2, 32, 8, 8, 32, 3, 1, 1, 4, true, PLAIN},
        {2, 3, 9, 9, 16, 3, 2, 1, 1, true, PLAIN},
        {2, 16, 8, 8, 32, 3, 1, 1, 1, false, BLOCKED},
        {2, 16, 8, 8, 32, 1, 2, 0, 1, false, BLOCKED},
    };
    const char *what[4] = {"y", "dx", "dw", "db"};
    cddp_rng rng;
    cddp_rng_seed(&rng, 5);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const conv_case *k = &cases[c];
        int64_t n[4] = {k->N * k->C * k->H * k->W,
                        k->O * (k->C / k->groups) * k->kernel * k->kernel, k->O, conv_out_n(k)};
        float *v[4], *rv[4], *got[4], *want[4], *f32[4];
        for (int i = 0; i < 4; i++) {
            v[i] = malloc((size_t)n[i] * sizeof(float));
            rv[i] = malloc((size_t)n[i] * sizeof(float));
            assert_true(v[i] && rv[i]);
            for (int64_t j = 0; j < n[i]; j++) {
                v[i][j] = 2 * cddp_rng_uniform(&rng) - 1;
                rv[i][j] = i == 2 ? v[i][j] : bf16(v[i][j]); /* the bias is added in float32 */
            }
        }
        conv_run(lo, k, v, got, n);
        conv_run(ctx, k, rv, want, n);
        conv_run(ctx, k, v, f32, n);
        int64_t len[4] = {n[3], n[0], n[1], k->bias ? n[2] : 0};
        for (int i = 0; i < 4; i++) {
            double mag, d = max_diff(got[i], want[i], len[i], &mag), m32;
            double d32 = max_diff(got[i], f32[i], len[i], &m32);
            /* pooling's gradient goes where the maxima are, which rounding may move */
            bool near = k->op != FUSED || i == 0;
            if (d > 1e-4 * mag || (near && d32 > 1e-2 * m32) || (i < 3 && d32 <= 1e-5 * m32))
                fail_msg("case %zu, %s: %g from float32 on rounded values, %g from float32 "
                         "(largest %g)",
                         c, what[i], d, d32, mag);
        }
        for (int i = 0; i < 4; i++) {
            free(v[i]);
            free(rv[i]);
            free(got[i]);
            free(want[i]);
            free(f32[i]);
        }
    }
}

/* ---- attention ------------------------------------------------------------------------------ */

/* Causal self-attention and its gradient in double, the products' operands rounded to bf16 as
 * mixed precision rounds them (q, k, v; the weights P and the output gradient r for o = P v and
 * dv = P^T r, dP = r v^T; dS for dq = dS k and dk = dS^T q), P and dS first taken to float32 as
 * the kernels hold them. o: (B,T,C); g: the gradient of qkv (B,T,3C). By rows (flash_attention,
 * where the device attends so): the weights rounded before they are divided by their sum,
 * o = sum bf16(exp(s - max)) v / sum, and the backward's rowsum(dP P) taken as r o. */
static void attention_ref(const float *qkv, const float *r, int64_t B, int64_t T, int64_t C,
                          int64_t NH, bool rows, double *o, double *g) {
    int64_t HS = C / NH;
    double scale = 1 / sqrt((double)HS);
    float *p = malloc(sizeof(float) * (size_t)(T * T)),
          *ds = malloc(sizeof(float) * (size_t)(T * T));
    assert_true(p && ds);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
#define Q(t, d)       bf16(qkv[(b * T + (t)) * 3 * C + h * HS + (d)])
#define K(t, d)       bf16(qkv[(b * T + (t)) * 3 * C + C + h * HS + (d)])
#define V(t, d)       bf16(qkv[(b * T + (t)) * 3 * C + 2 * C + h * HS + (d)])
#define R(t, d)       bf16(r[(b * T + (t)) * C + h * HS + (d)])
#define G(t, part, d) g[(b * T + (t)) * 3 * C + (part)*C + h * HS + (d)]
            for (int64_t t = 0; t < T; t++) {
                double s[4096], mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= t; j++) {
                    s[j] = 0;
                    for (int64_t d = 0; d < HS; d++) s[j] += (double)Q(t, d) * K(j, d);
                    mx = fmax(mx, s[j] *= scale);
                }
                for (int64_t j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                for (int64_t j = 0; j < T; j++) p[t * T + j] = j <= t ? (float)(s[j] / sum) : 0;
                for (int64_t d = 0; d < HS; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= t; j++)
                        acc += rows ? (double)bf16((float)s[j]) * V(j, d) / sum
                                    : (double)bf16(p[t * T + j]) * V(j, d);
                    o[(b * T + t) * C + h * HS + d] = acc;
                }
            }
            for (int64_t t = 0; t < T; t++) {
                double dp[4096], dot = 0;
                for (int64_t j = 0; j <= t; j++) {
                    dp[j] = 0;
                    for (int64_t d = 0; d < HS; d++) dp[j] += (double)R(t, d) * V(j, d);
                    dot += dp[j] * p[t * T + j];
                }
                if (rows) { /* the output's gradient . the output, as the kernel has them */
                    int64_t at = (b * T + t) * C + h * HS;
                    dot = 0;
                    for (int64_t d = 0; d < HS; d++) dot += (double)r[at + d] * o[at + d];
                }
                for (int64_t j = 0; j < T; j++)
                    ds[t * T + j] = j <= t ? (float)(p[t * T + j] * (dp[j] - dot)) : 0;
            }
            for (int64_t j = 0; j < T; j++)
                for (int64_t d = 0; d < HS; d++) {
                    double dv = 0, dq = 0, dk = 0;
                    for (int64_t t = j; t < T; t++) {
                        dv += (double)bf16(p[t * T + j]) * R(t, d);
                        dk += (double)bf16(ds[t * T + j]) * Q(t, d);
                    }
                    for (int64_t i = 0; i <= j; i++) dq += (double)bf16(ds[j * T + i]) * K(i, d);
                    G(j, 0, d) = dq * scale;
                    G(j, 1, d) = dk * scale;
                    G(j, 2, d) = dv;
                }
#undef Q
#undef K
#undef V
#undef R
#undef G
        }
    free(p);
    free(ds);
}

/* Root mean square of a - b (b double, or float when bf is given). */
static double rms_diff(const float *a, const double *b, const float *bf, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (bf ? (double)bf[i] : b[i]);
        s += d * d;
    }
    return sqrt(s / (double)n);
}

/* Attention in bf16 (attn_bf16.c on AVX512-BF16, the emulation's rounded operands elsewhere):
 * the output and the gradient of qkv are the reference's (attention_ref: bf16-rounded operands,
 * sums in double): all but a twentieth of the elements within 1e-5 of the largest value, and
 * within a fifth of float32's distance from it (root mean square). A weight of P or dS is a
 * float32 result that the kernel and the reference may round to neighbouring bf16 values, which
 * moves its row by a bf16 step: so not every element. And float32's within 1e-2 of the largest
 * value but not within 1e-5.
 * The shapes: odd T and head size (padding of every packed layout), T past a tile of 32, and a
 * GPT's head of 64. */
static void test_bf16_attention(void **state) {
    (void)state;
    const int64_t cases[][4] = {
        {2, 37, 10, 2}, {1, 70, 64, 2}, {1, 64, 64, 1}, {1, 131, 48, 2}}; /* B, T, C, NH */
    cddp_rng rng;
    cddp_rng_seed(&rng, 11);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t B = cases[c][0], T = cases[c][1], C = cases[c][2], NH = cases[c][3];
        int64_t nq = B * T * 3 * C, no = B * T * C;
        float *qkv = malloc(sizeof(float) * (size_t)nq), *r = malloc(sizeof(float) * (size_t)no);
        double *o = malloc(sizeof(double) * (size_t)no), *g = malloc(sizeof(double) * (size_t)nq);
        assert_true(qkv && r && o && g);
        for (int64_t i = 0; i < nq; i++) qkv[i] = 2 * cddp_rng_uniform(&rng) - 1;
        for (int64_t i = 0; i < no; i++) r[i] = 2 * cddp_rng_uniform(&rng) - 1;
        bool rows = cddp_knob_int(CDDP_KNOB_FLASH_ATTENTION) &&
                    test_device()->k->attends_by_rows(B, T, NH, C / NH, CDDP_BF16);
        attention_ref(qkv, r, B, T, C, NH, rows, o, g);
        float *got[2][2];
        cddp_ctx *cs[2] = {lo, ctx};
        for (int k = 0; k < 2; k++) {
            cddp_ctx *x = cs[k];
            cddp_ctx_reset(x);
            cddp_tensor *t =
                cddp_requires_grad(x, cddp_from_data(x, CDDP_F32, CDDP_SHAPE(B, T, 3 * C), qkv));
            cddp_tensor *y = cddp_attention(x, t, (int)NH);
            assert_non_null(y);
            cddp_tensor *w = cddp_from_data(x, CDDP_F32, CDDP_SHAPE(B, T, C), r);
            assert_int_equal(cddp_backward(x, cddp_sum(x, cddp_mul(x, y, w))), CDDP_OK);
            got[k][0] = malloc(sizeof(float) * (size_t)no);
            got[k][1] = malloc(sizeof(float) * (size_t)nq);
            memcpy(got[k][0], HOST(y), sizeof(float) * (size_t)no);
            memcpy(got[k][1], HOST_GRAD(t), sizeof(float) * (size_t)nq);
        }
        const char *what[2] = {"output", "qkv's gradient"};
        int64_t n[2] = {no, nq};
        for (int i = 0; i < 2; i++) {
            const double *ref = i ? g : o;
            double e16 = rms_diff(got[0][i], ref, NULL, n[i]);
            double e32 = rms_diff(got[1][i], ref, NULL, n[i]);
            double mag, d32 = max_diff(got[0][i], got[1][i], n[i], &mag);
            int64_t off = 0; /* elements not within 1e-5 of the largest value of the reference */
            for (int64_t e = 0; e < n[i]; e++) off += fabs(got[0][i][e] - ref[e]) > 1e-5 * mag;
            print_message("attention %zu%s, %s: %.3g from the rounded reference (float32: %.3g; "
                          "%lld of %lld elements off), %.3g from float32 (largest %.3g)\n",
                          c, rows ? " by rows" : "", what[i], e16, e32, (long long)off,
                          (long long)n[i], d32, mag);
            if (e16 > e32 / 5 || off > n[i] / 20 || d32 > 1e-2 * mag || d32 <= 1e-5 * mag)
                fail_msg("attention case %zu, %s: %g from the rounded reference (float32: %g; "
                         "%lld elements off), %g from float32 (largest %g)",
                         c, what[i], e16, e32, (long long)off, d32, mag);
        }
        for (int k = 0; k < 2; k++) free(got[k][0]), free(got[k][1]);
        free(qkv), free(r), free(o), free(g);
    }
}

/* Layer norm, GELU and attention, whose outputs feed linear layers, write them rounded to bf16
 * too in mixed precision (cddp_tensor.own.half): exactly data's rounding, which a linear layer then
 * reads instead of rounding data itself; in float32 they write none. */
static void test_bf16_halves(void **state) {
    (void)state;
    enum { B = 2, T = 10, C = 12 };
    float qkv[B * T * 3 * C], x[B * T * C], w[C], b[C];
    cddp_rng r;
    cddp_rng_seed(&r, 5);
    for (int i = 0; i < B * T * 3 * C; i++) qkv[i] = 2 * cddp_rng_uniform(&r) - 1;
    for (int i = 0; i < B * T * C; i++) x[i] = 4 * cddp_rng_uniform(&r) - 2;
    for (int i = 0; i < C; i++) w[i] = 1 + cddp_rng_uniform(&r), b[i] = cddp_rng_uniform(&r);
    cddp_ctx *cs[2] = {ctx, lo};
    for (int k = 0; k < 2; k++) {
        cddp_ctx *c = cs[k];
        cddp_ctx_reset(c);
        cddp_tensor *xt = cddp_from_data(c, CDDP_F32, CDDP_SHAPE(B, T, C), x);
        cddp_tensor *out[3] = {
            cddp_layer_norm(c, xt, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(C), w),
                            cddp_from_data(c, CDDP_F32, CDDP_SHAPE(C), b), 1e-5f),
            cddp_gelu_tanh(c, xt),
            cddp_attention(c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(B, T, 3 * C), qkv), 2)};
        for (int o = 0; o < 3; o++) {
            assert_non_null(out[o]);
            if (c == ctx) {
                assert_null(out[o]->own.half);
                continue;
            }
            assert_non_null(out[o]->own.half);
            const float *d = HOST(out[o]);
            const uint16_t *h = (const uint16_t *)host_f32(out[o]->device, out[o]->own.half,
                                                           out[o]->numel / 2); /* numel: even */
            for (int64_t i = 0; i < out[o]->numel; i++) {
                float v = bf16(d[i]);
                uint32_t u;
                memcpy(&u, &v, sizeof u);
                assert_int_equal(h[i], u >> 16);
            }
        }
    }
}

/* Batch normalisation's backward hands the convolution before it its gradient in bf16
 * (grad_half), where the convolution's backward reads it so (bf16 units; not when emulated): the
 * gradients of everything are the bits they are when the convolution's output keeps its float32
 * gradient (cddp_retain_grad, which turns the hand-over off), and grad_half is that gradient
 * rounded to nearest even. Three chains as a ResNet has them: one input channel (the stem: cddp's
 * own loop for the weights' gradient) into batch_norm_relu; 16 blocked channels into
 * batch_norm_add_relu with a residual that wants its gradient; a 1x1 stride-2 shortcut into
 * batch_norm. */
enum { GH_RELU, GH_ADD_RELU, GH_PLAIN };

typedef struct gh_run {
    float *grads[6]; /* x, w, b, gamma, beta, residual */
    int64_t n[6];
    float *h_grad;    /* the convolution output's float32 gradient (kept) */
    uint16_t *h_half; /* or its bf16 one */
    int64_t hn;
} gh_run;

static void gh_chain(int kind, bool keep, gh_run *out) {
    const int64_t C = kind == GH_RELU ? 1 : 16, O = 16, N = 2, H = 8;
    const int k = kind == GH_PLAIN ? 1 : 3, stride = kind == GH_PLAIN ? 2 : 1, pad = k / 2;
    cddp_rng rng;
    cddp_rng_seed(&rng, 11 + kind);
    float xv[N * C * H * H], wv[O * C * 9], bv[O], gv[O], betav[O], rv[N * O * H * H],
        sv[N * O * H * H];
    float *all[] = {xv, wv, bv, gv, betav, rv, sv};
    int64_t len[] = {N * C * H * H, O * C * k * k, O, O, O, N * O * H * H, N * O * H * H};
    for (int a = 0; a < 7; a++)
        for (int64_t i = 0; i < len[a]; i++) all[a][i] = 2 * cddp_rng_uniform(&rng) - 1;
    cddp_ctx_reset(lo);
    cddp_tensor *x =
        cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(N, C, H, H), xv));
    cddp_tensor *w =
        cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(O, C, k, k), wv));
    cddp_tensor *b = cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(O), bv));
    cddp_tensor *g = cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(O), gv));
    cddp_tensor *be = cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(O), betav));
    cddp_tensor *xin = C > 1 ? cddp_to_blocked(lo, x) : x, *r = NULL, *rb = NULL, *y;
    if (kind ==
        GH_ADD_RELU) { /* the residual in the output's layout, made before it (a ResNet's) */
        r = cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(N, O, H, H), rv));
        rb = cddp_to_blocked(lo, r);
    }
    cddp_tensor *h = cddp_conv2d_blocked(lo, xin, w, b, stride, pad, 1);
    assert_non_null(h);
    if (keep) cddp_retain_grad(h);
    if (kind == GH_ADD_RELU) {
        y = cddp_batch_norm_add_relu(lo, h, rb, g, be, NULL, NULL, true, 0.1f, 1e-5f);
    } else if (kind == GH_RELU) {
        y = cddp_batch_norm_relu(lo, h, g, be, NULL, NULL, true, 0.1f, 1e-5f);
    } else {
        y = cddp_batch_norm(lo, h, g, be, NULL, NULL, true, 0.1f, 1e-5f);
    }
    assert_non_null(y);
    y = cddp_to_nchw(lo, y);
    cddp_tensor *s = cddp_from_data(lo, CDDP_F32, y->ndim, y->shape, sv);
    assert_int_equal(cddp_backward(lo, cddp_sum(lo, cddp_mul(lo, y, s))), CDDP_OK);
    cddp_tensor *ts[6] = {x, w, b, g, be, r};
    for (int a = 0; a < 6; a++) {
        out->n[a] = ts[a] ? ts[a]->numel : 0;
        out->grads[a] = calloc((size_t)out->n[a] + 1, sizeof(float));
        assert_non_null(out->grads[a]);
        if (ts[a]) memcpy(out->grads[a], HOST_GRAD(ts[a]), (size_t)out->n[a] * sizeof(float));
    }
    out->hn = h->numel;
    out->h_grad = NULL;
    out->h_half = NULL;
    if (keep) {
        assert_null(h->own.grad_half);
        out->h_grad = malloc((size_t)h->numel * sizeof(float));
        assert_non_null(out->h_grad);
        memcpy(out->h_grad, HOST_GRAD(h), (size_t)h->numel * sizeof(float));
    } else if (h->own.grad_half) {
        assert_null(h->grad);
        out->h_half = malloc((size_t)h->numel * sizeof(uint16_t));
        assert_non_null(out->h_half);
        memcpy(out->h_half, host_f32(h->device, h->own.grad_half, h->numel / 2),
               (size_t)h->numel * sizeof(uint16_t));
    }
}

static void test_bf16_grad_half(void **state) {
    (void)state;
    cddp_error err = {0};
    const char *how = NULL;
    assert_int_equal(cddp_device_computes(test_device(), CDDP_BF16, &how, &err), CDDP_OK);
    bool units = strstr(how, "emulated") == NULL; /* the bf16 units multiply: hand-over on */
    for (int kind = GH_RELU; kind <= GH_PLAIN; kind++) {
        gh_run on, off;
        gh_chain(kind, false, &on);
        gh_chain(kind, true, &off);
        if (units != (on.h_half != NULL))
            fail_msg("chain %d: grad_half %s, the bf16 units %s", kind,
                     on.h_half ? "made" : "not made", units ? "multiply" : "are emulated");
        for (int a = 0; a < 6; a++)
            for (int64_t i = 0; i < on.n[a]; i++)
                if (memcmp(&on.grads[a][i], &off.grads[a][i], sizeof(float)))
                    fail_msg("chain %d, gradient %d [%lld]: %a with the hand-over, %a without",
                             kind, a, (long long)i, (double)on.grads[a][i],
                             (double)off.grads[a][i]);
        for (int64_t i = 0; on.h_half && i < on.hn; i++) {
            float v = bf16(off.h_grad[i]);
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            assert_int_equal(on.h_half[i], u >> 16);
        }
        for (int a = 0; a < 6; a++) free(on.grads[a]), free(off.grads[a]);
        free(on.h_half);
        free(off.h_grad);
    }
}

/* GELU's backward hands the linear layer before it (the GPT's MLP) its output's gradient in bf16,
 * and that gradient's column sums into the layer's bias gradient, as the layer's backward would
 * have rounded and summed them; so do cross-entropy's backward to the linear layer that made its
 * logits (a classifier), through the reshape between them (the GPT's (B, T, V) logits reach the
 * loss as (B T, V)), and a residual add's to the layer that made its second term (a GPT block's
 * output projection). Every gradient is the bits it is with the hand-over turned off
 * (cddp_retain_grad on the layer's output), and grad_half is the float32 gradient rounded. */
enum { CB = 2, CT = 3, CN = CB * CT, CIN = 24, COUT = 40 };
typedef enum tail { GELU_TAIL, CLASSIFIER_TAIL, RESIDUAL_TAIL } tail;
static const char *const tail_name[] = {"gelu", "classifier", "residual"};

static void linear_chain(tail t, bool keep, float *grads[3], uint16_t **half, float **h_grad) {
    float xv[CN * CIN], wv[COUT * CIN], bv[COUT], sv[CN * COUT], rv[CN * COUT];
    int64_t labels[CN];
    cddp_rng rng;
    cddp_rng_seed(&rng, 21);
    float *all[] = {xv, wv, bv, sv, rv};
    int len[] = {CN * CIN, COUT * CIN, COUT, CN * COUT, CN * COUT};
    for (int a = 0; a < 5; a++)
        for (int i = 0; i < len[a]; i++) all[a][i] = 4 * cddp_rng_uniform(&rng) - 2;
    for (int i = 0; i < CN; i++) labels[i] = (int64_t)(cddp_rng_uniform(&rng) * COUT) % COUT;
    cddp_ctx_reset(lo);
    cddp_tensor *x =
        cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(CB, CT, CIN), xv));
    cddp_tensor *w =
        cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(COUT, CIN), wv));
    cddp_tensor *b = cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(COUT), bv));
    cddp_tensor *h = cddp_linear(lo, x, w, b);
    assert_non_null(h);
    if (keep) cddp_retain_grad(h);
    cddp_tensor *loss, *s = cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(CB, CT, COUT), sv);
    if (t == CLASSIFIER_TAIL) {
        cddp_tensor *y = cddp_from_data(lo, CDDP_I64, CDDP_SHAPE(CN), labels);
        loss =
            cddp_cross_entropy(lo, cddp_reshape(lo, h, CDDP_SHAPE(CN, COUT)), y, CDDP_REDUCE_MEAN);
    } else if (t == RESIDUAL_TAIL) { /* a residual r (a leaf wanting its gradient) plus h */
        cddp_tensor *r =
            cddp_requires_grad(lo, cddp_from_data(lo, CDDP_F32, CDDP_SHAPE(CB, CT, COUT), rv));
        loss = cddp_sum(lo, cddp_mul(lo, cddp_add(lo, r, h), s));
    } else {
        loss = cddp_sum(lo, cddp_mul(lo, cddp_gelu_tanh(lo, h), s));
    }
    assert_int_equal(cddp_backward(lo, loss), CDDP_OK);
    cddp_tensor *ts[3] = {x, w, b};
    for (int a = 0; a < 3; a++) {
        grads[a] = malloc((size_t)ts[a]->numel * sizeof(float));
        assert_non_null(grads[a]);
        memcpy(grads[a], HOST_GRAD(ts[a]), (size_t)ts[a]->numel * sizeof(float));
    }
    *half = NULL;
    *h_grad = NULL;
    if (keep) {
        assert_null(h->own.grad_half);
        *h_grad = malloc(sizeof(float) * CN * COUT);
        assert_non_null(*h_grad);
        memcpy(*h_grad, HOST_GRAD(h), sizeof(float) * CN * COUT);
    } else {
        assert_non_null(h->own.grad_half); /* the CPU's products take bf16 operands, emulated too */
        assert_null(h->grad);
        *half = malloc(sizeof(uint16_t) * CN * COUT);
        assert_non_null(*half);
        memcpy(*half, host_f32(h->device, h->own.grad_half, CN * COUT / 2),
               sizeof(uint16_t) * CN * COUT);
    }
}

static void check_linear_chain(tail t) {
    float *on[3], *off[3], *h_grad, *unused_grad;
    uint16_t *half, *unused_half;
    linear_chain(t, false, on, &half, &unused_grad);
    linear_chain(t, true, off, &unused_half, &h_grad);
    int64_t n[3] = {CN * CIN, COUT * CIN, COUT};
    for (int a = 0; a < 3; a++) {
        for (int64_t i = 0; i < n[a]; i++)
            if (memcmp(&on[a][i], &off[a][i], sizeof(float)))
                fail_msg("%s: gradient %d [%lld]: %a with the hand-over, %a without", tail_name[t],
                         a, (long long)i, (double)on[a][i], (double)off[a][i]);
        free(on[a]);
        free(off[a]);
    }
    for (int i = 0; i < CN * COUT; i++) {
        float v = bf16(h_grad[i]);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        assert_int_equal(half[i], u >> 16);
    }
    free(half);
    free(h_grad);
}

static void test_bf16_gelu_grad_half(void **state) {
    (void)state;
    check_linear_chain(GELU_TAIL);
}

static void test_bf16_classifier_grad_half(void **state) {
    (void)state;
    check_linear_chain(CLASSIFIER_TAIL);
}

static void test_bf16_residual_grad_half(void **state) {
    (void)state;
    check_linear_chain(RESIDUAL_TAIL);
}

/* A fused op against the ops it stands for: k inputs of the given shapes, uniform in [-1, 1) and
 * requiring gradients; after y is made from them, the backward of sum(y s) (s uniform, y's shape)
 * and res[0..k) each input's gradient, res[k] y, on the host (freed by same_bits). */
typedef struct chain {
    cddp_rng rng;
    int k;
    cddp_tensor *t[5];
} chain;

static void chain_inputs(chain *ch, cddp_ctx *c, uint64_t seed, int k, const int ndim[],
                         const int64_t *const shapes[]) {
    cddp_rng_seed(&ch->rng, seed);
    cddp_ctx_reset(c);
    ch->k = k;
    for (int a = 0; a < k; a++) {
        ch->t[a] = cddp_requires_grad(c, cddp_uniform(c, ndim[a], shapes[a], -1, 1, &ch->rng));
        assert_non_null(ch->t[a]);
    }
}

static void chain_backward(chain *ch, cddp_ctx *c, cddp_tensor *y, float **res) {
    assert_non_null(y);
    cddp_tensor *s = cddp_uniform(c, y->ndim, y->shape, -1, 1, &ch->rng);
    assert_int_equal(cddp_backward(c, cddp_sum(c, cddp_mul(c, y, s))), CDDP_OK);
    for (int a = 0; a <= ch->k; a++) {
        const cddp_tensor *of = a < ch->k ? ch->t[a] : y;
        size_t bytes = (size_t)of->numel * sizeof(float);
        res[a] = malloc(bytes);
        assert_non_null(res[a]);
        memcpy(res[a], a < ch->k ? HOST_GRAD(of) : HOST(of), bytes);
    }
}

/* one[a] and two[a] (n[a] floats each, a = 0..k) the same bits; what[a] names them. */
static void same_bits(float **one, float **two, const int64_t *n, int k, const char *const *what,
                      bool mixed) {
    for (int a = 0; a <= k; a++) {
        for (int64_t i = 0; i < n[a]; i++)
            if (memcmp(&one[a][i], &two[a][i], sizeof(float)))
                fail_msg("%s, %s [%lld]: %a fused, %a as two ops", mixed ? "bf16" : "float32",
                         what[a], (long long)i, (double)one[a][i], (double)two[a][i]);
        free(one[a]);
        free(two[a]);
    }
}

/* cddp_gelu_tanh_linear (GPT's MLP after its first layer: GELU's output made only in bf16 for the
 * product) gives the output and every gradient the bits that cddp_gelu_tanh then cddp_linear
 * give, in mixed precision and in float32, and hands the layer before it its gradient in bf16. */
enum { MIN_ = 24, MHID = 40, MOUT = 16 };

static void mlp_chain(cddp_ctx *c, bool fused, float *res[6]) {
    chain ch;
    chain_inputs(&ch, c, 5, 5, (int[]){3, 2, 1, 2, 1},
                 (const int64_t *const[]){(int64_t[]){CB, CT, MIN_}, (int64_t[]){MHID, MIN_},
                                          (int64_t[]){MHID}, (int64_t[]){MOUT, MHID},
                                          (int64_t[]){MOUT}});
    cddp_tensor **t = ch.t, *h = cddp_linear(c, t[0], t[1], t[2]);
    chain_backward(&ch, c,
                   fused ? cddp_gelu_tanh_linear(c, h, t[3], t[4])
                         : cddp_linear(c, cddp_gelu_tanh(c, h), t[3], t[4]),
                   res);
    if (fused && c == lo) assert_non_null(h->own.grad_half); /* the first layer's, handed over */
}

static void test_bf16_gelu_linear_fused(void **state) {
    (void)state;
    static const char *const what[] = {"x's gradient", "w1's", "b1's", "w2's", "b2's", "output"};
    int64_t n[6] = {CN * MIN_, MHID * MIN_, MHID, MOUT * MHID, MOUT, CN * MOUT};
    for (int mixed = 0; mixed < 2; mixed++) {
        float *one[6], *two[6];
        mlp_chain(mixed ? lo : ctx, true, one);
        mlp_chain(mixed ? lo : ctx, false, two);
        same_bits(one, two, n, 5, what, mixed);
    }
}

/* cddp_qkv_attention (a GPT block's c_attn and attention: in mixed precision where the device
 * attends by rows, the emulated device here, q, k and v kept only in bf16) gives the output and
 * every gradient the bits that cddp_linear then cddp_attention give, in mixed precision and in
 * float32: 2 heads of 32 over a context of 70 (two blocks of 64 rows). */
enum { QB = 2, QT = 70, QIN = 24, QC = 64 };

static void qkv_chain(cddp_ctx *c, bool fused, float *res[4]) {
    chain ch;
    chain_inputs(&ch, c, 9, 3, (int[]){3, 2, 1},
                 (const int64_t *const[]){(int64_t[]){QB, QT, QIN}, (int64_t[]){3 * QC, QIN},
                                          (int64_t[]){3 * QC}});
    cddp_tensor **t = ch.t;
    chain_backward(&ch, c,
                   fused ? cddp_qkv_attention(c, t[0], t[1], t[2], 2)
                         : cddp_attention(c, cddp_linear(c, t[0], t[1], t[2]), 2),
                   res);
}

static void test_bf16_qkv_attention_fused(void **state) {
    (void)state;
    static const char *const what[] = {"x's gradient", "w's", "b's", "output"};
    int64_t n[4] = {QB * QT * QIN, 3 * QC * QIN, 3 * QC, QB * QT * QC};
    for (int mixed = 0; mixed < 2; mixed++) {
        float *one[4], *two[4];
        qkv_chain(mixed ? lo : ctx, true, one);
        qkv_chain(mixed ? lo : ctx, false, two);
        same_bits(one, two, n, 3, what, mixed);
    }
}

/* core's 16-bit conversions (bits, by hand; comm's by dtype the same) against the compiler's IEEE
 * half: every half to float32, and float32 to half at every midpoint between two halves and one
 * unit either side of it (where rounding to nearest even decides), then over all float32 bit
 * patterns in steps. */
static uint16_t half_bits(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

static void check_narrowed(uint32_t u) {
    float f, back;
    memcpy(&f, &u, 4);
    uint16_t h, hc;
    cddp_half_from_f32(&f, &h, 1, true);
    if (h != half_bits(f)) fail_msg("float32 %08x: half %04x, want %04x", u, h, half_bits(f));
    cddp_comm_from_f32(CDDP_COMM_F16, &f, &hc, 1); /* the collectives' dtype: the same */
    assert_int_equal(hc, h);
    cddp_half_to_f32(&h, &back, 1, true);
    if (f == f && (uint16_t)(h & 0x7fffu) < 0x7c00u) /* within half a unit of the half */
        assert_true(fabsf(back - f) <= fmaxf(fabsf(f) / 2048, 0x1p-25f));
}

static void test_half_conversions(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint16_t x = (uint16_t)h;
        _Float16 want;
        float got, w;
        memcpy(&want, &x, 2);
        w = (float)want;
        cddp_half_to_f32(&x, &got, 1, true);
        if (memcmp(&got, &w, 4)) fail_msg("half %04x: float32 %a, want %a", h, got, w);
        float viac;
        cddp_comm_to_f32(CDDP_COMM_F16, &x, &viac, 1);
        if (memcmp(&viac, &w, 4)) fail_msg("half %04x by the collectives' dtype: %a", h, viac);
        if ((h & 0x7fffu) >= 0x7c00u) continue;
        uint16_t next = (uint16_t)(h + 1); /* the next half of larger magnitude */
        _Float16 hi;
        memcpy(&hi, &next, 2);
        float mid = (w + (float)hi) / 2; /* exact: float32 holds every half's midpoints */
        uint32_t m;
        memcpy(&m, &mid, 4);
        for (int d = -1; d <= 1; d++) check_narrowed(m + (uint32_t)d);
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) check_narrowed((uint32_t)u);
    const float edge[] = {65504.0f, 65519.99f,       65520.0f, 1e30f,
                          0x1p-25f, 0x1.000002p-25f, 0x1p-149f};
    for (size_t i = 0; i < CDDP_ARRAY_LEN(edge); i++) {
        uint32_t u;
        memcpy(&u, &edge[i], 4);
        check_narrowed(u);
        check_narrowed(u | 0x80000000u);
    }
}

/* ---- activations in bf16 -------------------------------------------------------------------- */

/* A ResNet's chain with its activations in bf16 (cddp_to_dtype, then convolutions and batch
 * normalisations that take and return bf16), against the same chain in float32 rounded where the
 * bf16 one rounds (a float32 round trip through bf16 after the input, the convolution and the
 * batch normalisation): the output and every gradient the same bits where the products are
 * emulated (float32 loops on the same values), within bf16's 1e-2 of the largest on bf16 units
 * (their convolution writing bf16 may sum in another order). The cases: the stem (one input
 * channel, row-major: cddp's own loop for the weights' gradient) into batch_norm_relu; 16
 * channels blocked into batch_norm_add_relu with a bf16 residual, and with a float32 one; a 1x1
 * stride-2 shortcut into batch_norm; 16 channels row-major into batch_norm_relu in evaluation, and
 * into batch_norm_add_relu with a bf16 residual; a float32 convolution into batch_norm_add_relu
 * with a bf16 residual (its output float32). */
enum {
    ACT_STEM,
    ACT_ADD_HALF,
    ACT_ADD_F32,
    ACT_SHORTCUT,
    ACT_EVAL,
    ACT_PLAIN_ADD,
    ACT_F32_X,
    ACT_CASES
};

/* x rounded to bf16 and widened back, as a float32 tensor (the reference's rounding) */
static cddp_tensor *round_trip(cddp_ctx *c, cddp_tensor *x) {
    return cddp_to_dtype(c, cddp_to_dtype(c, x, CDDP_BF16), CDDP_F32);
}

static void act_chain(int kind, bool half, float *res[7], int64_t n[7]) {
    const int64_t C = kind == ACT_STEM ? 1 : 16, O = 16, N = 2, H = 8;
    const int k = kind == ACT_SHORTCUT ? 1 : 3, stride = kind == ACT_SHORTCUT ? 2 : 1;
    const int64_t OH = (H + 2 * (k / 2) - k) / stride + 1;
    bool blocked =
        kind == ACT_ADD_HALF || kind == ACT_ADD_F32 || kind == ACT_SHORTCUT || kind == ACT_F32_X;
    bool train = kind != ACT_EVAL, residual = kind == ACT_ADD_HALF || kind == ACT_ADD_F32 ||
                                              kind == ACT_PLAIN_ADD || kind == ACT_F32_X;
    bool x_half = half && kind != ACT_F32_X, r_half = kind != ACT_ADD_F32;
    chain ch;
    chain_inputs(&ch, lo, 41 + (uint64_t)kind, residual ? 5 : 4, (int[]){4, 4, 1, 1, 4},
                 (const int64_t *const[]){(int64_t[]){N, C, H, H}, (int64_t[]){O, C, k, k},
                                          (int64_t[]){O}, (int64_t[]){O},
                                          (int64_t[]){N, O, OH, OH}});
    cddp_tensor **t = ch.t, *rm = NULL, *rv = NULL;
    if (!train) { /* running statistics away from the batch's */
        rm = cddp_uniform(lo, 1, (int64_t[]){O}, -0.5, 0.5, &ch.rng);
        rv = cddp_uniform(lo, 1, (int64_t[]){O}, 0.5, 2, &ch.rng);
    }
    cddp_tensor *x = blocked ? cddp_to_blocked(lo, t[0]) : t[0];
    cddp_tensor *r = !residual ? NULL : blocked ? cddp_to_blocked(lo, t[4]) : t[4];
    x = x_half ? cddp_to_dtype(lo, x, CDDP_BF16) : round_trip(lo, x);
    if (residual && r_half) r = half ? cddp_to_dtype(lo, r, CDDP_BF16) : round_trip(lo, r);
    cddp_tensor *h = blocked || kind == ACT_STEM
                         ? cddp_conv2d_blocked(lo, x, t[1], NULL, stride, k / 2, 1)
                         : cddp_conv2d(lo, x, t[1], NULL, stride, k / 2);
    assert_non_null(h);
    assert_int_equal(h->dtype, x_half ? CDDP_BF16 : CDDP_F32);
    if (!x_half) h = round_trip(lo, h);
    cddp_tensor *y =
        residual ? cddp_batch_norm_add_relu(lo, h, r, t[2], t[3], rm, rv, train, 0.1f, 1e-5f)
        : kind == ACT_SHORTCUT
            ? cddp_batch_norm(lo, h, t[2], t[3], rm, rv, train, 0.1f, 1e-5f)
            : cddp_batch_norm_relu(lo, h, t[2], t[3], rm, rv, train, 0.1f, 1e-5f);
    assert_non_null(y);
    assert_int_equal(y->dtype, x_half ? CDDP_BF16 : CDDP_F32);
    assert_int_equal(y->block, h->block);
    y = cddp_to_nchw(lo, x_half ? cddp_to_dtype(lo, y, CDDP_F32) : round_trip(lo, y));
    float *got[6];
    chain_backward(&ch, lo, y, got); /* the inputs' gradients, then y */
    for (int a = 0; a < 5; a++) {
        res[a] = a < ch.k ? got[a] : NULL; /* the residual's: only where it is added */
        n[a] = a < ch.k ? t[a]->numel : 0;
    }
    res[5] = got[ch.k];
    n[5] = y->numel;
    res[6] = NULL;
    n[6] = 0;
    if (!train) { /* the running statistics stay as they were in evaluation */
        res[6] = malloc(2 * (size_t)O * sizeof(float));
        assert_non_null(res[6]);
        memcpy(res[6], HOST(rm), (size_t)O * sizeof(float));
        memcpy(res[6] + O, HOST(rv), (size_t)O * sizeof(float));
        n[6] = 2 * O;
    }
}

static void test_bf16_activations(void **state) {
    (void)state;
    static const char *const what[] = {"x's gradient",   "w's",    "gamma's",           "beta's",
                                       "the residual's", "output", "running statistics"};
    cddp_error err = {0};
    const char *how = NULL;
    assert_int_equal(cddp_device_computes(test_device(), CDDP_BF16, &how, &err), CDDP_OK);
    bool units = strstr(how, "emulated") == NULL;
    for (int kind = 0; kind < ACT_CASES; kind++) {
        float *half[7], *ref[7];
        int64_t n[7], nr[7];
        act_chain(kind, true, half, n);
        act_chain(kind, false, ref, nr);
        for (int a = 0; a < 7; a++) {
            assert_int_equal(n[a], nr[a]);
            double mag = 0, d = n[a] ? max_diff(half[a], ref[a], n[a], &mag) : 0;
            if (units ? d > 1e-2 * mag : d != 0)
                fail_msg("case %d, %s: %g from float32 rounded alike (largest %g)", kind, what[a],
                         d, mag);
            free(half[a]);
            free(ref[a]);
        }
    }
}

/* cddp_to_dtype: float32 to bf16 rounds to nearest even (a NaN stays a NaN), bf16 to float32 is
 * exact, a tensor already in the dtype is returned as it is, and the gradient passes through. */
static void test_bf16_to_dtype(void **state) {
    (void)state;
    const float v[] = {1.0f,   1.00390625f, 1.01171875f, -3.1415926f, 0x1.fffffep+127f,
                       1e-40f, NAN,         0.0f};
    const int64_t n = sizeof v / sizeof v[0];
    cddp_ctx_reset(ctx);
    cddp_tensor *x = cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(n), v));
    cddp_tensor *h = cddp_to_dtype(ctx, x, CDDP_BF16), *f = cddp_to_dtype(ctx, h, CDDP_F32);
    assert_true(cddp_to_dtype(ctx, x, CDDP_F32) == x && cddp_to_dtype(ctx, h, CDDP_BF16) == h);
    assert_int_equal(h->dtype, CDDP_BF16);
    assert_int_equal(f->dtype, CDDP_F32);
    const float *got = HOST(f);
    for (int64_t i = 0; i < n; i++) {
        float want = bf16(v[i]);
        if (isnan(v[i]) ? !isnan(got[i]) : memcmp(&got[i], &want, sizeof want))
            fail_msg("[%lld]: %a rounded to %a, want %a", (long long)i, (double)v[i],
                     (double)got[i], (double)want);
        assert_true(cddp_get(h, i) == got[i] || isnan(v[i]));
    }
    float iv[sizeof v / sizeof v[0]];
    for (int64_t i = 0; i < n; i++) iv[i] = (float)i;
    cddp_tensor *s = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(n), iv);
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, cddp_mul(ctx, f, s))), CDDP_OK);
    const float *g = HOST_GRAD(x);
    for (int64_t i = 0; i < n; i++) assert_true(g[i] == (float)i);
}

/* A convolution given a bf16 input outside mixed precision stops, saying how to go on. */
static void half_conv_in_f32(void *arg) {
    (void)arg;
    cddp_ctx_reset(ctx);
    cddp_tensor *x =
        cddp_to_dtype(ctx, cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(1, 1, 4, 4)), CDDP_BF16);
    cddp_conv2d(ctx, x, cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(2, 1, 3, 3)), NULL, 1, 1);
}

static void test_bf16_activation_refused(void **state) {
    (void)state;
    char msg[1024];
    int status = run_in_child(half_conv_in_f32, NULL, msg, sizeof msg);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    if (!strstr(msg, "conv2d: a bfloat16 input needs mixed precision") ||
        !strstr(msg, "cddp_to_dtype"))
        fail_msg("said: %s", msg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_path),
        cmocka_unit_test(test_bf16_products),
        cmocka_unit_test(test_bf16_convolutions),
        cmocka_unit_test(test_bf16_attention),
        cmocka_unit_test(test_bf16_halves),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_bf16_grad_half),
        cmocka_unit_test(test_bf16_gelu_grad_half),
        cmocka_unit_test(test_bf16_classifier_grad_half),
        cmocka_unit_test(test_bf16_residual_grad_half),
        cmocka_unit_test(test_bf16_gelu_linear_fused),
        cmocka_unit_test(test_bf16_qkv_attention_fused),
        cmocka_unit_test(test_bf16_activations),
        cmocka_unit_test(test_bf16_to_dtype),
        cmocka_unit_test(test_bf16_activation_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
