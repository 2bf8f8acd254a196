/* gpt_weights.c: a GPT's weights from the files people have: cddp's checkpoints, nanoGPT's and
 * Hugging Face's safetensors, and llm.c's model files.
 *
 * One GPT, three layouts of its sixteen kinds of tensors:
 *   - cddp and nanoGPT: PyTorch's names ("transformer.h.0.attn.c_attn.weight", ...), linear
 *     weights (out, in) as nn.Linear keeps them, the head tied to wte ("lm_head.weight" the same
 *     tensor).
 *   - Hugging Face's GPT-2 (model.safetensors): the same names with or without "transformer."
 *     (GPT2LMHeadModel or GPT2Model), but c_attn, c_proj and c_fc are Conv1D modules whose weights
 *     are (in, out): the transpose. Each block also holds its causal mask ("attn.bias",
 *     "attn.masked_bias"), which is not a weight. The shape (n_head) is in config.json beside it,
 *     whose fields that change the computation (activation_function, layer_norm_epsilon, the
 *     attention's scaling, n_inner, model_type) must be GPT-2's: another is refused by name.
 *   - llm.c (gpt2_124M.bin): a header of 256 int32 (magic 20240326, version 3 for float32 or 5
 *     for bf16, max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size),
 *     then the tensors back to back in a fixed order, each layer's stacked: wte (Vp, C) with its
 *     rows past vocab_size zero, wpe (maxT, C), ln1w, ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C),
 *     attprojw (L, C, C), attprojb, ln2w, ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw
 *     (L, C, 4C), fcprojb (L, C), lnfw, lnfb (C): nn.Linear's orientation.
 *
 * A square matrix (c_proj of the attention) has the same shape in both orientations, so the
 * orientation is the file's, not the tensor's: it is read from c_attn's weight, (3C, C) or
 * (C, 3C), and every linear weight of the file must then have that orientation's shape.
 * Everything is read and checked before the model changes.
 */
#include "io/internal.h"

#include "cddp/device.h"

#include <cjson/cJSON.h>

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240326

/* ---- the kinds of tensors ------------------------------------------------------------------ */

/* A GPT's tensor kinds in llm.c's order; the per-layer ones with their name after "h.<l>.". */
/* clang-format off */
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, LNFW, LNFB,
       NKIND };
/* clang-format on */
/* Each kind's name after "transformer." (the whole GPT's) or after "transformer.h.<l>." */
static const char *const kind_names[NKIND] = {
    [WTE] = "wte.weight",         [WPE] = "wpe.weight",          [LN1W] = "ln_1.weight",
    [LN1B] = "ln_1.bias",         [QKVW] = "attn.c_attn.weight", [QKVB] = "attn.c_attn.bias",
    [APW] = "attn.c_proj.weight", [APB] = "attn.c_proj.bias",    [LN2W] = "ln_2.weight",
    [LN2B] = "ln_2.bias",         [FCW] = "mlp.c_fc.weight",     [FCB] = "mlp.c_fc.bias",
    [FPW] = "mlp.c_proj.weight",  [FPB] = "mlp.c_proj.bias",     [LNFW] = "ln_f.weight",
    [LNFB] = "ln_f.bias"};

static bool per_layer(int kind) {
    return kind != WTE && kind != WPE && kind != LNFW && kind != LNFB;
}

static bool is_matrix(int kind) {
    return kind == QKVW || kind == APW || kind == FCW || kind == FPW;
}

/* A parameter's name without "transformer." -> its kind and layer; -1 when it is none of them. */
static int kind_of(const char *name, int64_t *layer) {
    if (!strncmp(name, "transformer.", 12)) name += 12;
    *layer = 0;
    const char *rest = name;
    if (!strncmp(name, "h.", 2)) {
        char *end;
        long long l = strtoll(name + 2, &end, 10);
        if (end == name + 2 || *end != '.' || l < 0) return -1;
        *layer = l;
        rest = end + 1;
    }
    for (int k = 0; k < NKIND; k++)
        if (per_layer(k) == (rest != name) && !strcmp(rest, kind_names[k])) return k;
    return -1;
}

