/* test_checkpoint.c: safetensors files and checkpoints: round trips, mismatches named exactly,
 * corrupt files rejected, atomic writes that survive a killed writer, and files from Python.
 *
 * Run as `test_checkpoint --write-interop PATH` it only writes a file for
 * tests/reference/check_interop.py to read with NumPy (the other direction of interoperability).
 */
#include "helpers.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void path_in(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", test_dir, name);
}

static cddp_model *net(int64_t hidden, uint64_t seed) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(3, hidden)), 0);
    assert_int_equal(cddp_model_add(m, "act", cddp_nn_relu()), 0);
    assert_int_equal(cddp_model_add(m, "out", cddp_nn_linear(hidden, 2)), 0);
    assert_int_equal(cddp_model_build(m, seed), 0);
    return m;
}

static void train_steps(cddp_model *m, cddp_optim *opt, int steps) {
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    float x[] = {1, 2, 3, -1, 0.5f, 2};
    int64_t y[] = {0, 1};
    for (int i = 0; i < steps; i++) {
        cddp_ctx_reset(ctx);
        cddp_tensor *logits =
            cddp_model_forward(m, ctx, cddp_wrap(ctx, CDDP_F32, CDDP_SHAPE(2, 3), x));
        cddp_tensor *loss = cddp_cross_entropy(
            ctx, logits, cddp_wrap(ctx, CDDP_I64, CDDP_SHAPE(2), y), CDDP_REDUCE_MEAN);
        cddp_model_zero_grad(m);
        assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
        cddp_optim_step(opt);
    }
    cddp_ctx_destroy(ctx);
}

static void test_round_trip_and_resume(void **state) {
    (void)state;
    char path[512];
    path_in(path, sizeof path, "ckpt.safetensors");
    cddp_error err = {0};
    cddp_adamw_options aw = cddp_adamw_defaults(0.01f);
    cddp_model *a = net(5, 1);
    cddp_optim *oa = cddp_optim_adamw(a, &aw, &err);
    train_steps(a, oa, 2);
    const char *meta[] = {"epoch", "3", "note", "hello", NULL};
    assert_int_equal(cddp_checkpoint_save(path, a, oa, meta, &err), CDDP_OK);

    cddp_model *b = net(5, 99); /* other weights, to be overwritten */
    cddp_optim *ob = cddp_optim_adamw(b, &aw, &err);
    cddp_safetensors *f = NULL;
    assert_int_equal(cddp_checkpoint_load(path, b, ob, &f, &err), CDDP_OK);
    assert_string_equal(cddp_safetensors_meta(f, "epoch"), "3");
    assert_string_equal(cddp_safetensors_meta(f, "note"), "hello");
    assert_string_equal(cddp_safetensors_meta(f, "optimizer"), "adamw");
    assert_null(cddp_safetensors_meta(f, "missing"));
    assert_non_null(cddp_safetensors_find(f, "optim.exp_avg.fc.weight"));
    cddp_safetensors_destroy(f);
    size_t n = cddp_model_numel(a) * sizeof(float);
    assert_memory_equal(cddp_model_data(a), cddp_model_data(b), n);
    for (int s = 0; s < 2; s++)
        assert_memory_equal(cddp_optim_state(oa, s, NULL), cddp_optim_state(ob, s, NULL), n);
    assert_int_equal(cddp_optim_steps(ob), 2);
    /* Resumed training is bit-identical to uninterrupted training. */
    train_steps(a, oa, 2);
    train_steps(b, ob, 2);
    assert_memory_equal(cddp_model_data(a), cddp_model_data(b), n);
    cddp_optim_destroy(oa);
    cddp_optim_destroy(ob);
    cddp_model_destroy(a);
    cddp_model_destroy(b);
}

