/* test_device.c: the devices: names, memory, queue order, late failures, copies between devices,
 * and what the emulated device is for: a host read of device memory faults, memory nobody wrote
 * reads as NaN, and tensors of two devices never meet in an op. */
#include "helpers.h"
#include "tensor/internal.h"

static cddp_device *emu(int i) {
    char name[16];
    snprintf(name, sizeof name, "emu:%d", i);
    cddp_error err = {0};
    cddp_device *d = cddp_device_get(name, &err);
    if (!d) fail_msg("%s: %s", name, err.msg);
    return d;
}

static void test_names(void **state) {
    (void)state;
    cddp_error err = {0};
    assert_ptr_equal(cddp_device_get("cpu", &err), cddp_device_cpu());
    assert_string_equal(cddp_device_name(cddp_device_cpu()), "cpu");
    assert_true(cddp_device_host_accessible(cddp_device_cpu()));
    assert_int_equal(cddp_device_kind_of(cddp_device_cpu()), CDDP_DEVICE_CPU);
    assert_ptr_equal(cddp_device_get("emu", &err), emu(0));
    assert_true(emu(1) != emu(0));
    assert_string_equal(cddp_device_name(emu(1)), "emu:1");
    assert_int_equal(cddp_device_index(emu(1)), 1);
    assert_int_equal(cddp_device_kind_of(emu(0)), CDDP_DEVICE_EMU);
    assert_false(cddp_device_host_accessible(emu(0)));
    assert_int_equal(cddp_device_count(CDDP_DEVICE_EMU), 2);
    assert_non_null(strstr(cddp_device_describe(emu(0)), "emulated"));
    assert_null(cddp_device_get("gpu", &err));
    assert_int_equal(err.code, CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "'gpu' is not a device (the devices: cpu, emu"));
    assert_null(cddp_device_get("emu:7", &err));
    assert_int_equal(err.code, CDDP_ERANGE);
    assert_non_null(strstr(err.msg, "this machine has 2 emu devices (indices 0..1)"));
    assert_null(cddp_device_get("emu:x", &err));
    assert_int_equal(err.code, CDDP_EINVAL);
    assert_null(cddp_device_get(NULL, &err));
}

static void read_device_memory(void *arg) {
    (void)arg;
    float *p = cddp_device_alloc(emu(0), 64, NULL);
    volatile float v = p[3]; /* the bug this device is for: the host reads device memory */
    (void)v;
}

static void write_device_memory(void *arg) {
    (void)arg;
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = emu(0)});
    cddp_tensor *t = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(4));
    cddp_f32(t)[0] = 1.0f;
}

static void test_host_access_faults(void **state) {
    (void)state;
    char msg[512];
    int st = run_in_child(read_device_memory, NULL, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    st = run_in_child(write_device_memory, NULL, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
}

/* Fresh device memory and a context's arena after a reset hold NaNs, so that a missing copy shows
 * in every value it touches. */
static void test_unwritten_memory_is_nan(void **state) {
    (void)state;
    cddp_error err = {0};
    float *p = cddp_device_alloc(emu(0), 16 * sizeof(float), &err);
    assert_non_null(p);
    float h[16];
    assert_int_equal(cddp_device_download(emu(0), h, p, sizeof h, &err), CDDP_OK);
    for (int i = 0; i < 16; i++) assert_true(isnan(h[i]));
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)i;
    assert_int_equal(cddp_device_upload(emu(0), p, v, sizeof v, &err), CDDP_OK);
    v[3] = -1; /* the upload took the data when it returned */
    assert_int_equal(cddp_device_download(emu(0), h, p, sizeof h, &err), CDDP_OK);
    for (int i = 0; i < 16; i++) assert_true(h[i] == (float)i);
    cddp_device_free(emu(0), p);

    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = emu(0)});
    cddp_tensor *z = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(100));
    const void *where = z->data;
    assert_true(cddp_item(cddp_sum(ctx, z)) == 0.0);
    cddp_tensor *t = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(100)); /* a copy forgotten */
    assert_true(isnan(cddp_item(cddp_sum(ctx, t))));
    cddp_ctx_reset(ctx);
    cddp_tensor *again = cddp_empty(ctx, CDDP_F32, CDDP_SHAPE(100)); /* the same memory */
    assert_ptr_equal(again->data, where);
    assert_true(isnan(cddp_get(again, 0)));
    cddp_ctx_destroy(ctx);
}

