/* cddp/store.h: the TCP key-value store where launchers and ranks meet (rendezvous).
 *
 * One server (a thread inside the launcher, or inside rank 0) holds string keys and byte values;
 * clients set, get, add to counters, compare-and-set, delete, count keys and wait for keys. get
 * and wait block until the keys exist or the deadline passes; a timed-out wait names the keys
 * still missing.
 *
 * The wire protocol is a length-prefixed binary frame: magic "CDDS", version, type, payload
 * length (at most CDDP_STORE_MAX_FRAME bytes), payload. A connection starts by proving the job
 * token both ways without sending it (a nonce from each side, then an HMAC-SHA256 of both keyed
 * with the token: cddp/net.h); the launcher makes the token and hands it to its workers
 * (CDDP_STORE_TOKEN), so a stranger who finds the port cannot read or write, and a client learns
 * when the store it reached belongs to another job. Until then a connection may send one frame of
 * at most 4 KiB and has CDDP_STORE_AUTH_TIMEOUT_S to finish; at most CDDP_STORE_MAX_PENDING such
 * connections are kept (the oldest goes, told to connect again, which this client does). A
 * malformed, oversized or truncated frame drops that client with a logged reason; the server
 * never crashes or stalls because of one client (it is a single poll loop with per-client
 * buffers, and never blocks on a client).
 */
#ifndef CDDP_STORE_H
#define CDDP_STORE_H

#include "cddp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDDP_STORE_MAX_FRAME (16u << 20)

typedef struct cddp_store_server cddp_store_server;

/* Starts a server thread listening on host:port (port 0: any free port). It binds to host's
 * address only; host NULL: every interface of the machine. NULL with err filled when the port is in
 * use ("... is already in use — another job? choose --master_port or --standalone") or the address
 * is not this machine's. */
CDDP_API cddp_store_server *cddp_store_server_start(const char *host, int port, const char *token,
                                                    cddp_error *err);
/* The port it listens on (useful after asking for port 0). */
CDDP_API int cddp_store_server_port(const cddp_store_server *srv);
/* Stops the thread, closes every connection, frees everything. Accepts NULL. */
CDDP_API void cddp_store_server_stop(cddp_store_server *srv);

typedef struct cddp_store cddp_store;

typedef struct cddp_store_options {
    const char *host;
    int port;
    const char *token;
    double timeout_s; /* connection (retried until then) and default wait; 0: CDDP_RDZV_TIMEOUT_S */
    const char *local_addr; /* source address to connect from; NULL: any */
} cddp_store_options;

/* Connects, retrying while the server is not up yet (or asks to come back), and proves the token.
 * NULL with err filled on timeout (naming host:port and what to check) or a wrong token. */
CDDP_API cddp_store *cddp_store_connect(const cddp_store_options *opts, cddp_error *err);
CDDP_API void cddp_store_close(cddp_store *s);

/* Each call is one request and its reply; a client is for one thread at a time. A connection
 * failure makes every later call fail with the first error, and so does a reply that has not come
 * within CDDP_STORE_REPLY_S (30 s) beyond a wait's own time: the server's host is gone or cut
 * off. */
CDDP_API int cddp_store_set(cddp_store *s, const char *key, const void *value, size_t len,
                            cddp_error *err);
CDDP_API int cddp_store_set_str(cddp_store *s, const char *key, const char *value, cddp_error *err);
/* Waits up to timeout_s (< 0: the client's default) for key, then returns its value in a new
 * buffer (*value, *len; NUL-terminated for convenience; the caller frees it with cddp_free). */
CDDP_API int cddp_store_get(cddp_store *s, const char *key, double timeout_s, void **value,
                            size_t *len, cddp_error *err);
/* Adds delta to the integer at key (missing = 0) and returns the new value. */
CDDP_API int cddp_store_add(cddp_store *s, const char *key, int64_t delta, int64_t *result,
                            cddp_error *err);
/* PyTorch's compare_set: if key holds `expected` (or is missing and expected is empty), it
 * becomes `desired`. *current (caller frees) receives the value now held; for a missing key with
 * a non-empty expected value, that is `expected` itself and nothing is stored. */
CDDP_API int cddp_store_compare_set(cddp_store *s, const char *key, const void *expected,
                                    size_t elen, const void *desired, size_t dlen, void **current,
                                    size_t *clen, cddp_error *err);
/* *deleted (may be NULL) says whether the key existed. */
CDDP_API int cddp_store_delete(cddp_store *s, const char *key, bool *deleted, cddp_error *err);
CDDP_API int cddp_store_num_keys(cddp_store *s, int64_t *count, cddp_error *err);
/* Leaves a will: the server sets key to value when this connection ends, however it ends (the
 * client closes it, its process dies, the server drops it), unless a later will for key replaced
 * it or cddp_store_clear_will withdrew it (key NULL: every will of this connection). What a
 * launcher uses to say at once that it is gone, or to free what it held. */
CDDP_API int cddp_store_set_will(cddp_store *s, const char *key, const void *value, size_t len,
                                 cddp_error *err);
CDDP_API int cddp_store_clear_will(cddp_store *s, const char *key, cddp_error *err);
/* The client's connection to the store (-1 when closed): where it is, cddp_net_peer_addr finds
 * this machine's address on the route to the master. */
CDDP_API int cddp_store_fd(const cddp_store *s);
/* Waits until every key exists. CDDP_ETIMEDOUT names the missing keys; timeout_s 0 checks once. */
CDDP_API int cddp_store_wait(cddp_store *s, const char *const *keys, int n, double timeout_s,
                             cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