static void test_mismatch_is_named_and_changes_nothing(void **state) {
    (void)state;
    char path[512];
    path_in(path, sizeof path, "small.safetensors");
    cddp_error err = {0};
    cddp_model *a = net(4, 1);
    assert_int_equal(cddp_checkpoint_save(path, a, NULL, NULL, &err), CDDP_OK);
    cddp_model *b = net(5, 2);
    size_t n = cddp_model_numel(b) * sizeof(float);
    float *before = malloc(n);
    memcpy(before, cddp_model_data(b), n);
    assert_int_equal(cddp_checkpoint_load(path, b, NULL, NULL, &err), CDDP_ESHAPE);
    assert_non_null(
        strstr(err.msg, "'fc.weight' has shape (4,3) in the file but (5,3) in the model"));
    assert_non_null(strstr(err.msg, "'out.weight' has shape (2,4) in the file but (2,5)"));
    assert_non_null(strstr(err.msg, "3 differences"));
    assert_memory_equal(before, cddp_model_data(b), n);
    free(before);
    /* Names: a model with another layer name. */
    cddp_model *c = cddp_model_create();
    assert_int_equal(cddp_model_add(c, "fc", cddp_nn_linear(3, 4)), 0);
    assert_int_equal(cddp_model_add(c, "head", cddp_nn_linear(4, 2)), 0);
    assert_int_equal(cddp_model_build(c, 0), 0);
    assert_int_equal(cddp_checkpoint_load(path, c, NULL, NULL, &err), CDDP_ESHAPE);
    assert_non_null(strstr(err.msg, "'head.weight' is missing from the file"));
    assert_non_null(strstr(err.msg, "'out.weight' is in the file but not in the model"));
    /* An optimizer asked for, none saved; and the wrong kind. */
    cddp_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
    cddp_optim *sgd = cddp_optim_sgd(a, &so, &err);
    assert_int_equal(cddp_checkpoint_load(path, a, sgd, NULL, &err), CDDP_ESHAPE);
    assert_non_null(strstr(err.msg, "no optimizer state"));
    assert_int_equal(cddp_checkpoint_save(path, a, sgd, NULL, &err), CDDP_OK);
    cddp_adamw_options aw = cddp_adamw_defaults(0.1f);
    cddp_optim *adam = cddp_optim_adamw(a, &aw, &err);
    assert_int_equal(cddp_checkpoint_load(path, a, adam, NULL, &err), CDDP_ESHAPE);
    assert_non_null(strstr(err.msg, "holds sgd state but the optimizer is adamw"));
    cddp_optim_destroy(sgd);
    cddp_optim_destroy(adam);
    cddp_model_destroy(a);
    cddp_model_destroy(b);
    cddp_model_destroy(c);
}

/* Rewrites src into dst without the tensor named drop, and with tensor `change` (if not NULL)
 * changed in its first element. */
static void rewrite(const char *src, const char *dst, const char *drop, const char *change) {
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(src, &err);
    assert_non_null(f);
    int n = cddp_safetensors_count(f), k = 0;
    cddp_st_tensor *list = calloc((size_t)n, sizeof *list);
    float *changed = NULL;
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = cddp_safetensors_at(f, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        list[k] = *t;
        if (change && strcmp(t->name, change) == 0) {
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            changed = malloc(sizeof(float) * (size_t)numel);
            memcpy(changed, t->data, sizeof(float) * (size_t)numel);
            changed[0] += 1.0f;
            list[k].data = changed;
        }
        k++;
    }
    assert_int_equal(cddp_safetensors_write(dst, list, k, NULL, &err), CDDP_OK);
    free(changed);
    free(list);
    cddp_safetensors_destroy(f);
}

/* A tied parameter (GPT's head) is saved under both its names with the same values, loads back
 * from a file with or without its second name, and a file where the two differ is refused. */
