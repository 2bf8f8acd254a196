/* core/internal.h: helpers shared by cddp's own sources, not part of the public API.
 *
 * CDDP_TRY propagates a failing status to the caller; CDDP_TRY_GOTO records it in a local `rc`
 * and jumps to the function's single cleanup label, so no function needs nested cleanup.
 */
#ifndef CDDP_CORE_INTERNAL_H
#define CDDP_CORE_INTERNAL_H

#include "cddp/core.h"

#define CDDP_TRY(expr)                                                                             \
    do {                                                                                           \
        int cddp__rc = (expr);                                                                     \
        if (cddp__rc != CDDP_OK) return cddp__rc;                                                  \
    } while (0)

#define CDDP_TRY_GOTO(expr, label)                                                                 \
    do {                                                                                           \
        rc = (expr);                                                                               \
        if (rc != CDDP_OK) goto label;                                                             \
    } while (0)

#define CDDP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CDDP_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define CDDP_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* Writes a shape as "(2,3,4)" into buf (n bytes, always terminated) and returns buf. */
const char *cddp__shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* The decimal in [0, 2^30) that environment variable name holds; -2 when it is unset or empty,
 * -1 when it holds something else. */
long cddp__env_int(const char *name);

/* vsnprintf into err after an optional prefix; used by cddp_error_set and friends. */
int cddp__error_vset(cddp_error *err, int code, const char *fmt, va_list ap);

#endif
