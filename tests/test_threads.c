/* test_threads.c: the CPU kernels that split their work across the math threads (tensor/cpu/par.c)
 * give the same bits on 1 thread as on 3: each case runs an op forward and backward (loss = sum of
 * out * R, R random) on fresh inputs at 1 math thread and at 3, and every value of the output and
 * of each input's gradient must be equal, bit for bit. The shapes are large enough to be split
 * (checked) and leave remainders (rows, heads and values that do not divide evenly). Mixed
 * precision (contexts computing in bf16) runs on the processor's bf16 units or, without them,
 * emulated. */
#include "helpers.h"
#include "tensor/cpu/cpu.h"

#define MAX_IN 4

typedef cddp_tensor *(*forward_fn)(cddp_ctx *ctx, cddp_tensor **x, const void *arg);

typedef struct input {
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    float lo, hi;
    bool grad;
} input;

/* The output and every differentiable input's gradient of f, computed with threads math threads,
 * appended into a malloc'd buffer (*n floats). */
static float *run(int threads, cddp_dtype compute, forward_fn f, const void *arg, int nin,
                  const input *in, int64_t *n) {
    cddp_set_num_threads(threads);
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.seed = 7, .compute = compute});
    assert_non_null(ctx);
    cddp_rng rng;
    cddp_rng_seed(&rng, 42);
    cddp_tensor *x[MAX_IN];
    for (int i = 0; i < nin; i++) {
        x[i] = cddp_uniform(ctx, in[i].ndim, in[i].shape, in[i].lo, in[i].hi, &rng);
        if (in[i].grad) cddp_requires_grad(ctx, x[i]);
    }
    cddp_tensor *out = f(ctx, x, arg);
    assert_non_null(out);
    cddp_tensor *r = cddp_uniform(ctx, out->ndim, out->shape, -1, 1, &rng);
    assert_int_equal(cddp_backward(ctx, cddp_sum(ctx, cddp_mul(ctx, out, r))), CDDP_OK);
    int64_t total = out->numel;
    for (int i = 0; i < nin; i++) total += in[i].grad ? x[i]->numel : 0;
    float *buf = malloc(sizeof(float) * (size_t)total), *p = buf;
    assert_non_null(buf);
    memcpy(p, out->data, sizeof(float) * (size_t)out->numel);
    p += out->numel;
    for (int i = 0; i < nin; i++) {
        if (!in[i].grad) continue;
        assert_non_null(x[i]->grad);
        memcpy(p, x[i]->grad, sizeof(float) * (size_t)x[i]->numel);
        p += x[i]->numel;
    }
    cddp_ctx_destroy(ctx);
    *n = total;
    return buf;
}

static void same_bits(const char *what, cddp_dtype compute, forward_fn f, const void *arg, int nin,
                      const input *in) {
    int64_t n1, n3;
    float *one = run(1, compute, f, arg, nin, in, &n1);
    float *three = run(3, compute, f, arg, nin, in, &n3);
    assert_int_equal(n1, n3);
    for (int64_t i = 0; i < n1; i++)
        if (memcmp(&one[i], &three[i], sizeof(float)) != 0)
            fail_msg("%s: value %lld of %lld is %.9g on 1 thread, %.9g on 3", what, (long long)i,
                     (long long)n1, one[i], three[i]);
    free(one);
    free(three);
    cddp_set_num_threads(1);
}

#define IN(lo, hi, g, ...)                                                                         \
    { (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), {__VA_ARGS__}, lo, hi, g }

static cddp_tensor *f_attention(cddp_ctx *c, cddp_tensor **x, const void *a) {
    return cddp_attention(c, x[0], *(const int *)a);
}

static cddp_tensor *f_layer_norm(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_layer_norm(c, x[0], x[1], x[2], 1e-5f);
}

static cddp_tensor *f_gelu_tanh(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_gelu_tanh(c, x[0]);
}

/* The kernels see 3 threads and split these sizes. */
static void test_splits(void **state) {
    (void)state;
    cddp_set_num_threads(3);
    assert_int_equal(cddp__cpu_parts(3 * 4, 1), 3);
    assert_int_equal(cddp__cpu_parts(70001, 16384), 3);
    assert_int_equal(cddp__cpu_parts(40000, 16384), 2);
    assert_int_equal(cddp__cpu_parts(30000, 16384), 1);
    cddp_set_num_threads(1);
    assert_int_equal(cddp__cpu_parts(70001, 16384), 1);
}

static void test_attention(void **state) {
    (void)state;
    int heads = 4; /* 3 batch elements x 4 heads of 12, 37 positions */
    input in[] = {IN(-2, 2, true, 3, 37, 3 * 48)};
    same_bits("attention", CDDP_F32, f_attention, &heads, 1, in);
    same_bits("attention in bf16", CDDP_BF16, f_attention, &heads, 1, in);
}

