/* text.c: tokens to text for the GPT examples (see text.h). */
#include "text.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB_MAGIC 20240328u

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void text_vocab_free(text_vocab *v) {
    for (int64_t i = 0; v->token && i < v->size; i++) free(v->token[i]);
    free(v->token);
    free(v->len);
    *v = (text_vocab){0};
}

int text_vocab_load(const char *path, text_vocab *v, cddp_error *err) {
    *v = (text_vocab){0};
    FILE *f = fopen(path, "rb");
    if (!f) return cddp_error_set(err, CDDP_EIO, "cannot open the tokenizer %s", path);
    unsigned char head[1024];
    int rc = CDDP_OK;
    uint32_t version = 0, size = 0;
    if (fread(head, 1, sizeof head, f) != sizeof head || le32(head) != VOCAB_MAGIC) {
        rc = cddp_error_set(err, CDDP_EFORMAT,
                            "%s is not llm.c's tokenizer file (a 1024-byte header starting with "
                            "the magic %u)",
                            path, VOCAB_MAGIC);
    } else if ((version = le32(head + 4)) != 1 && version != 2) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: tokenizer version %u; this reads 1 and 2", path,
                            version);
    } else if ((size = le32(head + 8)) == 0 || size > (1u << 24)) {
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: a vocabulary of %u tokens", path, size);
    }
    v->size = size;
    v->eot = version == 2 ? (int64_t)le32(head + 12) : -1;
    if (!rc && (v->eot >= v->size))
        rc = cddp_error_set(err, CDDP_EFORMAT, "%s: end-of-text token %" PRId64 " of %" PRId64,
                            path, v->eot, v->size);
    if (!rc && (!(v->token = calloc((size_t)size, sizeof *v->token)) ||
                !(v->len = calloc((size_t)size, 1))))
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory for %u tokens", size);
    for (uint32_t i = 0; !rc && i < size; i++) {
        int n = fgetc(f); /* the length, then the bytes (a token may be empty) */
        if (n != EOF && (v->token[i] = malloc((size_t)n + 1)) &&
            fread(v->token[i], 1, (size_t)n, f) == (size_t)n)
            v->len[i] = (uint8_t)n;
        else
            rc = cddp_error_set(err, CDDP_EFORMAT, "%s ends inside token %u of %u", path, i, size);
    }
    fclose(f);
    if (rc) text_vocab_free(v);
    return rc;
}

typedef struct printer {
    FILE *out;
    const text_vocab *vocab;
    int64_t vocab_size;
} printer;

static void print_token(int64_t tok, void *user) {
    const printer *p = user;
    if (p->vocab && tok < p->vocab->size)
        fwrite(p->vocab->token[tok], 1, p->vocab->len[tok], p->out);
    else if (p->vocab_size <= 256)
        fputc((int)tok, p->out);
    else
        fprintf(p->out, "%" PRId64 " ", tok);
    fflush(p->out);
}

int text_sample(cddp_model *m, cddp_ctx *ctx, const text_sample_options *o, FILE *out,
                cddp_error *err) {
    bool given = o->prompt && *o->prompt;
    const char *text = given ? o->prompt : "\n";
    int64_t np = (int64_t)strlen(text);
    if (o->vocab_size > 256 && given)
        return cddp_error_set(err, CDDP_EINVAL,
                              "a prompt is text, read as bytes, but this model's vocabulary is "
                              "%" PRId64 " tokens, not the byte tokenizer's 256",
                              o->vocab_size);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(np + (o->n > 0 ? o->n : 1)));
    if (!ids) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    for (int64_t i = 0; i < np; i++) ids[i] = (unsigned char)text[i];
    if (!given && o->vocab_size <= '\n') ids[0] = 0; /* a vocabulary too small for a newline */
    if (given) fputs(text, out);
    printer p = {out, o->vocab, o->vocab_size};
    cddp_gpt_sampling s = {.temperature = (float)o->temperature,
                           .top_k = o->top_k,
                           .no_cache = o->no_cache,
                           .on_token = print_token,
                           .user = &p};
    cddp_rng rng;
    cddp_rng_seed(&rng, o->seed);
    int rc = cddp_gpt_generate(m, ctx, ids, np, o->n, &s, &rng, ids + np, err);
    fputc('\n', out);
    free(ids);
    return rc;
}
