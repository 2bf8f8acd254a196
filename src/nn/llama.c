/* llama.c: a Llama-family transformer as Hugging Face's LlamaForCausalLM computes it (Llama 2 and
 * 3, TinyLlama, SmolLM, Mistral without its sliding window), as modules of modules.
 *
 *   LlamaForCausalLM            idx (B, T) -> logits (B, T, vocab)
 *     model
 *       embed_tokens  Embedding (vocab, C)
 *       layers        n_layer decoder layers, each pre-norm:
 *                       x = x + self_attn(input_layernorm(x))
 *                       x = x + mlp(post_attention_layernorm(x))
 *         self_attn   q_proj (C -> H D), k_proj, v_proj (C -> KV D), rotary positions on q and
 *                     k, causal attention with the KV key/value heads shared by H / KV query
 *                     heads each (grouped-query; 1: multi-query), o_proj (H D -> C); no biases
 *         mlp         down_proj(silu(gate_proj(x)) up_proj(x)) (SwiGLU; C -> I -> C)
 *       norm          RMSNorm (C)
 *     lm_head         Linear (C -> vocab) without bias, or the embedding itself (tied)
 *
 * Parameter names are Hugging Face's ("model.layers.0.self_attn.q_proj.weight", ...), so its
 * safetensors load by name and a checkpoint saved here is one transformers reads. The rotary
 * frequencies are a constant of the model, made once as transformers makes them (float32
 * theta^(-2i/D), or Llama 3's rope_scaling of them) and put on the device at each forward (D/2
 * floats). The initialisation is transformers' (normal, std 0.02; the norms ones).
 */
#include "nn/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct llama_state {
    cddp_llama_config g;
    float *inv_freq; /* D/2 */
} llama_state;

static cddp_module *child(const cddp_module *m, int i) {
    return cddp_module_child(m, i);
}

static cddp_tensor *run(const cddp_module *m, int i, cddp_ctx *ctx, cddp_tensor *x) {
    return cddp_module_forward(child(m, i), ctx, x);
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */

typedef struct rms_state {
    int64_t C;
    float eps;
} rms_state;

static int rms_declare(cddp_module *self) {
    const rms_state *s = cddp_module_state(self);
    int rc = cddp_module_param(self, "weight", 1, &s->C, (cddp_init){CDDP_INIT_CONSTANT, 1, 0});
    return rc < 0 ? rc : CDDP_OK;
}

static cddp_tensor *rms_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const rms_state *s = cddp_module_state(self);
    return cddp_rms_norm(ctx, x, cddp_module_get_param(self, 0), s->eps);
}

static const cddp_module_type rms_type = {"LlamaRMSNorm", rms_declare, rms_forward, free};

static cddp_module *rms_norm(int64_t C, float eps) {
    rms_state *s = malloc(sizeof *s);
    if (!s) return NULL;
    *s = (rms_state){C, eps};
    cddp_module *m = cddp_module_create(&rms_type, s);
    if (!m) free(s);
    return m;
}

/* ---- attention, MLP, decoder layer --------------------------------------------------------- */

/* The model's frequencies on x's device (a constant: no gradient). */
static cddp_tensor *frequencies(const llama_state *st, cddp_ctx *ctx, cddp_tensor *x) {
    int64_t half = st->g.n_embd / st->g.n_head / 2;
    return cddp_to(ctx, cddp_from_data(ctx, CDDP_F32, 1, &half, st->inv_freq), x->device);
}

static cddp_tensor *attention_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const llama_state *st = cddp_module_state(self);
    int64_t H = st->g.n_head, KV = st->g.n_kv_head;
    cddp_tensor *f = frequencies(st, ctx, x);
    cddp_tensor *q = cddp_rope(ctx, run(self, 0, ctx, x), f, H, 0);
    cddp_tensor *k = cddp_rope(ctx, run(self, 1, ctx, x), f, KV, 0);
    cddp_tensor *qkv = cddp_qkv_pack(ctx, q, k, run(self, 2, ctx, x), H, KV);
    return run(self, 3, ctx, cddp_attention(ctx, qkv, (int)H));
}

static const cddp_module_type attention_type = {"LlamaAttention", NULL, attention_forward, NULL};

static cddp_tensor *mlp_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    return run(self, 2, ctx, cddp_silu_mul(ctx, run(self, 0, ctx, x), run(self, 1, ctx, x)));
}

static const cddp_module_type mlp_type = {"LlamaMLP", NULL, mlp_forward, NULL};

static cddp_tensor *layer_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    x = cddp_add(ctx, x, run(self, 1, ctx, run(self, 0, ctx, x)));
    return cddp_add(ctx, x, run(self, 3, ctx, run(self, 2, ctx, x)));
}

