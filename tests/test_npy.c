/* test_npy.c: NumPy's .npy files as a dataset (cddp_dataset_from_files): files written by NumPy
 * itself (tests/data/npy_fixtures.py) of every element type, in each field dtype, sample by sample
 * against the values NumPy wrote; under the sampler and the loader; values out of a field's range;
 * what NumPy writes that cddp refuses, and damaged headers written byte by byte, each with a
 * message naming the file and the remedy; arrays in NumPy's archives (.npz), stored and compressed.
 */
#include "helpers.h"

#include "data/internal.h"

#include <sys/stat.h>

static char fixtures[320];

static int make_fixtures(void **state) {
    if (temp_dir_setup(state) != 0) return -1;
    snprintf(fixtures, sizeof fixtures, "%s/npy", test_dir);
    char script[512], cmd[1200];
    source_path(script, sizeof script, "tests/data/npy_fixtures.py");
    const char *py = getenv("CDDP_PYTHON3"); /* Debian's, which has NumPy */
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", py && *py ? py : "python3", script, fixtures);
    if (system(cmd) != 0) {
        fprintf(stderr,
                "%s failed: NumPy is needed (Debian's python3-numpy; make test installs "
                "it)\n",
                cmd);
        return -1;
    }
    return 0;
}

static const char *fx(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", fixtures, name);
    return p[k];
}

/* Element j of the fixtures' arrays of kind code (npy_fixtures.py's formula). */
static double want(const char *code, int64_t j) {
    if (code[0] == 'b') return j % 3 == 0;
    if (code[0] == 'u') return (double)(j * 7 % 251);
    if (code[0] == 'i') return (double)(j * 7 % 251 - 125);
    return (double)(j * 7 % 251 - 125) / 4;
}

static cddp_dataset *open1(const char *name, int dtype, cddp_error *err) {
    const char *p = fx(name);
    cddp_dtype d = (cddp_dtype)dtype;
    return cddp_dataset_from_files(1, &p, dtype < 0 ? NULL : &d, err);
}

/* Every sample of a (5, 2, 3) fixture read as dtype, against the formula. */
static void check_all(const char *code, int dtype) {
    char name[16];
    snprintf(name, sizeof name, "%s.npy", code);
    cddp_error err = {0};
    cddp_dataset *ds = open1(name, dtype, &err);
    if (!ds) fail_msg("%s as %d: %s", name, dtype, err.msg);
    const cddp_field *f = cddp_dataset_field(ds, 0);
    cddp_dtype expect = dtype >= 0 ? (cddp_dtype)dtype : code[0] == 'f' ? CDDP_F32 : CDDP_I64;
    assert_int_equal(f->dtype, expect);
    assert_string_equal(f->name, code);
    assert_int_equal(f->ndim, 2);
    assert_int_equal(f->shape[0], 2);
    assert_int_equal(f->shape[1], 3);
    assert_int_equal(cddp_dataset_len(ds), 5);
    for (int64_t i = 0; i < 5; i++) {
        union {
            float f[6];
            int32_t i32[6];
            int64_t i64[6];
        } got;
        void *out[1] = {&got};
        assert_int_equal(cddp_dataset_get(ds, i, out, &err), CDDP_OK);
        for (int k = 0; k < 6; k++) {
            double w = want(code, i * 6 + k), g = expect == CDDP_F32   ? (double)got.f[k]
                                                  : expect == CDDP_I32 ? (double)got.i32[k]
                                                                       : (double)got.i64[k];
            if (g != w)
                fail_msg("%s as %s: sample %lld element %d is %g, NumPy wrote %g", name,
                         cddp_dtype_name(expect), (long long)i, k, g, w);
        }
    }
    cddp_dataset_destroy(ds);
}

