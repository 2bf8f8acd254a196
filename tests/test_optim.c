/* test_optim.c: SGD, AdamW and Lion update rules against values derived by hand (one parameter
 * element, a constant gradient), Lion against its paper's rule written out here (every element
 * of a model of two parameters, random gradients, parameter groups), and option validation.
 * PyTorch parity on real models is in test_reference.c. The model and the optimizer's state live
 * on the test device (helpers.h). */
#include "helpers.h"

/* A one-element model whose gradient is set by hand before each step. */
static cddp_model *scalar_model(float init) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(
        cddp_model_add_param(m, "p", CDDP_SHAPE(1), (cddp_init){CDDP_INIT_CONSTANT, init, 0}, NULL),
        CDDP_OK);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    return test_model_to(m);
}

/* Steps n times with gradient g and checks the parameter after each step. */
static void run_steps(cddp_optim *opt, cddp_model *m, float g, const double *want, int n) {
    for (int i = 0; i < n; i++) {
        set_at(cddp_model_device(m), cddp_model_grad(m), 0, g);
        cddp_optim_step(opt);
        assert_close(host_f32(cddp_model_device(m), cddp_model_data(m), 1)[0], want[i], 1e-6, 1e-7);
    }
    assert_int_equal(cddp_optim_steps(opt), n);
}

static void test_sgd_rules(void **state) {
    (void)state;
    cddp_error err = {0};
    struct {
        cddp_sgd_options o;
        float init;
        double want[3];
    } cases[] = {
        /* plain: p -= lr g */
        {{.lr = 0.1f}, 0, {-0.1, -0.2, -0.3}},
        /* momentum 0.9: buf = 1, 1.9, 2.71; p -= 0.1 buf */
        {{.lr = 0.1f, .momentum = 0.9f}, 0, {-0.1, -0.29, -0.561}},
        /* nesterov: g' = g + 0.9 buf = 1.9, 2.71, 3.439 */
        {{.lr = 0.1f, .momentum = 0.9f, .nesterov = true}, 0, {-0.19, -0.461, -0.8049}},
        /* dampening 0.5: buf = 1 (first step undamped), 0.9 + 0.5 = 1.4, 1.26 + 0.5 = 1.76 */
        {{.lr = 0.1f, .momentum = 0.9f, .dampening = 0.5f}, 0, {-0.1, -0.24, -0.416}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cddp_model *m = scalar_model(cases[i].init);
        cddp_optim *opt = cddp_optim_sgd(m, &cases[i].o, &err);
        assert_non_null(opt);
        assert_string_equal(cddp_optim_name(opt), "sgd");
        run_steps(opt, m, 1.0f, cases[i].want, 3);
        cddp_optim_destroy(opt);
        cddp_model_destroy(m);
    }
    /* weight decay with no gradient: p = 1 - 0.1 (0.1 p) = 0.99, then 0.9801, 0.970299 */
    cddp_model *m = scalar_model(1.0f);
    cddp_optim *opt =
        cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.1f, .weight_decay = 0.1f}, &err);
    run_steps(opt, m, 0.0f, (double[]){0.99, 0.9801, 0.970299}, 3);
    assert_int_equal(cddp_optim_num_states(opt), 0);
    cddp_optim_set_lr(opt, 0.5f);
    assert_true(cddp_optim_lr(opt) == 0.5f);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
}

