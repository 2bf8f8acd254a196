/* weights_check.c DIR: a GPT's weights in the layouts of tests/reference/make_gpt_weights.py load
 * (cddp_gpt_config_read, cddp_gpt_load_weights) and give PyTorch's logits within 1e-5 relative,
 * on the CPU and the emulated device; the wrong files are refused with the reason (both shapes,
 * or the config.json field that asks for another computation), and leave the model as it was. */
#include <cddp/cddp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cddp_gpt_config want = {
    .vocab_size = 100, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
static int failures;
static char dir[4096];

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL: " __VA_ARGS__);                                                              \
        printf("\n");                                                                              \
        failures++;                                                                                \
    } while (0)

static const char *at(const char *name) {
    static char path[2][4200];
    static int k;
    k ^= 1;
    snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
    return path[k];
}

static cddp_model *gpt_on(cddp_device *dev) {
    cddp_error err = {0};
    cddp_model *m = cddp_model_create_with(cddp_nn_gpt(&want), &err);
    if (!m || cddp_model_build(m, 1) || cddp_model_to(m, dev, &err)) {
        printf("FAIL: a GPT on %s: %s\n", cddp_device_name(dev), err.msg);
        exit(1);
    }
    return m;
}

/* The model's flat parameters on the host (numel floats, malloc'd). */
static float *params(cddp_model *m) {
    size_t n = cddp_model_numel(m);
    float *p = malloc(n * sizeof(float));
    cddp_error err = {0};
    if (!p || cddp_device_download(cddp_model_device(m), p, cddp_model_data(m), n * 4, &err))
        exit(1);
    return p;
}

static void good(const char *name, int64_t n_head, const char *logits_key, cddp_device *dev) {
    cddp_error err = {0};
    cddp_gpt_config g = {.n_head = n_head};
    if (cddp_gpt_config_read(at(name), &g, &err)) {
        FAIL("%s: %s", name, err.msg);
        return;
    }
    if (memcmp(&g, &want, sizeof g)) {
        FAIL("%s: read as vocab %lld, block %lld, %lld layers, %lld heads, width %lld", name,
             (long long)g.vocab_size, (long long)g.block_size, (long long)g.n_layer,
             (long long)g.n_head, (long long)g.n_embd);
        return;
    }
    cddp_model *m = gpt_on(dev);
    if (cddp_gpt_load_weights(m, at(name), &err)) {
        FAIL("%s: %s", name, err.msg);
        cddp_model_destroy(m);
        return;
    }
    cddp_safetensors *batch = cddp_safetensors_read(at("batch.safetensors"), &err);
    const cddp_st_tensor *x = batch ? cddp_safetensors_find(batch, "x") : NULL,
                         *y = batch ? cddp_safetensors_find(batch, logits_key) : NULL;
    if (!x || !y) exit(1);
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    cddp_model_set_training(m, false);
    cddp_tensor *logits =
        cddp_model_forward(m, ctx, cddp_from_host(ctx, CDDP_I64, 2, x->shape, (void *)x->data));
    int64_t n = y->shape[0] * y->shape[1] * y->shape[2];
    float *got = malloc(sizeof(float) * (size_t)n);
    if (!logits || logits->numel != n ||
        cddp_device_download(dev, got, logits->data, sizeof(float) * (size_t)n, &err)) {
        FAIL("%s: no logits: %s", name, cddp_ctx_error(ctx));
    } else {
        const float *w = y->data;
        double diff = 0, scale = 0;
        for (int64_t i = 0; i < n; i++) {
            diff = fmax(diff, fabs((double)got[i] - w[i]));
            scale = fmax(scale, fabs((double)w[i]));
        }
        if (!(diff <= 1e-5 * scale))
            FAIL("%s on %s: logits differ from PyTorch's by %.3g (scale %.3g)", name,
                 cddp_device_name(dev), diff, scale);
        else
            printf("ok: %s on %s: PyTorch's logits within %.1e relative\n", name,
                   cddp_device_name(dev), diff / scale);
    }
    free(got);
    cddp_ctx_destroy(ctx);
    cddp_safetensors_destroy(batch);
    cddp_model_destroy(m);
}

/* path is refused (reading its shape when config, else loading into the reference GPT) with a
 * message holding every one of the words; the model keeps its weights. */
