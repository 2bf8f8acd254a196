/* windows.c: a text's tokens as a language model's samples, and the train/validation split
 * (cddp/data.h). A window is fetched by copying block_size + 1 tokens out of one array, so the
 * dataset costs the text's size and nothing per window. */
#include "cddp/core.h"
#include "cddp/data.h"

#include <inttypes.h>
#include <string.h>

static int copy_tokens(const uint16_t *from, int64_t n, cddp_tokens *to, cddp_error *err) {
    to->data = cddp_malloc(n ? (size_t)n * sizeof *to->data : 1);
    if (!to->data) return cddp_error_set(err, CDDP_ENOMEM, "cannot allocate %" PRId64 " tokens", n);
    if (n) memcpy(to->data, from, (size_t)n * sizeof *to->data);
    to->count = n;
    return CDDP_OK;
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
    int rc = copy_tokens(all->data, n_train, train, err);
    if (rc == CDDP_OK) rc = copy_tokens(all->data + n_train, all->count - n_train, val, err);
    if (rc != CDDP_OK) {
        cddp_free(train->data);
        memset(train, 0, sizeof *train);
    }
    return rc;
}

typedef struct windows {
    cddp_tokens tokens;
    int64_t block, stride, n;
} windows;

static int64_t windows_len(void *self) {
    return ((windows *)self)->n;
}

static int windows_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    (void)err;
    windows *w = self;
    const uint16_t *t = w->tokens.data + i * w->stride;
    int64_t *x = out[0], *y = out[1];
    for (int64_t j = 0; j < w->block; j++) {
        x[j] = t[j];
        y[j] = t[j + 1];
    }
    return CDDP_OK;
}

static void windows_destroy(void *self) {
    windows *w = self;
    cddp_free(w->tokens.data);
    cddp_free(w);
}

cddp_dataset *cddp_dataset_token_windows(const cddp_tokens *tokens, int64_t block_size,
                                         int64_t stride, cddp_error *err) {
    if (block_size < 1 || stride < 1) {
        cddp_error_set(err, CDDP_EINVAL,
                       "token windows: block_size %" PRId64 " and stride %" PRId64
                       " must be positive",
                       block_size, stride);
        return NULL;
    }
    if (tokens->count < block_size + 1) {
        cddp_error_set(err, CDDP_EINVAL,
                       "token windows: %" PRId64 " tokens, a window of %" PRId64
                       " needs at least %" PRId64 " (use a longer text or a smaller block_size)",
                       tokens->count, block_size, block_size + 1);
        return NULL;
    }
    windows *w = cddp_calloc(1, sizeof *w);
    if (!w || copy_tokens(tokens->data, tokens->count, &w->tokens, err) != CDDP_OK) {
        cddp_free(w);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory for %" PRId64 " tokens", tokens->count);
        return NULL;
    }
    w->block = block_size;
    w->stride = stride;
    w->n = (tokens->count - block_size - 1) / stride + 1;
    cddp_field fields[2] = {{.name = "x", .dtype = CDDP_I64, .ndim = 1, .shape = {block_size}},
                            {.name = "y", .dtype = CDDP_I64, .ndim = 1, .shape = {block_size}}};
    static const cddp_dataset_ops ops = {windows_len, windows_get, windows_destroy};
    return cddp_dataset_create(&ops, w, 2, fields, err);
}
