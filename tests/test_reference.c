/* test_reference.c: cddp against PyTorch on the MLP, the CNN and a tiny GPT.
 *
 * tests/reference/{mlp,cnn,gpt}.safetensors come from tests/reference/make_fixtures.py (PyTorch,
 * computed in float64): initial weights, three batches, the loss and every gradient at init, and
 * the parameters after 3 SGD-momentum steps and after 3 AdamW steps (eps 1e-5, see there). cddp
 * loads the same initial weights and must agree within 1e-5 relative: for each tensor, max |cddp -
 * torch| over the tensor is at most 1e-5 times max |torch| (and the losses within 1e-5 of their
 * value). Reading these files also checks that cddp reads safetensors written by Python.
 * gpt.safetensors holds GPT-2's recipe instead of SGD and plain AdamW: AdamW with weight decay on
 * matrices only, clipping at norm 1.0 and nanoGPT's warmup and cosine schedule.
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

/* Two stages (16 and 32 channels) of one basic block each, as make_fixtures.py's ResNet. */
static cddp_model *resnet(void) {
    cddp_resnet_config c = {.in_channels = 1, .classes = 10, .widths = {16, 32}, .blocks = 1};
    cddp_error err = {0};
    cddp_model *m = cddp_model_create_with(cddp_nn_resnet(&c), &err);
    assert_non_null(m);
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

/* One training step's tape: every convolution and batch normalisation (with the ReLU, and the
 * residual sum, after it, one op where they follow) of the ResNet has its output in the layout
 * blocked by B channels (0: row-major), and no node reorders. */
static void check_resnet_layout(int B) {
    cddp_safetensors *f = fixture("resnet");
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    cddp_model *m = resnet();
    step_loss(ctx, m, f, 0);
    int seen[6] = {0};
    for (cddp_node *n = cddp_ctx_tape(ctx); n; n = cddp_node_prev(n)) {
        const char *op = cddp_node_op(n);
        assert_string_not_equal(op, "to_blocked");
        assert_string_not_equal(op, "to_nchw");
        static const char *const ops[] = {
            "conv2d", "batch_norm", "batch_norm_relu", "batch_norm_add_relu", "relu", "add"};
        for (int k = 0; k < 6; k++)
            if (!strcmp(op, ops[k])) {
                assert_int_equal(cddp_node_output(n)->block, B);
                seen[k]++;
            }
    }
    /* 6 convolutions; 6 BatchNorms: the stem's and each block's first with their ReLU, each
     * block's second with the residual sum and the ReLU, the downsampling one alone */
    assert_int_equal(seen[0], 6);
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 3);
    assert_int_equal(seen[3], 2);
    assert_int_equal(seen[4], 0);
    assert_int_equal(seen[5], 0);
    cddp_model_destroy(m);
    cddp_ctx_destroy(ctx);
    cddp_safetensors_destroy(f);
}

/* Strided and 1x1 convolutions without bias, BatchNorm in training mode, residual adds, global
 * average pooling: with the activations kept blocked between layers (tensor.h's "Layouts"; the
 * default where oneDNN prefers a blocked layout) and with every tensor row-major (CDDP_BLOCKED=0),
 * so that both layouts' ops (batch normalisation's statistics, the convolutions' reorders, the
 * pooling, the ReLUs and the residual sums) are checked against PyTorch. */
static void test_resnet_layouts_match_pytorch(void **state) {
    (void)state;
    assert_true(cddp_blocked_size() == 8 || cddp_blocked_size() == 16);
    check_model(resnet, "resnet");
    check_resnet_layout(cddp_blocked_size());
    setenv("CDDP_BLOCKED", "0", 1);
    assert_int_equal(cddp_blocked_size(), 0);
    check_model(resnet, "resnet");
    check_resnet_layout(0);
    unsetenv("CDDP_BLOCKED");
}

static const cddp_gpt_config tiny_gpt = {
    .vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};

