/* device_check.c: a device's kernels against the CPU's, through the ops, on fresh random inputs.
 *
 *   device_check DEVICE [--json] [--all] [--seed N]
 *
 * Each case runs one op (or an optimizer's update, a norm, a data check) on the CPU and on
 * DEVICE with the same inputs: the forward output, then, with loss = out . R for a random R (a
 * product, whose gradient is R), the gradient of every input, each compared with the CPU's as the
 * largest difference relative to the largest value of the CPU's result. The bound is 1e-5 in
 * float32 for every kernel (the GEMMs are float32 products with float32 accumulation: no TF32).
 * The mixed-precision cases (bf16_*: contexts computing in bf16, CDDP_BF16_EMULATE on a CPU
 * without bf16 units, which gives the same numbers) run a linear layer and a GPT block's layers,
 * whose products round their operands to bf16 and whose outputs hand over bf16 copies; both sides
 * round the same float32 values, but a value one rounding apart can land on the neighbouring bf16
 * value, 2^-8 of it: bound 1e-2 (the GEMM-based ops' bound of mixed precision). A
 * case whose kernel the device lacks is "missing" (its context fails with CDDP_EUNSUPPORTED); with
 * --all a missing kernel is a failure too (the emulated device must have them all). Prints a line
 * per case ("ok", "FAIL", "missing"; with --json one JSON object per line), and exits 0 when no
 * case failed, 77 when the machine has no such device.
 *
 * ctest runs it on the emulated device; scripts/gpu/check.sh on a GPU (device "cuda"), and under
 * compute-sanitizer there. */
#include <cddp/cddp.h>
#include <cddp/internal/device.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BOUND   1e-5
#define BOUND16 1e-2
#define MAX_IN  4

static cddp_device *dev;
static cddp_ctx *cpu, *on;
static double bound = BOUND; /* the cases' now */
static cddp_rng rng;
static bool json, all;
static int failures, missing, passed;

/* ---- inputs ------------------------------------------------------------------------------- */

typedef struct input {
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    float lo, hi;
    bool grad; /* differentiable */
} input;

static int64_t numel_of(const input *in) {
    int64_t n = 1;
    for (int d = 0; d < in->ndim; d++) n *= in->shape[d];
    return n;
}

/* What one case computes from its inputs (their tensors in x, on one context). */
typedef cddp_tensor *(*forward_fn)(cddp_ctx *ctx, cddp_tensor **x, const void *arg);

/* n floats of t's data (grad: its gradient) on the host, into buf. */
static void fetch(const cddp_tensor *t, bool grad, float *buf) {
    cddp_error err = {0};
    const void *p = grad ? t->grad : t->data;
    if (!p) {
        memset(buf, 0, sizeof(float) * (size_t)t->numel);
        return;
    }
    if (cddp_device_download(t->device, buf, p, sizeof(float) * (size_t)t->numel, &err))
        fprintf(stderr, "device_check: %s\n", err.msg), exit(1);
}

/* max |got - ref| / max |ref| */
static double rel_err(const float *got, const float *ref, int64_t n) {
    double d = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        if (isnan(got[i]) != isnan(ref[i])) e = INFINITY;
        if (e > d) d = e;
        if (fabs(ref[i]) > big) big = fabs(ref[i]);
    }
    return big > 0 ? d / big : d;
}

static void report(const char *name, const char *status, double err, const char *why) {
    if (json)
        printf("{\"case\": \"%s\", \"device\": \"%s\", \"status\": \"%s\", \"rel_err\": %.3g, "
               "\"bound\": %g%s%s%s}\n",
               name, cddp_device_name(dev), status, err, bound, why ? ", \"why\": \"" : "",
               why ? why : "", why ? "\"" : "");
    else
        printf("%-8s %-28s rel err %.3g (bound %g)%s%s\n", status, name, err, bound,
               why ? ": " : "", why ? why : "");
    if (!strcmp(status, "ok"))
        passed++;
    else if (!strcmp(status, "missing"))
        missing++;
    else
        failures++;
}

/* Runs f on ctx with inputs made from the host values v; the output and the gradients are left in
 * the tensors (out, x). Returns the context's status. */
static int run(cddp_ctx *ctx, forward_fn f, const void *arg, int nin, const input *in,
               float *const *v, const float *r, cddp_tensor **x, cddp_tensor **out) {
    cddp_ctx_reset(ctx);
    for (int i = 0; i < nin; i++) {
        x[i] = cddp_from_data(ctx, CDDP_F32, in[i].ndim, in[i].shape, v[i]);
        if (in[i].grad) cddp_requires_grad(ctx, x[i]);
    }
    *out = f(ctx, x, arg);
    if (!*out) return cddp_ctx_status(ctx);
    bool any = false;
    for (int i = 0; i < nin; i++) any |= in[i].grad;
    if (any) { /* loss = out . R as a (1,n) x (n,1) product: the gradient R reaches out */
        int64_t n = (*out)->numel;
        cddp_tensor *flat = cddp_reshape(ctx, *out, CDDP_SHAPE(1, n));
        cddp_tensor *rt = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(1, n), r);
        cddp_backward(ctx, cddp_linear(ctx, flat, rt, NULL));
    }
    return cddp_ctx_synchronize(ctx);
}

