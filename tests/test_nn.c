/* test_nn.c: parameter naming and layout, PyTorch's initialisation, model errors, BatchNorm and
 * buffers (values by hand, checkpoints), and a custom model built from raw ops (the seed's linear
 * regression); the models on the test device (helpers.h). */
#include "helpers.h"

#include <unistd.h>

static void test_sequential_names_and_layout(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_flatten()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(784, 16)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "head", cddp_nn_linear(16, 10)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    test_model_to(m);
    assert_ptr_equal(cddp_model_device(m), test_device());
    const char *names[] = {"1.weight", "1.bias", "head.weight", "head.bias"};
    int64_t sizes[] = {16 * 784, 16, 10 * 16, 10};
    assert_int_equal(cddp_model_num_params(m), 4);
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        cddp_tensor *p = cddp_model_param(m, i);
        assert_string_equal(p->name, names[i]);
        assert_int_equal(p->numel, sizes[i]);
        assert_int_equal(cddp_model_param_offset(m, i), off);
        /* Views into the flat blocks, back to back. */
        assert_ptr_equal(p->data, cddp_model_data(m) + off);
        assert_ptr_equal(p->grad, cddp_model_grad(m) + off);
        assert_ptr_equal(cddp_model_find(m, names[i]), p);
        assert_ptr_equal(p->device, test_device());
        off += (size_t)sizes[i];
    }
    assert_int_equal(cddp_model_numel(m), off);
    assert_null(cddp_model_find(m, "0.weight"));
    cddp_tensor *w = cddp_model_find(m, "head.weight");
    assert_int_equal(w->shape[0], 10);
    assert_int_equal(w->shape[1], 16);
    cddp_model_destroy(m);
}

/* A Sequential runs a Conv2d followed by a ReLU and a MaxPool2d as one op, conv2d_relu_max_pool2d,
 * and a ReLU followed by a MaxPool2d as relu_max_pool2d, with the values of the ops apart; a ReLU
 * followed by anything else stays a ReLU. */
static void test_sequential_fuses_relu_and_max_pool(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_conv2d(1, 4, 3, 1, 1)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_max_pool2d(2, 2)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_max_pool2d(2, 1)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_flatten()), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 3), CDDP_OK);
    test_model_to(m);
    cddp_ctx *ctx = test_ctx(1);
    cddp_tensor *x = cddp_uniform(ctx, 4, (int64_t[]){2, 1, 9, 10}, -1, 1, cddp_ctx_rng(ctx));
    cddp_tensor *y = cddp_model_forward(m, ctx, x);
    const char *ops[] = {"reshape", "relu", "relu_max_pool2d",
                         "conv2d_relu_max_pool2d"}; /* newest first */
    int i = 0;
    for (cddp_node *n = cddp_ctx_tape(ctx); n; n = cddp_node_prev(n), i++) {
        assert_true(i < 4);
        assert_string_equal(cddp_node_op(n), ops[i]);
    }
    assert_int_equal(i, 4);
    /* the ops apart, from the first node's inputs */
    cddp_node *first = cddp_node_prev(cddp_node_prev(cddp_node_prev(cddp_ctx_tape(ctx))));
    cddp_tensor *conv = cddp_conv2d(ctx, cddp_node_input(first, 0), cddp_node_input(first, 1),
                                    cddp_node_input(first, 2), 1, 1);
    cddp_tensor *want = cddp_max_pool2d(ctx, cddp_relu(ctx, conv), 2, 2, 0);
    want = cddp_relu(ctx, cddp_max_pool2d(ctx, cddp_relu(ctx, want), 2, 1, 0));
    assert_int_equal(want->numel, y->numel);
    const float *yh = HOST(y), *wh = HOST(want);
    for (int64_t k = 0; k < y->numel; k++) assert_true(yh[k] == wh[k]);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* A Sequential's BatchNorm followed by a ReLU runs as one op, batch_norm_relu, with the values of
 * the two; a BatchNorm followed by something else stays batch_norm. */
