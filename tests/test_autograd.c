/* test_autograd.c: backward's bookkeeping and the gradient-ready hooks DDP builds on, on the test
 * device (helpers.h). */
#include "helpers.h"

#define MAXP 8

typedef struct hook_log {
    int order[64];
    int n;
    int count[MAXP];
    float snapshot[MAXP][64]; /* each parameter's gradient at the moment its hook fired */
} hook_log;

static void on_ready(void *user, cddp_tensor *p) {
    hook_log *log = user;
    log->order[log->n++] = p->param_index;
    log->count[p->param_index]++;
    /* on a device that queues its work, the hook comes when the last kernel that adds to the
     * gradient was queued: reading it waits for that kernel */
    memcpy(log->snapshot[p->param_index], HOST_GRAD(p), sizeof(float) * (size_t)p->numel);
}

static cddp_model *mlp(void) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "fc1", cddp_nn_linear(4, 5)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "act", cddp_nn_relu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "fc2", cddp_nn_linear(5, 3)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 1), CDDP_OK);
    return test_model_to(m);
}

static cddp_tensor *mlp_loss(cddp_ctx *ctx, cddp_model *m) {
    static float x[2 * 4] = {0.5f, -1, 2, 0.1f, 1, 1, -0.3f, 0.7f};
    static int64_t y[2] = {2, 0};
    cddp_tensor *in = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 4), x);
    cddp_tensor *labels = cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(2), y);
    return cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, in), labels, CDDP_REDUCE_MEAN);
}