static const cddp_module_type layer_type = {"LlamaDecoderLayer", NULL, layer_forward, NULL};

static cddp_module *decoder_layer(const llama_state *st) {
    const cddp_llama_config *g = &st->g;
    int64_t C = g->n_embd, D = C / g->n_head, I = g->intermediate_size;
    cddp_init w = {CDDP_INIT_NORMAL, 0, 0.02f};
    /* the attention reads the model's state (its frequencies), which the model frees */
    cddp_module *attn = cddp_module_create(&attention_type, (void *)st);
    cddp_module *mlp = cddp_module_create(&mlp_type, NULL);
    cddp_module *layer = cddp_module_create(&layer_type, NULL);
    bool ok =
        cddp__module_add_all(attn, (const char *[]){"q_proj", "k_proj", "v_proj", "o_proj"},
                             (cddp_module *[]){cddp_nn_linear_init(C, g->n_head * D, false, w),
                                               cddp_nn_linear_init(C, g->n_kv_head * D, false, w),
                                               cddp_nn_linear_init(C, g->n_kv_head * D, false, w),
                                               cddp_nn_linear_init(g->n_head * D, C, false, w)},
                             4);
    ok &= cddp__module_add_all(mlp, (const char *[]){"gate_proj", "up_proj", "down_proj"},
                               (cddp_module *[]){cddp_nn_linear_init(C, I, false, w),
                                                 cddp_nn_linear_init(C, I, false, w),
                                                 cddp_nn_linear_init(I, C, false, w)},
                               3);
    if (!ok) {
        cddp__module_free(attn);
        cddp__module_free(mlp);
        cddp__module_free(layer);
        return NULL;
    }
    if (!cddp__module_add_all(
            layer,
            (const char *[]){"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"},
            (cddp_module *[]){rms_norm(C, g->rms_norm_eps), attn, rms_norm(C, g->rms_norm_eps),
                              mlp},
            4)) {
        cddp__module_free(layer);
        return NULL;
    }
    return layer;
}

/* ---- the model ----------------------------------------------------------------------------- */

static cddp_tensor *model_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *idx) {
    const llama_state *st = cddp_module_state(self);
    CDDP_CHECK(idx->ndim == 2, "Llama: idx must be (B,T), got %d dimensions", idx->ndim);
    CDDP_CHECK(idx->shape[1] <= st->g.max_positions,
               "Llama: a sequence of %lld tokens is longer than max_positions %lld",
               (long long)idx->shape[1], (long long)st->g.max_positions);
    return run(self, 2, ctx, run(self, 1, ctx, run(self, 0, ctx, idx)));
}

static void free_state(void *p) {
    llama_state *st = p;
    if (st) free(st->inv_freq);
    free(st);
}

static const cddp_module_type model_type = {"LlamaModel", NULL, model_forward, free_state};

static cddp_tensor *causal_lm_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *idx) {
    cddp_module *model = child(self, 0);
    cddp_tensor *h = cddp_module_forward(model, ctx, idx);
    if (cddp_module_num_children(self) > 1) return run(self, 1, ctx, h);
    return cddp_linear(ctx, h, cddp_module_get_param(child(model, 0), 0), NULL); /* tied */
}

static int tied_declare(cddp_module *self) {
    return cddp_module_tie(self, "lm_head.weight", "model.embed_tokens.weight");
}

static const cddp_module_type causal_lm_type = {"LlamaForCausalLM", NULL, causal_lm_forward, NULL};
static const cddp_module_type causal_lm_tied_type = {"LlamaForCausalLM", tied_declare,
                                                     causal_lm_forward, NULL};

int cddp_llama_inv_freq(const cddp_llama_config *g, float *inv_freq) {
    int64_t D = g->n_embd / g->n_head;
    for (int64_t i = 0; i < D / 2; i++) { /* as transformers: in float32 */
        float f = 1.0f / powf((float)g->rope_theta, (float)(2 * i) / (float)D);
        if (g->rope_factor > 0) { /* Llama 3's: long wavelengths slowed, short ones kept */
            double low = (double)g->rope_original_max / g->rope_low_freq_factor;
            double high = (double)g->rope_original_max / g->rope_high_freq_factor;
            double wavelen = 2 * M_PI / f;
            if (wavelen > low) {
                f = (float)(f / g->rope_factor);
            } else if (wavelen >= high) {
                double smooth = ((double)g->rope_original_max / wavelen - g->rope_low_freq_factor) /
                                (g->rope_high_freq_factor - g->rope_low_freq_factor);
                f = (float)((1 - smooth) * f / g->rope_factor + smooth * f);
            }
        }
        inv_freq[i] = f;
    }
    return CDDP_OK;
}

