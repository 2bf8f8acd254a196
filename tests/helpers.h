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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* |a - b| <= atol + rtol * |b|, with both values in the failure message. */
#define assert_close(a, b, rtol, atol)                                                             \
    do {                                                                                           \
        double a__ = (double)(a), b__ = (double)(b);                                               \
        if (!(fabs(a__ - b__) <= (atol) + (rtol)*fabs(b__))) {                                     \
            fail_msg("%s = %.9g but %s = %.9g (rtol %g, atol %g)", #a, a__, #b, b__,               \
                     (double)(rtol), (double)(atol));                                              \
        }                                                                                          \
    } while (0)

/* The repository root (ctest sets CDDP_SOURCE_DIR). */
static inline const char *source_dir(void) {
    const char *d = getenv("CDDP_SOURCE_DIR");
    return d && *d ? d : ".";
}

static inline void source_path(char *buf, size_t n, const char *rel) {
    snprintf(buf, n, "%s/%s", source_dir(), rel);
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
