/* core.c: status names, error messages, levelled logging, allocation wrappers, env knobs, numbers
 * from text.
 *
 * Nothing here keeps hidden state beyond the process's rank (for log and error prefixes) and the
 * parsed log threshold, both of which are plain values read once.
 */
#include "cddp/core.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

const char *cddp_status_name(int status) {
    switch (status) {
#define CDDP__STATUS_NAME(name, value, msg)                                                        \
    case value:                                                                                    \
        return "CDDP_" #name;
        CDDP_STATUS_LIST(CDDP__STATUS_NAME)
#undef CDDP__STATUS_NAME
    }
    return "CDDP_UNKNOWN";
}

const char *cddp_status_str(int status) {
    switch (status) {
#define CDDP__STATUS_STR(name, value, msg)                                                         \
    case value:                                                                                    \
        return msg;
        CDDP_STATUS_LIST(CDDP__STATUS_STR)
#undef CDDP__STATUS_STR
    }
    return "unknown status";
}

/* The rank shown in log lines and error messages; -2 means "not looked up yet". */
static int log_rank = -2;
static int log_threshold = -1;

void cddp_log_set_rank(int rank) {
    log_rank = rank;
}

int cddp_log_rank(void) {
    if (log_rank == -2) {
        const char *r = getenv("RANK");
        char *end = NULL;
        long v = r && *r ? strtol(r, &end, 10) : -1;
        log_rank = (r && *r && end && *end == '\0' && v >= 0 && v < 1 << 30) ? (int)v : -1;
    }
    return log_rank;
}

void cddp_error_clear(cddp_error *err) {
    if (!err) return;
    err->code = CDDP_OK;
    err->msg[0] = '\0';
}

int cddp_error_vset(cddp_error *err, int code, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    char text[sizeof err->msg], prefix[32] = "";
    vsnprintf(text, sizeof text, fmt, ap);
    int rank = cddp_log_rank();
    /* A message passed on ("%s", other.msg) already carries this rank's prefix. */
    if (rank >= 0) snprintf(prefix, sizeof prefix, "rank %d: ", rank);
    if (strncmp(text, prefix, strlen(prefix)) == 0) prefix[0] = '\0';
    size_t np = strlen(prefix), nt = strlen(text);
    if (np + nt >= sizeof err->msg) nt = sizeof err->msg - 1 - np; /* cut the message's end */
    memcpy(err->msg, prefix, np);
    memcpy(err->msg + np, text, nt);
    err->msg[np + nt] = '\0';
    return code;
}

int cddp_error_set(cddp_error *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cddp_error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

const char *cddp_error_msg(const cddp_error *err) {
    if (!err) return "no error information";
    if (err->msg[0]) return err->msg;
    return cddp_status_str(err->code);
}

static int parse_log_level(const char *s) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < (int)CDDP_ARRAY_LEN(names); i++)
        if (strcasecmp(s, names[i]) == 0) return i;
    if (strcasecmp(s, "warning") == 0) return CDDP_LOG_WARN;
    fprintf(stderr,
            "[cddp] E core: CDDP_LOG_LEVEL=%s is not one of error, warn, info, debug; "
            "using info\n",
            s);
    return CDDP_LOG_INFO;
}

bool cddp_log_enabled(cddp_log_level level) {
    if (log_threshold < 0) log_threshold = parse_log_level(cddp_knob_str(CDDP_KNOB_LOG_LEVEL));
    return (int)level <= log_threshold;
}

void cddp_log(cddp_log_level level, const char *subsystem, const char *fmt, ...) {
    if (!cddp_log_enabled(level)) return;
    static const char letters[] = "EWID";
    char line[1024];
    int n;
    int rank = cddp_log_rank();
    if (rank >= 0)
        n = snprintf(line, sizeof line, "[cddp rank %d] %c %s: ", rank, letters[level], subsystem);
    else
        n = snprintf(line, sizeof line, "[cddp] %c %s: ", letters[level], subsystem);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line keeps lines from different threads whole. */
    fprintf(stderr, "%s\n", line);
}

void cddp__panic(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cddp: programmer error at %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    abort();
}

void *cddp_malloc(size_t bytes) {
    return malloc(bytes ? bytes : 1);
}

void *cddp_calloc(size_t count, size_t size) {
    return calloc(count ? count : 1, size ? size : 1);
}

void *cddp_realloc(void *ptr, size_t bytes) {
    return realloc(ptr, bytes ? bytes : 1);
}

void cddp_free(void *ptr) {
    free(ptr);
}

void *cddp_aligned_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

void cddp_aligned_free(void *ptr) {
    free(ptr);
}