static void test_sequential_fuses_batch_norm_and_relu(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_batch_norm(3)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_relu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_batch_norm(3)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 3), CDDP_OK);
    test_model_to(m);
    cddp_ctx *ctx = test_ctx(1);
    cddp_tensor *x = cddp_uniform(ctx, 4, (int64_t[]){4, 3, 5, 5}, -1, 1, cddp_ctx_rng(ctx));
    cddp_requires_grad(ctx, x);
    cddp_tensor *y = cddp_model_forward(m, ctx, x);
    cddp_node *last = cddp_ctx_tape(ctx), *first = cddp_node_prev(last);
    assert_string_equal(cddp_node_op(last), "batch_norm");
    assert_string_equal(cddp_node_op(first), "batch_norm_relu");
    assert_null(cddp_node_prev(first));
    cddp_tensor *p[4];
    for (int i = 0; i < 4; i++) p[i] = cddp_model_param(m, i); /* 0.weight 0.bias 2.weight 2.bias */
    cddp_tensor *want =
        cddp_relu(ctx, cddp_batch_norm(ctx, x, p[0], p[1], NULL, NULL, true, 0.1f, 1e-5f));
    want = cddp_batch_norm(ctx, want, p[2], p[3], NULL, NULL, true, 0.1f, 1e-5f);
    const float *yh = HOST(y), *wh = HOST(want);
    for (int64_t k = 0; k < y->numel; k++) assert_true(yh[k] == wh[k]);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for Linear and Conv2d weights and biases. */
static void check_uniform(const cddp_tensor *p, double bound) {
    double s = 0, s2 = 0;
    const float *ph = HOST(p);
    for (int64_t i = 0; i < p->numel; i++) {
        double v = ph[i];
        assert_true(fabs(v) <= bound);
        s += v;
        s2 += v * v;
    }
    double n = (double)p->numel;
    if (n >= 1000) {
        assert_close(s / n, 0.0, 0, bound * 0.05);
        assert_close(sqrt(s2 / n), bound / sqrt(3.0), 0.03, 0);
    }
}

static void test_pytorch_default_init(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(784, 512)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "conv", cddp_nn_conv2d(3, 64, 5, 1, 2)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 11), CDDP_OK);
    test_model_to(m);
    check_uniform(cddp_model_find(m, "fc.weight"), 1.0 / sqrt(784.0));
    check_uniform(cddp_model_find(m, "fc.bias"), 1.0 / sqrt(784.0));
    check_uniform(cddp_model_find(m, "conv.weight"), 1.0 / sqrt(75.0));
    check_uniform(cddp_model_find(m, "conv.bias"), 1.0 / sqrt(75.0));
    assert_int_equal(cddp_model_find(m, "conv.weight")->ndim, 4);
    /* Gradients start at zero. */
    const float *g =
        host_f32(cddp_model_device(m), cddp_model_grad(m), (int64_t)cddp_model_numel(m));
    for (size_t i = 0; i < cddp_model_numel(m); i++) assert_true(g[i] == 0.0f);
    cddp_model_destroy(m);
}

static cddp_model *small(uint64_t seed) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, NULL, cddp_nn_linear(5, 4)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, seed), CDDP_OK);
    return test_model_to(m);
}

/* One seed, the same weights: how every rank starts identical. */
static void test_seeded_init_is_reproducible(void **state) {
    (void)state;
    cddp_model *a = small(5), *b = small(5), *c = small(6);
    int64_t k = (int64_t)cddp_model_numel(a);
    size_t n = (size_t)k * sizeof(float);
    const float *ha = host_f32(cddp_model_device(a), cddp_model_data(a), k),
                *hb = host_f32(cddp_model_device(b), cddp_model_data(b), k),
                *hc = host_f32(cddp_model_device(c), cddp_model_data(c), k);
    assert_memory_equal(ha, hb, n);
    assert_memory_not_equal(ha, hc, n);
    cddp_model_destroy(a);
    cddp_model_destroy(b);
    cddp_model_destroy(c);
}

static void test_model_errors(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(4, 4)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(4, 4)), CDDP_EINVAL);
    assert_non_null(strstr(cddp_model_error(m), "'fc.weight' is already used"));
    assert_int_equal(cddp_model_add(m, "bad", cddp_nn_linear(0, 4)), CDDP_EINVAL);
    assert_non_null(strstr(cddp_model_error(m), "must be positive"));
    assert_int_equal(cddp_model_add(m, "drop", cddp_nn_dropout(1.5f)), CDDP_EINVAL);
    assert_int_equal(cddp_model_add(m, "conv", cddp_nn_conv2d(1, 1, 3, 0, 0)), CDDP_EINVAL);
    assert_int_equal(cddp_model_add_param(m, "p", CDDP_SHAPE(2, -1), (cddp_init){0}, NULL),
                     CDDP_EINVAL);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "late", cddp_nn_relu()), CDDP_ESTATE);
    assert_non_null(strstr(cddp_model_error(m), "already built"));
    assert_int_equal(cddp_model_build(m, 0), CDDP_ESTATE);
    cddp_model_destroy(m);
    cddp_model_destroy(NULL);
}