static void check(const char *name, forward_fn f, const void *arg, int nin, const input *in) {
    float *v[MAX_IN];
    for (int i = 0; i < nin; i++) {
        int64_t n = numel_of(&in[i]);
        v[i] = malloc(sizeof(float) * (size_t)(n ? n : 1));
        for (int64_t k = 0; k < n; k++)
            v[i][k] = in[i].lo + (in[i].hi - in[i].lo) * cddp_rng_uniform(&rng);
    }
    cddp_tensor *xc[MAX_IN], *xd[MAX_IN], *oc = NULL, *od = NULL;
    float *r = NULL;
    /* the CPU first, with R sized from its output */
    cddp_ctx_reset(cpu);
    cddp_tensor *probe[MAX_IN];
    for (int i = 0; i < nin; i++)
        probe[i] = cddp_from_data(cpu, CDDP_F32, in[i].ndim, in[i].shape, v[i]);
    cddp_tensor *po = f(cpu, probe, arg);
    int64_t on_ = po ? po->numel : 1;
    r = malloc(sizeof(float) * (size_t)on_);
    for (int64_t k = 0; k < on_; k++) r[k] = 2 * cddp_rng_uniform(&rng) - 1;
    int rc_cpu = run(cpu, f, arg, nin, in, v, r, xc, &oc);
    int rc_dev = run(on, f, arg, nin, in, v, r, xd, &od);
    if (rc_cpu != CDDP_OK) {
        report(name, "FAIL", INFINITY, cddp_ctx_error(cpu));
    } else if (rc_dev == CDDP_EUNSUPPORTED) {
        report(name, all ? "FAIL" : "missing", 0, cddp_ctx_error(on));
    } else if (rc_dev != CDDP_OK) {
        report(name, "FAIL", INFINITY, cddp_ctx_error(on));
    } else {
        double worst = 0;
        int64_t n = oc->numel;
        float *a = malloc(sizeof(float) * (size_t)(n ? n : 1)),
              *b = malloc(sizeof(float) * (size_t)(n ? n : 1));
        fetch(oc, false, a);
        fetch(od, false, b);
        worst = fmax(worst, rel_err(b, a, n));
        free(a);
        free(b);
        for (int i = 0; i < nin; i++) {
            if (!in[i].grad) continue;
            int64_t m = xc[i]->numel;
            float *ga = malloc(sizeof(float) * (size_t)(m ? m : 1)),
                  *gb = malloc(sizeof(float) * (size_t)(m ? m : 1));
            fetch(xc[i], true, ga);
            fetch(xd[i], true, gb);
            worst = fmax(worst, rel_err(gb, ga, m));
            free(ga);
            free(gb);
        }
        report(name, worst <= bound ? "ok" : "FAIL", worst, NULL);
    }
    for (int i = 0; i < nin; i++) free(v[i]);
    free(r);
}

/* ---- the cases ---------------------------------------------------------------------------- */

typedef struct mm_arg {
    bool ta, tb;
} mm_arg;

static cddp_tensor *f_matmul(cddp_ctx *c, cddp_tensor **x, const void *a) {
    const mm_arg *m = a;
    return cddp_matmul(c, x[0], x[1], m->ta, m->tb);
}
static cddp_tensor *f_linear(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_linear(c, x[0], x[1], x[2]);
}
static cddp_tensor *f_linear_nobias(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_linear(c, x[0], x[1], NULL);
}
static cddp_tensor *f_relu(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_relu(c, x[0]);
}
static cddp_tensor *f_gelu(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_gelu(c, x[0]);
}
static cddp_tensor *f_tanh(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_tanh(c, x[0]);
}
static cddp_tensor *f_sigmoid(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_sigmoid(c, x[0]);
}
static cddp_tensor *f_softmax(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_softmax(c, x[0]);
}
static cddp_tensor *f_log_softmax(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_log_softmax(c, x[0]);
}

typedef struct labels_arg {
    int64_t n, classes;
    cddp_dtype dtype;
    cddp_reduction red;
} labels_arg;

