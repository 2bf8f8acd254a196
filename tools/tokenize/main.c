/* cddp-tokenize: turns text into llm.c's token files, with a real tokenizer or the byte one.
 *
 *   cddp-tokenize /usr/share/games/fortunes data/fortunes     -> data/fortunes/{train,val}.bin
 *   cddp-tokenize --tokenizer gpt2/tokenizer.json my.txt data/mine
 *
 * The input is a text file or a folder of them (every regular file holding text, in name order).
 * Without --tokenizer each byte is a token (vocabulary 256); with it, Hugging Face's
 * tokenizer.json or GPT-2's vocab.json (merges.txt beside it) encodes the text, each file after
 * the tokenizer's end-of-text token, as llm.c's prepare scripts write documents. The files record
 * the vocabulary's size, so that a model of another vocabulary refuses them; ids past 65,535 are
 * written as uint32 (llm.c's Llama 3 files). The first 90% of the tokens go to train.bin and the
 * rest to val.bin (--val_fraction), as nanoGPT's prepare scripts split their text; gpt_train
 * --data DIR/train.bin reads both. With --shard_tokens N each part is written as shards of N
 * tokens, train_000001.bin, ... and val_000000.bin, ... as llm.c's FineWeb comes
 * (gpt_train --data 'DIR/train_*.bin').
 */
#include <cddp/cddp.h>

#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: cddp-tokenize [--tokenizer FILE] [--val_fraction X] [--shard_tokens N]\n"
            "                     INPUT OUTDIR\n"
            "Reads INPUT (a text file, or a folder whose text files are read in name order),\n"
            "tokenizes it and writes OUTDIR/train.bin and OUTDIR/val.bin in llm.c's token\n"
            "format (a 1024-byte header: magic 20240520, version 1, the count, and here the\n"
            "vocabulary's size; then uint16 tokens; magic 20240801, version 7 and uint32 tokens\n"
            "for a vocabulary past 65,536, as llm.c's Llama 3 files).\n\n"
            "  --tokenizer FILE   Hugging Face's tokenizer.json (byte-level BPE: GPT-2's,\n"
            "                     Llama 3's, ...), GPT-2's vocab.json with merges.txt beside\n"
            "                     it, or a model's folder holding either; each file of INPUT\n"
            "                     is written after the tokenizer's end-of-text token\n"
            "                     (default: bytes, the byte tokenizer: vocabulary 256)\n"
            "  --val_fraction X   the share of the text, taken from its end, for val.bin\n"
            "                     (default 0.1)\n"
            "  --shard_tokens N   write each part as shards of N tokens, as llm.c's FineWeb:\n"
            "                     OUTDIR/train_000001.bin, ... and OUTDIR/val_000000.bin, ...\n"
            "                     (train with gpt_train --data 'OUTDIR/train_*.bin'); needed\n"
            "                     beyond 2147483647 tokens a part, a file's most (default 0:\n"
            "                     one file a part); OUTDIR must hold no shards yet\n"
            "  -h, --help         show this help\n");
}

/* Writes t as dir/name.bin, or with shard > 0 as dir/name_%06d.bin files of shard tokens each,
 * numbered from first; *files counts them. */
static int write_part(const char *dir, const char *name, const cddp_tokens *t, int64_t shard,
                      int first, int *files, cddp_error *err) {
    char path[4096];
    if (shard == 0) {
        snprintf(path, sizeof path, "%s/%s.bin", dir, name);
        *files = 1;
        int rc = cddp_tokens_write(path, t, err);
        if (rc == CDDP_ERANGE)
            cddp_error_set(err, rc,
                           "%s: %lld tokens, more than a token file holds (2147483647): give "
                           "--shard_tokens (llm.c's FineWeb shards hold 100000000)",
                           path, (long long)t->count);
        return rc;
    }
    *files = 0;
    for (int64_t at = 0; at < t->count || *files == 0; at += shard) {
        snprintf(path, sizeof path, "%s/%s_%06d.bin", dir, name, first + *files);
        cddp_tokens part = {.count = t->count - at < shard ? t->count - at : shard,
                            .data = t->data ? t->data + at : NULL,
                            .wide = t->wide ? t->wide + at : NULL,
                            .vocab_size = t->vocab_size};
        CDDP_TRY(cddp_tokens_write(path, &part, err));
        ++*files;
    }
    return CDDP_OK;
}

