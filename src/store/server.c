/* server.c: the rendezvous store's server (contract in cddp/store.h, wire in store/internal.h).
 *
 * The server is one thread running a poll loop over the listening socket, its clients and a
 * wake-up pipe. Each client has an input buffer (a frame is handled once complete) and an output
 * buffer (flushed when the socket is writable), so no client can block the loop: a slow reader
 * only fills its own buffer (and is dropped past a limit), a slow or broken writer only leaves a
 * partial frame in its own buffer. A wait that cannot be answered yet parks the client with its
 * keys and deadline; every change to the key space re-checks parked clients, and the poll timeout
 * is the nearest deadline. Keys live in a small open-addressing hash table (kv.c).
 *
 * Strangers. Until a client has proved the job token it may send only small frames (PREAUTH_MAX),
 * must do so within CDDP_STORE_AUTH_TIMEOUT_S, and at most CDDP_STORE_MAX_PENDING such clients are
 * kept: one more closes the oldest (told to connect again, in case it was one of the job's in the
 * middle of its handshake). accept() failing for want of descriptors closes the oldest such client
 * too, or rests the listener for a moment, never spins. So a flood of connections costs the server
 * a bounded amount of memory and descriptors, and the job's own clients still get through.
 * Turned-away connections are logged once, then summed up every STRANGER_REPORT_S.
 */
#include "cddp/net.h"
#include "cddp/store.h"
#include "store/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the server -------------------------------------------------------------------------- */

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
#define ACCEPT_BATCH                                                                               \
    32 /* connections accepted per turn of the loop, so clients are read between                   \
        */

static void report_strangers(cddp_store_server *s, double now) {
    if (s->strangers == 1)
        cddp_log(CDDP_LOG_WARN, "store", "turned away %s", s->stranger_why);
    else
        cddp_log(CDDP_LOG_WARN, "store",
                 "turned away %ld connections that did not prove the job token in the last "
                 "%.0f s (the latest %s); is another job or a stranger using this port?",
                 s->strangers, STRANGER_REPORT_S, s->stranger_why);
    s->strangers = 0;
    s->strangers_said = now;
}

/* A connection that never proved the token is closed: logged at once when nothing was said for
 * STRANGER_REPORT_S, else counted into the next report, so that a flood does not flood the log. */
static void stranger(cddp_store_server *s, const client *c, const char *why) {
    double now = cddp_now_s();
    snprintf(s->stranger_why, sizeof s->stranger_why, "%s: %s", c->peer, why);
    s->strangers++;
    if (now - s->strangers_said >= STRANGER_REPORT_S) report_strangers(s, now);
}

static void drop(client *c, const char *why) {
    if (c->dead) return;
    if (c->authed)
        cddp_log(CDDP_LOG_WARN, "store", "dropping client %s: %s", c->peer, why);
    else
        stranger(c->srv, c, why);
    c->dead = true;
}

static void reply(client *c, int type, const buf *payload) {
    cddp__store_frame(&c->out, type, payload);
    if (c->out.oom || c->out.len - c->out_off > MAX_OUT) drop(c, "it does not read its replies");
}

static void reply_error(client *c, const char *msg) {
    buf p = {0};
    cddp__store_put_field(&p, msg, strlen(msg));
    reply(c, REP_ERROR, &p);
    cddp_free(p.p);
}

/* Answers a wait when it can: OK when every key exists, TIMEOUT (with the missing keys) when the
 * deadline has passed. Returns true when it replied. */