/* Work runs in the order it was queued, and the host sees its results when it reads them. */
static void test_queue_order(void **state) {
    (void)state;
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = emu(1)});
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)(i % 7) - 3.0f;
    cddp_tensor *x = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(10, 100), v);
    cddp_tensor *y = x;
    for (int k = 0; k < 50; k++) y = cddp_add(ctx, y, x); /* 51 x */
    double want = 0;
    for (int i = 0; i < 1000; i++) want += 51.0 * v[i];
    assert_true(cddp_item(cddp_sum(ctx, y)) == want);
    assert_int_equal(cddp_ctx_synchronize(ctx), CDDP_OK);
    assert_int_equal(cddp_device_synchronize(emu(1), NULL), CDDP_OK);
    cddp_ctx_destroy(ctx);
}

/* A kernel's failure on a device that runs later reaches the context when it waits. */
static void test_late_failure(void **state) {
    (void)state;
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = emu(0)});
    float lv[6] = {1, 2, 3, 1, 2, 3};
    int64_t yv[2] = {2, 5};
    cddp_tensor *logits = cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(2, 3), lv);
    cddp_tensor *labels = cddp_from_data(ctx, CDDP_I64, CDDP_SHAPE(2), yv);
    cddp_cross_entropy(ctx, logits, labels, CDDP_REDUCE_MEAN);
    assert_int_equal(cddp_ctx_status(ctx), CDDP_ERANGE);
    assert_true(cddp_ctx_failed(ctx));
    assert_non_null(strstr(cddp_ctx_error(ctx), "label 5 of sample 1 is out of range for 3"));
    cddp_ctx_reset(ctx); /* a reset clears it */
    assert_int_equal(cddp_ctx_status(ctx), CDDP_OK);
    cddp_ctx_destroy(ctx);
}

static void mix_devices(void *arg) {
    (void)arg;
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = emu(0)});
    cddp_tensor *a = cddp_zeros(ctx, CDDP_F32, CDDP_SHAPE(2, 3));
    cddp_tensor *b = cddp_to(ctx, a, cddp_device_cpu());
    cddp_add(ctx, a, b);
}