int main(int argc, char **argv) {
    double val_fraction = 0.1;
    int64_t shard = 0;
    const char *tokenizer = NULL;
    static const struct option longopts[] = {{"tokenizer", required_argument, 0, 't'},
                                             {"val_fraction", required_argument, 0, 'v'},
                                             {"shard_tokens", required_argument, 0, 's'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 't') {
            tokenizer = optarg;
        } else if (c == 'v') {
            cddp_error err = {0};
            if (cddp_parse_double("--val_fraction", optarg, 0, 0.99, true, &val_fraction, &err)) {
                fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
                return 2;
            }
        } else if (c == 's') {
            cddp_error err = {0};
            if (cddp_parse_int("--shard_tokens", optarg, 1, INT32_MAX, &shard, &err)) {
                fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
                return 2;
            }
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "cddp-tokenize: expected INPUT and OUTDIR (see --help)\n");
        return 2;
    }
    const char *in = argv[optind], *dir = argv[optind + 1];
    cddp_error err = {0};
    cddp_tokens all, train, val;
    cddp_tokenizer *tok = NULL;
    if (tokenizer && !(tok = cddp_tokenizer_load(tokenizer, &err))) {
        fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
        return 1;
    }
    int loaded = tok ? cddp_tokens_encode(tok, in, &all, &err) : cddp_tokens_load(in, &all, &err);
    cddp_tokenizer_destroy(tok);
    if (loaded != CDDP_OK) {
        fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = cddp_tokens_split(&all, val_fraction, &train, &val, &err);
    if (rc == CDDP_OK && mkdir(dir, 0755) != 0 && errno != EEXIST)
        rc = cddp_error_set(&err, CDDP_EIO, "cannot create %s: %s", dir, strerror(errno));
    int ntrain = 0, nval = 0;
    for (int k = 0; rc == CDDP_OK && shard > 0 && k < 2; k++) { /* never mixed with old shards */
        char pattern[4096];
        glob_t g;
        snprintf(pattern, sizeof pattern, "%s/%s_*.bin", dir, k ? "val" : "train");
        if (glob(pattern, 0, NULL, &g) == 0)
            rc = cddp_error_set(&err, CDDP_EINVAL,
                                "%s already holds %zu shards (%s): a pattern would read them with "
                                "the new ones; give an empty folder",
                                dir, g.gl_pathc, g.gl_pathv[0]);
        globfree(&g);
    }
    if (rc == CDDP_OK) rc = write_part(dir, "train", &train, shard, 1, &ntrain, &err);
    if (rc == CDDP_OK) rc = write_part(dir, "val", &val, shard, 0, &nval, &err);
    if (rc == CDDP_OK && shard == 0)
        printf("cddp-tokenize: %lld tokens (vocabulary %lld) from %s: %s/train.bin (%lld), "
               "%s/val.bin (%lld)\n",
               (long long)all.count, (long long)all.vocab_size, in, dir, (long long)train.count,
               dir, (long long)val.count);
    else if (rc == CDDP_OK)
        printf("cddp-tokenize: %lld tokens from %s: %s/train_*.bin (%lld in %d shards), "
               "%s/val_*.bin (%lld in %d); train with gpt_train --data '%s/train_*.bin'\n",
               (long long)all.count, in, dir, (long long)train.count, ntrain, dir,
               (long long)val.count, nval, dir);
    else
        fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
    cddp_tokens_free(&all);
    cddp_tokens_free(&train);
    cddp_tokens_free(&val);
    return rc == CDDP_OK ? 0 : 1;
}