/* labels i * 7 % classes, as int32 or int64 */
static cddp_tensor *labels_of(cddp_ctx *c, const labels_arg *l) {
    int64_t v64[512];
    int32_t v32[512];
    for (int64_t i = 0; i < l->n && i < 512; i++) v64[i] = v32[i] = (int32_t)(i * 7 % l->classes);
    return cddp_from_data(c, l->dtype, 1, &l->n, l->dtype == CDDP_I64 ? (void *)v64 : (void *)v32);
}
static cddp_tensor *f_cross_entropy(cddp_ctx *c, cddp_tensor **x, const void *a) {
    return cddp_cross_entropy(c, x[0], labels_of(c, a), ((const labels_arg *)a)->red);
}
static cddp_tensor *f_mse(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_mse_loss(c, x[0], x[1], CDDP_REDUCE_MEAN);
}
static cddp_tensor *f_sum(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_sum(c, x[0]);
}
static cddp_tensor *f_mean(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_mean(c, x[0]);
}
static cddp_tensor *f_add_bcast(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_add(c, x[0], x[1]);
}
static cddp_tensor *f_mul_bcast(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_mul(c, x[0], x[1]);
}
static cddp_tensor *f_scale(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_scale(c, x[0], -1.75f);
}
static cddp_tensor *f_flatten_linear(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_linear(c, cddp_flatten(c, x[0]), x[1], x[2]);
}
static cddp_tensor *f_embedding(cddp_ctx *c, cddp_tensor **x, const void *a) {
    const labels_arg *l = a;
    int64_t ids[64];
    for (int64_t i = 0; i < l->n; i++) ids[i] = (i * 5 + 3) % l->classes; /* repeats: sums */
    cddp_tensor *t = cddp_from_data(c, CDDP_I64, 2, (int64_t[]){4, l->n / 4}, ids);
    return cddp_embedding(c, t, x[0]);
}
static cddp_tensor *f_layer_norm(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_layer_norm(c, x[0], x[1], x[2], 1e-5f);
}
static cddp_tensor *f_gelu_tanh(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_gelu_tanh(c, x[0]);
}
static cddp_tensor *f_gelu_linear(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_gelu_tanh_linear(c, x[0], x[1], x[2]);
}
static cddp_tensor *f_attention(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_attention(c, x[0], 2);
}
/* Generation's attention: 5 positions (x[1]) into an empty cache, then 3 more (x[0]) after them;
 * the second output depends on what the first call left in the cache. No gradient. */
static cddp_tensor *f_attention_cached(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    bool grad = cddp_ctx_set_grad_enabled(c, false);
    cddp_tensor *cache = cddp_zeros(c, CDDP_F32, 3, (int64_t[]){2, 8, 2 * 32});
    cddp_attention_cached(c, x[1], 2, cache, 0);
    cddp_tensor *out = cddp_attention_cached(c, x[0], 2, cache, 5);
    cddp_ctx_set_grad_enabled(c, grad);
    return out;
}
/* Llama's: RMSNorm, SwiGLU's gate, rotary positions (3 heads of 16 from position 7; the
 * frequencies a constant, x[1] taking no gradient), grouped-query packing through the attention
 * (4 heads, 2 key/value heads of 8) */
static cddp_tensor *f_rms_norm(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_rms_norm(c, x[0], x[1], 1e-6f);
}
static cddp_tensor *f_silu_mul(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_silu_mul(c, x[0], x[1]);
}
static cddp_tensor *f_rope(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_rope(c, x[0], x[1], 3, 7);
}
static cddp_tensor *f_gqa(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_attention(c, cddp_qkv_pack(c, x[0], x[1], x[2], 4, 2), 4);
}
static cddp_tensor *f_conv2d(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_conv2d(c, x[0], x[1], x[2], 1, 1);
}
static cddp_tensor *f_max_pool(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_max_pool2d(c, x[0], 2, 2, 0);
}
static cddp_tensor *f_avg_pool(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_avg_pool2d(c, x[0], 3, 2, 1);
}
static cddp_tensor *f_batch_norm(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_batch_norm(c, x[0], x[1], x[2], NULL, NULL, true, 0.1f, 1e-5f);
}
static cddp_tensor *f_dropout(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    cddp_rng_seed(cddp_ctx_rng(c), 77); /* the same mask on both */
    return cddp_dropout(c, x[0], 0.25f, true);
}

/* A GPT block's MLP without the residual: layer_norm, linear (x[1], bias x[2]), GELU, linear
 * (x[3]); in bf16 the layer norm and GELU hand their outputs over rounded, GELU's backward its
 * gradient (the first linear's bias gradient its column sums). */
static cddp_tensor *f_mlp_block(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    cddp_tensor *h = cddp_layer_norm(c, x[0], NULL, NULL, 1e-5f);
    return cddp_linear(c, cddp_gelu_tanh(c, cddp_linear(c, h, x[1], x[2])), x[3], NULL);
}
/* The same through cddp_gelu_tanh_linear: in bf16 GELU's output made only rounded (gelu_tanh
 * without y), its backward from the product's into the first linear's gradient in bf16. */
static cddp_tensor *f_mlp_fused(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    cddp_tensor *h = cddp_layer_norm(c, x[0], NULL, NULL, 1e-5f);
    return cddp_gelu_tanh_linear(c, cddp_linear(c, h, x[1], x[2]), x[3], NULL);
}
/* Attention's half: layer_norm, the qkv projection (x[1]), attention in 2 heads, the output
 * projection (x[2]) of its bf16 copy. */
static cddp_tensor *f_attention_block(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    cddp_tensor *h = cddp_linear(c, cddp_layer_norm(c, x[0], NULL, NULL, 1e-5f), x[1], NULL);
    return cddp_linear(c, cddp_attention(c, h, 2), x[2], NULL);
}

/* The same through cddp_qkv_attention, with the projection's bias (x[3]): in bf16 by rows q, k
 * and v kept only rounded (the flash kernels' qkv16), the backward into their gradient in scratch
 * and the projection's products from it. */
static cddp_tensor *f_qkv_attention(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    cddp_tensor *h = cddp_layer_norm(c, x[0], NULL, NULL, 1e-5f);
    return cddp_linear(c, cddp_qkv_attention(c, h, x[1], x[3], 2), x[2], NULL);
}

