/* wire.c: the store's frames and fields (format in store/internal.h). */
#include "store/internal.h"

#include <string.h>

void cddp__store_buf_put(buf *b, const void *data, size_t n) {
    if (b->oom || n == 0) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = cddp_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

void cddp__store_put_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    cddp__store_buf_put(b, x, 4);
}

void cddp__store_put_u64(buf *b, uint64_t v) {
    cddp__store_put_u32(b, (uint32_t)v);
    cddp__store_put_u32(b, (uint32_t)(v >> 32));
}

void cddp__store_put_field(buf *b, const void *data, size_t n) {
    cddp__store_put_u32(b, (uint32_t)n);
    cddp__store_buf_put(b, data, n);
}

uint32_t cddp__store_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t cddp__store_rd_u64(const uint8_t *p) {
    return cddp__store_rd_u32(p) | (uint64_t)cddp__store_rd_u32(p + 4) << 32;
}

bool cddp__store_get_u32(cursor *c, uint32_t *v) {
    if (c->end - c->p < 4) return false;
    *v = cddp__store_rd_u32(c->p);
    c->p += 4;
    return true;
}

bool cddp__store_get_u64(cursor *c, uint64_t *v) {
    if (c->end - c->p < 8) return false;
    *v = cddp__store_rd_u64(c->p);
    c->p += 8;
    return true;
}

bool cddp__store_get_field(cursor *c, const uint8_t **data, size_t *n) {
    uint32_t len;
    if (!cddp__store_get_u32(c, &len) || (size_t)(c->end - c->p) < len) return false;
    *data = c->p;
    *n = len;
    c->p += len;
    return true;
}

/* A frame: header then payload. */
void cddp__store_frame(buf *out, int type, const buf *payload) {
    cddp__store_put_u32(out, MAGIC);
    uint8_t vt[4] = {VERSION, 0, (uint8_t)type, (uint8_t)(type >> 8)};
    cddp__store_buf_put(out, vt, 4);
    cddp__store_put_u32(out, (uint32_t)(payload ? payload->len : 0));
    if (payload && payload->len) cddp__store_buf_put(out, payload->p, payload->len);
}
