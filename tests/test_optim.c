/* test_optim.c: SGD and AdamW update rules against values derived by hand (one parameter
 * element, a constant gradient), and option validation. PyTorch parity on real models is in
 * test_reference.c. The model and the optimizer's state live on the test device (helpers.h). */
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
    cddp_optim_destroy(NULL);
    cddp_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_rules),
        cmocka_unit_test(test_adamw_rules),
        cmocka_unit_test(test_invalid_options),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    host_release();
    return failed;
}
