/* corpus.h: gpt_train's text: the token arrays it trains and evaluates on, read from a text, a
 * token file or llm.c's shards, and their windows as a dataset whose every token is checked
 * against the model's vocabulary as it is read.
 *
 * This is the examples' code, not the library's.
 */
#ifndef CDDP_EXAMPLES_CORPUS_H
#define CDDP_EXAMPLES_CORPUS_H

#include <cddp/cddp.h>

#define CORPUS_FORTUNES "/usr/share/games/fortunes" /* the corpus when none is given */

/* A corpus: its token arrays (shards) in order, each with the file it is from and where in that
 * file it starts (a text split 90/10: the validation part starts at the training part's end). */
typedef struct corpus {
    cddp_tokens *shard;
    char **name;
    int64_t *base;
    int count;
    int64_t tokens;
} corpus;

/* The training and validation tokens of path (NULL: Debian's fortunes): a pattern of token files
 * (llm.c's shards, fineweb_train_*.bin) with the same pattern's validation shards (the last
 * "train" of its file name as "val"); a *train.bin with its *val.bin; or one text (file, folder or
 * token file) split 90/10. Token files are mapped, not copied. */
int corpus_load(const char *path, corpus *train, corpus *val, cddp_error *err);
void corpus_free(corpus *c);

/* The largest token in c: it reads every token. */
int64_t corpus_max_token(const corpus *c);
/* The vocabulary c's token files record (cddp-tokenize writes it) into *vocab, left as it is when
 * none does (llm.c's own files, or *vocab from another corpus); CDDP_EINVAL naming the file when
 * two record different ones. */
int corpus_vocab(const corpus *c, int64_t *vocab, cddp_error *err);

/* c's windows of block tokens every stride (cddp_dataset_token_shards, which takes c's shards
 * over). vocab > 0: each window's tokens are checked as the window is read, one at or beyond
 * vocab failing the read (CDDP_ERANGE) with the file it is in and its place there; nothing is
 * read before. vocab 0: unchecked. */
cddp_dataset *corpus_windows(corpus *c, int64_t block, int64_t stride, int64_t vocab,
                             cddp_error *err);

#endif