static bool settle_wait(cddp_store_server *s, client *c, const uint8_t *payload, size_t len,
                        double deadline) {
    /* The payload was validated when the request arrived. */
    cursor cur = {payload, payload + len};
    uint64_t ms = 0;
    uint32_t n = 0;
    cddp__store_get_u64(&cur, &ms);
    cddp__store_get_u32(&cur, &n);
    buf missing = {0};
    int nmissing = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *k = NULL;
        size_t kl = 0;
        if (!cddp__store_get_field(&cur, &k, &kl)) break;
        if (!cddp__kv_lookup(&s->kv, k, kl)) {
            if (nmissing++) cddp__store_buf_put(&missing, ", ", 2);
            cddp__store_buf_put(&missing, k, kl);
        }
    }
    bool done = true;
    if (nmissing == 0) {
        reply(c, REP_OK, NULL);
    } else if (deadline >= 0 && cddp_now_s() >= deadline) {
        buf p = {0};
        cddp__store_put_field(&p, missing.p, missing.len);
        reply(c, REP_TIMEOUT, &p);
        cddp_free(p.p);
    } else {
        done = false;
    }
    cddp_free(missing.p);
    return done;
}

static void recheck_waits(cddp_store_server *s) {
    for (int i = 0; i < s->nclients; i++) {
        client *c = s->clients[i];
        if (c->waiting && settle_wait(s, c, c->wait_payload, c->wait_len, c->wait_deadline)) {
            c->waiting = false;
            cddp_free(c->wait_payload);
            c->wait_payload = NULL;
        }
    }
}

/* Parses the integer a counter key holds; false when it holds something else. */
static bool counter_value(const entry *e, int64_t *v) {
    char num[32] = {0}, *end = NULL;
    if (e->len == 0 || e->len >= sizeof num) return false;
    memcpy(num, e->val, e->len);
    errno = 0;
    *v = strtoll(num, &end, 10);
    return *end == '\0' && errno == 0;
}

/* A key: a field without NUL bytes (the key space holds C strings, as clients name keys). */
static bool get_key(cursor *c, const uint8_t **k, size_t *kl) {
    return cddp__store_get_field(c, k, kl) && !memchr(*k, 0, *kl);
}