static void test_tied_parameter(void **state) {
    (void)state;
    char path[512], other[512];
    path_in(path, sizeof path, "gpt.safetensors");
    path_in(other, sizeof other, "gpt_edited.safetensors");
    cddp_error err = {0};
    cddp_gpt_config g = {.vocab_size = 16, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8};
    cddp_model *a = cddp_model_create_with(cddp_nn_gpt(&g), &err);
    assert_int_equal(cddp_model_build(a, 1), CDDP_OK);
    assert_int_equal(cddp_checkpoint_save(path, a, NULL, NULL, &err), CDDP_OK);
    cddp_safetensors *f = cddp_safetensors_read(path, &err);
    const cddp_st_tensor *head = cddp_safetensors_find(f, "lm_head.weight");
    const cddp_st_tensor *wte = cddp_safetensors_find(f, "transformer.wte.weight");
    assert_non_null(head);
    assert_non_null(wte);
    assert_int_equal(head->shape[0], 16);
    assert_int_equal(head->shape[1], 8);
    assert_memory_equal(head->data, wte->data, 16 * 8 * sizeof(float));
    assert_int_equal(cddp_safetensors_count(f), cddp_model_num_params(a) + 1);
    cddp_safetensors_destroy(f);

    cddp_model *b = cddp_model_create_with(cddp_nn_gpt(&g), &err);
    assert_int_equal(cddp_model_build(b, 2), CDDP_OK);
    assert_int_equal(cddp_checkpoint_load(path, b, NULL, NULL, &err), CDDP_OK);
    assert_memory_equal(cddp_model_data(a), cddp_model_data(b),
                        cddp_model_numel(a) * sizeof(float));
    rewrite(path, other, "lm_head.weight", NULL);
    assert_int_equal(cddp_checkpoint_load(other, b, NULL, NULL, &err), CDDP_OK);
    rewrite(path, other, NULL, "lm_head.weight");
    assert_int_equal(cddp_checkpoint_load(other, b, NULL, NULL, &err), CDDP_ESHAPE);
    assert_non_null(strstr(err.msg, "'lm_head.weight' is tied to 'transformer.wte.weight' but "
                                    "they differ in the file"));
    cddp_model_destroy(a);
    cddp_model_destroy(b);
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*n);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

static void expect_read_error(const char *path, int code, const char *text) {
    cddp_error err = {0};
    assert_null(cddp_safetensors_read(path, &err));
    assert_int_equal(err.code, code);
    if (!strstr(err.msg, text)) fail_msg("error '%s' lacks '%s'", err.msg, text);
    assert_non_null(strstr(err.msg, path));
}

static void test_corrupt_files(void **state) {
    (void)state;
    char good[512], bad[512];
    path_in(good, sizeof good, "good.safetensors");
    path_in(bad, sizeof bad, "bad.safetensors");
    cddp_error err = {0};
    cddp_model *m = net(8, 1);
    assert_int_equal(cddp_checkpoint_save(good, m, NULL, NULL, &err), CDDP_OK);
    size_t n;
    char *blob = read_all(good, &n);
    /* Truncated data. */
    write_bytes(bad, blob, n - 10);
    expect_read_error(bad, CDDP_EFORMAT, "is the file truncated?");
    /* Truncated inside the header, and too short for a header. */
    write_bytes(bad, blob, 20);
    expect_read_error(bad, CDDP_EFORMAT, "header length");
    write_bytes(bad, blob, 5);
    expect_read_error(bad, CDDP_EFORMAT, "too short");
    /* A header length that points past the end. */
    char *copy = malloc(n);
    memcpy(copy, blob, n);
    uint64_t huge = 1ull << 40;
    memcpy(copy, &huge, 8);
    write_bytes(bad, copy, n);
    expect_read_error(bad, CDDP_EFORMAT, "header length");
    /* Broken JSON. */
    memcpy(copy, blob, n);
    copy[8] = '[';
    write_bytes(bad, copy, n);
    expect_read_error(bad, CDDP_EFORMAT, "not a JSON object");
    /* A dtype cddp does not read. */
    memcpy(copy, blob, n);
    char *dt = strstr(copy + 8, "\"F32\"");
    assert_non_null(dt);
    memcpy(dt, "\"BF6\"", 5);
    write_bytes(bad, copy, n);
    expect_read_error(bad, CDDP_EUNSUPPORTED, "dtype BF6");
    /* A shape that disagrees with its byte range. */
    memcpy(copy, blob, n);
    char *shape = strstr(copy + 8, "[8,3]");
    assert_non_null(shape);
    shape[1] = '7';
    write_bytes(bad, copy, n);
    expect_read_error(bad, CDDP_EFORMAT, "shape and dtype need");
    /* No file at all. */
    path_in(bad, sizeof bad, "absent.safetensors");
    expect_read_error(bad, CDDP_ENOENT, "cannot open");
    free(copy);
    free(blob);
    cddp_model_destroy(m);
}

