/* test_idx.c: the IDX reader on every element type, gzip and raw, on corrupt files, and
 * (Fashion-)MNIST loading on the real Debian data. */
#include "helpers.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

/* Writes bytes to test_dir/name, gzip-compressed when gz. */
static void put(const char *name, const void *data, size_t n, bool gz, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", test_dir, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, data, (unsigned)n), (int)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, n, f), n);
        fclose(f);
    }
}

/* An IDX image: header for type and dims, then the elements big-endian. */
static size_t make_idx(uint8_t *buf, int type, int ndim, const uint32_t *dims, const void *elems,
                       size_t esize, size_t count) {
    size_t k = 0;
    buf[k++] = 0;
    buf[k++] = 0;
    buf[k++] = (uint8_t)type;
    buf[k++] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[k++] = (uint8_t)(dims[i] >> 24);
        buf[k++] = (uint8_t)(dims[i] >> 16);
        buf[k++] = (uint8_t)(dims[i] >> 8);
        buf[k++] = (uint8_t)dims[i];
    }
    const uint8_t *e = elems;
    for (size_t i = 0; i < count; i++)
        for (size_t b = 0; b < esize; b++) buf[k++] = e[i * esize + esize - 1 - b];
    return k;
}

static void test_every_type_gzip_and_raw(void **state) {
    (void)state;
    uint8_t u8[6] = {0, 1, 2, 250, 254, 255};
    int8_t i8[6] = {-128, -1, 0, 1, 2, 127};
    int16_t i16[6] = {-32768, -2, 0, 3, 1000, 32767};
    int32_t i32[6] = {INT32_MIN, -70000, 0, 1, 70000, INT32_MAX};
    float f32[6] = {-1.5f, 0.0f, 3.25f, 1e-7f, 6e10f, -0.0f};
    double f64[6] = {-1e300, 0.5, 2.0, 3.14159, 1e-300, 42.0};
    struct {
        int type;
        const void *v;
        size_t esize;
    } cases[] = {{CDDP_IDX_U8, u8, 1},   {CDDP_IDX_I8, i8, 1},   {CDDP_IDX_I16, i16, 2},
                 {CDDP_IDX_I32, i32, 4}, {CDDP_IDX_F32, f32, 4}, {CDDP_IDX_F64, f64, 8}};
    uint32_t shapes[][5] = {{6}, {2, 3}, {3, 1, 2}, {1, 2, 1, 3, 1}};
    int ndims[] = {1, 2, 3, 5};
    uint8_t buf[256];
    char path[512];
    for (size_t c = 0; c < 6; c++)
        for (int s = 0; s < 4; s++)
            for (int gz = 0; gz < 2; gz++) {
                size_t n = make_idx(buf, cases[c].type, ndims[s], shapes[s], cases[c].v,
                                    cases[c].esize, 6);
                put("t.idx", buf, n, gz, path, sizeof path);
                cddp_idx idx;
                cddp_error err = {0};
                if (cddp_idx_read(path, 0, &idx, &err) != CDDP_OK) fail_msg("%s", err.msg);
                assert_int_equal(idx.type, cases[c].type);
                assert_int_equal(idx.ndim, ndims[s]);
                for (int d = 0; d < ndims[s]; d++) assert_int_equal(idx.dims[d], shapes[s][d]);
                assert_int_equal(idx.count, 6);
                assert_int_equal(idx.elem_size, cases[c].esize);
                assert_memory_equal(idx.data, cases[c].v, 6 * cases[c].esize);
                cddp_idx_free(&idx);
            }
}

static void expect_error(const void *bytes, size_t n, bool gz, int code, const char *text) {
    char path[512];
    put("bad.idx", bytes, n, gz, path, sizeof path);
    cddp_idx idx;
    cddp_error err = {0};
    assert_int_equal(cddp_idx_read(path, 1 << 20, &idx, &err), code);
    if (!strstr(err.msg, text)) fail_msg("error '%s' lacks '%s'", err.msg, text);
    assert_non_null(strstr(err.msg, path));
    assert_null(idx.data);
}

