/* test_ops.c: forward values of every op against hand-computed or naively computed results, on
 * the test device (helpers.h: the CPU, and the emulated device in a second run). */
#include "helpers.h"

#include <dlfcn.h>

static cddp_ctx *ctx;

static int setup(void **state) {
    (void)state;
    ctx = cddp_ctx_create(&(cddp_ctx_options){.seed = 7, .device = test_device()});
    return ctx ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cddp_ctx_destroy(ctx);
    host_release();
    return 0;
}

static cddp_tensor *vec(int64_t n, const float *v) {
    return cddp_from_data(ctx, CDDP_F32, 1, (int64_t[]){n}, v);
}

static void test_creation(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    cddp_tensor *z = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(2, 3));
    cddp_tensor *o = cddp_ones(ctx, CDDP_I64, CDDP_SHAPE(4));
    assert_int_equal(z->ndim, 2);
    assert_int_equal(z->numel, 6);
    assert_ptr_equal(z->device, test_device());
    assert_ptr_equal(cddp_ctx_device(ctx), test_device());
    for (int i = 0; i < 6; i++) assert_true(cddp_get(z, i) == 0.0);
    for (int i = 0; i < 4; i++) assert_true(cddp_get(o, i) == 1.0);
    int32_t raw[3] = {5, -2, 9};
    cddp_tensor *c = cddp_from_data(ctx, CDDP_I32, CDDP_SHAPE(3), raw);
    raw[0] = 0; /* from_data copies */
    assert_true(cddp_get(c, 0) == 5.0 && cddp_get(c, 2) == 9.0);
    cddp_tensor *w = cddp_wrap(ctx, CDDP_F32, CDDP_SHAPE(2), z->data); /* the device's memory */
    assert_ptr_equal(w->data, z->data);                                /* wrap does not copy */
    assert_int_equal(cddp_dtype_size(CDDP_I64), 8);
    assert_string_equal(cddp_dtype_name(CDDP_I32), "int32");
    cddp_tensor *s = cddp_zeros(ctx, CDDP_F32, 0, NULL);
    assert_int_equal(s->numel, 1); /* a scalar */
}

static void test_rng(void **state) {
    (void)state;
    cddp_rng a, b;
    cddp_rng_seed(&a, 123);
    cddp_rng_seed(&b, 123);
    for (int i = 0; i < 1000; i++) assert_true(cddp_rng_next(&a) == cddp_rng_next(&b));
    cddp_rng_seed(&b, 124);
    assert_true(cddp_rng_next(&a) != cddp_rng_next(&b));
    /* Moments of uniform and normal draws. */
    double su = 0, sn = 0, sn2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = cddp_rng_uniform(&a);
        assert_true(u >= 0.0f && u < 1.0f);
        su += u;
        double g = cddp_rng_normal(&a);
        sn += g;
        sn2 += g * g;
    }
    assert_close(su / n, 0.5, 0, 0.005);
    assert_close(sn / n, 0.0, 0, 0.01);
    assert_close(sqrt(sn2 / n), 1.0, 0, 0.01);
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++) counts[cddp_rng_below(&a, 7)]++;
    for (int i = 0; i < 7; i++) assert_close(counts[i], 10000, 0, 400);
    /* Tensors drawn from equal seeds are equal: every rank gets the same initial weights. */
    cddp_ctx_reset(ctx);
    cddp_rng r1, r2;
    cddp_rng_seed(&r1, 9);
    cddp_rng_seed(&r2, 9);
    cddp_tensor *t1 = cddp_normal(ctx, CDDP_SHAPE(50), 1.0f, 2.0f, &r1);
    cddp_tensor *t2 = cddp_normal(ctx, CDDP_SHAPE(50), 1.0f, 2.0f, &r2);
    assert_memory_equal(HOST(t1), HOST(t2), 50 * sizeof(float));
    const float *u = HOST(cddp_uniform(ctx, CDDP_SHAPE(1000), -3.0f, -2.0f, &r1));
    for (int i = 0; i < 1000; i++) assert_true(u[i] >= -3.0f && u[i] < -2.0f);
}

static void fill_random(cddp_tensor *t, cddp_rng *r) {
    cddp_fill_uniform(t, -1.0f, 1.0f, r);
}

/* Products (oneDNN's sgemm) on one thread and on two, small and large enough to be split between
 * threads, every transpose; the OpenMP runtime oneDNN runs on follows cddp_set_num_threads, though
 * it read OMP_NUM_THREADS long before. */
static void test_matmul_and_linear(void **state) {
    (void)state;
    cddp_rng r;
    cddp_rng_seed(&r, 1);
    for (int run = 0; run < 16; run++) {
        int tr = run % 4, threads = run / 8 ? 2 : 1;
        bool ta = tr & 1, tb = tr & 2, large = run / 4 % 2;
        cddp_set_num_threads(threads);
        assert_int_equal(cddp_num_threads(), threads);
        int (*omp_max)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "omp_get_max_threads");
        assert_non_null(omp_max);
        assert_int_equal(omp_max(), threads);
        int64_t M = large ? 97 + tr : 3 + tr, K = large ? 300 : 5, N = large ? 65 : 4;
        cddp_ctx_reset(ctx);
        cddp_tensor *a = cddp_empty(ctx, CDDP_F32, 2, ta ? (int64_t[]){K, M} : (int64_t[]){M, K});
        cddp_tensor *b = cddp_empty(ctx, CDDP_F32, 2, tb ? (int64_t[]){N, K} : (int64_t[]){K, N});
        fill_random(a, &r);
        fill_random(b, &r);
        cddp_tensor *c = cddp_matmul(ctx, a, b, ta, tb);
        assert_int_equal(c->shape[0], M);
        assert_int_equal(c->shape[1], N);
        const float *ah = HOST(a), *bh = HOST(b), *ch = HOST(c);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += (double)ah[ta ? k * M + i : i * K + k] * bh[tb ? j * K + k : k * N + j];
                assert_close(ch[i * N + j], s, 1e-5, 1e-5);
            }
    }
    cddp_set_num_threads(1);
    cddp_ctx_reset(ctx);
    cddp_tensor *x = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(3, 4));
    cddp_tensor *w = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(2, 4));
    cddp_tensor *bias = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(2));
    fill_random(x, &r);
    fill_random(w, &r);
    fill_random(bias, &r);
    const float *y = HOST(cddp_linear(ctx, x, w, bias)), *y0 = HOST(cddp_linear(ctx, x, w, NULL));
    const float *xh = HOST(x), *wh = HOST(w), *bh = HOST(bias);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double s = 0;
            for (int k = 0; k < 4; k++) s += (double)xh[i * 4 + k] * wh[j * 4 + k];
            assert_close(y0[i * 2 + j], s, 1e-5, 1e-6);
            assert_close(y[i * 2 + j], s + bh[j], 1e-5, 1e-6);
        }
}

