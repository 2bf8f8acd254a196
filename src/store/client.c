/* client.c: the rendezvous store's client (contract in cddp/store.h, wire in store/internal.h).
 *
 * One request at a time on one connection: a request frame, then its reply, with the caller's
 * deadline (a wait's reply arrives when the keys do or the wait times out on the server).
 */
#include "cddp/net.h"
#include "cddp/store.h"
#include "store/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct cddp_store {
    int fd;
    double timeout;
    char addr[300];
    cddp_error broken; /* the first connection failure, latched */
    bool lost;         /* it was the peer closing or resetting the connection, not a timeout */
    char lost_why[sizeof(cddp_error){0}.msg]; /* how, in the network's words */
};

typedef struct reply_msg {
    int type;
    uint8_t *p; /* payload, NUL-terminated; the caller frees it */
    size_t len;
} reply_msg;

/* Sends a request and reads its reply. wait_s extends the reply deadline for waits. A transport
 * failure latches in the client; an ERROR reply becomes CDDP_ESTATE with the server's words. */
static int request(cddp_store *s, int type, const buf *payload, double wait_s, reply_msg *r,
                   cddp_error *err) {
    r->p = NULL;
    if (s->broken.code) {
        if (err) *err = s->broken;
        return s->broken.code;
    }
    buf out = {0};
    cddp__store_frame(&out, type, payload);
    if (out.oom || (payload && payload->oom)) {
        cddp_free(out.p);
        return cddp_error_set(err, CDDP_ENOMEM, "store: out of memory for a request");
    }
    /* A live server answers at once (a wait when its keys come or its time is up): a reply
     * later than CDDP_STORE_REPLY_S means the store's host is gone or cut off, not slow. */
    double reply =
        CDDP_MIN(s->timeout, (double)CDDP_MAX(cddp_knob_int(CDDP_KNOB_STORE_REPLY_S), 1));
    double deadline = cddp_now_s() + reply + (wait_s > 0 ? wait_s : 0);
    uint8_t h[HEADER];
    cddp_error e = {0};
    int rc = cddp_net_write_all(s->fd, out.p, out.len, deadline, &e);
    if (!rc) rc = cddp_net_read_all(s->fd, h, HEADER, deadline, &e);
    bool closed = rc == CDDP_EIO; /* the socket's own failure: closed or reset by the peer */
    cddp_free(out.p);
    uint32_t len = 0;
    if (!rc && (cddp__store_rd_u32(h) != MAGIC ||
                (len = cddp__store_rd_u32(h + 8)) > CDDP_STORE_MAX_FRAME))
        rc = cddp_error_set(&e, CDDP_EIO, "the reply is not a cddp store frame");
    if (!rc && !(r->p = cddp_malloc(len + 1)))
        rc = cddp_error_set(&e, CDDP_ENOMEM, "out of memory for a reply");
    if (!rc) closed = (rc = cddp_net_read_all(s->fd, r->p, len, deadline, &e)) == CDDP_EIO;
    if (rc) {
        /* A reply that never came is the connection's failure, not a wait's timeout
         * (CDDP_ETIMEDOUT, which says the keys are not there yet): CDDP_EIO. */
        s->lost = closed;
        snprintf(s->lost_why, sizeof s->lost_why, "%s", e.msg);
        if (rc == CDDP_ETIMEDOUT)
            cddp_error_set(&s->broken, CDDP_EIO,
                           "store at %s: no reply within %.0f s (CDDP_STORE_REPLY_S): its host is "
                           "gone or the network to it is cut",
                           s->addr, reply);
        else
            cddp_error_set(&s->broken, rc, "store at %s: %s", s->addr, e.msg);
        rc = s->broken.code;
        if (err) *err = s->broken;
        cddp_free(r->p);
        r->p = NULL;
        return rc;
    }
    r->p[len] = 0;
    r->type = h[6] | h[7] << 8;
    r->len = len;
    if (r->type == REP_ERROR) {
        cursor c = {r->p, r->p + len};
        const uint8_t *m = (const uint8_t *)"";
        size_t ml = 0;
        cddp__store_get_field(&c, &m, &ml);
        rc = cddp_error_set(err, CDDP_ESTATE, "store at %s: %.*s", s->addr, (int)ml, m);
        cddp_free(r->p);
        r->p = NULL;
    }
    return rc;
}

