/* test_core.c: status codes, error messages, knobs (and their table in docs/LAUNCHER.md), logging,
 * arena. */
#include "helpers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>

static void test_status_names(void **state) {
    (void)state;
    assert_string_equal(cddp_status_name(CDDP_OK), "CDDP_OK");
    assert_string_equal(cddp_status_name(CDDP_EINVAL), "CDDP_EINVAL");
    assert_string_equal(cddp_status_name(CDDP_ETIMEDOUT), "CDDP_ETIMEDOUT");
    assert_string_equal(cddp_status_name(-999), "CDDP_UNKNOWN");
    assert_string_equal(cddp_status_str(CDDP_ENOMEM), "out of memory");
    assert_string_equal(cddp_status_str(12345), "unknown status");
    /* Failures are negative and distinct. */
    int codes[] = {CDDP_EINVAL, CDDP_ENOMEM, CDDP_EIO,       CDDP_EFORMAT, CDDP_ESHAPE,
                   CDDP_ERANGE, CDDP_ENOENT, CDDP_ETIMEDOUT, CDDP_ESTATE,  CDDP_EUNSUPPORTED};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        assert_true(codes[i] < 0);
        for (size_t j = 0; j < i; j++) assert_int_not_equal(codes[i], codes[j]);
    }
}

static void test_error_messages(void **state) {
    (void)state;
    cddp_error err = {0};
    assert_string_equal(cddp_error_msg(&err), "success");
    cddp_log_set_rank(-1);
    assert_int_equal(cddp_error_set(&err, CDDP_EIO, "disk %s failed", "sda"), CDDP_EIO);
    assert_int_equal(err.code, CDDP_EIO);
    assert_string_equal(cddp_error_msg(&err), "disk sda failed");
    cddp_log_set_rank(3);
    cddp_error_set(&err, CDDP_EINVAL, "bad count %d", 7);
    assert_string_equal(cddp_error_msg(&err), "rank 3: bad count 7");
    cddp_log_set_rank(-1);
    /* A status without a message reads as its meaning. */
    cddp_error_clear(&err);
    err.code = CDDP_ENOENT;
    assert_string_equal(cddp_error_msg(&err), "no such file or key");
    /* NULL errors are allowed and the code still comes back. */
    assert_int_equal(cddp_error_set(NULL, CDDP_ERANGE, "x"), CDDP_ERANGE);
    /* Long messages are cut, not overflowed. */
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cddp_error_set(&err, CDDP_EIO, "%s", big);
    assert_int_equal(strlen(err.msg), CDDP_ERROR_MSG_MAX - 1);
}

static void test_knobs(void **state) {
    (void)state;
    unsetenv("CDDP_ARENA_MB");
    assert_string_equal(cddp_knob_name(CDDP_KNOB_ARENA_MB), "CDDP_ARENA_MB");
    assert_int_equal(cddp_knob_int(CDDP_KNOB_ARENA_MB), 4096);
    setenv("CDDP_ARENA_MB", "12", 1);
    assert_int_equal(cddp_knob_int(CDDP_KNOB_ARENA_MB), 12);
    setenv("CDDP_ARENA_MB", "12abc", 1); /* not a number: the default, with a logged error */
    assert_int_equal(cddp_knob_int(CDDP_KNOB_ARENA_MB), 4096);
    setenv("CDDP_ARENA_MB", "", 1); /* empty counts as unset */
    assert_int_equal(cddp_knob_int(CDDP_KNOB_ARENA_MB), 4096);
    unsetenv("CDDP_ARENA_MB");
    setenv("CDDP_DATA", "/tmp/x", 1);
    assert_string_equal(cddp_knob_str(CDDP_KNOB_DATA), "/tmp/x");
    unsetenv("CDDP_DATA");
    assert_string_equal(cddp_knob_str(CDDP_KNOB_DATA), "/usr/share/datasets/fashion-mnist");
    for (int k = 0; k < CDDP_KNOB_COUNT; k++) {
        assert_int_equal(strncmp(cddp_knob_name(k), "CDDP_", 5), 0);
        assert_true(strlen(cddp_knob_doc(k)) > 10);
    }
}

