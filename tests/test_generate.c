/* test_generate.c: text from a GPT (cddp_gpt_generate) on the test device (helpers.h): the key/
 * value cache draws the same tokens as recomputing the whole context, before and after the text
 * outgrows block_size, with every kind of draw; the callback sees each token; the model and the
 * context are left as they were; bad arguments are refused with the reason. */
#include "helpers.h"

enum { V = 40, BLOCK = 12 };

static const cddp_gpt_config config = {
    .vocab_size = V, .block_size = BLOCK, .n_layer = 2, .n_head = 2, .n_embd = 16};

static cddp_model *gpt(void) {
    cddp_error err = {0};
    cddp_model *m = cddp_model_create_with(cddp_nn_gpt(&config), &err);
    assert_non_null(m);
    assert_int_equal(cddp_model_build(m, 11), CDDP_OK);
    /* Larger weights than GPT-2's start (N(0, 0.02)), so that the draws are far from uniform. */
    size_t n = cddp_model_numel(m);
    float *w = cddp_model_data(m);
    cddp_rng rng;
    cddp_rng_seed(&rng, 3);
    for (size_t i = 0; i < n; i++) w[i] = (float)(0.3 * cddp_rng_normal(&rng));
    return test_model_to(m);
}

typedef struct seen {
    int64_t tokens[64];
    int n;
} seen;

static void on_token(int64_t token, void *user) {
    seen *s = user;
    if (s->n < 64) s->tokens[s->n] = token;
    s->n++;
}

/* n tokens after prompt, drawn with seed; with the cache or without. */
static void generate(cddp_model *m, cddp_ctx *ctx, const int64_t *prompt, int64_t np, int64_t n,
                     cddp_gpt_sampling s, bool cache, int64_t *out) {
    cddp_error err = {0};
    cddp_rng rng;
    cddp_rng_seed(&rng, 99);
    s.no_cache = !cache;
    int rc = cddp_gpt_generate(m, ctx, prompt, np, n, &s, &rng, out, &err);
    if (rc != CDDP_OK) fail_msg("cddp_gpt_generate: %s", err.msg);
}