/* A residual block's shape: x + linear(layer_norm(x)) (x[1], bias x[2]); in bf16 the add's
 * backward hands the linear layer its gradient rounded, the bias's column sums on the way. */
static cddp_tensor *f_residual(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_add(c, x[0],
                    cddp_linear(c, cddp_layer_norm(c, x[0], NULL, NULL, 1e-5f), x[1], x[2]));
}

/* A classifier: the logits of x (B, T, C) by the linear layer x[1] (bias x[2], or none), reshaped
 * to (B T, V) for cross-entropy, as the GPT's; in bf16 cross-entropy's backward hands the layer its
 * gradient rounded, through the reshape. */
typedef struct classifier_arg {
    labels_arg l;
    bool bias;
} classifier_arg;

static cddp_tensor *f_classifier(cddp_ctx *c, cddp_tensor **x, const void *a) {
    const classifier_arg *k = a;
    cddp_tensor *logits = cddp_linear(c, x[0], x[1], k->bias ? x[2] : NULL);
    return cddp_cross_entropy(c, cddp_reshape(c, logits, 2, (int64_t[]){k->l.n, k->l.classes}),
                              labels_of(c, &k->l), k->l.red);
}

#define IN(lo_, hi_, grad_, ...)                                                                   \
    {                                                                                              \
        .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .shape = {__VA_ARGS__}, \
        .lo = lo_, .hi = hi_, .grad = grad_                                                        \
    }

static void op_cases(void) {
    for (int t = 0; t < 4; t++) {
        mm_arg m = {t & 1, t & 2};
        int64_t M = 37, K = 53, N = 29;
        input in[2] = {
            {.ndim = 2, .shape = {m.ta ? K : M, m.ta ? M : K}, .lo = -1, .hi = 1, .grad = true},
            {.ndim = 2, .shape = {m.tb ? N : K, m.tb ? K : N}, .lo = -1, .hi = 1, .grad = true}};
        char name[32];
        snprintf(name, sizeof name, "matmul_%c%c", m.ta ? 't' : 'n', m.tb ? 't' : 'n');
        check(name, f_matmul, &m, 2, in);
    }
    mm_arg big = {false, true};
    check("matmul_256x512x384", f_matmul, &big, 2,
          (input[]){IN(-1, 1, true, 256, 512), IN(-1, 1, true, 384, 512)});
    check("linear", f_linear, NULL, 3,
          (input[]){IN(-1, 1, true, 64, 784), IN(-0.05f, 0.05f, true, 512, 784),
                    IN(-0.05f, 0.05f, true, 512)});
    check("linear_3d_nobias", f_linear_nobias, NULL, 2,
          (input[]){IN(-1, 1, true, 4, 16, 32), IN(-0.2f, 0.2f, true, 48, 32)});
    check("flatten_linear", f_flatten_linear, NULL, 3,
          (input[]){IN(-1, 1, true, 8, 1, 28, 28), IN(-0.05f, 0.05f, true, 10, 784),
                    IN(-0.05f, 0.05f, true, 10)});
    check("relu", f_relu, NULL, 1, (input[]){IN(-2, 2, true, 4099)});
    check("gelu", f_gelu, NULL, 1, (input[]){IN(-3, 3, true, 4099)});
    check("tanh", f_tanh, NULL, 1, (input[]){IN(-3, 3, true, 4099)});
    check("sigmoid", f_sigmoid, NULL, 1, (input[]){IN(-5, 5, true, 4099)});
    check("softmax", f_softmax, NULL, 1, (input[]){IN(-4, 4, true, 33, 1000)});
    check("log_softmax", f_log_softmax, NULL, 1, (input[]){IN(-4, 4, true, 33, 1000)});
    labels_arg l64 = {64, 10, CDDP_I64, CDDP_REDUCE_MEAN},
               l32 = {300, 1000, CDDP_I32, CDDP_REDUCE_SUM};
    check("cross_entropy_i64_mean", f_cross_entropy, &l64, 1, (input[]){IN(-3, 3, true, 64, 10)});
    check("cross_entropy_i32_sum", f_cross_entropy, &l32, 1, (input[]){IN(-3, 3, true, 300, 1000)});
    classifier_arg cls = {{66, 1000, CDDP_I64, CDDP_REDUCE_MEAN}, true};
    check("classifier", f_classifier, &cls, 3,
          (input[]){IN(-1, 1, true, 2, 33, 64), IN(-0.2f, 0.2f, true, 1000, 64),
                    IN(-0.1f, 0.1f, true, 1000)});
    check("mse", f_mse, NULL, 2, (input[]){IN(-1, 1, true, 257, 3), IN(-1, 1, true, 257, 3)});
    check("sum", f_sum, NULL, 1, (input[]){IN(-1, 1, true, 100003)});
    check("mean", f_mean, NULL, 1, (input[]){IN(-1, 1, true, 17, 19)});
    check("scale", f_scale, NULL, 1, (input[]){IN(-1, 1, true, 1000)});
    labels_arg e = {64, 50, CDDP_I64, CDDP_REDUCE_MEAN};
    check("embedding", f_embedding, &e, 1, (input[]){IN(-1, 1, true, 50, 24)});
    /* the GPT's, the CNN's and the rest */
    check("add_broadcast", f_add_bcast, NULL, 2,
          (input[]){IN(-1, 1, true, 4, 3, 5), IN(-1, 1, true, 3, 1)});
    check("mul_broadcast", f_mul_bcast, NULL, 2,
          (input[]){IN(-1, 1, true, 4, 3, 5), IN(-1, 1, true, 5)});
    check("layer_norm", f_layer_norm, NULL, 3,
          (input[]){IN(-2, 2, true, 6, 7, 64), IN(0.5f, 1.5f, true, 64), IN(-1, 1, true, 64)});
    check("layer_norm_768", f_layer_norm, NULL, 3,
          (input[]){IN(-2, 2, true, 33, 768), IN(0.5f, 1.5f, true, 768), IN(-1, 1, true, 768)});
    check("add_positions", f_add_bcast, NULL, 2,
          (input[]){IN(-1, 1, true, 4, 9, 16), IN(-1, 1, true, 9, 16)});
    check("gelu_tanh", f_gelu_tanh, NULL, 1, (input[]){IN(-3, 3, true, 4099)});
    check("gelu_tanh_linear", f_gelu_linear, NULL, 3,
          (input[]){IN(-3, 3, true, 5, 7, 48), IN(-0.2f, 0.2f, true, 24, 48),
                    IN(-0.1f, 0.1f, true, 24)});
    check("attention", f_attention, NULL, 1, (input[]){IN(-1, 1, true, 2, 16, 3 * 32)});
    check("attention_T67_HS64", f_attention, NULL, 1, (input[]){IN(-1, 1, true, 3, 67, 3 * 128)});
    check("attention_cached", f_attention_cached, NULL, 2,
          (input[]){IN(-1, 1, false, 2, 3, 3 * 32), IN(-1, 1, false, 2, 5, 3 * 32)});
    check("rms_norm", f_rms_norm, NULL, 2,
          (input[]){IN(-2, 2, true, 33, 768), IN(0.5f, 1.5f, true, 768)});
    check("silu_mul", f_silu_mul, NULL, 2,
          (input[]){IN(-4, 4, true, 7, 1001), IN(-1, 1, true, 7, 1001)});
    check("rope", f_rope, NULL, 2, (input[]){IN(-1, 1, true, 2, 9, 48), IN(0.01f, 1, false, 8)});
    check(
        "qkv_pack_attention", f_gqa, NULL, 3,
        (input[]){IN(-1, 1, true, 2, 6, 32), IN(-1, 1, true, 2, 6, 16), IN(-1, 1, true, 2, 6, 16)});
    check("conv2d", f_conv2d, NULL, 3,
          (input[]){IN(-1, 1, true, 2, 3, 9, 8), IN(-0.5f, 0.5f, true, 4, 3, 3, 3),
                    IN(-0.5f, 0.5f, true, 4)});
    check("max_pool2d", f_max_pool, NULL, 1, (input[]){IN(-1, 1, true, 2, 3, 8, 10)});
    check("avg_pool2d", f_avg_pool, NULL, 1, (input[]){IN(-1, 1, true, 2, 3, 8, 10)});
    check("batch_norm", f_batch_norm, NULL, 3,
          (input[]){IN(-2, 2, true, 8, 5, 4, 4), IN(0.5f, 1.5f, true, 5), IN(-1, 1, true, 5)});
    check("dropout", f_dropout, NULL, 1, (input[]){IN(-1, 1, true, 5000)});
}