/* A Slurm step's variables: the first host of a compressed node list (leading zeros kept), the
 * port from the job and step, the step list before the job's; outside a step, nothing. */
static void test_slurm_step(void **state) {
    (void)state;
    setenv("SLURM_JOB_ID", "4321", 1);
    setenv("SLURM_STEP_ID", "3", 1);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    setenv("SLURM_JOB_NODELIST", "login1,node7", 1);
    const char *lists[][2] = {{"node[03-05,9],login", "node03"},
                              {"gpu-[1-4]", "gpu-1"},
                              {"n[001]", "n001"},
                              {"a,b[1-2]", "a"},
                              {"host", "host"},
                              {"c12-[7,9]x", "c12-7"}};
    cddp_slurm_step st;
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        setenv("SLURM_STEP_NODELIST", lists[i][0], 1);
        assert_true(cddp_slurm_step_read(&st));
        assert_string_equal(st.first_host, lists[i][1]);
    }
    assert_int_equal(st.job, 4321);
    assert_int_equal(st.step, 3);
    assert_int_equal(st.task, 5);
    assert_int_equal(st.ntasks, 8);
    assert_int_equal(st.node, 1);
    assert_int_equal(st.nnodes, 2);
    assert_int_equal(st.port, 10000 + 10 * (4321 % 2000) + 3);
    unsetenv("SLURM_STEP_NODELIST"); /* the job's list then */
    assert_true(cddp_slurm_step_read(&st));
    assert_string_equal(st.first_host, "login1");
    unsetenv("SLURM_STEP_ID"); /* a batch script: not a step */
    assert_false(cddp_slurm_step_read(&st));
    const char *vars[] = {"SLURM_JOB_ID", "SLURM_PROCID",         "SLURM_NTASKS",
                          "SLURM_NODEID", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NODELIST"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* docs/LAUNCHER.md's table of environment variables lists every knob with its default. */
static void test_docs_list_every_knob(void **state) {
    (void)state;
    char path[4096];
    source_path(path, sizeof path, "docs/LAUNCHER.md");
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    for (int k = 0; k < CDDP_KNOB_COUNT; k++) {
        char row[256];
        const char *def = cddp_knob_default(k);
        char shown[128];
        snprintf(shown, sizeof shown, *def ? "`%s`" : "unset", def);
        snprintf(row, sizeof row, "| `%s` | %s |", cddp_knob_name(k), shown);
        if (!strstr(text, row)) fail_msg("docs/LAUNCHER.md lacks the row starting %s", row);
    }
}

/* The one number parser: whole strings, no overflow, finite, in range; the message says what. */
static void test_parse_numbers(void **state) {
    (void)state;
    cddp_error err = {0};
    int64_t i = 7;
    assert_int_equal(cddp_parse_int("--epochs", "12", 1, 100, &i, &err), CDDP_OK);
    assert_int_equal(i, 12);
    assert_int_equal(cddp_parse_int("--n", "-9223372036854775808", INT64_MIN, 0, &i, &err), 0);
    assert_true(i == INT64_MIN);
    const char *bad_ints[] = {
        "4294967297",           "0",    "101", "-5", "", " 3", "3 ", "3x", "1.5", "1e3",
        "99999999999999999999", "0x10", "nan"};
    for (size_t k = 0; k < sizeof bad_ints / sizeof *bad_ints; k++) {
        i = 7;
        if (cddp_parse_int("--epochs", bad_ints[k], 1, 100, &i, &err) != CDDP_EINVAL)
            fail_msg("'%s' was accepted as an integer in [1, 100]", bad_ints[k]);
        assert_int_equal(i, 7);
        assert_non_null(strstr(err.msg, "expected a whole number from 1 to 100"));
    }
    assert_int_equal(cddp_parse_int("--epochs", "4294967297", 1, 100, &i, &err), CDDP_EINVAL);
    assert_string_equal(err.msg, "--epochs 4294967297: expected a whole number from 1 to 100");
    double d = 0;
    assert_int_equal(cddp_parse_double("--lr", "1e-3", 0, 10, true, &d, &err), CDDP_OK);
    assert_true(d == 1e-3);
    assert_int_equal(cddp_parse_double("--m", "0", 0, 1, false, &d, &err), CDDP_OK);
    assert_true(d == 0);
    const char *bad_reals[] = {"inf",  "-inf", "nan",  "1e30", "0",
                               "-0.1", "",     "0.1x", " 1",   "1e999"};
    for (size_t k = 0; k < sizeof bad_reals / sizeof *bad_reals; k++) {
        d = 5;
        if (cddp_parse_double("--lr", bad_reals[k], 0, 10, true, &d, &err) != CDDP_EINVAL)
            fail_msg("'%s' was accepted as a number in (0, 10]", bad_reals[k]);
        assert_true(d == 5);
    }
    assert_int_equal(cddp_parse_double("--lr", "inf", 0, 10, true, &d, &err), CDDP_EINVAL);
    assert_string_equal(err.msg, "--lr inf: expected a finite number in (0, 10]");
}

static void test_logging_levels(void **state) {
    (void)state;
    /* ctest runs with CDDP_LOG_LEVEL=error. */
    assert_true(cddp_log_enabled(CDDP_LOG_ERROR));
    assert_false(cddp_log_enabled(CDDP_LOG_WARN));
    assert_false(cddp_log_enabled(CDDP_LOG_DEBUG));
}

static void test_arena(void **state) {
    (void)state;
    cddp_arena *a = cddp_arena_create(1 << 16, 64 << 20);
    assert_non_null(a);
    cddp_error err = {0};
    /* Alignment, and growth past the first chunk. */
    for (int i = 0; i < 100; i++) {
        void *p = cddp_arena_alloc(a, 10000 + (size_t)i, &err);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, i, 10000);
    }
    size_t hw = cddp_arena_high_water(a);
    assert_true(hw >= 100 * 10000);
    cddp_arena_reset(a);
    assert_int_equal(cddp_arena_used(a), 0);
    /* The same step again fits in the coalesced chunk. */
    for (int i = 0; i < 100; i++) assert_non_null(cddp_arena_alloc(a, 10000 + (size_t)i, &err));
    assert_int_equal(cddp_arena_high_water(a), hw);
    /* Past the limit: an error naming the need and the knob. */
    assert_null(cddp_arena_alloc(a, 100 << 20, &err));
    assert_int_equal(err.code, CDDP_ENOMEM);
    assert_non_null(strstr(err.msg, "CDDP_ARENA_MB"));
    assert_non_null(strstr(err.msg, "needs at least"));
    cddp_arena_destroy(a);
    cddp_arena_destroy(NULL);
}