char *cddp_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cddp_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static const struct {
    const char *name, *def, *doc;
    bool is_int;
} knobs[] = {
#define CDDP__KNOB_ROW(id, type, def, doc) {"CDDP_" #id, def, doc, CDDP__KNOB_IS_##type},
#define CDDP__KNOB_IS_INT                  true
#define CDDP__KNOB_IS_STR                  false
    CDDP_KNOB_LIST(CDDP__KNOB_ROW)
#undef CDDP__KNOB_ROW
};

static void check_knob(cddp_knob knob) {
    CDDP_CHECK((int)knob >= 0 && knob < CDDP_KNOB_COUNT, "knob %d does not exist", (int)knob);
}

const char *cddp_knob_name(cddp_knob knob) {
    check_knob(knob);
    return knobs[knob].name;
}

const char *cddp_knob_default(cddp_knob knob) {
    check_knob(knob);
    return knobs[knob].def;
}

const char *cddp_knob_doc(cddp_knob knob) {
    check_knob(knob);
    return knobs[knob].doc;
}

const char *cddp_knob_str(cddp_knob knob) {
    check_knob(knob);
    const char *v = getenv(knobs[knob].name);
    return v && *v ? v : knobs[knob].def;
}

long cddp_knob_int(cddp_knob knob) {
    check_knob(knob);
    CDDP_CHECK(knobs[knob].is_int, "%s is not an integer knob", knobs[knob].name);
    int64_t x = 0;
    cddp_error e = {0};
    if (cddp_parse_int(knobs[knob].name, cddp_knob_str(knob), 0, INT64_MAX, &x, &e) != CDDP_OK) {
        cddp_log(CDDP_LOG_ERROR, "core", "%s; using %s", e.msg, knobs[knob].def);
        x = strtol(knobs[knob].def, NULL, 10);
    }
    return (long)x;
}

long cddp_env_int(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -2;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    return (errno || *end || x < 0 || x >= 1L << 30) ? -1 : x;
}

int cddp_env_rank_world(int *rank, int *world, cddp_error *err) {
    static const char *pairs[][2] = {{"RANK", "WORLD_SIZE"},
                                     {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                     {"PMI_RANK", "PMI_SIZE"},
                                     {"SLURM_PROCID", "SLURM_NTASKS"}};
    *rank = 0;
    *world = 1;
    for (size_t i = 0; i < CDDP_ARRAY_LEN(pairs); i++) {
        long r = cddp_env_int(pairs[i][0]), w = cddp_env_int(pairs[i][1]);
        if (r == -2 && w == -2) continue;
        /* Slurm's pair describes a task only inside a step (srun); a batch script has it too. */
        if (!strcmp(pairs[i][0], "SLURM_PROCID") && cddp_env_int("SLURM_STEP_ID") == -2) continue;
        if (r < 0 || w < 1 || r >= w)
            return cddp_error_set(
                err, CDDP_EINVAL,
                "%s=%s and %s=%s do not describe a rank in [0, world size); "
                "was the program started by a launcher?",
                pairs[i][0], getenv(pairs[i][0]) ? getenv(pairs[i][0]) : "(unset)", pairs[i][1],
                getenv(pairs[i][1]) ? getenv(pairs[i][1]) : "(unset)");
        *rank = (int)r;
        *world = (int)w;
        return CDDP_OK;
    }
    return CDDP_ENOENT;
}

double cddp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *cddp_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    int k = snprintf(buf, n, "(");
    for (int i = 0; i < ndim && k < (int)n; i++)
        k += snprintf(buf + k, n - (size_t)k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < (int)n) snprintf(buf + k, n - (size_t)k, ")");
    return buf;
}

/* ---- numbers from text ------------------------------------------------------------------ */

int cddp_parse_int(const char *what, const char *text, int64_t lo, int64_t hi, int64_t *out,
                   cddp_error *err) {
    const char *t = text ? text : "";
    char *end = NULL;
    errno = 0;
    long long x = strtoll(t, &end, 10);
    /* strtoll skips leading blanks; a value with them is not "the whole string" either */
    if (!*t || isspace((unsigned char)*t) || *end || errno || x < lo || x > hi)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s %s: expected a whole number from %" PRId64 " to %" PRId64, what,
                              *t ? t : "''", lo, hi);
    *out = (int64_t)x;
    return CDDP_OK;
}

int cddp_parse_double(const char *what, const char *text, double lo, double hi, bool lo_open,
                      double *out, cddp_error *err) {
    const char *t = text ? text : "";
    char *end = NULL;
    errno = 0;
    double x = strtod(t, &end);
    bool below = lo_open ? !(x > lo) : !(x >= lo);
    /* errno is ERANGE for overflow (inf) and for denormal underflow, which is a fine number */
    if (!*t || isspace((unsigned char)*t) || *end || !isfinite(x) || below || x > hi)
        return cddp_error_set(err, CDDP_EINVAL, "%s %s: expected a finite number in %c%g, %g]",
                              what, *t ? t : "''", lo_open ? '(' : '[', lo, hi);
    *out = x;
    return CDDP_OK;
}