static void test_every_kind(void **state) {
    (void)state;
    static const char *codes[] = {"b1", "i1", "i2", "i4", "i8", "u1",
                                  "u2", "u4", "u8", "f2", "f4", "f8"};
    for (size_t c = 0; c < CDDP_ARRAY_LEN(codes); c++) {
        check_all(codes[c], -1);
        check_all(codes[c], CDDP_F32);
        if (codes[c][0] != 'f') {
            check_all(codes[c], CDDP_I32);
            check_all(codes[c], CDDP_I64);
        }
    }
    /* format versions 2 and 3 hold the same float32 array as f4.npy */
    cddp_error err = {0};
    for (int v = 2; v <= 3; v++) {
        char name[16];
        snprintf(name, sizeof name, "v%d.npy", v);
        cddp_dataset *ds = open1(name, -1, &err);
        if (!ds) fail_msg("%s: %s", name, err.msg);
        float got[6];
        void *out[1] = {got};
        assert_int_equal(cddp_dataset_get(ds, 4, out, &err), CDDP_OK);
        for (int k = 0; k < 6; k++) assert_true(got[k] == (float)want("f4", 24 + k));
        cddp_dataset_destroy(ds);
    }
}

/* Images and labels as a user saves them, through the sampler and the prefetching loader. */
static void test_under_the_loader(void **state) {
    (void)state;
    cddp_error err = {0};
    const char *paths[2] = {fx("images.npy"), fx("labels.npy")};
    cddp_dataset *ds = cddp_dataset_from_files(2, paths, (cddp_dtype[]){CDDP_F32, CDDP_I64}, &err);
    if (!ds) fail_msg("%s", err.msg);
    const cddp_field *img = cddp_dataset_field(ds, 0), *lab = cddp_dataset_field(ds, 1);
    assert_string_equal(img->name, "images");
    assert_int_equal(img->ndim, 3);
    assert_int_equal(img->shape[0] * 100 + img->shape[1] * 10 + img->shape[2], 123);
    assert_string_equal(lab->name, "labels");
    assert_int_equal(lab->ndim, 0);
    cddp_sampler_options so = cddp_sampler_defaults();
    so.num_replicas = 1;
    so.rank = 0;
    cddp_sampler *s = cddp_sampler_create(5, &so, &err);
    assert_non_null(s);
    cddp_loader_options lo = {
        .batch_size = 2, .prefetch = 2, .rescale = true, .rescale_scale = 0.5f};
    cddp_loader *l = cddp_loader_create(ds, s, &lo, &err);
    if (!l) fail_msg("%s", err.msg);
    static const int64_t labels[5] = {3, 1, 4, 1, 5};
    int64_t seen = 0, b = cddp_loader_begin(l);
    assert_int_equal(b, 3);
    cddp_batch batch;
    while (cddp_loader_next(l, &batch, &err) == 1) {
        const float *x = batch.data[0];
        const int64_t *y = batch.data[1];
        for (int64_t r = 0; r < batch.size; r++, seen++) {
            int64_t i = batch.indices[r];
            assert_int_equal(y[r], labels[i]);
            for (int k = 0; k < 6; k++)
                assert_true(x[r * 6 + k] == (float)want("u1", i * 6 + k) * 0.5f);
        }
    }
    assert_string_equal(err.msg, "");
    assert_int_equal(seen, 5);
    cddp_loader_destroy(l);
    cddp_sampler_destroy(s);
    cddp_dataset_destroy(ds);
}

/* Fetching sample i of name as dtype fails naming the value; the other samples read. */
static void out_of_range(const char *name, int dtype, const char *value) {
    cddp_error err = {0};
    cddp_dataset *ds = open1(name, dtype, &err);
    if (!ds) fail_msg("%s: %s", name, err.msg);
    int64_t buf[2];
    void *out[1] = {buf};
    assert_int_equal(cddp_dataset_get(ds, 0, out, &err), CDDP_OK);
    assert_int_equal(cddp_dataset_get(ds, 2, out, &err), CDDP_OK);
    assert_int_equal(cddp_dataset_get(ds, 1, out, &err), CDDP_ERANGE);
    if (!strstr(err.msg, name) || !strstr(err.msg, "sample 1") || !strstr(err.msg, value))
        fail_msg("%s: the message does not name the file, the sample and %s: %s", name, value,
                 err.msg);
    cddp_dataset_destroy(ds);
}