/* The kind's shape in nn.Linear's orientation, per layer. */
static int shape_of(int kind, const cddp_gpt_config *g, int64_t *shape) {
    int64_t C = g->n_embd;
    switch (kind) {
    case WTE:
        shape[0] = g->vocab_size, shape[1] = C;
        return 2;
    case WPE:
        shape[0] = g->block_size, shape[1] = C;
        return 2;
    case QKVW:
        shape[0] = 3 * C, shape[1] = C;
        return 2;
    case QKVB:
        shape[0] = 3 * C;
        return 1;
    case APW:
        shape[0] = C, shape[1] = C;
        return 2;
    case FCW:
        shape[0] = 4 * C, shape[1] = C;
        return 2;
    case FCB:
        shape[0] = 4 * C;
        return 1;
    case FPW:
        shape[0] = C, shape[1] = 4 * C;
        return 2;
    default:
        shape[0] = C;
        return 1;
    }
}

/* ---- the file ------------------------------------------------------------------------------ */

typedef struct source {
    const char *path;
    int fd;
    bool llmc;
    /* safetensors: one file, or a sharded checkpoint's files */
    cddp__st_files st;
    bool conv1d; /* Hugging Face's Conv1D orientation: linear weights (in, out) */
    /* llm.c */
    int version;  /* 3: float32, 5: bf16 */
    int64_t vpad; /* padded_vocab_size */
    uint64_t at[NKIND];
    cddp_gpt_config g; /* the file's shape (llm.c: its header) */
} source;

/* Tensor (kind, layer)'s name in nanoGPT's layout into name (cap bytes). */
static void full_name(int kind, int64_t layer, char *name, size_t cap) {
    if (per_layer(kind))
        snprintf(name, cap, "transformer.h.%" PRId64 ".%s", layer, kind_names[kind]);
    else
        snprintf(name, cap, "transformer.%s", kind_names[kind]);
}

/* Tensor (kind, layer) of a safetensors file, with or without "transformer."; NULL if none. */
static const cddp_st_tensor *find(const source *s, int kind, int64_t layer) {
    char name[160];
    full_name(kind, layer, name, sizeof name);
    const cddp_st_tensor *t = cddp__st_files_find(&s->st, name, NULL);
    return t ? t : cddp__st_files_find(&s->st, name + 12, NULL);
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* llm.c's header: the shape, and where each kind's block starts. */
static int llmc_open(source *s, cddp_error *err) {
    int32_t h[256];
    struct stat st;
    int rc = cddp__pread_all(s->fd, h, sizeof h, 0, s->path, err);
    if (rc) return rc;
    s->version = h[1];
    if (s->version != 3 && s->version != 5)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: llm.c model version %d; this reads 3 (float32) and 5 (bf16)",
                              s->path, h[1]);
    s->g = (cddp_gpt_config){
        .block_size = h[2], .vocab_size = h[3], .n_layer = h[4], .n_head = h[5], .n_embd = h[6]};
    s->vpad = h[7];
    if (h[2] < 1 || h[3] < 1 || h[4] < 1 || h[5] < 1 || h[6] < 1 || h[7] < h[3] || h[6] % h[5])
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: llm.c header with max_seq_len %d, vocab_size %d (padded %d), "
                              "%d layers, %d heads, %d channels: not a GPT",
                              s->path, h[2], h[3], h[7], h[4], h[5], h[6]);
    /* Each block's bytes, added up with every product checked: a damaged header's sizes can
     * multiply past 64 bits and wrap to a size that matches the file. */
    uint64_t at = 1024, elt = s->version == 3 ? 4 : 2;
    bool wraps = false;
    for (int k = 0; k < NKIND; k++) {
        int64_t shape[2];
        int nd = shape_of(k, &s->g, shape);
        if (k == WTE) shape[0] = s->vpad;
        uint64_t bytes = elt;
        for (int d = 0; d < nd; d++)
            wraps |= __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes);
        if (per_layer(k)) wraps |= __builtin_mul_overflow(bytes, (uint64_t)h[4], &bytes);
        s->at[k] = at;
        wraps |= __builtin_add_overflow(at, bytes, &at);
    }
    if (wraps)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: llm.c header with max_seq_len %d, vocab_size %d (padded %d), "
                              "%d layers, %d channels: a GPT of more than 2^64 bytes (a damaged "
                              "file?)",
                              s->path, h[2], h[3], h[7], h[4], h[6]);
    if (fstat(s->fd, &st) || (uint64_t)st.st_size != at)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: %lld bytes, but its header describes a GPT of %" PRIu64
                              " bytes (truncated, or not llm.c's layout)",
                              s->path, (long long)st.st_size, at);
    return CDDP_OK;
}