cddp_module *cddp_nn_llama(const cddp_llama_config *config) {
    cddp_llama_config g = *config;
    if (g.n_kv_head == 0) g.n_kv_head = g.n_head;
    if (g.vocab_size <= 0 || g.max_positions <= 0 || g.n_layer <= 0 || g.n_head <= 0 ||
        g.n_embd <= 0 || g.intermediate_size <= 0 || g.n_kv_head <= 0 || g.n_embd % g.n_head ||
        (g.n_embd / g.n_head) % 2 || g.n_head % g.n_kv_head || !(g.rms_norm_eps > 0) ||
        !(g.rope_theta > 0))
        return NULL;
    llama_state *st = calloc(1, sizeof *st);
    if (st) st->inv_freq = malloc(sizeof(float) * (size_t)(g.n_embd / g.n_head / 2));
    if (!st || !st->inv_freq) {
        free_state(st);
        return NULL;
    }
    st->g = g;
    cddp_llama_inv_freq(&g, st->inv_freq);
    cddp_module *layers = cddp_nn_sequential();
    bool ok = layers != NULL;
    for (int64_t l = 0; l < g.n_layer && ok; l++)
        ok = cddp_module_add(layers, NULL, decoder_layer(st)) == CDDP_OK;
    cddp_module *model = cddp_module_create(&model_type, st);
    if (!model) free_state(st);
    if (!model || !ok) {
        cddp__module_free(layers);
        cddp__module_free(model);
        return NULL;
    }
    cddp_init w = {CDDP_INIT_NORMAL, 0, 0.02f};
    if (!cddp__module_add_all(model, (const char *[]){"embed_tokens", "layers", "norm"},
                              (cddp_module *[]){cddp_nn_embedding_init(g.vocab_size, g.n_embd, w),
                                                layers, rms_norm(g.n_embd, g.rms_norm_eps)},
                              3)) {
        cddp__module_free(model);
        return NULL;
    }
    cddp_module *lm =
        cddp_module_create(g.tie_embeddings ? &causal_lm_tied_type : &causal_lm_type, NULL);
    if (!cddp__module_add_all(lm, (const char *[]){"model"}, (cddp_module *[]){model}, 1) ||
        (!g.tie_embeddings &&
         cddp_module_add(lm, "lm_head", cddp_nn_linear_init(g.n_embd, g.vocab_size, false, w)) !=
             CDDP_OK)) {
        cddp__module_free(lm);
        return NULL;
    }
    return lm;
}

const cddp_module *cddp__llama_find(const cddp_module *m, const cddp_llama_config **config) {
    if (!m) return NULL;
    if (m->type == &causal_lm_type || m->type == &causal_lm_tied_type) {
        *config = &((const llama_state *)cddp_module_state(child(m, 0)))->g;
        return m;
    }
    for (int i = 0; i < m->nchildren; i++) {
        const cddp_module *l = cddp__llama_find(m->children[i], config);
        if (l) return l;
    }
    return NULL;
}

/* As the model's forward for idx (1, T) at positions past..past+T-1, each layer's attention
 * reading the earlier positions' keys and values (repeated for the heads that share them) from
 * caches[l] (1, L, 2 n_embd) and adding the new ones'. */
cddp_tensor *cddp__llama_forward_cached(const cddp_module *lm, cddp_ctx *ctx, cddp_tensor *idx,
                                        int64_t past, cddp_tensor *const *caches) {
    cddp_module *model = child(lm, 0), *layers = child(model, 1);
    const llama_state *st = cddp_module_state(model);
    int64_t H = st->g.n_head, KV = st->g.n_kv_head;
    cddp_tensor *x = run(model, 0, ctx, idx);
    cddp_tensor *f = x ? frequencies(st, ctx, x) : NULL;
    for (int l = 0; l < cddp_module_num_children(layers); l++) {
        cddp_module *layer = child(layers, l), *attn = child(layer, 1);
        cddp_tensor *h = run(layer, 0, ctx, x);
        cddp_tensor *q = cddp_rope(ctx, run(attn, 0, ctx, h), f, H, past);
        cddp_tensor *k = cddp_rope(ctx, run(attn, 1, ctx, h), f, KV, past);
        cddp_tensor *qkv = cddp_qkv_pack(ctx, q, k, run(attn, 2, ctx, h), H, KV);
        x = cddp_add(ctx, x,
                     run(attn, 3, ctx, cddp_attention_cached(ctx, qkv, (int)H, caches[l], past)));
        x = cddp_add(ctx, x, run(layer, 3, ctx, run(layer, 2, ctx, x)));
    }
    cddp_tensor *hf = run(model, 2, ctx, x);
    if (cddp_module_num_children(lm) > 1) return run(lm, 1, ctx, hf);
    return cddp_linear(ctx, hf, cddp_module_get_param(child(model, 0), 0), NULL);
}