static void test_broadcasting(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    /* (2,3) + (3): the row is added to each row. */
    float av[] = {1, 2, 3, 4, 5, 6}, bv[] = {10, 20, 30};
    cddp_tensor *a = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), av);
    cddp_tensor *b = vec(3, bv);
    float want_add[] = {11, 22, 33, 14, 25, 36};
    cddp_tensor *s = cddp_add(ctx, a, b);
    assert_int_equal(s->ndim, 2);
    for (int i = 0; i < 6; i++) assert_true(HOST(s)[i] == want_add[i]);
    const float *d = HOST(cddp_sub(ctx, b, a)); /* (3) - (2,3) */
    for (int i = 0; i < 6; i++) assert_true(d[i] == bv[i % 3] - av[i]);
    /* (4,1,3) * (2,1) -> (4,2,3) */
    cddp_rng r;
    cddp_rng_seed(&r, 2);
    cddp_tensor *x = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(4, 1, 3));
    cddp_tensor *y = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(2, 1));
    fill_random(x, &r);
    fill_random(y, &r);
    cddp_tensor *m = cddp_mul(ctx, x, y), *q = cddp_div(ctx, x, y);
    assert_int_equal(m->ndim, 3);
    assert_int_equal(m->shape[0], 4);
    assert_int_equal(m->shape[1], 2);
    assert_int_equal(m->shape[2], 3);
    const float *xh = HOST(x), *yh = HOST(y), *mh = HOST(m), *qh = HOST(q);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) {
                float xv = xh[i * 3 + k], yv = yh[j];
                assert_true(mh[(i * 2 + j) * 3 + k] == xv * yv);
                assert_true(qh[(i * 2 + j) * 3 + k] == xv / yv);
            }
    const float *sc = HOST(cddp_scale(ctx, a, -2.0f));
    for (int i = 0; i < 6; i++) assert_true(sc[i] == -2.0f * av[i]);
}

static void test_activations(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    float v[] = {-2.0f, -1.0f, 0.0f, 0.5f, 1.0f, 3.0f};
    cddp_tensor *x = vec(6, v);
    const float *r = HOST(cddp_relu(ctx, x)), *g = HOST(cddp_gelu(ctx, x)),
                *t = HOST(cddp_tanh(ctx, x)), *s = HOST(cddp_sigmoid(ctx, x));
    /* GELU reference values: x * Phi(x) from the normal CDF. */
    double gelu_ref[] = {-0.04550026389635842, -0.15865525393145707, 0.0,
                         0.34573123063700656,  0.8413447460685429,   2.9959502669189897};
    for (int i = 0; i < 6; i++) {
        assert_true(r[i] == (v[i] > 0 ? v[i] : 0.0f));
        assert_close(g[i], gelu_ref[i], 1e-6, 1e-7);
        assert_close(t[i], tanh(v[i]), 1e-6, 1e-7);
        assert_close(s[i], 1.0 / (1.0 + exp(-v[i])), 1e-6, 1e-7);
    }
}

static void test_softmax_is_stable(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    float v[] = {1000, 1001, 1002, -1000, -1001, -1002};
    cddp_tensor *x = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), v);
    const float *p = HOST(cddp_softmax(ctx, x)), *lp = HOST(cddp_log_softmax(ctx, x));
    double want[] = {0.09003057317038046, 0.24472847105479764, 0.6652409557748219};
    for (int i = 0; i < 3; i++) {
        assert_close(p[i], want[i], 1e-6, 0);
        assert_close(p[3 + i], want[2 - i], 1e-6, 0);
        assert_close(lp[i], log(want[i]), 1e-6, 0);
        assert_true(isfinite(lp[3 + i]));
    }
}

static void test_losses(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    float lv[] = {1, 2, 3, 1, 2, 3};
    int64_t yv[] = {2, 0};
    cddp_tensor *logits = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), lv);
    cddp_tensor *labels = cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(2), yv);
    double l0 = -log(0.6652409557748219), l1 = -log(0.09003057317038046);
    assert_close(cddp_get(cddp_cross_entropy(ctx, logits, labels, CDDP_REDUCE_SUM), 0), l0 + l1,
                 1e-6, 0);
    assert_close(cddp_get(cddp_cross_entropy(ctx, logits, labels, CDDP_REDUCE_MEAN), 0),
                 (l0 + l1) / 2, 1e-6, 0);
    int32_t y32[] = {2, 0};
    cddp_tensor *labels32 = cddp_from_data(ctx, CDDP_I32, CDDP_SHAPE(2), y32);
    assert_close(cddp_get(cddp_cross_entropy(ctx, logits, labels32, CDDP_REDUCE_SUM), 0), l0 + l1,
                 1e-6, 0);
    float pv[] = {1, 2, 3}, tv[] = {1, 1, 1};
    cddp_tensor *p = vec(3, pv), *t = vec(3, tv);
    assert_close(cddp_get(cddp_mse_loss(ctx, p, t, CDDP_REDUCE_SUM), 0), 5.0, 1e-7, 0);
    assert_close(cddp_get(cddp_mse_loss(ctx, p, t, CDDP_REDUCE_MEAN), 0), 5.0 / 3, 1e-6, 0);
    assert_close(cddp_get(cddp_sum(ctx, logits), 0), 12.0, 1e-7, 0);
    assert_close(cddp_get(cddp_mean(ctx, logits), 0), 2.0, 1e-7, 0);
}

static void test_bad_label_fails_the_step(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    float lv[] = {1, 2, 3, 1, 2, 3};
    int64_t yv[] = {2, 10};
    cddp_tensor *logits = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), lv);
    cddp_tensor *labels = cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(2), yv);
    /* On the CPU the op itself returns NULL; a device that runs it later reports the failure when
     * the step's status is asked for (which waits for it). */
    cddp_tensor *loss = cddp_cross_entropy(ctx, logits, labels, CDDP_REDUCE_MEAN);
    if (test_device_in_order()) assert_null(loss);
    assert_int_equal(cddp_ctx_status(ctx), CDDP_ERANGE);
    assert_non_null(strstr(cddp_ctx_error(ctx), "label 10 of sample 1"));
    assert_non_null(strstr(cddp_ctx_error(ctx), "3 classes"));
    /* The failure latches: later ops return NULL, backward reports the first error. */
    assert_null(cddp_relu(ctx, logits));
    assert_null(cddp_sum(ctx, NULL));
    assert_int_equal(cddp_backward(ctx, NULL), CDDP_ERANGE);
    int64_t neg[] = {-1, 0};
    cddp_ctx_reset(ctx);
    assert_int_equal(cddp_ctx_status(ctx), CDDP_OK);
    logits = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), lv);
    labels = cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(2), neg);
    loss = cddp_cross_entropy(ctx, logits, labels, CDDP_REDUCE_SUM);
    if (test_device_in_order()) assert_null(loss);
    assert_non_null(strstr(cddp_ctx_error(ctx), "label -1 of sample 0"));
}

