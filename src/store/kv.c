/* kv.c: the store's key space, an open-addressing hash table (contract in store/internal.h). */
#include "store/internal.h"

#include <string.h>

static char tombstone;
#define TOMBSTONE (&tombstone)

static uint64_t hash(const char *k, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    return h;
}

static bool live(const entry *e) {
    return e->key && e->key != TOMBSTONE;
}

bool cddp__kv_live(const entry *e) {
    return live(e);
}

/* The slot holding key, or the slot where it would go. */
static entry *find(table *t, const char *key, size_t klen) {
    entry *free_slot = NULL;
    for (size_t i = hash(key, klen) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        entry *e = &t->e[i];
        if (!e->key) return free_slot ? free_slot : e;
        if (e->key == TOMBSTONE) {
            if (!free_slot) free_slot = e;
        } else if (strlen(e->key) == klen && memcmp(e->key, key, klen) == 0) {
            return e;
        }
    }
}

static bool grow(table *t) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    entry *e = cddp_calloc(cap, sizeof *e);
    if (!e) return false;
    table n = {e, cap, 0, 0};
    for (size_t i = 0; i < t->cap; i++)
        if (live(&t->e[i])) {
            *find(&n, t->e[i].key, strlen(t->e[i].key)) = t->e[i];
            n.used++;
            n.live++;
        }
    cddp_free(t->e);
    *t = n;
    return true;
}

bool cddp__kv_put(table *t, const uint8_t *key, size_t klen, const uint8_t *val, size_t len) {
    if ((t->used + 1) * 4 > t->cap * 3 && !grow(t)) return false;
    entry *e = find(t, (const char *)key, klen);
    uint8_t *v = cddp_malloc(len);
    if (!v) return false;
    memcpy(v, val, len);
    if (live(e)) {
        cddp_free(e->val);
    } else {
        char *k = cddp_malloc(klen + 1);
        if (!k) {
            cddp_free(v);
            return false;
        }
        memcpy(k, key, klen);
        k[klen] = '\0';
        if (!e->key) t->used++;
        t->live++;
        e->key = k;
    }
    e->val = v;
    e->len = len;
    return true;
}

entry *cddp__kv_lookup(table *t, const uint8_t *key, size_t klen) {
    if (!t->cap) return NULL;
    entry *e = find(t, (const char *)key, klen);
    return live(e) ? e : NULL;
}

void cddp__kv_remove(table *t, entry *e) {
    cddp_free(e->key);
    cddp_free(e->val);
    e->key = TOMBSTONE;
    e->val = NULL;
    t->live--;
}

void cddp__kv_free(table *t) {
    for (size_t i = 0; i < t->cap; i++)
        if (live(&t->e[i])) {
            cddp_free(t->e[i].key);
            cddp_free(t->e[i].val);
        }
    cddp_free(t->e);
}