static void test_ranges(void **state) {
    (void)state;
    out_of_range("u8_big.npy", CDDP_I64, "9223372036854775808");
    out_of_range("u8_big.npy", CDDP_I32, "9223372036854775808");
    out_of_range("i8_wide.npy", CDDP_I32, "-1099511627776");
    out_of_range("u4_big.npy", CDDP_I32, "4294967295");
    /* where the field is wide enough, the values are NumPy's */
    cddp_error err = {0};
    cddp_dataset *ds = open1("i8_wide.npy", CDDP_I64, &err);
    assert_non_null(ds);
    int64_t v[2];
    void *out[1] = {v};
    assert_int_equal(cddp_dataset_get(ds, 1, out, &err), CDDP_OK);
    assert_true(v[0] == -((int64_t)1 << 40) && v[1] == 0);
    cddp_dataset_destroy(ds);
    ds = open1("u8_big.npy", CDDP_F32, &err);
    assert_non_null(ds);
    float f[2];
    out[0] = f;
    assert_int_equal(cddp_dataset_get(ds, 1, out, &err), CDDP_OK);
    assert_true(f[0] == 0 && f[1] == 0x1p63f);
    cddp_dataset_destroy(ds);
}

/* np.save to the same path rewrites the file in place, maybe while a job reads it: a sample
 * that is no longer there fails naming the file; the ones still there read as before. */
static void test_rewritten_under_the_job(void **state) {
    (void)state;
    int64_t keep = cddp__npy_memory_max;
    cddp__npy_memory_max = 0; /* read a sample at a time, as a large array is */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", fx("f4.npy"), fx("rewritten.npy"));
    assert_int_equal(system(cmd), 0);
    cddp_error err = {0};
    cddp_dataset *ds = open1("rewritten.npy", -1, &err);
    if (!ds) fail_msg("%s", err.msg);
    assert_int_equal(truncate(fx("rewritten.npy"), 128 + 2 * 24), 0); /* 2 of the 5 samples */
    float got[6];
    void *out[1] = {got};
    assert_int_equal(cddp_dataset_get(ds, 1, out, &err), CDDP_OK);
    for (int k = 0; k < 6; k++) assert_true(got[k] == (float)want("f4", 6 + k));
    assert_int_equal(cddp_dataset_get(ds, 4, out, &err), CDDP_EIO);
    if (!strstr(err.msg, "rewritten.npy: reading sample 4") || !strstr(err.msg, "ends before it"))
        fail_msg("the message does not name the file and the sample: %s", err.msg);
    cddp_dataset_destroy(ds);
    cddp__npy_memory_max = keep;
}

/* Opening fails with status rc and a message holding each of the words. */
static void refused(int n, const char *const *paths, const cddp_dtype *dtypes, int rc,
                    const char *w1, const char *w2) {
    cddp_error err = {0};
    assert_null(cddp_dataset_from_files(n, paths, dtypes, &err));
    if (err.code != rc || !strstr(err.msg, w1) || (w2 && !strstr(err.msg, w2)))
        fail_msg("expected %d with '%s'%s%s, got %d: %s", rc, w1, w2 ? " and " : "", w2 ? w2 : "",
                 err.code, err.msg);
}

static void refused1(const char *name, int dtype, int rc, const char *words) {
    const char *p = fx(name);
    cddp_dtype d = (cddp_dtype)dtype;
    refused(1, &p, dtype < 0 ? NULL : &d, rc, name, words);
}

/* NumPy's archives: ARCHIVE:NAME fields, stored (np.savez) and deflated (np.savez_compressed),
 * the same values as the .npy files; the archive alone, a missing name, an array in Fortran order
 * inside, and damaged archives (cut short; a changed byte in a deflated member) refused in words.
 */