static void test_corrupt_files(void **state) {
    (void)state;
    uint8_t buf[256], v[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    uint32_t dims[2] = {3, 4};
    size_t n = make_idx(buf, CDDP_IDX_U8, 2, dims, v, 1, 12);
    for (int gz = 0; gz < 2; gz++) {
        expect_error(buf, n - 1, gz, CDDP_EFORMAT, "truncated: the header promises 12 data bytes");
        expect_error(buf, 6, gz, CDDP_EFORMAT, "header is cut short");
        expect_error(buf, 2, gz, CDDP_EFORMAT, "cannot read the IDX magic");
        uint8_t more[300];
        memcpy(more, buf, n);
        more[n] = 99;
        expect_error(more, n + 1, gz, CDDP_EFORMAT, "extra bytes");
        memcpy(more, buf, n);
        more[0] = 1;
        expect_error(more, n, gz, CDDP_EFORMAT, "not an IDX file");
        more[0] = 0;
        more[2] = 0x07; /* no such element type */
        expect_error(more, n, gz, CDDP_EFORMAT, "not an IDX file");
        more[2] = 0x08;
        more[3] = 0; /* zero dimensions */
        expect_error(more, n, gz, CDDP_EFORMAT, "not an IDX file");
        /* Absurd dimensions: refused before any allocation. */
        uint32_t huge[3] = {0xFFFFFFFFu, 0xFFFFFFFFu, 16};
        size_t hn = make_idx(more, CDDP_IDX_F64, 3, huge, v, 8, 0);
        expect_error(more, hn, gz, CDDP_EFORMAT, "makes the data larger than");
    }
    /* gzip garbage: a gzip header followed by noise, and a gzip stream cut in half. */
    uint8_t garbage[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    for (int i = 10; i < 64; i++) garbage[i] = (uint8_t)(i * 37);
    expect_error(garbage, sizeof garbage, false, CDDP_EFORMAT, "");
    char path[512];
    uint8_t big[4096 + 16], more_big[64];
    uint8_t payload[4096];
    for (int i = 0; i < 4096; i++) payload[i] = (uint8_t)(i * 7919 % 251);
    uint32_t d1[1] = {4096};
    size_t bn = make_idx(big, CDDP_IDX_U8, 1, d1, payload, 1, 4096);
    put("whole.gz", big, bn, true, path, sizeof path);
    FILE *f = fopen(path, "rb");
    uint8_t z[8192];
    size_t zn = fread(z, 1, sizeof z, f);
    fclose(f);
    expect_error(z, zn / 2, false, CDDP_EFORMAT, "");
    /* A 20-byte file whose header promises 12 GiB: the reader's memory follows the data it
     * reads, so it says "truncated" with 1 GiB of address space (it used to allocate the 12 GiB
     * first). Under AddressSanitizer, which needs its own address space, without the limit. */
    uint32_t promise[2] = {1u << 20, 1536};
    size_t pn = make_idx(more_big, CDDP_IDX_F64, 2, promise, v, 8, 1);
    char ppath[512];
    put("promise.idx", more_big, pn, false, ppath, sizeof ppath);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
#ifndef __SANITIZE_ADDRESS__
        struct rlimit lim = {(rlim_t)1 << 30, (rlim_t)1 << 30};
        if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
#endif
        cddp_idx idx;
        cddp_error e = {0};
        int rc = cddp_idx_read(ppath, 0, &idx, &e);
        _exit(rc == CDDP_EFORMAT && strstr(e.msg, "truncated: the header promises") ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* A missing file. */
    cddp_idx idx;
    cddp_error err = {0};
    assert_int_equal(cddp_idx_read("/nonexistent/x.idx", 0, &idx, &err), CDDP_ENOENT);
}

static void test_fashion_mnist(void **state) {
    (void)state;
    cddp_mnist train, test;
    cddp_error err = {0};
    if (cddp_mnist_load(NULL, true, &train, &err) != CDDP_OK) fail_msg("%s", err.msg);
    if (cddp_mnist_load(NULL, false, &test, &err) != CDDP_OK) fail_msg("%s", err.msg);
    assert_int_equal(train.n, 60000);
    assert_int_equal(test.n, 10000);
    assert_int_equal(train.rows, 28);
    assert_int_equal(train.cols, 28);
    /* Fashion-MNIST's first training labels: ankle boot, t-shirt, t-shirt, dress, ... */
    uint8_t first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    assert_memory_equal(train.labels, first, 10);
    int counts[10] = {0}, tcounts[10] = {0};
    for (int64_t i = 0; i < train.n; i++) counts[train.labels[i]]++;
    for (int64_t i = 0; i < test.n; i++) tcounts[test.labels[i]]++;
    for (int c = 0; c < 10; c++) {
        assert_int_equal(counts[c], 6000);
        assert_int_equal(tcounts[c], 1000);
    }
    float img[784];
    cddp_mnist_normalize(&train, 0, 1, 0.1307f, 0.3081f, img);
    for (int i = 0; i < 784; i++)
        assert_close(img[i], (train.images[i] / 255.0 - 0.1307) / 0.3081, 1e-5, 1e-5);
    /* the first 100 only: the same samples; more than there are: all; none */
    cddp_dataset *few = cddp_dataset_mnist_first(NULL, true, 100, &err);
    assert_non_null(few);
    assert_int_equal(cddp_dataset_len(few), 100);
    for (int64_t i = 0; i < 100; i++) {
        int64_t label;
        assert_int_equal(cddp_dataset_get(few, i, (void *const[]){img, &label}, &err), CDDP_OK);
        assert_int_equal(label, train.labels[i]);
        for (int k = 0; k < 784; k++) assert_true(img[k] == (float)train.images[784 * i + k]);
    }
    cddp_dataset_destroy(few);
    few = cddp_dataset_mnist_first(NULL, false, 70000, &err);
    assert_int_equal(cddp_dataset_len(few), 10000);
    cddp_dataset_destroy(few);
    few = cddp_dataset_mnist_first(NULL, false, 0, &err);
    assert_int_equal(cddp_dataset_len(few), 0);
    cddp_dataset_destroy(few);
    cddp_mnist_free(&train);
    cddp_mnist_free(&test);
}

static void test_mnist_errors(void **state) {
    (void)state;
    char path[512];
    uint8_t buf[4096], img[3 * 4 * 4] = {0}, lab[3] = {1, 2, 3};
    uint32_t idims[3] = {3, 4, 4}, ldims[1] = {2};
    size_t n = make_idx(buf, CDDP_IDX_U8, 3, idims, img, 1, 48);
    put("train-images-idx3-ubyte", buf, n, false, path, sizeof path);
    n = make_idx(buf, CDDP_IDX_U8, 1, ldims, lab, 1, 2);
    put("train-labels-idx1-ubyte.gz", buf, n, true, path, sizeof path);
    cddp_mnist ds;
    cddp_error err = {0};
    assert_int_equal(cddp_mnist_load(test_dir, true, &ds, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "3 train images but 2 labels"));
    uint8_t badlab[3] = {1, 12, 3};
    uint32_t l3[1] = {3};
    n = make_idx(buf, CDDP_IDX_U8, 1, l3, badlab, 1, 3);
    put("train-labels-idx1-ubyte.gz", buf, n, true, path, sizeof path);
    assert_int_equal(cddp_mnist_load(test_dir, true, &ds, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "label 1 is 12"));
    /* 14x56: as many pixels as 28x28, in another shape */
    static uint8_t wide[3 * 14 * 56];
    uint32_t wdims[3] = {3, 14, 56};
    static uint8_t wbuf[3 * 14 * 56 + 64];
    n = make_idx(wbuf, CDDP_IDX_U8, 3, wdims, wide, 1, sizeof wide);
    put("train-images-idx3-ubyte", wbuf, n, false, path, sizeof path);
    n = make_idx(buf, CDDP_IDX_U8, 1, l3, lab, 1, 3);
    put("train-labels-idx1-ubyte.gz", buf, n, true, path, sizeof path);
    assert_int_equal(cddp_mnist_load(test_dir, true, &ds, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "train images are 14x56; (Fashion-)MNIST's are 28x28"));
    assert_int_equal(cddp_mnist_load("/nonexistent", false, &ds, &err), CDDP_ENOENT);
    assert_non_null(strstr(err.msg, "dataset-fashion-mnist"));
    assert_null(ds.images);
    /* images cut after the second of 3: refused whole; its first 2 read, and nothing further */
    uint8_t two[2 * 28 * 28] = {0};
    two[28 * 28] = 200;
    static uint8_t tbuf[2 * 28 * 28 + 64];
    uint32_t tdims[3] = {3, 28, 28};
    n = make_idx(tbuf, CDDP_IDX_U8, 3, tdims, two, 1, sizeof two);
    put("train-images-idx3-ubyte", tbuf, n, false, path, sizeof path);
    assert_int_equal(cddp_mnist_load(test_dir, true, &ds, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    cddp_dataset *first = cddp_dataset_mnist_first(test_dir, true, 2, &err);
    assert_non_null(first);
    assert_int_equal(cddp_dataset_len(first), 2);
    float px[784];
    int64_t label;
    assert_int_equal(cddp_dataset_get(first, 1, (void *const[]){px, &label}, &err), CDDP_OK);
    assert_true(px[0] == 200.0f);
    assert_int_equal(label, 2);
    cddp_dataset_destroy(first);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_gzip_and_raw),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_fashion_mnist),
        cmocka_unit_test(test_mnist_errors),
    };
    return cmocka_run_group_tests(tests, temp_dir_setup, temp_dir_teardown);
}