/* The file's orientation, from c_attn's weight of block 0. */
static int st_orientation(source *s, cddp_error *err) {
    const cddp_st_tensor *t = find(s, QKVW, 0);
    if (!t || t->ndim != 2)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s holds no 2-D h.0.attn.c_attn.weight: not a GPT's weights",
                              s->path);
    s->conv1d = t->shape[1] == 3 * t->shape[0];
    if (!s->conv1d && t->shape[0] != 3 * t->shape[1]) {
        char a[64];
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: h.0.attn.c_attn.weight is %s, neither (3C, C) nor (C, 3C)",
                              s->path, cddp_shape_str(t->ndim, t->shape, a, sizeof a));
    }
    return CDDP_OK;
}

static int source_open(source *s, const char *path, cddp_error *err) {
    *s = (source){.path = path, .fd = -1};
    size_t len = strlen(path);
    if (len >= 11 && !strcmp(path + len - 11, ".index.json")) { /* Hugging Face's shards */
        CDDP_TRY(cddp__st_files_open(&s->st, path, -1, err));
        return st_orientation(s, err);
    }
    if ((s->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return cddp_error_set(err, CDDP_EIO, "cannot open %s", path);
    int32_t magic = 0;
    if (pread(s->fd, &magic, sizeof magic, 0) == sizeof magic && magic == LLMC_MAGIC) {
        s->llmc = true;
        return llmc_open(s, err);
    }
    /* llm.c's other files start with magics of their own: named, not read as safetensors */
    if (magic == 20240328 || magic == 20240520)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s is llm.c's %s (magic %d), not a model's weights (llm.c's model "
                              "files start with %d)",
                              path, magic == 20240328 ? "tokenizer file" : "token file", magic,
                              LLMC_MAGIC);
    int rc = cddp__st_files_open(&s->st, path, s->fd, err);
    s->fd = -1; /* the set's now */
    if (rc == CDDP_EFORMAT && err) {
        char why[CDDP_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err->msg);
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s holds no GPT's weights: it is not llm.c's model file (it starts "
                              "with %d, not the magic %d), nor a safetensors file (%s)",
                              path, magic, LLMC_MAGIC, why);
    }
    CDDP_TRY(rc);
    return st_orientation(s, err);
}

static void source_close(source *s) {
    cddp__st_files_close(&s->st);
    if (s->fd >= 0) close(s->fd);
}

/* n float32 or bf16 values (llm.c's version 3 or 5) at byte at of llm.c's file into dst as
 * float32. */
static int read_llmc(const source *s, uint64_t at, bool bf16, float *dst, int64_t n,
                     cddp_error *err) {
    if (!bf16) return cddp__pread_all(s->fd, dst, (size_t)n * 4, at, s->path, err);
    uint16_t *h = malloc((size_t)n * 2);
    if (!h) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = cddp__pread_all(s->fd, h, (size_t)n * 2, at, s->path, err);
    for (int64_t i = 0; !rc && i < n; i++) dst[i] = bf16_to_f32(h[i]);
    free(h);
    return rc;
}

static bool is_float(cddp_dtype d) {
    return d == CDDP_F32 || d == CDDP_BF16 || d == CDDP_F16;
}

/* The n floats of a safetensors file's tensor t. */
static int read_tensor(const source *s, const cddp_st_tensor *t, float *dst, int64_t n,
                       cddp_error *err) {
    return cddp__st_files_read_f32(&s->st, t, dst, n, err);
}

/* Tensor (kind, layer) into dst (nn.Linear's orientation, numel floats), checked against g. */
static int fill(const source *s, const cddp_gpt_config *g, int kind, int64_t layer, float *dst,
                cddp_error *err) {
    int64_t want[2];
    int nd = shape_of(kind, g, want);
    int64_t n = numel_of(nd, want);
    if (s->llmc) {
        int64_t per = kind == WTE ? s->vpad * g->n_embd : n; /* a layer's share of the block */
        uint64_t at = s->at[kind] + (uint64_t)(layer * per) * (s->version == 3 ? 4u : 2u);
        return read_llmc(s, at, s->version == 5, dst, n, err);
    }
    const cddp_st_tensor *t = find(s, kind, layer);
    char name[160], a[64], b[64], c[64];
    full_name(kind, layer, name, sizeof name);
    if (!t) return cddp_error_set(err, CDDP_EFORMAT, "%s holds no %s", s->path, name);
    bool flip = s->conv1d && is_matrix(kind);
    int64_t file_want[2] = {flip ? want[1] : want[0], flip ? want[0] : want[1]};
    if (!is_float(t->dtype) || t->ndim != nd || numel_of(nd, t->shape) != n ||
        memcmp(t->shape, file_want, (size_t)nd * sizeof(int64_t)))
        return flip ? cddp_error_set(err, CDDP_EFORMAT,
                                     "%s: %s is %s %s, but this file keeps its linear weights as "
                                     "Hugging Face's Conv1D does, (in, out) (its "
                                     "h.0.attn.c_attn.weight says so): the model's %s would be "
                                     "stored as %s",
                                     s->path, t->name, cddp_dtype_name(t->dtype),
                                     cddp_shape_str(t->ndim, t->shape, a, sizeof a),
                                     cddp_shape_str(nd, want, b, sizeof b),
                                     cddp_shape_str(nd, file_want, c, sizeof c))
                    : cddp_error_set(err, CDDP_EFORMAT, "%s: %s is %s %s, but the model's is %s",
                                     s->path, t->name, cddp_dtype_name(t->dtype),
                                     cddp_shape_str(t->ndim, t->shape, a, sizeof a),
                                     cddp_shape_str(nd, want, b, sizeof b));
    float *into = dst;
    if (flip && !(into = malloc((size_t)n * sizeof(float))))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = read_tensor(s, t, into, n, err);
    if (flip) {
        for (int64_t i = 0; !rc && i < want[0]; i++) /* dst (out, in) from into (in, out) */
            for (int64_t j = 0; j < want[1]; j++) dst[i * want[1] + j] = into[j * want[0] + i];
        free(into);
    }
    return rc;
}

/* Every tensor of a safetensors file is a weight of this GPT, a mask, optimizer state of a
 * checkpoint, or the tied head equal to wte. */
static int st_check_extra(const source *s, const cddp_gpt_config *g, const float *wte,
                          cddp_error *err) {
    for (int i = 0; i < cddp__st_files_count(&s->st); i++) {
        const cddp_st_tensor *t = cddp__st_files_at(&s->st, i, NULL);
        const char *name = t->name, *rest = strncmp(name, "transformer.", 12) ? name : name + 12;
        int64_t layer;
        int kind = kind_of(name, &layer);
        if (kind >= 0 && layer < g->n_layer) continue;
        if (!strncmp(name, "optim.", 6)) continue;
        size_t len = strlen(rest);
        if (!strncmp(rest, "h.", 2) &&
            ((len > 10 && !strcmp(rest + len - 10, ".attn.bias")) ||
             (len > 17 && !strcmp(rest + len - 17, ".attn.masked_bias"))))
            continue; /* Hugging Face's causal masks */
        if (!strcmp(name, "lm_head.weight")) {
            int64_t n = g->vocab_size * g->n_embd;
            float *head = is_float(t->dtype) && numel_of(t->ndim, t->shape) == n
                              ? malloc((size_t)n * sizeof(float))
                              : NULL;
            int rc = head ? read_tensor(s, t, head, n, err) : CDDP_EFORMAT;
            bool same = rc == CDDP_OK && !memcmp(head, wte, (size_t)n * sizeof(float));
            free(head);
            if (same) continue;
            return rc != CDDP_OK && rc != CDDP_EFORMAT
                       ? rc
                       : cddp_error_set(err, CDDP_EFORMAT,
                                        "%s: lm_head.weight is not transformer.wte.weight: "
                                        "cddp's GPT ties its head to the token embedding",
                                        s->path);
        }
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s holds %s, which a GPT of %" PRId64
                              " layers has not (a larger model's weights?)",
                              s->path, name, g->n_layer);
    }
    return CDDP_OK;
}

/* ---- the shape ------------------------------------------------------------------------------ */

int cddp__meta_sizes(const cddp_safetensors *f, const char *path, const char *const *keys,
                     int64_t *const *at, int n, cddp_error *err) {
    for (int i = 0; i < n; i++) {
        const char *v = cddp_safetensors_meta(f, keys[i]);
        char what[4200];
        snprintf(what, sizeof what, "%s: %s", path, keys[i]);
        if (!v)
            return cddp_error_set(err, CDDP_EFORMAT, "%s: no %s in its metadata", path, keys[i]);
        CDDP_TRY(cddp_parse_int(what, v, 1, 1 << 24, at[i], err));
    }
    return CDDP_OK;
}

static int from_meta(const cddp_safetensors *f, const char *path, cddp_gpt_config *g,
                     cddp_error *err) {
    const char *keys[] = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"};
    int64_t *at[] = {&g->vocab_size, &g->block_size, &g->n_layer, &g->n_head, &g->n_embd};
    return cddp__meta_sizes(f, path, keys, at, 5, err);
}

/* The fields of GPT-2's config.json that change what the model computes, each as cddp's GPT
 * computes it or refused by name: a model of another activation, LayerNorm epsilon or attention
 * scaling would load with logits up to 0.4 off, silently. (Dropout does not change the forward
 * pass; cddp's GPT trains without it.) */
static int hf_fields(const cJSON *root, const char *json, int64_t width, cddp_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "gpt2") != 0)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: model_type %s: cddp's GPT is GPT-2's (model_type gpt2)", json,
                              type->valuestring);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    if (act && !(cJSON_IsString(act) && (strcmp(act->valuestring, "gelu_new") == 0 ||
                                         strcmp(act->valuestring, "gelu_pytorch_tanh") == 0 ||
                                         strcmp(act->valuestring, "gelu_fast") == 0)))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: activation_function %s: cddp's GPT computes GELU's tanh "
                              "approximation (gelu_new, GPT-2's), and would give this model other "
                              "outputs",
                              json, cJSON_IsString(act) ? act->valuestring : "(not a string)");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    if (eps && !(cJSON_IsNumber(eps) && fabs(eps->valuedouble - 1e-5) <= 1e-12))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: layer_norm_epsilon %g: cddp's GPT normalises with GPT-2's 1e-05",
                              json, cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    static const struct {
        const char *key;
        bool want;
        const char *what;
    } flags[] = {{"scale_attn_weights", true, "scales the attention by 1/sqrt(head size)"},
                 {"scale_attn_by_inverse_layer_idx", false, "does not scale by layer"},
                 {"add_cross_attention", false, "has no cross-attention"}};
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, flags[k].key);
        if (f && !cJSON_IsNull(f) && !(cJSON_IsBool(f) && cJSON_IsTrue(f) == flags[k].want))
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: %s is %s, where cddp's GPT, as GPT-2, %s (%s %s)", json,
                                  flags[k].key, cJSON_IsTrue(f) ? "true" : "not true",
                                  flags[k].what, flags[k].key, flags[k].want ? "true" : "false");
    }
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (inner && !cJSON_IsNull(inner) &&
        !(cJSON_IsNumber(inner) && width > 0 && inner->valuedouble == 4.0 * (double)width))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: n_inner %g: cddp's GPT has an MLP of 4 n_embd (%" PRId64 ")",
                              json, cJSON_IsNumber(inner) ? inner->valuedouble : NAN, 4 * width);
    return CDDP_OK;
}

