/* corpus.c: gpt_train's text and its checked windows (see corpus.h). */
#include "corpus.h"

#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

static void free_names(char **name, int count) {
    for (int k = 0; name && k < count; k++) free(name[k]);
    free(name);
}

void corpus_free(corpus *c) {
    for (int k = 0; k < c->count; k++) cddp_tokens_free(&c->shard[k]);
    free(c->shard);
    free_names(c->name, c->count);
    free(c->base);
    memset(c, 0, sizeof *c);
}

/* Room for count shards in c (zeroed). */
static int corpus_alloc(corpus *c, size_t count, cddp_error *err) {
    if (count > INT32_MAX || !(c->shard = calloc(count, sizeof *c->shard)) ||
        !(c->name = calloc(count, sizeof *c->name)) ||
        !(c->base = calloc(count, sizeof *c->base))) {
        corpus_free(c);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %zu token files", count);
    }
    return CDDP_OK;
}

/* Every token file pattern matches, in name order (llm.c's shards: fineweb_train_000001.bin, ...),
 * read (mapped) into c. */
static int corpus_glob(const char *pattern, const char *what, corpus *c, cddp_error *err) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0) {
        if (rc != GLOB_NOMATCH) return cddp_error_set(err, CDDP_EIO, "%s: cannot list", pattern);
        return cddp_error_set(err, CDDP_ENOENT, "%s: no %s matches it", pattern, what);
    }
    rc = corpus_alloc(c, g.gl_pathc, err);
    for (size_t k = 0; rc == CDDP_OK && k < g.gl_pathc; k++) {
        if (!(c->name[k] = strdup(g.gl_pathv[k])))
            rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        else
            rc = cddp_tokens_read(g.gl_pathv[k], &c->shard[k], err);
        c->count = (int)k + 1;
        c->tokens += c->shard[k].count;
    }
    globfree(&g);
    if (rc != CDDP_OK) corpus_free(c);
    return rc;
}

