/* transformer.c: a GPT as nanoGPT and llm.c write it, as modules of modules.
 *
 *   GPT                      idx (B, T) -> logits (B, T, vocab)
 *     transformer
 *       wte  Embedding (vocab, C)      the tokens; also the language-model head (tied)
 *       wpe  Embedding (block, C)      the positions
 *       h    Sequential of n_layer Blocks, each pre-LN:
 *              x = x + attn(ln_1(x))   CausalSelfAttention: c_attn (C -> 3C), the fused causal
 *                                      attention, c_proj (C -> C)
 *              x = x + mlp(ln_2(x))    MLP: c_fc (C -> 4C), GELU (tanh), c_proj (4C -> C)
 *       ln_f LayerNorm (C)
 *     logits = ln_f(x) wte.weight^T    (the head is wte, used twice, so its gradient sums both
 *                                      uses and DDP reduces it once; "lm_head.weight" is its
 *                                      second name, cddp_module_tie)
 *
 * Names are nanoGPT's (transformer.h.0.attn.c_attn.weight, ...), so a checkpoint loads into a
 * PyTorch GPT of the same shape (whose lm_head.weight is the same tensor as wte's: checkpoints
 * hold it under both names). The
 * initialisation is GPT-2's: weights N(0, 0.02), biases zero, every residual projection
 * (c_proj) N(0, 0.02 / sqrt(2 n_layer)), LayerNorms ones and zeros.
 */
#include "nn/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static cddp_module *child(const cddp_module *m, int i) {
    return cddp_module_child(m, i);
}

static cddp_tensor *run(const cddp_module *m, int i, cddp_ctx *ctx, cddp_tensor *x) {
    return cddp_module_forward(child(m, i), ctx, x);
}

/* ---- attention, MLP, block ----------------------------------------------------------------*/

/* A Linear child's bias, or NULL when it has none (its weight is parameter 0). */
static cddp_tensor *bias_of(const cddp_module *linear) {
    return linear->nparams > 1 ? cddp_module_get_param(linear, 1) : NULL;
}

typedef struct heads {
    int n_head;
} heads;

/* c_attn's product and the attention as one op (cddp_qkv_attention: in mixed precision on a GPU
 * q, k and v are kept only in bf16, as the attention reads them) */
static cddp_tensor *attention_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const heads *h = cddp_module_state(self);
    cddp_module *qkv = child(self, 0);
    return run(self, 1, ctx,
               cddp_qkv_attention(ctx, x, cddp_module_get_param(qkv, 0), bias_of(qkv), h->n_head));
}

static const cddp_module_type attention_type = {"CausalSelfAttention", NULL, attention_forward,
                                                free};

/* c_proj's product takes GELU's output as one op (cddp_gelu_tanh_linear: in mixed precision GELU's
 * output is made only in bf16, for the product) */
static cddp_tensor *mlp_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    cddp_module *proj = child(self, 1);
    return cddp_gelu_tanh_linear(ctx, run(self, 0, ctx, x), cddp_module_get_param(proj, 0),
                                 bias_of(proj));
}

static const cddp_module_type mlp_type = {"MLP", NULL, mlp_forward, NULL};

static cddp_tensor *block_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    x = cddp_add(ctx, x, run(self, 1, ctx, run(self, 0, ctx, x)));
    return cddp_add(ctx, x, run(self, 3, ctx, run(self, 2, ctx, x)));
}

static const cddp_module_type block_type = {"Block", NULL, block_forward, NULL};

static cddp_module *block(const cddp_gpt_config *g) {
    int64_t C = g->n_embd;
    cddp_init w = {CDDP_INIT_NORMAL, 0, 0.02f};
    cddp_init proj = {CDDP_INIT_NORMAL, 0, 0.02f / sqrtf(2.0f * (float)g->n_layer)};
    heads *h = malloc(sizeof *h);
    if (h) h->n_head = (int)g->n_head;
    cddp_module *attn = h ? cddp_module_create(&attention_type, h) : NULL;
    cddp_module *mlp = cddp_module_create(&mlp_type, NULL);
    cddp_module *b = cddp_module_create(&block_type, NULL);
    bool ok = cddp__module_add_all(attn, (const char *[]){"c_attn", "c_proj"},
                                   (cddp_module *[]){cddp_nn_linear_init(C, 3 * C, true, w),
                                                     cddp_nn_linear_init(C, C, true, proj)},
                                   2);
    ok &= cddp__module_add_all(mlp, (const char *[]){"c_fc", "c_proj"},
                               (cddp_module *[]){cddp_nn_linear_init(C, 4 * C, true, w),
                                                 cddp_nn_linear_init(4 * C, C, true, proj)},
                               2);
    if (!ok) {
        cddp__module_free(attn);
        cddp__module_free(mlp);
        cddp__module_free(b);
        return NULL;
    }
    if (!cddp__module_add_all(
            b, (const char *[]){"ln_1", "attn", "ln_2", "mlp"},
            (cddp_module *[]){cddp_nn_layer_norm(C), attn, cddp_nn_layer_norm(C), mlp}, 4)) {
        cddp__module_free(b);
        return NULL;
    }
    return b;
}

/* ---- the GPT ----------------------------------------------------------------------------- */