/* Writes a safetensors file with this header (padded to 8 bytes) and n zero data bytes. */
static void write_header(const char *path, const char *json, size_t n) {
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    char *buf = calloc(1, 8 + padded + n);
    uint64_t hl = padded;
    memcpy(buf, &hl, 8);
    memset(buf + 8, ' ', padded);
    memcpy(buf + 8, json, len);
    write_bytes(path, buf, 8 + padded + n);
    free(buf);
}

/* JSON allows a key twice; a header that repeats __metadata__ once made the reader write past its
 * metadata array (heap corruption, a crash under --resume). Each repetition is refused by name,
 * and so are repeated tensor names and metadata keys. */
static void test_repeated_keys(void **state) {
    (void)state;
    char bad[512];
    path_in(bad, sizeof bad, "repeated.safetensors");
    write_header(bad,
                 "{\"__metadata__\":{\"a\":\"1\"},\"__metadata__\":{\"b\":\"2\",\"c\":\"3\","
                 "\"d\":\"4\",\"e\":\"5\",\"f\":\"6\",\"g\":\"7\",\"h\":\"8\"}}",
                 0);
    expect_read_error(bad, CDDP_EFORMAT, "__metadata__ appears twice");
    write_header(bad,
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8);
    expect_read_error(bad, CDDP_EFORMAT, "'w' appears twice in the header");
    write_header(bad, "{\"__metadata__\":{\"epoch\":\"1\",\"epoch\":\"9\"}}", 0);
    expect_read_error(bad, CDDP_EFORMAT, "'epoch' appears twice in the header");
    /* The same file without the repetition reads. */
    write_header(bad, "{\"__metadata__\":{\"epoch\":\"1\"}}", 0);
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(bad, &err);
    assert_non_null(f);
    assert_string_equal(cddp_safetensors_meta(f, "epoch"), "1");
    cddp_safetensors_destroy(f);
}

/* Two tensors that share bytes: a file no writer makes, refused with both tensors' ranges. Tensors
 * in any order of offsets that do not overlap, and an empty tensor at another's offset, read. */
static void test_overlapping_offsets(void **state) {
    (void)state;
    char bad[512];
    path_in(bad, sizeof bad, "overlap.safetensors");
    write_header(bad,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
                 16);
    expect_read_error(bad, CDDP_EFORMAT,
                      "tensors 'b' (bytes 0-12) and 'a' (bytes 8-16) overlap in the data section");
    write_header(bad,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
                 16);
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(bad, &err);
    assert_non_null(f);
    assert_int_equal(cddp_safetensors_count(f), 3);
    cddp_safetensors_destroy(f);
}

