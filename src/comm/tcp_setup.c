/* tcp_setup.c: the TCP transport's mesh (design in tcp.c): every rank listens, connects to each
 * lower rank and accepts each higher one, and both ends of every connection prove the job token.
 */
#include "comm/tcp.h"
#include "cddp/net.h"

#include "cddp/store.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct hello {
    uint64_t magic;
    int32_t rank, channel, pid, pad;
    uint8_t nonce[CDDP_NET_NONCE];
} hello;

/* The accepting rank's answer: its hello, and its proof of the token. */
typedef struct answer {
    hello h;
    uint8_t proof[CDDP_NET_PROOF];
} answer;

/* The proof of the token that rank `from` gives on its channel to rank `to` (from < to: the
 * accepting side), over the connecting side's nonce, then the accepting side's. */
static void mesh_proof(const cddp_comm *c, int from, int to, int ch, const uint8_t *nonce_connect,
                       const uint8_t *nonce_accept, uint8_t proof[CDDP_NET_PROOF]) {
    char label[96];
    snprintf(label, sizeof label, "cddp mesh: rank %d to rank %d, channel %d, %s", from, to, ch,
             from < to ? "accepting" : "connecting");
    cddp_net_proof(c->token ? c->token : "", label, nonce_connect, nonce_accept, proof);
}

/* ---- setup ------------------------------------------------------------------------------- */

/* Where this rank listens: CDDP_LOCAL_ADDR (an address, a host name or an interface's name),
 * else CDDP_SOCKET_IFNAME's address, else the address on the route to the master (the store's
 * connection: what srun's ranks on other hosts reach; cddp_net_peer_addr). */
static int local_address(const cddp_comm *c, cddp_store *st, char *out, size_t n, char *from,
                         size_t fn, cddp_error *err) {
    const char *knob = cddp_knob_str(CDDP_KNOB_LOCAL_ADDR);
    const char *ifname = cddp_knob_str(CDDP_KNOB_SOCKET_IFNAME);
    bool given = *knob && strcmp(knob, "auto") != 0;
    cddp_error e = {0};
    int rc = CDDP_OK;
    if (given)
        snprintf(from, fn, "CDDP_LOCAL_ADDR=%s", knob);
    else if (*ifname)
        snprintf(from, fn, "CDDP_SOCKET_IFNAME=%s", ifname);
    else
        snprintf(from, fn, "route");
    for (char *p = from; *p; p++) /* one word in the posted line */
        if (*p == ' ') *p = '_';
    if (given) {
        rc = cddp_net_local_host(knob, out, n, NULL, &e);
    } else if (*ifname) {
        rc = cddp_net_interface_addr(ifname, out, n, &e);
    } else {
        char dev[64];
        const char *how;
        if (cddp_net_peer_addr(cddp_store_fd(st), c->local_world < c->world, out, n, dev,
                               sizeof dev, &how) != CDDP_OK)
            snprintf(out, n, "127.0.0.1");
        else if (c->local_rank == 0)
            cddp_log(CDDP_LOG_DEBUG, "comm", "tcp: listening on %s%s%s (%s)", out,
                     *dev ? ", interface " : "", dev, how);
    }
    if (rc != CDDP_OK)
        return cddp_error_set(err, rc, "%s=%s: %s",
                              given ? "CDDP_LOCAL_ADDR" : "CDDP_SOCKET_IFNAME",
                              given ? knob : ifname, e.msg);
    return CDDP_OK;
}

/* Rank `listener` listens at addr, a loopback address (chosen by `from`: the knob and its value,
 * or "route", the route to the master), which rank `other`, on another host or network
 * namespace, cannot reach: said at once, by both, rather than at the deadline. */
static int loopback_unreachable(int listener, const char *addr, const char *from, int other,
                                cddp_error *err) {
    return cddp_error_set(
        err, CDDP_EINVAL,
        "rank %d listens at %s, a loopback address (from %s), but rank %d is on another host (or "
        "network namespace) and cannot reach it there. Give every rank an address the other "
        "hosts reach: cddprun --local_addr (or CDDP_SOCKET_IFNAME) naming an interface other "
        "than lo, or CDDP_LOCAL_ADDR",
        listener, addr,
        !strcmp(from, "route") ? "the route to the master: is MASTER_ADDR loopback?"
        : *from                ? from
                               : "?",
        other);
}