static void bad(const char *name, bool config, const char *const *words, int nwords) {
    cddp_error err = {0};
    cddp_model *m = gpt_on(cddp_device_cpu());
    float *before = params(m);
    int rc;
    if (config) {
        cddp_gpt_config g = {0};
        rc = cddp_gpt_config_read(at(name), &g, &err);
    } else {
        rc = cddp_gpt_load_weights(m, at(name), &err);
    }
    float *after = params(m);
    if (rc == CDDP_OK) {
        FAIL("%s was accepted", name);
    } else {
        for (int i = 0; i < nwords; i++)
            if (!strstr(err.msg, words[i]))
                FAIL("%s: '%s' does not say '%s'", name, err.msg, words[i]);
        printf("ok: %s refused: %s\n", name, err.msg);
    }
    if (memcmp(before, after, cddp_model_numel(m) * sizeof(float)))
        FAIL("%s: the refused file changed the model", name);
    free(before);
    free(after);
    cddp_model_destroy(m);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: weights_check DIR (from make_gpt_weights.py)\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    cddp_error err = {0};
    cddp_device *devs[] = {cddp_device_cpu(), cddp_device_get("emu", &err)};
    for (int d = 0; d < 2; d++) {
        good("hf/model.safetensors", 0, "logits", devs[d]);    /* n_head from config.json */
        good("hf_lm/model.safetensors", 4, "logits", devs[d]); /* n_head given */
        good("nanogpt.safetensors", 4, "logits", devs[d]);
        good("gpt2.bin", 0, "logits", devs[d]);
        good("gpt2_bf16.bin", 0, "logits_bf16", devs[d]);
        good("hf_bf16/model.safetensors", 0, "logits_bf16", devs[d]);
        good("hf_f16/model.safetensors", 0, "logits_f16", devs[d]);
        good("hf_sharded/model.safetensors.index.json", 0, "logits", devs[d]);
        good("hf_sharded", 0, "logits", devs[d]); /* the model's folder, as from_pretrained */
        good("hf", 0, "logits", devs[d]);
    }
    good("spelled_out/model.safetensors", 0, "logits", devs[0]); /* GPT-2's values, written out */
    /* a config.json field that changes the computation: refused by name, before any weight */
    bad("act_relu/model.safetensors", true, (const char *[]){"activation_function relu"}, 1);
    bad("ln_eps/model.safetensors", true, (const char *[]){"layer_norm_epsilon 1e-06"}, 1);
    bad("unscaled/model.safetensors", true,
        (const char *[]){"scale_attn_weights is not true", "1/sqrt(head size)"}, 2);
    bad("layer_scaled/model.safetensors", true,
        (const char *[]){"scale_attn_by_inverse_layer_idx is true"}, 1);
    bad("inner/model.safetensors", true, (const char *[]){"n_inner 64", "4 n_embd (128)"}, 2);
    bad("llama_type/model.safetensors", true, (const char *[]){"model_type llama"}, 1);
    bad("act_relu/model.safetensors", false, (const char *[]){"activation_function relu"}, 1);
    bad("sharded_missing/model.safetensors.index.json", true,
        (const char *[]){"names model-00002-of-00002.safetensors", "cannot open",
                         "a shard missing"},
        3);
    bad("sharded_wrong/model.safetensors.index.json", true,
        (const char *[]){"maps h.1.mlp.c_fc.weight to", "model-00001-of-00002.safetensors",
                         "which does not hold it"},
        3);
    bad("heads8/model.safetensors", false,
        (const char *[]){"config.json says 8 heads, but the model has 4"}, 1);
    bad("hf_lm/model.safetensors", true,
        (const char *[]){"how many heads", "none was given", "config.json", "--n_head"}, 4);
    bad("broken_config/model.safetensors", true,
        (const char *[]){"broken_config/config.json is not a JSON object", "give n_head"}, 2);
    bad("headless_config/model.safetensors", true,
        (const char *[]){"headless_config/config.json has no n_head"}, 1);
    bad("nan/model.safetensors", false,
        (const char *[]){"transformer.h.1.mlp.c_fc.weight holds 2 values that are NaN or infinite",
                         "the first, NaN, at element 160 of 4096", "diverged"},
        3);
    bad("hf_fc_linear/model.safetensors", false,
        (const char *[]){"h.1.mlp.c_fc.weight", "(128,32)", "(32,128)", "Conv1D"}, 4);
    bad("wide/model.safetensors", false, (const char *[]){"wte.weight", "(100,48)", "(100,32)"}, 3);
    bad("wide.bin", false, (const char *[]){"n_embd 48", "the model's is 32"}, 2);
    bad("extra/model.safetensors", false, (const char *[]){"h.2.", "2 layers"}, 2);
    bad("untied/model.safetensors", false, (const char *[]){"lm_head.weight", "ties"}, 2);
    bad("batch.safetensors", false, (const char *[]){"c_attn"}, 1);
    bad("wrong_magic.bin", true,
        (const char *[]){"not llm.c's model file (it starts with 20240327, not the magic 20240326)",
                         "nor a safetensors file"},
        2);
    bad("tokens.bin", true, (const char *[]){"is llm.c's token file (magic 20240520)"}, 1);
    printf("%s\n", failures ? "FAILED" : "ok: every layout loads and every wrong file is refused");
    return failures ? 1 : 0;
}