static int count_temporaries(void) {
    DIR *d = opendir(test_dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void test_failed_write_leaves_nothing(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_model *m = net(4, 1);
    assert_int_equal(cddp_checkpoint_save("/nonexistent-dir/x.safetensors", m, NULL, NULL, &err),
                     CDDP_EIO);
    assert_non_null(strstr(err.msg, "cannot create /nonexistent-dir/x.safetensors.tmp."));
    /* The final rename fails (the target is a folder): the temporary is removed. */
    char target[512];
    path_in(target, sizeof target, "a-folder");
    assert_int_equal(mkdir(target, 0700), 0);
    char inner[600];
    snprintf(inner, sizeof inner, "%s/keep", target);
    write_bytes(inner, "x", 1);
    assert_int_equal(cddp_checkpoint_save(target, m, NULL, NULL, &err), CDDP_EIO);
    assert_non_null(strstr(err.msg, "renaming"));
    assert_int_equal(count_temporaries(), 0);
    cddp_model_destroy(m);
}

/* A writer killed mid-save never leaves a torn checkpoint under the final name: the file there
 * is always one complete save (every weight equal to that save's constant). */
static void test_killed_writer_never_tears_the_file(void **state) {
    (void)state;
    char path[512];
    path_in(path, sizeof path, "big.safetensors");
    cddp_error err = {0};
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add_param(m, "w", CDDP_SHAPE(4 << 20), (cddp_init){0}, NULL), 0);
    assert_int_equal(cddp_model_build(m, 0), 0);
    assert_int_equal(cddp_checkpoint_save(path, m, NULL, NULL, &err), CDDP_OK);
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            for (int k = 1;; k++) {
                float *d = cddp_model_data(m);
                for (size_t i = 0; i < cddp_model_numel(m); i++) d[i] = (float)k;
                if (cddp_checkpoint_save(path, m, NULL, NULL, &err) != CDDP_OK) _exit(1);
            }
        }
        usleep(30000 + 40000 * (useconds_t)round);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cddp_model *r = cddp_model_create();
        assert_int_equal(cddp_model_add_param(r, "w", CDDP_SHAPE(4 << 20), (cddp_init){0}, NULL),
                         0);
        assert_int_equal(cddp_model_build(r, 0), 0);
        assert_int_equal(cddp_checkpoint_load(path, r, NULL, NULL, &err), CDDP_OK);
        const float *d = cddp_model_data(r);
        for (size_t i = 1; i < cddp_model_numel(r); i++)
            if (d[i] != d[0]) fail_msg("torn checkpoint: w[0] = %g but w[%zu] = %g", d[0], i, d[i]);
        cddp_model_destroy(r);
    }
    /* The killed writers' temporaries are swept by the next save; one of a writer that still
     * runs (the test's parent) stays, and so does one of another host. */
    char host[256] = "host", live[1024], other[1024];
    gethostname(host, sizeof host - 1);
    for (char *c = host; *c; c++)
        if (*c == '/' || *c == '.') *c = '_';
    snprintf(live, sizeof live, "%s.tmp.%s.%ld", path, host, (long)getppid());
    snprintf(other, sizeof other, "%s.tmp.elsewhere.%ld", path, (long)getpid() + 1000000);
    write_bytes(live, "x", 1);
    write_bytes(other, "x", 1);
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0);
    char dead[1024];
    snprintf(dead, sizeof dead, "%s.tmp.%s.%ld", path, host, (long)gone);
    write_bytes(dead, "x", 1);
    assert_int_equal(cddp_checkpoint_save(path, m, NULL, NULL, &err), CDDP_OK);
    assert_int_equal(access(dead, F_OK), -1);
    assert_int_equal(access(live, F_OK), 0);
    assert_int_equal(access(other, F_OK), 0);
    assert_int_equal(count_temporaries(), 2);
    unlink(live);
    unlink(other);
    cddp_model_destroy(m);
}

/* The fixtures under tests/reference were written by Python (safetensors_np.py). */
static void test_reads_python_written_files(void **state) {
    (void)state;
    char path[4096];
    source_path(path, sizeof path, "tests/reference/cnn.safetensors");
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(path, &err);
    if (!f) fail_msg("%s", err.msg);
    assert_string_equal(cddp_safetensors_meta(f, "generator"), "tests/reference/make_fixtures.py");
    const cddp_st_tensor *w = cddp_safetensors_find(f, "init.0.weight");
    assert_non_null(w);
    assert_int_equal(w->dtype, CDDP_F32);
    assert_int_equal(w->ndim, 4);
    assert_int_equal(w->shape[0], 4);
    assert_int_equal(w->shape[1], 1);
    assert_int_equal(w->shape[2], 3);
    assert_int_equal((uintptr_t)w->data % sizeof(float), 0); /* usable in place */
    const cddp_st_tensor *y = cddp_safetensors_find(f, "y.0");
    assert_int_equal(y->dtype, CDDP_I64);
    for (int i = 0; i < 8; i++)
        assert_true(((const int64_t *)y->data)[i] >= 0 && ((const int64_t *)y->data)[i] < 10);
    cddp_safetensors_destroy(f);
}