static void test_forward_shapes_and_training_mode(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "conv", cddp_nn_conv2d(1, 4, 3, 1, 1)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "act", cddp_nn_gelu()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "pool", cddp_nn_max_pool2d(2, 0)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "flat", cddp_nn_flatten()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "drop", cddp_nn_dropout(0.5f)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(4 * 14 * 14, 3)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "out", cddp_nn_tanh()), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    test_model_to(m);
    cddp_ctx *ctx = test_ctx(0);
    cddp_tensor *x = cddp_ones(ctx, CDDP_F32, CDDP_SHAPE(2, 1, 28, 28));
    cddp_tensor *train = cddp_model_forward(m, ctx, x);
    assert_int_equal(train->ndim, 2);
    assert_int_equal(train->shape[0], 2);
    assert_int_equal(train->shape[1], 3);
    cddp_model_set_training(m, false);
    assert_false(cddp_model_training(m));
    cddp_tensor *eval1 = cddp_model_forward(m, ctx, x), *eval2 = cddp_model_forward(m, ctx, x);
    /* Without dropout the output is deterministic; with it, it differs. */
    assert_memory_equal(HOST(eval1), HOST(eval2), 6 * sizeof(float));
    assert_memory_not_equal(HOST(eval1), HOST(train), 6 * sizeof(float));
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* The OneFlow seed's model: one (2,1) parameter w starting at zero, y = x w, MSE with sum
 * reduction, SGD lr 0.01 for 500 iterations, on both ranks' data at once. w must reach [2, 3]. */
static void test_custom_model_linear_regression(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    int w;
    assert_int_equal(cddp_model_add_param(m, "w", CDDP_SHAPE(2, 1), (cddp_init){0}, &w), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    test_model_to(m);
    cddp_error err = {0};
    cddp_optim *opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.01f}, &err);
    assert_non_null(opt);
    cddp_ctx *ctx = test_ctx(0);
    float x[] = {1, 2, 2, 3, 4, 6, 3, 1}, y[] = {8, 13, 26, 9};
    float loss = 0;
    for (int i = 0; i < 500; i++) {
        cddp_ctx_reset(ctx);
        cddp_tensor *pred = cddp_matmul(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(4, 2), x),
                                        cddp_model_param(m, w), false, false);
        cddp_tensor *l = cddp_mse_loss(
            ctx, pred, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(4, 1), y), CDDP_REDUCE_SUM);
        cddp_model_zero_grad(m);
        assert_int_equal(cddp_backward(ctx, l), CDDP_OK);
        cddp_optim_step(opt);
        loss = (float)cddp_get(l, 0);
    }
    const float *wh = host_f32(cddp_model_device(m), cddp_model_data(m), 2);
    assert_close(wh[0], 2.0, 0, 1e-3);
    assert_close(wh[1], 3.0, 0, 1e-3);
    assert_true(loss < 1e-6f);
    cddp_ctx_destroy(ctx);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
}

/* BatchNorm: PyTorch's names, the batch statistics in training (running_var unbiased, momentum
 * 0.1), the running ones in evaluation, buffers apart from the parameters, and a checkpoint that
 * carries them. x is (4, 2): channel 0 holds 1, 2, 3, 4 (mean 2.5, biased variance 1.25, unbiased
 * 5/3); channel 1 is constant 7 (variance 0: the output is the bias). */