/* Mixed precision's layers, on contexts computing in bf16 (the bound BOUND16). */
static void bf16_cases(void) {
    bound = BOUND16;
    check("bf16_linear", f_linear, NULL, 3,
          (input[]){IN(-1, 1, true, 64, 784), IN(-0.05f, 0.05f, true, 512, 784),
                    IN(-0.05f, 0.05f, true, 512)});
    check("bf16_mlp_block", f_mlp_block, NULL, 4,
          (input[]){IN(-2, 2, true, 2, 33, 64), IN(-0.2f, 0.2f, true, 256, 64),
                    IN(-0.1f, 0.1f, true, 256), IN(-0.1f, 0.1f, true, 64, 256)});
    check("bf16_mlp_fused", f_mlp_fused, NULL, 4,
          (input[]){IN(-2, 2, true, 2, 33, 64), IN(-0.2f, 0.2f, true, 256, 64),
                    IN(-0.1f, 0.1f, true, 256), IN(-0.1f, 0.1f, true, 64, 256)});
    check("bf16_attention_block", f_attention_block, NULL, 3,
          (input[]){IN(-2, 2, true, 3, 67, 128), IN(-0.2f, 0.2f, true, 3 * 128, 128),
                    IN(-0.2f, 0.2f, true, 128, 128)});
    check("bf16_residual", f_residual, NULL, 3,
          (input[]){IN(-2, 2, true, 2, 33, 64), IN(-0.2f, 0.2f, true, 64, 64),
                    IN(-0.1f, 0.1f, true, 64)});
    /* the classifier's gradient handed over in bf16: rows of 1000 (16 bytes at a time) with a
     * bias, and of 257 without */
    classifier_arg cls = {{66, 1000, CDDP_I64, CDDP_REDUCE_MEAN}, true},
                   odd = {{66, 257, CDDP_I32, CDDP_REDUCE_SUM}, false};
    check("bf16_classifier", f_classifier, &cls, 3,
          (input[]){IN(-1, 1, true, 2, 33, 64), IN(-0.2f, 0.2f, true, 1000, 64),
                    IN(-0.1f, 0.1f, true, 1000)});
    check("bf16_classifier_257", f_classifier, &odd, 2,
          (input[]){IN(-1, 1, true, 2, 33, 64), IN(-0.2f, 0.2f, true, 257, 64)});
    /* attention by rows where the device has it (the CUDA device's flash kernels: heads of 64 and
     * 32), over several blocks of 64 queries and keys (the next block's tiles loaded while one's
     * are multiplied), the last one partial; peaked weights
     * (scores of a few units: each row's running maximum moves from block to block) */
    check("bf16_attention_T200_HS64", f_attention, NULL, 1,
          (input[]){IN(-1, 1, true, 2, 200, 3 * 128)});
    check("bf16_attention_T130_HS32", f_attention, NULL, 1,
          (input[]){IN(-1, 1, true, 3, 130, 3 * 64)});
    /* one partial block: only the diagonal, most of its rows past T */
    check("bf16_attention_T40_HS64", f_attention, NULL, 1,
          (input[]){IN(-1, 1, true, 3, 40, 3 * 128)});
    check("bf16_attention_peaked", f_attention, NULL, 1,
          (input[]){IN(-3, 3, true, 2, 256, 3 * 128)});
    check("bf16_qkv_attention", f_qkv_attention, NULL, 4,
          (input[]){IN(-2, 2, true, 2, 130, 128), IN(-0.2f, 0.2f, true, 3 * 128, 128),
                    IN(-0.2f, 0.2f, true, 128, 128), IN(-0.1f, 0.1f, true, 3 * 128)});
    bound = BOUND;
}

