/* llama_config.c: a Llama-family model's shape from Hugging Face's config.json
 * (cddp/checkpoint.h).
 *
 * Every field that changes what the model computes is honoured or refused by name: a model
 * loaded with a field ignored would give other logits, silently. Honoured: the sizes, the
 * key/value heads, rms_norm_eps, rope_theta, Llama 3's rope_scaling, tie_word_embeddings.
 * Refused unless they hold what cddp computes: hidden_act (silu), attention_bias and mlp_bias
 * (false), head_dim (hidden_size / num_attention_heads), another rope_scaling type,
 * sliding_window (Mistral's, when smaller than the positions), model_type other than llama and
 * mistral. Dropout fields do not change the forward pass and are read as nothing.
 */
#include "cddp/checkpoint.h"
#include "io/internal.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const cJSON *field(const cJSON *root, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNull(j) ? NULL : j;
}

/* A positive integer field into *v (required: absent is an error; else left as it is). */
static int int_field(const cJSON *root, const char *key, bool required, int64_t *v,
                     const char *json, cddp_error *err) {
    const cJSON *j = field(root, key);
    if (!j && !required) return CDDP_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 1 && j->valuedouble < 1e12) ||
        j->valuedouble != (double)(int64_t)j->valuedouble)
        return cddp_error_set(err, CDDP_EFORMAT, "%s: %s %s (a positive integer is needed)", json,
                              key, j ? "is not a positive integer" : "is missing");
    *v = (int64_t)j->valuedouble;
    return CDDP_OK;
}

static int num_field(const cJSON *root, const char *key, double *v, const char *json,
                     cddp_error *err) {
    const cJSON *j = field(root, key);
    if (!j) return CDDP_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble > 0))
        return cddp_error_set(err, CDDP_EFORMAT, "%s: %s is not a positive number", json, key);
    *v = j->valuedouble;
    return CDDP_OK;
}

static int scaling(const cJSON *root, cddp_llama_config *g, const char *json, cddp_error *err) {
    const cJSON *s = field(root, "rope_scaling");
    if (!s) return CDDP_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "llama3") != 0)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: rope_scaling of type %s: cddp computes Llama 3's (llama3) "
                              "and none",
                              json, cJSON_IsString(type) ? type->valuestring : "(none)");
    g->rope_factor = g->rope_low_freq_factor = g->rope_high_freq_factor = 0;
    CDDP_TRY(num_field(s, "factor", &g->rope_factor, json, err));
    CDDP_TRY(num_field(s, "low_freq_factor", &g->rope_low_freq_factor, json, err));
    CDDP_TRY(num_field(s, "high_freq_factor", &g->rope_high_freq_factor, json, err));
    CDDP_TRY(
        int_field(s, "original_max_position_embeddings", true, &g->rope_original_max, json, err));
    if (!(g->rope_factor > 0 && g->rope_low_freq_factor > 0 &&
          g->rope_high_freq_factor > g->rope_low_freq_factor))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: rope_scaling needs factor, low_freq_factor and a larger "
                              "high_freq_factor",
                              json);
    return CDDP_OK;
}

