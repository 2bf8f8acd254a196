/* text.c: text into tokens and back for the GPT examples (see text.h). */
#include "text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB_MAGIC 20240328u
#define GPT2_EOT    50256 /* <|endoftext|> in GPT-2's vocabulary of 50257 */

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void text_vocab_free(text_vocab *v) {
    for (int64_t i = 0; v->token && i < v->size; i++) free(v->token[i]);
    free(v->token);
    free(v->len);
    cddp_tokenizer_destroy(v->bpe);
    *v = (text_vocab){0};
}

/* llm.c's tokenizer file, f open at its start. */
static int load_llmc(FILE *f, const char *path, text_vocab *v, cddp_error *err) {
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
    v->eot = v->bos = version == 2 ? (int64_t)le32(head + 12) : -1;
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
    return rc;
}

int text_vocab_load(const char *path, text_vocab *v, cddp_error *err) {
    *v = (text_vocab){.path = path, .bos = -1, .eot = -1};
    FILE *f = fopen(path, "rb");
    unsigned char magic[4];
    bool llmc = f && fread(magic, 1, 4, f) == 4 && le32(magic) == VOCAB_MAGIC;
    int rc = CDDP_OK;
    if (llmc) {
        rewind(f);
        rc = load_llmc(f, path, v, err);
    } else if ((v->bpe = cddp_tokenizer_load(path, err))) {
        v->size = cddp_tokenizer_vocab_size(v->bpe);
        v->bos = cddp_tokenizer_bos(v->bpe);
        v->eot = cddp_tokenizer_eos(v->bpe);
    } else {
        rc = err ? err->code : CDDP_EFORMAT;
    }
    if (f) fclose(f);
    if (rc) text_vocab_free(v);
    v->path = path;
    return rc;
}

int text_vocab_check(int64_t model_vocab, int64_t vocab, const char *what, const char *name,
                     cddp_error *err) {
    if (vocab <= 0 || (model_vocab >= vocab && model_vocab <= (vocab + 127) / 128 * 128))
        return CDDP_OK;
    return cddp_error_set(
        err, CDDP_EINVAL,
        "%s %s: a vocabulary of %" PRId64 " tokens%s, where the model's is %" PRId64 "%s: ids "
        "of one tokenizer mean other text to a model of another; %s",
        what, name, vocab, vocab == 256 ? " (the byte tokenizer)" : "", model_vocab,
        model_vocab == 256 ? " (the byte tokenizer)" : "",
        vocab == 256 ? "tokenize the text with the model's tokenizer (cddp-tokenize --tokenizer "
                       "tokenizer.json TEXT OUTDIR)"
                     : "use the model's own tokenizer, or train a model of this vocabulary");
}

/* "1,2 3": the ids, each in [0, vocab). */
static int parse_ids(const char *s, int64_t vocab, int64_t **ids, int64_t *count, cddp_error *err) {
    size_t cap = strlen(s) / 2 + 1;
    *count = 0;
    if (!(*ids = malloc(cap * sizeof **ids))) return cddp_error_set(err, CDDP_ENOMEM, "no memory");
    for (const char *p = s; *p;) {
        while (*p == ',' || *p == ' ') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long id = strtoll(p, &end, 10);
        if (end == p || errno || id < 0 || id >= vocab) {
            free(*ids);
            *ids = NULL;
            return cddp_error_set(err, CDDP_EINVAL,
                                  "--prompt_ids %s: '%.*s' is not a token id of the model's "
                                  "vocabulary of %" PRId64 " (ids 0 to %" PRId64
                                  ", commas between)",
                                  s, (int)strcspn(p, ", "), p, vocab, vocab - 1);
        }
        (*ids)[(*count)++] = id;
        p = end;
    }
    if (*count == 0) {
        free(*ids);
        *ids = NULL;
        return cddp_error_set(err, CDDP_EINVAL, "--prompt_ids '%s' holds no id", s);
    }
    return CDDP_OK;
}