/* Hooks fire once each, in reverse order of use, with the final gradient in place. */
static void test_hooks_order_and_once(void **state) {
    (void)state;
    cddp_model *m = mlp();
    cddp_ctx *ctx = test_ctx(0);
    hook_log log = {0};
    cddp_model_set_ready_hook(m, on_ready, &log);
    assert_int_equal(cddp_backward(ctx, mlp_loss(ctx, m)), CDDP_OK);
    int want[] = {2, 3, 0, 1}; /* fc2.weight, fc2.bias, fc1.weight, fc1.bias */
    assert_int_equal(log.n, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(log.order[i], want[i]);
        assert_int_equal(log.count[i], 1);
        cddp_tensor *p = cddp_model_param(m, i);
        assert_memory_equal(log.snapshot[i], HOST_GRAD(p), sizeof(float) * (size_t)p->numel);
    }
    /* The next step fires each hook exactly once again. */
    cddp_ctx_reset(ctx);
    assert_int_equal(cddp_backward(ctx, mlp_loss(ctx, m)), CDDP_OK);
    assert_int_equal(log.n, 8);
    for (int i = 0; i < 4; i++) assert_int_equal(log.count[i], 2);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* Parameters the loss does not depend on never fire and keep their gradients. */
static void test_unused_parameters_never_fire(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    int a, b, c;
    cddp_init ones = {CDDP_INIT_CONSTANT, 1.0f, 0};
    assert_int_equal(cddp_model_add_param(m, "a", CDDP_SHAPE(3), ones, &a), CDDP_OK);
    assert_int_equal(cddp_model_add_param(m, "b", CDDP_SHAPE(3), ones, &b), CDDP_OK);
    assert_int_equal(cddp_model_add_param(m, "c", CDDP_SHAPE(3), ones, &c), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    test_model_to(m);
    cddp_ctx *ctx = test_ctx(0);
    hook_log log = {0};
    cddp_model_set_ready_hook(m, on_ready, &log);
    set_grad(cddp_model_param(m, b), 0, 42.0f); /* an old gradient that must survive */
    /* b feeds a dead branch (its output is computed, then dropped); c is never touched. */
    cddp_tensor *dead = cddp_tanh(ctx, cddp_model_param(m, b));
    assert_non_null(dead);
    cddp_tensor *loss = cddp_sum(ctx, cddp_scale(ctx, cddp_model_param(m, a), 3.0f));
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    assert_int_equal(log.n, 1);
    assert_int_equal(log.order[0], a);
    assert_int_equal(log.count[b], 0);
    assert_int_equal(log.count[c], 0);
    for (int i = 0; i < 3; i++) assert_true(HOST_GRAD(cddp_model_param(m, a))[i] == 3.0f);
    assert_true(HOST_GRAD(cddp_model_param(m, b))[0] == 42.0f);
    assert_true(HOST_GRAD(cddp_model_param(m, c))[0] == 0.0f);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* A parameter used twice fires once, after its second contribution. */
static void test_parameter_used_twice(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    int w;
    assert_int_equal(
        cddp_model_add_param(m, "w", CDDP_SHAPE(2, 2), (cddp_init){CDDP_INIT_UNIFORM, -1, 1}, &w),
        CDDP_OK);
    assert_int_equal(cddp_model_build(m, 3), CDDP_OK);
    test_model_to(m);
    cddp_ctx *ctx = test_ctx(0);
    hook_log log = {0};
    cddp_model_set_ready_hook(m, on_ready, &log);
    float x1[] = {1, 2, 3, 4}, x2[] = {-1, 0.5f, 2, 1};
    cddp_tensor *p = cddp_model_param(m, w);
    cddp_tensor *t1 =
        cddp_matmul(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 2), x1), p, 0, 0);
    cddp_tensor *t2 =
        cddp_matmul(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 2), x2), p, 0, 0);
    cddp_tensor *loss = cddp_add(ctx, cddp_sum(ctx, t1), cddp_sum(ctx, t2));
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    assert_int_equal(log.count[w], 1);
    /* d/dw sum(x w) = x^T 1: column sums of x1 plus those of x2, for each output column. */
    float want[4] = {1 + 3 - 1 + 2, 1 + 3 - 1 + 2, 2 + 4 + 0.5f + 1, 2 + 4 + 0.5f + 1};
    const float *dp = HOST_GRAD(p);
    for (int i = 0; i < 4; i++) {
        assert_true(dp[i] == want[i]);
        assert_true(log.snapshot[w][i] == want[i]); /* both contributions were in at the hook */
    }
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* Gradients accumulate across backward calls until zeroed explicitly. */
static void test_accumulation_and_zeroing(void **state) {
    (void)state;
    cddp_model *m = mlp();
    cddp_ctx *ctx = test_ctx(0);
    size_t n = cddp_model_numel(m);
    assert_int_equal(cddp_backward(ctx, mlp_loss(ctx, m)), CDDP_OK);
    cddp_device *dev = cddp_model_device(m);
    float *once = malloc(n * sizeof(float));
    memcpy(once, host_f32(dev, cddp_model_grad(m), (int64_t)n), n * sizeof(float));
    cddp_ctx_reset(ctx);
    assert_int_equal(cddp_backward(ctx, mlp_loss(ctx, m)), CDDP_OK);
    const float *twice = host_f32(dev, cddp_model_grad(m), (int64_t)n);
    bool nonzero = false;
    for (size_t i = 0; i < n; i++) {
        assert_close(twice[i], 2.0f * once[i], 1e-6, 1e-9);
        nonzero |= once[i] != 0.0f;
    }
    assert_true(nonzero);
    cddp_model_zero_grad(m);
    const float *zeroed = host_f32(dev, cddp_model_grad(m), (int64_t)n);
    for (size_t i = 0; i < n; i++) assert_true(zeroed[i] == 0.0f);
    free(once);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

static void test_backward_misuse(void **state) {
    (void)state;
    cddp_model *m = mlp();
    cddp_ctx *ctx = test_ctx(0);
    cddp_tensor *loss = mlp_loss(ctx, m);
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    /* A second backward over the same tape would double-count intermediate gradients. */
    assert_int_equal(cddp_backward(ctx, loss), CDDP_ESTATE);
    assert_non_null(strstr(cddp_ctx_error(ctx), "cddp_ctx_reset"));
    cddp_ctx_reset(ctx);
    /* A loss with more than one element. */
    cddp_tensor *v = cddp_relu(ctx, cddp_model_param(m, 0));
    assert_int_equal(cddp_backward(ctx, v), CDDP_EINVAL);
    assert_non_null(strstr(cddp_ctx_error(ctx), "one float32 element"));
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* Gradients reach leaf tensors that ask for them, through views. */
static void test_leaf_gradients_through_views(void **state) {
    (void)state;
    cddp_ctx *ctx = test_ctx(0);
    float v[6] = {1, -2, 3, -4, 5, -6};
    cddp_tensor *x = cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), v));
    cddp_tensor *flat = cddp_reshape(ctx, x, CDDP_SHAPE(6));
    cddp_tensor *loss = cddp_sum(ctx, cddp_mul(ctx, flat, flat)); /* d/dx = 2x */
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    assert_non_null(x->grad);
    for (int i = 0; i < 6; i++) assert_true(HOST_GRAD(x)[i] == 2.0f * v[i]);
    cddp_ctx_destroy(ctx);
}

