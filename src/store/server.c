/* server.c: the rendezvous store's server loop (contract in cddp/store.h, wire in
 * store/internal.h, the requests in requests.c, the state both share in store/server.h).
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
#include "store/server.h"

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

#define ACCEPT_BATCH                                                                               \
    32 /* connections accepted per turn of the loop, so clients are read between                   \
        */

/* Handles every complete frame in c's input buffer. */
static void process_input(cddp_store_server *s, client *c) {
    size_t off = 0;
    while (!c->dead && !c->closing && !c->waiting && c->in.len - off >= HEADER) {
        const uint8_t *h = c->in.p + off;
        if (cddp__store_rd_u32(h) != MAGIC || h[4] != VERSION || h[5] != 0) {
            cddp__store_drop(c, "not a cddp store frame (bad magic or version)");
            return;
        }
        uint32_t len = cddp__store_rd_u32(h + 8);
        uint32_t limit = c->authed ? CDDP_STORE_MAX_FRAME : PREAUTH_MAX;
        if (len > limit) {
            char why[128];
            snprintf(why, sizeof why, "oversized frame (%u bytes, the limit is %u%s)", len, limit,
                     c->authed ? "" : " before the job token");
            cddp__store_drop(c, why);
            return;
        }
        if (c->in.len - off < HEADER + (size_t)len) break;
        cddp__store_handle(s, c, h[6] | h[7] << 8, h + HEADER, len);
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
                cddp__store_drop(c, "out of memory for its request");
                return;
            }
            if (c->in.len > HEADER + (size_t)CDDP_STORE_MAX_FRAME) break; /* process, then drop */
            continue;
        }
        if (r == 0) { /* the peer is gone; a partial frame left behind was cut short */
            process_input(s, c);
            if (c->in.len && !c->dead)
                cddp__store_drop(c, "it closed the connection in the middle of a frame");
            c->dead = true;
            return;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) cddp__store_drop(c, strerror(errno));
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
    if (wills) cddp__store_recheck_waits(s);
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
    cddp__store_reply(c, REP_BUSY, NULL);
    flush_client(c);
    cddp__store_drop(c, why);
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
        cddp__store_stranger(s, &who,
                             "no file descriptors left, and every connection has the job token");
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
        cddp__store_recheck_waits(s); /* deadlines that passed */
        now = cddp_now_s();
        for (int i = 0; i < s->nclients; i++) {
            client *c = s->clients[i];
            if (!c->authed && now >= c->since + s->auth_timeout) {
                char why[96];
                snprintf(why, sizeof why, "it did not prove the job token within %.0f s",
                         s->auth_timeout);
                cddp__store_drop(c, why);
            }
        }
        if (s->strangers && now - s->strangers_said >= STRANGER_REPORT_S)
            cddp__store_report_strangers(s, now);
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