static int prompt_ids(const text_sample_options *o, int64_t **ids, int64_t *count,
                      int64_t *stop_token, cddp_error *err) {
    const text_vocab *v = o->vocab;
    int64_t V = o->vocab_size, eot = v ? v->eot : -1;
    *ids = NULL;
    *count = 0;
    if (eot < 0 && !(v && v->bpe) && V >= GPT2_EOT + 1) eot = GPT2_EOT;
    *stop_token = o->stop ? eot : -1;
    if (o->stop && eot < 0)
        return cddp_error_set(err, CDDP_EINVAL,
                              "--stop: no end-of-text token is known for this vocabulary of "
                              "%" PRId64 " (give --tokenizer)",
                              V);
    if (v) CDDP_TRY(text_vocab_check(V, v->size, "the tokenizer", v->path, err));
    if (o->prompt_ids && *o->prompt_ids) return parse_ids(o->prompt_ids, V, ids, count, err);
    bool text = o->prompt && *o->prompt;
    if (text && v && v->bpe) {
        int32_t *enc;
        int64_t n;
        CDDP_TRY(cddp_tokenizer_encode(v->bpe, o->prompt, strlen(o->prompt), &enc, &n, err));
        if (n > 0 && (*ids = malloc(sizeof **ids * (size_t)n)))
            for (int64_t i = 0; i < n; i++) (*ids)[(*count)++] = enc[i];
        cddp_free(enc);
        if (n > 0 && !*ids) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        if (n > 0) return CDDP_OK;
        text = false; /* a prompt of no tokens: from the start token */
    }
    if (text && V > 256)
        return cddp_error_set(err, CDDP_EINVAL,
                              "--prompt is text, but this model's vocabulary is %" PRId64
                              " tokens, not the byte tokenizer's 256: give --tokenizer (its "
                              "tokenizer.json) to encode it, or --prompt_ids",
                              V);
    const char *s = text ? o->prompt : "\n";
    size_t n = strlen(s);
    if (!(*ids = malloc(sizeof **ids * n))) return cddp_error_set(err, CDDP_ENOMEM, "no memory");
    int64_t start = v && v->bos >= 0 ? v->bos : eot;
    if (!text && start >= 0) { /* a text from nothing starts where texts start */
        (*ids)[0] = start;
        *count = 1;
        return CDDP_OK;
    }
    for (size_t i = 0; i < n; i++) (*ids)[(*count)++] = (unsigned char)s[i];
    if (!text && V <= '\n') (*ids)[0] = 0; /* a vocabulary too small for a newline */
    return CDDP_OK;
}

int text_prompt(const text_sample_options *o, int64_t **ids, int64_t *count, int64_t *stop_token,
                cddp_error *err) {
    CDDP_TRY(prompt_ids(o, ids, count, stop_token, err));
    for (int64_t i = 0; i < *count; i++)
        if ((*ids)[i] >= o->vocab_size) {
            cddp_error_set(err, CDDP_EINVAL,
                           "the prompt's token %" PRId64 " is %" PRId64 ", outside the model's "
                           "vocabulary of %" PRId64,
                           i, (*ids)[i], o->vocab_size);
            free(*ids);
            *ids = NULL;
            return CDDP_EINVAL;
        }
    return CDDP_OK;
}

typedef struct printer {
    FILE *out;
    const text_vocab *vocab;
    int64_t vocab_size, drawn;
} printer;

static void print_token(int64_t tok, void *user) {
    printer *p = user;
    const text_vocab *v = p->vocab;
    size_t n;
    const char *piece;
    if (v && v->bpe && (piece = cddp_tokenizer_piece(v->bpe, tok, &n)))
        fwrite(piece, 1, n, p->out);
    else if (v && !v->bpe && tok < v->size)
        fwrite(v->token[tok], 1, v->len[tok], p->out);
    else if (p->vocab_size <= 256)
        fputc((int)tok, p->out);
    else
        fprintf(p->out, "%" PRId64 " ", tok);
    fflush(p->out);
    p->drawn++;
}

int text_sample(cddp_model *m, cddp_ctx *ctx, const text_sample_options *o, FILE *out,
                int64_t *drawn, cddp_error *err) {
    int64_t *prompt, np, stop;
    CDDP_TRY(text_prompt(o, &prompt, &np, &stop, err));
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(o->n > 0 ? o->n : 1));
    if (!ids) {
        free(prompt);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    printer p = {out, o->vocab, o->vocab_size, 0};
    if (o->prompt_ids && *o->prompt_ids) /* as they read */
        for (int64_t i = 0; i < np; i++) print_token(prompt[i], &p);
    else if (o->prompt && *o->prompt)
        fputs(o->prompt, out);
    p.drawn = 0;
    cddp_gpt_sampling s = {.temperature = (float)o->temperature,
                           .top_k = o->top_k,
                           .no_cache = o->no_cache,
                           .stop = stop >= 0,
                           .stop_token = stop,
                           .on_token = print_token,
                           .user = &p};
    cddp_rng rng;
    cddp_rng_seed(&rng, o->seed);
    int rc = cddp_gpt_generate(m, ctx, prompt, np, o->n, &s, &rng, ids, err);
    fputc('\n', out);
    if (drawn) *drawn = p.drawn;
    free(ids);
    free(prompt);
    return rc;
}