/* A reshape's backward hands its gradient on as its input's (no copy) where the input has none
 * yet: what other ops add to the input's gradient afterwards lands on it, and a view that keeps
 * its gradient (cddp_retain_grad) keeps it unchanged. h = 2x is read by a product recorded before
 * the view and by the view's square: dL/dh = s + 2h, dL/dx = 2 (s + 4x). */
static void test_view_gradient_handed_on(void **state) {
    (void)state;
    cddp_ctx *ctx = test_ctx(0);
    float v[6] = {1, -2, 3, -4, 5, -6}, sv[6] = {0.5f, 2, -1, 4, -3, 0.25f};
    for (int retain = 0; retain < 2; retain++) {
        for (int before = 0; before < 2; before++) {
            cddp_ctx_reset(ctx);
            cddp_tensor *x =
                cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), v));
            cddp_tensor *s = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), sv);
            cddp_tensor *h = cddp_scale(ctx, x, 2.0f), *other = NULL;
            if (before) other = cddp_sum(ctx, cddp_mul(ctx, h, s));
            cddp_tensor *flat = cddp_reshape(ctx, h, CDDP_SHAPE(6));
            if (retain) cddp_retain_grad(flat);
            cddp_tensor *loss = cddp_sum(ctx, cddp_mul(ctx, flat, flat));
            if (!before) other = cddp_sum(ctx, cddp_mul(ctx, h, s));
            assert_int_equal(cddp_backward(ctx, cddp_add(ctx, loss, other)), CDDP_OK);
            const float *gx = HOST_GRAD(x);
            for (int i = 0; i < 6; i++) assert_true(gx[i] == 2.0f * (sv[i] + 4.0f * v[i]));
            if (retain) { /* the view's own gradient copied, not handed on */
                const float *gf = HOST_GRAD(flat);
                for (int i = 0; i < 6; i++) assert_true(gf[i] == 4.0f * v[i]);
            }
        }
    }
    cddp_ctx_destroy(ctx);
}

/* An op's output's gradient is released once its op's backward ran, and its memory serves the
 * next gradients: a chain of 8 scalings holds about two gradients at a time, not 9. A retained
 * one (cddp_retain_grad) stays readable. */
