/* text.h: what the GPT examples share to turn tokens into text: a prompt into byte tokens, tokens
 * back into text (bytes, llm.c's GPT-2 tokenizer file, or token ids), and a sample from a model
 * printed as it is drawn.
 *
 * This is the examples' code, not the library's.
 */
#ifndef CDDP_EXAMPLES_TEXT_H
#define CDDP_EXAMPLES_TEXT_H

#include <cddp/cddp.h>

#include <stdio.h>

/* A vocabulary to decode with: llm.c's tokenizer file (gpt2_tokenizer.bin: a header of 256
 * little-endian uint32, magic 20240328, version 1 or 2, the vocabulary's size and, in version 2,
 * the end-of-text token; then each token's bytes, a length byte first). */
typedef struct text_vocab {
    int64_t size, eot; /* eot: -1 when the file has none (version 1) */
    char **token;      /* size strings of bytes */
    uint8_t *len;
} text_vocab;
int text_vocab_load(const char *path, text_vocab *v, cddp_error *err);
void text_vocab_free(text_vocab *v);

/* What to sample: n tokens after the prompt (text, read as byte tokens; NULL or "": a newline),
 * drawn as cddp_gpt_generate draws them from rng seeded with seed. Tokens are printed as bytes
 * when the model's vocabulary is the byte tokenizer's (256), through vocab when given, else as
 * their ids. */
typedef struct text_sample_options {
    const char *prompt;
    int64_t n, top_k, vocab_size;
    double temperature;
    uint64_t seed;
    bool no_cache;
    const text_vocab *vocab;
} text_sample_options;
/* Prints the prompt, then each token as it comes, then a newline, to out. A prompt that the
 * model's vocabulary cannot read (a model of other tokens than bytes) is refused. */
int text_sample(cddp_model *m, cddp_ctx *ctx, const text_sample_options *o, FILE *out,
                cddp_error *err);

#endif
