/* tokenizer.c: reading a byte-level BPE tokenizer (cddp/data.h): Hugging Face's tokenizer.json,
 * or GPT-2's vocab.json with merges.txt beside it.
 *
 * What is read is what changes the ids: the vocabulary, the merges (a list of "a b" strings or,
 * in newer files, of ["a", "b"] pairs), the added tokens, the pre-tokenizer's steps (ByteLevel,
 * Split by an expression or a string with behaviour Isolated, Digits, and a Sequence of them) and
 * the model's options. Whatever else a file asks for is refused by name, never ignored: a
 * normalizer, a SentencePiece-style tokenizer (Metaspace, byte fallback: Llama 2's, Mistral's), a
 * WordPiece or Unigram model, BPE dropout, a subword prefix or suffix. A file that encodes
 * differently from Hugging Face's tokenizers would corrupt a training run silently; a refusal
 * costs a minute.
 *
 * The beginning- and end-of-text tokens are tokenizer_config.json's bos_token and eos_token when
 * that file is beside the tokenizer (as in a model's folder), else the first of the usual names
 * the vocabulary holds: <|begin_of_text|> or <s> for the beginning, <|endoftext|> (GPT-2's, for
 * both), <|end_of_text|> or </s> for the end.
 *
 * Byte-level vocabularies write each byte as a printable character (the space as "Ġ", the
 * newline as "Ċ": bytes 33-126, 161-172 and 174-255 as themselves, the others as U+0100 on, in
 * order). Tokens are translated back to their bytes here, once.
 */
#include "cddp/core.h"
#include "data/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The byte a byte-level character stands for, by code point (-1: not one of them). */
static int byte_of_char(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int k = (int)cp - 256; /* the k-th byte outside the printable ranges */
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        if (!printable && k-- == 0) return b;
    }
    return -1;
}

/* One code point of UTF-8 at s (n bytes left), its length in *len; -1 when invalid. */
static int64_t utf8_next(const char *s, size_t n, size_t *len) {
    const uint8_t *u = (const uint8_t *)s;
    size_t k = u[0] < 0x80 ? 1 : (u[0] & 0xe0) == 0xc0 ? 2 : (u[0] & 0xf0) == 0xe0 ? 3 : 4;
    if (k > n || (u[0] >= 0x80 && u[0] < 0xc0) || u[0] >= 0xf8) return -1;
    uint32_t cp = k == 1 ? u[0] : u[0] & (0x7f >> k);
    for (size_t i = 1; i < k; i++) {
        if ((u[i] & 0xc0) != 0x80) return -1;
        cp = cp << 6 | (u[i] & 0x3f);
    }
    *len = k;
    return cp;
}

/* A vocabulary string as the bytes it stands for, in out (n bytes; at most strlen(s)): false
 * when s is not written in the byte-level characters (then out holds s itself). */
static bool from_byte_level(const char *s, char *out, size_t *n) {
    size_t len = strlen(s), at = 0;
    for (size_t i = 0; i < len;) {
        size_t k;
        int64_t cp = utf8_next(s + i, len - i, &k);
        int b = cp < 0 ? -1 : byte_of_char((uint32_t)cp);
        if (b < 0) {
            memcpy(out, s, len);
            *n = len;
            return false;
        }
        out[at++] = (char)b;
        i += k;
    }
    *n = at;
    return true;
}

void cddp_tokenizer_destroy(cddp_tokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; t->piece && i < t->vocab_size; i++) cddp_free(t->piece[i]);
    cddp_free(t->piece);
    cddp_free(t->piece_len);
    cddp__tok_map_free(&t->by_bytes);
    cddp__tok_map_free(&t->by_pair);
    cddp_free(t->merge);
    for (int a = 0; a < t->added_count; a++) cddp_free(t->added[a].content);
    cddp_free(t->added);
    for (int k = 0; k < t->steps; k++) pcre2_code_free(t->step[k].re);
    cddp_free(t->path);
    cddp_free(t);
}