static void test_conv2d_matches_direct(void **state) {
    (void)state;
    cddp_rng r;
    cddp_rng_seed(&r, 3);
    int configs[][2] = {{1, 0}, {1, 1}, {2, 1}, {2, 0}, {3, 2}};
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        int stride = configs[c][0], pad = configs[c][1];
        int64_t N = 2, C = 3, H = 7, W = 6, O = 4, K = 3;
        cddp_ctx_reset(ctx);
        cddp_tensor *x = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(N, C, H, W));
        cddp_tensor *w = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(O, C, K, K));
        cddp_tensor *b = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(O));
        fill_random(x, &r);
        fill_random(w, &r);
        fill_random(b, &r);
        cddp_tensor *y = cddp_conv2d(ctx, x, w, b, stride, pad);
        int64_t OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
        assert_int_equal(y->shape[2], OH);
        assert_int_equal(y->shape[3], OW);
        const float *xh = HOST(x), *wh = HOST(w), *bh = HOST(b), *yh = HOST(y);
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        double s = bh[o];
                        for (int64_t ci = 0; ci < C; ci++)
                            for (int64_t kh = 0; kh < K; kh++)
                                for (int64_t kw = 0; kw < K; kw++) {
                                    int64_t ih = oh * stride - pad + kh,
                                            iw = ow * stride - pad + kw;
                                    if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                    s += (double)xh[((n * C + ci) * H + ih) * W + iw] *
                                         wh[((o * C + ci) * K + kh) * K + kw];
                                }
                        assert_close(yh[((n * O + o) * OH + oh) * OW + ow], s, 1e-5, 1e-5);
                    }
    }
}

static void test_max_pool(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)(i + 1);
    cddp_tensor *x = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(1, 1, 4, 4), v);
    cddp_tensor *y = cddp_max_pool2d(ctx, x, 2, 0, 0); /* stride 0 = kernel */
    float want[] = {6, 8, 14, 16};
    assert_int_equal(y->numel, 4);
    for (int i = 0; i < 4; i++) assert_true(HOST(y)[i] == want[i]);
    /* Kernel 3, stride 2, padding 1: windows clipped at the border. */
    y = cddp_max_pool2d(ctx, x, 3, 2, 1);
    float want2[] = {6, 8, 14, 16};
    assert_int_equal(y->shape[2], 2);
    for (int i = 0; i < 4; i++) assert_true(HOST(y)[i] == want2[i]);
    /* NaN propagates. */
    v[5] = NAN;
    x = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(1, 1, 4, 4), v);
    y = cddp_max_pool2d(ctx, x, 2, 2, 0);
    assert_true(isnan(HOST(y)[0]));
    assert_true(HOST(y)[1] == 8);
}

/* 2x2, stride 2 pooling on its vectorised path, against a naive scan: odd sizes (a row and a
 * column in no window), rows longer than a vector, equal values (the first in row-major window
 * order wins) and NaNs (the first NaN wins). Its gradient goes to that element alone, whether
 * the input's gradient is fresh (written) or already holds a use's (added). The same for ReLU. */
enum { POOL_MAX = 2 * 3 * 7 * 37 };

static void check_max_pool_2x2_and_relu(int64_t H, int64_t W) {
    cddp_ctx_reset(ctx);
    const int64_t N = 2, C = 3, OH = H / 2, OW = W / 2;
    const int64_t xshape[] = {N, C, H, W}, yshape[] = {N, C, OH, OW};
    assert_true(N * C * H * W <= POOL_MAX);
    cddp_rng *r = cddp_ctx_rng(ctx);
    static float xv[POOL_MAX], wv[POOL_MAX], want[POOL_MAX];
    static int64_t at[POOL_MAX];
    for (int64_t i = 0; i < N * C * H * W; i++) { /* 5 levels: many ties */
        xv[i] = (float)(cddp_rng_uniform(r) < 0.5 ? 1 : (int)(cddp_rng_uniform(r) * 5));
        if (cddp_rng_uniform(r) < 0.02) xv[i] = NAN;
    }
    for (int64_t i = 0; i < N * C * OH * OW; i++) wv[i] = cddp_rng_uniform(r) * 2 - 1;
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t o = (nc * OH + oh) * OW + ow, best = -1;
                for (int k = 0; k < 4; k++) {
                    int64_t i = (nc * H + 2 * oh + k / 2) * W + 2 * ow + k % 2;
                    if (best < 0 || (!isnan(xv[best]) && (xv[i] > xv[best] || isnan(xv[i]))))
                        best = i;
                }
                at[o] = best;
                want[o] = xv[best];
            }
    for (int uses = 1; uses <= 2; uses++) {
        cddp_ctx_reset(ctx);
        cddp_tensor *xg = cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, 4, xshape, xv));
        cddp_tensor *w = cddp_from_data(ctx, CDDP_F32, 4, yshape, wv);
        cddp_tensor *y = cddp_max_pool2d(ctx, xg, 2, 2, 0);
        const float *yh = HOST(y);
        for (int64_t o = 0; o < y->numel; o++) {
            if (isnan(want[o]))
                assert_true(isnan(yh[o]));
            else
                assert_true(yh[o] == want[o]);
        }
        cddp_tensor *loss = cddp_sum(ctx, cddp_mul(ctx, y, w));
        if (uses == 2) /* a second use: its gradient is added to the first's */
            loss = cddp_add(ctx, loss,
                            cddp_sum(ctx, cddp_mul(ctx, cddp_max_pool2d(ctx, xg, 2, 2, 0), w)));
        assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
        static float dx[POOL_MAX];
        memset(dx, 0, sizeof dx);
        for (int64_t o = 0; o < y->numel; o++) dx[at[o]] += (float)uses * wv[o];
        const float *dxg = HOST_GRAD(xg);
        for (int64_t i = 0; i < xg->numel; i++) assert_true(dxg[i] == dx[i]);
        /* ReLU: dy where the output is positive, else 0, written or added the same way */
        cddp_ctx_reset(ctx);
        cddp_tensor *z =
            cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, 1, (int64_t[]){W}, wv));
        cddp_tensor *g = cddp_from_data(ctx, CDDP_F32, 1, (int64_t[]){W}, xv);
        loss = cddp_sum(ctx, cddp_mul(ctx, cddp_relu(ctx, z), g));
        if (uses == 2)
            loss = cddp_add(ctx, loss, cddp_sum(ctx, cddp_mul(ctx, cddp_relu(ctx, z), g)));
        assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
        const float *dz = HOST_GRAD(z);
        for (int64_t i = 0; i < W; i++) {
            float d = wv[i] > 0 ? (float)uses * xv[i] : 0.0f;
            if (isnan(d))
                assert_true(isnan(dz[i]));
            else
                assert_true(dz[i] == d);
        }
    }
}

