/* model_check.c OUTDIR CASE...: cddp's Llama against transformers' LlamaForCausalLM, on the
 * models tests/llama/make_model.py saved (each OUTDIR/CASE: model.safetensors, config.json,
 * reference.safetensors): the shape from config.json (cddp_llama_config_read), the weights by
 * their names from the folder (cddp_model_load_hf: one file or shards, float32, bfloat16 or
 * float16), then the logits of a batch, the cross-entropy loss and the
 * gradient of every parameter within 1e-5 relative of transformers' (the largest difference over a
 * tensor against its largest value), on the CPU and the emulated device; and the config.json
 * fields of OUTDIR/refusals refused naming them. */
#include <cddp/cddp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static void close_to(const char *what, const char *dir, cddp_device *dev, const float *got,
                     const float *want, int64_t n) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    if (!(diff <= 1e-5 * scale)) {
        printf("FAIL: %s %s on %s: %.3g from transformers' (scale %.3g)\n", dir, what,
               cddp_device_name(dev), diff, scale);
        failures++;
    }
}

/* t's n floats (on dev) as a host copy (malloc'd). */
static float *host(cddp_device *dev, const float *t, int64_t n) {
    float *h = malloc(sizeof(float) * (size_t)n);
    cddp_error err = {0};
    if (!h || !t || cddp_device_download(dev, h, t, sizeof(float) * (size_t)n, &err)) {
        printf("FAIL: cannot read a tensor back: %s\n", err.msg);
        exit(1);
    }
    return h;
}

static void check(const char *dir, cddp_device *dev) {
    char path[4200];
    cddp_error err = {0};
    cddp_llama_config g;
    if (cddp_llama_config_read(dir, &g, &err)) {
        printf("FAIL: %s\n", err.msg);
        failures++;
        return;
    }
    cddp_model *m = cddp_model_create_with(cddp_nn_llama(&g), &err);
    if (!m || cddp_model_build(m, 1) || cddp_model_to(m, dev, &err) ||
        cddp_model_load_hf(m, dir, &err)) {
        printf("FAIL: %s: the model: %s %s\n", dir, err.msg, m ? cddp_model_error(m) : "");
        failures++;
        cddp_model_destroy(m);
        return;
    }
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    cddp_safetensors *ref = cddp_safetensors_read(path, &err);
    if (!ref) {
        printf("FAIL: %s\n", err.msg);
        exit(1);
    }
    const cddp_st_tensor *x = cddp_safetensors_find(ref, "x"), *y = cddp_safetensors_find(ref, "y");
    const cddp_st_tensor *want = cddp_safetensors_find(ref, "logits");
    const cddp_st_tensor *loss_ref = cddp_safetensors_find(ref, "loss");
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    cddp_model_set_training(m, true);
    cddp_model_zero_grad(m);
    cddp_tensor *logits =
        cddp_model_forward(m, ctx, cddp_from_host(ctx, CDDP_I64, 2, x->shape, (void *)x->data));
    int64_t rows = x->shape[0] * x->shape[1], V = g.vocab_size;
    cddp_tensor *flat = cddp_reshape(ctx, logits, 2, (int64_t[]){rows, V});
    cddp_tensor *labels = cddp_from_host(ctx, CDDP_I64, 1, &rows, (void *)y->data);
    cddp_tensor *loss = cddp_cross_entropy(ctx, flat, labels, CDDP_REDUCE_MEAN);
    if (!loss || cddp_backward(ctx, loss) != CDDP_OK) {
        printf("FAIL: %s on %s: %s\n", dir, cddp_device_name(dev), cddp_ctx_error(ctx));
        failures++;
    } else {
        float *got = host(dev, logits->data, logits->numel);
        close_to("logits", dir, dev, got, want->data, logits->numel);
        free(got);
        double l = cddp_item(loss), lr = ((const float *)loss_ref->data)[0];
        if (!(fabs(l - lr) <= 1e-5 * fabs(lr))) {
            printf("FAIL: %s loss %.8f, transformers' %.8f\n", dir, l, lr);
            failures++;
        }
        int checked = 0;
        for (int i = 0; i < cddp_model_num_params(m); i++) {
            cddp_tensor *p = cddp_model_param(m, i);
            char key[256];
            snprintf(key, sizeof key, "grad.%s", p->name);
            const cddp_st_tensor *r = cddp_safetensors_find(ref, key);
            if (!r) {
                printf("FAIL: %s: no gradient of %s in the reference\n", dir, p->name);
                failures++;
                continue;
            }
            float *gr = host(dev, p->grad, p->numel);
            close_to(key, dir, dev, gr, r->data, p->numel);
            free(gr);
            checked++;
        }
        /* greedy generation, token for token as transformers' generate(do_sample=False) */
        const cddp_st_tensor *gen = cddp_safetensors_find(ref, "gen");
        int64_t prompt[3] = {1, 2, 3}, drawn[12];
        for (int nc = 0; nc < 2; nc++) { /* with the key/value cache, and recomputing the text */
            cddp_gpt_sampling s = {.temperature = 0, .no_cache = nc};
            if (!gen ||
                cddp_gpt_generate(m, ctx, prompt, 3, 12, &s, NULL, drawn, &err) != CDDP_OK ||
                memcmp(drawn, (const int64_t *)gen->data + 3, sizeof drawn) != 0) {
                printf("FAIL: %s on %s%s: greedy tokens differ from transformers' generate: %s\n",
                       dir, cddp_device_name(dev), nc ? " without the cache" : "", err.msg);
                failures++;
            }
        }
        printf("%s on %s: logits, loss %.6f, %d gradients and 12 greedy tokens compared\n", dir,
               cddp_device_name(dev), l, checked);
    }
    cddp_ctx_destroy(ctx);
    cddp_safetensors_destroy(ref);
    cddp_model_destroy(m);
}

