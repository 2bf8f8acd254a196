/* data/tokenizer.h: the byte-level BPE tokenizer's parts, shared by the reader of its files
 * (tokenizer.c) and the encoder (bpe.c). Not public: cddp/data.h's cddp_tokenizer_* is the API. */
#ifndef CDDP_DATA_TOKENIZER_H
#define CDDP_DATA_TOKENIZER_H

#include "cddp/data.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* An open-addressing table from byte strings to token ids (the vocabulary, by its tokens' bytes)
 * or from pairs of ids to merges; capacity a power of two, at most half full. */
typedef struct cddp__tok_map {
    int32_t *slot; /* ids into the tokenizer's pieces (strings) or its merges (pairs); -1 empty */
    uint64_t mask;
} cddp__tok_map;

/* A merge: the pair (left, right) becomes token `into`; rank is its place in the merges list,
 * the lower merged first. */
typedef struct cddp__tok_merge {
    int32_t left, right, into, rank;
} cddp__tok_merge;

/* A token the text is split at before anything else (tokenizer.json's added_tokens: special
 * tokens such as <|endoftext|>, and others): its content is matched as it is written. */
typedef struct cddp__tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool lstrip, rstrip, single_word;
} cddp__tok_added;

/* One step of the pre-tokenizer: the text's pieces are cut by `re`; the matches and the text
 * between them are pieces of their own (Hugging Face's Split with behaviour Isolated). A
 * ByteLevel step first puts a space before a piece that does not start with one when
 * prefix_space is set; its re is GPT-2's pattern, or NULL when it does not split (use_regex
 * false). */
typedef struct cddp__tok_step {
    pcre2_code *re;
    bool prefix_space;
} cddp__tok_step;

#define CDDP__TOK_STEPS 8

struct cddp_tokenizer {
    char *path;
    int64_t vocab_size; /* the largest id + 1 */
    char **piece;       /* piece[id]: the bytes a token stands for (NULL: no token has this id) */
    size_t *piece_len;
    cddp__tok_map by_bytes; /* byte string -> id, over the vocabulary (not the added tokens) */
    int32_t byte_id[256];   /* the single-byte tokens; -1 where the vocabulary has none */
    cddp__tok_merge *merge;
    int32_t merges;
    cddp__tok_map by_pair; /* (left, right) -> index into merge */
    cddp__tok_added *added;
    int added_count;
    bool added_first[256]; /* a byte that starts some added token */
    cddp__tok_step step[CDDP__TOK_STEPS];
    int steps;
    int32_t unk;        /* the model's unknown token, -1 none: a byte without a token is dropped */
    bool ignore_merges; /* a piece that is a token as a whole is that token (Llama 3) */
    int32_t bos, eos;
};

/* bpe.c: the tables. map_init sizes a table for n entries; CDDP_ENOMEM on failure. */
int cddp__tok_map_init(cddp__tok_map *m, int64_t n, cddp_error *err);
void cddp__tok_map_free(cddp__tok_map *m);
/* The id of the vocabulary token whose bytes are s[0, n), or -1. */
int32_t cddp__tok_lookup(const cddp_tokenizer *t, const char *s, size_t n);
/* Adds id under its piece's bytes; false when a token of the same bytes is there already. */
bool cddp__tok_insert(cddp_tokenizer *t, int32_t id);
/* Adds merge k (t->merge[k]); false when its pair is there already. */
bool cddp__tok_insert_pair(cddp_tokenizer *t, int32_t k);

/* GPT-2's pre-tokenizer pattern (ByteLevel with use_regex). */
extern const char *const cddp__tok_gpt2_pattern;

#endif
