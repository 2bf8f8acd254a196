/* test_recompute.c: activation checkpointing (cddp_recompute, cddp_model_recompute_blocks) against
 * the same model without it: the loss and every parameter's gradient bit for bit (the GPT and the
 * Llama, a segment that draws a dropout mask, segments inside segments), each parameter's ready
 * hook once per backward and never before its gradient is whole, the step's memory (on the CPU),
 * a failure inside a segment named, and gradients disabled; on the test device (helpers.h). */
#include "helpers.h"

enum { B = 2, T = 16, V = 64 };

/* A GPT (or a Llama) of 3 blocks, width 32, built from seed 5 on the test device. */
static cddp_model *make(bool llama) {
    cddp_error err = {0};
    cddp_module *root;
    if (llama) {
        cddp_llama_config c = {.vocab_size = V,
                               .max_positions = T,
                               .n_layer = 3,
                               .n_head = 4,
                               .n_embd = 32,
                               .intermediate_size = 48,
                               .n_kv_head = 2,
                               .rope_theta = 10000,
                               .rms_norm_eps = 1e-5f};
        root = cddp_nn_llama(&c);
    } else {
        cddp_gpt_config c = {
            .vocab_size = V, .block_size = T, .n_layer = 3, .n_head = 4, .n_embd = 32};
        root = cddp_nn_gpt(&c);
    }
    cddp_model *m = cddp_model_create_with(root, &err);
    assert_non_null(m);
    assert_int_equal(cddp_model_build(m, 5), CDDP_OK);
    return test_model_to(m);
}

/* One forward and backward of the batch every test uses; the loss. */
static double step(cddp_model *m, cddp_ctx *ctx) {
    int64_t x[B * T], y[B * T], rows = B * T;
    for (int i = 0; i < B * T; i++) x[i] = (i * 7 + 3) % V, y[i] = (i * 5 + 1) % V;
    cddp_model_zero_grad(m);
    cddp_tensor *logits =
        cddp_model_forward(m, ctx, cddp_from_data(ctx, CDDP_I64, 2, (int64_t[]){B, T}, x));
    cddp_tensor *loss =
        cddp_cross_entropy(ctx, cddp_reshape(ctx, logits, 2, (int64_t[]){rows, V}),
                           cddp_from_data(ctx, CDDP_I64, 1, &rows, y), CDDP_REDUCE_MEAN);
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    return cddp_item(loss);
}

static void same_gradients(cddp_model *a, cddp_model *b, const char *what) {
    int64_t n = (int64_t)cddp_model_numel(a);
    const float *ga = host_f32(cddp_model_device(a), cddp_model_grad(a), n);
    const float *gb = host_f32(cddp_model_device(b), cddp_model_grad(b), n);
    for (int64_t e = 0; e < n; e++)
        if (memcmp(&ga[e], &gb[e], sizeof(float)) != 0)
            fail_msg("%s: gradient %lld is %.9g recomputed, %.9g kept", what, (long long)e,
                     (double)gb[e], (double)ga[e]);
    host_release();
}

/* The arena memory a step took at most, the scratch's included (the CPU: its arena holds the
 * tensors). */
static size_t high_water(cddp_ctx *ctx) {
    return cddp_arena_high_water(cddp_ctx_arena(ctx)) +
           cddp_arena_high_water(cddp_ctx_arena(cddp_ctx_scratch(ctx)));
}

static void blocks_recomputed(bool llama) {
    cddp_model *kept = make(llama), *again = make(llama);
    assert_int_equal(cddp_model_recompute_blocks(again, true), 3);
    cddp_ctx *c1 = test_ctx(1), *c2 = test_ctx(1);
    double l1 = step(kept, c1), l2 = step(again, c2);
    assert_memory_equal(&l1, &l2, sizeof l1);
    same_gradients(kept, again, llama ? "the Llama" : "the GPT");
    /* a second step on the same contexts: the scratch reused */
    cddp_ctx_reset(c1);
    cddp_ctx_reset(c2);
    l1 = step(kept, c1);
    l2 = step(again, c2);
    assert_memory_equal(&l1, &l2, sizeof l1);
    same_gradients(kept, again, "the second step");
    if (test_device_in_order()) { /* what the step kept: each block's input, not its insides */
        size_t k = high_water(c1), r = high_water(c2);
        if (!(r < k * 3 / 4))
            fail_msg("recomputing the blocks took %zu bytes of arena at most, keeping them %zu", r,
                     k);
    }
    assert_int_equal(cddp_model_recompute_blocks(again, false), 3);
    cddp_ctx_destroy(c1);
    cddp_ctx_destroy(c2);
    cddp_model_destroy(kept);
    cddp_model_destroy(again);
}

static void test_gpt_blocks_recomputed_bit_for_bit(void **state) {
    (void)state;
    blocks_recomputed(false);
}

static void test_llama_layers_recomputed_bit_for_bit(void **state) {
    (void)state;
    blocks_recomputed(true);
}

/* Ready hooks: once per parameter, and a parameter's gradient is whole when its hook fires. */
typedef struct seen {
    int fired[64];
    float first[64]; /* its gradient's first element when the hook fired */
} seen;

static void on_ready(void *user, cddp_tensor *p) {
    seen *s = user;
    s->fired[p->param_index]++;
    s->first[p->param_index] = (float)cddp_get(&(cddp_tensor){.dtype = CDDP_F32,
                                                              .ndim = 1,
                                                              .shape = {1},
                                                              .numel = 1,
                                                              .data = p->grad,
                                                              .device = p->device},
                                               0);
}