static void test_layer_norm(void **state) {
    (void)state;
    /* 401 rows of 100: dx by rows, dw and db by columns */
    input in[] = {IN(-2, 2, true, 401, 100), IN(0.5f, 1.5f, true, 100), IN(-1, 1, true, 100)};
    same_bits("layer_norm", CDDP_F32, f_layer_norm, NULL, 3, in);
}

static void test_gelu_tanh(void **state) {
    (void)state;
    input in[] = {IN(-4, 4, true, 70001)};
    same_bits("gelu_tanh", CDDP_F32, f_gelu_tanh, NULL, 1, in);
}

static cddp_tensor *f_softmaxes(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a; /* softmax and log_softmax of the same rows, each through its backward */
    return cddp_add(c, cddp_softmax(c, x[0]), cddp_scale(c, cddp_log_softmax(c, x[0]), 0.25f));
}

static cddp_tensor *f_cross_entropy(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a; /* rows x 1 of the losses' copies: the summed loss through a broadcast */
    int64_t N = x[0]->shape[0], C = x[0]->shape[1];
    cddp_tensor *labels = cddp_empty(c, CDDP_I64, 1, (int64_t[]){N});
    for (int64_t i = 0; i < N; i++) ((int64_t *)labels->data)[i] = (i * 7919) % C;
    cddp_tensor *loss = cddp_cross_entropy(c, x[0], labels, CDDP_REDUCE_SUM);
    return cddp_mul(c, x[1], cddp_reshape(c, loss, 1, (int64_t[]){1}));
}

static cddp_tensor *f_elementwise(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a; /* the unary ops, add, sub, mul, div and scale of same-shape tensors */
    cddp_tensor *u = cddp_add(c, cddp_relu(c, x[0]), cddp_gelu(c, x[1]));
    u = cddp_sub(c, u, cddp_mul(c, cddp_tanh(c, x[0]), cddp_sigmoid(c, x[1])));
    return cddp_scale(c, cddp_div(c, u, x[2]), 0.5f);
}

static cddp_tensor *f_embedding(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    int64_t n = 2000;
    cddp_tensor *ids = cddp_empty(c, CDDP_I64, 1, (int64_t[]){n});
    for (int64_t i = 0; i < n; i++) ((int64_t *)ids->data)[i] = (i * 31) % x[0]->shape[0];
    return cddp_embedding(c, ids, x[0]);
}

static cddp_tensor *f_conv_relu_pool(cddp_ctx *c, cddp_tensor **x, const void *a) {
    (void)a;
    return cddp_conv2d_relu_max_pool2d(c, x[0], x[1], x[2], 1, 1, 1, 2, 2, 0);
}

/* The CNN's fused convolution, ReLU and pooling: the ReLU and pooling and their gradient split
 * by batch element; the first layer's weight and bias gradients (cddp's loop for few input
 * channels) by output channel. The second's, oneDNN's sum over the batch, is left out: its order
 * is oneDNN's. */
static void test_conv_relu_pool(void **state) {
    (void)state;
    /* the layers of fashion_mnist's CNN, 9 images */
    input in1[] = {IN(-1, 1, true, 9, 1, 28, 28), IN(-0.3f, 0.3f, true, 32, 1, 3, 3),
                   IN(-0.1f, 0.1f, true, 32)};
    same_bits("conv2d_relu_max_pool2d", CDDP_F32, f_conv_relu_pool, NULL, 3, in1);
    input in2[] = {IN(-1, 1, true, 9, 32, 14, 14), IN(-0.1f, 0.1f, false, 64, 32, 3, 3),
                   IN(-0.1f, 0.1f, false, 64)};
    same_bits("conv2d_relu_max_pool2d", CDDP_F32, f_conv_relu_pool, NULL, 3, in2);
}

static cddp_tensor *f_batch_norm(cddp_ctx *c, cddp_tensor **x, const void *a) {
    bool blocked = *(const bool *)a; /* oneDNN's channel blocks (the ResNet's), or row-major */
    int64_t C = x[0]->shape[1];
    cddp_tensor *rm = cddp_zeros(c, CDDP_F32, 1, (int64_t[]){C});
    cddp_tensor *rv = cddp_ones(c, CDDP_F32, 1, (int64_t[]){C});
    cddp_tensor *in = blocked ? cddp_to_blocked(c, x[0]) : x[0];
    cddp_tensor *r = blocked ? cddp_to_blocked(c, x[3]) : x[3];
    cddp_tensor *y = cddp_batch_norm_relu(c, in, x[1], x[2], rm, rv, true, 0.1f, 1e-5f);
    y = cddp_batch_norm_add_relu(c, y, r, x[1], x[2], rm, rv, true, 0.1f, 1e-5f);
    return cddp_to_nchw(c, cddp_batch_norm(c, y, x[1], x[2], rm, rv, true, 0.1f, 1e-5f));
}