/* ---- reading the files ---------------------------------------------------------------------- */

/* The whole file, NUL-terminated, in *text (cddp_free it). */
static int read_text(const char *path, char **text, cddp_error *err) {
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return cddp_error_set(err, errno == ENOENT ? CDDP_ENOENT : CDDP_EIO, "cannot open %s: %s",
                              path, strerror(errno));
    int rc = CDDP_OK;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        rc = cddp_error_set(err, CDDP_EIO, "%s: not a regular file", path);
    else if (!(*text = cddp_malloc((size_t)size + 1)))
        rc = cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for %ld bytes", path, size);
    else if (fread(*text, 1, (size_t)size, f) != (size_t)size)
        rc = cddp_error_set(err, CDDP_EIO, "%s: read failed", path);
    else
        (*text)[size] = '\0';
    fclose(f);
    if (rc != CDDP_OK) {
        cddp_free(*text);
        *text = NULL;
    }
    return rc;
}

static int read_json(const char *path, cJSON **root, cddp_error *err) {
    char *text;
    *root = NULL;
    CDDP_TRY(read_text(path, &text, err));
    *root = cJSON_Parse(text);
    cddp_free(text);
    if (!*root) return cddp_error_set(err, CDDP_EFORMAT, "%s: not JSON (or damaged)", path);
    return CDDP_OK;
}

static bool is_null(const cJSON *j) {
    return !j || cJSON_IsNull(j);
}

/* An id from JSON: an integer from 0, below most (the ids of a file of `tokens` tokens stay
 * near that count: a vocabulary is numbered densely, and an id of 10^9 in a damaged file must not
 * ask for 8 GB of token slots). */
static int get_id(const cJSON *j, const char *path, const char *what, int64_t tokens, int32_t *id,
                  cddp_error *err) {
    double v = cJSON_IsNumber(j) ? j->valuedouble : -1;
    double most = 2.0 * (double)tokens + 65536;
    if (!(v >= 0 && v < 2147483647.0 && v == (double)(int32_t)v))
        return cddp_error_set(err, CDDP_EFORMAT, "%s: %s has no id (an integer from 0)", path,
                              what);
    if (v >= most)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: %s has id %.0f, far past the file's %" PRId64 " tokens (a "
                              "vocabulary numbers its tokens from 0, densely: damaged?)",
                              path, what, v, tokens);
    *id = (int32_t)v;
    return CDDP_OK;
}

/* Makes room for ids up to top (grows piece and piece_len, new entries empty). */
static int room(cddp_tokenizer *t, int64_t top, cddp_error *err) {
    if (top < t->vocab_size) return CDDP_OK;
    char **p = cddp_realloc(t->piece, (size_t)(top + 1) * sizeof *p);
    if (p) t->piece = p;
    size_t *l = p ? cddp_realloc(t->piece_len, (size_t)(top + 1) * sizeof *l) : NULL;
    if (!l) return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %" PRId64 " tokens", top);
    t->piece_len = l;
    for (int64_t i = t->vocab_size; i <= top; i++) {
        t->piece[i] = NULL;
        t->piece_len[i] = 0;
    }
    t->vocab_size = top + 1;
    return CDDP_OK;
}

