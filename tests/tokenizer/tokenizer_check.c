/* tokenizer_check.c DIR: cddp's byte-level BPE tokenizer against Hugging Face's tokenizers, on
 * what tests/tokenizer/make_tokenizers.py wrote in DIR.
 *
 * For every line of DIR/cases (a tokenizer file, a text, whose ids), the ids cddp_tokenizer_encode
 * gives are those tokenizers gave, token for token (the first difference is printed with the
 * text around it), and decoding them gives what tokenizers decodes them to, byte for byte: the
 * text itself with GPT-2's and Llama 3's settings (make_tokenizers.py checks); text that is not
 * UTF-8 round-trips too; the beginning- and end-of-text tokens are found; an id outside the
 * vocabulary is refused on decode; and every file of DIR/refusals is refused with the words given
 * there. Prints each text's encoding speed beside tokenizers' (bench/tokenizer.sh compares them
 * over rounds). */
#include <cddp/cddp.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL: " __VA_ARGS__);                                                              \
        printf("\n");                                                                              \
        failures++;                                                                                \
    } while (0)

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FAIL: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) exit(1);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cddp_tokenizer *load(const char *dir, const char *name) {
    char path[4096];
    cddp_error err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cddp_tokenizer *t = cddp_tokenizer_load(path, &err);
    if (!t) FAIL("%s: %s", name, err.msg);
    return t;
}

/* Prints the pieces of ids[from, to) as the text they stand for, escaped. */
static void show(const cddp_tokenizer *t, const int32_t *ids, int64_t from, int64_t to) {
    for (int64_t i = from < 0 ? 0 : from; i < to; i++) {
        size_t n;
        const char *p = cddp_tokenizer_piece(t, ids[i], &n);
        printf(" %" PRId32 ":\"", ids[i]);
        for (size_t k = 0; p && k < n; k++)
            printf((uint8_t)p[k] < 32 || p[k] == '"' ? "\\x%02x" : "%c", (uint8_t)p[k]);
        printf("\"");
    }
    printf("\n");
}

static void check_case(const char *dir, const char *file, const char *text_name, const char *ref) {
    char path[4096];
    size_t len, ref_bytes;
    snprintf(path, sizeof path, "%s/%s.txt", dir, text_name);
    char *text = slurp(path, &len);
    snprintf(path, sizeof path, "%s/%s.%s.ids", dir, ref, text_name);
    int32_t *want = (int32_t *)slurp(path, &ref_bytes);
    int64_t nwant = (int64_t)(ref_bytes / 4);
    cddp_tokenizer *t = load(dir, file);
    cddp_error err = {0};
    int32_t *ids = NULL;
    int64_t n = 0;
    double start = now();
    if (t && cddp_tokenizer_encode(t, text, len, &ids, &n, &err) != CDDP_OK)
        FAIL("%s on %s: %s", file, text_name, err.msg);
    double took = now() - start;
    if (ids) {
        int64_t i = 0;
        while (i < n && i < nwant && ids[i] == want[i]) i++;
        if (i < n || i < nwant) {
            FAIL("%s on %s: %" PRId64 " ids where tokenizers gives %" PRId64
                 ", the first difference at %" PRId64 ":",
                 file, text_name, n, nwant, i);
            printf("  cddp:      ");
            show(t, ids, i - 3, i + 4 < n ? i + 4 : n);
            printf("  tokenizers:");
            show(t, want, i - 3, i + 4 < nwant ? i + 4 : nwant);
        }
        char *back = NULL;
        size_t blen = 0, dlen;
        snprintf(path, sizeof path, "%s/%s.%s.decoded", dir, ref, text_name);
        char *decoded = slurp(path, &dlen);
        if (cddp_tokenizer_decode(t, ids, n, &back, &blen, &err) != CDDP_OK)
            FAIL("%s on %s: decode: %s", file, text_name, err.msg);
        else if (blen != dlen || memcmp(back, decoded, dlen) != 0)
            FAIL("%s on %s: decoded to %zu bytes, tokenizers to %zu%s", file, text_name, blen, dlen,
                 dlen == len && memcmp(decoded, text, len) == 0 ? " (the text)" : "");
        cddp_free(back);
        free(decoded);
        printf("%-22s %-9s %9zu bytes -> %8" PRId64 " tokens, %6.2f MB/s\n", file, text_name, len,
               n, (double)len / took / 1e6);
    }
    cddp_free(ids);
    cddp_tokenizer_destroy(t);
    free(text);
    free(want);
}

