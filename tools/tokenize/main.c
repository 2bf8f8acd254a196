/* cddp-tokenize: turns text into llm.c's token files with the byte tokenizer.
 *
 *   cddp-tokenize /usr/share/games/fortunes data/fortunes     -> data/fortunes/{train,val}.bin
 *
 * The input is a text file or a folder of them (every regular file holding text, in name order).
 * The first 90% of the tokens go to train.bin and the rest to val.bin (--val_fraction), as
 * nanoGPT's prepare scripts split their text; gpt_train --data DIR/train.bin reads both.
 */
#include <cddp/cddp.h>

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: cddp-tokenize [--val_fraction X] INPUT OUTDIR\n"
            "Reads INPUT (a text file, or a folder whose text files are read in name order) as\n"
            "bytes (the byte tokenizer: vocabulary 256) and writes OUTDIR/train.bin and\n"
            "OUTDIR/val.bin in llm.c's token format (a 1024-byte header: magic 20240520,\n"
            "version 1, the count; then uint16 tokens).\n\n"
            "  --val_fraction X   the share of the text, taken from its end, for val.bin\n"
            "                     (default 0.1)\n"
            "  -h, --help         show this help\n");
}

int main(int argc, char **argv) {
    double val_fraction = 0.1;
    static const struct option longopts[] = {
        {"val_fraction", required_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'v') {
            cddp_error err = {0};
            if (cddp_parse_double("--val_fraction", optarg, 0, 0.99, true, &val_fraction, &err)) {
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
    if (cddp_tokens_load(in, &all, &err) != CDDP_OK) {
        fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
        return 1;
    }
    int rc = cddp_tokens_split(&all, val_fraction, &train, &val, &err);
    if (rc == CDDP_OK && mkdir(dir, 0755) != 0 && errno != EEXIST)
        rc = cddp_error_set(&err, CDDP_EIO, "cannot create %s: %s", dir, strerror(errno));
    char path[4096];
    if (rc == CDDP_OK) {
        snprintf(path, sizeof path, "%s/train.bin", dir);
        rc = cddp_tokens_write(path, train.data, train.count, &err);
    }
    if (rc == CDDP_OK) {
        snprintf(path, sizeof path, "%s/val.bin", dir);
        rc = cddp_tokens_write(path, val.data, val.count, &err);
    }
    if (rc == CDDP_OK)
        printf("cddp-tokenize: %lld tokens from %s: %s/train.bin (%lld), %s/val.bin (%lld)\n",
               (long long)all.count, in, dir, (long long)train.count, dir, (long long)val.count);
    else
        fprintf(stderr, "cddp-tokenize: %s\n", err.msg);
    cddp_tokens_free(&all);
    cddp_tokens_free(&train);
    cddp_tokens_free(&val);
    return rc == CDDP_OK ? 0 : 1;
}