/* Handles one complete request. Malformed requests drop the client. */
static void handle(cddp_store_server *s, client *c, int type, const uint8_t *pl, size_t len) {
    cursor cur = {pl, pl + len};
    const uint8_t *k, *a, *b;
    size_t kl, al, bl;
    buf p = {0};
    if (!c->authed && type != REQ_HELLO && type != REQ_AUTH) {
        drop(c, "a request came before the job token");
        return;
    }
    switch (type) {
    case REQ_HELLO: {
        if (c->challenged || !cddp__store_get_field(&cur, &a, &al) || al != CDDP_NET_NONCE)
            goto malformed;
        uint8_t proof[CDDP_NET_PROOF];
        if (cddp_net_nonce(c->nonce, NULL) != CDDP_OK) {
            reply_error(c, "the store has no random bytes for its challenge");
            c->closing = true;
            break;
        }
        memcpy(c->peer_nonce, a, CDDP_NET_NONCE);
        cddp_net_proof(s->token, "cddp store: server", c->peer_nonce, c->nonce, proof);
        cddp__store_put_field(&p, c->nonce, CDDP_NET_NONCE);
        cddp__store_put_field(&p, proof, CDDP_NET_PROOF);
        reply(c, REP_CHALLENGE, &p);
        c->challenged = true;
        break;
    }
    case REQ_AUTH: {
        if (!c->challenged || c->authed || !cddp__store_get_field(&cur, &a, &al) ||
            al != CDDP_NET_PROOF)
            goto malformed;
        uint8_t want[CDDP_NET_PROOF];
        cddp_net_proof(s->token, "cddp store: client", c->peer_nonce, c->nonce, want);
        if (cddp_net_proof_equal(a, want)) {
            c->authed = true;
            reply(c, REP_OK, NULL);
        } else {
            stranger(s, c, "wrong job token");
            reply_error(c, "wrong job token: this store belongs to another job (is "
                           "CDDP_STORE_TOKEN the one this job's launcher set?)");
            c->closing = true;
        }
        break;
    }
    case REQ_SET:
        if (!get_key(&cur, &k, &kl) || !cddp__store_get_field(&cur, &a, &al)) goto malformed;
        if (!cddp__kv_put(&s->kv, k, kl, a, al)) goto oom;
        reply(c, REP_OK, NULL);
        recheck_waits(s);
        break;
    case REQ_GET: {
        if (!get_key(&cur, &k, &kl)) goto malformed;
        entry *e = cddp__kv_lookup(&s->kv, k, kl);
        if (e) {
            cddp__store_put_field(&p, e->val, e->len);
            reply(c, REP_VALUE, &p);
        } else {
            reply(c, REP_NOTFOUND, NULL);
        }
        break;
    }
    case REQ_ADD: {
        uint64_t delta;
        if (!get_key(&cur, &k, &kl) || !cddp__store_get_u64(&cur, &delta)) goto malformed;
        entry *e = cddp__kv_lookup(&s->kv, k, kl);
        int64_t v = 0;
        if (e && !counter_value(e, &v)) {
            reply_error(c, "add: the key holds a value that is not an integer");
            break;
        }
        int64_t d = (int64_t)delta;
        if ((d > 0 && v > INT64_MAX - d) || (d < 0 && v < INT64_MIN - d)) {
            reply_error(c, "add: the counter would overflow a 64-bit integer");
            break;
        }
        v += d;
        char text[32];
        int n = snprintf(text, sizeof text, "%" PRId64, v);
        if (!cddp__kv_put(&s->kv, k, kl, (const uint8_t *)text, (size_t)n)) goto oom;
        cddp__store_put_u64(&p, (uint64_t)v);
        reply(c, REP_VALUE, &p);
        recheck_waits(s);
        break;
    }
    case REQ_CAS: {
        if (!get_key(&cur, &k, &kl) || !cddp__store_get_field(&cur, &a, &al) ||
            !cddp__store_get_field(&cur, &b, &bl))
            goto malformed;
        entry *e = cddp__kv_lookup(&s->kv, k, kl);
        if ((!e && al == 0) || (e && e->len == al && memcmp(e->val, a, al) == 0)) {
            if (!cddp__kv_put(&s->kv, k, kl, b, bl)) goto oom;
            cddp__store_put_field(&p, b, bl);
        } else if (!e) {
            cddp__store_put_field(&p, a,
                                  al); /* PyTorch's answer for a missing key: the expected value */
        } else {
            cddp__store_put_field(&p, e->val, e->len);
        }
        reply(c, REP_VALUE, &p);
        recheck_waits(s);
        break;
    }
    case REQ_DELETE: {
        if (!get_key(&cur, &k, &kl)) goto malformed;
        entry *e = cddp__kv_lookup(&s->kv, k, kl);
        uint8_t existed = e != NULL;
        if (e) cddp__kv_remove(&s->kv, e);
        cddp__store_put_field(&p, &existed, 1);
        reply(c, REP_VALUE, &p);
        break;
    }
    case REQ_WILL: {
        uint32_t keep;
        if (!cddp__store_get_field(&cur, &k, &kl) || !cddp__store_get_field(&cur, &a, &al) ||
            !cddp__store_get_u32(&cur, &keep) || (keep && !kl))
            goto malformed;
        if (keep) {
            if (!cddp__kv_put(&c->wills, k, kl, a, al)) goto oom;
        } else if (kl) {
            entry *e = cddp__kv_lookup(&c->wills, k, kl);
            if (e) cddp__kv_remove(&c->wills, e);
        } else {
            cddp__kv_free(&c->wills);
            c->wills = (table){0};
        }
        reply(c, REP_OK, NULL);
        break;
    }
    case REQ_NUM_KEYS:
        cddp__store_put_u64(&p, s->kv.live);
        reply(c, REP_VALUE, &p);
        break;
    case REQ_WAIT: {
        uint64_t ms;
        uint32_t n;
        if (!cddp__store_get_u64(&cur, &ms) || !cddp__store_get_u32(&cur, &n)) goto malformed;
        for (uint32_t i = 0; i < n; i++)
            if (!get_key(&cur, &k, &kl)) goto malformed;
        double deadline = ms == UINT64_MAX ? -1 : cddp_now_s() + (double)ms / 1000.0;
        if (!settle_wait(s, c, pl, len, deadline)) {
            c->wait_payload = cddp_malloc(len);
            if (!c->wait_payload) goto oom;
            memcpy(c->wait_payload, pl, len);
            c->wait_len = len;
            c->wait_deadline = deadline;
            c->waiting = true;
        }
        break;
    }
    default:
        drop(c, "unknown request type");
        break;
    }
    cddp_free(p.p);
    return;
malformed:
    drop(c, "malformed request");
    return;
oom:
    cddp_free(p.p);
    reply_error(c, "the store is out of memory");
}

