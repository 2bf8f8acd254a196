/* bpe.c: encoding text with a byte-level BPE tokenizer, and decoding its tokens (cddp/data.h).
 *
 * Encoding is Hugging Face's pipeline for the tokenizers GPT-2, Llama 3 and most current models
 * ship, in its order:
 *
 *   1. Added tokens: the text is cut at every added token (special tokens such as <|endoftext|>
 *      and others), leftmost first and the longest where several start at one place; each is its
 *      id, whatever its bytes would encode to.
 *   2. Pre-tokenization: each stretch between added tokens is cut into pieces by the
 *      pre-tokenizer's steps in turn (a regular expression's matches and the text between them,
 *      PCRE2 with Unicode properties: \p{L}, \p{N} and \s mean what they mean in Unicode). A
 *      piece never merges with its neighbour: a word and the space before it are one piece
 *      (" world"), so common words become one token.
 *   3. BPE: a piece starts as its bytes' tokens, and the merges are applied, the lowest-ranked
 *      pair first (at its leftmost place where it occurs more than once), until no adjacent pair
 *      has a merge. A heap of candidate pairs ordered by (rank, place) makes this n log n in the
 *      piece's length n (a megabyte of one punctuation character is one piece), where rescanning
 *      the piece after each merge would be n^2.
 *
 * Tokens are kept as the bytes they stand for, not as the printable characters that byte-level
 * vocabularies write them with ("Ġworld" is " world"): tokenizer.c translates them once at load,
 * so encoding works on the text's bytes and decoding concatenates bytes. Text that is not valid
 * UTF-8 is encoded all the same: the expressions match no invalid sequence, so its bytes are
 * pieces of their own, each byte a token at worst.
 *
 * A tokenizer is read-only once loaded: encode and decode keep their state in the call, so
 * threads may share one tokenizer.
 */
#include "cddp/core.h"
#include "data/tokenizer.h"

#include <inttypes.h>
#include <string.h>

const char *const cddp__tok_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- tables --------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ h >> 29;
}

static uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9e3779b97f4a7c15ull;
    return h ^ h >> 31;
}

int cddp__tok_map_init(cddp__tok_map *m, int64_t n, cddp_error *err) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap *= 2;
    m->slot = cddp_malloc(cap * sizeof *m->slot);
    if (!m->slot)
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %" PRId64 " tokens", n);
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return CDDP_OK;
}

void cddp__tok_map_free(cddp__tok_map *m) {
    cddp_free(m->slot);
    m->slot = NULL;
}

int32_t cddp__tok_lookup(const cddp_tokenizer *t, const char *s, size_t n) {
    const cddp__tok_map *m = &t->by_bytes;
    for (uint64_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (t->piece_len[id] == n && memcmp(t->piece[id], s, n) == 0) return id;
    }
}

bool cddp__tok_insert(cddp_tokenizer *t, int32_t id) {
    cddp__tok_map *m = &t->by_bytes;
    if (cddp__tok_lookup(t, t->piece[id], t->piece_len[id]) >= 0) return false;
    uint64_t i = hash_bytes(t->piece[id], t->piece_len[id]) & m->mask;
    while (m->slot[i] >= 0) i = (i + 1) & m->mask;
    m->slot[i] = id;
    return true;
}

/* The index of the merge of (a, b) into t->merge, or -1. */
static int32_t pair_lookup(const cddp_tokenizer *t, int32_t a, int32_t b) {
    const cddp__tok_map *m = &t->by_pair;
    for (uint64_t i = hash_pair(a, b) & m->mask;; i = (i + 1) & m->mask) {
        int32_t k = m->slot[i];
        if (k < 0 || (t->merge[k].left == a && t->merge[k].right == b)) return k;
    }
}

bool cddp__tok_insert_pair(cddp_tokenizer *t, int32_t k) {
    cddp__tok_map *m = &t->by_pair;
    int32_t a = t->merge[k].left, b = t->merge[k].right;
    if (pair_lookup(t, a, b) >= 0) return false;
    uint64_t i = hash_pair(a, b) & m->mask;
    while (m->slot[i] >= 0) i = (i + 1) & m->mask;
    m->slot[i] = k;
    return true;
}

/* ---- one encoding's state ------------------------------------------------------------------- */

typedef struct cand { /* a pair that may merge: sym[pos] and the symbol after it */
    int32_t rank, pos, left, right, into;
} cand;

typedef struct enc {
    const cddp_tokenizer *t;
    pcre2_match_data *md;
    int32_t *ids;
    int64_t n, cap;
    int32_t *sym, *prev, *next; /* a piece's symbols as a list (sym -1: merged away); one block */
    cand *heap;
    int64_t sym_cap, heap_n, heap_cap;
    char *prefixed[CDDP__TOK_STEPS]; /* a piece with a space put before it, per step */
    size_t prefixed_cap[CDDP__TOK_STEPS];
    cddp_error *err;
} enc;