static int read_fields(const cJSON *root, cddp_llama_config *g, const char *json, cddp_error *err) {
    const cJSON *type = field(root, "model_type");
    if (type && !(cJSON_IsString(type) && (strcmp(type->valuestring, "llama") == 0 ||
                                           strcmp(type->valuestring, "mistral") == 0)))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: model_type %s: cddp's Llama reads llama (and mistral) models",
                              json, cJSON_IsString(type) ? type->valuestring : "(not a string)");
    *g = (cddp_llama_config){.rope_theta = 10000.0, .rms_norm_eps = 1e-6f, .max_positions = 2048};
    CDDP_TRY(int_field(root, "vocab_size", true, &g->vocab_size, json, err));
    CDDP_TRY(int_field(root, "hidden_size", true, &g->n_embd, json, err));
    CDDP_TRY(int_field(root, "intermediate_size", true, &g->intermediate_size, json, err));
    CDDP_TRY(int_field(root, "num_hidden_layers", true, &g->n_layer, json, err));
    CDDP_TRY(int_field(root, "num_attention_heads", true, &g->n_head, json, err));
    g->n_kv_head = g->n_head;
    CDDP_TRY(int_field(root, "num_key_value_heads", false, &g->n_kv_head, json, err));
    CDDP_TRY(int_field(root, "max_position_embeddings", false, &g->max_positions, json, err));
    double eps = g->rms_norm_eps;
    CDDP_TRY(num_field(root, "rms_norm_eps", &eps, json, err));
    g->rms_norm_eps = (float)eps;
    CDDP_TRY(num_field(root, "rope_theta", &g->rope_theta, json, err));
    CDDP_TRY(scaling(root, g, json, err));
    const cJSON *tie = field(root, "tie_word_embeddings");
    g->tie_embeddings = cJSON_IsTrue(tie);
    const cJSON *act = field(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: hidden_act %s: cddp's Llama computes SwiGLU with silu", json,
                              cJSON_IsString(act) ? act->valuestring : "(not a string)");
    static const char *const no[] = {"attention_bias", "mlp_bias"};
    for (size_t k = 0; k < sizeof no / sizeof *no; k++)
        if (cJSON_IsTrue(field(root, no[k])))
            return cddp_error_set(err, CDDP_EFORMAT,
                                  "%s: %s is true: cddp's Llama has no biases (as Llama's)", json,
                                  no[k]);
    int64_t head_dim = g->n_embd / g->n_head;
    CDDP_TRY(int_field(root, "head_dim", false, &head_dim, json, err));
    if (head_dim * g->n_head != g->n_embd || head_dim % 2)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: head_dim %" PRId64 " with %" PRId64
                              " heads and hidden_size %" PRId64
                              ": cddp's Llama needs head_dim = hidden_size / heads, even",
                              json, head_dim, g->n_head, g->n_embd);
    if (g->n_head % g->n_kv_head)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: %" PRId64 " heads do not share %" PRId64
                              " key/value heads evenly",
                              json, g->n_head, g->n_kv_head);
    int64_t window = 0;
    CDDP_TRY(int_field(root, "sliding_window", false, &window, json, err));
    if (window && window < g->max_positions)
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: sliding_window %" PRId64
                              " below max_position_embeddings %" PRId64
                              ": cddp's attention sees every earlier position",
                              json, window, g->max_positions);
    return CDDP_OK;
}

/* Keys of a cddp checkpoint's metadata (gpt_train --arch llama writes them) and their fields. */
static int from_meta(const cddp_safetensors *f, const char *path, cddp_llama_config *g,
                     cddp_error *err) {
    const char *ikeys[] = {"vocab_size", "max_positions", "n_layer",          "n_head",
                           "n_embd",     "n_kv_head",     "intermediate_size"};
    int64_t *iat[] = {&g->vocab_size, &g->max_positions, &g->n_layer,          &g->n_head,
                      &g->n_embd,     &g->n_kv_head,     &g->intermediate_size};
    *g = (cddp_llama_config){0};
    char what[4300];
    CDDP_TRY(cddp__meta_sizes(f, path, ikeys, iat, 7, err));
    const char *dkeys[] = {"rope_theta", "rms_norm_eps", "rope_factor", "rope_low_freq_factor",
                           "rope_high_freq_factor"};
    double d[5] = {0};
    for (size_t k = 0; k < 5; k++) {
        const char *v = cddp_safetensors_meta(f, dkeys[k]);
        snprintf(what, sizeof what, "%s: %s", path, dkeys[k]);
        if (!v && k < 2)
            return cddp_error_set(err, CDDP_EFORMAT, "%s: no %s in its metadata", path, dkeys[k]);
        if (v) CDDP_TRY(cddp_parse_double(what, v, 0, 1e12, k >= 2, &d[k], err));
    }
    g->rope_theta = d[0];
    g->rms_norm_eps = (float)d[1];
    g->rope_factor = d[2];
    g->rope_low_freq_factor = d[3];
    g->rope_high_freq_factor = d[4];
    const char *v = cddp_safetensors_meta(f, "rope_original_max");
    snprintf(what, sizeof what, "%s: rope_original_max", path);
    if (v) CDDP_TRY(cddp_parse_int(what, v, 1, 1 << 30, &g->rope_original_max, err));
    v = cddp_safetensors_meta(f, "tie_embeddings");
    g->tie_embeddings = v && strcmp(v, "true") == 0;
    return CDDP_OK;
}