/* Handles every complete frame in c's input buffer. */
static void process_input(cddp_store_server *s, client *c) {
    size_t off = 0;
    while (!c->dead && !c->closing && !c->waiting && c->in.len - off >= HEADER) {
        const uint8_t *h = c->in.p + off;
        if (cddp__store_rd_u32(h) != MAGIC || h[4] != VERSION || h[5] != 0) {
            drop(c, "not a cddp store frame (bad magic or version)");
            return;
        }
        uint32_t len = cddp__store_rd_u32(h + 8);
        uint32_t limit = c->authed ? CDDP_STORE_MAX_FRAME : PREAUTH_MAX;
        if (len > limit) {
            char why[128];
            snprintf(why, sizeof why, "oversized frame (%u bytes, the limit is %u%s)", len, limit,
                     c->authed ? "" : " before the job token");
            drop(c, why);
            return;
        }
        if (c->in.len - off < HEADER + (size_t)len) break;
        handle(s, c, h[6] | h[7] << 8, h + HEADER, len);
        off += HEADER + len;
    }
    if (off) {
        memmove(c->in.p, c->in.p + off, c->in.len - off);
        c->in.len -= off;
    }
}

static void read_client(cddp_store_server *s, client *c) {
    uint8_t chunk[65536];
    for (;;) {
        size_t want = sizeof chunk;
        if (!c->authed) { /* never more than one small frame from a client without the token */
            size_t most = HEADER + PREAUTH_MAX;
            if (c->in.len >= most) break;
            want = CDDP_MIN(want, most - c->in.len);
        }
        ssize_t r = recv(c->fd, chunk, want, 0);
        if (r > 0) {
            cddp__store_buf_put(&c->in, chunk, (size_t)r);
            if (c->in.oom) {
                drop(c, "out of memory for its request");
                return;
            }
            if (c->in.len > HEADER + (size_t)CDDP_STORE_MAX_FRAME) break; /* process, then drop */
            continue;
        }
        if (r == 0) { /* the peer is gone; a partial frame left behind was cut short */
            process_input(s, c);
            if (c->in.len && !c->dead) drop(c, "it closed the connection in the middle of a frame");
            c->dead = true;
            return;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) drop(c, strerror(errno));
        break;
    }
    process_input(s, c);
}

static void flush_client(client *c) {
    while (c->out_off < c->out.len) {
        ssize_t w = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        c->dead = true;
        return;
    }
    c->out.len = c->out_off = 0;
    if (c->closing) c->dead = true;
}

static void free_client(client *c) {
    close(c->fd);
    cddp_free(c->in.p);
    cddp_free(c->out.p);
    cddp_free(c->wait_payload);
    cddp__kv_free(&c->wills);
    cddp_free(c);
}

static void describe_peer(const struct sockaddr_storage *ss, char *out, size_t n) {
    char host[64] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, host, sizeof host);
        port = ntohs(((const struct sockaddr_in *)ss)->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, host, sizeof host);
        port = ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    }
    cddp_net_endpoint(out, n, host, port);
}

/* Removes a connection that ended, carrying out its wills. */
static void remove_client(cddp_store_server *s, int i) {
    client *c = s->clients[i];
    bool wills = c->authed && c->wills.live > 0;
    for (size_t w = 0; wills && w < c->wills.cap; w++) {
        const entry *e = &c->wills.e[w];
        if (cddp__kv_live(e))
            cddp__kv_put(&s->kv, (const uint8_t *)e->key, strlen(e->key), e->val, e->len);
    }
    free_client(c);
    s->clients[i] = s->clients[--s->nclients];
    if (wills) recheck_waits(s);
}

