/* generate.c: text from a GPT or a Llama, a token at a time.
 *
 * Every step feeds the model the positions it has not seen: the whole prompt first, then the one
 * token drawn last. Each block's attention keeps the keys and values of the positions before in a
 * cache of its own (1, block_size, 2 n_embd) on the model's device (cddp_attention_cached), so a
 * step's cost is that of one position plus its attention over the cache, where recomputing the
 * prefix costs the whole context every time. When the text outgrows block_size the window slides,
 * every position's embedding changes, and each step recomputes the window, as nanoGPT's generate
 * does (the tokens drawn are the same with the cache and without it).
 *
 * A Llama (cddp_nn_llama) caches its keys and values as the GPT does, the key/value heads
 * repeated for the query heads that share them; its cache holds the positions this generation
 * reaches (prompt and new tokens, at most max_positions), not the whole context a Llama 3 allows.
 *
 * The draw: softmax(logits / temperature) over the top_k likeliest tokens (the others get
 * probability 0), the token where the running sum passes a uniform draw times the total, as
 * nanoGPT's torch.multinomial; temperature 0 takes the first likeliest token.
 */
#include "nn/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

cddp_gpt_sampling cddp_gpt_sampling_defaults(void) {
    return (cddp_gpt_sampling){.temperature = 1.0f};
}

static int by_value_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The next token from one row of logits; p and sorted: V floats of scratch. */
static int64_t draw(const float *logits, int64_t V, const cddp_gpt_sampling *s, cddp_rng *rng,
                    float *p, float *sorted) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (s->temperature == 0) return best;
    float top = logits[best], floor = -INFINITY;
    if (s->top_k > 0 && s->top_k < V) {
        memcpy(sorted, logits, sizeof(float) * (size_t)V);
        qsort(sorted, (size_t)V, sizeof(float), by_value_desc);
        floor = sorted[s->top_k - 1];
    }
    double z = 0;
    for (int64_t v = 0; v < V; v++) {
        p[v] = logits[v] < floor ? 0.0f : expf((logits[v] - top) / s->temperature);
        z += p[v];
    }
    double u = cddp_rng_uniform(rng) * z, acc = 0;
    for (int64_t v = 0; v < V; v++)
        if ((acc += p[v]) > u && p[v] > 0) return v;
    return best; /* u rounded up to the total */
}

/* The generation's state: the text so far, the caches and the scratch of the draw. */
typedef struct gen {
    const cddp_module *gpt;
    bool llama; /* gpt is a Llama */
    int64_t cache_rows;
    const cddp_gpt_config *g;
    cddp_ctx *ctx, *own_ctx, *cache_ctx;
    cddp_tensor **caches;
    int64_t *ids, len, past; /* past: the positions the caches hold */
    float *p, *sorted, *row;
} gen;

/* The logits of the next token after ids[0..len) into *row, on the host (s->row or the tensor's
 * data). */
static int next_logits(gen *s, bool no_cache, const float **row, cddp_error *err) {
    int64_t block = s->g->block_size, V = s->g->vocab_size;
    int64_t from = s->len > block ? s->len - block : 0; /* the window nanoGPT takes */
    cddp_ctx_reset(s->ctx);
    cddp_tensor *logits;
    if (no_cache) {
        logits = cddp_module_forward(
            (cddp_module *)s->gpt, s->ctx,
            cddp_from_host(s->ctx, CDDP_I64, 2, (int64_t[]){1, s->len - from}, s->ids + from));
    } else {
        if (from > 0) s->past = 0; /* the window slid: every position moved */
        int64_t start = from + s->past, T = s->len - start;
        cddp_tensor *idx = cddp_from_host(s->ctx, CDDP_I64, 2, (int64_t[]){1, T}, s->ids + start);
        logits = s->llama ? cddp__llama_forward_cached(s->gpt, s->ctx, idx, s->past, s->caches)
                          : cddp__gpt_forward_cached(s->gpt, s->ctx, idx, s->past, s->caches);
        s->past += T;
    }
    if (!logits) return cddp_error_set(err, cddp_ctx_status(s->ctx), "%s", cddp_ctx_error(s->ctx));
    const float *last = cddp_f32(logits) + (logits->shape[1] - 1) * V;
    *row = last;
    if (cddp_device_host_accessible(logits->device)) return CDDP_OK;
    *row = s->row;
    return cddp_device_download(logits->device, s->row, last, sizeof(float) * (size_t)V, err);
}

static int check_args(const cddp_gpt_config *g, const int64_t *prompt, int64_t n_prompt, int64_t n,
                      const cddp_gpt_sampling *s, const int64_t *out, cddp_error *err) {
    if (!g)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_generate: the model holds no GPT (cddp_nn_gpt) nor Llama "
                              "(cddp_nn_llama)");
    if (n_prompt < 1 || !prompt)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_generate: the prompt needs at least one token (a newline, "
                              "for text from nothing)");
    if (n < 0 || (n > 0 && !out) || n > ((int64_t)1 << 40) || n_prompt > ((int64_t)1 << 40))
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_generate: %lld tokens to generate after %lld, into %s "
                              "(at most 2^40 each)",
                              (long long)n, (long long)n_prompt, out ? "out" : "no out");
    if (!(s->temperature >= 0) || !isfinite(s->temperature) || s->top_k < 0)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_generate: temperature %g and top_k %lld: the temperature "
                              "must be finite and >= 0, top_k >= 0",
                              (double)s->temperature, (long long)s->top_k);
    if (s->stop && (s->stop_token < 0 || s->stop_token >= g->vocab_size))
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_generate: stop token %lld is outside the model's "
                              "vocabulary of %lld",
                              (long long)s->stop_token, (long long)g->vocab_size);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= g->vocab_size)
            return cddp_error_set(err, CDDP_EINVAL,
                                  "cddp_gpt_generate: prompt token %lld is %lld, outside the "
                                  "model's vocabulary of %lld",
                                  (long long)i, (long long)prompt[i], (long long)g->vocab_size);
    return CDDP_OK;
}

