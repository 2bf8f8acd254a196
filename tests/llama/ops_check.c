/* ops_check.c FILE: cddp's Llama ops against transformers' own modules, on what
 * tests/llama/make_ops.py wrote in FILE: cddp_rms_norm as LlamaRMSNorm (eps 1e-6 and 1e-5),
 * cddp_silu_mul as LlamaMLP's act_fn(gate) * up, cddp_rope as LlamaRotaryEmbedding with
 * apply_rotary_pos_emb (Llama 2's frequencies from position 0, Llama 3's scaled ones from 9000),
 * and cddp_qkv_pack then cddp_attention as grouped-query (4 heads, 2 key/value heads) and
 * multi-query attention through transformers' repeat_kv.
 * Each output and each input's gradient of sum(out * R) within 1e-5 relative (the largest
 * difference over a tensor against its largest value), on the CPU and the emulated device. */
#include <cddp/cddp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static cddp_safetensors *ref;

static const cddp_st_tensor *get(const char *name, const char *key) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", name, key);
    const cddp_st_tensor *t = cddp_safetensors_find(ref, full);
    if (!t) {
        printf("FAIL: the reference lacks %s\n", full);
        exit(1);
    }
    return t;
}

static int64_t numel(const cddp_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* A reference tensor on the context's device, its gradient kept when grad. */
static cddp_tensor *load(cddp_ctx *ctx, const char *name, const char *key, bool grad) {
    const cddp_st_tensor *t = get(name, key);
    cddp_tensor *x = cddp_from_host(ctx, CDDP_F32, t->ndim, t->shape, (void *)t->data);
    if (grad) cddp_requires_grad(ctx, x);
    return x;
}

/* got (n floats on dev) against the reference's name.key. */
static void compare(cddp_device *dev, const char *name, const char *key, const float *got_dev,
                    int64_t n) {
    const cddp_st_tensor *want = get(name, key);
    float *got = malloc(sizeof(float) * (size_t)n);
    cddp_error err = {0};
    if (!got_dev || n != numel(want) ||
        cddp_device_download(dev, got, got_dev, sizeof(float) * (size_t)n, &err) != CDDP_OK) {
        printf("FAIL: %s.%s on %s: nothing to compare (%s)\n", name, key, cddp_device_name(dev),
               err.msg);
        failures++;
        free(got);
        return;
    }
    const float *w = want->data;
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - w[i]));
        scale = fmax(scale, fabs((double)w[i]));
    }
    if (!(diff <= 1e-5 * scale)) {
        printf("FAIL: %s.%s on %s: %.3g from transformers' (scale %.3g)\n", name, key,
               cddp_device_name(dev), diff, scale);
        failures++;
    } else {
        printf("ok: %s.%s on %s within %.1e relative\n", name, key, cddp_device_name(dev),
               diff / scale);
    }
    free(got);
}

/* out's backward with R, then each (key, tensor) gradient compared. */
static void backward(cddp_ctx *ctx, const char *name, cddp_tensor *out) {
    cddp_tensor *R = load(ctx, name, "R", false);
    if (cddp_backward(ctx, cddp_sum(ctx, cddp_mul(ctx, out, R))) != CDDP_OK)
        printf("FAIL: %s: backward: %s\n", name, cddp_ctx_error(ctx)), failures++;
}

static void check(cddp_device *dev) {
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "rms5" : "rms";
        cddp_ctx_reset(ctx);
        cddp_tensor *x = load(ctx, name, "x", true), *w = load(ctx, name, "w", true);
        float eps = ((const float *)get(name, "eps")->data)[0];
        cddp_tensor *y = cddp_rms_norm(ctx, x, w, eps);
        compare(dev, name, "y", y ? y->data : NULL, y ? y->numel : 0);
        backward(ctx, name, y);
        compare(dev, name, "dx", x->grad, x->numel);
        compare(dev, name, "dw", w->grad, w->numel);
    }
    cddp_ctx_reset(ctx);
    cddp_tensor *g = load(ctx, "swiglu", "g", true), *u = load(ctx, "swiglu", "u", true);
    cddp_tensor *y = cddp_silu_mul(ctx, g, u);
    compare(dev, "swiglu", "y", y ? y->data : NULL, y ? y->numel : 0);
    backward(ctx, "swiglu", y);
    compare(dev, "swiglu", "dg", g->grad, g->numel);
    compare(dev, "swiglu", "du", u->grad, u->numel);
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "rope3" : "rope";
        cddp_ctx_reset(ctx);
        cddp_tensor *x = load(ctx, name, "x", true), *f = load(ctx, name, "inv_freq", false);
        const float *meta = get(name, "meta")->data;
        cddp_tensor *r = cddp_rope(ctx, x, f, (int64_t)meta[0], (int64_t)meta[1]);
        compare(dev, name, "y", r ? r->data : NULL, r ? r->numel : 0);
        backward(ctx, name, r);
        compare(dev, name, "dx", x->grad, x->numel);
    }
    for (int k = 0; k < 2; k++) { /* grouped-query and multi-query attention */
        const char *name = k ? "mqa" : "gqa";
        cddp_ctx_reset(ctx);
        cddp_tensor *q = load(ctx, name, "q", true), *kk = load(ctx, name, "k", true),
                    *v = load(ctx, name, "v", true);
        const float *meta = get(name, "meta")->data;
        int64_t H = (int64_t)meta[0], KV = (int64_t)meta[1];
        cddp_tensor *a = cddp_attention(ctx, cddp_qkv_pack(ctx, q, kk, v, H, KV), (int)H);
        compare(dev, name, "y", a ? a->data : NULL, a ? a->numel : 0);
        backward(ctx, name, a);
        compare(dev, name, "dq", q->grad, q->numel);
        compare(dev, name, "dk", kk->grad, kk->numel);
        compare(dev, name, "dv", v->grad, v->numel);
    }
    cddp_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ops_check FILE (from make_ops.py)\n");
        return 2;
    }
    cddp_error err = {0};
    if (!(ref = cddp_safetensors_read(argv[1], &err))) {
        printf("FAIL: %s\n", err.msg);
        return 1;
    }
    check(cddp_device_cpu());
    cddp_device *emu = cddp_device_get("emu", &err);
    if (!emu) {
        printf("FAIL: no emulated device: %s\n", err.msg);
        return 1;
    }
    check(emu);
    cddp_safetensors_destroy(ref);
    printf("%s\n", failures ? "FAILED" : "ok: every op and gradient as transformers computes it");
    return failures ? 1 : 0;
}