static void test_cache_draws_the_same_tokens(void **state) {
    (void)state;
    cddp_model *m = gpt();
    cddp_ctx *ctx = test_ctx(1);
    const int64_t prompt[15] = {1, 5, 9, 2, 33, 7, 0, 39, 12, 4, 4, 18, 26, 3, 8};
    const cddp_gpt_sampling draws[] = {{.temperature = 1.0f},
                                       {.temperature = 0.7f, .top_k = 5},
                                       {.temperature = 0.0f},
                                       {.temperature = 1.3f, .top_k = 1}};
    int64_t np[] = {1, 3, 15}; /* 15: a prompt longer than the block, cropped */
    for (size_t d = 0; d < sizeof draws / sizeof draws[0]; d++)
        for (size_t p = 0; p < 3; p++) {
            int64_t with[40], without[40];
            generate(m, ctx, prompt, np[p], 40, draws[d], true, with); /* past block_size */
            generate(m, ctx, prompt, np[p], 40, draws[d], false, without);
            for (int i = 0; i < 40; i++) {
                if (with[i] != without[i])
                    fail_msg("draw %zu, prompt of %lld: token %d is %lld with the cache, %lld "
                             "without",
                             d, (long long)np[p], i, (long long)with[i], (long long)without[i]);
                assert_true(with[i] >= 0 && with[i] < V);
            }
        }
    /* The draws are not all one token: the test compares something. */
    int64_t t[40];
    generate(m, ctx, prompt, 3, 40, draws[0], true, t);
    int distinct = 0;
    for (int i = 0; i < 40; i++) {
        bool before = false;
        for (int j = 0; j < i; j++) before |= t[j] == t[i];
        distinct += !before;
    }
    assert_true(distinct >= 5);
    /* top_k 1 is the greedy draw. */
    int64_t g[40], k1[40];
    generate(m, ctx, prompt, 3, 40, draws[2], true, g);
    generate(m, ctx, prompt, 3, 40, draws[3], true, k1);
    assert_memory_equal(g, k1, sizeof g);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

static void test_tokens_reach_the_callback(void **state) {
    (void)state;
    cddp_model *m = gpt();
    seen s = {0};
    cddp_gpt_sampling opt = cddp_gpt_sampling_defaults();
    opt.on_token = on_token;
    opt.user = &s;
    int64_t out[20], prompt[] = {7};
    cddp_error err = {0};
    cddp_model_set_training(m, true);
    /* its own context (NULL) and generator (NULL) */
    assert_int_equal(cddp_gpt_generate(m, NULL, prompt, 1, 20, &opt, NULL, out, &err), CDDP_OK);
    assert_int_equal(s.n, 20);
    assert_memory_equal(s.tokens, out, sizeof out);
    assert_true(cddp_model_training(m));
    /* with a context: its gradients as they were */
    cddp_ctx *ctx = test_ctx(1);
    assert_true(cddp_ctx_grad_enabled(ctx));
    int64_t again[20];
    assert_int_equal(cddp_gpt_generate(m, ctx, prompt, 1, 20, &opt, NULL, again, &err), CDDP_OK);
    assert_memory_equal(again, out, sizeof out); /* the same seed: the same text */
    assert_true(cddp_ctx_grad_enabled(ctx));
    cddp_gpt_config g;
    assert_int_equal(cddp_model_gpt_config(m, &g), CDDP_OK);
    assert_memory_equal(&g, &config, sizeof g);
    /* stopping at a token (an end of text): the same text up to its first place, then -1 */
    opt.stop = true;
    opt.stop_token = out[5];
    s.n = 0;
    assert_int_equal(cddp_gpt_generate(m, ctx, prompt, 1, 20, &opt, NULL, again, &err), CDDP_OK);
    int first = 0;
    while (out[first] != out[5]) first++;
    assert_int_equal(s.n, first + 1);
    assert_memory_equal(again, out, sizeof(int64_t) * (size_t)(first + 1));
    for (int j = first + 1; j < 20; j++) assert_int_equal(again[j], -1);
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
}

static void expect_refused(cddp_model *m, cddp_ctx *ctx, const int64_t *prompt, int64_t np,
                           int64_t n, const cddp_gpt_sampling *s, const char *why) {
    cddp_error err = {0};
    int64_t out[4];
    assert_int_equal(cddp_gpt_generate(m, ctx, prompt, np, n, s, NULL, out, &err), CDDP_EINVAL);
    if (!strstr(err.msg, why)) fail_msg("'%s' does not say '%s'", err.msg, why);
}

static void test_bad_arguments(void **state) {
    (void)state;
    cddp_model *m = gpt();
    int64_t ok[] = {1, 2}, outside[] = {1, V}, negative[] = {-1};
    expect_refused(m, NULL, ok, 0, 4, NULL, "at least one token");
    expect_refused(m, NULL, outside, 2, 4, NULL,
                   "prompt token 1 is 40, outside the model's vocabulary of 40");
    expect_refused(m, NULL, negative, 1, 4, NULL, "prompt token 0 is -1");
    cddp_gpt_sampling stop = {.temperature = 1, .stop = true, .stop_token = V};
    expect_refused(m, NULL, ok, 2, 4, &stop, "stop token");
    expect_refused(m, NULL, ok, 2, 4, &(cddp_gpt_sampling){.temperature = -1}, "temperature");
    expect_refused(m, NULL, ok, 2, 4, &(cddp_gpt_sampling){.temperature = 1, .top_k = -2}, "top_k");
    expect_refused(m, NULL, ok, 2, -1, NULL, "tokens to generate");
    expect_refused(m, NULL, ok, 2, ((int64_t)1 << 40) + 1, NULL, "at most 2^40"); /* no overflow */
    /* a context on another device than the model's */
    cddp_error err = {0};
    cddp_device *other = cddp_device_get(test_device() == cddp_device_cpu() ? "emu" : "cpu", &err);
    assert_non_null(other);
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = other});
    expect_refused(m, ctx, ok, 2, 4, NULL, "the context is on");
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
    /* a model without a GPT */
    cddp_model *mlp = cddp_model_create();
    cddp_model_add(mlp, "fc", cddp_nn_linear(4, 4));
    assert_int_equal(cddp_model_build(mlp, 0), CDDP_OK);
    expect_refused(mlp, NULL, ok, 2, 4, NULL, "holds no GPT");
    cddp_gpt_config g;
    assert_int_equal(cddp_model_gpt_config(mlp, &g), CDDP_EINVAL);
    cddp_model_destroy(mlp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_draws_the_same_tokens),
        cmocka_unit_test(test_tokens_reach_the_callback),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