/* ---- flat blocks: the optimizers' updates and the norm ----------------------------------------
 */

/* n random floats in [lo, hi) on the host, then on d (freed by the caller). */
static float *block_on(cddp_device *d, const float *host, size_t n) {
    cddp_error err = {0};
    float *p = cddp_device_alloc(d, n * sizeof(float), &err);
    if (!p || cddp_device_upload(d, p, host, n * sizeof(float), &err))
        fprintf(stderr, "device_check: %s\n", err.msg), exit(1);
    return p;
}

static void optimizer_cases(void) {
    enum { N = 100003 };
    float *h[4], *back = malloc(sizeof(float) * N);
    for (int k = 0; k < 4; k++) {
        h[k] = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++)
            h[k][i] = k == 3 ? cddp_rng_uniform(&rng) : 2 * cddp_rng_uniform(&rng) - 1;
    }
    cddp_device *c = cddp_device_cpu();
    cddp_error err = {0};
    static const char *const names[] = {"sgd_momentum_wd", "sgd_nesterov", "adamw", "lion"};
    for (int which = 0; which < 4; which++) {
        float *b[2][4];
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 4; k++) b[s][k] = block_on(s ? dev : c, h[k], N);
        for (int step = 0; step < 3; step++)
            for (int s = 0; s < 2; s++) {
                cddp_device *d = s ? dev : c;
                if (which == 0)
                    cddp_device_sgd(d, b[s][0], b[s][1], b[s][2], N,
                                    &(cddp_sgd_hparams){.lr = 0.1f,
                                                        .momentum = 0.9f,
                                                        .weight_decay = 0.01f,
                                                        .first = step == 0});
                else if (which == 1)
                    cddp_device_sgd(
                        d, b[s][0], b[s][1], b[s][2], N,
                        &(cddp_sgd_hparams){
                            .lr = 0.1f, .momentum = 0.9f, .nesterov = true, .first = step == 0});
                else if (which == 2)
                    cddp_device_adamw(d, b[s][0], b[s][1], b[s][2], b[s][3], N,
                                      &(cddp_adamw_hparams){0.9f, 0.95f, 1e-8f, 0.01f * (step + 1),
                                                            0.3f, 0.999f});
                else
                    cddp_device_lion(d, b[s][0], b[s][1], b[s][2], N,
                                     &(cddp_lion_hparams){0.01f, 0.9f, 0.99f, 0.999f});
            }
        double worst = 0;
        for (int k = 0; k < (which == 2 ? 4 : 3); k++) {
            if (k == 1) continue; /* the gradient is read, not written */
            if (cddp_device_download(dev, back, b[1][k], sizeof(float) * N, &err))
                fprintf(stderr, "device_check: %s\n", err.msg), exit(1);
            worst = fmax(worst, rel_err(back, b[0][k], N));
        }
        if (cddp_device_synchronize(dev, &err) == CDDP_EUNSUPPORTED)
            report(names[which], "missing", 0, err.msg);
        else
            report(names[which], worst <= bound ? "ok" : "FAIL", worst, NULL);
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 4; k++) cddp_device_free(s ? dev : c, b[s][k]);
    }
    float *x = block_on(dev, h[0], N);
    double got = 0, want = 0;
    for (int i = 0; i < N; i++) want += (double)h[0][i] * h[0][i];
    int rc = cddp_device_sum_squares(dev, x, N, &got, &err);
    double e = fabs(got - want) / want;
    report("sum_squares",
           rc           ? "FAIL"
           : e <= BOUND ? "ok"
                        : "FAIL",
           rc ? INFINITY : e, rc ? err.msg : NULL);
    cddp_device_free(dev, x);
    for (int k = 0; k < 4; k++) free(h[k]);
    free(back);
}

