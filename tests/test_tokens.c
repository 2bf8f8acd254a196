/* test_tokens.c: llm.c's token files (byte layout, round trips, corrupt and fuzzed files), the
 * byte tokenizer, folders of text, the train/validation split, and the dataset of windows under
 * the DistributedSampler, down to the real fortunes corpus. */
#include "helpers.h"

#include <sys/stat.h>
#include <unistd.h>

static void put(const char *name, const void *data, size_t n, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", test_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A token file as llm.c's write_datafile lays it out, built byte by byte. */
static size_t llmc_file(uint8_t *buf, const uint16_t *tokens, uint32_t count) {
    memset(buf, 0, 1024);
    le32(buf, 20240520);
    le32(buf + 4, 1);
    le32(buf + 8, count);
    for (uint32_t i = 0; i < count; i++) {
        buf[1024 + 2 * i] = (uint8_t)tokens[i];
        buf[1024 + 2 * i + 1] = (uint8_t)(tokens[i] >> 8);
    }
    return 1024 + 2 * (size_t)count;
}

static void test_layout_and_round_trip(void **state) {
    (void)state;
    uint16_t tokens[7] = {0, 1, 255, 256, 50256, 65535, 42};
    char path[512];
    snprintf(path, sizeof path, "%s/t.bin", test_dir);
    cddp_error err = {0};
    assert_int_equal(cddp_tokens_write(path, &(cddp_tokens){.count = 7, .data = tokens}, &err),
                     CDDP_OK);
    size_t n;
    uint8_t *got = slurp(path, &n), want[1024 + 14];
    assert_int_equal(n, llmc_file(want, tokens, 7));
    assert_memory_equal(got, want, n);
    free(got);
    cddp_tokens t;
    assert_int_equal(cddp_tokens_read(path, &t, &err), CDDP_OK);
    assert_int_equal(t.count, 7);
    assert_memory_equal(t.data, tokens, sizeof tokens);
    cddp_tokens_free(&t);
    assert_null(t.data);
    /* cddp_tokens_load recognises the magic; an empty token file is valid. */
    assert_int_equal(cddp_tokens_load(path, &t, &err), CDDP_OK);
    assert_int_equal(t.count, 7);
    assert_int_equal(t.data[4], 50256);
    cddp_tokens_free(&t);
    assert_int_equal(cddp_tokens_write(path, &(cddp_tokens){.count = 0, .data = tokens}, &err),
                     CDDP_OK);
    assert_int_equal(cddp_tokens_read(path, &t, &err), CDDP_OK);
    assert_int_equal(t.count, 0);
    cddp_tokens_free(&t);
    /* A count beyond the header's int32, and a folder that does not exist: clear errors, and no
     * temporary file is left behind. */
    assert_int_equal(
        cddp_tokens_write(path, &(cddp_tokens){.count = (int64_t)INT32_MAX + 1, .data = tokens},
                          &err),
        CDDP_ERANGE);
    assert_non_null(strstr(err.msg, "an int32 count"));
    assert_int_equal(
        cddp_tokens_write("/nonexistent/t.bin", &(cddp_tokens){.count = 7, .data = tokens}, &err),
        CDDP_EIO);
    assert_non_null(strstr(err.msg, "does the folder exist"));
}

static void expect_error(const void *bytes, size_t n, int code, const char *text) {
    char path[512];
    put("bad.bin", bytes, n, path, sizeof path);
    cddp_tokens t = {.count = 99};
    cddp_error err = {0};
    assert_int_equal(cddp_tokens_read(path, &t, &err), code);
    if (!strstr(err.msg, text)) fail_msg("error '%s' lacks '%s'", err.msg, text);
    assert_non_null(strstr(err.msg, path));
    assert_null(t.data);
    assert_int_equal(t.count, 0);
}

static void test_corrupt_files(void **state) {
    (void)state;
    uint16_t tokens[5] = {10, 20, 30, 40, 50};
    uint8_t buf[1024 + 64];
    size_t n = llmc_file(buf, tokens, 5);
    expect_error(buf, n - 1, CDDP_EFORMAT, "truncated: the header promises 5 tokens (1034 bytes");
    expect_error(buf, n - 2, CDDP_EFORMAT, "truncated");
    expect_error(buf, 1024, CDDP_EFORMAT, "truncated");
    expect_error(buf, 1000, CDDP_EFORMAT, "shorter than the 1024-byte header");
    expect_error(buf, 0, CDDP_EFORMAT, "shorter than the 1024-byte header");
    buf[n] = 7;
    expect_error(buf, n + 1, CDDP_EFORMAT, "trailing bytes");
    le32(buf, 20240521);
    expect_error(buf, n, CDDP_EFORMAT, "magic 20240521, expected 20240520");
    le32(buf, 20240520);
    le32(buf + 4, 2);
    expect_error(buf, n, CDDP_EFORMAT, "version 2, only version 1");
    le32(buf + 4, 1);
    le32(buf + 8, 0x80000001u);
    expect_error(buf, n, CDDP_EFORMAT, "negative token count");
    /* A count far beyond the file is refused from the size alone, before any allocation. */
    le32(buf + 8, 0x7FFFFFFFu);
    expect_error(buf, n, CDDP_EFORMAT, "the header promises 2147483647 tokens");
    cddp_tokens t;
    cddp_error err = {0};
    assert_int_equal(cddp_tokens_read("/nonexistent/t.bin", &t, &err), CDDP_ENOENT);
    assert_non_null(strstr(err.msg, "cannot open token file /nonexistent/t.bin"));
    assert_int_equal(cddp_tokens_read(test_dir, &t, &err), CDDP_EIO);
    assert_non_null(strstr(err.msg, "not a regular file"));
}

/* Llama 3's files (uint32 tokens, magic 20240801, version 7) and the vocabulary cddp records in
 * the header's fourth int32: written, read back (mapped), split and windowed as uint16 files are;
 * a uint16 file that says its vocabulary is past 65,536 is refused, as is writing one. */
static void test_wide_and_vocab(void **state) {
    (void)state;
    uint32_t tokens[6] = {0, 1, 65535, 65536, 128255, 7};
    char path[512];
    snprintf(path, sizeof path, "%s/wide.bin", test_dir);
    cddp_error err = {0};
    cddp_tokens w = {.count = 6, .wide = tokens, .vocab_size = 128256};
    assert_int_equal(cddp_tokens_write(path, &w, &err), CDDP_OK);
    size_t n;
    uint8_t *got = slurp(path, &n);
    assert_int_equal(n, 1024 + 24);
    uint8_t head[16];
    le32(head, 20240801);
    le32(head + 4, 7);
    le32(head + 8, 6);
    le32(head + 12, 128256);
    assert_memory_equal(got, head, 16);
    for (size_t i = 16; i < 1024; i++) assert_int_equal(got[i], 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(got[1024 + 4 * i] | got[1025 + 4 * i] << 8 | got[1026 + 4 * i] << 16 |
                             (uint32_t)got[1027 + 4 * i] << 24,
                         tokens[i]);
    free(got);
    cddp_tokens t, a, b;
    assert_int_equal(cddp_tokens_load(path, &t, &err), CDDP_OK);
    assert_null(t.data);
    assert_non_null(t.map);
    assert_int_equal(t.count, 6);
    assert_int_equal(t.vocab_size, 128256);
    assert_memory_equal(t.wide, tokens, sizeof tokens);
    assert_int_equal(cddp_tokens_split(&t, 0.5, &a, &b, &err), CDDP_OK);
    assert_int_equal(a.wide[2], 65535);
    assert_int_equal(b.wide[1], 128255);
    assert_int_equal(b.vocab_size, 128256);
    cddp_dataset *ds = cddp_dataset_token_windows(&t, 2, 2, &err);
    assert_non_null(ds);
    int64_t x[2], y[2];
    void *out[2] = {x, y};
    assert_int_equal(cddp_dataset_get(ds, 1, out, &err), CDDP_OK);
    assert_int_equal(x[0], 65535);
    assert_int_equal(x[1], 65536);
    assert_int_equal(y[1], 128255);
    cddp_dataset_destroy(ds);
    cddp_tokens_free(&a);
    cddp_tokens_free(&b);
    cddp_tokens_free(&t);
    /* a uint16 file records its vocabulary too; past 16 bits it is refused both ways */
    uint16_t small[3] = {1, 2, 3};
    assert_int_equal(
        cddp_tokens_write(path, &(cddp_tokens){.count = 3, .data = small, .vocab_size = 50257},
                          &err),
        CDDP_OK);
    assert_int_equal(cddp_tokens_read(path, &t, &err), CDDP_OK);
    assert_int_equal(t.vocab_size, 50257);
    cddp_tokens_free(&t);
    assert_int_equal(
        cddp_tokens_write(path, &(cddp_tokens){.count = 3, .data = small, .vocab_size = 70000},
                          &err),
        CDDP_ERANGE);
    assert_non_null(strstr(err.msg, "a vocabulary of 70000 tokens for uint16 tokens"));
    uint8_t buf[1024 + 6];
    llmc_file(buf, small, 3);
    le32(buf + 12, 70000);
    expect_error(buf, sizeof buf, CDDP_EFORMAT, "a vocabulary of 70000 tokens recorded for uint16");
    le32(buf + 12, 0);
    le32(buf, 20240801);
    expect_error(buf, sizeof buf, CDDP_EFORMAT, "version 1, only version 7 (uint32 tokens)");
    /* the byte tokenizer's text is a vocabulary of 256 */
    put("text.txt", "hi", 2, path, sizeof path);
    assert_int_equal(cddp_tokens_load(path, &t, &err), CDDP_OK);
    assert_int_equal(t.vocab_size, 256);
    cddp_tokens_free(&t);
}

/* 3000 random mutations of a valid file: each cut, extension or byte change either reads back
 * exactly what the bytes say or is a format error naming the file; nothing else. */
static void test_fuzzed_files(void **state) {
    (void)state;
    enum { N = 40 };
    uint16_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (uint16_t)(i * 2654435761u >> 7);
    uint8_t good[1024 + 2 * N + 8], buf[sizeof good];
    size_t n = llmc_file(good, tokens, N);
    uint64_t s = 12345;
    int ok = 0, bad = 0;
    char path[512];
    for (int round = 0; round < 3000; round++) {
        memcpy(buf, good, n);
        size_t len = n;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(s >> 33);
        switch (r % 4) {
        case 0:
            len = r / 4 % (n + 8);
            break; /* cut or extend */
        case 1:
            buf[r / 4 % 12] ^= (uint8_t)(1 + r / 64 % 255);
            break; /* the header's ints */
        case 2:
            buf[12 + r / 4 % 1012] ^= (uint8_t)(1 + r / 64 % 255);
            break; /* header padding */
        default:
            buf[1024 + r / 4 % (2 * N)] ^= (uint8_t)(1 + r / 64 % 255); /* a token */
        }
        put("fuzz.bin", buf, len, path, sizeof path);
        cddp_tokens t;
        cddp_error err = {0};
        int rc = cddp_tokens_read(path, &t, &err);
        if (rc == CDDP_OK) {
            ok++;
            assert_int_equal(len, n);
            assert_memory_equal(buf, good, 12);
            assert_int_equal(t.count, N);
            assert_int_equal(t.vocab_size, (int32_t)(buf[12] | buf[13] << 8 | buf[14] << 16 |
                                                     (uint32_t)buf[15] << 24));
            for (int i = 0; i < N; i++)
                assert_int_equal(t.data[i], buf[1024 + 2 * i] | buf[1024 + 2 * i + 1] << 8);
            cddp_tokens_free(&t);
        } else {
            bad++;
            assert_int_equal(rc, CDDP_EFORMAT);
            assert_non_null(strstr(err.msg, path));
            assert_null(t.data);
            assert_true(len != n || memcmp(buf, good, 16) != 0); /* or a vocabulary past 16 bits */
        }
    }
    /* Both outcomes happen often: the mutations are not all caught by one check. */
    assert_true(ok > 1000);
    assert_true(bad > 1000);
}

static void test_text_and_folders(void **state) {
    (void)state;
    uint8_t bytes[300];
    for (int i = 0; i < 300; i++) bytes[i] = (uint8_t)(i * 7 + 1);
    char path[512], dir[300];
    put("all.txt", bytes, 300, path, sizeof path);
    cddp_tokens t;
    cddp_error err = {0};
    assert_int_equal(cddp_tokens_from_text(path, &t, &err), CDDP_OK);
    assert_int_equal(t.count, 300);
    for (int i = 0; i < 300; i++) assert_int_equal(t.data[i], bytes[i]);
    cddp_tokens_free(&t);
    /* Text that happens to be short, or starts like anything else, is text to the loader. */
    put("short.txt", "hi", 2, path, sizeof path);
    assert_int_equal(cddp_tokens_load(path, &t, &err), CDDP_OK);
    assert_int_equal(t.count, 2);
    assert_int_equal(t.data[1], 'i');
    cddp_tokens_free(&t);

    /* A folder: text files in name order; binary files, links and hidden files skipped. */
    snprintf(dir, sizeof dir, "%s/corpus", test_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    put("corpus/b", "second\n", 7, path, sizeof path);
    put("corpus/a", "first\n", 6, path, sizeof path);
    put("corpus/a.dat", "\0\0\0\2xx", 6, path, sizeof path);
    put("corpus/.hidden", "no\n", 3, path, sizeof path);
    char link[400];
    snprintf(link, sizeof link, "%s/c.u8", dir);
    assert_int_equal(symlink("a", link), 0);
    assert_int_equal(cddp_tokens_load(dir, &t, &err), CDDP_OK);
    assert_int_equal(t.count, 13);
    char text[14];
    for (int i = 0; i < 13; i++) text[i] = (char)t.data[i];
    text[13] = 0;
    assert_string_equal(text, "first\nsecond\n");
    cddp_tokens_free(&t);
    snprintf(dir, sizeof dir, "%s/empty", test_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(cddp_tokens_load(dir, &t, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "no text file in this folder"));
    assert_int_equal(cddp_tokens_load("/nonexistent/text", &t, &err), CDDP_ENOENT);
    assert_non_null(strstr(err.msg, "cannot open data file /nonexistent/text"));
}

static void test_split(void **state) {
    (void)state;
    uint16_t d[100];
    for (int i = 0; i < 100; i++) d[i] = (uint16_t)i;
    cddp_tokens all = {.count = 100, .data = d}, train, val;
    cddp_error err = {0};
    assert_int_equal(cddp_tokens_split(&all, 0.1, &train, &val, &err), CDDP_OK);
    assert_int_equal(train.count, 90);
    assert_int_equal(val.count, 10);
    assert_int_equal(train.data[89], 89);
    assert_int_equal(val.data[0], 90);
    assert_int_equal(val.data[9], 99);
    cddp_tokens_free(&train);
    cddp_tokens_free(&val);
    assert_int_equal(cddp_tokens_split(&all, 0, &train, &val, &err), CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "not in (0, 1)"));
    assert_int_equal(cddp_tokens_split(&all, 1, &train, &val, &err), CDDP_EINVAL);
    all.count = 1;
    assert_int_equal(cddp_tokens_split(&all, 0.5, &train, &val, &err), CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "a part would be empty"));
    assert_null(train.data);
}

static void test_windows_under_the_sampler(void **state) {
    (void)state;
    uint16_t d[103];
    for (int i = 0; i < 103; i++) d[i] = (uint16_t)(1000 + i);
    cddp_tokens text = {.count = 103, .data = d};
    cddp_error err = {0};
    /* (103 - 8 - 1) / 8 + 1 = 12 windows that do not overlap; with stride 3, 32. */
    cddp_dataset *ds = cddp_dataset_token_windows(&text, 8, 8, &err);
    assert_non_null(ds);
    assert_int_equal(cddp_dataset_len(ds), 12);
    assert_string_equal(cddp_dataset_field(ds, 0)->name, "x");
    assert_int_equal(cddp_dataset_field(ds, 1)->dtype, CDDP_I64);
    assert_int_equal(cddp_dataset_field(ds, 1)->shape[0], 8);
    int64_t x[8], y[8];
    void *out[2] = {x, y};
    assert_int_equal(cddp_dataset_get(ds, 11, out, &err), CDDP_OK);
    for (int j = 0; j < 8; j++) {
        assert_int_equal(x[j], 1000 + 88 + j);
        assert_int_equal(y[j], 1000 + 89 + j);
    }
    assert_int_equal(cddp_dataset_get(ds, 12, out, &err), CDDP_ERANGE);
    cddp_dataset *ov = cddp_dataset_token_windows(&text, 8, 3, &err);
    assert_int_equal(cddp_dataset_len(ov), 32);
    assert_int_equal(cddp_dataset_get(ov, 31, out, &err), CDDP_OK);
    assert_int_equal(y[7], 1000 + 93 + 8); /* window 31 starts at token 93 */
    cddp_dataset_destroy(ov);

    /* Three ranks, shuffled, drop_last: every window at most once per epoch, the ranks' windows
     * disjoint, and the batches carry the windows' tokens. */
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        int seen[12] = {0};
        for (int r = 0; r < 3; r++) {
            cddp_sampler_options so = cddp_sampler_defaults();
            so.num_replicas = 3;
            so.rank = r;
            so.drop_last = true;
            so.seed = 7;
            cddp_sampler *s = cddp_sampler_create(12, &so, &err);
            cddp_sampler_set_epoch(s, epoch);
            cddp_loader *l =
                cddp_loader_create(ds, s, &(cddp_loader_options){.batch_size = 2}, &err);
            assert_non_null(l);
            assert_int_equal(cddp_loader_begin(l), 2);
            cddp_batch b;
            while (cddp_loader_next(l, &b, &err) == 1)
                for (int64_t k = 0; k < b.size; k++) {
                    int64_t w = b.indices[k];
                    seen[w]++;
                    const int64_t *bx = (const int64_t *)b.data[0] + k * 8;
                    const int64_t *by = (const int64_t *)b.data[1] + k * 8;
                    assert_int_equal(bx[0], 1000 + 8 * w);
                    assert_int_equal(by[7], 1000 + 8 * w + 8);
                }
            cddp_loader_destroy(l);
            cddp_sampler_destroy(s);
        }
        for (int w = 0; w < 12; w++) assert_int_equal(seen[w], 1);
    }
    cddp_dataset_destroy(ds);

    text.count = 8;
    assert_null(cddp_dataset_token_windows(&text, 8, 8, &err));
    assert_non_null(strstr(err.msg, "8 tokens, a window of 8 needs at least 9"));
    assert_null(cddp_dataset_token_windows(&text, 4, 0, &err));
    assert_non_null(strstr(err.msg, "must be positive"));
}

/* A token file read is the file mapped (on this little-endian host), private: a write to the
 * tokens does not reach the file, and another read sees the file's tokens. */
static void test_mapped(void **state) {
    (void)state;
    uint16_t tokens[5] = {7, 8, 9, 65535, 0};
    char path[512];
    snprintf(path, sizeof path, "%s/m.bin", test_dir);
    cddp_error err = {0};
    assert_int_equal(cddp_tokens_write(path, &(cddp_tokens){.count = 5, .data = tokens}, &err),
                     CDDP_OK);
    cddp_tokens a, b;
    assert_int_equal(cddp_tokens_read(path, &a, &err), CDDP_OK);
    assert_non_null(a.map);
    assert_int_equal(a.map_bytes, 1024 + 10);
    assert_ptr_equal(a.data, (uint8_t *)a.map + 1024);
    assert_memory_equal(a.data, tokens, sizeof tokens);
    a.data[0] = 1234;
    assert_int_equal(cddp_tokens_read(path, &b, &err), CDDP_OK);
    assert_int_equal(b.data[0], 7);
    /* the file replaced while mapped: the mapping keeps the old tokens */
    uint16_t other[3] = {1, 2, 3};
    assert_int_equal(cddp_tokens_write(path, &(cddp_tokens){.count = 3, .data = other}, &err),
                     CDDP_OK);
    assert_int_equal(b.count, 5);
    assert_int_equal(b.data[3], 65535);
    cddp_tokens_free(&a);
    cddp_tokens_free(&b);
    assert_null(a.data);
    assert_null(a.map);
}

/* Windows over shards: numbered on across them, none across two, a short shard has none; the
 * shards are taken over (the caller's zeroed). */
static void test_shards(void **state) {
    (void)state;
    cddp_error err = {0};
    int64_t sizes[3] = {20, 4, 14}; /* windows of 4 at stride 4: 4, 0 (4 tokens: too short), 3 */
    cddp_tokens sh[3];
    for (int k = 0; k < 3; k++) {
        uint16_t d[20];
        for (int i = 0; i < sizes[k]; i++) d[i] = (uint16_t)(1000 * (k + 1) + i);
        char path[512];
        snprintf(path, sizeof path, "%s/shard_train_%d.bin", test_dir, k);
        assert_int_equal(
            cddp_tokens_write(path, &(cddp_tokens){.count = sizes[k], .data = d}, &err), CDDP_OK);
        assert_int_equal(cddp_tokens_read(path, &sh[k], &err), CDDP_OK);
    }
    cddp_dataset *ds = cddp_dataset_token_shards(sh, 3, 4, 4, &err);
    assert_non_null(ds);
    for (int k = 0; k < 3; k++) {
        assert_null(sh[k].data);
        assert_null(sh[k].map);
        assert_int_equal(sh[k].count, 0);
    }
    assert_int_equal(cddp_dataset_len(ds), 7);
    int64_t x[4], y[4];
    void *out[2] = {x, y};
    const int64_t want_x0[7] = {1000, 1004, 1008, 1012, 3000, 3004, 3008};
    for (int64_t i = 0; i < 7; i++) {
        assert_int_equal(cddp_dataset_get(ds, i, out, &err), CDDP_OK);
        for (int j = 0; j < 4; j++) {
            assert_int_equal(x[j], want_x0[i] + j);
            assert_int_equal(y[j], want_x0[i] + j + 1); /* within its shard */
        }
    }
    assert_int_equal(cddp_dataset_get(ds, 7, out, &err), CDDP_ERANGE);
    cddp_dataset_destroy(ds);

    /* no shard long enough: the longest named; the shards released all the same */
    uint16_t *d = cddp_malloc(2 * sizeof *d), *e = cddp_malloc(3 * sizeof *e);
    d[0] = d[1] = e[0] = e[1] = e[2] = 1;
    cddp_tokens few[2] = {{.count = 2, .data = d}, {.count = 3, .data = e}};
    assert_null(cddp_dataset_token_shards(few, 2, 4, 1, &err));
    assert_non_null(
        strstr(err.msg, "the longest shard holds 3 tokens, a window of 4 needs at least 5"));
    assert_null(few[0].data);
    assert_null(few[1].data);
}

/* The corpus of the GPT example and tests: Debian's fortunes folder. */
static void test_fortunes(void **state) {
    (void)state;
    cddp_tokens t;
    cddp_error err = {0};
    if (cddp_tokens_load("/usr/share/games/fortunes", &t, &err) != CDDP_OK)
        fail_msg("%s (install Debian's fortunes package; make test does)", err.msg);
    /* 43 text files of fortunes and fortunes-min, 2.5 MB; the .dat indexes are not text. */
    assert_true(t.count > 2400000 && t.count < 2700000);
    int64_t newlines = 0, percents = 0;
    for (int64_t i = 0; i < t.count; i++) {
        assert_true(t.data[i] > 0 && t.data[i] < 256);
        newlines += t.data[i] == '\n';
        percents += t.data[i] == '%' && i > 0 && t.data[i - 1] == '\n';
    }
    assert_true(newlines > 50000);
    assert_true(percents > 10000); /* fortunes are separated by lines holding "%" */
    cddp_tokens_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_round_trip),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_wide_and_vocab),
        cmocka_unit_test(test_fuzzed_files),
        cmocka_unit_test(test_text_and_folders),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_windows_under_the_sampler),
        cmocka_unit_test(test_mapped),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_fortunes),
    };
    return cmocka_run_group_tests(tests, temp_dir_setup, temp_dir_teardown);
}