static void test_max_pool_2x2_and_relu_gradients(void **state) {
    (void)state;
    /* rows of 18 outputs (blocks of 8, the last overlapping), 8 (one block), 5 (blocks of 4),
     * 2 (one at a time); odd and even sizes */
    check_max_pool_2x2_and_relu(7, 37);
    check_max_pool_2x2_and_relu(6, 16);
    check_max_pool_2x2_and_relu(7, 11);
    check_max_pool_2x2_and_relu(4, 5);
}

/* cddp_relu_max_pool2d is cddp_max_pool2d(cddp_relu(x)) bit for bit, values and gradients
 * (fresh and added), on the 2x2 path and the general loop, with ties, NaNs and odd sizes; only
 * where windows overlap and x has a second use are its gradient's terms added in another order. */
static void check_relu_max_pool(int64_t H, int64_t W, int kernel, int stride, int padding) {
    const int64_t shape[] = {2, 3, H, W}, n = 2 * 3 * H * W;
    static float xv[POOL_MAX], gv[POOL_MAX], y0[POOL_MAX], dx0[POOL_MAX];
    assert_true(n <= POOL_MAX);
    cddp_ctx_reset(ctx);
    cddp_rng *r = cddp_ctx_rng(ctx);
    for (int64_t i = 0; i < n; i++) {
        xv[i] = (float)((int)(cddp_rng_uniform(r) * 7) - 3); /* -3..3: ties, zeros, negatives */
        if (cddp_rng_uniform(r) < 0.03) xv[i] = NAN;
        gv[i] = cddp_rng_uniform(r) * 2 - 1;
    }
    for (int uses = 1; uses <= 2; uses++)
        for (int fused = 0; fused <= 1; fused++) {
            cddp_ctx_reset(ctx);
            cddp_tensor *x = cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, 4, shape, xv));
            cddp_tensor *y = NULL, *loss = NULL;
            for (int u = 0; u < uses; u++) {
                y = fused ? cddp_relu_max_pool2d(ctx, x, kernel, stride, padding)
                          : cddp_max_pool2d(ctx, cddp_relu(ctx, x), kernel, stride, padding);
                cddp_tensor *g = cddp_from_data(ctx, CDDP_F32, 4, y->shape, gv);
                cddp_tensor *l = cddp_sum(ctx, cddp_mul(ctx, y, g));
                loss = loss ? cddp_add(ctx, loss, l) : l;
            }
            assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
            const float *yh = HOST(y), *dx = HOST_GRAD(x);
            for (int64_t i = 0; i < y->numel; i++) {
                if (!fused) y0[i] = yh[i];
                assert_memory_equal(&y0[i], &yh[i], sizeof(float));
                assert_false(isnan(y0[i]));
            }
            for (int64_t i = 0; i < n; i++) {
                if (!fused) dx0[i] = dx[i];
                if (uses == 2 && stride < kernel) /* overlapping windows, added in another order */
                    assert_close(dx[i], dx0[i], 1e-6, 1e-7);
                else
                    assert_memory_equal(&dx0[i], &dx[i], sizeof(float));
            }
        }
}

static void test_relu_max_pool(void **state) {
    (void)state;
    check_relu_max_pool(7, 37, 2, 2, 0);
    check_relu_max_pool(6, 11, 2, 2, 0);
    check_relu_max_pool(7, 9, 3, 2, 1);
    check_relu_max_pool(5, 6, 2, 1, 0);
}

/* cddp_conv2d_relu_max_pool2d is cddp_relu_max_pool2d(cddp_conv2d_groups(...)) bit for bit,
 * values and the gradients of x, w and b, fresh and added (x used twice), in training and in
 * evaluation (oneDNN's layouts differ: nChw16c, NHWC); integer inputs, so that the convolution's
 * outputs tie and hit 0. The cases: few input channels (cddp's own weights' gradient, read from
 * the blocked layout), 16 -> 32 (oneDNN's), output channels not a multiple of the block (padding
 * lanes), odd sizes (a last row or column in no window), groups, stride 2, no bias, and pooling
 * that is not 2x2 (the two ops). */
typedef struct fused_case {
    int64_t N, C, H, W, O;
    int kernel, stride, pad, groups;
    bool bias;
    int pool, pool_stride;
} fused_case;

static float *fused_data(int64_t n, int lo, int hi) {
    float *v = malloc((size_t)n * sizeof(float));
    assert_non_null(v);
    cddp_rng *r = cddp_ctx_rng(ctx);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(lo + (int)(cddp_rng_uniform(r) * (float)(hi - lo + 1)));
    return v;
}