static void test_ready_hooks_fire_once_when_whole(void **state) {
    (void)state;
    cddp_model *m = make(false);
    assert_true(cddp_model_num_params(m) <= 64);
    assert_int_equal(cddp_model_recompute_blocks(m, true), 3);
    seen s = {{0}, {0}};
    cddp_model_set_ready_hook(m, on_ready, &s);
    cddp_ctx *ctx = test_ctx(1);
    step(m, ctx);
    int64_t n = (int64_t)cddp_model_numel(m);
    const float *g = host_f32(cddp_model_device(m), cddp_model_grad(m), n);
    for (int i = 0; i < cddp_model_num_params(m); i++) {
        cddp_tensor *p = cddp_model_param(m, i);
        if (s.fired[i] != 1)
            fail_msg("%s's hook fired %d times in one backward", p->name, s.fired[i]);
        float final = g[cddp_model_param_offset(m, i)];
        if (memcmp(&final, &s.first[i], sizeof final) != 0)
            fail_msg("%s's hook fired before its gradient was whole (%.9g, then %.9g)", p->name,
                     (double)s.first[i], (double) final);
    }
    host_release();
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

/* A segment of our own: dropout(relu(x W^T + b)), and inside it a second segment. */
typedef struct seg {
    cddp_tensor *w, *b;
    bool nested;
} seg;

static cddp_tensor *inner(void *user, cddp_ctx *ctx, cddp_tensor *x) {
    const seg *s = user;
    return cddp_dropout(ctx, cddp_relu(ctx, cddp_linear(ctx, x, s->w, s->b)), 0.5f, true);
}

static cddp_tensor *outer(void *user, cddp_ctx *ctx, cddp_tensor *x) {
    seg *s = user;
    cddp_tensor *h = s->nested ? cddp_recompute(ctx, inner, s, x) : inner(s, ctx, x);
    return cddp_scale(ctx, h, 2.0f);
}

/* The gradients of w, b and x through outer (recomputed or not, nested or not). */
static void own_segment(bool recompute, bool nested, float *out) {
    cddp_model *m = cddp_model_create();
    int wi, bi;
    assert_int_equal(cddp_model_add_param(m, "w", 2, (int64_t[]){8, 8},
                                          (cddp_init){CDDP_INIT_UNIFORM, -0.5f, 0.5f}, &wi),
                     CDDP_OK);
    assert_int_equal(cddp_model_add_param(m, "b", 1, (int64_t[]){8},
                                          (cddp_init){CDDP_INIT_UNIFORM, -0.5f, 0.5f}, &bi),
                     CDDP_OK);
    assert_int_equal(cddp_model_build(m, 3), CDDP_OK);
    test_model_to(m);
    cddp_ctx *ctx = test_ctx(9);
    seg s = {cddp_model_param(m, wi), cddp_model_param(m, bi), nested};
    float xs[4 * 8];
    for (int i = 0; i < 4 * 8; i++) xs[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    cddp_tensor *x =
        cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){4, 8}, xs));
    cddp_tensor *y = recompute ? cddp_recompute(ctx, outer, &s, x) : outer(&s, ctx, x);
    cddp_tensor *t = cddp_dropout(ctx, y, 0.25f, true); /* a draw after the segment's */
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, t)), CDDP_OK);
    memcpy(out, host_f32(test_device(), cddp_model_grad(m), 72), 72 * sizeof(float));
    memcpy(out + 72, host_f32(test_device(), x->grad, 32), 32 * sizeof(float));
    host_release();
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

static void test_own_segment_with_dropout_and_nesting(void **state) {
    (void)state;
    float kept[104], again[104], nested[104];
    own_segment(false, false, kept);
    own_segment(true, false, again);
    own_segment(true, true, nested);
    int zeros = 0;
    for (int i = 0; i < 104; i++) zeros += kept[i] == 0.0f;
    assert_true(zeros > 0 && zeros < 104); /* the masks did drop some */
    assert_memory_equal(kept, again, sizeof kept);
    assert_memory_equal(kept, nested, sizeof kept);
}

static cddp_tensor *broken(void *user, cddp_ctx *ctx, cddp_tensor *x) {
    (void)user, (void)x;
    cddp_ctx_fail(ctx, CDDP_EINVAL, "the segment's own words");
    return NULL;
}

static cddp_tensor *plain(void *user, cddp_ctx *ctx, cddp_tensor *x) {
    (void)user;
    return cddp_scale(ctx, x, 3.0f);
}

static void test_failure_named_and_grad_disabled(void **state) {
    (void)state;
    cddp_ctx *ctx = test_ctx(1);
    float v[4] = {1, 2, 3, 4};
    cddp_tensor *x = cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, 1, (int64_t[]){4}, v));
    assert_null(cddp_recompute(ctx, broken, NULL, x));
    assert_true(cddp_ctx_failed(ctx));
    assert_non_null(strstr(cddp_ctx_error(ctx), "a checkpointed segment: the segment's own words"));
    cddp_ctx_reset(ctx);
    /* gradients disabled: the segment on the scratch, its output copied, nothing recorded */
    x = cddp_from_data(ctx, CDDP_F32, 1, (int64_t[]){4}, v);
    bool was = cddp_ctx_set_grad_enabled(ctx, false);
    cddp_tensor *y = cddp_recompute(ctx, plain, NULL, x);
    cddp_ctx_set_grad_enabled(ctx, was);
    assert_non_null(y);
    assert_null(y->node);
    assert_true(cddp_get(y, 3) == 12.0);
    assert_int_equal(cddp_ctx_tape_length(ctx), 0);
    cddp_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_blocks_recomputed_bit_for_bit),
        cmocka_unit_test(test_llama_layers_recomputed_bit_for_bit),
        cmocka_unit_test(test_ready_hooks_fire_once_when_whole),
        cmocka_unit_test(test_own_segment_with_dropout_and_nesting),
        cmocka_unit_test(test_failure_named_and_grad_disabled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
