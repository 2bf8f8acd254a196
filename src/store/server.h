/* store/server.h: the store server's state, shared by its loop (server.c) and its requests
 * (requests.c). */
#ifndef CDDP_STORE_SERVER_H
#define CDDP_STORE_SERVER_H

#include "cddp/net.h"
#include "cddp/store.h"
#include "store/internal.h"

#include <pthread.h>

typedef struct client {
    cddp_store_server *srv;
    int fd;
    char peer[64];
    buf in, out;
    size_t out_off;
    double since; /* when it connected: it must prove the token within the server's auth_timeout */
    uint8_t nonce[CDDP_NET_NONCE],
        peer_nonce[CDDP_NET_NONCE]; /* the handshake's, once challenged */
    bool challenged, authed, closing, dead;
    table wills; /* keys and values set when the connection ends */
    /* A parked wait: the request's payload (its keys), kept to re-check. */
    bool waiting;
    uint8_t *wait_payload;
    size_t wait_len;
    double wait_deadline;
} client;

struct cddp_store_server {
    int lfd, port, wake[2];
    int spare; /* a descriptor held back, to accept a connection when there is none left */
    char *token;
    pthread_t thread;
    table kv;
    client **clients;
    int nclients, cap_clients;
    double auth_timeout; /* CDDP_STORE_AUTH_TIMEOUT_S */
    int max_pending;     /* CDDP_STORE_MAX_PENDING */
    double listen_again; /* accept() found no descriptor: the listener rests until then */
    /* Connections turned away before proving the token since the last report, and the latest. */
    long strangers;
    double strangers_said;
    char stranger_why[160];
};

#define STRANGER_REPORT_S 10.0

/* requests.c. A client dropped (logged, or counted as a stranger when it never proved the token);
 * a stranger turned away: logged at once when nothing was said for STRANGER_REPORT_S, else
 * counted into the next report (report_strangers: what was counted, at now). */
void cddp__store_drop(client *c, const char *why);
void cddp__store_stranger(cddp_store_server *s, const client *c, const char *why);
void cddp__store_report_strangers(cddp_store_server *s, double now);
/* A reply queued on c (which is dropped when it does not read them); one complete request
 * handled; the parked waits answered where they can be. */
void cddp__store_reply(client *c, int type, const buf *payload);
void cddp__store_handle(cddp_store_server *s, client *c, int type, const uint8_t *pl, size_t len);
void cddp__store_recheck_waits(cddp_store_server *s);

#endif