static void test_intermediate_gradients_released(void **state) {
    (void)state;
    cddp_ctx *ctx = test_ctx(0);
    enum { N = 1 << 18 };
    cddp_tensor *x = cddp_requires_grad(ctx, cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(N)));
    cddp_tensor *h[9] = {x};
    for (int i = 1; i <= 8; i++) h[i] = cddp_scale(ctx, h[i - 1], 0.5f);
    cddp_retain_grad(h[4]);
    cddp_tensor *loss = cddp_sum(ctx, h[8]);
    size_t before = cddp_arena_used(cddp_ctx_arena(ctx));
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    size_t grown = cddp_arena_high_water(cddp_ctx_arena(ctx)) - before;
    for (int i = 1; i <= 8; i++)
        if (i != 4) assert_null(h[i]->grad);
    assert_null(loss->grad);
    const float *g4 = HOST_GRAD(h[4]), *gx = HOST_GRAD(x);
    for (int64_t j = 0; j < N; j++) {
        assert_true(g4[j] == 0.0625f);     /* 0.5^4 */
        assert_true(gx[j] == 0.00390625f); /* 0.5^8 */
    }
    /* the CPU's gradients are in the context's arena (another device's in its own): x's, h[4]'s
     * and the one being released, not eight */
    if (cddp_device_host_accessible(test_device()))
        assert_true(grown < 4 * (size_t)N * sizeof(float));
    cddp_ctx_destroy(ctx);
}

/* A same-shape sum's backward hands its gradient's memory to its first input instead of copying
 * it: a residual chain h + 0.5 h, and x + x (both inputs one tensor), still get their sums. */
static void test_residual_gradients(void **state) {
    (void)state;
    cddp_ctx *ctx = test_ctx(0);
    cddp_tensor *x = cddp_requires_grad(ctx, cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(1000)));
    cddp_tensor *h = x;
    for (int i = 0; i < 3; i++) h = cddp_add(ctx, h, cddp_scale(ctx, h, 0.5f));
    cddp_tensor *xx = cddp_add(ctx, h, h); /* d/dh = 2 */
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, xx)), CDDP_OK);
    const float *g = HOST_GRAD(x);
    for (int j = 0; j < 1000; j++) assert_true(g[j] == 6.75f); /* 2 * 1.5^3 */
    cddp_ctx_destroy(ctx);
}

/* batch_norm_relu's backward masks its output's gradient in place when that gradient is released
 * after it, and leaves a retained one as it was: both give x the same gradient. */
static void test_batch_norm_relu_keeps_retained_gradient(void **state) {
    (void)state;
    float xv[2 * 3 * 4], rv[2 * 3 * 4];
    for (int i = 0; i < 24; i++) xv[i] = (float)((i * 7) % 11) - 5.0f, rv[i] = (float)(i % 5) - 2;
    float *gx[2];
    for (int keep = 0; keep < 2; keep++) {
        cddp_ctx *ctx = test_ctx(0);
        cddp_tensor *x =
            cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3, 2, 2), xv));
        cddp_tensor *y = cddp_batch_norm_relu(ctx, x, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f);
        if (keep) cddp_retain_grad(y);
        cddp_tensor *r = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3, 2, 2), rv);
        assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, cddp_mul(ctx, y, r))), CDDP_OK);
        gx[keep] = malloc(sizeof xv);
        memcpy(gx[keep], HOST_GRAD(x), sizeof xv);
        if (keep) { /* y's gradient is r, not r masked by y > 0 */
            const float *gy = HOST_GRAD(y);
            for (int i = 0; i < 24; i++) assert_true(gy[i] == rv[i]);
        } else {
            assert_null(y->grad);
        }
        cddp_ctx_destroy(ctx);
    }
    assert_memory_equal(gx[0], gx[1], sizeof xv);
    free(gx[0]);
    free(gx[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_order_and_once),
        cmocka_unit_test(test_unused_parameters_never_fire),
        cmocka_unit_test(test_parameter_used_twice),
        cmocka_unit_test(test_accumulation_and_zeroing),
        cmocka_unit_test(test_backward_misuse),
        cmocka_unit_test(test_leaf_gradients_through_views),
        cmocka_unit_test(test_view_gradient_handed_on),
        cmocka_unit_test(test_intermediate_gradients_released),
        cmocka_unit_test(test_residual_gradients),
        cmocka_unit_test(test_batch_norm_relu_keeps_retained_gradient),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    host_release();
    return failed;
}