static cddp_model *gpt(void) {
    cddp_error err = {0};
    cddp_model *m = cddp_model_create_with(cddp_nn_gpt(&tiny_gpt), &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(cddp_model_build(m, 0), 0);
    return m;
}

/* Mean cross-entropy over every position of batch i, as nanoGPT computes it. */
static double gpt_loss(cddp_ctx *ctx, cddp_model *m, cddp_safetensors *f, int i) {
    char n[8];
    snprintf(n, sizeof n, "%d", i);
    const cddp_st_tensor *x = get(f, "x.", n), *y = get(f, "y.", n);
    assert_int_equal(x->dtype, CDDP_I64);
    assert_int_equal(y->dtype, CDDP_I64);
    cddp_ctx_reset(ctx);
    cddp_tensor *idx = cddp_wrap(ctx, CDDP_I64, x->ndim, x->shape, (void *)x->data);
    int64_t rows = x->shape[0] * x->shape[1];
    cddp_tensor *targets = cddp_wrap(ctx, CDDP_I64, 1, &rows, (void *)y->data);
    cddp_tensor *logits = cddp_model_forward(m, ctx, idx);
    assert_non_null(logits);
    assert_int_equal(logits->ndim, 3);
    assert_int_equal(logits->shape[2], tiny_gpt.vocab_size);
    int64_t flat[2] = {rows, tiny_gpt.vocab_size};
    cddp_tensor *loss =
        cddp_cross_entropy(ctx, cddp_reshape(ctx, logits, 2, flat), targets, CDDP_REDUCE_MEAN);
    cddp_model_zero_grad(m);
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    return cddp_get(loss, 0);
}

static void test_gpt_matches_pytorch(void **state) {
    (void)state;
    cddp_safetensors *f = fixture("gpt");
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    cddp_error err = {0};

    /* The tied head is one parameter, transformer.wte.weight, as in PyTorch's named_parameters,
     * with lm_head.weight its second name. */
    cddp_model *m = gpt();
    assert_int_equal(cddp_model_num_ties(m), 1);
    const char *tied;
    assert_ptr_equal(cddp_model_tie(m, 0, &tied), cddp_model_find(m, "transformer.wte.weight"));
    assert_string_equal(tied, "lm_head.weight");
    assert_ptr_equal(cddp_model_find(m, "lm_head.weight"), cddp_model_tie(m, 0, NULL));
    load_init(m, f);
    assert_close(gpt_loss(ctx, m, f, 0), ((const float *)get(f, "loss.", "grad")->data)[0], RTOL,
                 0);
    compare_params(m, f, "grad.", true);
    cddp_model_destroy(m);

    /* Three steps of GPT-2's recipe. */
    m = gpt();
    load_init(m, f);
    cddp_adamw_options aw = cddp_adamw_defaults(1e-3f);
    aw.beta2 = 0.95f;
    aw.eps = 1e-5f;
    aw.weight_decay = 0.1f;
    aw.decay_matrices_only = true;
    cddp_optim *opt = cddp_optim_adamw(m, &aw, &err);
    assert_non_null(opt);
    const float *losses = get(f, "loss.", "adamw")->data;
    for (int i = 0; i < 3; i++) {
        cddp_optim_set_lr(opt, cddp_lr_warmup_cosine(i, 1e-3f, 1e-4f, 2, 3));
        assert_close(gpt_loss(ctx, m, f, i), losses[i], RTOL, 0);
        double norm = cddp_clip_grad_norm(m, 1.0);
        assert_true(norm > 0);
        cddp_optim_step(opt);
    }
    compare_params(m, f, "adamw.", false);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    cddp_ctx_destroy(ctx);
    cddp_safetensors_destroy(f);
}

/* `test_reference --write-gpt DIR`: the tiny GPT after the 3 steps above, saved as a checkpoint
 * (DIR/gpt_checkpoint.safetensors, with the optimizer's state; and as a set of 3 shards in
 * DIR/gpt_sets) and its logits on batch 1
 * (DIR/gpt_logits.safetensors), for check_gpt_load.py to load into PyTorch's GPT strictly. */
static int write_gpt(const char *dir) {
    cddp_safetensors *f = fixture("gpt");
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    cddp_error err = {0};
    cddp_model *m = gpt();
    load_init(m, f);
    cddp_adamw_options aw = cddp_adamw_defaults(1e-3f);
    aw.decay_matrices_only = true;
    cddp_optim *opt = cddp_optim_adamw(m, &aw, &err);
    for (int i = 0; i < 3; i++) {
        gpt_loss(ctx, m, f, i);
        cddp_optim_step(opt);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/gpt_checkpoint.safetensors", dir);
    const char *meta[] = {"n_layer", "2", "n_head", "2", "n_embd", "32", NULL};
    int rc = cddp_checkpoint_save(path, m, opt, meta, &err);
    /* The same as a set of 3 shards of uneven sizes (DIR/gpt_sets/step-00000003). */
    char sets[4096], set[4200];
    snprintf(sets, sizeof sets, "%s/gpt_sets", dir);
    int64_t n = (int64_t)cddp_model_numel(m), cut[] = {0, n / 5, n / 2, n};
    cddp_ckpt_shard shards[3];
    if (rc == CDDP_OK) rc = cddp_ckpt_set_prepare(sets, 3, set, sizeof set, &err);
    for (int r = 0; r < 3 && rc == CDDP_OK; r++)
        rc = cddp_ckpt_set_write_shard(set, r, 3, m, opt, 1, cut + r, &shards[r], &err);
    if (rc == CDDP_OK) rc = cddp_ckpt_set_commit(set, 3, m, opt, shards, meta, 0, &err);
    const cddp_st_tensor *x = get(f, "x.", "1");
    cddp_ctx_reset(ctx);
    cddp_tensor *logits =
        cddp_model_forward(m, ctx, cddp_wrap(ctx, CDDP_I64, x->ndim, x->shape, (void *)x->data));
    cddp_st_tensor out = {.name = "logits", .dtype = CDDP_F32, .ndim = 3, .data = logits->data};
    memcpy(out.shape, logits->shape, sizeof(int64_t) * 3);
    snprintf(path, sizeof path, "%s/gpt_logits.safetensors", dir);
    if (rc == CDDP_OK) rc = cddp_safetensors_write(path, &out, 1, NULL, &err);
    if (rc != CDDP_OK) fprintf(stderr, "test_reference: %s\n", err.msg);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    cddp_ctx_destroy(ctx);
    cddp_safetensors_destroy(f);
    return rc == CDDP_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-gpt") == 0) return write_gpt(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_matches_pytorch),
        cmocka_unit_test(test_cnn_matches_pytorch),
        cmocka_unit_test(test_resnet_layouts_match_pytorch),
        cmocka_unit_test(test_gpt_matches_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
