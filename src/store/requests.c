/* requests.c: what the rendezvous store does with its clients (the loop is server.c): each
 * request that does more than a line a function of its own, the replies and parked waits beside
 * them, and the clients dropped, strangers counted and reported. */
#include "cddp/net.h"
#include "store/server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cddp__store_report_strangers(cddp_store_server *s, double now) {
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
void cddp__store_stranger(cddp_store_server *s, const client *c, const char *why) {
    double now = cddp_now_s();
    snprintf(s->stranger_why, sizeof s->stranger_why, "%s: %s", c->peer, why);
    s->strangers++;
    if (now - s->strangers_said >= STRANGER_REPORT_S) cddp__store_report_strangers(s, now);
}

void cddp__store_drop(client *c, const char *why) {
    if (c->dead) return;
    if (c->authed)
        cddp_log(CDDP_LOG_WARN, "store", "dropping client %s: %s", c->peer, why);
    else
        cddp__store_stranger(c->srv, c, why);
    c->dead = true;
}

void cddp__store_reply(client *c, int type, const buf *payload) {
    cddp__store_frame(&c->out, type, payload);
    if (c->out.oom || c->out.len - c->out_off > MAX_OUT)
        cddp__store_drop(c, "it does not read its replies");
}

static void reply_error(client *c, const char *msg) {
    buf p = {0};
    cddp__store_put_field(&p, msg, strlen(msg));
    cddp__store_reply(c, REP_ERROR, &p);
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
        cddp__store_reply(c, REP_OK, NULL);
    } else if (deadline >= 0 && cddp_now_s() >= deadline) {
        buf p = {0};
        cddp__store_put_field(&p, missing.p, missing.len);
        cddp__store_reply(c, REP_TIMEOUT, &p);
        cddp_free(p.p);
    } else {
        done = false;
    }
    cddp_free(missing.p);
    return done;
}