/* Batch normalisation (with a ReLU, with a residual sum and a ReLU, alone), forward and backward:
 * its channel groups split across the math threads, each group's sums over the batch in one
 * part. */
static void test_batch_norm(void **state) {
    (void)state;
    input in[] = {IN(-2, 2, true, 8, 40, 12, 12), IN(0.5f, 1.5f, true, 40),
                  IN(-0.5f, 0.5f, true, 40), IN(-1, 1, true, 8, 40, 12, 12)};
    for (int blocked = 0; blocked < 2; blocked++) {
        bool b = blocked;
        same_bits(b ? "batch_norm, blocked" : "batch_norm", CDDP_F32, f_batch_norm, &b, 4, in);
        same_bits(b ? "batch_norm, blocked, bf16" : "batch_norm, bf16", CDDP_BF16, f_batch_norm, &b,
                  4, in);
    }
}

static void test_rows(void **state) {
    (void)state;
    input sm[] = {IN(-5, 5, true, 333, 130)};
    same_bits("softmax and log_softmax", CDDP_F32, f_softmaxes, NULL, 1, sm);
    input ce[] = {IN(-5, 5, true, 333, 130), IN(-1, 1, true, 1)};
    same_bits("cross_entropy", CDDP_F32, f_cross_entropy, NULL, 2, ce);
    input em[] = {IN(-1, 1, true, 50, 160)}; /* the gradient split by columns */
    same_bits("embedding", CDDP_F32, f_embedding, NULL, 1, em);
}

static void test_elementwise(void **state) {
    (void)state;
    input in[] = {IN(-3, 3, true, 70001), IN(-3, 3, true, 70001), IN(0.5f, 2, true, 70001)};
    same_bits("elementwise", CDDP_F32, f_elementwise, NULL, 3, in);
}

/* A queue for calling the CPU's kernels directly, its scratch from malloc (freed by free_scratch).
 */
static void *held[64];
static int nheld;