static void test_batch_norm_module(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "bn", cddp_nn_batch_norm(2)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    test_model_to(m);
    assert_int_equal(cddp_model_num_params(m), 2);
    assert_int_equal(cddp_model_num_buffers(m), 2);
    assert_string_equal(cddp_model_param(m, 0)->name, "bn.weight");
    assert_string_equal(cddp_model_param(m, 1)->name, "bn.bias");
    cddp_tensor *rm = cddp_model_find_buffer(m, "bn.running_mean");
    cddp_tensor *rv = cddp_model_find_buffer(m, "bn.running_var");
    assert_non_null(rm);
    assert_non_null(rv);
    assert_null(cddp_model_find(m, "bn.running_mean")); /* not a parameter */
    assert_int_equal(cddp_model_buffer_numel(m), 4);
    assert_ptr_equal(rm->data, cddp_model_buffer_data(m));
    assert_false(rm->requires_grad);
    assert_float_equal(HOST(rv)[0], 1.0f, 0);
    set_f32(cddp_model_param(m, 1), 1, 0.5f); /* bias of channel 1 */
    cddp_ctx *ctx = test_ctx(0);
    float x[8] = {1, 7, 2, 7, 3, 7, 4, 7};
    cddp_tensor *y = cddp_model_forward(m, ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(4, 2), x));
    assert_non_null(y);
    double inv = 1.0 / sqrt(1.25 + 1e-5);
    const float *yh = HOST(y), *rmh = HOST(rm), *rvh = HOST(rv);
    for (int n = 0; n < 4; n++) {
        assert_float_equal(yh[2 * n], (float)((n + 1 - 2.5) * inv), 1e-6);
        assert_float_equal(yh[2 * n + 1], 0.5f, 1e-6);
    }
    assert_float_equal(rmh[0], 0.25f, 1e-7);
    assert_float_equal(rmh[1], 0.7f, 1e-6);
    assert_float_equal(rvh[0], (float)(0.9 + 0.1 * 5.0 / 3.0), 1e-6);
    assert_float_equal(rvh[1], 0.9f, 1e-7);
    /* Evaluation: the running statistics, which stay put. */
    cddp_model_set_training(m, false);
    cddp_ctx_reset(ctx);
    y = cddp_model_forward(m, ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(4, 2), x));
    double inv0 = 1.0 / sqrt(0.9 + 0.5 / 3.0 + 1e-5), inv1 = 1.0 / sqrt(0.9 + 1e-5);
    yh = HOST(y);
    assert_float_equal(yh[0], (float)((1 - 0.25) * inv0), 1e-6);
    assert_float_equal(yh[1], (float)((7 - 0.7) * inv1 + 0.5), 1e-5);
    assert_float_equal(HOST(rm)[0], 0.25f, 1e-7);
    /* A checkpoint carries the buffers; a model that lacks them is told so. */
    char path[] = "/tmp/cddp_bn_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    cddp_error err = {0};
    assert_int_equal(cddp_checkpoint_save(path, m, NULL, NULL, &err), CDDP_OK);
    cddp_model *m2 = cddp_model_create();
    assert_int_equal(cddp_model_add(m2, "bn", cddp_nn_batch_norm(2)), CDDP_OK);
    assert_int_equal(cddp_model_build(m2, 0), CDDP_OK);
    test_model_to(m2);
    assert_int_equal(cddp_checkpoint_load(path, m2, NULL, NULL, &err), CDDP_OK);
    assert_memory_equal(host_f32(test_device(), cddp_model_buffer_data(m2), 4),
                        host_f32(test_device(), cddp_model_buffer_data(m), 4), 4 * sizeof(float));
    cddp_model *plain = cddp_model_create();
    int64_t two = 2;
    assert_int_equal(cddp_model_add_param(plain, "bn.weight", 1, &two, (cddp_init){0}, NULL), 0);
    assert_int_equal(cddp_model_add_param(plain, "bn.bias", 1, &two, (cddp_init){0}, NULL), 0);
    assert_int_equal(cddp_model_build(plain, 0), CDDP_OK);
    assert_int_equal(cddp_checkpoint_load(path, plain, NULL, NULL, &err), CDDP_ESHAPE);
    assert_non_null(strstr(err.msg, "'bn.running_mean' is in the file but not in the model"));
    /* A duplicate name across parameters and buffers is refused. */
    cddp_model *dup = cddp_model_create();
    assert_int_equal(cddp_model_add_param(dup, "s", 1, &two, (cddp_init){0}, NULL), CDDP_OK);
    assert_int_equal(cddp_model_add_buffer(dup, "s", 1, &two, 0, NULL), CDDP_EINVAL);
    unlink(path);
    cddp_model_destroy(dup);
    cddp_model_destroy(plain);
    cddp_model_destroy(m2);
    cddp_model_destroy(m);
    cddp_ctx_destroy(ctx);
}

/* A residual block written as a module of modules: y = relu(x + conv2(relu(conv1(x)))), with
 * its two convolutions as children and a scale parameter of its own. */
