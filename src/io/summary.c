/* summary.c: TensorBoard's event files (see cddp/summary.h).
 *
 * A record is TFRecord's: uint64 length, uint32 masked CRC-32C of those 8 bytes, the data, uint32
 * masked CRC-32C of the data; a mask is ((crc >> 15) | (crc << 17)) + 0xa282ead8. The data is an
 * Event in protocol buffers' wire format, written here field by field:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * (a field's key is its number << 3 | its wire type: 0 varint, 1 eight bytes, 2 length-delimited,
 * 5 four bytes).
 */
#include "cddp/summary.h"

#include "io/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_TAG 1000

struct cddp_summary {
    FILE *f;
    char path[4096];
    int status; /* the first failed write's */
};

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), a byte at a time from a table. */
static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc32c(const unsigned char *p, size_t n) {
    pthread_once(&table_once, make_table);
    uint32_t c = 0xffffffffu;
    while (n--) c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t masked(const unsigned char *p, size_t n) {
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void le(unsigned char *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(v >> (8 * i));
}

/* A message being written into buf (cap bytes). */
typedef struct pb {
    unsigned char *buf;
    size_t n, cap;
} pb;

static void put(pb *b, const void *p, size_t n) {
    if (b->n + n <= b->cap) memcpy(b->buf + b->n, p, n);
    b->n += n;
}

static void varint(pb *b, uint64_t v) {
    unsigned char c[10];
    int n = 0;
    do {
        c[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) c[n] |= 0x80;
        n++;
    } while (v);
    put(b, c, (size_t)n);
}

static void bytes_field(pb *b, int field, const void *p, size_t n) {
    varint(b, (uint64_t)field << 3 | 2);
    varint(b, n);
    put(b, p, n);
}

static void double_field(pb *b, int field, double v) {
    unsigned char c[8];
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    le(c, u, 8);
    varint(b, (uint64_t)field << 3 | 1);
    put(b, c, 8);
}

static int record(cddp_summary *s, const pb *event, cddp_error *err) {
    if (event->n > event->cap) /* the buffers are sized for MAX_TAG: never, but never silently */
        return cddp_error_set(err, CDDP_EINVAL, "%s: an event of %zu bytes", s->path, event->n);
    unsigned char head[12], tail[4];
    le(head, event->n, 8);
    le(head + 8, masked(head, 8), 4);
    le(tail, masked(event->buf, event->n), 4);
    if (fwrite(head, 1, 12, s->f) != 12 || fwrite(event->buf, 1, event->n, s->f) != event->n ||
        fwrite(tail, 1, 4, s->f) != 4 || fflush(s->f) != 0)
        s->status = cddp_error_set(err, CDDP_EIO, "cannot write %s: %s", s->path, strerror(errno));
    return s->status;
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

cddp_summary *cddp_summary_open(const char *dir, cddp_error *err) {
    if (cddp__make_dirs(dir, err) != CDDP_OK) return NULL;
    cddp_summary *s = calloc(1, sizeof *s);
    if (!s) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    double now = wall_time();
    int n = snprintf(s->path, sizeof s->path, "%s/events.out.tfevents.%lld.%s.%d.cddp", dir,
                     (long long)now, host, (int)getpid());
    if (n <= 0 || (size_t)n >= sizeof s->path) {
        cddp_error_set(err, CDDP_EINVAL, "%s: path too long", dir);
        free(s);
        return NULL;
    }
    if (!(s->f = fopen(s->path, "wbx"))) { /* a new file: never another writer's */
        cddp_error_set(err, CDDP_EIO, "cannot create %s: %s", s->path, strerror(errno));
        free(s);
        return NULL;
    }
    unsigned char buf[64];
    pb e = {buf, 0, sizeof buf};
    double_field(&e, 1, now);
    bytes_field(&e, 3, "brain.Event:2", 13);
    if (record(s, &e, err) != CDDP_OK) {
        cddp_summary_close(s, NULL);
        return NULL;
    }
    return s;
}

int cddp_summary_scalar(cddp_summary *s, const char *tag, int64_t step, double value,
                        cddp_error *err) {
    size_t tn = strlen(tag);
    if (tn == 0 || tn > MAX_TAG)
        return cddp_error_set(err, CDDP_EINVAL, "a summary's tag has 1 to %d bytes, not %zu",
                              MAX_TAG, tn);
    if (s->status) return cddp_error_set(err, s->status, "%s: an earlier write failed", s->path);
    unsigned char vbuf[MAX_TAG + 32], sbuf[MAX_TAG + 48], ebuf[MAX_TAG + 96];
    pb v = {vbuf, 0, sizeof vbuf}, sum = {sbuf, 0, sizeof sbuf}, e = {ebuf, 0, sizeof ebuf};
    bytes_field(&v, 1, tag, tn);
    float f = (float)value;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    unsigned char c[4];
    le(c, u, 4);
    varint(&v, 2 << 3 | 5);
    put(&v, c, 4);
    bytes_field(&sum, 1, v.buf, v.n);
    double_field(&e, 1, wall_time());
    varint(&e, 2 << 3 | 0);
    varint(&e, (uint64_t)step);
    bytes_field(&e, 5, sum.buf, sum.n);
    return record(s, &e, err);
}

const char *cddp_summary_path(const cddp_summary *s) {
    return s->path;
}

int cddp_summary_close(cddp_summary *s, cddp_error *err) {
    if (!s) return CDDP_OK;
    int rc = s->status;
    if (s->f && fclose(s->f) != 0 && !rc)
        rc = cddp_error_set(err, CDDP_EIO, "cannot close %s: %s", s->path, strerror(errno));
    free(s);
    return rc;
}
