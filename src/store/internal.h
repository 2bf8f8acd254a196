/* store/internal.h: the store's wire format, shared by its server and client.
 *
 * Frames: 12-byte header (magic "CDDS", u16 version, u16 type, u32 payload length, all little
 * endian) and the payload, a sequence of fields (u32 length + bytes, or fixed-size integers).
 *
 * A connection starts by proving the job token both ways without sending it (cddp/net.h):
 *   client: HELLO      {nonce_c}
 *   server: CHALLENGE  {nonce_s, proof("cddp store: server", nonce_c, nonce_s)}
 *   client: AUTH       {proof("cddp store: client", nonce_c, nonce_s)}   (the server's checked)
 *   server: OK, or ERROR "wrong job token" and the connection closes.
 *
 * A connection may leave wills (WILL {key, value, 1}): the server sets each when the connection
 * ends (the client closed it, died, or was dropped), unless a later WILL for the key replaced or
 * withdrew it.
 */
#ifndef CDDP_STORE_INTERNAL_H
#define CDDP_STORE_INTERNAL_H

#include "cddp/core.h"

#define MAGIC   0x53444443u /* "CDDS" read as little endian */
#define VERSION 2
#define HEADER  12
#define MAX_OUT (64u << 20) /* replies a client may leave unread before it is dropped */
/* The largest frame a client may send before it has proved the job token: the handshake's frames
 * are a few dozen bytes, so a stranger cannot make the server buffer more than this. */
#define PREAUTH_MAX 4096u

enum {
    REQ_HELLO = 1,
    REQ_SET,
    REQ_GET,
    REQ_ADD,
    REQ_CAS,
    REQ_DELETE,
    REQ_NUM_KEYS,
    REQ_WAIT,
    REQ_AUTH, /* the client's proof of the token, after the server's challenge */
    REQ_WILL, /* {key, value, u32 keep}: keep 1 leaves a will for key (the server sets it when
               * this connection ends), 0 withdraws it (an empty key: every will) */
    REP_OK = 100,
    REP_VALUE,
    REP_NOTFOUND,
    REP_TIMEOUT,
    REP_ERROR,
    REP_BUSY,      /* too many connections are proving the token: close, then connect again */
    REP_CHALLENGE, /* the answer to HELLO: the server's nonce and its own proof of the token */
};

/* An output buffer that grows; a failed allocation sets oom and drops what follows. */
typedef struct buf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} buf;

/* A cursor over a payload; every get fails (false) instead of reading past the end. */
typedef struct cursor {
    const uint8_t *p, *end;
} cursor;

void cddp__store_buf_put(buf *b, const void *data, size_t n);
void cddp__store_put_u32(buf *b, uint32_t v);
void cddp__store_put_u64(buf *b, uint64_t v);
/* A field: its u32 length, then its bytes. */
void cddp__store_put_field(buf *b, const void *data, size_t n);
uint32_t cddp__store_rd_u32(const uint8_t *p);
uint64_t cddp__store_rd_u64(const uint8_t *p);
/* Every get fails (false) instead of reading past the end. */
bool cddp__store_get_u32(cursor *c, uint32_t *v);
bool cddp__store_get_u64(cursor *c, uint64_t *v);
bool cddp__store_get_field(cursor *c, const uint8_t **data, size_t *n);
/* A frame: header then payload (NULL: none). */
void cddp__store_frame(buf *out, int type, const buf *payload);

/* The server's key space (kv.c): string keys, byte values. */
typedef struct entry {
    char *key; /* NULL: empty; TOMBSTONE: deleted */
    uint8_t *val;
    size_t len;
} entry;

typedef struct table {
    entry *e;
    size_t cap, used, live; /* used counts tombstones too */
} table;

/* Stores a copy of value under key; false when out of memory. */
bool cddp__kv_put(table *t, const uint8_t *key, size_t klen, const uint8_t *val, size_t len);
/* The live entry holding key, or NULL. */
entry *cddp__kv_lookup(table *t, const uint8_t *key, size_t klen);
/* Deletes a live entry. */
void cddp__kv_remove(table *t, entry *e);
/* Whether a slot of t->e holds a live entry. */
bool cddp__kv_live(const entry *e);
void cddp__kv_free(table *t);

#endif