/* Sets token id to the bytes s[0, n). */
static int set_piece(cddp_tokenizer *t, int32_t id, const char *s, size_t n, cddp_error *err) {
    CDDP_TRY(room(t, id, err));
    cddp_free(t->piece[id]);
    if (!(t->piece[id] = cddp_malloc(n + 1)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for the vocabulary");
    memcpy(t->piece[id], s, n);
    t->piece[id][n] = '\0';
    t->piece_len[id] = n;
    return CDDP_OK;
}

/* The vocabulary: an object from token strings (byte-level) to ids. */
static int read_vocab(cddp_tokenizer *t, const cJSON *vocab, cddp_error *err) {
    if (!cJSON_IsObject(vocab))
        return cddp_error_set(err, CDDP_EFORMAT, "%s: the model has no vocabulary (\"vocab\")",
                              t->path);
    int64_t n = cJSON_GetArraySize(vocab);
    CDDP_TRY(cddp__tok_map_init(&t->by_bytes, n, err));
    char buf[1024];
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = 0;
        size_t len;
        if (strlen(e->string) >= sizeof buf)
            return cddp_error_set(err, CDDP_EFORMAT, "%s: a token of %zu bytes (\"%.40s...\")",
                                  t->path, strlen(e->string), e->string);
        CDDP_TRY(get_id(e, t->path, e->string, n, &id, err));
        if (id < t->vocab_size && t->piece[id])
            return cddp_error_set(err, CDDP_EFORMAT, "%s: two tokens have id %" PRId32, t->path,
                                  id);
        from_byte_level(e->string, buf, &len);
        CDDP_TRY(set_piece(t, id, buf, len, err));
        cddp__tok_insert(t, id); /* a second token of the same bytes is never produced */
    }
    for (int b = 0; b < 256; b++) t->byte_id[b] = cddp__tok_lookup(t, (char[]){(char)b}, 1);
    return CDDP_OK;
}

/* Merge k: tokens a and b (byte-level strings) become a + b. */
static int add_merge(cddp_tokenizer *t, int32_t k, const char *a, const char *b, cddp_error *err) {
    char buf[2048];
    size_t na, nb;
    if (strlen(a) + strlen(b) >= sizeof buf / 2)
        return cddp_error_set(err, CDDP_EFORMAT, "%s: merge %" PRId32 " is too long", t->path, k);
    from_byte_level(a, buf, &na);
    from_byte_level(b, buf + na, &nb);
    int32_t left = cddp__tok_lookup(t, buf, na), right = cddp__tok_lookup(t, buf + na, nb),
            into = cddp__tok_lookup(t, buf, na + nb);
    if (left < 0 || right < 0 || into < 0)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: merge %" PRId32 " (\"%s\" \"%s\"): \"%s%s\" is not in the "
                              "vocabulary",
                              t->path, k, a, b,
                              left < 0    ? a
                              : right < 0 ? b
                                          : a,
                              left < 0 || right < 0 ? "" : b);
    t->merge[k] = (cddp__tok_merge){left, right, into, k};
    cddp__tok_insert_pair(t, k); /* a repeated pair keeps its first (lowest) rank */
    return CDDP_OK;
}

static int read_merges(cddp_tokenizer *t, const cJSON *merges, cddp_error *err) {
    if (!cJSON_IsArray(merges))
        return cddp_error_set(err, CDDP_EFORMAT, "%s: the model has no merges", t->path);
    int32_t n = cJSON_GetArraySize(merges), k = 0;
    CDDP_TRY(cddp__tok_map_init(&t->by_pair, n, err));
    if (!(t->merge = cddp_calloc((size_t)CDDP_MAX(n, 1), sizeof *t->merge)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %" PRId32 " merges", n);
    for (const cJSON *m = merges->child; m; m = m->next, k++) {
        const char *a = NULL, *b = NULL;
        char pair[2048];
        if (cJSON_IsString(m) && strlen(m->valuestring) < sizeof pair) {
            strcpy(pair, m->valuestring);
            char *space = strchr(pair, ' ');
            if (space) {
                *space = '\0';
                a = pair;
                b = space + 1;
            }
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring;
            b = m->child->next->valuestring;
        }
        if (!a)
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: merge %" PRId32 " is neither \"a b\" nor [\"a\", \"b\"]",
                                  t->path, k);
        CDDP_TRY(add_merge(t, k, a, b, err));
    }
    t->merges = n;
    return CDDP_OK;
}

static int add_step(cddp_tokenizer *t, const char *pattern, uint32_t flags, bool prefix_space,
                    cddp_error *err) {
    if (t->steps == CDDP__TOK_STEPS)
        return cddp_error_set(err, CDDP_EFORMAT, "%s: more than %d pre-tokenizer steps", t->path,
                              CDDP__TOK_STEPS);
    cddp__tok_step *st = &t->step[t->steps];
    *st = (cddp__tok_step){.prefix_space = prefix_space};
    if (pattern) {
        int code;
        PCRE2_SIZE at;
        st->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | flags, &code, &at,
                               NULL);
        if (!st->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: the pre-tokenizer's expression %s: %s (at %zu)", t->path,
                                  pattern, (const char *)msg, (size_t)at);
        }
        pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE); /* where JIT is missing, interpreted */
    }
    t->steps++;
    return CDDP_OK;
}