static void check_conv_relu_pool(const fused_case *k) {
    int64_t xn = k->N * k->C * k->H * k->W, wn = k->O * (k->C / k->groups) * k->kernel * k->kernel;
    int64_t xs[4] = {k->N, k->C, k->H, k->W},
            ws[4] = {k->O, k->C / k->groups, k->kernel, k->kernel};
    cddp_rng_seed(cddp_ctx_rng(ctx), 11);
    float *xv = fused_data(xn, -2, 2), *wv = fused_data(wn, -1, 1), *bv = fused_data(k->O, -2, 1);
    float *y0 = NULL, *g[3] = {NULL, NULL, NULL};
    int64_t yn = 0;
    for (int train = 0; train <= 1; train++)
        for (int fused = 0; fused <= 1; fused++) {
            cddp_ctx_reset(ctx);
            cddp_rng_seed(cddp_ctx_rng(ctx), 5); /* the same weights r in every run */
            cddp_tensor *x = cddp_from_data(ctx, CDDP_F32, 4, xs, xv);
            cddp_tensor *w = cddp_from_data(ctx, CDDP_F32, 4, ws, wv);
            cddp_tensor *b = k->bias ? cddp_from_data(ctx, CDDP_F32, 1, &k->O, bv) : NULL;
            if (train) {
                cddp_requires_grad(ctx, x);
                cddp_requires_grad(ctx, w);
                if (b) cddp_requires_grad(ctx, b);
            }
            cddp_tensor *loss = NULL, *y = NULL;
            for (int use = 0; use < 2; use++) {
                y = fused ? cddp_conv2d_relu_max_pool2d(ctx, x, w, b, k->stride, k->pad, k->groups,
                                                        k->pool, k->pool_stride, 0)
                          : cddp_relu_max_pool2d(
                                ctx, cddp_conv2d_groups(ctx, x, w, b, k->stride, k->pad, k->groups),
                                k->pool, k->pool_stride, 0);
                assert_non_null(y);
                cddp_tensor *r = cddp_uniform(ctx, 4, y->shape, -1, 1, cddp_ctx_rng(ctx));
                cddp_tensor *l = cddp_sum(ctx, cddp_mul(ctx, y, r));
                loss = loss ? cddp_add(ctx, loss, l) : l;
            }
            const char *want = fused && k->pool == 2 && k->pool_stride == 2
                                   ? "conv2d_relu_max_pool2d"
                                   : "relu_max_pool2d";
            if (train)
                assert_string_equal(cddp_node_op(cddp_node_prev(
                                        cddp_node_prev(cddp_node_prev(cddp_ctx_tape(ctx))))),
                                    want);
            if (!y0) {
                yn = y->numel;
                y0 = malloc((size_t)yn * sizeof(float));
                assert_non_null(y0);
                memcpy(y0, HOST(y), (size_t)yn * sizeof(float));
            }
            assert_int_equal(y->numel, yn);
            assert_memory_equal(y0, HOST(y), (size_t)yn * sizeof(float));
            if (!train) continue;
            assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
            cddp_tensor *t[3] = {x, w, b};
            for (int i = 0; i < (b ? 3 : 2); i++) {
                size_t bytes = (size_t)t[i]->numel * sizeof(float);
                if (!fused) {
                    g[i] = malloc(bytes);
                    assert_non_null(g[i]);
                    memcpy(g[i], HOST_GRAD(t[i]), bytes);
                } else {
                    assert_memory_equal(g[i], HOST_GRAD(t[i]), bytes);
                }
            }
        }
    for (int i = 0; i < 3; i++) free(g[i]);
    free(y0);
    free(xv);
    free(wv);
    free(bv);
}

static void test_conv_relu_max_pool(void **state) {
    (void)state;
    const fused_case cases[] = {
        {4, 1, 28, 28, 16, 3, 1, 1, 1, true, 2, 2},  /* the example CNN's first layer */
        {4, 16, 14, 14, 32, 3, 1, 1, 1, true, 2, 2}, /* and its second */
        {2, 3, 9, 11, 20, 3, 1, 1, 1, true, 2, 2},   /* padding lanes, odd sizes */
        {2, 8, 10, 7, 24, 3, 2, 1, 1, false, 2, 2},  /* stride 2, no bias */
        {3, 4, 8, 8, 8, 3, 1, 0, 2, true, 2, 0},     /* groups; pool stride 0: the kernel */
        {2, 16, 9, 9, 16, 1, 1, 0, 1, true, 2, 2},   /* a 1x1 convolution, odd output */
        {2, 2, 9, 9, 16, 3, 1, 1, 1, true, 3, 2},    /* 3x3 pooling: the two ops */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_conv_relu_pool(&cases[i]);
}

/* ---- the channel-blocked layout (tensor.h's "Layouts") ----------------------------------- */

/* Integer values in [lo, hi]: sums of their products are exact in float, whatever their order. */
static cddp_tensor *int_tensor(int ndim, const int64_t *shape, int lo, int hi) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *v = fused_data(n, lo, hi);
    cddp_tensor *t = cddp_from_data(ctx, CDDP_F32, ndim, shape, v);
    free(v);
    return t;
}

/* The layout itself: element (n, c, h, w) at ((n C/B + c/B) H + h) W B + w B + c % B; cddp_get
 * reads in row-major order; to_nchw undoes to_blocked; channels that are not whole blocks stay
 * row-major. */
static void test_blocked_layout(void **state) {
    (void)state;
    int64_t B = cddp_blocked_size();
    assert_true(B == 8 || B == 16); /* oneDNN blocks its convolutions on every x86-64 it runs */
    cddp_ctx_reset(ctx);
    int64_t N = 2, C = 2 * B, H = 3, W = 5;
    float iota[2 * 2 * 16 * 3 * 5];
    for (int64_t i = 0; i < N * C * H * W; i++) iota[i] = (float)i;
    cddp_tensor *x = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(N, C, H, W), iota);
    cddp_tensor *xb = cddp_to_blocked(ctx, x);
    assert_int_equal(xb->block, B);
    assert_int_equal(xb->numel, x->numel);
    const float *xbh = HOST(xb);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++)
                    assert_true(xbh[(((n * (C / B) + c / B) * H + h) * W + w) * B + c % B] ==
                                (float)(((n * C + c) * H + h) * W + w));
    for (int64_t i = 0; i < x->numel; i++) assert_true(cddp_get(xb, i) == (double)i);
    assert_ptr_equal(cddp_to_blocked(ctx, xb), xb);
    cddp_tensor *back = cddp_to_nchw(ctx, xb);
    assert_int_equal(back->block, 0);
    assert_memory_equal(HOST(back), iota, (size_t)x->numel * sizeof(float));
    assert_ptr_equal(cddp_to_nchw(ctx, x), x);
    cddp_tensor *odd = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(1, B + 1, 2, 2));
    assert_ptr_equal(cddp_to_blocked(ctx, odd), odd);
    setenv("CDDP_BLOCKED", "0", 1);
    assert_int_equal(cddp_blocked_size(), 0);
    assert_ptr_equal(cddp_to_blocked(ctx, x), x);
    unsetenv("CDDP_BLOCKED");
}

/* Runs op on x (and, for two-input ops, y; w and b for a convolution) row-major and then blocked;
 * the outputs, and the gradients of loss = sum(out * r) (r integer), are equal (bit for bit with
 * exact = true, else within 1e-6 relative to the largest), and the blocked output stays blocked. */