/* c as one array of tokens t (taken over), which starts at base in the file name. */
static int corpus_of(cddp_tokens *t, const char *name, int64_t base, corpus *c, cddp_error *err) {
    int rc = corpus_alloc(c, 1, err);
    if (rc == CDDP_OK && !(c->name[0] = strdup(name))) {
        corpus_free(c);
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    if (rc != CDDP_OK) {
        cddp_tokens_free(t);
        return rc;
    }
    c->shard[0] = *t;
    c->base[0] = base;
    c->count = 1;
    c->tokens = t->count;
    memset(t, 0, sizeof *t);
    return CDDP_OK;
}

int corpus_load(const char *path, corpus *train, corpus *val, cddp_error *err) {
    if (!path) {
        struct stat st;
        if (stat(CORPUS_FORTUNES, &st) != 0)
            return cddp_error_set(err, CDDP_ENOENT,
                                  "no --data given and Debian's fortunes package, the default "
                                  "corpus, is not installed (apt-get install fortunes; make "
                                  "demo-gpt installs it)");
        path = CORPUS_FORTUNES;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path, *at = NULL;
    for (const char *p = strstr(base, "train"); p; p = strstr(p + 1, "train")) at = p;
    char vpath[4096] = "";
    if (at && strlen(path) < sizeof vpath - 1)
        snprintf(vpath, sizeof vpath, "%.*sval%s", (int)(at - path), path, at + strlen("train"));
    if (strpbrk(path, "*?[") && access(path, F_OK) != 0) { /* shards (not a file named so) */
        if (!at)
            return cddp_error_set(err, CDDP_EINVAL,
                                  "--data %s: a pattern names the training shards, with train in "
                                  "their file name (the same with val names the validation "
                                  "shards), as llm.c's fineweb_train_*.bin",
                                  path);
        CDDP_TRY(corpus_glob(path, "token file", train, err));
        int rc = corpus_glob(vpath, "validation shard (the training shards' pattern with val)", val,
                             err);
        if (rc != CDDP_OK) corpus_free(train);
        return rc;
    }
    cddp_tokens a = {0}, b = {0};
    const char *vname = path;
    if (at && ends_with(path, "train.bin") && access(vpath, F_OK) == 0) {
        CDDP_TRY(cddp_tokens_read(path, &a, err));
        int rc = cddp_tokens_read(vpath, &b, err);
        if (rc != CDDP_OK) cddp_tokens_free(&a);
        CDDP_TRY(rc);
        vname = vpath;
    } else {
        cddp_tokens all;
        CDDP_TRY(cddp_tokens_load(path, &all, err));
        int rc = cddp_tokens_split(&all, 0.1, &a, &b, err);
        cddp_tokens_free(&all);
        CDDP_TRY(rc);
    }
    int64_t vbase = vname == path ? a.count : 0;
    int rc = corpus_of(&a, path, 0, train, err);
    if (rc == CDDP_OK && (rc = corpus_of(&b, vname, vbase, val, err)) != CDDP_OK)
        corpus_free(train);
    cddp_tokens_free(&b);
    return rc;
}

int64_t corpus_max_token(const corpus *c) {
    uint32_t m = 0; /* the loops as the compiler vectorises them: 10 GB/s on one core */
    for (int k = 0; k < c->count; k++) {
        const uint16_t *t = c->shard[k].data;
        const uint32_t *w = c->shard[k].wide;
        for (int64_t i = 0; t && i < c->shard[k].count; i++) m = t[i] > m ? t[i] : m;
        for (int64_t i = 0; w && i < c->shard[k].count; i++) m = w[i] > m ? w[i] : m;
    }
    return m;
}

int corpus_vocab(const corpus *c, int64_t *vocab, cddp_error *err) {
    for (int k = 0; k < c->count; k++) {
        int64_t v = c->shard[k].vocab_size;
        if (v > 0 && *vocab > 0 && v != *vocab)
            return cddp_error_set(err, CDDP_EINVAL,
                                  "%s was tokenized with a vocabulary of %" PRId64
                                  " tokens, the data before it with one of %" PRId64
                                  ": files of two tokenizers",
                                  c->name[k], v, *vocab);
        if (v > 0) *vocab = v;
    }
    return CDDP_OK;
}

/* ---- windows checked as they are read ------------------------------------------------------- */

typedef struct checked {
    cddp_dataset *windows;
    char **name;
    int64_t *base, *first; /* shard k's windows are [first[k], first[k + 1]) */
    int count;
    int64_t stride, vocab;
} checked;

static int64_t checked_len(void *self) {
    return cddp_dataset_len(((checked *)self)->windows);
}

static int checked_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    checked *c = self;
    CDDP_TRY(cddp_dataset_get(c->windows, i, out, err));
    int64_t block = cddp_dataset_field(c->windows, 0)->shape[0];
    const int64_t *x = out[0], *y = out[1]; /* y is x one token on: its last is the window's end */
    int64_t j = 0;
    while (j < block && x[j] < c->vocab) j++;
    if (j == block && y[block - 1] < c->vocab) return CDDP_OK;
    int k = 0;
    while (k + 1 < c->count && c->first[k + 1] <= i) k++;
    return cddp_error_set(err, CDDP_ERANGE,
                          "%s: token %" PRId64 " at %" PRId64 " (counted from 0) is beyond the "
                          "model's vocabulary of %" PRId64 " (--vocab_size): tokens of another "
                          "tokenizer, or a damaged file",
                          c->name[k], j < block ? x[j] : y[block - 1],
                          c->base[k] + (i - c->first[k]) * c->stride + j, c->vocab);
}

static void checked_destroy(void *self) {
    checked *c = self;
    cddp_dataset_destroy(c->windows);
    free_names(c->name, c->count);
    free(c->base);
    free(c->first);
    free(c);
}

cddp_dataset *corpus_windows(corpus *c, int64_t block, int64_t stride, int64_t vocab,
                             cddp_error *err) {
    int64_t *first = NULL;
    if (vocab > 0 && !(first = calloc((size_t)c->count + 1, sizeof *first))) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    for (int k = 0; first && k < c->count; k++) { /* as cddp_dataset_token_shards counts them */
        int64_t n = c->shard[k].count;
        first[k + 1] =
            first[k] +
            (block >= 1 && stride >= 1 && n >= block + 1 ? (n - block - 1) / stride + 1 : 0);
    }
    cddp_dataset *windows = cddp_dataset_token_shards(c->shard, c->count, block, stride, err);
    if (!windows || vocab <= 0) {
        free(first);
        return windows;
    }
    checked *w = malloc(sizeof *w);
    if (!w) {
        free(first);
        cddp_dataset_destroy(windows);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    *w = (checked){.windows = windows,
                   .name = c->name,
                   .base = c->base,
                   .first = first,
                   .count = c->count,
                   .stride = stride,
                   .vocab = vocab};
    c->name = NULL; /* taken over */
    c->base = NULL;
    cddp_field fields[2] = {*cddp_dataset_field(windows, 0), *cddp_dataset_field(windows, 1)};
    static const cddp_dataset_ops ops = {checked_len, checked_get, checked_destroy};
    return cddp_dataset_create(&ops, w, 2, fields, err);
}