static void test_mixing_devices_aborts(void **state) {
    (void)state;
    char msg[1024];
    int st = run_in_child(mix_devices, NULL, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    if (!strstr(msg, "expected all tensors to be on the same device, but found at least two "
                     "devices, emu:0") ||
        !strstr(msg, "and cpu"))
        fail_msg("it said: %s", msg);
}

/* cddp_to copies, and its gradient goes back: x on the CPU, the work on emu:0 and emu:1, the loss
 * on the CPU give the all-CPU values and gradient bit for bit. */
static double to_and_back(cddp_device *a, cddp_device *b, float *grad) {
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    float v[12];
    for (int i = 0; i < 12; i++) v[i] = 0.3f * (float)i - 1.7f;
    cddp_tensor *x = cddp_requires_grad(ctx, cddp_from_data(ctx, CDDP_F32, CDDP_SHAPE(3, 4), v));
    cddp_tensor *h = cddp_tanh(ctx, cddp_to(ctx, x, a));
    h = cddp_mul(ctx, cddp_to(ctx, h, b), cddp_to(ctx, h, b));
    cddp_tensor *loss = cddp_sum(ctx, cddp_to(ctx, h, cddp_device_cpu()));
    assert_ptr_equal(loss->device, cddp_device_cpu());
    assert_int_equal(cddp_backward(ctx, loss), CDDP_OK);
    memcpy(grad, x->grad, sizeof v);
    double l = cddp_item(loss);
    cddp_ctx_destroy(ctx);
    return l;
}

/* Queued copies both ways from page-locked host memory: the data is there once an event recorded
 * after them is done, and the host's buffer may be reused from then on. */
static void test_queued_copies(void **state) {
    (void)state;
    cddp_device *devs[] = {cddp_device_cpu(), emu(0)};
    for (int k = 0; k < 2; k++) {
        cddp_device *dev = devs[k];
        cddp_error err = {0};
        enum { N = 1000 };
        float *host = cddp_device_host_alloc(dev, N * sizeof(float), &err), back[N];
        float *d = cddp_device_alloc(dev, N * sizeof(float), &err);
        cddp_event *ev = cddp_event_create(dev, &err);
        assert_non_null(host);
        assert_non_null(d);
        assert_non_null(ev);
        for (int i = 0; i < N; i++) host[i] = (float)i / 8;
        assert_int_equal(cddp_device_upload_async(dev, d, host, N * sizeof(float), &err), CDDP_OK);
        assert_int_equal(cddp_event_record(ev, &err), CDDP_OK);
        assert_int_equal(cddp_event_synchronize(ev, &err), CDDP_OK);
        for (int i = 0; i < N; i++) host[i] = -1; /* free again: the device has its copy */
        assert_int_equal(cddp_device_download_async(dev, host, d, N * sizeof(float), &err),
                         CDDP_OK);
        assert_int_equal(cddp_event_record(ev, &err), CDDP_OK);
        assert_int_equal(cddp_event_synchronize(ev, &err), CDDP_OK);
        memcpy(back, host, sizeof back);
        for (int i = 0; i < N; i++) assert_float_equal(back[i], (float)i / 8, 0);
        assert_int_equal(cddp_device_upload_async(dev, d, host, 0, &err), CDDP_OK);
        cddp_event_destroy(ev);
        cddp_device_free(dev, d);
        cddp_device_host_free(dev, host);
    }
}

/* What a collective library asks of a device (cddp/dcomm.h's nccl): a queue that goes first, its
 * platform handle, an event asked after without waiting. On the CPU all is done at once; on the
 * emulated device a queued upload is held until a wait asks for it (or 0.2 s), so a query right
 * after says not yet, and polling sees it done without the host waiting. Neither has a platform
 * whose libraries may queue work on it. */
static void test_first_queue_and_event_query(void **state) {
    (void)state;
    cddp_device *devs[] = {cddp_device_cpu(), emu(0)};
    for (int k = 0; k < 2; k++) {
        cddp_device *dev = devs[k];
        cddp_error err = {0};
        assert_null(cddp_device_platform(dev));
        assert_int_equal(cddp_device_make_current(dev, &err), CDDP_OK);
        cddp_queue *q = cddp_queue_create_first(dev, &err);
        assert_non_null(q);
        assert_null(cddp_queue_native(q));
        float *host = cddp_device_host_alloc(dev, 64 * sizeof(float), &err), back[64];
        float *d = cddp_device_alloc(dev, 64 * sizeof(float), &err);
        cddp_event *ev = cddp_event_create(dev, &err);
        bool done = false;
        assert_int_equal(cddp_event_query(ev, &done, &err), CDDP_OK); /* never recorded */
        assert_true(done);
        for (int i = 0; i < 64; i++) host[i] = (float)i;
        double t0 = cddp_now_s();
        assert_int_equal(cddp_queue_upload(q, d, host, 64 * sizeof(float), &err), CDDP_OK);
        assert_int_equal(cddp_queue_record(q, ev, &err), CDDP_OK);
        assert_int_equal(cddp_event_query(ev, &done, &err), CDDP_OK);
        if (k == 0) assert_true(done);                             /* the CPU: at once */
        if (k == 1 && cddp_now_s() - t0 < 0.1) assert_false(done); /* held for 0.2 s */
        while (!done && cddp_now_s() - t0 < 5)
            assert_int_equal(cddp_event_query(ev, &done, &err), CDDP_OK);
        assert_true(done);
        assert_int_equal(cddp_device_download(dev, back, d, sizeof back, &err), CDDP_OK);
        for (int i = 0; i < 64; i++) assert_float_equal(back[i], (float)i, 0);
        cddp_event_destroy(ev);
        cddp_queue_destroy(q);
        cddp_device_free(dev, d);
        cddp_device_host_free(dev, host);
    }
}

static void test_to_round_trip(void **state) {
    (void)state;
    float g_cpu[12], g_emu[12];
    double l_cpu = to_and_back(cddp_device_cpu(), cddp_device_cpu(), g_cpu);
    double l_emu = to_and_back(emu(0), emu(1), g_emu);
    assert_true(l_cpu == l_emu);
    assert_memory_equal(g_cpu, g_emu, sizeof g_cpu);
    bool nonzero = false;
    for (int i = 0; i < 12; i++) nonzero |= g_cpu[i] != 0.0f;
    assert_true(nonzero);
}

/* A step's arena on a device with memory of its own may take all of it unless CDDP_ARENA_MB says
 * otherwise: emu:2 made with 64 MiB refuses a step of 100 MiB as the arena's limit, not with the
 * device's own out-of-memory, and 4 MiB asked for are the limit where CDDP_ARENA_MB is set. */
/* Where attention runs by rows (flash_attention): the emulated device answers as the CUDA device
 * does (bf16, heads of 32 or 64, at most 65535 heads in all), so that CI takes the GPU's path
 * through the op; the CPU never. */
static void test_attends_by_rows(void **state) {
    (void)state;
    const cddp__kernels *e = emu(0)->k, *c = cddp_device_cpu()->k;
    const struct {
        int64_t B, T, NH, HS;
        cddp_dtype compute;
        bool rows;
    } cases[] = {{16, 1024, 12, 64, CDDP_BF16, true}, {4, 96, 2, 32, CDDP_BF16, true},
                 {1, 1, 1, 64, CDDP_BF16, true},      {5461, 8, 12, 64, CDDP_BF16, true},
                 {16, 1024, 12, 64, CDDP_F32, false}, {2, 64, 4, 16, CDDP_BF16, false},
                 {2, 64, 2, 48, CDDP_BF16, false},    {2, 64, 2, 128, CDDP_BF16, false},
                 {5462, 8, 12, 64, CDDP_BF16, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t B = cases[i].B, T = cases[i].T, NH = cases[i].NH, HS = cases[i].HS;
        assert_int_equal(e->attends_by_rows(B, T, NH, HS, cases[i].compute), cases[i].rows);
        assert_int_equal(cddp__gpu_attends_by_rows(B, T, NH, HS, cases[i].compute), cases[i].rows);
        assert_false(c->attends_by_rows(B, T, NH, HS, cases[i].compute));
    }
}

static void test_arena_limit_is_the_devices_memory(void **state) {
    (void)state;
    setenv("CDDP_EMU_DEVICES", "3", 1);
    setenv("CDDP_EMU_MB", "64", 1);
    unsetenv("CDDP_ARENA_MB");
    cddp_device *d = emu(2);
    unsetenv("CDDP_EMU_MB");
    const int64_t big[] = {25 << 20}, small[] = {2 << 20}; /* 100 MiB and 8 MiB of floats */
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = d});
    assert_non_null(ctx);
    assert_null(cddp_empty(ctx, CDDP_F32, 1, big));
    assert_non_null(strstr(cddp_ctx_error(ctx), "the limit is 64 MiB"));
    cddp_ctx_destroy(ctx);
    setenv("CDDP_ARENA_MB", "4", 1);
    ctx = cddp_ctx_create(&(cddp_ctx_options){.device = d});
    assert_null(cddp_empty(ctx, CDDP_F32, 1, small));
    assert_non_null(strstr(cddp_ctx_error(ctx), "the limit is 4 MiB"));
    cddp_ctx_destroy(ctx);
    unsetenv("CDDP_ARENA_MB");
    unsetenv("CDDP_EMU_DEVICES");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_host_access_faults),
        cmocka_unit_test(test_unwritten_memory_is_nan),
        cmocka_unit_test(test_queue_order),
        cmocka_unit_test(test_late_failure),
        cmocka_unit_test(test_mixing_devices_aborts),
        cmocka_unit_test(test_queued_copies),
        cmocka_unit_test(test_first_queue_and_event_query),
        cmocka_unit_test(test_to_round_trip),
        cmocka_unit_test(test_attends_by_rows),
        cmocka_unit_test(test_arena_limit_is_the_devices_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
