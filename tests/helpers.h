/* helpers.h: what the cmocka tests share: includes, float comparison, paths to fixtures. */
#ifndef CDDP_TEST_HELPERS_H
#define CDDP_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include <cddp/cddp.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* |a - b| <= atol + rtol * |b|, with both values in the failure message. */
#define assert_close(a, b, rtol, atol)                                                             \
    do {                                                                                           \
        double a__ = (double)(a), b__ = (double)(b);                                               \
        if (!(fabs(a__ - b__) <= (atol) + (rtol)*fabs(b__))) {                                     \
            fail_msg("%s = %.9g but %s = %.9g (rtol %g, atol %g)", #a, a__, #b, b__,               \
                     (double)(rtol), (double)(atol));                                              \
        }                                                                                          \
    } while (0)

/* ---- the device the tensor tests run on -------------------------------------------------------
 * CDDP_TEST_DEVICE names it ("cpu" when unset); ctest runs the op, gradient and autograd tests a
 * second time with "emu", where a tensor's data is device memory the host cannot read: a test
 * reads values through host_f32 (HOST, HOST_GRAD), which copies them back, and writes them with
 * set_f32. On the CPU the copies are the data themselves, so the tests read what they always did.
 */
static inline cddp_device *test_device(void) {
    static cddp_device *dev;
    if (!dev) {
        const char *name = getenv("CDDP_TEST_DEVICE");
        cddp_error err = {0};
        dev = cddp_device_get(name && *name ? name : "cpu", &err);
        if (!dev) {
            fprintf(stderr, "CDDP_TEST_DEVICE: %s\n", err.msg);
            exit(2);
        }
    }
    return dev;
}

/* A context on the test device (seed as cddp_ctx_options.seed). */
static inline cddp_ctx *test_ctx(uint64_t seed) {
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.seed = seed, .device = test_device()});
    assert_non_null(ctx);
    return ctx;
}

/* A built model moved to the test device; returns it. */
static inline cddp_model *test_model_to(cddp_model *m) {
    cddp_error err = {0};
    if (cddp_model_to(m, test_device(), &err) != CDDP_OK) fail_msg("cddp_model_to: %s", err.msg);
    return m;
}

/* Whether the test device runs kernels when they are called (the CPU), so that an op that fails
 * returns NULL itself rather than the step's status saying so later. */
static inline bool test_device_in_order(void) {
    return cddp_device_kind_of(test_device()) == CDDP_DEVICE_CPU;
}

static void **host_copies;
static size_t host_ncopies;

/* Frees the copies host_f32 made. */
static inline void host_release(void) {
    for (size_t i = 0; i < host_ncopies; i++) free(host_copies[i]);
    free(host_copies);
    host_copies = NULL;
    host_ncopies = 0;
}

/* n floats at p, device memory of dev, as the host sees them now: p itself where the host reads
 * dev's memory, else a copy (valid until host_release). NULL for NULL. */
static inline const float *host_f32(cddp_device *dev, const void *p, int64_t n) {
    if (!p || cddp_device_host_accessible(dev)) return p;
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    void **more = realloc(host_copies, sizeof *more * (host_ncopies + 1));
    assert_non_null(h);
    assert_non_null(more);
    cddp_error err = {0};
    if (cddp_device_download(dev, h, p, sizeof(float) * (size_t)n, &err) != CDDP_OK)
        fail_msg("copying %lld floats from %s: %s", (long long)n, cddp_device_name(dev), err.msg);
    host_copies = more;
    host_copies[host_ncopies++] = h;
    return h;
}
#define HOST(t)      host_f32((t)->device, (t)->data, (t)->numel)
#define HOST_GRAD(t) host_f32((t)->device, (t)->grad, (t)->numel)

/* v into element i of n floats at p, device memory of dev (a tensor's data or gradient). */
static inline void set_at(cddp_device *dev, float *p, int64_t i, float v) {
    cddp_error err = {0};
    if (cddp_device_upload(dev, p + i, &v, sizeof v, &err) != CDDP_OK)
        fail_msg("setting element %lld on %s: %s", (long long)i, cddp_device_name(dev), err.msg);
}
#define set_f32(t, i, v)  set_at((t)->device, cddp_f32(t), i, v)
#define set_grad(t, i, v) set_at((t)->device, (t)->grad, i, v)

/* Runs body(arg) in a forked child with the default signal actions (cmocka's would report a
 * crash as a failed test instead of letting the child die of it), its stderr into msg (n bytes,
 * terminated); returns the child's wait status. */
static inline int run_in_child(void (*body)(void *), void *arg, char *msg, size_t n) {
    fflush(stderr);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        signal(SIGSEGV, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        body(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t k;
    while (got < n - 1 && (k = read(fds[0], msg + got, n - 1 - got)) > 0) got += (size_t)k;
    msg[got] = '\0';
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* The repository root (ctest sets CDDP_SOURCE_DIR). */
static inline const char *source_dir(void) {
    const char *d = getenv("CDDP_SOURCE_DIR");
    return d && *d ? d : ".";
}

static inline void source_path(char *buf, size_t n, const char *rel) {
    snprintf(buf, n, "%s/%s", source_dir(), rel);
}

/* A whole file into memory (*n bytes, and a NUL after them); free it. */
static inline uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* A private temporary folder per test program: test_dir, made by temp_dir_setup and removed
 * with its contents by temp_dir_teardown (use them as cmocka group setup/teardown). */
static char test_dir[256];

static inline int temp_dir_setup(void **state) {
    (void)state;
    snprintf(test_dir, sizeof test_dir, "/tmp/cddp-test-XXXXXX");
    return mkdtemp(test_dir) ? 0 : -1;
}

static inline int temp_dir_teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_dir);
    return system(cmd);
}

#endif