/* n_head from Hugging Face's config.json beside path into *heads; 0 when there is no such file.
 * A config.json that cannot be read, is not JSON or names no head count is refused by name: its
 * weights would otherwise load with a head count of the caller's guess; so is one whose fields
 * ask for another computation than cddp's GPT (hf_fields; width: the model's n_embd). */
static int hf_config(const char *path, int64_t width, int64_t *heads, cddp_error *err) {
    char json[4200];
    const char *slash = strrchr(path, '/');
    snprintf(json, sizeof json, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
    *heads = 0;
    FILE *f = fopen(json, "rb");
    if (!f) return CDDP_OK;
    char *text = malloc(1 << 20);
    size_t n = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    bool failed = ferror(f);
    fclose(f);
    if (!text) return cddp_error_set(err, CDDP_ENOMEM, "out of memory for %s", json);
    text[n] = '\0';
    cJSON *root = failed ? NULL : cJSON_Parse(text);
    free(text);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "n_head");
    if (!cJSON_IsNumber(h)) h = cJSON_GetObjectItemCaseSensitive(root, "num_attention_heads");
    if (cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble <= 1 << 20 &&
        h->valuedouble == (double)(int64_t)h->valuedouble)
        *heads = (int64_t)h->valuedouble;
    int rc = *heads   ? hf_fields(root, json, width, err)
             : failed ? cddp_error_set(err, CDDP_EIO, "cannot read %s", json)
             : !cJSON_IsObject(root)
                 ? cddp_error_set(err, CDDP_EFORMAT,
                                  "%s is not a JSON object (damaged?): the GPT's head count "
                                  "comes from it; repair it, or remove it and give n_head",
                                  json)
                 : cddp_error_set(err, CDDP_EFORMAT,
                                  "%s has no n_head (nor num_attention_heads) of 1 or more: the "
                                  "GPT's head count comes from it; repair it, or remove it and "
                                  "give n_head",
                                  json);
    if (rc != CDDP_OK) *heads = 0;
    cJSON_Delete(root);
    return rc;
}

