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

#endif
