/* text.h: what the GPT examples share to turn text into tokens and back: a prompt into tokens
 * (bytes, a tokenizer, or ids as given), tokens back into text (bytes, a tokenizer, llm.c's GPT-2
 * tokenizer file, or token ids), a model's vocabulary checked against its data's and its
 * tokenizer's, and a sample from a model printed as it is drawn.
 *
 * This is the examples' code, not the library's.
 */
#ifndef CDDP_EXAMPLES_TEXT_H
#define CDDP_EXAMPLES_TEXT_H

#include <cddp/cddp.h>

#include <stdio.h>

/* A vocabulary to encode and decode with: a tokenizer (cddp_tokenizer_load: Hugging Face's
 * tokenizer.json, GPT-2's vocab.json, a model's folder), or llm.c's tokenizer file, which decodes
 * only (gpt2_tokenizer.bin: a header of 256 little-endian uint32, magic 20240328, version 1 or 2,
 * the vocabulary's size and, in version 2, the end-of-text token; then each token's bytes, a
 * length byte first). */
typedef struct text_vocab {
    const char *path;
    int64_t size, bos, eot; /* bos: where a text starts; bos, eot: -1 when unknown */
    cddp_tokenizer *bpe;    /* a tokenizer, or else llm.c's file: */
    char **token;           /* size strings of bytes */
    uint8_t *len;
} text_vocab;
int text_vocab_load(const char *path, text_vocab *v, cddp_error *err);
void text_vocab_free(text_vocab *v);

/* Whether a model of model_vocab tokens reads ids of a tokenizer of vocab tokens (what) named
 * name: the same vocabulary, or one padded up to the next multiple of 128 as llm.c pads GPT-2's
 * 50257 to 50304. CDDP_EINVAL otherwise, saying which is which. */
int text_vocab_check(int64_t model_vocab, int64_t vocab, const char *what, const char *name,
                     cddp_error *err);

/* What to sample: n tokens after the prompt, drawn as cddp_gpt_generate draws them from rng
 * seeded with seed. The prompt is prompt_ids ("50256,464") when given; else the text prompt,
 * encoded by vocab's tokenizer, or as bytes for a model of the byte tokenizer (vocabulary 256);
 * with neither, the text starts from vocab's beginning- (else end-) of-text token, from GPT-2's
 * <|endoftext|> (50256) for a model of at least 50257 tokens and no tokenizer, else from a
 * newline. With stop, the sample ends at the end-of-text token. Tokens are printed through vocab
 * when given, as bytes for the byte tokenizer's vocabulary, else as their ids. */
typedef struct text_sample_options {
    const char *prompt, *prompt_ids;
    int64_t n, top_k, vocab_size;
    double temperature;
    uint64_t seed;
    bool no_cache, stop;
    const text_vocab *vocab;
} text_sample_options;
/* The prompt's tokens as above (*ids malloc'd, *count of them), each checked against the model's
 * vocabulary, and where the text stops (*stop_token, -1: it does not): what text_sample would
 * use, so that a program can refuse a bad prompt before it trains. A text prompt the vocabulary
 * cannot encode (a model of other tokens than bytes, without a tokenizer) is refused. */
int text_prompt(const text_sample_options *o, int64_t **ids, int64_t *count, int64_t *stop_token,
                cddp_error *err);
/* Prints the prompt, then each token as it comes, then a newline, to out; *drawn (may be NULL):
 * how many tokens were drawn (fewer than n when the sample stopped at the end of text). */
int text_sample(cddp_model *m, cddp_ctx *ctx, const text_sample_options *o, FILE *out,
                int64_t *drawn, cddp_error *err);

#endif