void cddp__store_recheck_waits(cddp_store_server *s) {
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

/* What a request's handling came to. */
typedef enum { DONE, MALFORMED, OOM } outcome;

/* HELLO: the client's nonce; the store answers with its own and its proof of the token. */
static outcome req_hello(cddp_store_server *s, client *c, cursor *cur, buf *p) {
    const uint8_t *a;
    size_t al;
    if (c->challenged || !cddp__store_get_field(cur, &a, &al) || al != CDDP_NET_NONCE)
        return MALFORMED;
    uint8_t proof[CDDP_NET_PROOF];
    if (cddp_net_nonce(c->nonce, NULL) != CDDP_OK) {
        reply_error(c, "the store has no random bytes for its challenge");
        c->closing = true;
        return DONE;
    }
    memcpy(c->peer_nonce, a, CDDP_NET_NONCE);
    cddp_net_proof(s->token, "cddp store: server", c->peer_nonce, c->nonce, proof);
    cddp__store_put_field(p, c->nonce, CDDP_NET_NONCE);
    cddp__store_put_field(p, proof, CDDP_NET_PROOF);
    cddp__store_reply(c, REP_CHALLENGE, p);
    c->challenged = true;
    return DONE;
}

/* AUTH: the client's proof of the token, checked; a stranger is dropped, saying why. */
static outcome req_auth(cddp_store_server *s, client *c, cursor *cur, buf *p) {
    (void)p;
    const uint8_t *a;
    size_t al;
    if (!c->challenged || c->authed || !cddp__store_get_field(cur, &a, &al) || al != CDDP_NET_PROOF)
        return MALFORMED;
    uint8_t want[CDDP_NET_PROOF];
    cddp_net_proof(s->token, "cddp store: client", c->peer_nonce, c->nonce, want);
    if (cddp_net_proof_equal(a, want)) {
        c->authed = true;
        cddp__store_reply(c, REP_OK, NULL);
    } else {
        cddp__store_stranger(s, c, "wrong job token");
        reply_error(c, "wrong job token: this store belongs to another job (is "
                       "CDDP_STORE_TOKEN the one this job's launcher set?)");
        c->closing = true;
    }
    return DONE;
}

/* ADD: a counter (a key holding an integer, or none: 0) plus delta, without overflow. */
static outcome req_add(cddp_store_server *s, client *c, cursor *cur, buf *p) {
    const uint8_t *k;
    size_t kl;
    uint64_t delta;
    if (!get_key(cur, &k, &kl) || !cddp__store_get_u64(cur, &delta)) return MALFORMED;
    entry *e = cddp__kv_lookup(&s->kv, k, kl);
    int64_t v = 0;
    if (e && !counter_value(e, &v)) {
        reply_error(c, "add: the key holds a value that is not an integer");
        return DONE;
    }
    int64_t d = (int64_t)delta;
    if ((d > 0 && v > INT64_MAX - d) || (d < 0 && v < INT64_MIN - d)) {
        reply_error(c, "add: the counter would overflow a 64-bit integer");
        return DONE;
    }
    v += d;
    char text[32];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    if (!cddp__kv_put(&s->kv, k, kl, (const uint8_t *)text, (size_t)n)) return OOM;
    cddp__store_put_u64(p, (uint64_t)v);
    cddp__store_reply(c, REP_VALUE, p);
    cddp__store_recheck_waits(s);
    return DONE;
}

/* CAS: the value set when the key holds the expected one (none: expected empty). */
static outcome req_cas(cddp_store_server *s, client *c, cursor *cur, buf *p) {
    const uint8_t *k, *a, *b;
    size_t kl, al, bl;
    if (!get_key(cur, &k, &kl) || !cddp__store_get_field(cur, &a, &al) ||
        !cddp__store_get_field(cur, &b, &bl))
        return MALFORMED;
    entry *e = cddp__kv_lookup(&s->kv, k, kl);
    if ((!e && al == 0) || (e && e->len == al && memcmp(e->val, a, al) == 0)) {
        if (!cddp__kv_put(&s->kv, k, kl, b, bl)) return OOM;
        cddp__store_put_field(p, b, bl);
    } else if (!e) {
        cddp__store_put_field(p, a,
                              al); /* PyTorch's answer for a missing key: the expected value */
    } else {
        cddp__store_put_field(p, e->val, e->len);
    }
    cddp__store_reply(c, REP_VALUE, p);
    cddp__store_recheck_waits(s);
    return DONE;
}

/* WILL: a key the store sets (keep) or forgets when this client goes. */
static outcome req_will(cddp_store_server *s, client *c, cursor *cur, buf *p) {
    (void)s, (void)p;
    const uint8_t *k, *a;
    size_t kl, al;
    uint32_t keep;
    if (!cddp__store_get_field(cur, &k, &kl) || !cddp__store_get_field(cur, &a, &al) ||
        !cddp__store_get_u32(cur, &keep) || (keep && !kl))
        return MALFORMED;
    if (keep) {
        if (!cddp__kv_put(&c->wills, k, kl, a, al)) return OOM;
    } else if (kl) {
        entry *e = cddp__kv_lookup(&c->wills, k, kl);
        if (e) cddp__kv_remove(&c->wills, e);
    } else {
        cddp__kv_free(&c->wills);
        c->wills = (table){0};
    }
    cddp__store_reply(c, REP_OK, NULL);
    return DONE;
}

/* WAIT: answered when every key is there, or kept until then or the deadline. */
static outcome req_wait(cddp_store_server *s, client *c, cursor *cur, buf *p, const uint8_t *pl,
                        size_t len) {
    (void)p;
    const uint8_t *k;
    size_t kl;
    uint64_t ms;
    uint32_t n;
    if (!cddp__store_get_u64(cur, &ms) || !cddp__store_get_u32(cur, &n)) return MALFORMED;
    for (uint32_t i = 0; i < n; i++)
        if (!get_key(cur, &k, &kl)) return MALFORMED;
    double deadline = ms == UINT64_MAX ? -1 : cddp_now_s() + (double)ms / 1000.0;
    if (!settle_wait(s, c, pl, len, deadline)) {
        c->wait_payload = cddp_malloc(len);
        if (!c->wait_payload) return OOM;
        memcpy(c->wait_payload, pl, len);
        c->wait_len = len;
        c->wait_deadline = deadline;
        c->waiting = true;
    }
    return DONE;
}

/* Handles one complete request. Malformed requests drop the client. */
void cddp__store_handle(cddp_store_server *s, client *c, int type, const uint8_t *pl, size_t len) {
    cursor cur = {pl, pl + len};
    const uint8_t *k, *a;
    size_t kl, al;
    buf p = {0};
    if (!c->authed && type != REQ_HELLO && type != REQ_AUTH) {
        cddp__store_drop(c, "a request came before the job token");
        return;
    }
    outcome o = DONE;
    switch (type) {
    case REQ_HELLO:
        o = req_hello(s, c, &cur, &p);
        break;
    case REQ_AUTH:
        o = req_auth(s, c, &cur, &p);
        break;
    case REQ_SET:
        if (!get_key(&cur, &k, &kl) || !cddp__store_get_field(&cur, &a, &al)) goto malformed;
        if (!cddp__kv_put(&s->kv, k, kl, a, al)) goto oom;
        cddp__store_reply(c, REP_OK, NULL);
        cddp__store_recheck_waits(s);
        break;
    case REQ_GET: {
        if (!get_key(&cur, &k, &kl)) goto malformed;
        entry *e = cddp__kv_lookup(&s->kv, k, kl);
        if (e) {
            cddp__store_put_field(&p, e->val, e->len);
            cddp__store_reply(c, REP_VALUE, &p);
        } else {
            cddp__store_reply(c, REP_NOTFOUND, NULL);
        }
        break;
    }
    case REQ_ADD:
        o = req_add(s, c, &cur, &p);
        break;
    case REQ_CAS:
        o = req_cas(s, c, &cur, &p);
        break;
    case REQ_DELETE: {
        if (!get_key(&cur, &k, &kl)) goto malformed;
        entry *e = cddp__kv_lookup(&s->kv, k, kl);
        uint8_t existed = e != NULL;
        if (e) cddp__kv_remove(&s->kv, e);
        cddp__store_put_field(&p, &existed, 1);
        cddp__store_reply(c, REP_VALUE, &p);
        break;
    }
    case REQ_WILL:
        o = req_will(s, c, &cur, &p);
        break;
    case REQ_NUM_KEYS:
        cddp__store_put_u64(&p, s->kv.live);
        cddp__store_reply(c, REP_VALUE, &p);
        break;
    case REQ_WAIT:
        o = req_wait(s, c, &cur, &p, pl, len);
        break;
    default:
        cddp__store_drop(c, "unknown request type");
        break;
    }
    if (o == MALFORMED) goto malformed;
    if (o == OOM) goto oom;
    cddp_free(p.p);
    return;
malformed:
    cddp__store_drop(c, "malformed request");
    return;
oom:
    cddp_free(p.p);
    reply_error(c, "the store is out of memory");
}