typedef enum {
    L_CONV,
    L_CONV_BLOCKED_OUT,
    L_BN_TRAIN,
    L_BN_EVAL,
    L_RELU,
    L_ADD,
    L_SCALE,
    L_POOL,
    L_POOL_2x3,
    L_SUM
} layout_op;

static cddp_tensor *layout_run(layout_op op, cddp_tensor *x, cddp_tensor *y, cddp_tensor **p,
                               const int *conv) {
    switch (op) {
    case L_CONV:
        return cddp_conv2d_groups(ctx, x, p[0], p[1], conv[0], conv[1], conv[2]);
    case L_CONV_BLOCKED_OUT:
        return cddp_conv2d_blocked(ctx, x, p[0], p[1], conv[0], conv[1], conv[2]);
    case L_BN_TRAIN:
    case L_BN_EVAL:
        return cddp_batch_norm(ctx, x, p[0], p[1], p[2], p[3], op == L_BN_TRAIN, 0.1f, 1e-5f);
    case L_RELU:
        return cddp_relu(ctx, x);
    case L_ADD:
        return cddp_add(ctx, x, y);
    case L_SCALE:
        return cddp_scale(ctx, x, -1.5f);
    case L_POOL:
        return cddp_adaptive_avg_pool2d(ctx, x, 1, 1);
    case L_POOL_2x3:
        return cddp_adaptive_avg_pool2d(ctx, x, 2, 3);
    case L_SUM:
        return cddp_sum(ctx, x);
    }
    return NULL;
}

static void check_layouts(layout_op op, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O,
                          const int *conv, bool exact) {
    int64_t B = cddp_blocked_size();
    float *keep[8] = {0};
    int64_t keep_n[8] = {0};
    float rs[4] = {0}, rv[4] = {0}; /* the running statistics after each run */
    for (int blocked = 0; blocked <= 1; blocked++) {
        cddp_ctx_reset(ctx);
        cddp_rng_seed(cddp_ctx_rng(ctx), 21);
        cddp_tensor *x = int_tensor(4, (int64_t[]){N, C, H, W}, -3, 3);
        cddp_tensor *y = int_tensor(4, (int64_t[]){N, C, H, W}, -3, 3);
        cddp_tensor *p[4] = {0};
        if (op == L_CONV || op == L_CONV_BLOCKED_OUT) {
            int64_t K = conv[3];
            p[0] = int_tensor(4, (int64_t[]){O, C / conv[2], K, K}, -2, 2);
            p[1] = conv[4] ? int_tensor(1, &O, -2, 2) : NULL;
        } else if (op == L_BN_TRAIN || op == L_BN_EVAL) {
            p[0] = int_tensor(1, &C, 1, 3);
            p[1] = int_tensor(1, &C, -2, 2);
            p[2] = int_tensor(1, &C, -1, 1); /* running mean */
            p[3] = int_tensor(1, &C, 1, 2);  /* running variance */
        }
        for (int i = 0; i < 2; i++)
            if (p[i]) cddp_requires_grad(ctx, p[i]);
        cddp_requires_grad(ctx, x);
        cddp_requires_grad(ctx, y);
        cddp_tensor *xi = blocked && op != L_CONV_BLOCKED_OUT ? cddp_to_blocked(ctx, x) : x;
        cddp_tensor *yi = blocked ? cddp_to_blocked(ctx, y) : y;
        if (blocked && op != L_CONV_BLOCKED_OUT) assert_int_equal(xi->block, B);
        /* cddp_conv2d_blocked's reference is the row-major convolution */
        cddp_tensor *out =
            layout_run(!blocked && op == L_CONV_BLOCKED_OUT ? L_CONV : op, xi, yi, p, conv);
        bool stays = op != L_POOL && op != L_POOL_2x3 && op != L_SUM;
        assert_int_equal(out->block, blocked && stays ? B : 0);
        cddp_tensor *o = cddp_to_nchw(ctx, out);
        cddp_tensor *r = int_tensor(o->ndim, o->shape, -2, 2);
        assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, cddp_mul(ctx, o, r))), CDDP_OK);
        const float *got[8] = {HOST(o), HOST_GRAD(x), HOST_GRAD(y)};
        int64_t n[8] = {o->numel, x->numel, y->numel};
        for (int i = 0; i < 4; i++)
            if (p[i] && p[i]->grad) got[3 + i] = HOST_GRAD(p[i]), n[3 + i] = p[i]->numel;
        for (int i = 0; i < 8; i++) {
            if (!got[i]) continue;
            if (!blocked) {
                keep[i] = malloc((size_t)n[i] * sizeof(float));
                memcpy(keep[i], got[i], (size_t)n[i] * sizeof(float));
                keep_n[i] = n[i];
                continue;
            }
            assert_non_null(keep[i]);
            assert_int_equal(keep_n[i], n[i]);
            float big = 0.0f;
            for (int64_t k = 0; k < n[i]; k++) big = fmaxf(big, fabsf(keep[i][k]));
            for (int64_t k = 0; k < n[i]; k++) {
                if (exact)
                    assert_true(got[i][k] == keep[i][k]);
                else
                    assert_close(got[i][k], keep[i][k], 0, 1e-6 * big + 1e-7);
            }
        }
        if (op == L_BN_TRAIN)
            for (int64_t c = 0; c < C && c < 4; c++) {
                if (!blocked) {
                    rs[c] = HOST(p[2])[c];
                    rv[c] = HOST(p[3])[c];
                } else {
                    assert_close(HOST(p[2])[c], rs[c], 1e-6, 1e-7);
                    assert_close(HOST(p[3])[c], rv[c], 1e-6, 1e-7);
                }
            }
    }
    for (int i = 0; i < 8; i++) free(keep[i]);
}