static bool flag(const cJSON *o, const char *key, bool dflt) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

static const char *type_of(const cJSON *o) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(j) ? j->valuestring : "(no type)";
}

/* The pre-tokenizer's steps, a Sequence flattened; *byte_level: a ByteLevel step was seen. */
static int read_pre(cddp_tokenizer *t, const cJSON *p, bool *byte_level, cddp_error *err) {
    const char *type = type_of(p);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        for (const cJSON *q = cJSON_IsArray(list) ? list->child : NULL; q; q = q->next)
            CDDP_TRY(read_pre(t, q, byte_level, err));
        return CDDP_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        *byte_level = true;
        return add_step(t, flag(p, "use_regex", true) ? cddp__tok_gpt2_pattern : NULL, 0,
                        flag(p, "add_prefix_space", false), err);
    }
    if (strcmp(type, "Digits") == 0)
        return add_step(t, flag(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+", 0, false,
                        err);
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0 ||
            flag(p, "invert", false) || !(cJSON_IsString(re) || cJSON_IsString(str)))
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: a Split pre-tokenizer with behavior %s%s: cddp's tokenizer "
                                  "reads Split with a Regex or String pattern, behavior Isolated, "
                                  "not inverted",
                                  t->path,
                                  cJSON_IsString(behavior) ? behavior->valuestring : "(none)",
                                  flag(p, "invert", false) ? ", inverted" : "");
        return cJSON_IsString(re) ? add_step(t, re->valuestring, 0, false, err)
                                  : add_step(t, str->valuestring, PCRE2_LITERAL, false, err);
    }
    return cddp_error_set(err, CDDP_EFORMAT,
                          "%s: pre-tokenizer %s%s: cddp reads byte-level BPE tokenizers (GPT-2's, "
                          "Llama 3's, SmolLM's: ByteLevel, Split, Digits)",
                          t->path, type,
                          strcmp(type, "Metaspace") == 0
                              ? " (a SentencePiece-style tokenizer, as Llama 2's and Mistral's)"
                              : "");
}

/* The model's options that change the ids, each honoured or refused. */
static int read_model(cddp_tokenizer *t, const cJSON *model, cddp_error *err) {
    const char *type = type_of(model);
    if (strcmp(type, "BPE") != 0 && strcmp(type, "(no type)") != 0)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: a %s model: cddp's tokenizer reads BPE (byte-level)", t->path,
                              type);
    static const char *const unsupported[] = {"dropout", "continuing_subword_prefix",
                                              "end_of_word_suffix"};
    for (size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(model, unsupported[k]);
        if (!is_null(j) && !(cJSON_IsString(j) && !*j->valuestring))
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: the BPE model sets %s, which cddp's tokenizer does not "
                                  "implement",
                                  t->path, unsupported[k]);
    }
    if (flag(model, "byte_fallback", false))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: byte_fallback is a SentencePiece-style BPE's (Llama 2, "
                              "Mistral): cddp reads byte-level BPE tokenizers",
                              t->path);
    t->ignore_merges = flag(model, "ignore_merges", false);
    CDDP_TRY(read_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), err));
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) t->unk = cddp_tokenizer_id(t, unk->valuestring);
    return read_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), err);
}