/* The single field of a VALUE reply, copied into a new NUL-terminated buffer; frees r. */
static int take_value(reply_msg *r, void **value, size_t *len, cddp_error *err) {
    cursor c = {r->p, r->p + r->len};
    const uint8_t *v;
    size_t vl;
    int rc = CDDP_OK;
    if (r->type != REP_VALUE || !cddp__store_get_field(&c, &v, &vl)) {
        rc = cddp_error_set(err, CDDP_EIO, "store: malformed reply");
    } else if (value) {
        *value = cddp_malloc(vl + 1);
        if (!*value) {
            rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        } else {
            memcpy(*value, v, vl);
            ((char *)*value)[vl] = '\0';
            if (len) *len = vl;
        }
    }
    cddp_free(r->p);
    return rc;
}

/* A request whose reply carries nothing the caller needs. */
static int simple(cddp_store *s, int type, buf *p, cddp_error *err) {
    reply_msg r;
    int rc = request(s, type, p, -1, &r, err);
    cddp_free(p->p);
    cddp_free(r.p);
    return rc;
}

static int will(cddp_store *s, const char *key, const void *value, size_t len, uint32_t keep,
                cddp_error *err) {
    buf p = {0};
    cddp__store_put_field(&p, key ? key : "", key ? strlen(key) : 0);
    cddp__store_put_field(&p, value, len);
    cddp__store_put_u32(&p, keep);
    return simple(s, REQ_WILL, &p, err);
}

int cddp_store_set_will(cddp_store *s, const char *key, const void *value, size_t len,
                        cddp_error *err) {
    if (!key || !*key) return cddp_error_set(err, CDDP_EINVAL, "store: a will needs a key");
    return will(s, key, value, len, 1, err);
}

int cddp_store_clear_will(cddp_store *s, const char *key, cddp_error *err) {
    return will(s, key, NULL, 0, 0, err);
}

/* Proves the job token on a new connection. *busy: the server had too many connections that had
 * not yet, closed this one and asks to connect again. Afterwards s->lost says whether the
 * connection was closed or reset under the handshake. */
static int hello(cddp_store *s, const char *token, bool *busy, cddp_error *err) {
    uint8_t mine[CDDP_NET_NONCE], want[CDDP_NET_PROOF];
    CDDP_TRY(cddp_net_nonce(mine, err));
    buf p = {0};
    cddp__store_put_field(&p, mine, sizeof mine);
    reply_msg r;
    int rc = request(s, REQ_HELLO, &p, -1, &r, err);
    cddp_free(p.p);
    p = (buf){0};
    *busy = rc == CDDP_OK && r.type == REP_BUSY;
    if (rc == CDDP_OK && !*busy) {
        /* The challenge: the server's nonce and its proof that it knows the token too. */
        cursor c = {r.p, r.p + r.len};
        const uint8_t *theirs = NULL, *proof = NULL;
        size_t tl = 0, pl = 0;
        if (r.type != REP_CHALLENGE || !cddp__store_get_field(&c, &theirs, &tl) ||
            tl != CDDP_NET_NONCE || !cddp__store_get_field(&c, &proof, &pl) ||
            pl != CDDP_NET_PROOF) {
            rc = cddp_error_set(err, CDDP_EIO,
                                "store at %s: the answer to HELLO is not a "
                                "challenge (another program on this port?)",
                                s->addr);
        } else {
            cddp_net_proof(token, "cddp store: server", mine, theirs, want);
            if (!cddp_net_proof_equal(proof, want))
                rc = cddp_error_set(err, CDDP_ESTATE,
                                    "store at %s: wrong job token: this store belongs to another "
                                    "job (is CDDP_STORE_TOKEN the one this job's launcher set?)",
                                    s->addr);
            cddp_net_proof(token, "cddp store: client", mine, theirs, want);
            cddp__store_put_field(&p, want, sizeof want);
        }
    }
    cddp_free(r.p);
    if (rc == CDDP_OK && !*busy) {
        rc = request(s, REQ_AUTH, &p, -1, &r, err);
        *busy = rc == CDDP_OK && r.type == REP_BUSY;
        cddp_free(r.p);
    }
    cddp_free(p.p);
    if (*busy) rc = cddp_error_set(err, CDDP_ESTATE, "store at %s: busy", s->addr);
    return rc;
}