/* DDP's 16-bit wire format: x rounded to bf16 and to IEEE half on the device, bit for bit as on
 * the CPU (a NaN only as a NaN), and widened back times 0.5 exactly as there; values from 1e-6 to
 * 1e5, beyond half's range (infinity), and a NaN. */
static void half_cases(void) {
    enum { N = 100003 };
    float *h = malloc(sizeof(float) * N), *want = malloc(sizeof(float) * N),
          *got = malloc(sizeof(float) * N);
    uint16_t *want16 = malloc(2 * N), *got16 = malloc(2 * N);
    for (int i = 0; i < N; i++)
        h[i] = (2 * cddp_rng_uniform(&rng) - 1) * powf(10.0f, 11 * cddp_rng_uniform(&rng) - 6);
    h[17] = NAN;
    cddp_device *c = cddp_device_cpu();
    cddp_error err = {0};
    for (int f16 = 0; f16 < 2; f16++) {
        float *x = block_on(dev, h, N);
        uint16_t *x16 = cddp_device_alloc(dev, 2 * N, &err);
        if (!x16) fprintf(stderr, "device_check: %s\n", err.msg), exit(1);
        cddp_device_to_half(dev, x16, x, N, f16);
        cddp_device_from_half(dev, x, x16, N, f16, 0.5f);
        cddp_device_to_half(c, want16, h, N, f16);
        cddp_device_from_half(c, want, want16, N, f16, 0.5f);
        const char *name = f16 ? "cast16_f16" : "cast16_bf16";
        if (cddp_device_synchronize(dev, &err) == CDDP_EUNSUPPORTED) {
            report(name, "missing", 0, err.msg);
        } else {
            if (cddp_device_download(dev, got16, x16, 2 * N, &err) ||
                cddp_device_download(dev, got, x, sizeof(float) * N, &err))
                fprintf(stderr, "device_check: %s\n", err.msg), exit(1);
            int wrong = 0;
            for (int i = 0; i < N; i++)
                wrong += isnan(want[i]) ? !isnan(got[i])
                                        : got16[i] != want16[i] || memcmp(&got[i], &want[i], 4);
            report(name, wrong ? "FAIL" : "ok", wrong,
                   wrong ? "values differ from the CPU's" : NULL);
        }
        cddp_device_free(dev, x);
        cddp_device_free(dev, x16);
    }
    free(h), free(want), free(got), free(want16), free(got16);
}

/* argmax and count_correct; a label out of range fails the step with the CPU's message. */
/* The loader's path: page-locked host memory copied on a queue of one's own, a kernel on the
 * default queue after the copy's event (no host wait between), its result against the host's. */
/* DDP's staging: plain host memory made page-locked (cddp_device_host_register), a queued copy
 * of device memory into it, read once an event after it is done; then the memory given back. */
static void registered_download(void) {
    enum { N = 1 << 20 };
    cddp_error err = {0};
    float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) want[i] = (float)(cddp_rng_uniform(&rng) - 0.5), got[i] = NAN;
    float *d = block_on(dev, want, N);
    cddp_event *ev = cddp_event_create(dev, &err);
    int rc = ev ? cddp_device_host_register(dev, got, N * sizeof(float), &err) : err.code;
    bool registered = rc == CDDP_OK;
    if (registered && (cddp_device_download_async(dev, got, d, N * sizeof(float), &err) ||
                       cddp_event_record(ev, &err) || cddp_event_synchronize(ev, &err)))
        rc = err.code;
    if (registered) cddp_device_host_unregister(dev, got);
    bool same = rc == CDDP_OK && memcmp(got, want, N * sizeof(float)) == 0;
    report("registered_download", same ? "ok" : "FAIL", same ? 0 : 1, rc ? err.msg : NULL);
    cddp_event_destroy(ev);
    cddp_device_free(dev, d);
    free(want), free(got);
}

static void queued_upload(void) {
    enum { N = 1 << 20 };
    cddp_error err = {0};
    float *h = cddp_device_host_alloc(dev, N * sizeof(float), &err);
    float *d = h ? cddp_device_alloc(dev, N * sizeof(float), &err) : NULL;
    cddp_queue *q = d ? cddp_queue_create(dev, &err) : NULL;
    cddp_event *ev = q ? cddp_event_create(dev, &err) : NULL;
    double want = 0, got = NAN;
    if (ev) {
        for (int i = 0; i < N; i++) want += h[i] = (float)(cddp_rng_uniform(&rng) - 0.5);
        cddp_ctx_reset(on);
        if (cddp_queue_upload(q, d, h, N * sizeof(float), &err) == CDDP_OK &&
            cddp_queue_record(q, ev, &err) == CDDP_OK &&
            cddp_device_wait_event(dev, ev, &err) == CDDP_OK)
            got = cddp_item(cddp_sum(on, cddp_wrap(on, CDDP_F32, CDDP_SHAPE(N), d)));
    }
    double rel = fabs(got - want) / (fabs(want) > 1 ? fabs(want) : 1);
    report("queued_upload", rel <= BOUND && cddp_ctx_status(on) == CDDP_OK ? "ok" : "FAIL", rel,
           err.msg[0] ? err.msg : NULL);
    cddp_event_destroy(ev);
    cddp_queue_destroy(q);
    cddp_device_free(dev, d);
    cddp_device_host_free(dev, h);
}