static int setup(gen *s, cddp_model *m, cddp_ctx *ctx, const int64_t *prompt, int64_t n_prompt,
                 int64_t n, bool no_cache, cddp_error *err) {
    const cddp_gpt_config *g = s->g;
    int64_t V = g->vocab_size;
    s->ids = malloc(sizeof(int64_t) * (size_t)(n_prompt + n));
    s->p = malloc(sizeof(float) * (size_t)V);
    s->sorted = malloc(sizeof(float) * (size_t)V);
    s->row = malloc(sizeof(float) * (size_t)V);
    if (!s->ids || !s->p || !s->sorted || !s->row)
        return cddp_error_set(err, CDDP_ENOMEM, "cddp_gpt_generate: out of memory");
    memcpy(s->ids, prompt, sizeof(int64_t) * (size_t)n_prompt);
    s->len = n_prompt;
    cddp_device *dev = cddp_model_device(m);
    if (!ctx && !(ctx = s->own_ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev})))
        return cddp_error_set(err, CDDP_ENOMEM, "cddp_gpt_generate: out of memory");
    s->ctx = ctx;
    if (cddp_ctx_device(ctx) != dev)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_generate: the context is on %s but the model on %s",
                              cddp_device_name(cddp_ctx_device(ctx)), cddp_device_name(dev));
    if (no_cache) return CDDP_OK; /* the whole context each time: no cache to keep */
    size_t bytes = (size_t)g->n_layer * (size_t)(s->cache_rows * 2 * g->n_embd) * sizeof(float);
    if (!(s->caches = calloc((size_t)g->n_layer, sizeof *s->caches)))
        return cddp_error_set(err, CDDP_ENOMEM, "cddp_gpt_generate: out of memory");
    s->cache_ctx = cddp_ctx_create(&(cddp_ctx_options){
        .device = dev, .arena_initial_bytes = bytes + 4096 * (size_t)(g->n_layer + 1)});
    if (!s->cache_ctx) return cddp_error_set(err, CDDP_ENOMEM, "cddp_gpt_generate: out of memory");
    for (int64_t l = 0; l < g->n_layer; l++)
        s->caches[l] =
            cddp_empty(s->cache_ctx, CDDP_F32, 3, (int64_t[]){1, s->cache_rows, 2 * g->n_embd});
    if (cddp_ctx_failed(s->cache_ctx))
        return cddp_error_set(err, cddp_ctx_status(s->cache_ctx),
                              "cddp_gpt_generate: the key/value cache (%zu bytes): %s", bytes,
                              cddp_ctx_error(s->cache_ctx));
    return CDDP_OK;
}

int cddp_gpt_generate(cddp_model *m, cddp_ctx *ctx, const int64_t *prompt, int64_t n_prompt,
                      int64_t n, const cddp_gpt_sampling *sampling, cddp_rng *rng, int64_t *out,
                      cddp_error *err) {
    cddp_gpt_sampling s = sampling ? *sampling : cddp_gpt_sampling_defaults();
    gen st = {0};
    st.gpt = m ? cddp__gpt_find(cddp_model_root(m), &st.g) : NULL;
    const cddp_llama_config *lc = NULL;
    cddp_gpt_config lg;
    if (!st.gpt && m && (st.gpt = cddp__llama_find(cddp_model_root(m), &lc))) {
        lg = (cddp_gpt_config){.vocab_size = lc->vocab_size,
                               .block_size = lc->max_positions,
                               .n_layer = lc->n_layer,
                               .n_head = lc->n_head,
                               .n_embd = lc->n_embd};
        st.g = &lg;
        st.llama = true;
    }
    if (st.gpt) /* a Llama's context may be long: its cache holds what this generation reaches */
        st.cache_rows =
            st.llama && n_prompt + n < st.g->block_size ? n_prompt + n : st.g->block_size;
    int rc = check_args(st.gpt ? st.g : NULL, prompt, n_prompt, n, &s, out, err);
    if (rc != CDDP_OK) return rc;
    cddp_rng own_rng;
    if (!rng) cddp_rng_seed(rng = &own_rng, 0);
    bool training = cddp_model_training(m);
    rc = setup(&st, m, ctx, prompt, n_prompt, n, s.no_cache, err);
    bool grad = st.ctx ? cddp_ctx_set_grad_enabled(st.ctx, false) : false;
    cddp_model_set_training(m, false);
    for (int64_t k = 0; k < n && rc == CDDP_OK; k++) {
        const float *logits = NULL;
        if ((rc = next_logits(&st, s.no_cache, &logits, err)) != CDDP_OK) break;
        int64_t tok = draw(logits, st.g->vocab_size, &s, rng, st.p, st.sorted);
        st.ids[st.len++] = out[k] = tok;
        if (s.on_token) s.on_token(tok, s.user);
        if (s.stop && tok == s.stop_token) { /* the end of the text: nothing after it */
            for (int64_t j = k + 1; j < n; j++) out[j] = -1;
            break;
        }
    }
    cddp_model_set_training(m, training);
    if (st.ctx) {
        cddp_ctx_reset(st.ctx);
        cddp_ctx_set_grad_enabled(st.ctx, grad);
    }
    cddp_ctx_destroy(st.own_ctx);
    cddp_ctx_destroy(st.cache_ctx);
    free(st.ids);
    free(st.p);
    free(st.sorted);
    free(st.row);
    free(st.caches);
    return rc;
}