/* Memory for an arena that is never touched (a device's, as the arena sees it): address space
 * only, each block's size kept beside it, counted live and at its peak. */
#define COUNTED_BLOCKS 64
typedef struct counted {
    void *at[COUNTED_BLOCKS];
    size_t size[COUNTED_BLOCKS];
    size_t live, peak, blocks;
    bool refuse; /* the next allocation fails */
} counted;

static void *counted_alloc(void *user, size_t bytes) {
    counted *m = user;
    int i = 0;
    while (i < COUNTED_BLOCKS && m->at[i]) i++;
    if (m->refuse || i == COUNTED_BLOCKS) {
        m->refuse = false;
        return NULL;
    }
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    m->at[i] = p, m->size[i] = bytes;
    m->live += bytes;
    m->blocks++;
    if (m->live > m->peak) m->peak = m->live;
    return p;
}

static void counted_free(void *user, void *p) {
    counted *m = user;
    for (int i = 0; i < COUNTED_BLOCKS; i++)
        if (m->at[i] == p) {
            munmap(p, m->size[i]);
            m->live -= m->size[i];
            m->blocks--;
            m->at[i] = NULL;
            return;
        }
    fail_msg("freed memory the arena was not given");
}

/* A device's arena (memory the arena cannot reserve up front): a 6 GiB step holds at most the step
 * and one chunk of growth (1 GiB) at once, the reset gives the chunks back before taking the one
 * that replaces them, and a reset whose one chunk cannot be had leaves an arena that grows again.
 */