static void test_adamw_rules(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_model *m = scalar_model(1.0f);
    cddp_adamw_options o = cddp_adamw_defaults(0.1f);
    assert_true(o.beta1 == 0.9f && o.beta2 == 0.999f && o.eps == 1e-8f && o.weight_decay == 0.01f);
    cddp_optim *opt = cddp_optim_adamw(m, &o, &err);
    assert_non_null(opt);
    /* With a constant gradient g = 1 the bias-corrected moments are exactly m^ = 1, v^ = 1, so
     * each step is p = p (1 - lr wd) - lr / (1 + eps): 1 * 0.999 - 0.1 = 0.899, then
     * 0.899 * 0.999 - 0.1 = 0.798101, then 0.798101 * 0.999 - 0.1 = 0.697302899. */
    run_steps(opt, m, 1.0f, (double[]){0.899, 0.798101, 0.697302899}, 3);
    const char *name;
    const float *ea = host_f32(cddp_model_device(m), cddp_optim_state(opt, 0, &name), 1);
    assert_string_equal(name, "exp_avg");
    /* The moments after 3 steps of g = 1: m = 1 - b1^3, v = 1 - b2^3, with the betas as the
     * float32 values the update uses (0.999f is 0.99900001...). */
    double b1 = 0.9f, b2 = 0.999f;
    assert_close(ea[0], (double)(1.0f - 0.9f) * (1 + b1 + b1 * b1), 1e-6, 0);
    const float *ev = host_f32(cddp_model_device(m), cddp_optim_state(opt, 1, &name), 1);
    assert_string_equal(name, "exp_avg_sq");
    assert_close(ev[0], (double)(1.0f - 0.999f) * (1 + b2 + b2 * b2), 1e-6, 0);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
}

static void test_lion_rules(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_model *m = scalar_model(1.0f);
    cddp_lion_options o = cddp_lion_defaults(0.1f);
    assert_true(o.beta1 == 0.9f && o.beta2 == 0.99f && o.weight_decay == 0.0f);
    o.weight_decay = 0.5f;
    cddp_optim *opt = cddp_optim_lion(m, &o, &err);
    assert_non_null(opt);
    assert_string_equal(cddp_optim_name(opt), "lion");
    assert_int_equal(cddp_optim_num_states(opt), 1);
    /* g = 1: c = 0.1 > 0, so each step is p = p (1 - 0.1 * 0.5) - 0.1: 0.85, 0.7075, 0.572125 */
    run_steps(opt, m, 1.0f, (double[]){0.85, 0.7075, 0.572125}, 3);
    const char *name;
    const float *ea = host_f32(cddp_model_device(m), cddp_optim_state(opt, 0, &name), 1);
    assert_string_equal(name, "exp_avg");
    /* m = 0.01 (1 + b2 + b2^2) after 3 steps of g = 1, b2 the float32 0.99f */
    double b2 = 0.99f;
    assert_close(ea[0], (double)(1.0f - 0.99f) * (1 + b2 + b2 * b2), 1e-6, 0);
    /* g = -0.1: c = 0.9 m - 0.01 = 0.0168... > 0 still (the momentum decides): p goes down
     * again; then g = -1: c = 0.9 m' - 0.1 < 0, p goes up. */
    set_at(cddp_model_device(m), cddp_model_grad(m), 0, -0.1f);
    cddp_optim_step(opt);
    float after = host_f32(cddp_model_device(m), cddp_model_data(m), 1)[0];
    assert_close(after, 0.572125 * 0.95 - 0.1, 1e-6, 1e-7);
    set_at(cddp_model_device(m), cddp_model_grad(m), 0, -1.0f);
    cddp_optim_step(opt);
    assert_close(host_f32(cddp_model_device(m), cddp_model_data(m), 1)[0], after * 0.95 + 0.1, 1e-6,
                 1e-7);
    /* g = 0 with m = 0: c = 0, sign(0) = 0: only the decay */
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    m = scalar_model(2.0f);
    opt = cddp_optim_lion(m, &o, &err);
    run_steps(opt, m, 0.0f, (double[]){1.9, 1.805}, 2);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
}

/* The paper's Lion, written out here in double on float inputs, against the optimizer on every
 * element of a weight (decayed) and a bias (no decay: decay_matrices_only) over 6 steps of random
 * gradients. */