static int read_added(cddp_tokenizer *t, const cJSON *list, cddp_error *err) {
    int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    if (n && !(t->added = cddp_calloc((size_t)n, sizeof *t->added)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for the added tokens");
    for (const cJSON *a = n ? list->child : NULL; a; a = a->next) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        int32_t id = 0;
        if (!cJSON_IsString(content) || !*content->valuestring)
            return cddp_error_set(err, CDDP_EFORMAT, "%s: an added token without content", t->path);
        CDDP_TRY(get_id(cJSON_GetObjectItemCaseSensitive(a, "id"), t->path, content->valuestring,
                        t->vocab_size + n, &id, err));
        cddp__tok_added *x = &t->added[t->added_count++];
        x->len = strlen(content->valuestring);
        if (!(x->content = cddp_malloc(x->len + 1)))
            return cddp_error_set(err, CDDP_ENOMEM, "out of memory for the added tokens");
        memcpy(x->content, content->valuestring, x->len + 1);
        x->id = id;
        x->lstrip = flag(a, "lstrip", false);
        x->rstrip = flag(a, "rstrip", false);
        x->single_word = flag(a, "single_word", false);
        t->added_first[(uint8_t)x->content[0]] = true;
        CDDP_TRY(set_piece(t, id, x->content, x->len, err));
    }
    return CDDP_OK;
}

static int read_tokenizer_json(cddp_tokenizer *t, cddp_error *err) {
    cJSON *root;
    CDDP_TRY(read_json(t->path, &root, err));
    int rc = CDDP_OK;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    bool byte_level = false;
    if (!cJSON_IsObject(model))
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: no \"model\": is this Hugging Face's tokenizer.json?", t->path);
    else if (!is_null(norm))
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: normalizer %s: cddp's tokenizer has no normalizers yet (the "
                            "byte-level BPE of GPT-2 and Llama 3 has none)",
                            t->path, type_of(norm));
    else if (!is_null(dec) && strcmp(type_of(dec), "ByteLevel") != 0)
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: decoder %s: cddp reads byte-level BPE tokenizers (decoder "
                            "ByteLevel)",
                            t->path, type_of(dec));
    else if (is_null(pre))
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: no pre-tokenizer: cddp reads byte-level BPE tokenizers (a "
                            "ByteLevel pre-tokenizer)",
                            t->path);
    if (rc == CDDP_OK) rc = read_pre(t, pre, &byte_level, err);
    if (rc == CDDP_OK && !byte_level)
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: the pre-tokenizer has no ByteLevel step: cddp reads byte-level "
                            "BPE tokenizers",
                            t->path);
    if (rc == CDDP_OK) rc = read_model(t, model, err);
    if (rc == CDDP_OK)
        rc = read_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err);
    cJSON_Delete(root);
    return rc;
}

/* GPT-2's files: vocab.json (token -> id) and merges.txt ("#version" then "a b" lines). */
static int read_gpt2_files(cddp_tokenizer *t, const char *merges_path, cddp_error *err) {
    cJSON *vocab;
    char *text;
    CDDP_TRY(read_json(t->path, &vocab, err));
    int rc = read_vocab(t, vocab, err);
    cJSON_Delete(vocab);
    CDDP_TRY(rc);
    CDDP_TRY(read_text(merges_path, &text, err));
    cJSON *merges = cJSON_CreateArray();
    for (char *line = strtok(text, "\r\n"); merges && line; line = strtok(NULL, "\r\n"))
        if (strncmp(line, "#version", 8) != 0 && *line)
            cJSON_AddItemToArray(merges, cJSON_CreateString(line));
    cddp_free(text);
    rc = merges ? read_merges(t, merges, err)
                : cddp_error_set(err, CDDP_ENOMEM, "out of memory for %s", merges_path);
    cJSON_Delete(merges);
    if (rc == CDDP_OK) rc = add_step(t, cddp__tok_gpt2_pattern, 0, false, err);
    int64_t eot = cddp_tokenizer_id(t, "<|endoftext|>");
    if (rc == CDDP_OK && eot >= 0 && (t->added = cddp_calloc(1, sizeof *t->added))) {
        t->added[0] = (cddp__tok_added){.len = 13, .id = (int32_t)eot};
        if ((t->added[0].content = cddp_malloc(14))) {
            memcpy(t->added[0].content, "<|endoftext|>", 14);
            t->added_count = 1;
            t->added_first['<'] = true;
        }
    }
    if (rc == CDDP_OK && eot >= 0 && t->added_count == 0)
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return rc;
}