/* How long a client goes on connecting again to a port whose listener closes or resets the
 * connection before the handshake ends: long enough for a store being stopped (another job's, on a
 * port both were given) to let go of the port and this job's own to take it, short enough that a
 * program on the port that is not a store is named at once rather than at the rendezvous timeout.
 */
#define LOST_RETRY_S 5.0

cddp_store *cddp_store_connect(const cddp_store_options *o, cddp_error *err) {
    cddp_store *s = cddp_calloc(1, sizeof *s);
    if (!s) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    s->timeout = o->timeout_s > 0 ? o->timeout_s : (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
    cddp_net_endpoint(s->addr, sizeof s->addr, o->host, o->port);
    double start = cddp_now_s(), deadline = start + s->timeout, pause = 0.01, first_lost = -1;
    int lost = 0;
    for (;;) {
        if (cddp_net_connect(o->host, o->port, o->local_addr, deadline, &s->fd, err)) {
            cddp_free(s);
            return NULL;
        }
        bool busy = false;
        s->lost = false;
        if (hello(s, o->token ? o->token : "", &busy, err) == CDDP_OK) return s;
        close(s->fd);
        s->fd = -1;
        double now = cddp_now_s();
        /* Closed under the handshake: the store was stopping (its job ending), so connect again,
         * for a while; a store of this job's may take the port next. */
        bool again = busy || (s->lost && (first_lost < 0 || now - first_lost < LOST_RETRY_S));
        if (s->lost && first_lost < 0) first_lost = now;
        lost += s->lost;
        if (again && now + pause >= deadline) {
            if (busy)
                cddp_error_set(err, CDDP_ETIMEDOUT,
                               "store at %s: turned away for %.0f s because too many connections "
                               "without the job token were open (is something flooding the "
                               "port? CDDP_STORE_MAX_PENDING raises the limit)",
                               s->addr, now - start);
            again = false;
        }
        if (!again) {
            if (s->lost && err)
                cddp_error_set(err, CDDP_EIO,
                               "store at %s: the connection was closed before the store answered, "
                               "%d times in %.1f s (%s): a store that was stopping (another job's, "
                               "given the same port?) or a program that is not a cddp store is on "
                               "this port; check --master_addr and --master_port",
                               s->addr, lost, now - start, s->lost_why);
            break;
        }
        s->broken = (cddp_error){0};
        usleep((useconds_t)(pause * 1e6));
        pause = CDDP_MIN(2 * pause, 0.5);
    }
    cddp_free(s);
    return NULL;
}

void cddp_store_close(cddp_store *s) {
    if (!s) return;
    close(s->fd);
    cddp_free(s);
}

int cddp_store_set(cddp_store *s, const char *key, const void *value, size_t len, cddp_error *err) {
    buf p = {0};
    cddp__store_put_field(&p, key, strlen(key));
    cddp__store_put_field(&p, value, len);
    return simple(s, REQ_SET, &p, err);
}

int cddp_store_set_str(cddp_store *s, const char *key, const char *value, cddp_error *err) {
    return cddp_store_set(s, key, value, strlen(value), err);
}

int cddp_store_wait(cddp_store *s, const char *const *keys, int n, double timeout_s,
                    cddp_error *err) {
    if (timeout_s < 0) timeout_s = s->timeout;
    buf p = {0};
    cddp__store_put_u64(&p, (uint64_t)(timeout_s * 1000.0));
    cddp__store_put_u32(&p, (uint32_t)n);
    for (int i = 0; i < n; i++) cddp__store_put_field(&p, keys[i], strlen(keys[i]));
    reply_msg r;
    int rc = request(s, REQ_WAIT, &p, timeout_s, &r, err);
    cddp_free(p.p);
    if (rc == CDDP_OK && r.type == REP_TIMEOUT) {
        cursor c = {r.p, r.p + r.len};
        const uint8_t *m = (const uint8_t *)"";
        size_t ml = 0;
        cddp__store_get_field(&c, &m, &ml);
        rc = cddp_error_set(err, CDDP_ETIMEDOUT,
                            "store at %s: timed out after %.3g s waiting for keys: %.*s", s->addr,
                            timeout_s, (int)ml, m);
    }
    cddp_free(r.p);
    return rc;
}

int cddp_store_get(cddp_store *s, const char *key, double timeout_s, void **value, size_t *len,
                   cddp_error *err) {
    CDDP_TRY(cddp_store_wait(s, &key, 1, timeout_s, err));
    buf p = {0};
    cddp__store_put_field(&p, key, strlen(key));
    reply_msg r;
    int rc = request(s, REQ_GET, &p, -1, &r, err);
    cddp_free(p.p);
    if (rc) return rc;
    if (r.type == REP_NOTFOUND) { /* deleted between the wait and the get */
        cddp_free(r.p);
        return cddp_error_set(err, CDDP_ENOENT, "store at %s: key '%s' was deleted", s->addr, key);
    }
    return take_value(&r, value, len, err);
}

int cddp_store_add(cddp_store *s, const char *key, int64_t delta, int64_t *result,
                   cddp_error *err) {
    buf p = {0};
    cddp__store_put_field(&p, key, strlen(key));
    cddp__store_put_u64(&p, (uint64_t)delta);
    reply_msg r;
    int rc = request(s, REQ_ADD, &p, -1, &r, err);
    cddp_free(p.p);
    if (!rc && r.len == 8 && result) *result = (int64_t)cddp__store_rd_u64(r.p);
    cddp_free(r.p);
    return rc;
}

int cddp_store_compare_set(cddp_store *s, const char *key, const void *expected, size_t elen,
                           const void *desired, size_t dlen, void **current, size_t *clen,
                           cddp_error *err) {
    buf p = {0};
    cddp__store_put_field(&p, key, strlen(key));
    cddp__store_put_field(&p, expected, elen);
    cddp__store_put_field(&p, desired, dlen);
    reply_msg r;
    int rc = request(s, REQ_CAS, &p, -1, &r, err);
    cddp_free(p.p);
    return rc ? rc : take_value(&r, current, clen, err);
}

int cddp_store_delete(cddp_store *s, const char *key, bool *deleted, cddp_error *err) {
    buf p = {0};
    cddp__store_put_field(&p, key, strlen(key));
    reply_msg r;
    int rc = request(s, REQ_DELETE, &p, -1, &r, err);
    cddp_free(p.p);
    if (!rc && deleted) *deleted = r.len == 5 && r.p[4] == 1;
    cddp_free(r.p);
    return rc;
}

int cddp_store_num_keys(cddp_store *s, int64_t *count, cddp_error *err) {
    reply_msg r;
    int rc = request(s, REQ_NUM_KEYS, NULL, -1, &r, err);
    if (!rc && r.len == 8) *count = (int64_t)cddp__store_rd_u64(r.p);
    cddp_free(r.p);
    return rc;
}

int cddp_store_fd(const cddp_store *s) {
    return s ? s->fd : -1;
}