static void test_archives(void **state) {
    (void)state;
    static const int64_t labels[5] = {3, 1, 4, 1, 5};
    const char *archives[2] = {"stored.npz", "compressed.npz"};
    for (int z = 0; z < 2; z++) {
        char img[512], lab[512];
        snprintf(img, sizeof img, "%s:images", fx(archives[z]));
        snprintf(lab, sizeof lab, "%s:labels.npy", fx(archives[z]));
        const char *paths[2] = {img, lab};
        cddp_error err = {0};
        cddp_dataset *ds =
            cddp_dataset_from_files(2, paths, (cddp_dtype[]){CDDP_F32, CDDP_I64}, &err);
        if (!ds) fail_msg("%s: %s", archives[z], err.msg);
        assert_string_equal(cddp_dataset_field(ds, 0)->name, "images");
        assert_string_equal(cddp_dataset_field(ds, 1)->name, "labels");
        assert_int_equal(cddp_dataset_field(ds, 0)->ndim, 3);
        assert_int_equal(cddp_dataset_len(ds), 5);
        for (int64_t i = 0; i < 5; i++) {
            float x[6];
            int64_t y;
            void *out[2] = {x, &y};
            assert_int_equal(cddp_dataset_get(ds, i, out, &err), CDDP_OK);
            assert_int_equal(y, labels[i]);
            for (int k = 0; k < 6; k++) assert_true(x[k] == (float)want("u1", i * 6 + k));
        }
        cddp_dataset_destroy(ds);
    }
    refused1("stored.npz", -1, CDDP_EINVAL, "stored.npz:NAME (it holds images, labels)");
    char p[512];
    snprintf(p, sizeof p, "%s:nope", fx("compressed.npz"));
    const char *one = p;
    refused(1, &one, NULL, CDDP_ENOENT, "holds no array 'nope' (it holds images, labels)", NULL);
    snprintf(p, sizeof p, "%s:x", fx("fortran.npz"));
    refused(1, &one, NULL, CDDP_EUNSUPPORTED, "fortran.npz:x is in Fortran order", NULL);
    /* cut short: the end of the central directory is gone */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "head -c 300 '%s' > '%s'", fx("stored.npz"), fx("cut.npz"));
    assert_int_equal(system(cmd), 0);
    snprintf(p, sizeof p, "%s:images", fx("cut.npz"));
    refused(1, &one, NULL, CDDP_EFORMAT, "cut.npz: no end of central directory", NULL);
    /* a changed byte in the deflated images: zlib or the CRC-32 catches it */
    size_t n;
    uint8_t *zb = slurp(fx("compressed.npz"), &n);
    zb[30 + strlen("images.npy") + 20] ^= 0x55; /* inside the first member's data */
    FILE *f = fopen(fx("changed.npz"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(zb, 1, n, f), n);
    fclose(f);
    free(zb);
    snprintf(p, sizeof p, "%s:images", fx("changed.npz"));
    cddp_error err = {0};
    assert_null(cddp_dataset_from_files(1, &one, NULL, &err));
    if (!strstr(err.msg, "changed.npz") ||
        (!strstr(err.msg, "does not inflate") && !strstr(err.msg, "CRC-32")))
        fail_msg("a changed deflated member: %s", err.msg);
}

/* Tensors of a safetensors file (FILE:NAME): U8 images and I64 labels as the .npy files give
 * them, BF16 and F16 values widened exactly; the file alone, a missing name, an 8-bit float, a
 * tensor whose span does not fit its shape, and ":NAME" on a .npy file refused in words. */
static void test_safetensors(void **state) {
    (void)state;
    char img[512], lab[512], b16[512], h16[512];
    snprintf(img, sizeof img, "%s:images", fx("tensors.safetensors"));
    snprintf(lab, sizeof lab, "%s:labels", fx("tensors.safetensors"));
    snprintf(b16, sizeof b16, "%s:bf16", fx("tensors.safetensors"));
    snprintf(h16, sizeof h16, "%s:f16", fx("tensors.safetensors"));
    const char *paths[4] = {img, lab, b16, h16};
    cddp_error err = {0};
    cddp_dataset *ds = cddp_dataset_from_files(
        4, paths, (cddp_dtype[]){CDDP_F32, CDDP_I64, CDDP_F32, CDDP_F32}, &err);
    if (!ds) fail_msg("%s", err.msg);
    assert_string_equal(cddp_dataset_field(ds, 2)->name, "bf16");
    assert_int_equal(cddp_dataset_field(ds, 2)->ndim, 2);
    static const int64_t labels[5] = {3, 1, 4, 1, 5};
    for (int64_t i = 0; i < 5; i++) {
        float x[6], b[6], h[6];
        int64_t y;
        void *out[4] = {x, &y, b, h};
        assert_int_equal(cddp_dataset_get(ds, i, out, &err), CDDP_OK);
        assert_int_equal(y, labels[i]);
        for (int k = 0; k < 6; k++) {
            assert_true(x[k] == (float)want("u1", i * 6 + k));
            assert_true(b[k] == (float)want("f4", i * 6 + k));
            assert_true(h[k] == (float)want("f2", i * 6 + k));
        }
    }
    cddp_dataset_destroy(ds);
    refused1("tensors.safetensors", -1, CDDP_EINVAL,
             "tensors.safetensors:NAME (it holds images, labels, bf16, f16, f8)");
    char p[512];
    const char *one = p;
    snprintf(p, sizeof p, "%s:nope", fx("tensors.safetensors"));
    refused(1, &one, NULL, CDDP_ENOENT, "holds no tensor 'nope'", NULL);
    snprintf(p, sizeof p, "%s:f8", fx("tensors.safetensors"));
    refused(1, &one, NULL, CDDP_EUNSUPPORTED, "tensor 'f8' holds F8_E4M3", NULL);
    snprintf(p, sizeof p, "%s:x", fx("bad_span.safetensors"));
    refused(1, &one, NULL, CDDP_EFORMAT,
            "its data_offsets span 116 bytes, but 5 samples of 6 float32 need 120", NULL);
    snprintf(p, sizeof p, "%s:x", fx("f4.npy"));
    refused(1, &one, NULL, CDDP_EINVAL, "is neither a .npz archive nor a safetensors file", NULL);
}