static void *scratch(cddp__kq *q, size_t bytes) {
    (void)q;
    assert_true(nheld < 64);
    return held[nheld++] = aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void free_scratch(void) {
    while (nheld) free(held[--nheld]);
}

enum { R = 300, K = 200, NG = 70001 };

/* Mixed precision's passes, called directly on fixed inputs: a gradient rounded with its column
 * sums (to_bf16), GELU's output made only rounded, GELU's backward rounded with the column sums,
 * cross-entropy and its backward rounded with the column sums (by columns), rows added into one
 * (a bias's gradient in float32: by columns) and into rows; into out16 (R K x 3 + NG values) and
 * out (4 K + 2 R + 1 + R K values). */
static void bf16_passes(int threads, uint16_t *out16, float *out) {
    cddp_set_num_threads(threads);
    cddp__kq q = {.scratch = scratch};
    float *x = scratch(&q, sizeof(float) * NG), *dy = scratch(&q, sizeof(float) * R * K);
    int64_t *labels = scratch(&q, sizeof(int64_t) * R);
    for (int64_t i = 0; i < NG; i++) x[i] = (float)((i * 40503) % 8000) / 1000 - 4;
    for (int64_t i = 0; i < R * K; i++) dy[i] = (float)((i * 9973) % 2000) / 1000 - 1;
    for (int64_t i = 0; i < R; i++) labels[i] = (i * 7919) % K;
    memset(out, 0, sizeof(float) * (4 * K + 2 * R + 1 + R * K));
    float *colsum = out, *stats = out + 4 * K, *loss = stats + 2 * R, *dy2 = loss + 1, one = 1.0f;
    cddp__cpu_to_bf16(&q, &(cddp__k_to_bf16){out16, dy, R, K, K, colsum});
    cddp__cpu_gelu_tanh(&q, &(cddp__k_gelu_tanh){x, NULL, NG, out16 + R * K});
    cddp__cpu_gelu_tanh_grad(
        &q, &(cddp__k_gelu_tanh_grad){x, dy, NULL, R * K, true, out16 + R * K + NG, colsum + K, K});
    cddp__cpu_cross_entropy(&q,
                            &(cddp__k_cross_entropy){x, labels, CDDP_I64, stats, loss, R, K, true});
    /* a bias's gradient: every row summed into one (by columns), and rows added into rows */
    cddp__cpu_add_rows(&q, &(cddp__k_add_rows){colsum + 3 * K, dy, R, K, 0, K});
    cddp__cpu_add_rows(&q, &(cddp__k_add_rows){dy2, dy, R, K, K, K});
    cddp__cpu_cross_entropy_grad(
        &q, &(cddp__k_cross_entropy_grad){x, stats, labels, CDDP_I64, &one, NULL, R, K, true, true,
                                          out16 + 2 * R * K + NG, colsum + 2 * K});
    free_scratch();
    cddp_set_num_threads(1);
}

static void test_bf16_passes(void **state) {
    (void)state;
    size_t n16 = 3 * R * K + NG, nf = 4 * K + 2 * R + 1 + R * K;
    uint16_t *h1 = malloc(2 * n16), *h3 = malloc(2 * n16);
    float *f1 = malloc(4 * nf), *f3 = malloc(4 * nf);
    assert_true(h1 && h3 && f1 && f3);
    bf16_passes(1, h1, f1);
    bf16_passes(3, h3, f3);
    assert_memory_equal(h1, h3, 2 * n16);
    assert_memory_equal(f1, f3, 4 * nf);
    free(h1), free(h3), free(f1), free(f3);
}

/* Rows summed into one row (a bias's gradient in float32), enough of them that the parts run at
 * the same time: equal, bit for bit, to the sum taken row after row here (parts that split the
 * rows would race on the row they add into). */
static void test_rows_into_one(void **state) {
    (void)state;
    enum { ROWS = 4096, COLS = 256 };
    float *src = malloc(sizeof(float) * ROWS * COLS), *want = calloc(COLS, sizeof(float));
    float *got = calloc(COLS, sizeof(float));
    assert_true(src && want && got);
    for (int64_t i = 0; i < ROWS * COLS; i++) src[i] = (float)((i * 9973) % 2000) / 1000 - 1;
    for (int64_t r = 0; r < ROWS; r++)
        for (int64_t c = 0; c < COLS; c++) want[c] += src[r * COLS + c];
    cddp_set_num_threads(3);
    assert_int_equal(cddp__cpu_col_parts(ROWS, COLS), 3);
    cddp__kq q = {.scratch = scratch};
    cddp__cpu_add_rows(&q, &(cddp__k_add_rows){got, src, ROWS, COLS, 0, COLS});
    cddp_set_num_threads(1);
    assert_memory_equal(got, want, sizeof(float) * COLS);
    free(src), free(want), free(got);
}

/* Three steps of SGD (momentum) and of AdamW over 70,001 parameters, the gradients set by hand. */
static void optimizer_steps(int threads, bool adamw, float *out, int64_t n) {
    cddp_set_num_threads(threads);
    cddp_error err = {0};
    cddp_model *m = cddp_model_create();
    int at = 0;
    cddp_model_add_param(m, "p", 1, (int64_t[]){n}, (cddp_init){CDDP_INIT_CONSTANT, 0.5f, 0}, &at);
    assert_int_equal(cddp_model_build(m, 0), CDDP_OK);
    cddp_optim *opt =
        adamw ? cddp_optim_adamw(m,
                                 &(cddp_adamw_options){.lr = 1e-2f,
                                                       .beta1 = 0.9f,
                                                       .beta2 = 0.95f,
                                                       .eps = 1e-8f,
                                                       .weight_decay = 0.1f},
                                 &err)
              : cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.1f, .momentum = 0.9f}, &err);
    assert_non_null(opt);
    cddp_tensor *p = cddp_model_param(m, at);
    for (int step = 0; step < 3; step++) {
        for (int64_t i = 0; i < n; i++)
            ((float *)p->grad)[i] = (float)((i * 2654435761u + (uint64_t)step) % 1000) / 500 - 1;
        cddp_optim_step(opt);
    }
    memcpy(out, p->data, sizeof(float) * (size_t)n);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    cddp_set_num_threads(1);
}

static void test_optimizers(void **state) {
    (void)state;
    int64_t n = 70001;
    float *one = malloc(sizeof(float) * (size_t)n), *three = malloc(sizeof(float) * (size_t)n);
    assert_true(one && three);
    for (int adamw = 0; adamw < 2; adamw++) {
        optimizer_steps(1, adamw, one, n);
        optimizer_steps(3, adamw, three, n);
        assert_memory_equal(one, three, sizeof(float) * (size_t)n);
    }
    free(one);
    free(three);
}

int main(void) {
    setenv("CDDP_BF16_EMULATE", "1", 0); /* bf16's numbers where the processor lacks its units */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits),         cmocka_unit_test(test_attention),
        cmocka_unit_test(test_layer_norm),     cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_rows),           cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_bf16_passes),    cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_conv_relu_pool), cmocka_unit_test(test_batch_norm),
        cmocka_unit_test(test_rows_into_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