/* bos_token or eos_token of tokenizer_config.json: a string, or an object with its content. */
static int64_t config_token(const cddp_tokenizer *t, const cJSON *config, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsObject(j)) j = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(j) ? cddp_tokenizer_id(t, j->valuestring) : -1;
}

static int64_t first_of(const cddp_tokenizer *t, const char *const *names) {
    for (; *names; names++) {
        int64_t id = cddp_tokenizer_id(t, *names);
        if (id >= 0) return id;
    }
    return -1;
}

static void find_bos_eos(cddp_tokenizer *t, const char *dir) {
    static const char *const bos[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>", NULL};
    static const char *const eos[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", NULL};
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat st;
    cddp_error ignored = {0};
    cJSON *config = NULL;
    if (stat(path, &st) == 0) read_json(path, &config, &ignored); /* damaged: the names below */
    t->bos = (int32_t)config_token(t, config, "bos_token");
    t->eos = (int32_t)config_token(t, config, "eos_token");
    cJSON_Delete(config);
    if (t->bos < 0) t->bos = (int32_t)first_of(t, bos);
    if (t->eos < 0) t->eos = (int32_t)first_of(t, eos);
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

cddp_tokenizer *cddp_tokenizer_load(const char *path, cddp_error *err) {
    char file[4096], dir[4096];
    struct stat st;
    bool folder = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (strlen(path) > sizeof file - 32) {
        cddp_error_set(err, CDDP_EINVAL, "a tokenizer path of %zu bytes", strlen(path));
        return NULL;
    }
    snprintf(dir, sizeof dir, "%s", path);
    if (folder) { /* a model's folder: its tokenizer.json, else GPT-2's vocab.json */
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (stat(file, &st) != 0) snprintf(file, sizeof file, "%s/vocab.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    }
    cddp_tokenizer *t = cddp_calloc(1, sizeof *t);
    if (!t || !(t->path = cddp_malloc(strlen(file) + 1))) {
        cddp_free(t);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    strcpy(t->path, file);
    t->unk = -1;
    int rc;
    if (ends_with(file, "vocab.json")) {
        char merges[4096 + 16];
        snprintf(merges, sizeof merges, "%s/merges.txt", dir);
        rc = read_gpt2_files(t, merges, err);
    } else
        rc = read_tokenizer_json(t, err);
    if (rc == CDDP_OK && t->vocab_size == 0)
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: an empty vocabulary", file);
    if (rc != CDDP_OK) {
        if (folder && rc == CDDP_ENOENT)
            cddp_error_set(
                err, rc, "%s holds no tokenizer.json, nor GPT-2's vocab.json and merges.txt", path);
        cddp_tokenizer_destroy(t);
        return NULL;
    }
    find_bos_eos(t, dir);
    return t;
}

int64_t cddp_tokenizer_vocab_size(const cddp_tokenizer *t) {
    return t->vocab_size;
}

int64_t cddp_tokenizer_bos(const cddp_tokenizer *t) {
    return t->bos;
}

int64_t cddp_tokenizer_eos(const cddp_tokenizer *t) {
    return t->eos;
}

int64_t cddp_tokenizer_id(const cddp_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int a = 0; a < t->added_count; a++)
        if (t->added[a].len == n && memcmp(t->added[a].content, token, n) == 0)
            return t->added[a].id;
    char buf[1024];
    if (n >= sizeof buf || !t->by_bytes.slot) return -1;
    from_byte_level(token, buf, &n); /* as the vocabulary writes it ("Ġworld"), or as bytes */
    int32_t id = cddp__tok_lookup(t, buf, n);
    return id >= 0 ? id : cddp__tok_lookup(t, token, strlen(token));
}