/* The model of OUT/name exported (cddp_model_save_hf, cddp_llama_config_write) to OUT/to in
 * dtype, for check_export.py to open with transformers. */
static void export(const char *out, const char *name, const char *to, cddp_dtype dtype) {
    char from[4200], dir[4200];
    snprintf(from, sizeof from, "%s/%s", out, name);
    snprintf(dir, sizeof dir, "%s/%s", out, to);
    cddp_error err = {0};
    cddp_llama_config g;
    cddp_model *m = cddp_llama_config_read(from, &g, &err)
                        ? NULL
                        : cddp_model_create_with(cddp_nn_llama(&g), &err);
    if (!m || cddp_model_build(m, 1) || cddp_model_load_hf(m, from, &err) ||
        cddp_model_save_hf(m, dir, dtype, &err) || cddp_llama_config_write(&g, dir, dtype, &err)) {
        printf("FAIL: exporting %s: %s\n", from, err.msg);
        failures++;
    }
    cddp_model_destroy(m);
}

/* Each config.json of OUT/refusals (a line: the folder, a tab, the words) refused with its words.
 */
static void refusals(const char *out) {
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/refusals", out);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab++ = '\0';
        tab[strcspn(tab, "\n")] = '\0';
        snprintf(path, sizeof path, "%s/%s", out, line);
        cddp_llama_config g;
        cddp_error err = {0};
        if (cddp_llama_config_read(path, &g, &err) == CDDP_OK || !strstr(err.msg, tab)) {
            printf("FAIL: %s: %s, where it should say '%s'\n", path, err.msg[0] ? err.msg : "read",
                   tab);
            failures++;
        }
        n++;
    }
    if (f) fclose(f);
    if (n < 8) {
        printf("FAIL: %d refusals in %s/refusals, expected 8\n", n, out);
        failures++;
    }
    printf("%d config.json fields that cddp does not compute refused by name\n", n);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: model_check OUTDIR CASE... (from make_model.py OUTDIR)\n");
        return 2;
    }
    cddp_error err = {0};
    cddp_device *devs[2] = {cddp_device_cpu(), cddp_device_get("emu", &err)};
    char dir[4096];
    for (int a = 2; a < argc; a++)
        for (int d = 0; d < 2; d++) {
            snprintf(dir, sizeof dir, "%s/%s", argv[1], argv[a]);
            check(dir, devs[d]);
        }
    refusals(argv[1]);
    export(argv[1], "gqa", "export_gqa", CDDP_F32);
    export(argv[1], "mqa", "export_mqa", CDDP_F32);
    export(argv[1], "gqa", "export_bf16", CDDP_BF16);
    /* another model's weights (2 key/value heads into a model of 1): refused naming the tensor */
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/mqa", argv[1]);
    snprintf(b, sizeof b, "%s/gqa", argv[1]);
    cddp_llama_config g;
    cddp_model *m = cddp_llama_config_read(a, &g, &err)
                        ? NULL
                        : cddp_model_create_with(cddp_nn_llama(&g), &err);
    if (!m || cddp_model_build(m, 1) || cddp_model_load_hf(m, b, &err) == CDDP_OK ||
        !strstr(err.msg, "model.layers.0.self_attn.k_proj.weight is (16,32), the model's (8,32)")) {
        printf("FAIL: gqa's weights into mqa's model: %s\n", err.msg);
        failures++;
    }
    cddp_model_destroy(m);
    printf("%s\n", failures ? "FAILED" : "ok: logits, loss and gradients as transformers' Llama");
    return failures ? 1 : 0;
}
