/* test_flight.c: the flight recorder's report (cddp_flight_report) from records written here, a
 * rank at a time, as the recorder writes them: who waits where and who is behind (a rank whose
 * call failed when the group did waited at the frontier, not behind it); a rank that left no
 * record; ranks that called different collectives at one sequence number; a clean record set;
 * and this process's own record (cddp_flight_mark, cddp_flight_dump) read back, with collectives
 * on a device's memory (cddp/dcomm.h) in it.
 */
#include "helpers.h"

#include "comm/internal.h"

#include <cddp/dcomm.h>
#include <cddp/flight.h>

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[300];
static int case_no;

/* A fresh folder for one case. */
static void fresh(void) {
    snprintf(dir, sizeof dir, "%s/case%d", test_dir, ++case_no);
    assert_int_equal(mkdir(dir, 0700), 0);
}

/* Writes rank r's record (of world ranks, taken at time now) with the events given, each a JSON
 * object's text. */
static void record(int r, int world, double now, int n, ...) {
    char path[400];
    snprintf(path, sizeof path, "%s/rank-%d.json", dir, r);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"cddp_flight\": 1, \"rank\": %d, \"world\": %d, \"pid\": %d, \"host\": \"h\", "
            "\"run_id\": \"t\", \"why\": \"test\", \"now\": %.3f, \"wall\": %.3f, "
            "\"capacity\": 64, \"events\": [",
            r, world, 100 + r, now, 1e9 + now);
    va_list ap;
    va_start(ap, n);
    for (int k = 0; k < n; k++) fprintf(f, "%s\n  %s", k ? "," : "", va_arg(ap, const char *));
    va_end(ap);
    fprintf(f, "]}\n");
    assert_int_equal(fclose(f), 0);
}

/* The report of the folder, into a buffer (static: one at a time). */
static const char *report(int world) {
    static char text[8192];
    FILE *f = fmemopen(text, sizeof text, "w");
    assert_non_null(f);
    cddp_error err = {0};
    assert_int_equal(cddp_flight_report(dir, world, f, NULL, &err), CDDP_OK);
    fclose(f);
    return text;
}

static void has(const char *text, const char *want) {
    if (!strstr(text, want)) fail_msg("expected \"%s\" in:\n%s", want, text);
}

static void hasnt(const char *text, const char *want) {
    if (strstr(text, want)) fail_msg("did not expect \"%s\" in:\n%s", want, text);
}

#define DONE14                                                                                     \
    "{\"type\": \"collective\", \"group\": 0, \"seq\": 14, \"op\": \"allreduce\", \"reduce\": "    \
    "\"mean\", \"dtype\": \"float32\", \"count\": 100, \"bytes\": 400, \"label\": \"bucket 0: "    \
    "a .. b\", \"state\": \"done\", \"queued\": 9.0, \"started\": 9.0, \"ended\": 9.5}"
#define CALL15(state, ended)                                                                       \
    "{\"type\": \"collective\", \"group\": 0, \"seq\": 15, \"op\": \"allreduce\", \"reduce\": "    \
    "\"mean\", \"dtype\": \"float32\", \"count\": 100, \"bytes\": 400, \"label\": \"bucket 0: "    \
    "a .. b\", \"state\": \"" state "\", \"queued\": 10.0, \"started\": 10.0" ended "}"
#define MARK(phase, step, t)                                                                       \
    "{\"type\": \"mark\", \"phase\": \"" phase "\", \"step\": " #step ", \"t\": " #t "}"

/* Ranks 0 and 2 wait in #15, rank 1's #15 failed after 8 s (the group failed): all three are at
 * the frontier; rank 3 is in step 5's forward, its last call #14: it is behind. */
