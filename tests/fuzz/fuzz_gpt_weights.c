/* fuzz_gpt_weights.c: what `gpt_train --init_from` and `gpt_generate` read, on any bytes: llm.c's
 * model file, Hugging Face's GPT-2 safetensors with the config.json beside it, and nanoGPT's or
 * cddp's safetensors with their metadata.
 *
 * An input that starts with '{' is a pair: the bytes up to the first NUL are config.json, the
 * rest the weights file beside it (model.safetensors); one that starts with '!' is a sharded
 * checkpoint: after the '!' up to the first NUL, model.safetensors.index.json, the rest the shard
 * a.safetensors beside it (config.json as before, when the input before held one); any other
 * input is the weights file alone.
 * cddp_gpt_config_read must refuse with a message or give a shape that builds a GPT; when that
 * GPT is small, cddp_gpt_load_weights must load it or refuse with a message. */
#include "fuzz.h"

#include <stdbool.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    const char *dir = fuzz_folder();
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    bool sharded = size && data[0] == '!';
    if (sharded) {
        const uint8_t *nul = memchr(data, 0, size);
        size_t json = nul ? (size_t)(nul - data) - 1 : size - 1;
        fuzz_put(dir, "model.safetensors.index.json", data + 1, json);
        fuzz_put(dir, "a.safetensors", nul ? nul + 1 : data, nul ? size - json - 2 : 0);
    } else if (size && data[0] == '{') {
        const uint8_t *nul = memchr(data, 0, size);
        size_t json = nul ? (size_t)(nul - data) : size;
        fuzz_put(dir, "config.json", data, json);
        size_t rest = nul ? size - json - 1 : 0;
        fuzz_put(dir, "model.safetensors", nul ? nul + 1 : data, rest);
    } else {
        fuzz_put(dir, "model.safetensors", data, size);
    }
    snprintf(path, sizeof path, "%s/%s", dir,
             sharded ? "model.safetensors.index.json" : "model.safetensors");

    cddp_error err = {0};
    cddp_gpt_config g = {.n_head = 0}; /* no heads given: the file must say */
    if (cddp_gpt_config_read(path, &g, &err) != CDDP_OK) {
        if (!err.msg[0]) abort();
        return 0;
    }
    if (g.vocab_size < 1 || g.block_size < 1 || g.n_layer < 1 || g.n_head < 1 || g.n_embd < 1 ||
        g.n_embd % g.n_head)
        abort(); /* a shape no GPT has, given as good */
    /* Loading only when the GPT is small, so that each input takes microseconds. */
    bool small = g.vocab_size <= 4096 && g.block_size <= 4096 && g.n_layer <= 8 &&
                 g.n_embd <= 256 && (g.vocab_size + g.block_size) * g.n_embd <= 1 << 18;
    if (!small) return 0;
    cddp_model *m = cddp_model_create_with(cddp_nn_gpt(&g), &err);
    if (!m || cddp_model_build(m, 1) != CDDP_OK) abort();
    if (cddp_gpt_load_weights(m, path, &err) != CDDP_OK) {
        if (!err.msg[0]) abort();
    } else {
        const float *w = cddp_model_data(m);
        for (size_t i = 0; i < cddp_model_numel(m); i++) fuzz_sink ^= (uint8_t)(w[i] != w[i]);
    }
    cddp_model_destroy(m);
    return 0;
}