static void test_arena_device_memory(void **state) {
    (void)state;
    counted m = {0};
    cddp_arena_memory mem = {counted_alloc, counted_free, &m, false, NULL};
    size_t gib = (size_t)1 << 30, step = 6 * gib;
    cddp_arena *a = cddp_arena_create_on(1 << 16, 8 * gib, &mem);
    assert_non_null(a);
    cddp_error err = {0};
    for (size_t used = 0; used < step; used += 16 << 20)
        assert_non_null(cddp_arena_alloc(a, 16 << 20, &err));
    assert_true(m.peak <= step + gib);
    assert_true(m.blocks > 1);
    cddp_arena_reset(a);
    assert_int_equal(m.blocks, 1);
    assert_int_equal(m.live, step);
    assert_true(m.peak <= step + gib);
    /* The next step fits its one chunk. */
    for (size_t used = 0; used < step; used += 16 << 20)
        assert_non_null(cddp_arena_alloc(a, 16 << 20, &err));
    assert_int_equal(m.blocks, 1);
    /* Two chunks, and the one that would replace them refused: none held, the next step grows. */
    assert_non_null(cddp_arena_alloc(a, 1 << 20, &err));
    assert_int_equal(m.blocks, 2);
    m.refuse = true;
    cddp_arena_reset(a);
    assert_int_equal(m.blocks, 0);
    assert_int_equal(m.live, 0);
    void *p = cddp_arena_alloc(a, 1000, &err);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    assert_int_equal(m.blocks, 1);
    cddp_arena_destroy(a);
    assert_int_equal(m.live, 0);
}

static void test_alloc(void **state) {
    (void)state;
    void *p = cddp_aligned_alloc(1000);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    cddp_aligned_free(p);
    cddp_aligned_free(NULL);
    char *s = cddp_strdup("abc");
    assert_string_equal(s, "abc");
    cddp_free(s);
}

/* Which loopback this process reaches is the same when it has no file descriptor left (a
 * launcher whose store a stranger floods): the boot id read once is kept, where reading it again
 * failed and made the launcher take a node of its own machine for another host's. */
static void test_loopback_id_out_of_descriptors(void **state) {
    (void)state;
    char before[128], after[128];
    cddp_net_loopback_id(before, sizeof before);
    assert_true(before[0] != '?');
    assert_non_null(strchr(before, '/'));
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    int fd = open("/dev/null", O_RDONLY);
    assert_true(fd >= 0);
    close(fd);
    struct rlimit none = {(rlim_t)fd, old.rlim_max}; /* the next descriptor is over the limit */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &none), 0);
    int more = open("/dev/null", O_RDONLY);
    cddp_net_loopback_id(after, sizeof after);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(more, -1); /* the test did run out */
    assert_string_equal(after, before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_knobs),
        cmocka_unit_test(test_docs_list_every_knob),
        cmocka_unit_test(test_parse_numbers),
        cmocka_unit_test(test_logging_levels),
        cmocka_unit_test(test_arena),
        cmocka_unit_test(test_arena_device_memory),
        cmocka_unit_test(test_alloc),
        cmocka_unit_test(test_slurm_step),
        cmocka_unit_test(test_loopback_id_out_of_descriptors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
