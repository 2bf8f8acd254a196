/* windows.c: a text's tokens as a language model's samples, and the train/validation split
 * (cddp/data.h). A window is fetched by copying block_size + 1 tokens out of one shard's array
 * (found by a binary search over where each shard's windows start), so the dataset costs the
 * text's size, or nothing for mapped token files, and nothing per window. */
#include "cddp/core.h"
#include "cddp/data.h"

#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>

/* Tokens [from, from + n) of t as a new array in to (16 or 32 bits, as t's). */
static int copy_tokens(const cddp_tokens *t, int64_t from, int64_t n, cddp_tokens *to,
                       cddp_error *err) {
    memset(to, 0, sizeof *to);
    size_t width = t->wide ? 4 : 2;
    void *p = cddp_malloc(n ? (size_t)n * width : 1);
    if (!p) return cddp_error_set(err, CDDP_ENOMEM, "cannot allocate %" PRId64 " tokens", n);
    if (n)
        memcpy(p, t->wide ? (const void *)(t->wide + from) : (const void *)(t->data + from),
               (size_t)n * width);
    if (t->wide)
        to->wide = p;
    else
        to->data = p;
    to->count = n;
    to->vocab_size = t->vocab_size;
    return CDDP_OK;
}

/* Here, below io/tokens.c which maps the files, so that the windows may release their shards. */
void cddp_tokens_free(cddp_tokens *t) {
    if (!t) return;
    if (t->map)
        munmap(t->map, t->map_bytes);
    else {
        cddp_free(t->data);
        cddp_free(t->wide);
    }
    memset(t, 0, sizeof *t);
}

int cddp_tokens_split(const cddp_tokens *all, double val_fraction, cddp_tokens *train,
                      cddp_tokens *val, cddp_error *err) {
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    if (!(val_fraction > 0 && val_fraction < 1))
        return cddp_error_set(err, CDDP_EINVAL, "the validation fraction is %g, not in (0, 1)",
                              val_fraction);
    int64_t n_train = (int64_t)((double)all->count * (1 - val_fraction));
    if (n_train < 1 || n_train >= all->count)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%" PRId64 " tokens cannot be split %g / %g: a part would be empty",
                              all->count, 1 - val_fraction, val_fraction);
    int rc = copy_tokens(all, 0, n_train, train, err);
    if (rc == CDDP_OK) rc = copy_tokens(all, n_train, all->count - n_train, val, err);
    if (rc != CDDP_OK) cddp_tokens_free(train);
    return rc;
}

typedef struct windows {
    cddp_tokens *shards;
    int64_t *first; /* shard k's windows are [first[k], first[k + 1]) */
    int count;
    int64_t block, stride;
} windows;

static int64_t windows_len(void *self) {
    windows *w = self;
    return w->first[w->count];
}

static int windows_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    (void)err;
    windows *w = self;
    int lo = 0, hi = w->count - 1; /* the last shard whose first window is at most i */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (w->first[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    const cddp_tokens *s = &w->shards[lo];
    int64_t at = (i - w->first[lo]) * w->stride, *x = out[0], *y = out[1];
    if (s->wide)
        for (int64_t j = 0; j < w->block; j++) {
            x[j] = s->wide[at + j];
            y[j] = s->wide[at + j + 1];
        }
    else
        for (int64_t j = 0; j < w->block; j++) {
            x[j] = s->data[at + j];
            y[j] = s->data[at + j + 1];
        }
    return CDDP_OK;
}

static void windows_destroy(void *self) {
    windows *w = self;
    for (int k = 0; w->shards && k < w->count; k++) cddp_tokens_free(&w->shards[k]);
    cddp_free(w->shards);
    cddp_free(w->first);
    cddp_free(w);
}

cddp_dataset *cddp_dataset_token_shards(cddp_tokens *shards, int count, int64_t block_size,
                                        int64_t stride, cddp_error *err) {
    windows *w = cddp_calloc(1, sizeof *w);
    if (w) {
        w->shards = cddp_calloc((size_t)CDDP_MAX(count, 1), sizeof *w->shards);
        w->first = cddp_calloc((size_t)CDDP_MAX(count, 0) + 1, sizeof *w->first);
    }
    if (!w || !w->shards || !w->first) { /* taken over all the same */
        for (int k = 0; k < count; k++) cddp_tokens_free(&shards[k]);
        if (w) windows_destroy(w);
        cddp_error_set(err, CDDP_ENOMEM, "token windows: out of memory");
        return NULL;
    }
    int64_t most = 0;
    for (int k = 0; k < count; k++) {
        w->shards[k] = shards[k];
        memset(&shards[k], 0, sizeof shards[k]);
        int64_t c = w->shards[k].count;
        most = CDDP_MAX(most, c);
        w->first[k + 1] = w->first[k] + (block_size >= 1 && stride >= 1 && c >= block_size + 1
                                             ? (c - block_size - 1) / stride + 1
                                             : 0);
    }
    w->count = count;
    w->block = block_size;
    w->stride = stride;
    if (block_size < 1 || stride < 1 || count < 1 || w->first[count] == 0) {
        if (block_size < 1 || stride < 1)
            cddp_error_set(err, CDDP_EINVAL,
                           "token windows: block_size %" PRId64 " and stride %" PRId64
                           " must be positive",
                           block_size, stride);
        else
            cddp_error_set(
                err, CDDP_EINVAL,
                "token windows: %s%" PRId64 " tokens, a window of %" PRId64
                " needs at least %" PRId64 " (use a longer text or a smaller block_size)",
                count > 1 ? "the longest shard holds " : "", most, block_size, block_size + 1);
        windows_destroy(w);
        return NULL;
    }
    cddp_field fields[2] = {{.name = "x", .dtype = CDDP_I64, .ndim = 1, .shape = {block_size}},
                            {.name = "y", .dtype = CDDP_I64, .ndim = 1, .shape = {block_size}}};
    static const cddp_dataset_ops ops = {windows_len, windows_get, windows_destroy};
    return cddp_dataset_create(&ops, w, 2, fields, err);
}

cddp_dataset *cddp_dataset_token_windows(const cddp_tokens *tokens, int64_t block_size,
                                         int64_t stride, cddp_error *err) {
    cddp_tokens copy;
    if (copy_tokens(tokens, 0, tokens->count, &copy, err) != CDDP_OK) return NULL;
    return cddp_dataset_token_shards(&copy, 1, block_size, stride, err);
}