/* Closes the oldest connection that has not proved the token, telling it to connect again (a
 * client of this job in the middle of its handshake does). False when there is none. */
static bool evict_oldest_pending(cddp_store_server *s, const char *why) {
    int oldest = -1;
    for (int i = 0; i < s->nclients; i++) {
        const client *c = s->clients[i];
        if (!c->authed && !c->dead && (oldest < 0 || c->since < s->clients[oldest]->since))
            oldest = i;
    }
    if (oldest < 0) return false;
    client *c = s->clients[oldest];
    reply(c, REP_BUSY, NULL);
    flush_client(c);
    drop(c, why);
    remove_client(s, oldest);
    return true;
}

static int pending_clients(const cddp_store_server *s) {
    int n = 0;
    for (int i = 0; i < s->nclients; i++) n += !s->clients[i]->authed && !s->clients[i]->dead;
    return n;
}

/* accept() found no descriptor for a new connection: the spare one makes room to take it (an
 * empty queue answers EAGAIN), then a stranger makes room for it, or it is told to come back
 * (a client of the job in the middle of connecting does). Returns the connection, or -1. */
static int accept_without_descriptors(cddp_store_server *s, struct sockaddr_storage *ss,
                                      socklen_t *sl) {
    if (s->spare < 0) {
        cddp_log(CDDP_LOG_WARN, "store", "cannot accept a connection: %s; retrying in 0.1 s",
                 strerror(EMFILE));
        s->listen_again = cddp_now_s() + 0.1;
        return -1;
    }
    close(s->spare);
    int fd = accept4(s->lfd, (struct sockaddr *)ss, sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 && !evict_oldest_pending(s, "no file descriptors left, and this was the oldest "
                                            "connection without the job token")) {
        static const uint8_t busy[HEADER] = {'C', 'D', 'D', 'S', VERSION, 0, REP_BUSY, 0};
        ssize_t w = send(fd, busy, sizeof busy, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        close(fd);
        fd = -1;
        client who = {0};
        describe_peer(ss, who.peer, sizeof who.peer);
        stranger(s, &who, "no file descriptors left, and every connection has the job token");
    }
    s->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd;
}

/* Accepts up to ACCEPT_BATCH connections. */
static void accept_clients(cddp_store_server *s) {
    for (int batch = 0; batch < ACCEPT_BATCH; batch++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            sl = sizeof ss;
            fd = accept_without_descriptors(s, &ss, &sl);
            if (fd < 0) return;
        } else if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == ENOBUFS || errno == ENOMEM) s->listen_again = cddp_now_s() + 0.1;
            return;
        }
        cddp_net_nonblocking(fd);
        if (pending_clients(s) >= CDDP_MAX(s->max_pending, 1))
            evict_oldest_pending(s, "too many connections without the job token "
                                    "(CDDP_STORE_MAX_PENDING), and this was the oldest");
        if (s->nclients == s->cap_clients) {
            int cap = s->cap_clients ? 2 * s->cap_clients : 16;
            client **cs = cddp_realloc(s->clients, (size_t)cap * sizeof *cs);
            if (!cs) {
                close(fd);
                continue;
            }
            s->clients = cs;
            s->cap_clients = cap;
        }
        client *c = cddp_calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->srv = s;
        c->fd = fd;
        c->since = cddp_now_s();
        describe_peer(&ss, c->peer, sizeof c->peer);
        s->clients[s->nclients++] = c;
    }
}

/* The earlier of two deadlines; a negative one is none. */
static double earliest(double a, double b) {
    return a < 0 ? b : b < 0 ? a : CDDP_MIN(a, b);
}