/* What holds beyond the reference's ids: special tokens, bytes that are not UTF-8, bad ids. */
static void check_more(const char *dir) {
    cddp_tokenizer *gpt2 = load(dir, "gpt2"), *llama = load(dir, "llama3/tokenizer.json");
    if (!gpt2 || !llama) return;
    int64_t eot = cddp_tokenizer_id(gpt2, "<|endoftext|>");
    if (eot < 0 || cddp_tokenizer_bos(gpt2) != eot || cddp_tokenizer_eos(gpt2) != eot)
        FAIL("gpt2: <|endoftext|> is %" PRId64 ", bos %" PRId64 ", eos %" PRId64 ": want all one",
             eot, cddp_tokenizer_bos(gpt2), cddp_tokenizer_eos(gpt2));
    int64_t bos = cddp_tokenizer_id(llama, "<|begin_of_text|>");
    int64_t end = cddp_tokenizer_id(llama, "<|end_of_text|>");
    if (bos < 0 || end < 0 || cddp_tokenizer_bos(llama) != bos || cddp_tokenizer_eos(llama) != end)
        FAIL("llama3: bos %" PRId64 " (want %" PRId64 "), eos %" PRId64 " (want %" PRId64 ")",
             cddp_tokenizer_bos(llama), bos, cddp_tokenizer_eos(llama), end);
    if (cddp_tokenizer_id(gpt2, "Ġthe") < 0 ||
        cddp_tokenizer_id(gpt2, "Ġthe") != cddp_tokenizer_id(gpt2, " the"))
        FAIL("gpt2: \"Ġthe\" is %" PRId64 ", \" the\" %" PRId64, cddp_tokenizer_id(gpt2, "Ġthe"),
             cddp_tokenizer_id(gpt2, " the"));
    static const char bad[] = "ok \xff\xfe latin-1 caf\xe9 cut \xe2\x82 end\x80 \xf0\x9f\x99";
    cddp_error err = {0};
    for (int k = 0; k < 2; k++) {
        cddp_tokenizer *t = k ? llama : gpt2;
        int32_t *ids = NULL;
        int64_t n = 0;
        char *back = NULL;
        size_t blen = 0;
        if (cddp_tokenizer_encode(t, bad, sizeof bad - 1, &ids, &n, &err) != CDDP_OK ||
            cddp_tokenizer_decode(t, ids, n, &back, &blen, &err) != CDDP_OK)
            FAIL("text that is not UTF-8: %s", err.msg);
        else if (blen != sizeof bad - 1 || memcmp(back, bad, blen) != 0)
            FAIL("text that is not UTF-8 does not round-trip (%zu bytes back of %zu)", blen,
                 sizeof bad - 1);
        cddp_free(ids);
        cddp_free(back);
    }
    int32_t wrong[2] = {5, (int32_t)cddp_tokenizer_vocab_size(gpt2)};
    char *back = NULL;
    size_t blen;
    if (cddp_tokenizer_decode(gpt2, wrong, 2, &back, &blen, &err) != CDDP_ERANGE || back ||
        !strstr(err.msg, "is not in"))
        FAIL("decoding id %" PRId32 " (the vocabulary's size): %s", wrong[1], err.msg);
    cddp_tokenizer_destroy(gpt2);
    cddp_tokenizer_destroy(llama);
}

static void check_refusals(const char *dir) {
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/refusals", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        FAIL("no %s", path);
        return;
    }
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = '\0';
        tab[strcspn(tab + 1, "\n") + 1] = '\0';
        snprintf(path, sizeof path, "%s/%s", dir, line);
        cddp_error err = {0};
        cddp_tokenizer *t = cddp_tokenizer_load(path, &err);
        if (t || !strstr(err.msg, tab + 1))
            FAIL("%s: %s, where the message should say '%s'", line, t ? "loaded" : err.msg,
                 tab + 1);
        cddp_tokenizer_destroy(t);
        n++;
    }
    fclose(f);
    cddp_error err = {0};
    snprintf(path, sizeof path, "%s/refused", dir);
    if (cddp_tokenizer_load(path, &err) || err.code != CDDP_ENOENT ||
        !strstr(err.msg, "holds no tokenizer.json"))
        FAIL("a folder without a tokenizer: %s", err.msg);
    printf("%d files refused, each naming why\n", n);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (written by make_tokenizers.py)\n", argv[0]);
        return 2;
    }
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/cases", argv[1]);
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("FAIL: no %s\n", path);
        return 1;
    }
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        char file[256], text[64], ref[64];
        if (sscanf(line, "%255s %63s %63s", file, text, ref) != 3) continue;
        check_case(argv[1], file, text, ref);
        cases++;
    }
    fclose(f);
    if (cases < 16) FAIL("%d cases in %s, expected 16", cases, path);
    check_more(argv[1]);
    check_refusals(argv[1]);
    printf("%d cases, %d failed\n", cases, failures);
    return failures ? 1 : 0;
}