typedef struct residual {
    int64_t channels;
} residual;

static int residual_declare(cddp_module *self) {
    int64_t one = 1;
    int k = cddp_module_param(self, "gate", 1, &one, (cddp_init){CDDP_INIT_CONSTANT, 0.5f, 0});
    return k < 0 ? k : CDDP_OK;
}

static cddp_tensor *residual_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    cddp_tensor *h = cddp_module_forward(cddp_module_child(self, 0), ctx, x);
    h = cddp_module_forward(cddp_module_child(self, 1), ctx, cddp_relu(ctx, h));
    return cddp_relu(ctx, cddp_add(ctx, x, cddp_mul(ctx, h, cddp_module_get_param(self, 0))));
}

static const cddp_module_type residual_type = {"Residual", residual_declare, residual_forward,
                                               free};

static cddp_module *residual_block(int64_t channels) {
    residual *r = malloc(sizeof *r);
    r->channels = channels;
    cddp_module *m = cddp_module_create(&residual_type, r);
    assert_int_equal(cddp_module_add(m, "conv1", cddp_nn_conv2d(channels, channels, 3, 1, 1)),
                     CDDP_OK);
    assert_int_equal(cddp_module_add(m, "conv2", cddp_nn_conv2d(channels, channels, 3, 1, 1)),
                     CDDP_OK);
    return m;
}

/* Modules nest: names follow the path (PyTorch's state_dict), a module's own parameters come
 * before its children's, the forward runs through the children, gradients reach every
 * parameter, and a failed add leaves the model as it was. */
static void test_modules_nest(void **state) {
    (void)state;
    cddp_model *m = cddp_model_create();
    cddp_module *layer1 = cddp_nn_sequential();
    assert_int_equal(cddp_model_add(m, "stem", cddp_nn_conv2d(1, 2, 3, 1, 1)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "layer1", layer1), CDDP_OK);
    /* Added to a module already in the model: it joins at once. */
    assert_int_equal(cddp_module_add(layer1, NULL, residual_block(2)), CDDP_OK);
    assert_int_equal(cddp_module_add(layer1, NULL, residual_block(2)), CDDP_OK);
    /* A child whose description is wrong fails and leaves nothing behind. */
    int before = cddp_model_num_params(m);
    cddp_module *bad = residual_block(2);
    assert_int_equal(cddp_module_add(bad, "conv3", cddp_nn_conv2d(2, 0, 3, 1, 1)), CDDP_OK);
    assert_int_equal(cddp_module_add(layer1, "bad", bad), CDDP_EINVAL);
    assert_non_null(strstr(cddp_model_error(m), "module 'layer1.bad.conv3': in=2 and out=0"));
    assert_int_equal(cddp_model_num_params(m), before);
    assert_int_equal(cddp_module_num_children(layer1), 2);
    /* A duplicate name deeper down is refused too. */
    cddp_module *dup = residual_block(2);
    assert_int_equal(cddp_module_add(dup, "conv1", cddp_nn_conv2d(2, 2, 1, 1, 0)), CDDP_OK);
    assert_int_equal(cddp_module_add(layer1, "1", dup), CDDP_EINVAL);
    assert_non_null(strstr(cddp_model_error(m), "'layer1.1.gate' is already used"));
    assert_int_equal(cddp_model_num_params(m), before);
    assert_int_equal(cddp_model_add(m, "pool", cddp_nn_max_pool2d(2, 0)), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "flat", cddp_nn_flatten()), CDDP_OK);
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(2 * 2 * 2, 3)), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 5), CDDP_OK);
    test_model_to(m);
    const char *names[] = {"stem.weight",
                           "stem.bias",
                           "layer1.0.gate",
                           "layer1.0.conv1.weight",
                           "layer1.0.conv1.bias",
                           "layer1.0.conv2.weight",
                           "layer1.0.conv2.bias",
                           "layer1.1.gate",
                           "layer1.1.conv1.weight",
                           "layer1.1.conv1.bias",
                           "layer1.1.conv2.weight",
                           "layer1.1.conv2.bias",
                           "fc.weight",
                           "fc.bias"};
    assert_int_equal(cddp_model_num_params(m), 14);
    for (int i = 0; i < 14; i++) assert_string_equal(cddp_model_param(m, i)->name, names[i]);
    assert_string_equal(cddp_module_path(cddp_module_child(layer1, 1)), "layer1.1");
    assert_string_equal(cddp_module_path(cddp_module_child(cddp_module_child(layer1, 1), 0)),
                        "layer1.1.conv1");
    assert_int_equal(cddp_module_add(layer1, NULL, cddp_nn_relu()), CDDP_ESTATE);

    /* The forward equals the same ops written out by hand. */
    cddp_ctx *ctx = test_ctx(0);
    cddp_rng rng;
    cddp_rng_seed(&rng, 3);
    cddp_tensor *x = cddp_normal(ctx, CDDP_SHAPE(2, 1, 4, 4), 0, 1, &rng);
    cddp_tensor *y = cddp_model_forward(m, ctx, x);
    assert_non_null(y);
    assert_int_equal(y->shape[0], 2);
    assert_int_equal(y->shape[1], 3);