static int grow(void **p, int64_t *cap, int64_t want, size_t size, cddp_error *err) {
    if (want <= *cap) return CDDP_OK;
    int64_t n = CDDP_MAX(want, *cap * 2);
    void *q = cddp_realloc(*p, (size_t)n * size);
    if (!q) return cddp_error_set(err, CDDP_ENOMEM, "out of memory encoding text");
    *p = q;
    *cap = n;
    return CDDP_OK;
}

static int emit(enc *e, int32_t id) {
    if (e->n == e->cap) CDDP_TRY(grow((void **)&e->ids, &e->cap, e->n + 1, sizeof *e->ids, e->err));
    e->ids[e->n++] = id;
    return CDDP_OK;
}

static bool cand_before(const cand *a, const cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

/* Offers the pair at pos (sym[pos] and its next) to the heap, if it has a merge. */
static int offer(enc *e, int32_t pos) {
    if (pos < 0 || e->next[pos] < 0) return CDDP_OK;
    int32_t nx = e->next[pos];
    int32_t k = pair_lookup(e->t, e->sym[pos], e->sym[nx]);
    if (k < 0) return CDDP_OK;
    const cddp__tok_merge *m = &e->t->merge[k];
    CDDP_TRY(grow((void **)&e->heap, &e->heap_cap, e->heap_n + 1, sizeof *e->heap, e->err));
    cand c = {m->rank, pos, m->left, m->right, m->into};
    int64_t i = e->heap_n++;
    while (i > 0 && cand_before(&c, &e->heap[(i - 1) / 2])) { /* sift up */
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = c;
    return CDDP_OK;
}

static cand pop(enc *e) {
    cand top = e->heap[0], last = e->heap[--e->heap_n];
    int64_t i = 0;
    for (;;) { /* sift the last entry down from the root */
        int64_t c = 2 * i + 1;
        if (c >= e->heap_n) break;
        if (c + 1 < e->heap_n && cand_before(&e->heap[c + 1], &e->heap[c])) c++;
        if (!cand_before(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->heap_n > 0) e->heap[i] = last;
    return top;
}

/* Step 3: one piece's tokens. */
static int bpe(enc *e, const char *s, size_t len) {
    const cddp_tokenizer *t = e->t;
    if (t->ignore_merges) {
        int32_t whole = cddp__tok_lookup(t, s, len);
        if (whole >= 0) return emit(e, whole);
    }
    if ((int64_t)len > e->sym_cap) { /* the three lists in one block, nothing kept */
        int64_t cap = CDDP_MAX((int64_t)len, 2 * e->sym_cap);
        cddp_free(e->sym);
        if (!(e->sym = cddp_malloc((size_t)cap * 3 * sizeof *e->sym))) {
            e->sym_cap = 0;
            return cddp_error_set(e->err, CDDP_ENOMEM, "out of memory encoding text");
        }
        e->sym_cap = cap;
        e->prev = e->sym + cap;
        e->next = e->sym + 2 * cap;
    }
    int32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_id[(uint8_t)s[i]];
        if (id < 0 && t->unk >= 0 && (n == 0 || e->sym[n - 1] != t->unk)) id = t->unk;
        if (id < 0) continue; /* a byte without a token and no unknown token: dropped */
        e->sym[n] = id;
        e->prev[n] = n - 1;
        e->next[n] = -1;
        if (n > 0) e->next[n - 1] = n;
        n++;
    }
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) CDDP_TRY(offer(e, i));
    while (e->heap_n > 0) {
        cand c = pop(e);
        int32_t nx = e->next[c.pos];
        if (e->sym[c.pos] != c.left || nx < 0 || e->sym[nx] != c.right) continue; /* stale */
        e->sym[c.pos] = c.into;
        e->sym[nx] = -1;
        e->next[c.pos] = e->next[nx];
        if (e->next[nx] >= 0) e->prev[e->next[nx]] = c.pos;
        CDDP_TRY(offer(e, e->prev[c.pos]));
        CDDP_TRY(offer(e, c.pos));
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = e->next[i]) CDDP_TRY(emit(e, e->sym[i]));
    return CDDP_OK;
}

static size_t utf8_len(uint8_t b) {
    return b < 0xc0 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
}

/* Step 2 from pre-tokenizer step k on: s[0, len) cut by step k, each part handed on. */
static int split(enc *e, int k, const char *s, size_t len) {
    const cddp_tokenizer *t = e->t;
    if (len == 0) return CDDP_OK;
    if (k == t->steps) return bpe(e, s, len);
    const cddp__tok_step *st = &t->step[k];
    if (st->prefix_space && s[0] != ' ') {
        int64_t cap = (int64_t)e->prefixed_cap[k];
        CDDP_TRY(grow((void **)&e->prefixed[k], &cap, (int64_t)len + 1, 1, e->err));
        e->prefixed_cap[k] = (size_t)cap;
        e->prefixed[k][0] = ' ';
        memcpy(e->prefixed[k] + 1, s, len);
        s = e->prefixed[k];
        len++;
    }
    if (!st->re) return split(e, k + 1, s, len);
    size_t at = 0, last = 0;
    while (at < len) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, len, at, 0, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return cddp_error_set(e->err, CDDP_EINVAL, "%s: the pre-tokenizer's expression: %s",
                                  t->path, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t from = ov[0], to = ov[1];
        if (to == from) { /* an empty match cuts nothing: look on after its character */
            at = from + utf8_len((uint8_t)s[from]);
            continue;
        }
        if (from > last) CDDP_TRY(split(e, k + 1, s + last, from - last));
        CDDP_TRY(split(e, k + 1, s + from, to - from));
        last = at = to;
    }
    return split(e, k + 1, s + last, len - last);
}

static bool word_byte(uint8_t c) {
    return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') ||
           ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

static bool space_byte(uint8_t c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The longest added token at s[i] (-1: none), within text[0, len). */
static int added_at(const cddp_tokenizer *t, const char *s, size_t i, size_t len) {
    int best = -1;
    for (int a = 0; a < t->added_count; a++) {
        const cddp__tok_added *x = &t->added[a];
        if (x->len > len - i || (best >= 0 && x->len <= t->added[best].len) ||
            memcmp(s + i, x->content, x->len) != 0)
            continue;
        if (x->single_word && ((i > 0 && word_byte((uint8_t)s[i - 1])) ||
                               (i + x->len < len && word_byte((uint8_t)s[i + x->len]))))
            continue;
        best = a;
    }
    return best;
}

int cddp_tokenizer_encode(const cddp_tokenizer *t, const char *text, size_t len, int32_t **ids,
                          int64_t *count, cddp_error *err) {
    *ids = NULL;
    *count = 0;
    enc e = {.t = t, .err = err};
    int rc = CDDP_OK;
    if (t->steps > 0 && !(e.md = pcre2_match_data_create(4, NULL)))
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory encoding text");
    /* Step 1: the stretches between added tokens go on to pre-tokenization. */
    size_t from = 0;
    for (size_t i = 0; rc == CDDP_OK && i < len; i++) {
        int a = t->added_first[(uint8_t)text[i]] ? added_at(t, text, i, len) : -1;
        if (a < 0) continue;
        const cddp__tok_added *x = &t->added[a];
        size_t start = i, end = i + x->len;
        while (x->lstrip && start > from && space_byte((uint8_t)text[start - 1])) start--;
        while (x->rstrip && end < len && space_byte((uint8_t)text[end])) end++;
        rc = split(&e, 0, text + from, start - from);
        if (rc == CDDP_OK) rc = emit(&e, x->id);
        from = end;
        i = end - 1;
    }
    if (rc == CDDP_OK) rc = split(&e, 0, text + from, len - from);
    pcre2_match_data_free(e.md);
    cddp_free(e.sym);
    cddp_free(e.heap);
    for (int k = 0; k < CDDP__TOK_STEPS; k++) cddp_free(e.prefixed[k]);
    if (rc != CDDP_OK) {
        cddp_free(e.ids);
        return rc;
    }
    if (!e.ids && !(e.ids = cddp_malloc(sizeof *e.ids)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory encoding text");
    *ids = e.ids;
    *count = e.n;
    return CDDP_OK;
}

const char *cddp_tokenizer_piece(const cddp_tokenizer *t, int64_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size || !t->piece[id]) {
        *len = 0;
        return NULL;
    }
    *len = t->piece_len[id];
    return t->piece[id];
}

int cddp_tokenizer_decode(const cddp_tokenizer *t, const int32_t *ids, int64_t count, char **text,
                          size_t *len, cddp_error *err) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < count; i++) {
        size_t n;
        if (!cddp_tokenizer_piece(t, ids[i], &n))
            return cddp_error_set(err, CDDP_ERANGE,
                                  "token %" PRId32 " (at %" PRId64 ") is not in %s's vocabulary of "
                                  "%" PRId64 " tokens",
                                  ids[i], i, t->path, t->vocab_size);
        total += n;
    }
    char *out = cddp_malloc(total + 1);
    if (!out) return cddp_error_set(err, CDDP_ENOMEM, "out of memory decoding %zu bytes", total);
    size_t at = 0;
    for (int64_t i = 0; i < count; i++) {
        memcpy(out + at, t->piece[ids[i]], t->piece_len[ids[i]]);
        at += t->piece_len[ids[i]];
    }
    out[total] = '\0';
    *text = out;
    *len = total;
    return CDDP_OK;
}