static void *serve(void *arg) {
    cddp_store_server *s = arg;
    struct pollfd *pf = NULL;
    int cap = 0;
    for (;;) {
        if (cap < s->nclients + 2) {
            cap = 2 * (s->nclients + 2);
            struct pollfd *n = cddp_realloc(pf, (size_t)cap * sizeof *pf);
            if (!n) break;
            pf = n;
        }
        double now = cddp_now_s(), next = -1;
        bool resting = now < s->listen_again;
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){s->lfd, (short)(resting ? 0 : POLLIN), 0};
        if (resting) next = s->listen_again;
        if (s->strangers) next = earliest(next, s->strangers_said + STRANGER_REPORT_S);
        int n = s->nclients;
        for (int i = 0; i < n; i++) {
            client *c = s->clients[i];
            short ev = (short)(POLLIN | (c->out.len > c->out_off ? POLLOUT : 0));
            pf[i + 2] = (struct pollfd){c->fd, ev, 0};
            if (c->waiting && c->wait_deadline >= 0) next = earliest(next, c->wait_deadline);
            if (!c->authed) next = earliest(next, c->since + s->auth_timeout);
        }
        int r = poll(pf, (nfds_t)n + 2, cddp_net_poll_ms(next));
        if (r < 0 && errno != EINTR) break;
        if (r > 0 && (pf[0].revents & POLLIN)) break; /* asked to stop */
        for (int i = 0; r > 0 && i < n; i++)
            if (pf[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) read_client(s, s->clients[i]);
        if (r > 0 && (pf[1].revents & POLLIN)) accept_clients(s);
        recheck_waits(s); /* deadlines that passed */
        now = cddp_now_s();
        for (int i = 0; i < s->nclients; i++) {
            client *c = s->clients[i];
            if (!c->authed && now >= c->since + s->auth_timeout) {
                char why[96];
                snprintf(why, sizeof why, "it did not prove the job token within %.0f s",
                         s->auth_timeout);
                drop(c, why);
            }
        }
        if (s->strangers && now - s->strangers_said >= STRANGER_REPORT_S) report_strangers(s, now);
        for (int i = 0; i < s->nclients; i++) {
            client *c = s->clients[i];
            if (!c->dead && c->out.len > c->out_off) flush_client(c);
            if (c->dead) remove_client(s, i--);
        }
    }
    cddp_free(pf);
    return NULL;
}

cddp_store_server *cddp_store_server_start(const char *host, int port, const char *token,
                                           cddp_error *err) {
    cddp_store_server *s = cddp_calloc(1, sizeof *s);
    if (!s) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->auth_timeout = (double)CDDP_MAX(cddp_knob_int(CDDP_KNOB_STORE_AUTH_TIMEOUT_S), 1);
    s->max_pending = (int)CDDP_MIN(cddp_knob_int(CDDP_KNOB_STORE_MAX_PENDING), 1 << 20);
    s->strangers_said = -1e9;
    s->token = cddp_strdup(token ? token : "");
    if (!s->token || cddp_net_listen(host, port, &s->lfd, &s->port, err) != CDDP_OK) goto fail;
    fcntl(s->lfd, F_SETFL, fcntl(s->lfd, F_GETFL) | O_NONBLOCK);
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        cddp_error_set(err, CDDP_EIO, "store: pipe: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&s->thread, NULL, serve, s) != 0) {
        cddp_error_set(err, CDDP_EIO, "store: cannot start the server thread");
        goto fail;
    }
    return s;
fail:
    if (s->spare >= 0) close(s->spare);
    if (s->lfd >= 0) close(s->lfd);
    if (s->wake[0] >= 0) {
        close(s->wake[0]);
        close(s->wake[1]);
    }
    cddp_free(s->token);
    cddp_free(s);
    return NULL;
}

int cddp_store_server_port(const cddp_store_server *s) {
    return s->port;
}

void cddp_store_server_stop(cddp_store_server *s) {
    if (!s) return;
    ssize_t w;
    do w = write(s->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    for (int i = 0; i < s->nclients; i++) free_client(s->clients[i]);
    cddp__kv_free(&s->kv);
    cddp_free(s->clients);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    if (s->spare >= 0) close(s->spare);
    cddp_free(s->token);
    cddp_free(s);
}