#define P(name) cddp_model_find(m, name)
    cddp_tensor *h = cddp_conv2d(ctx, x, P("stem.weight"), P("stem.bias"), 1, 1);
    for (int b = 0; b < 2; b++) {
        char c1w[64], c1b[64], c2w[64], c2b[64], g[64];
        snprintf(c1w, sizeof c1w, "layer1.%d.conv1.weight", b);
        snprintf(c1b, sizeof c1b, "layer1.%d.conv1.bias", b);
        snprintf(c2w, sizeof c2w, "layer1.%d.conv2.weight", b);
        snprintf(c2b, sizeof c2b, "layer1.%d.conv2.bias", b);
        snprintf(g, sizeof g, "layer1.%d.gate", b);
        cddp_tensor *t = cddp_relu(ctx, cddp_conv2d(ctx, h, P(c1w), P(c1b), 1, 1));
        t = cddp_conv2d(ctx, t, P(c2w), P(c2b), 1, 1);
        h = cddp_relu(ctx, cddp_add(ctx, h, cddp_mul(ctx, t, P(g))));
    }
    h = cddp_linear(ctx, cddp_flatten(ctx, cddp_max_pool2d(ctx, h, 2, 2, 0)), P("fc.weight"),
                    P("fc.bias"));
#undef P
    for (int64_t i = 0; i < y->numel; i++) assert_float_equal(cddp_get(y, i), cddp_get(h, i), 0);
    /* Every parameter, the blocks' own gates included, gets a gradient. */
    cddp_model_zero_grad(m);
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, y)), CDDP_OK);
    for (int i = 0; i < 14; i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        double g = 0;
        const float *dp = HOST_GRAD(p);
        for (int64_t e = 0; e < p->numel; e++) g += fabs(dp[e]);
        assert_true(g > 0);
    }
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);

    /* A model whose root is a module of its own: names start at the root's children. */
    cddp_error err = {0};
    cddp_module *root = residual_block(1);
    cddp_model *r = cddp_model_create_with(root, &err);
    assert_non_null(r);
    assert_ptr_equal(cddp_model_root(r), root);
    assert_int_equal(cddp_model_build(r, 0), CDDP_OK);
    assert_string_equal(cddp_model_param(r, 0)->name, "gate");
    assert_string_equal(cddp_model_param(r, 1)->name, "conv1.weight");
    cddp_model_destroy(r);
}

/* A module using one weight twice, y = W (W x + b), with "outer.weight" its tied second name. */
static int twice_declare(cddp_module *self) {
    return cddp_module_tie(self, "outer.weight", "inner.weight");
}

static cddp_tensor *twice_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    cddp_module *inner = cddp_module_child(self, 0);
    return cddp_linear(ctx, cddp_module_forward(inner, ctx, x), cddp_module_get_param(inner, 0),
                       NULL);
}

static const cddp_module_type twice_type = {"Twice", twice_declare, twice_forward, NULL};

/* Tied weights: one parameter under two names, whose gradient sums both uses (the gradients of
 * the same model with two separate copies of the weight, added). */
