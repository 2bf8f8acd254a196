/* check.h: what the multi-process checks in tests/ddp/ share: this process's rank and the world
 * size, FAIL, which names the program (CHECK_NAME) and the rank, says why and exits 1, and the
 * device the checks train on: CDDP_TEST_DEVICE ("cpu" unless set; ctest runs them again with
 * "emu", where the models' blocks are memory the host cannot read: the checks read values through
 * on_host, which copies them back, and write them with to_device). */
#ifndef CDDP_TESTS_DDP_CHECK_H
#define CDDP_TESTS_DDP_CHECK_H

#include <cddp/cddp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world;

/* One line, written at once: the ranks' lines must not interleave on the launcher's stderr. */
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        char fail_[1024];                                                                          \
        int at_ = snprintf(fail_, sizeof fail_ - 1, "%s rank %d: ", CHECK_NAME, rank);             \
        snprintf(fail_ + at_, sizeof fail_ - 1 - (size_t)at_, __VA_ARGS__);                        \
        strcat(fail_, "\n");                                                                       \
        fputs(fail_, stderr);                                                                      \
        exit(1);                                                                                   \
    } while (0)

static inline cddp_device *check_device(void) {
    static cddp_device *dev;
    if (!dev) {
        const char *name = getenv("CDDP_TEST_DEVICE");
        cddp_error err = {0};
        if (!(dev = cddp_device_get(name && *name ? name : "cpu", &err)))
            FAIL("CDDP_TEST_DEVICE: %s", err.msg);
    }
    return dev;
}

/* A context on the check device, its products in CDDP_TEST_COMPUTE's precision: bf16 (mixed
 * precision), or float32 when unset. */
static inline cddp_ctx *check_ctx(void) {
    const char *compute = getenv("CDDP_TEST_COMPUTE");
    cddp_dtype dt = compute && !strcmp(compute, "bf16") ? CDDP_BF16 : CDDP_F32;
    if (compute && *compute && dt == CDDP_F32 && strcmp(compute, "fp32"))
        FAIL("CDDP_TEST_COMPUTE=%s: expected bf16 or fp32", compute);
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = check_device(), .compute = dt});
    if (!ctx) FAIL("out of memory for a context");
    return ctx;
}

/* A built model, moved to the check device. */
static inline cddp_model *on_device(cddp_model *m) {
    cddp_error err = {0};
    if (cddp_model_to(m, check_device(), &err) != CDDP_OK) FAIL("cddp_model_to: %s", err.msg);
    return m;
}

static void **host_copies;
static size_t host_ncopies;

static inline void host_copies_free(void) {
    for (size_t i = 0; i < host_ncopies; i++) free(host_copies[i]);
    free(host_copies);
}

/* n floats at p, memory of the check device, as the host sees them now: p itself on the CPU, else
 * a copy (freed at exit). */
static inline const float *on_host(const void *p, int64_t n) {
    if (cddp_device_host_accessible(check_device())) return p;
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    void **more = realloc(host_copies, sizeof *more * (host_ncopies + 1));
    if (!h || !more) FAIL("out of memory");
    if (!host_copies) atexit(host_copies_free);
    host_copies = more;
    host_copies[host_ncopies++] = h;
    cddp_error err = {0};
    if (cddp_device_download(check_device(), h, p, sizeof(float) * (size_t)n, &err) != CDDP_OK)
        FAIL("copying from %s: %s", cddp_device_name(check_device()), err.msg);
    return h;
}

/* n floats from the host into p, memory of the check device. */
static inline void to_device(void *p, const float *v, int64_t n) {
    cddp_error err = {0};
    if (cddp_device_upload(check_device(), p, v, sizeof(float) * (size_t)n, &err) != CDDP_OK)
        FAIL("copying to %s: %s", cddp_device_name(check_device()), err.msg);
}

#endif