static void big_buffers(int fd) {
    int size = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
}

/* Connects to rank r (below this one), whose post holds its address; mine: this rank's
 * cddp_net_loopback_id. */
static int connect_lower(cddp_comm *c, cddp_store *st, int r, const char *mine, double deadline,
                         cddp_error *err) {
    tcp *t = T(c);
    void *v = NULL;
    size_t len;
    char key[64], host[256];
    int port = 0;
    snprintf(key, sizeof key, "comm/tcp/%d", r);
    CDDP_TRY(cddp_store_get(st, key, -1, &v, &len, err));
    int rc = CDDP_OK;
    char reach[128] = "", from[64] = "";
    if (sscanf(v, "%255s %d %127s %63s", host, &port, reach, from) < 2)
        rc = cddp_error_set(err, CDDP_EIO, "rank %d posted a bad address '%s'", r, (char *)v);
    /* A loopback address reaches rank r only from its own machine and network namespace: from
     * another host it would reach this one's loopback. */
    if (rc == CDDP_OK && cddp_net_loopback_apart(reach, mine) && cddp_net_is_loopback(host))
        rc = loopback_unreachable(r, host, from, c->rank, err);
    for (int ch = CH_DATA; ch <= CH_CONTROL && rc == CDDP_OK; ch++) {
        int *fd = ch == CH_DATA ? &t->data[r] : &t->control[r];
        if ((rc = cddp_net_connect(host, port, NULL, deadline, fd, err)) != CDDP_OK) break;
        hello h = {TCP_MAGIC, c->rank, ch, (int)getpid(), 0, {0}};
        answer back = {0};
        uint8_t want[CDDP_NET_PROOF];
        rc = cddp_net_nonce(h.nonce, err);
        if (rc == CDDP_OK) rc = cddp_net_write_all(*fd, &h, sizeof h, deadline, err);
        /* The peer answers with its own hello (its pid, its nonce) and its proof of the token. */
        if (rc == CDDP_OK) rc = cddp_net_read_all(*fd, &back, sizeof back, deadline, err);
        if (rc == CDDP_OK && (back.h.magic != TCP_MAGIC || back.h.rank != r))
            rc = cddp_error_set(err, CDDP_EIO, "%s answered as something other than rank %d",
                                CDDP_NET_ENDPOINT(host, port), r);
        if (rc == CDDP_OK) {
            mesh_proof(c, r, c->rank, ch, h.nonce, back.h.nonce, want);
            if (!cddp_net_proof_equal(back.proof, want))
                rc = cddp_error_set(err, CDDP_ESTATE,
                                    "%s answered as rank %d but does not know this job's "
                                    "token (another job's rank at the address rank %d posted?)",
                                    CDDP_NET_ENDPOINT(host, port), r, r);
        }
        if (rc == CDDP_OK) {
            mesh_proof(c, c->rank, r, ch, h.nonce, back.h.nonce, want);
            rc = cddp_net_write_all(*fd, want, sizeof want, deadline, err);
        }
        t->pid[r] = back.h.pid;
    }
    cddp_free(v);
    return rc;
}

/* A connection being accepted: it owes its hello, then (once answered) its proof. */
typedef struct arrival {
    int fd;
    double until; /* it is closed if it has not proved the token by then */
    size_t got;   /* bytes of the hello, then of the proof, read so far */
    bool answered;
    hello h;
    uint8_t proof[CDDP_NET_PROOF], expected[CDDP_NET_PROOF];
} arrival;

#define MAX_ARRIVALS 64  /* connections in their handshake at once; one more drops the oldest */
#define ARRIVAL_S    5.0 /* to finish the handshake */

/* Reads what arrival a has sent so far; answers its hello. Returns 1 when it proved the token, -1
 * when it must go (end of file, a wrong hello or proof, a slot already taken), 0 for more. */