static void test_a_failed_call_is_at_the_frontier(void **state) {
    (void)state;
    fresh();
    record(0, 4, 20.0, 3, MARK("backward", 4, 9.8), DONE14, CALL15("started", ""));
    record(1, 4, 20.0, 4, MARK("backward", 4, 9.8), DONE14, CALL15("failed", ", \"ended\": 18.0"),
           MARK("after backward", 4, 18.0));
    record(2, 4, 20.0, 3, MARK("backward", 4, 9.8), DONE14, CALL15("started", ""));
    record(3, 4, 20.0, 2, DONE14, MARK("forward", 5, 9.9));
    const char *t = report(4);
    has(t, "flight records in");
    has(t, ": 4 of 4 ranks");
    has(t, "ranks 0-2 wait in allreduce #15 (bucket 0: a .. b), up to 10.0 s");
    has(t, "rank 3 is in step 5's forward (for 10.1 s); its last collective allreduce #14");
    has(t, "done  <- BEHIND");
    hasnt(t, "rank 1 is");
    hasnt(t, "MISMATCH");
}

/* A rank without a record is named; the others wait for it. */
static void test_a_rank_without_a_record(void **state) {
    (void)state;
    fresh();
    record(0, 3, 20.0, 2, DONE14, CALL15("started", ""));
    record(2, 3, 20.0, 2, DONE14, CALL15("started", ""));
    const char *t = report(3);
    has(t, ": 2 of 3 ranks");
    has(t, "ranks 0, 2 wait in allreduce #15 (bucket 0: a .. b), up to 10.0 s");
    has(t, "rank 1 left no record: it is stopped, killed, hung without answering SIGUSR1, or "
           "never started (the ranks above wait for it)");
}

/* Rank 1 called allreduce of float64 where the others called it of float32: the minority is
 * named, and no rank is called behind. */
static void test_a_mismatch(void **state) {
    (void)state;
    fresh();
    const char *odd =
        "{\"type\": \"collective\", \"group\": 0, \"seq\": 15, \"op\": \"allreduce\", "
        "\"reduce\": \"mean\", \"dtype\": \"float64\", \"count\": 1, \"bytes\": 8, "
        "\"state\": \"failed\", \"queued\": 10.0, \"started\": 10.0, \"ended\": 10.1}";
    record(0, 3, 20.0, 2, DONE14, CALL15("failed", ", \"ended\": 10.1"));
    record(1, 3, 20.0, 2, DONE14, odd);
    record(2, 3, 20.0, 2, DONE14, CALL15("failed", ", \"ended\": 10.1"));
    const char *t = report(3);
    has(t, "MISMATCH at collective #15: rank 1 called allreduce(mean, float64, count 1) where "
           "ranks 0, 2 called allreduce(mean, float32, count 100)");
    hasnt(t, "BEHIND");
}

/* Every rank done with #15: none is behind. */
static void test_every_rank_done(void **state) {
    (void)state;
    fresh();
    for (int r = 0; r < 2; r++)
        record(r, 2, 20.0, 3, DONE14, CALL15("done", ", \"ended\": 10.5"), MARK("forward", 6, 11));
    const char *t = report(2);
    hasnt(t, "BEHIND");
    hasnt(t, "wait in");
    has(t, "rank 0 is in step 6's forward (for 9.0 s)");
    has(t, "rank 1 is in step 6's forward (for 9.0 s)");
}

/* An empty folder: CDDP_ENOENT, with a message naming it. */
static void test_no_records(void **state) {
    (void)state;
    fresh();
    cddp_error err = {0};
    FILE *f = fopen("/dev/null", "w");
    assert_int_equal(cddp_flight_report(dir, 0, f, NULL, &err), CDDP_ENOENT);
    fclose(f);
    has(err.msg, dir);
}

/* This process's own record: its marks, written where asked, read back by the report. */
static void test_own_record(void **state) {
    (void)state;
    fresh();
    setenv("CDDP_FLIGHT_DIR", dir, 1);
    char path[512], want[512];
    cddp_flight_mark("data", 41);
    cddp_flight_mark("forward", 42);
    cddp_error err = {0};
    assert_int_equal(cddp_flight_dump("a test", path, sizeof path, &err), CDDP_OK);
    snprintf(want, sizeof want, "%s/rank-0.json", dir);
    assert_string_equal(path, want);
    const char *t = report(1);
    has(t, "rank 0 (pid ");
    has(t, "wrote it: a test");
    has(t, "rank 0 is in step 42's forward");
    has(t, "it made no collective");
    unsetenv("CDDP_FLIGHT_DIR");
}