/* The token and position embeddings of idx (B, T) at positions past..past+T-1: (B, T, C). */
static cddp_tensor *embed(cddp_module *tr, cddp_ctx *ctx, cddp_tensor *idx, int64_t past) {
    int64_t T = idx->shape[1];
    int64_t *at = cddp_arena_alloc(cddp_ctx_arena(ctx), (size_t)T * sizeof *at, NULL);
    if (!at) {
        cddp_ctx_fail(ctx, CDDP_ENOMEM, "GPT: out of memory for %lld positions", (long long)T);
        return NULL;
    }
    for (int64_t t = 0; t < T; t++) at[t] = past + t;
    cddp_tensor *pos = cddp_to(ctx, cddp_from_data(ctx, CDDP_I64, 1, &T, at), idx->device);
    return cddp_add(ctx, run(tr, 0, ctx, idx), run(tr, 1, ctx, pos));
}

/* idx (B, T) -> the final LayerNorm's output (B, T, C). */
static cddp_tensor *transformer_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *idx) {
    const cddp_gpt_config *g = cddp_module_state(self);
    CDDP_CHECK(idx->ndim == 2, "GPT: idx must be (B,T), got %d dimensions", idx->ndim);
    CDDP_CHECK(idx->shape[1] <= g->block_size,
               "GPT: a sequence of %lld tokens is longer than block_size %lld",
               (long long)idx->shape[1], (long long)g->block_size);
    return run(self, 3, ctx, run(self, 2, ctx, embed(self, ctx, idx, 0)));
}

static const cddp_module_type transformer_type = {"Transformer", NULL, transformer_forward, free};

static cddp_tensor *gpt_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *idx) {
    cddp_module *tr = child(self, 0);
    cddp_tensor *wte = cddp_module_get_param(child(tr, 0), 0);
    return cddp_linear(ctx, cddp_module_forward(tr, ctx, idx), wte, NULL);
}

/* The head's PyTorch name, so that nanoGPT's load_state_dict finds it. */
static int gpt_declare(cddp_module *self) {
    return cddp_module_tie(self, "lm_head.weight", "transformer.wte.weight");
}

static const cddp_module_type gpt_type = {"GPT", gpt_declare, gpt_forward, NULL};

/* ---- generation: the forward of new positions with a key/value cache --------------------- */

const cddp_module *cddp__gpt_find(const cddp_module *m, const cddp_gpt_config **config) {
    if (!m) return NULL;
    if (m->type == &gpt_type) {
        *config = cddp_module_state(child(m, 0));
        return m;
    }
    for (int i = 0; i < m->nchildren; i++) {
        const cddp_module *g = cddp__gpt_find(m->children[i], config);
        if (g) return g;
    }
    return NULL;
}

int cddp_model_gpt_config(const cddp_model *m, cddp_gpt_config *config) {
    const cddp_gpt_config *g = NULL;
    if (!m || !cddp__gpt_find(cddp_model_root(m), &g)) return CDDP_EINVAL;
    *config = *g;
    return CDDP_OK;
}

/* As gpt_forward for idx (1, T) at positions past..past+T-1, each block's attention reading the
 * earlier positions' keys and values from caches[l] and adding the new ones'. */
cddp_tensor *cddp__gpt_forward_cached(const cddp_module *gpt, cddp_ctx *ctx, cddp_tensor *idx,
                                      int64_t past, cddp_tensor *const *caches) {
    cddp_module *tr = child(gpt, 0), *h = child(tr, 2);
    cddp_tensor *x = embed(tr, ctx, idx, past);
    for (int l = 0; l < cddp_module_num_children(h); l++) {
        cddp_module *b = child(h, l), *attn = child(b, 1);
        const heads *hd = cddp_module_state(attn);
        cddp_tensor *qkv = run(attn, 0, ctx, run(b, 0, ctx, x));
        x = cddp_add(
            ctx, x,
            run(attn, 1, ctx, cddp_attention_cached(ctx, qkv, hd->n_head, caches[l], past)));
        x = cddp_add(ctx, x, run(b, 3, ctx, run(b, 2, ctx, x)));
    }
    cddp_tensor *wte = cddp_module_get_param(child(tr, 0), 0);
    return cddp_linear(ctx, run(tr, 3, ctx, x), wte, NULL);
}

cddp_module *cddp_nn_gpt(const cddp_gpt_config *config) {
    cddp_gpt_config g = *config;
    if (g.vocab_size <= 0 || g.block_size <= 0 || g.n_layer <= 0 || g.n_head <= 0 ||
        g.n_embd <= 0 || g.n_embd % g.n_head)
        return NULL;
    cddp_gpt_config *state = malloc(sizeof *state);
    if (!state) return NULL;
    *state = g;
    cddp_init w = {CDDP_INIT_NORMAL, 0, 0.02f};
    cddp_module *h = cddp_nn_sequential();
    bool ok = h != NULL;
    for (int64_t l = 0; l < g.n_layer && ok; l++)
        ok = cddp_module_add(h, NULL, block(&g)) == CDDP_OK;
    cddp_module *tr = cddp_module_create(&transformer_type, state);
    ok = cddp__module_add_all(ok ? tr : NULL, (const char *[]){"wte", "wpe", "h", "ln_f"},
                              (cddp_module *[]){cddp_nn_embedding_init(g.vocab_size, g.n_embd, w),
                                                cddp_nn_embedding_init(g.block_size, g.n_embd, w),
                                                h, cddp_nn_layer_norm(g.n_embd)},
                              4);
    cddp_module *gpt = cddp_module_create(&gpt_type, NULL);
    if (!cddp__module_add_all(ok ? gpt : NULL, (const char *[]){"transformer"},
                              (cddp_module *[]){tr}, 1)) {
        cddp__module_free(gpt);
        return NULL;
    }
    return gpt;
}
