/* test_reference.c: cddp against PyTorch on the MLP and the CNN.
 *
 * tests/reference/{mlp,cnn}.safetensors come from tests/reference/make_fixtures.py (PyTorch,
 * computed in float64): initial weights, three batches, the loss and every gradient at init, and
 * the parameters after 3 SGD-momentum steps and after 3 AdamW steps (eps 1e-5, see there). cddp
 * loads the same initial weights and must agree within 1e-5 relative: for each tensor, max |cddp -
 * torch| over the tensor is at most 1e-5 times max |torch| (and the losses within 1e-5 of their
 * value). Reading these files also checks that cddp reads safetensors written by Python.
 */
#include "helpers.h"

#define RTOL 1e-5

static cddp_safetensors *fixture(const char *name) {
    char rel[128], path[4096];
    snprintf(rel, sizeof rel, "tests/reference/%s.safetensors", name);
    source_path(path, sizeof path, rel);
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(path, &err);
    if (!f) fail_msg("%s", err.msg);
    return f;
}

static const cddp_st_tensor *get(cddp_safetensors *f, const char *prefix, const char *name) {
    char key[256];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    const cddp_st_tensor *t = cddp_safetensors_find(f, key);
    if (!t) fail_msg("fixture lacks %s", key);
    return t;
}

/* max |a - b| <= RTOL * max |b| over n elements. */
static void assert_tensor_close(const char *what, const float *a, const float *b, int64_t n) {
    double maxb = 0, maxd = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        maxb = fmax(maxb, fabs(b[i]));
        double d = fabs((double)a[i] - b[i]);
        if (d > maxd) {
            maxd = d;
            worst = i;
        }
    }
    if (maxd > RTOL * maxb)
        fail_msg("%s: max difference %.3g at [%lld] (cddp %.9g, torch %.9g) exceeds %.0e x %.3g",
                 what, maxd, (long long)worst, a[worst], b[worst], RTOL, maxb);
}

static cddp_model *mlp(void) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_flatten()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(784, 128)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(128, 128)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(128, 10)), 0);
    assert_int_equal(cddp_model_build(m, 0), 0);
    return m;
}

static cddp_model *cnn(void) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_conv2d(1, 4, 3, 1, 1)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_max_pool2d(2, 0)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_conv2d(4, 8, 3, 1, 1)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_max_pool2d(2, 0)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_flatten()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(8 * 7 * 7, 32)), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), 0);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(32, 10)), 0);
    assert_int_equal(cddp_model_build(m, 0), 0);
    return m;
}

/* Copies init.<name> into every parameter, checking shapes. */
static void load_init(cddp_model *m, cddp_safetensors *f) {
    for (int i = 0; i < cddp_model_num_params(m); i++) {
        cddp_tensor *p = cddp_model_param(m, i);
        const cddp_st_tensor *t = get(f, "init.", p->name);
        assert_int_equal(t->ndim, p->ndim);
        for (int d = 0; d < p->ndim; d++) assert_int_equal(t->shape[d], p->shape[d]);
        memcpy(p->data, t->data, sizeof(float) * (size_t)p->numel);
    }
}

/* Mean cross-entropy of batch i; gradients are zeroed first and left in the model. */
static double step_loss(cddp_ctx *ctx, cddp_model *m, cddp_safetensors *f, int i) {
    char xn[8], yn[8];
    snprintf(xn, sizeof xn, "%d", i);
    snprintf(yn, sizeof yn, "%d", i);
    const cddp_st_tensor *x = get(f, "x.", xn), *y = get(f, "y.", yn);
    assert_int_equal(y->dtype, CDDP_I64);
    cddp_ctx_reset(ctx);
    cddp_tensor *in = cddp_wrap(ctx, CDDP_F32, x->ndim, x->shape, (void *)x->data);
    cddp_tensor *labels = cddp_wrap(ctx, CDDP_I64, y->ndim, y->shape, (void *)y->data);
    cddp_tensor *loss =
        cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, in), labels, CDDP_REDUCE_MEAN);
    cddp_model_zero_grad(m);
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    return cddp_get(loss, 0);
}

static void compare_params(cddp_model *m, cddp_safetensors *f, const char *prefix, bool grads) {
    for (int i = 0; i < cddp_model_num_params(m); i++) {
        cddp_tensor *p = cddp_model_param(m, i);
        char what[128];
        snprintf(what, sizeof what, "%s%s", prefix, p->name);
        assert_tensor_close(what, grads ? p->grad : cddp_f32(p), get(f, prefix, p->name)->data,
                            p->numel);
    }
}

static void check_model(cddp_model *(*make)(void), const char *name) {
    cddp_safetensors *f = fixture(name);
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    cddp_error err = {0};

    /* Loss and every gradient at init. */
    cddp_model *m = make();
    load_init(m, f);
    double loss = step_loss(ctx, m, f, 0);
    assert_close(loss, ((const float *)get(f, "loss.", "grad")->data)[0], RTOL, 0);
    compare_params(m, f, "grad.", true);
    cddp_model_destroy(m);

    /* Three SGD steps (lr 0.01, momentum 0.9) and three AdamW steps (lr 1e-3). */
    for (int o = 0; o < 2; o++) {
        m = make();
        load_init(m, f);
        cddp_adamw_options aw = cddp_adamw_defaults(1e-3f);
        aw.eps = 1e-5f; /* see make_fixtures.py: keeps noise-level gradients from deciding steps */
        cddp_optim *opt =
            o == 0 ? cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.01f, .momentum = 0.9f}, &err)
                   : cddp_optim_adamw(m, &aw, &err);
        assert_non_null(opt);
        const char *tag = o == 0 ? "sgd" : "adamw";
        const float *losses = get(f, "loss.", tag)->data;
        for (int i = 0; i < 3; i++) {
            assert_close(step_loss(ctx, m, f, i), losses[i], RTOL, 0);
            cddp_optim_step(opt);
        }
        char prefix[16];
        snprintf(prefix, sizeof prefix, "%s.", tag);
        compare_params(m, f, prefix, false);
        cddp_optim_destroy(opt);
        cddp_model_destroy(m);
    }
    cddp_ctx_destroy(ctx);
    cddp_safetensors_destroy(f);
}

static void test_mlp_matches_pytorch(void **state) {
    (void)state;
    check_model(mlp, "mlp");
}

static void test_cnn_matches_pytorch(void **state) {
    (void)state;
    check_model(cnn, "cnn");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_matches_pytorch),
        cmocka_unit_test(test_cnn_matches_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