/* A fresh folder for the records, and a group of one rank recording into it. */
static cddp_comm *group_of_one(void) {
    fresh();
    setenv("CDDP_FLIGHT_DIR", dir, 1);
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(&(cddp_comm_options){.rank = 0, .world_size = 1}, &err);
    if (!g) fail_msg("%s", err.msg);
    return g;
}

/* Collectives on a device's memory (cddp_dcomm, a group of one on the emulated device through
 * host copies) are recorded as a group of their own, with the device and the transport: done
 * once joined (host copies: the join waits for them), started while only issued; the report
 * says where each rank's last one stands. */
static void test_device_collectives(void **state) {
    (void)state;
    cddp_comm *g = group_of_one();
    cddp_error err = {0};
    cddp_device *emu = cddp_device_get("emu", &err);
    assert_non_null(emu);
    cddp_dcomm *d = cddp_dcomm_create(g, emu, &(cddp_dcomm_options){.transport = "host"}, &err);
    assert_non_null(d);
    float *x = cddp_device_alloc(emu, 64 * sizeof(float), &err);
    assert_int_equal(cddp_device_memset(emu, x, 0, 64 * sizeof(float), &err), CDDP_OK);
    cddp_flight_label("bucket 0: w .. b");
    assert_int_equal(cddp_dcomm_allreduce(d, x, x, 64, CDDP_COMM_F32, CDDP_COMM_MEAN, &err),
                     CDDP_OK);
    assert_int_equal(cddp_dcomm_join(d, &err), CDDP_OK);
    assert_int_equal(cddp_dcomm_allgather(d, x, x, 64, CDDP_COMM_F32, &err), CDDP_OK);
    char path[512];
    assert_int_equal(cddp_flight_dump("a test", path, sizeof path, &err), CDDP_OK);
    size_t n = 0;
    char *t = (char *)slurp(path, &n);
    assert_non_null(t);
    has(t, "\"seq\": 1, \"op\": \"allreduce\", \"reduce\": \"mean\", \"dtype\": \"float32\", "
           "\"count\": 64, \"bytes\": 256, \"device\": \"emu:0\", \"transport\": \"host\", "
           "\"label\": \"bucket 0: w .. b\", \"state\": \"done\"");
    has(t, "\"seq\": 2, \"op\": \"allgather\", \"dtype\": \"float32\", \"count\": 64, "
           "\"bytes\": 256, \"device\": \"emu:0\", \"transport\": \"host\", \"state\": "
           "\"started\"");
    free(t);
    cddp_flight_mark("optimizer", 3);
    assert_int_equal(cddp_flight_dump("a test", path, sizeof path, &err), CDDP_OK);
    has(report(1), "on emu:0 (host) its last collective allgather #2, issued (in flight or not yet "
                   "known done)");
    assert_int_equal(cddp_dcomm_wait(d, &err), CDDP_OK); /* now known done */
    assert_int_equal(cddp_flight_dump("a test", path, sizeof path, &err), CDDP_OK);
    has(report(1), "on emu:0 (host) its last collective allgather #2, done");
    cddp_device_free(emu, x);
    cddp_dcomm_destroy(d);
    cddp_comm_destroy(g);
    unsetenv("CDDP_FLIGHT_DIR");
}

/* The products of a step: an MLP's GEMMs forward and backward (oneDNN's sgemm) and a
 * convolution (a oneDNN primitive), into out (the results one after another); returns how many. */
static size_t products(cddp_ctx *ctx, cddp_tensor *const in[5], float *out) {
    cddp_ctx_reset(ctx);
    cddp_tensor *r[] = {
        cddp_matmul(ctx, in[0], in[1], false, true), cddp_matmul(ctx, in[0], in[2], true, false),
        cddp_matmul(ctx, in[2], in[1], false, false), cddp_conv2d(ctx, in[3], in[4], NULL, 1, 1)};
    size_t n = 0;
    for (size_t k = 0; k < CDDP_ARRAY_LEN(r); k++) {
        assert_non_null(r[k]);
        memcpy(out + n, cddp_f32(r[k]), (size_t)r[k]->numel * sizeof(float));
        n += (size_t)r[k]->numel;
    }
    return n;
}

