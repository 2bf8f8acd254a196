/* gpt_export.c: a GPT as Hugging Face's GPT2LMHeadModel saves one (cddp/checkpoint.h), so that
 * transformers' from_pretrained(dir) opens a model trained here.
 *
 * save_pretrained's layout: model.safetensors with metadata {"format": "pt"} (transformers refuses
 * a file without it), the parameters under GPT2LMHeadModel's names ("transformer.h.0.attn.c_attn
 * .weight", ...), which are nanoGPT's and so cddp's, but the four linear weights of a block as
 * Conv1D keeps them, (in, out): the transpose of nn.Linear's (out, in). The head is tied to the
 * token embedding and is not stored (tie_word_embeddings ties it on load), nor are the attention
 * masks (buffers transformers rebuilds). config.json holds GPT-2's fields with the model's shape:
 * the computation cddp's GPT does (gelu_new, LayerNorm epsilon 1e-5, attention scaled by
 * 1/sqrt(head size)), and no dropout, as cddp trains without it (a fine-tune in transformers then
 * goes on as here). Lower precisions are rounded to nearest even, as PyTorch's .to() rounds.
 */
#include "io/internal.h"

#include "cddp/device.h"
#include "cddp/internal/device.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether name (from "transformer.") is one of a block's linear weights, Conv1D in the file. */
static bool conv1d(const char *name) {
    static const char *const tails[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
                                        ".mlp.c_fc.weight", ".mlp.c_proj.weight"};
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof tails / sizeof *tails; k++) {
        size_t m = strlen(tails[k]);
        if (n > m && strcmp(name + n - m, tails[k]) == 0) return true;
    }
    return false;
}

static int write_config(const char *dir, const cddp_gpt_config *g, cddp_dtype dtype, int64_t bos,
                        int64_t eos, cddp_error *err) {
    char path[4200], ids[96], text[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (eos >= 0)
        snprintf(ids, sizeof ids, "%" PRId64 ", \"eos_token_id\": %" PRId64, bos >= 0 ? bos : eos,
                 eos);
    else if (g->vocab_size > 50256) /* GPT-2's <|endoftext|> */
        snprintf(ids, sizeof ids, "50256, \"eos_token_id\": 50256");
    else
        snprintf(ids, sizeof ids, "null, \"eos_token_id\": null");
    int n = snprintf(
        text, sizeof text,
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
        "  \"vocab_size\": %" PRId64 ",\n  \"n_positions\": %" PRId64 ",\n  \"n_ctx\": %" PRId64
        ",\n  \"n_embd\": %" PRId64 ",\n  \"n_layer\": %" PRId64 ",\n  \"n_head\": %" PRId64
        ",\n  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n"
        "  \"layer_norm_epsilon\": 1e-05,\n  \"scale_attn_weights\": true,\n"
        "  \"scale_attn_by_inverse_layer_idx\": false,\n  \"reorder_and_upcast_attn\": false,\n"
        "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
        "  \"initializer_range\": 0.02,\n  \"tie_word_embeddings\": true,\n"
        "  \"bos_token_id\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
        g->vocab_size, g->block_size, g->block_size, g->n_embd, g->n_layer, g->n_head, ids,
        dtype == CDDP_BF16  ? "bfloat16"
        : dtype == CDDP_F16 ? "float16"
                            : "float32");
    cddp__atomic_file af;
    CDDP_TRY(cddp__atomic_open(&af, path, err));
    return cddp__atomic_close(&af, cddp__atomic_write(&af, text, (size_t)n, err), err);
}

int cddp_gpt_export_hf(const cddp_model *m, const char *dir, cddp_dtype dtype, int64_t bos,
                       int64_t eos, cddp_error *err) {
    cddp_gpt_config g;
    if (cddp_model_gpt_config(m, &g) != CDDP_OK)
        return cddp_error_set(err, CDDP_EINVAL, "cddp_gpt_export_hf: the model holds no GPT");
    if (dtype != CDDP_F32 && dtype != CDDP_BF16 && dtype != CDDP_F16)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_export_hf: %s: a checkpoint for transformers is float32, "
                              "bfloat16 or float16",
                              cddp_dtype_name(dtype));
    if (eos >= g.vocab_size || bos >= g.vocab_size)
        return cddp_error_set(err, CDDP_EINVAL,
                              "cddp_gpt_export_hf: tokens %" PRId64 " and %" PRId64
                              " for a vocabulary of %" PRId64,
                              bos, eos, g.vocab_size);
    size_t numel = cddp_model_numel(m), width = cddp_dtype_size(dtype);
    int np = cddp_model_num_params(m);
    float *flat = malloc(numel * sizeof(float));
    float *tmp = malloc(numel * sizeof(float)); /* a transposed matrix, then the file's values */
    uint8_t *out = malloc(numel * width);
    cddp_st_tensor *t = calloc((size_t)np, sizeof *t);
    int rc = flat && tmp && out && t ? CDDP_OK
                                     : cddp_error_set(err, CDDP_ENOMEM,
                                                      "out of memory for the "
                                                      "weights");
    if (rc == CDDP_OK)
        rc = cddp_device_download(cddp_model_device(m), flat, cddp_model_data(m),
                                  numel * sizeof(float), err);
    for (int i = 0; rc == CDDP_OK && i < np; i++) {
        const cddp_tensor *p = cddp_model_param(m, i);
        const char *name = strstr(p->name, "transformer.");
        if (!name) {
            rc = cddp_error_set(err, CDDP_EINVAL,
                                "cddp_gpt_export_hf: the model's parameter %s is not its GPT's",
                                p->name);
            break;
        }
        size_t at = cddp_model_param_offset(m, i);
        const float *src = flat + at;
        t[i] = (cddp_st_tensor){.name = name, .dtype = dtype, .ndim = p->ndim};
        memcpy(t[i].shape, p->shape, sizeof t[i].shape);
        if (conv1d(name) && p->ndim == 2) { /* (out, in) -> Conv1D's (in, out) */
            int64_t rows = p->shape[0], cols = p->shape[1];
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) tmp[at + c * rows + r] = src[r * cols + c];
            t[i].shape[0] = cols;
            t[i].shape[1] = rows;
            src = tmp + at;
        }
        uint8_t *dst = out + at * width;
        if (dtype == CDDP_F32)
            memcpy(dst, src, (size_t)p->numel * sizeof(float));
        else
            cddp_device_to_half(cddp_device_cpu(), (uint16_t *)dst, src, (size_t)p->numel,
                                dtype == CDDP_F16);
        t[i].data = dst;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static const char *const meta[] = {"format", "pt", NULL};
    if (rc == CDDP_OK) rc = cddp__make_dirs(dir, err);
    if (rc == CDDP_OK) rc = cddp_safetensors_write(path, t, np, meta, err);
    if (rc == CDDP_OK) rc = write_config(dir, &g, dtype, bos, eos, err);
    free(flat);
    free(tmp);
    free(out);
    free(t);
    return rc;
}