static int progress(cddp_comm *c, arrival *a) {
    tcp *t = T(c);
    int me = c->rank;
    uint8_t *into = a->answered ? a->proof : (uint8_t *)&a->h;
    size_t want = a->answered ? sizeof a->proof : sizeof a->h;
    ssize_t n = recv(a->fd, into + a->got, want - a->got, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
    if (n > 0) a->got += (size_t)n;
    if (a->got < want) return 0;
    const hello *h = &a->h;
    int *slot = h->channel == CH_DATA ? &t->data[h->rank] : &t->control[h->rank];
    if (!a->answered) {
        if (h->magic != TCP_MAGIC || h->rank <= me || h->rank >= c->world ||
            (h->channel != CH_DATA && h->channel != CH_CONTROL) || *slot >= 0)
            return -1;
        answer back = {{TCP_MAGIC, me, h->channel, (int)getpid(), 0, {0}}, {0}};
        if (cddp_net_nonce(back.h.nonce, NULL) != CDDP_OK) return -1;
        mesh_proof(c, me, h->rank, h->channel, h->nonce, back.h.nonce, back.proof);
        mesh_proof(c, h->rank, me, h->channel, h->nonce, back.h.nonce, a->expected);
        /* A hundred bytes into a new connection's empty buffer: all of it goes at once. */
        if (send(a->fd, &back, sizeof back, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof back)
            return -1;
        a->answered = true;
        a->got = 0;
        return 0;
    }
    if (!cddp_net_proof_equal(a->proof, a->expected) || *slot >= 0) {
        cddp_log(CDDP_LOG_WARN, "comm",
                 "rank %d: turned away a connection that claimed to be rank %d but did not prove "
                 "the job token",
                 me, h->rank);
        return -1;
    }
    *slot = a->fd;
    t->pid[h->rank] = h->pid;
    return 1;
}

/* Accepts the two connections of every higher rank. Handshakes run side by side, each with
 * ARRIVAL_S to finish, so strangers that connect and say nothing (or half a hello) delay no one;
 * they are turned away. */
static int accept_higher(cddp_comm *c, int listen_fd, const char *addr, int port, double deadline,
                         cddp_error *err) {
    int me = c->rank, want = 2 * (c->world - 1 - me), got = 0, n = 0;
    arrival *as = cddp_calloc(MAX_ARRIVALS, sizeof *as);
    struct pollfd *pf = cddp_calloc(MAX_ARRIVALS + 1, sizeof *pf);
    int rc = as && pf ? CDDP_OK : cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    cddp_net_nonblocking(listen_fd);
    while (rc == CDDP_OK && got < want) {
        double now, wake = deadline; /* the deadline, or the first arrival's, if sooner */
        for (int i = 0; i < n; i++)
            if (wake < 0 || as[i].until < wake) wake = as[i].until;
        pf[0] = (struct pollfd){listen_fd, POLLIN, 0};
        for (int i = 0; i < n; i++) pf[i + 1] = (struct pollfd){as[i].fd, POLLIN, 0};
        if (poll(pf, (nfds_t)n + 1, cddp_net_poll_ms(wake)) < 0 && errno != EINTR) {
            rc = cddp_error_set(err, CDDP_EIO, "poll: %s", strerror(errno));
            break;
        }
        now = cddp_now_s();
        if (deadline >= 0 && now > deadline) {
            rc = cddp_error_set(err, CDDP_ETIMEDOUT,
                                "rank %d: only %d of the %d connections from higher ranks reached "
                                "%s in time (a firewall between the hosts? give an address "
                                "the others reach: cddprun --local_addr, or CDDP_SOCKET_IFNAME or "
                                "CDDP_LOCAL_ADDR for ranks started otherwise)",
                                me, got, want, CDDP_NET_ENDPOINT(addr, port));
            break;
        }
        /* Progress every connection that spoke; drop those that failed or ran out of time. */
        int kept = 0;
        for (int i = 0; i < n; i++) {
            int r = pf[i + 1].revents ? progress(c, &as[i]) : 0;
            if (r == 0 && now > as[i].until) r = -1;
            if (r < 0) close(as[i].fd);
            if (r > 0) got++;
            if (r == 0) as[kept++] = as[i];
        }
        n = kept;
        if (!(pf[0].revents & POLLIN)) continue;
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                usleep(10000); /* no descriptor for now: do not spin on the listener */
            continue;
        }
        if (n == MAX_ARRIVALS) { /* the oldest that said nothing yet makes room (a rank speaks
                                    at once), else the oldest */
            int old = 0;
            while (old < n - 1 && as[old].got + as[old].answered) old++;
            if (as[old].got + as[old].answered) old = 0;
            close(as[old].fd);
            memmove(as + old, as + old + 1, (size_t)(n - old - 1) * sizeof *as);
            n--;
        }
        as[n++] = (arrival){.fd = fd, .until = now + ARRIVAL_S};
    }
    for (int i = 0; i < n; i++) close(as[i].fd);
    cddp_free(as);
    cddp_free(pf);
    return rc;
}

int cddp__tcp_setup(cddp_comm *c, cddp_store *st, double deadline, cddp_error *err) {
    int W = c->world, me = c->rank, listen_fd = -1, port = 0;
    tcp *t = c->priv = cddp_calloc(1, sizeof *t);
    if (!t || !(t->data = cddp_malloc(sizeof(int) * (size_t)W)) ||
        !(t->control = cddp_malloc(sizeof(int) * (size_t)W)) ||
        !(t->pid = cddp_calloc((size_t)W, sizeof(int))) ||
        !(t->state = cddp_calloc((size_t)W, sizeof(int))) ||
        !(t->notes = cddp_calloc((size_t)W, sizeof(notice))) ||
        !(t->noted = cddp_calloc((size_t)W, sizeof(size_t))) ||
        !(t->pfd = cddp_calloc((size_t)W * 3, sizeof(struct pollfd))) ||
        !(t->xfers = cddp_calloc((size_t)W * 2, sizeof(xfer)))) {
        if (t) cddp_free(t->control), t->control = NULL; /* nothing for close to close */
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    for (int r = 0; r < W; r++) t->data[r] = t->control[r] = -1;
    t->pid[me] = (int)getpid();
    t->small = (size_t)CDDP_MAX(cddp_knob_int(CDDP_KNOB_TCP_SMALL_KB), 0) << 10;
    char addr[256], key[64], val[512], from[64], reach[128];
    CDDP_TRY(local_address(c, st, addr, sizeof addr, from, sizeof from, err));
    CDDP_TRY(cddp_net_listen(addr, 0, &listen_fd, &port, err));
    cddp_net_loopback_id(reach, sizeof reach);
    snprintf(key, sizeof key, "comm/tcp/%d", me);
    snprintf(val, sizeof val, "%s %d %s %s", addr, port, reach, from); /* what connects needs */
    int rc = cddp_store_set_str(st, key, val, err);
    /* Listening on loopback in a group across hosts: the higher ranks of other hosts would
     * connect to their own loopback. They say so (connect_lower); so does this rank, which would
     * otherwise wait for them until the deadline. */
    if (rc == CDDP_OK && c->local_world < W && cddp_net_is_loopback(addr))
        for (int r = me + 1; r < W && rc == CDDP_OK; r++) {
            void *v = NULL;
            size_t len;
            char theirs[128] = "";
            snprintf(key, sizeof key, "comm/tcp/%d", r);
            rc = cddp_store_get(st, key, -1, &v, &len, err);
            if (rc == CDDP_OK && sscanf(v, "%*s %*d %127s", theirs) == 1 &&
                cddp_net_loopback_apart(theirs, reach))
                rc = loopback_unreachable(me, addr, from, r, err);
            cddp_free(v);
        }
    for (int r = 0; r < me && rc == CDDP_OK; r++)
        rc = connect_lower(c, st, r, reach, deadline, err);
    if (rc == CDDP_OK) rc = accept_higher(c, listen_fd, addr, port, deadline, err);
    close(listen_fd);
    if (rc != CDDP_OK) return rc;
    for (int r = 0; r < W; r++)
        if (r != me) {
            big_buffers(t->data[r]);
            cddp_net_nonblocking(t->data[r]);
            cddp_net_nonblocking(t->control[r]);
        }
    return CDDP_OK;
}