/* Every op that takes a blocked tensor gives the row-major op's values and gradients. */
static void test_blocked_ops_match_plain(void **state) {
    (void)state;
    int64_t B = cddp_blocked_size();
    /* stride, padding, groups, kernel, bias */
    const int convs[][5] = {{1, 1, 1, 3, 0}, {2, 1, 1, 3, 1}, {2, 0, 1, 1, 0},
                            {1, 0, 2, 3, 1}, {1, 1, 2, 1, 0}, {2, 1, 2, 3, 0}};
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        int64_t G = convs[i][2];
        check_layouts(L_CONV, 2, B * G, 9, 7, 2 * B, convs[i], true);
        check_layouts(L_CONV_BLOCKED_OUT, 2, B * G, 9, 7, 2 * B, convs[i], true);
    }
    const int stem[5] = {1, 1, 1, 3, 0}; /* the ResNet's stem: one input channel, out blocked */
    check_layouts(L_CONV_BLOCKED_OUT, 3, 1, 8, 8, B, stem, true);
    check_layouts(L_BN_TRAIN, 3, 2 * B, 5, 4, 0, NULL, false);
    check_layouts(L_BN_EVAL, 3, 2 * B, 5, 4, 0, NULL, false);
    check_layouts(L_RELU, 2, B, 3, 3, 0, NULL, true);
    check_layouts(L_ADD, 2, 2 * B, 3, 5, 0, NULL, true);
    check_layouts(L_SCALE, 2, B, 4, 3, 0, NULL, true);
    check_layouts(L_POOL, 3, 2 * B, 7, 7, 0, NULL, true);
    check_layouts(L_POOL_2x3, 2, B, 5, 7, 0, NULL, true);
    check_layouts(L_SUM, 2, B, 3, 4, 0, NULL, true);
}

/* An op that reads tensors row-major aborts when given a blocked one, naming cddp_to_nchw, and so
 * does a blocked tensor with a row-major one: never numbers read in the wrong order. */
static void refused(void *arg) {
    int which = *(int *)arg;
    cddp_ctx_reset(ctx);
    cddp_tensor *x = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(2, cddp_blocked_size(), 4, 4));
    cddp_tensor *xb = cddp_to_blocked(ctx, x);
    switch (which) {
    case 0:
        cddp_max_pool2d(ctx, xb, 2, 2, 0);
        break;
    case 1:
        cddp_flatten(ctx, xb);
        break;
    case 2:
        cddp_add(ctx, xb, x);
        break;
    case 3:
        cddp_layer_norm(ctx, xb, NULL, NULL, 1e-5f);
        break;
    }
}

static void expect_abort(int which) {
    char msg[1024];
    int status = run_in_child(refused, &which, msg, sizeof msg);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    if (!strstr(msg, "cddp_to_nchw")) fail_msg("case %d said: %s", which, msg);
}

static void test_blocked_refused_where_not_taken(void **state) {
    (void)state;
    for (int which = 0; which < 4; which++) expect_abort(which);
}

/* cddp_batch_norm_relu is cddp_relu(cddp_batch_norm(...)) bit for bit, and
 * cddp_batch_norm_add_relu(x, res) cddp_relu(cddp_add(cddp_batch_norm(x), res)): values, the
 * running statistics, and the gradients of x, weight, bias and the residual, in training and in
 * evaluation, row-major (2-D and 4-D) and blocked, with x's gradient fresh (stored) and with x
 * used again after it (added). residual: 0 none, 1 a tensor of its own, 2 x itself. */
static void check_bn_relu(int ndim, const int64_t *shape, bool blocked, bool train, bool reuse,
                          int residual) {
    int64_t C = shape[1], yn = 0;
    float *keep[6] = {0};
    for (int fused = 0; fused <= 1; fused++) {
        cddp_ctx_reset(ctx);
        cddp_rng_seed(cddp_ctx_rng(ctx), 31);
        cddp_rng *r = cddp_ctx_rng(ctx);
        cddp_tensor *x = cddp_requires_grad(ctx, cddp_uniform(ctx, ndim, shape, -2, 2, r));
        cddp_tensor *w = cddp_requires_grad(ctx, cddp_uniform(ctx, 1, &C, 0.5f, 1.5f, r));
        cddp_tensor *b = cddp_requires_grad(ctx, cddp_uniform(ctx, 1, &C, -1, 1, r));
        cddp_tensor *rm = cddp_uniform(ctx, 1, &C, -0.5f, 0.5f, r);
        cddp_tensor *rv = cddp_uniform(ctx, 1, &C, 0.5f, 1.5f, r);
        cddp_tensor *res = cddp_requires_grad(ctx, cddp_uniform(ctx, ndim, shape, -1, 1, r));
        cddp_tensor *xi = blocked ? cddp_to_blocked(ctx, x) : x;
        cddp_tensor *ri = residual == 2 ? xi : blocked ? cddp_to_blocked(ctx, res) : res;
        assert_int_equal(xi->block, blocked ? cddp_blocked_size() : 0);
        cddp_tensor *y;
        if (fused && residual)
            y = cddp_batch_norm_add_relu(ctx, xi, ri, w, b, rm, rv, train, 0.1f, 1e-5f);
        else if (fused)
            y = cddp_batch_norm_relu(ctx, xi, w, b, rm, rv, train, 0.1f, 1e-5f);
        else {
            y = cddp_batch_norm(ctx, xi, w, b, rm, rv, train, 0.1f, 1e-5f);
            y = cddp_relu(ctx, residual ? cddp_add(ctx, y, ri) : y);
        }
        assert_int_equal(y->block, xi->block);
        assert_string_equal(cddp_node_op(cddp_ctx_tape(ctx)), !fused     ? "relu"
                                                              : residual ? "batch_norm_add_relu"
                                                                         : "batch_norm_relu");
        cddp_tensor *yp = cddp_to_nchw(ctx, y);
        cddp_tensor *loss =
            cddp_sum(ctx, cddp_mul(ctx, yp, cddp_uniform(ctx, ndim, shape, -1, 1, r)));
        if (reuse) /* recorded after: its backward runs first, so x's gradient is added to */
            loss = cddp_add(ctx, loss, cddp_sum(ctx, cddp_scale(ctx, xi, 0.5f)));
        assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
        const float *got[6] = {HOST(yp),     HOST_GRAD(x), HOST_GRAD(w),
                               HOST_GRAD(b), HOST(rv),     HOST_GRAD(res)};
        yn = yp->numel;
        int64_t n[6] = {yp->numel, x->numel, C, C, C, x->numel};
        for (int i = 0; i < 6; i++) {
            if (i == 5 && residual != 1) { /* only a residual of its own has a gradient */
                assert_null(got[i]);
                continue;
            }
            assert_non_null(got[i]);
            size_t bytes = (size_t)n[i] * sizeof(float);
            if (!fused) {
                keep[i] = malloc(bytes);
                memcpy(keep[i], got[i], bytes);
            } else {
                assert_memory_equal(keep[i], got[i], bytes);
            }
        }
    }
    bool some_zero = false, some_positive = false; /* the ReLU did cut */
    for (int64_t i = 0; i < yn; i++) {
        some_zero |= keep[0][i] == 0.0f;
        some_positive |= keep[0][i] > 0.0f;
    }
    assert_true(some_zero && some_positive);
    for (int i = 0; i < 6; i++) free(keep[i]);
}