/* A safetensors file without cddp's metadata: the shape from its tensors. */
static int from_tensors(const source *s, cddp_gpt_config *g, cddp_error *err) {
    const cddp_st_tensor *wte = find(s, WTE, 0), *wpe = find(s, WPE, 0);
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1])
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: no 2-D wte.weight and wpe.weight of one width: not a GPT's "
                              "weights",
                              s->path);
    int64_t layers = 0, layer;
    for (int i = 0; i < cddp__st_files_count(&s->st); i++)
        if (kind_of(cddp__st_files_at(&s->st, i, NULL)->name, &layer) >= 0 && layer + 1 > layers)
            layers = layer + 1;
    int64_t heads;
    int rc = hf_config(s->path, wte->shape[1], &heads, err);
    if (rc) return rc;
    *g = (cddp_gpt_config){.vocab_size = wte->shape[0],
                           .block_size = wpe->shape[0],
                           .n_layer = layers,
                           .n_head = heads ? heads : g->n_head,
                           .n_embd = wte->shape[1]};
    if (g->n_head < 1)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s does not say how many heads its GPT has, and none was given: "
                              "put its config.json (Hugging Face's, with n_head) beside it, or "
                              "give the head count (gpt_train and gpt_generate: --n_head N; "
                              "GPT-2 124M has 12)",
                              s->path);
    return CDDP_OK;
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int cddp_gpt_config_read(const char *path, cddp_gpt_config *g, cddp_error *err) {
    cddp_gpt_config out = *g;
    char file[4200];
    path = cddp__hf_weights_file(path, file, sizeof file);
    int rc;
    if (is_dir(path)) { /* a checkpoint set */
        cddp_safetensors *f = cddp_checkpoint_metadata(path, err);
        if (!f) return err && err->code ? err->code : CDDP_EFORMAT;
        rc = from_meta(f, path, &out, err);
        cddp_safetensors_destroy(f);
    } else {
        source s;
        rc = source_open(&s, path, err);
        if (!rc && s.llmc)
            out = s.g;
        else if (!rc && cddp_safetensors_meta(s.st.index[0], "n_layer"))
            rc = from_meta(s.st.index[0], path, &out, err);
        else if (!rc)
            rc = from_tensors(&s, &out, err);
        source_close(&s);
    }
    if (!rc && out.n_embd % out.n_head)
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s: n_embd %" PRId64 " is not a multiple of n_head %" PRId64, path,
                            out.n_embd, out.n_head);
    if (!rc) *g = out;
    return rc;
}