static void data_cases(void) {
    float v[6 * 5];
    for (int i = 0; i < 30; i++) v[i] = (float)((i * 7) % 11);
    int64_t lab[6] = {0, 1, 2, 3, 4, 0};
    cddp_ctx_reset(on);
    cddp_tensor *logits = cddp_from_data(on, CDDP_F32, CDDP_SHAPE(6, 5), v);
    cddp_tensor *labels = cddp_from_data(on, CDDP_I64, CDDP_SHAPE(6), lab);
    cddp_tensor *am = cddp_argmax(on, logits);
    int64_t correct = am ? cddp_count_correct(logits, labels) : -1, want = 0, ok = 1;
    for (int r = 0; r < 6; r++) {
        int64_t best = 0;
        for (int j = 1; j < 5; j++)
            if (v[r * 5 + j] > v[r * 5 + best]) best = j;
        want += best == lab[r];
        if (am && cddp_get(am, r) != (double)best) ok = 0;
    }
    int rc = cddp_ctx_synchronize(on);
    if (rc == CDDP_EUNSUPPORTED)
        report("argmax_count_correct", all ? "FAIL" : "missing", 0, cddp_ctx_error(on));
    else
        report("argmax_count_correct", rc == CDDP_OK && ok && correct == want ? "ok" : "FAIL", 0,
               NULL);
    char msg[2][CDDP_ERROR_MSG_MAX];
    for (int s = 0; s < 2; s++) {
        cddp_ctx *c = s ? on : cpu;
        cddp_ctx_reset(c);
        int64_t bad[3] = {1, 7, 2};
        cddp_cross_entropy(c, cddp_from_data(c, CDDP_F32, CDDP_SHAPE(3, 5), v),
                           cddp_from_data(c, CDDP_I64, CDDP_SHAPE(3), bad), CDDP_REDUCE_MEAN);
        snprintf(msg[s], sizeof msg[s], "%s",
                 cddp_ctx_status(c) == CDDP_ERANGE ? cddp_ctx_error(c) : "");
    }
    bool same = msg[0][0] && !strcmp(msg[0], msg[1]);
    report("label_check", same ? "ok" : "FAIL", 0, same ? NULL : msg[1]);
    queued_upload();
    registered_download();
}

int main(int argc, char **argv) {
    uint64_t seed = 1;
    const char *spec = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--all"))
            all = true;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!spec && argv[i][0] != '-')
            spec = argv[i];
        else {
            fprintf(stderr, "usage: device_check DEVICE [--json] [--all] [--seed N]\n");
            return 2;
        }
    }
    cddp_error err = {0};
    if (!spec || !(dev = cddp_device_get(spec, &err))) {
        /* A machine without the device skips the check (ctest's SKIP_RETURN_CODE), saying why. */
        bool absent = err.code == CDDP_EUNSUPPORTED && !strncmp(err.msg, "no ", 3);
        fprintf(stderr, "device_check: %s%s\n", absent ? "cannot run on this machine: " : "",
                spec ? err.msg : "which device? (cpu, emu, cuda)");
        return absent ? 77 : 2;
    }
    cddp_rng_seed(&rng, seed);
    cpu = cddp_ctx_create(NULL);
    on = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    if (!json)
        printf("%s against the CPU, seed %llu\n", cddp_device_describe(dev),
               (unsigned long long)seed);
    op_cases();
    /* then the mixed-precision cases, on contexts computing in bf16 (emulated on the CPU where it
     * has no bf16 units: the same numbers) */
    cddp_ctx_destroy(on);
    cddp_ctx_destroy(cpu);
    setenv("CDDP_BF16_EMULATE", "1", 0);
    cpu = cddp_ctx_create(&(cddp_ctx_options){.compute = CDDP_BF16});
    on = cddp_ctx_create(&(cddp_ctx_options){.device = dev, .compute = CDDP_BF16});
    if (!cpu || !on) fprintf(stderr, "device_check: no context computing in bf16\n"), exit(1);
    bf16_cases();
    cddp_ctx_destroy(on);
    cddp_ctx_destroy(cpu);
    cpu = cddp_ctx_create(NULL);
    on = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    optimizer_cases();
    half_cases();
    data_cases();
    printf("%s%d ok, %d missing, %d failed%s\n", json ? "{\"summary\": \"" : "", passed, missing,
           failures, json ? "\"}" : "");
    cddp_ctx_destroy(on);
    cddp_ctx_destroy(cpu);
    return failures ? 1 : 0;
}