static void test_tied_weights(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_module *twice = cddp_module_create(&twice_type, NULL);
    assert_int_equal(cddp_module_add(twice, "inner", cddp_nn_linear(4, 4)), CDDP_OK);
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "net", twice), CDDP_OK);
    assert_int_equal(cddp_model_build(m, 3), CDDP_OK);
    test_model_to(m);
    assert_int_equal(cddp_model_num_params(m), 2); /* inner.weight and inner.bias, once */
    assert_int_equal(cddp_model_num_ties(m), 1);
    const char *name;
    cddp_tensor *w = cddp_model_tie(m, 0, &name);
    assert_string_equal(name, "net.outer.weight");
    assert_ptr_equal(w, cddp_model_find(m, "net.inner.weight"));
    assert_ptr_equal(cddp_model_find(m, "net.outer.weight"), w);

    /* The same computation with two separate weights holding the same values. */
    cddp_model *u = cddp_model_create();
    int64_t shape[2] = {4, 4}, four = 4;
    int a, b, c;
    assert_int_equal(cddp_model_add_param(u, "a", 2, shape, (cddp_init){0}, &a), CDDP_OK);
    assert_int_equal(cddp_model_add_param(u, "b", 1, &four, (cddp_init){0}, &b), CDDP_OK);
    assert_int_equal(cddp_model_add_param(u, "c", 2, shape, (cddp_init){0}, &c), CDDP_OK);
    assert_int_equal(cddp_model_build(u, 0), CDDP_OK);
    test_model_to(u);
    cddp_tensor *pa = cddp_model_param(u, a), *pb = cddp_model_param(u, b),
                *pc = cddp_model_param(u, c);
    cddp_error e = {0};
    cddp_device *dev = test_device();
    assert_int_equal(cddp_device_copy(dev, pa->data, w->data, 16 * sizeof(float), &e), CDDP_OK);
    assert_int_equal(cddp_device_copy(dev, pc->data, w->data, 16 * sizeof(float), &e), CDDP_OK);
    assert_int_equal(cddp_device_copy(dev, pb->data, cddp_model_find(m, "net.inner.bias")->data,
                                      4 * sizeof(float), &e),
                     CDDP_OK);
    cddp_ctx *ctx = test_ctx(0);
    cddp_rng rng;
    cddp_rng_seed(&rng, 9);
    cddp_tensor *x = cddp_normal(ctx, CDDP_SHAPE(3, 4), 0, 1, &rng);
    cddp_model_zero_grad(m);
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, cddp_model_forward(m, ctx, x))), CDDP_OK);
    cddp_model_zero_grad(u);
    cddp_ctx_reset(ctx); /* one backward per step: the same x again in a new step */
    cddp_rng_seed(&rng, 9);
    x = cddp_normal(ctx, CDDP_SHAPE(3, 4), 0, 1, &rng);
    cddp_tensor *y = cddp_linear(ctx, cddp_linear(ctx, x, pa, pb), pc, NULL);
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, y)), CDDP_OK);
    const float *gw = HOST_GRAD(w), *ga = HOST_GRAD(pa), *gc = HOST_GRAD(pc);
    for (int i = 0; i < 16; i++) assert_close(gw[i], ga[i] + gc[i], 1e-6, 1e-6);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(u);
    cddp_model_destroy(m);

    /* A tie to a name that is not a parameter fails the build; a tie's name is taken. */
    twice = cddp_module_create(&twice_type, NULL);
    assert_int_equal(cddp_module_add(twice, "inner", cddp_nn_relu()), CDDP_OK);
    m = cddp_model_create_with(twice, &err);
    assert_non_null(m);
    assert_int_equal(cddp_model_build(m, 0), CDDP_EINVAL);
    assert_non_null(strstr(cddp_model_error(m),
                           "'outer.weight' is tied to 'inner.weight', which is not a parameter"));
    cddp_model_destroy(m);
    twice = cddp_module_create(&twice_type, NULL);
    assert_int_equal(cddp_module_add(twice, "inner", cddp_nn_linear(2, 2)), CDDP_OK);
    assert_int_equal(cddp_module_add(twice, "outer", cddp_nn_linear(2, 2)), CDDP_OK);
    assert_null(cddp_model_create_with(twice, &err));
    assert_non_null(strstr(err.msg, "'outer.weight' is already used"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_names_and_layout),
        cmocka_unit_test(test_sequential_fuses_relu_and_max_pool),
        cmocka_unit_test(test_sequential_fuses_batch_norm_and_relu),
        cmocka_unit_test(test_pytorch_default_init),
        cmocka_unit_test(test_seeded_init_is_reproducible),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_forward_shapes_and_training_mode),
        cmocka_unit_test(test_custom_model_linear_regression),
        cmocka_unit_test(test_batch_norm_module),
        cmocka_unit_test(test_modules_nest),
        cmocka_unit_test(test_tied_weights),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    host_release();
    return failed;
}