static void test_batch_norm_relu_is_the_two_ops(void **state) {
    (void)state;
    int64_t B = cddp_blocked_size();
    for (int train = 0; train <= 1; train++)
        for (int reuse = 0; reuse <= 1; reuse++) {
            for (int res = 0; res <= 2; res++) {
                check_bn_relu(4, (int64_t[]){3, 5, 4, 3}, false, train, reuse, res);
                check_bn_relu(2, (int64_t[]){6, 7}, false, train, reuse, res);
                check_bn_relu(4, (int64_t[]){2, 2 * B, 5, 3}, true, train, reuse, res);
            }
        }
}

static void test_dropout(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    int64_t n = 100000;
    cddp_tensor *x = cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(n));
    assert_ptr_equal(cddp_dropout(ctx, x, 0.3f, false), x); /* evaluation: identity */
    assert_ptr_equal(cddp_dropout(ctx, x, 0.0f, true), x);
    cddp_rng_seed(cddp_ctx_rng(ctx), 5);
    cddp_tensor *y = cddp_dropout(ctx, x, 0.3f, true);
    const float *yh = HOST(y);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = yh[i];
        if (v == 0.0f)
            zeros++;
        else
            assert_close(v, 1.0 / 0.7, 1e-6, 0);
    }
    assert_close((double)zeros / (double)n, 0.3, 0, 0.01);
    cddp_rng_seed(cddp_ctx_rng(ctx), 5); /* the same seed, the same mask */
    cddp_tensor *y2 = cddp_dropout(ctx, x, 0.3f, true);
    assert_memory_equal(yh, HOST(y2), (size_t)n * sizeof(float));
    const float *all = HOST(cddp_dropout(ctx, x, 1.0f, true));
    for (int64_t i = 0; i < 10; i++) assert_true(all[i] == 0.0f);
}

static void test_argmax_and_accuracy(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    float lv[] = {0.1f, 0.9f, 0.0f, 5, 5, 1, -1, -2, -0.5f};
    int64_t yv[] = {1, 1, 2};
    cddp_tensor *logits = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(3, 3), lv);
    cddp_tensor *labels = cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(3), yv);
    cddp_tensor *am = cddp_argmax(ctx, logits);
    assert_int_equal(am->dtype, CDDP_I64);
    assert_int_equal(am->numel, 3);
    assert_true(cddp_get(am, 0) == 1 && cddp_get(am, 1) == 0 && cddp_get(am, 2) == 2);
    assert_int_equal(cddp_count_correct(logits, labels), 2); /* the tie picks index 0 */
    assert_close(cddp_accuracy(logits, labels), 2.0 / 3.0, 1e-12, 0);
}

static void test_views(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    cddp_tensor *x = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(2, 3, 4));
    cddp_tensor *v = cddp_reshape(ctx, x, CDDP_SHAPE(-1, 4));
    assert_int_equal(v->shape[0], 6);
    assert_ptr_equal(v->data, x->data);
    cddp_tensor *f = cddp_flatten(ctx, x);
    assert_int_equal(f->ndim, 2);
    assert_int_equal(f->shape[1], 12);
    set_f32(f, 5, 3.0f);
    assert_true(HOST(x)[5] == 3.0f);
}

/* Attention with a key/value cache, fed a sequence in pieces (a prompt of 4 positions, then 1,
 * then the other 6), gives every position the output the whole sequence's attention gives it. */
static void test_attention_cached(void **state) {
    (void)state;
    enum { B = 2, T = 11, NH = 2, C = 8 };
    static float qkv[B][T][3 * C];
    cddp_rng rng;
    cddp_rng_seed(&rng, 5);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < 3 * C; c++) qkv[b][t][c] = 2 * cddp_rng_uniform(&rng) - 1;
    cddp_ctx_reset(ctx);
    bool grad = cddp_ctx_set_grad_enabled(ctx, false);
    cddp_tensor *full =
        cddp_attention(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(B, T, 3 * C), qkv), NH);
    cddp_tensor *cache = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(B, T, 2 * C));
    const int pieces[][2] = {{0, 4}, {4, 5}, {5, 11}};
    for (int i = 0; i < 3; i++) {
        int from = pieces[i][0], n = pieces[i][1] - from;
        float flat[B * T * 3 * C]; /* (B, n, 3C): positions from..from+n-1 */
        for (int b = 0; b < B; b++)
            memcpy(flat + b * n * 3 * C, qkv[b][from], sizeof(float) * n * 3 * C);
        cddp_tensor *out = cddp_attention_cached(
            ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(B, n, 3 * C), flat), NH, cache, from);
        assert_non_null(out);
        assert_int_equal(out->shape[1], n);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++)
                for (int c = 0; c < C; c++)
                    assert_float_equal(cddp_get(out, (b * n + t) * C + c),
                                       cddp_get(full, (b * T + from + t) * C + c), 1e-6);
    }
    assert_false(cddp_ctx_failed(ctx));
    cddp_ctx_set_grad_enabled(ctx, grad);
}

static void test_no_grad_records_nothing(void **state) {
    (void)state;
    cddp_ctx_reset(ctx);
    cddp_tensor *w = cddp_requires_grad(ctx, cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(3)));
    bool old = cddp_ctx_set_grad_enabled(ctx, false);
    assert_true(old);
    cddp_tensor *y = cddp_sum(ctx, cddp_relu(ctx, w));
    assert_false(y->requires_grad);
    assert_null(y->node);
    assert_int_equal(cddp_backward(ctx, y), CDDP_ESTATE);
    assert_non_null(strstr(cddp_ctx_error(ctx), "gradients disabled"));
    cddp_ctx_set_grad_enabled(ctx, true);
    cddp_ctx_reset(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_creation),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_matmul_and_linear),
        cmocka_unit_test(test_broadcasting),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softmax_is_stable),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_bad_label_fails_the_step),
        cmocka_unit_test(test_conv2d_matches_direct),
        cmocka_unit_test(test_max_pool),
        cmocka_unit_test(test_max_pool_2x2_and_relu_gradients),
        cmocka_unit_test(test_relu_max_pool),
        cmocka_unit_test(test_conv_relu_max_pool),
        cmocka_unit_test(test_blocked_layout),
        cmocka_unit_test(test_blocked_ops_match_plain),
        cmocka_unit_test(test_blocked_refused_where_not_taken),
        cmocka_unit_test(test_batch_norm_relu_is_the_two_ops),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_argmax_and_accuracy),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_no_grad_records_nothing),
        cmocka_unit_test(test_attention_cached),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