static void test_refused_numpy_files(void **state) {
    (void)state;
    refused1("big_endian.npy", -1, CDDP_EUNSUPPORTED, "astype('<f4')");
    refused1("fortran.npy", -1, CDDP_EUNSUPPORTED, "np.ascontiguousarray");
    refused1("structured.npy", -1, CDDP_EUNSUPPORTED, "structured");
    refused1("objects.npy", -1, CDDP_EUNSUPPORTED, "Python objects");
    refused1("complex.npy", -1, CDDP_EUNSUPPORTED, "complex");
    refused1("strings.npy", -1, CDDP_EUNSUPPORTED, "strings");
    refused1("longdouble.npy", -1, CDDP_EUNSUPPORTED, "long doubles");
    refused1("scalar.npy", -1, CDDP_EINVAL, "single value");
    refused1("empty.npy", -1, CDDP_EINVAL, "no samples");
    refused1("no_elements.npy", -1, CDDP_EINVAL, "no elements");
    refused1("dims5.npy", -1, CDDP_EUNSUPPORTED, "5 dimensions");
    refused1("two.npy", -1, CDDP_EFORMAT, "one array a file");
    refused1("f8.npy", CDDP_I64, CDDP_EINVAL, "x.astype(np.int64)");
    refused1("f4.npy", CDDP_BF16, CDDP_EINVAL, "float32, int32 or int64");
    refused1("missing.npy", -1, CDDP_ENOENT, "No such file");
    const char *two[2] = {fx("f4.npy"), fx("count4.npy")};
    refused(2, two, NULL, CDDP_EINVAL, "count4.npy 4", "same first dimension");
    refused(0, two, NULL, CDDP_EINVAL, "1 to 4", NULL);
    refused(5, two, NULL, CDDP_EINVAL, "not 5", NULL);
    const char *folder = fixtures;
    refused(1, &folder, NULL, CDDP_EINVAL, "is a folder", NULL);
}

/* A file of the given bytes; then its refusal must hold the words. */
static void crafted(const char *what, const void *bytes, size_t n, int rc, const char *words) {
    const char *p = fx("crafted.npy");
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
    cddp_error err = {0};
    cddp_dataset *ds = cddp_dataset_from_files(1, &p, NULL, &err);
    if (ds || err.code != rc || !strstr(err.msg, words) || !strstr(err.msg, "crafted.npy"))
        fail_msg("%s: expected %d with '%s', got %s%d: %s", what, rc, words,
                 ds ? "a dataset, " : "", err.code, err.msg);
}

/* A version-1 file: the magic, the header padded to 64 bytes, then data bytes of data. */
static size_t npy1(uint8_t *buf, const char *dict, size_t data) {
    size_t hl = strlen(dict), total = (10 + hl + 1 + 63) / 64 * 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)((total - 10) & 0xff);
    buf[9] = (uint8_t)((total - 10) >> 8);
    memcpy(buf + 10, dict, hl);
    memset(buf + 10 + hl, ' ', total - 10 - hl - 1);
    buf[total - 1] = '\n';
    memset(buf + total, 7, data);
    return total + data;
}