/* A cddp checkpoint (a file or a set) of a Llama: its metadata's model is "llama". */
static cddp_safetensors *llama_checkpoint(const char *path) {
    cddp_error ignored = {0};
    char at[4096];
    if (cddp_checkpoint_resolve(path, at, sizeof at, &ignored) != CDDP_OK) return NULL;
    cddp_safetensors *f = cddp_checkpoint_metadata(at, &ignored);
    const char *model = f ? cddp_safetensors_meta(f, "model") : NULL;
    if (model && strcmp(model, "llama") == 0) return f;
    cddp_safetensors_destroy(f);
    return NULL;
}

int cddp_llama_config_read(const char *path, cddp_llama_config *config, cddp_error *err) {
    char json[4200];
    struct stat st;
    size_t n = strlen(path);
    cddp_safetensors *ck = llama_checkpoint(path);
    if (ck) {
        cddp_llama_config g;
        int rc = from_meta(ck, path, &g, err);
        cddp_safetensors_destroy(ck);
        if (rc == CDDP_OK) *config = g;
        return rc;
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(json, sizeof json, "%s/config.json", path);
    else if (n >= 11 && strcmp(path + n - 11, "config.json") == 0)
        snprintf(json, sizeof json, "%s", path);
    else { /* a weights file: the config.json beside it */
        const char *slash = strrchr(path, '/');
        snprintf(json, sizeof json, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
    }
    cJSON *root;
    cddp_llama_config g;
    int rc = cddp__json_read(json, 1 << 20, &root, err);
    if (rc == CDDP_ENOENT)
        return cddp_error_set(err, rc,
                              "%s: a Llama's shape is in its config.json, which is missing", json);
    if (rc == CDDP_OK) rc = read_fields(root, &g, json, err);
    cJSON_Delete(root);
    if (rc == CDDP_OK) *config = g;
    return rc;
}

int cddp_llama_config_write(const cddp_llama_config *g, const char *dir, cddp_dtype dtype,
                            cddp_error *err) {
    char path[4200], scaling[512] = "null", text[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (g->rope_factor > 0)
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                 "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %" PRId64 "}",
                 g->rope_factor, g->rope_low_freq_factor, g->rope_high_freq_factor,
                 g->rope_original_max);
    int n = snprintf(
        text, sizeof text,
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
        "  \"vocab_size\": %" PRId64 ",\n  \"hidden_size\": %" PRId64
        ",\n  \"intermediate_size\": %" PRId64 ",\n  \"num_hidden_layers\": %" PRId64
        ",\n  \"num_attention_heads\": %" PRId64 ",\n  \"num_key_value_heads\": %" PRId64
        ",\n  \"max_position_embeddings\": %" PRId64 ",\n  \"rms_norm_eps\": %.9g,\n"
        "  \"rope_theta\": %.17g,\n  \"rope_scaling\": %s,\n  \"hidden_act\": \"silu\",\n"
        "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n  \"attention_dropout\": 0.0,\n"
        "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
        g->vocab_size, g->n_embd, g->intermediate_size, g->n_layer, g->n_head,
        g->n_kv_head ? g->n_kv_head : g->n_head, g->max_positions, (double)g->rms_norm_eps,
        g->rope_theta, scaling, g->tie_embeddings ? "true" : "false",
        dtype == CDDP_BF16  ? "bfloat16"
        : dtype == CDDP_F16 ? "float16"
                            : "float32");
    CDDP_TRY(cddp__make_dirs(dir, err));
    cddp__atomic_file af;
    CDDP_TRY(cddp__atomic_open(&af, path, err));
    return cddp__atomic_close(&af, cddp__atomic_write(&af, text, (size_t)n, err), err);
}
