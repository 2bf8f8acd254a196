/* fuzz_tokenizer.c: what cddp-tokenize --tokenizer and gpt_train --tokenizer read, on any bytes:
 * Hugging Face's tokenizer.json, or GPT-2's vocab.json with merges.txt beside it; then text
 * encoded with what loaded.
 *
 * An input that starts with 'V' is GPT-2's pair: the bytes after it up to the first NUL are
 * vocab.json, up to the next NUL merges.txt; any other input is tokenizer.json up to its first
 * NUL. The bytes after are text. cddp_tokenizer_load must refuse with a message or give a
 * tokenizer whose encoding of the text is ids of its vocabulary, which decode. */
#include "fuzz.h"

/* The bytes of [*at, end) up to the next NUL (or end); *at moves past that NUL. */
static size_t part(const uint8_t **at, const uint8_t *end) {
    const uint8_t *nul = memchr(*at, 0, (size_t)(end - *at));
    size_t n = (size_t)((nul ? nul : end) - *at);
    *at = nul ? nul + 1 : end;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_folder();
    const uint8_t *at = data, *end = data + size;
    char path[512];
    bool gpt2 = size && data[0] == 'V';
    if (gpt2) {
        at++;
        const uint8_t *vocab = at;
        size_t nv = part(&at, end);
        fuzz_put(dir, "vocab.json", vocab, nv);
        const uint8_t *merges = at;
        size_t nm = part(&at, end);
        fuzz_put(dir, "merges.txt", merges, nm);
    } else {
        const uint8_t *json = at;
        size_t n = part(&at, end);
        fuzz_put(dir, "tokenizer.json", json, n);
    }
    snprintf(path, sizeof path, "%s/%s", dir, gpt2 ? "vocab.json" : "tokenizer.json");
    cddp_error err = {0};
    cddp_tokenizer *t = cddp_tokenizer_load(path, &err);
    if (!t) {
        if (!err.msg[0]) abort();
        return 0;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    if (cddp_tokenizer_encode(t, (const char *)at, (size_t)(end - at), &ids, &n, &err) != CDDP_OK) {
        if (!err.msg[0]) abort();
    } else {
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= cddp_tokenizer_vocab_size(t)) abort();
        char *text = NULL;
        size_t len = 0;
        if (cddp_tokenizer_decode(t, ids, n, &text, &len, &err) != CDDP_OK) abort();
        for (size_t i = 0; i < len; i++) fuzz_sink ^= (uint8_t)text[i];
        cddp_free(text);
    }
    cddp_free(ids);
    cddp_tokenizer_destroy(t);
    return 0;
}