static void test_damaged_headers(void **state) {
    (void)state;
    uint8_t b[4096];
    size_t n;
    const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
    n = npy1(b, good, 24);
    { /* the hand-made file itself is good, in NumPy's layout and without the spaces */
        const char *p = fx("crafted.npy");
        FILE *f = fopen(p, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        cddp_error err = {0};
        cddp_dataset *ds = cddp_dataset_from_files(1, &p, NULL, &err);
        if (!ds) fail_msg("%s", err.msg);
        assert_int_equal(cddp_dataset_len(ds), 3);
        cddp_dataset_destroy(ds);
        n = npy1(b, "{\"shape\":(3,2,),\"descr\":\"<f4\",\"fortran_order\":False}", 24);
        f = fopen(p, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        ds = cddp_dataset_from_files(1, &p, NULL, &err);
        if (!ds) fail_msg("%s", err.msg);
        cddp_dataset_destroy(ds);
    }
    n = npy1(b, good, 20);
    crafted("truncated", b, n, CDDP_EFORMAT, "truncated: 3 samples of 2 float32 need 24 bytes");
    crafted("short", b, 6, CDDP_EFORMAT, "not a .npy file");
    static const char gif[] = "GIF89a, an image, say";
    crafted("not npy", gif, sizeof gif - 1, CDDP_EFORMAT, "\\x93NUMPY");
    static const char zip[] = "PK\x03\x04 but no zip archive";
    crafted("a zip's start", zip, sizeof zip - 1, CDDP_EFORMAT, "no end of central directory");
    n = npy1(b, good, 24);
    b[6] = 4;
    crafted("version 4", b, n, CDDP_EUNSUPPORTED, "version 4.0");
    n = npy1(b, good, 24);
    b[8] = 0xff, b[9] = 0xff;
    crafted("header past the end", b, n, CDDP_EFORMAT, "does not fit");
    static const char *bad_dicts[] = {
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3,, 2), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 2), }",
        "{'descr': '<f4', 'fortran_order': 0, 'shape': (3, 2), }",
        "{'descr': '<f\\4', 'fortran_order': False, 'shape': (3, 2), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), } x",
        "{'descr': '<f4' 'fortran_order': False, 'shape': (3, 2), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2)",
        "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (3, 2), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 2), }",
        "['descr', '<f4']",
    };
    for (size_t k = 0; k < CDDP_ARRAY_LEN(bad_dicts); k++) {
        n = npy1(b, bad_dicts[k], 24);
        crafted(bad_dicts[k], b, n, CDDP_EFORMAT, "not the dict NumPy writes");
    }
    n = npy1(b, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), 'x': 1}", 24);
    crafted("a key of its own", b, n, CDDP_EFORMAT, "the key 'x'");
    n = npy1(b,
             "{'descr': '<f4', 'fortran_order': False, "
             "'shape': (4611686018427387903, 4611686018427387903), }",
             24);
    crafted("a shape past any file", b, n, CDDP_EFORMAT, "too large");
    n = npy1(b, "{'descr': '<f5', 'fortran_order': False, 'shape': (3, 2), }", 24);
    crafted("float of 5 bytes", b, n, CDDP_EUNSUPPORTED, "'<f5'");
    n = npy1(b, "{'descr': '<f+4', 'fortran_order': False, 'shape': (3, 2), }", 24);
    crafted("a sign in the size", b, n, CDDP_EUNSUPPORTED, "'<f+4'");
    n = npy1(b, "{'descr': '', 'fortran_order': False, 'shape': (3, 2), }", 24);
    crafted("no descr", b, n, CDDP_EFORMAT, "not the dict");
}

/* The same with every array read a sample at a time from its file, as arrays over 64 MiB are
 * (the others above come whole into memory at open). */
static void test_from_the_files(void **state) {
    int64_t keep = cddp__npy_memory_max;
    cddp__npy_memory_max = 0;
    test_every_kind(state);
    test_under_the_loader(state);
    test_ranges(state);
    test_archives(state);
    test_safetensors(state);
    cddp__npy_memory_max = keep;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_under_the_loader),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_rewritten_under_the_job),
        cmocka_unit_test(test_refused_numpy_files),
        cmocka_unit_test(test_archives),
        cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_damaged_headers),
        cmocka_unit_test(test_from_the_files),
    };
    return cmocka_run_group_tests(tests, make_fixtures, temp_dir_teardown);
}