static void test_lion_paper(void **state) {
    (void)state;
    enum { R = 37, C = 29, N = R * C + C, STEPS = 6 };
    cddp_model *m = cddp_model_create();
    assert_int_equal(
        cddp_model_add_param(m, "w", CDDP_SHAPE(R, C), (cddp_init){CDDP_INIT_UNIFORM, -1, 1}, NULL),
        CDDP_OK);
    assert_int_equal(
        cddp_model_add_param(m, "b", CDDP_SHAPE(C), (cddp_init){CDDP_INIT_UNIFORM, -1, 1}, NULL),
        CDDP_OK);
    assert_int_equal(cddp_model_build(m, 5), CDDP_OK);
    m = test_model_to(m);
    cddp_device *dev = cddp_model_device(m);
    assert_int_equal((int)cddp_model_numel(m), N);
    cddp_lion_options o = {.lr = 0.003f,
                           .beta1 = 0.85f,
                           .beta2 = 0.98f,
                           .weight_decay = 0.7f,
                           .decay_matrices_only = true};
    cddp_error err = {0};
    cddp_optim *opt = cddp_optim_lion(m, &o, &err);
    assert_non_null(opt);
    static double p[N], mom[N];
    static float g[N];
    const float *p0 = host_f32(dev, cddp_model_data(m), N);
    for (int i = 0; i < N; i++) p[i] = p0[i], mom[i] = 0;
    cddp_rng r;
    cddp_rng_seed(&r, 11);
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < N; i++) g[i] = cddp_rng_uniform(&r) * 2 - 1;
        assert_int_equal(cddp_device_upload(dev, cddp_model_grad(m), g, sizeof g, &err), CDDP_OK);
        cddp_optim_step(opt);
        for (int i = 0; i < N; i++) {
            double wd = i < R * C ? 0.7 : 0.0; /* the bias: no decay */
            double c = (double)o.beta1 * mom[i] + (1.0 - (double)o.beta1) * g[i];
            p[i] = p[i] * (1.0 - (double)o.lr * wd) - (double)o.lr * ((c > 0) - (c < 0));
            mom[i] = (double)o.beta2 * mom[i] + (1.0 - (double)o.beta2) * g[i];
        }
        const float *got = host_f32(dev, cddp_model_data(m), N);
        const float *gm = host_f32(dev, cddp_optim_state(opt, 0, NULL), N);
        for (int i = 0; i < N; i++) {
            if (fabs(got[i] - p[i]) > 1e-6 * fabs(p[i]) + 1e-6)
                fail_msg("step %d, element %d: p %.9g, the paper's %.9g", t, i, got[i], p[i]);
            if (fabs(gm[i] - mom[i]) > 1e-6 * fabs(mom[i]) + 1e-7)
                fail_msg("step %d, element %d: m %.9g, the paper's %.9g", t, i, gm[i], mom[i]);
        }
    }
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
}

static void test_invalid_options(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_model *m = scalar_model(0);
    assert_null(cddp_optim_sgd(m, &(cddp_sgd_options){.lr = -1}, &err));
    assert_non_null(strstr(err.msg, "learning rate"));
    assert_null(cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.1f, .nesterov = true}, &err));
    assert_non_null(strstr(err.msg, "nesterov needs momentum"));
    cddp_adamw_options o = cddp_adamw_defaults(0.1f);
    o.beta2 = 1.0f;
    assert_null(cddp_optim_adamw(m, &o, &err));
    assert_int_equal(err.code, CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "betas"));
    cddp_lion_options lo = cddp_lion_defaults(0.1f);
    lo.beta1 = 1.5f;
    assert_null(cddp_optim_lion(m, &lo, &err));
    assert_int_equal(err.code, CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "Lion: betas"));
    lo = cddp_lion_defaults(-1);
    assert_null(cddp_optim_lion(m, &lo, &err));
    assert_non_null(strstr(err.msg, "learning rate"));
    cddp_optim_destroy(NULL);
    cddp_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_rules),       cmocka_unit_test(test_adamw_rules),
        cmocka_unit_test(test_lion_rules),      cmocka_unit_test(test_lion_paper),
        cmocka_unit_test(test_invalid_options),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    host_release();
    return failed;
}