static _Atomic int storming;

static void *storm(void *arg) {
    (void)arg;
    while (storming) {
        kill(getpid(), SIGUSR1);
        usleep(100);
    }
    return NULL;
}

/* SIGUSR1 (what `cddprun --dump` sends) every 0.1 ms while the products run: each the same to the
 * bit as before, the process alive (a signal taken inside one of oneDNN's GEMM kernels wrote over
 * the heap, and the process aborted in free()), and the recorder's dumps written. */
static void test_dumps_during_products(void **state) {
    (void)state;
    cddp_comm *g = group_of_one();
    struct sigaction now;
    assert_int_equal(sigaction(SIGUSR1, NULL, &now), 0);
    assert_true(now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN); /* the recorder's */
    cddp_ctx *make = cddp_ctx_create(NULL), *ctx = cddp_ctx_create(NULL);
    cddp_tensor *in[5] = {
        cddp_uniform(make, 2, (int64_t[]){32, 64}, -1, 1, cddp_ctx_rng(make)),
        cddp_uniform(make, 2, (int64_t[]){128, 64}, -1, 1, cddp_ctx_rng(make)),
        cddp_uniform(make, 2, (int64_t[]){32, 128}, -1, 1, cddp_ctx_rng(make)),
        cddp_uniform(make, 4, (int64_t[]){2, 8, 16, 16}, -1, 1, cddp_ctx_rng(make)),
        cddp_uniform(make, 4, (int64_t[]){16, 8, 3, 3}, -1, 1, cddp_ctx_rng(make)),
    };
    size_t most = 32 * 128 + 64 * 128 + 32 * 64 + 2 * 16 * 16 * 16;
    float *want = malloc(most * sizeof(float)), *got = malloc(most * sizeof(float));
    assert_true(want && got);
    size_t n = products(ctx, in, want);
    assert_int_equal(n, most);
    storming = 1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, storm, NULL), 0);
    int rounds = 0;
    for (double end = cddp_now_s() + 3; cddp_now_s() < end; rounds++) {
        assert_int_equal(products(ctx, in, got), n);
        assert_memory_equal(got, want, n * sizeof(float));
    }
    storming = 0;
    pthread_join(t, NULL);
    cddp__flight_settle(30);
    char path[400];
    snprintf(path, sizeof path, "%s/rank-0.json", dir);
    char *rec = (char *)slurp(path, &n);
    assert_non_null(rec);
    has(rec, "\"why\": \"SIGUSR1: asked for the record\"");
    print_message("%d rounds of products under SIGUSR1\n", rounds);
    assert_true(rounds > 10);
    free(rec);
    free(want);
    free(got);
    cddp_ctx_destroy(ctx);
    cddp_ctx_destroy(make);
    cddp_comm_destroy(g);
    unsetenv("CDDP_FLIGHT_DIR");
}

/* The default folder: in TMPDIR by run id. */
static void test_default_folder(void **state) {
    (void)state;
    char got[512];
    unsetenv("CDDP_FLIGHT_DIR");
    setenv("TMPDIR", "/var/tmp/x", 1);
    setenv("CDDP_RUN_ID", "job7", 1);
    cddp_flight_dir(got, sizeof got);
    assert_string_equal(got, "/var/tmp/x/cddp-flight-job7");
    unsetenv("TMPDIR");
    cddp_flight_dir(got, sizeof got);
    assert_string_equal(got, "/tmp/cddp-flight-job7");
    unsetenv("CDDP_RUN_ID");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_failed_call_is_at_the_frontier),
        cmocka_unit_test(test_a_rank_without_a_record),
        cmocka_unit_test(test_a_mismatch),
        cmocka_unit_test(test_every_rank_done),
        cmocka_unit_test(test_no_records),
        cmocka_unit_test(test_own_record),
        cmocka_unit_test(test_device_collectives),
        cmocka_unit_test(test_default_folder),
        cmocka_unit_test(test_dumps_during_products),
    };
    return cmocka_run_group_tests(tests, temp_dir_setup, temp_dir_teardown);
}