/* ---- the weights ---------------------------------------------------------------------------- */

static int same_shape(const source *s, const cddp_gpt_config *g, cddp_error *err) {
    const char *keys[] = {"vocab_size", "block_size (max_seq_len)", "n_layer", "n_head", "n_embd"};
    const int64_t file[] = {s->g.vocab_size, s->g.block_size, s->g.n_layer, s->g.n_head,
                            s->g.n_embd};
    const int64_t model[] = {g->vocab_size, g->block_size, g->n_layer, g->n_head, g->n_embd};
    for (int i = 0; i < 5; i++)
        if (file[i] != model[i])
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s is a GPT of %s %" PRId64 ", but the model's is %" PRId64,
                                  s->path, keys[i], file[i], model[i]);
    return CDDP_OK;
}

/* Every value of a tensor just read is a number: a NaN or an infinity in a file of weights makes
 * the first step's loss NaN, far from its cause. The tensor is named with the first such value. */
int cddp_gpt_load_weights(cddp_model *m, const char *path, cddp_error *err) {
    char file[4200];
    path = cddp__hf_weights_file(path, file, sizeof file);
    cddp_gpt_config g;
    if (cddp_model_gpt_config(m, &g) != CDDP_OK)
        return cddp_error_set(err, CDDP_EINVAL, "cddp_gpt_load_weights: the model holds no GPT");
    if (is_dir(path)) return cddp_checkpoint_load(path, m, NULL, NULL, err);
    source s;
    int rc = source_open(&s, path, err);
    if (!rc && s.llmc) rc = same_shape(&s, &g, err);
    int64_t heads = 0; /* Hugging Face's files: what config.json beside them says */
    if (!rc && !s.llmc && !cddp_safetensors_meta(s.st.index[0], "n_layer"))
        rc = hf_config(path, g.n_embd, &heads, err);
    if (!rc && heads && heads != g.n_head)
        rc = cddp_error_set(err, CDDP_EINVAL,
                            "%s: its config.json says %" PRId64 " heads, but the model has %" PRId64
                            ": build the GPT with n_head %" PRId64
                            " (cddp_gpt_config_read reads it)",
                            path, heads, g.n_head, heads);
    size_t numel = cddp_model_numel(m);
    float *flat = rc ? NULL : malloc(numel * sizeof(float));
    if (!rc && !flat) rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory for the weights");
    float *wte = NULL;
    for (int i = 0; !rc && i < cddp_model_num_params(m); i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        const char *gpt_name = strstr(p->name, "transformer.");
        int64_t layer = 0, shape[2];
        int kind = gpt_name ? kind_of(gpt_name, &layer) : -1;
        if (kind < 0 || p->numel != numel_of(shape_of(kind, &g, shape), shape)) {
            rc = cddp_error_set(err, CDDP_EINVAL,
                                "cddp_gpt_load_weights: the model's parameter %s is not one of "
                                "its GPT's",
                                p->name);
            break;
        }
        float *dst = flat + cddp_model_param_offset(m, i);
        if (kind == WTE) wte = dst;
        rc = fill(&s, &g, kind, layer, dst, err);
        if (!rc) rc = cddp__check_finite(s.path, p->name, dst, p->numel, err);
    }
    if (!rc && !s.llmc) rc = st_check_extra(&s, &g, wte, err);
    source_close(&s);
    cddp_device *dev = cddp_model_device(m);
    if (!rc && cddp_device_host_accessible(dev))
        memcpy(cddp_model_data(m), flat, numel * sizeof(float));
    else if (!rc)
        rc = cddp_device_upload(dev, cddp_model_data(m), flat, numel * sizeof(float), err);
    free(flat);
    return rc;
}