/* The file check_interop.py reads: known values of each dtype, and metadata. */
static int write_interop(const char *path) {
    float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
    int64_t i64[3] = {-5, 0, 1ll << 40};
    int32_t i32[1] = {42};
    cddp_st_tensor t[3] = {
        {.name = "weights", .dtype = CDDP_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "labels", .dtype = CDDP_I64, .ndim = 1, .shape = {3}, .data = i64},
        {.name = "scalar", .dtype = CDDP_I32, .ndim = 0, .data = i32},
    };
    const char *meta[] = {"writer", "cddp", "epoch", "7", NULL};
    cddp_error err = {0};
    if (cddp_safetensors_write(path, t, 3, meta, &err) != CDDP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    return 0;
}

/* TensorBoard's event files (cddp/summary.h): each record is its length, the length's masked
 * CRC-32C, the data and the data's masked CRC-32C (TensorBoard's reader checks the CRCs:
 * tests/tools/tensorboard_test.sh); the first event holds the file's version, a scalar's its tag
 * and value; bad tags and folders are refused with the reason. */
static void test_summary_writer(void **state) {
    (void)state;
    char dir[] = "/tmp/cddp_summary_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[600];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    cddp_error err = {0};
    cddp_summary *s = cddp_summary_open(sub, &err); /* parents made */
    assert_non_null(s);
    assert_int_equal(cddp_summary_scalar(s, "loss", 7, 2.5, &err), CDDP_OK);
    assert_int_equal(cddp_summary_scalar(s, "", 7, 2.5, &err), CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "tag"));
    char path[512];
    snprintf(path, sizeof path, "%s", cddp_summary_path(s));
    assert_non_null(strstr(path, "/events.out.tfevents."));
    assert_int_equal(cddp_summary_close(s, &err), CDDP_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* record 1: an event of 9 (wall time) + 15 (file_version "brain.Event:2") bytes */
    assert_true(n > 12 + 24 + 4);
    assert_int_equal(buf[0], 24);
    assert_memory_equal(buf + 12 + 11, "brain.Event:2", 13);
    /* record 2: its event ends in the Summary's value {tag "loss", simple_value 2.5f} */
    size_t r2 = 12 + 24 + 4, len2 = buf[r2];
    float v;
    memcpy(&v, buf + r2 + 12 + len2 - 4, 4);
    assert_true(v == 2.5f);
    assert_memory_equal(buf + r2 + 12 + len2 - 9, "loss", 4);
    assert_int_equal(n, r2 + 12 + len2 + 4);
    /* a folder under a file: refused, naming the file */
    snprintf(sub, sizeof sub, "%s/x", path);
    assert_null(cddp_summary_open(sub, &err));
    assert_non_null(strstr(err.msg, "events.out.tfevents."));
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-interop") == 0) return write_interop(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_resume),
        cmocka_unit_test(test_mismatch_is_named_and_changes_nothing),
        cmocka_unit_test(test_tied_parameter),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_repeated_keys),
        cmocka_unit_test(test_overlapping_offsets),
        cmocka_unit_test(test_failed_write_leaves_nothing),
        cmocka_unit_test(test_killed_writer_never_tears_the_file),
        cmocka_unit_test(test_reads_python_written_files),
        cmocka_unit_test(test_summary_writer),
    };
    return cmocka_run_group_tests(tests, temp_dir_setup, temp_dir_teardown);
}
