/* test_sampler.c: the DistributedSampler against PyTorch's semantics and the extensions
 * (uneven mode, resumable position, automatic epoch advance), every case twice: with each epoch's
 * order a shuffled list, and by the keyed bijection that large datasets use instead
 * (cddp__sampler_list_max lowered to 0). */
#include "helpers.h"

#include "data/internal.h"

#include <sys/resource.h>

static cddp_sampler *make(int64_t n, int replicas, int rank, bool shuffle, bool drop_last,
                          bool uneven, uint64_t seed) {
    cddp_sampler_options o = {replicas, rank, shuffle, seed, drop_last, uneven};
    cddp_error err = {0};
    cddp_sampler *s = cddp_sampler_create(n, &o, &err);
    if (!s) fail_msg("%s", err.msg);
    return s;
}

/* Hand-derived from PyTorch's DistributedSampler(shuffle=False) on 10 samples, 3 replicas:
 * the list 0..9 is padded with its start (0, 1) to 12 and strided. */
static void test_matches_pytorch_without_shuffle(void **state) {
    (void)state;
    int64_t want_pad[3][4] = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
    int64_t want_drop[3][3] = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
    int64_t want_uneven[3][4] = {{0, 3, 6, 9}, {1, 4, 7, -1}, {2, 5, 8, -1}};
    for (int r = 0; r < 3; r++) {
        int64_t out[4];
        cddp_sampler *s = make(10, 3, r, false, false, false, 0);
        assert_int_equal(cddp_sampler_len(s), 4);
        cddp_sampler_indices(s, 0, out);
        assert_memory_equal(out, want_pad[r], sizeof want_pad[r]);
        cddp_sampler_destroy(s);
        s = make(10, 3, r, false, true, false, 0);
        assert_int_equal(cddp_sampler_len(s), 3);
        cddp_sampler_indices(s, 0, out);
        assert_memory_equal(out, want_drop[r], sizeof want_drop[r]);
        cddp_sampler_destroy(s);
        s = make(10, 3, r, false, false, true, 0);
        assert_int_equal(cddp_sampler_len(s), r == 0 ? 4 : 3);
        cddp_sampler_indices(s, 0, out);
        assert_memory_equal(out, want_uneven[r], sizeof(int64_t) * (size_t)cddp_sampler_len(s));
        cddp_sampler_destroy(s);
    }
    /* Fewer samples than replicas: the padding wraps around more than once. */
    int64_t one[1];
    for (int r = 0; r < 5; r++) {
        cddp_sampler *s = make(2, 5, r, false, false, false, 0);
        assert_int_equal(cddp_sampler_len(s), 1);
        cddp_sampler_indices(s, 0, one);
        assert_int_equal(one[0], r % 2);
        cddp_sampler_destroy(s);
    }
}

/* Replicas 1..9, sizes around multiples of them, every mode: coverage, duplicates, lengths, and
 * agreement between ranks on one permutation. */
static void test_partition_properties(void **state) {
    (void)state;
    for (int R = 1; R <= 9; R++)
        for (int k = 1; k <= 4; k++)
            for (int d = -1; d <= 1; d++)
                for (int mode = 0; mode < 3; mode++) {
                    int64_t N = (int64_t)R * k + d;
                    if (N < 1) continue;
                    bool drop = mode == 1, uneven = mode == 2;
                    int64_t *global = calloc((size_t)(N + R) * 2, sizeof(int64_t));
                    int *seen = calloc((size_t)N, sizeof(int));
                    int64_t total = 0, minlen = INT64_MAX, maxlen = 0;
                    for (int r = 0; r < R; r++) {
                        cddp_sampler *s = make(N, R, r, true, drop, uneven, 42);
                        int64_t len = cddp_sampler_len(s), *out = calloc((size_t)len + 1, 8);
                        cddp_sampler_indices(s, 3, out);
                        for (int64_t j = 0; j < len; j++) {
                            assert_true(out[j] >= 0 && out[j] < N);
                            seen[out[j]]++;
                            global[r + j * R] = out[j]; /* rebuild the list the ranks share */
                        }
                        total += len;
                        minlen = len < minlen ? len : minlen;
                        maxlen = len > maxlen ? len : maxlen;
                        free(out);
                        cddp_sampler_destroy(s);
                    }
                    if (uneven) {
                        assert_int_equal(total, N);
                        assert_true(maxlen - minlen <= 1);
                        for (int64_t i = 0; i < N; i++) assert_int_equal(seen[i], 1);
                    } else if (drop) {
                        assert_int_equal(minlen, N / R);
                        assert_int_equal(maxlen, N / R);
                        for (int64_t i = 0; i < N; i++) assert_true(seen[i] <= 1);
                    } else {
                        int64_t per = (N + R - 1) / R;
                        assert_int_equal(minlen, per);
                        assert_int_equal(maxlen, per);
                        for (int64_t i = 0; i < N; i++) assert_true(seen[i] >= 1);
                        /* The padding repeats the start of the shared permutation. */
                        for (int64_t j = N; j < per * R; j++)
                            assert_int_equal(global[j], global[(j - N) % N]);
                    }
                    /* The first entries of the shared list form one permutation. */
                    int64_t span = uneven ? N : drop ? (N / R) * R : N;
                    int *once = calloc((size_t)N, sizeof(int));
                    for (int64_t j = 0; j < span; j++) assert_int_equal(once[global[j]]++, 0);
                    free(once);
                    free(seen);
                    free(global);
                }
}

/* MindSpore's default sharding: 10 samples on 3 shards gives every shard 4 (two repeated),
 * shuffled, every sample in some shard, a new order the next epoch; a shard_id out of range is
 * refused as the strict view refuses it. */
static void test_mindspore_shards(void **state) {
    (void)state;
    cddp_error err = {0};
    int seen[10] = {0};
    int64_t first[3][4], again[4];
    bool strided = true;
    for (int id = 0; id < 3; id++) {
        cddp_sampler_options o = cddp_sampler_shards(3, id);
        assert_true(o.shuffle);
        assert_false(o.drop_last);
        assert_false(o.uneven);
        cddp_sampler *s = cddp_sampler_create(10, &o, &err);
        assert_non_null(s);
        assert_int_equal(cddp_sampler_len(s), 4);
        assert_int_equal(cddp_sampler_rank(s), id);
        cddp_sampler_indices(s, 0, first[id]);
        for (int j = 0; j < 4; j++) {
            seen[first[id][j]]++;
            strided &= first[id][j] == id + 3 * j || id + 3 * j >= 10;
        }
        cddp_sampler_indices(s, 1, again);
        if (id == 0) assert_memory_not_equal(again, first[0], sizeof again);
        cddp_sampler_destroy(s);
    }
    int total = 0;
    for (int i = 0; i < 10; i++) {
        assert_true(seen[i] >= 1 && seen[i] <= 2);
        total += seen[i];
    }
    assert_int_equal(total, 12);
    assert_false(strided); /* shuffled, not the strict view's order */
    cddp_sampler_options bad = cddp_sampler_shards(3, 3);
    assert_null(cddp_sampler_create(10, &bad, &err));
}

static void test_epochs_change_and_repeat(void **state) {
    (void)state;
    cddp_sampler *s = make(100, 2, 1, true, false, false, 7);
    int64_t a[50], b[50], c[50];
    cddp_sampler_indices(s, 0, a);
    cddp_sampler_indices(s, 1, b);
    cddp_sampler_indices(s, 0, c);
    assert_memory_not_equal(a, b, sizeof a);
    assert_memory_equal(a, c, sizeof a);
    /* Another seed, another order; no shuffle, the identity stride. */
    cddp_sampler *t = make(100, 2, 1, true, false, false, 8);
    cddp_sampler_indices(t, 0, c);
    assert_memory_not_equal(a, c, sizeof a);
    cddp_sampler *u = make(100, 2, 1, false, false, false, 7);
    cddp_sampler_indices(u, 5, c);
    for (int j = 0; j < 50; j++) assert_int_equal(c[j], 1 + 2 * j);
    cddp_sampler_destroy(s);
    cddp_sampler_destroy(t);
    cddp_sampler_destroy(u);
}

/* Collects one iteration through begin/next. */
static int64_t iterate(cddp_sampler *s, int64_t *out) {
    int64_t n = cddp_sampler_begin(s), k = 0, i;
    while ((i = cddp_sampler_next(s)) >= 0) out[k++] = i;
    assert_int_equal(k, n);
    return k;
}

/* Never calling set_epoch still gives a new order each epoch; set_epoch wins when called. */
static void test_automatic_epoch_advance(void **state) {
    (void)state;
    cddp_sampler *s = make(64, 1, 0, true, false, false, 1);
    int64_t e0[64], e1[64], ref[64];
    iterate(s, e0);
    assert_int_equal(cddp_sampler_epoch(s), 0);
    iterate(s, e1);
    assert_int_equal(cddp_sampler_epoch(s), 1);
    cddp_sampler_indices(s, 0, ref);
    assert_memory_equal(e0, ref, sizeof ref);
    cddp_sampler_indices(s, 1, ref);
    assert_memory_equal(e1, ref, sizeof ref);
    assert_memory_not_equal(e0, e1, sizeof e0);
    /* The PyTorch pattern: set_epoch before every iteration. */
    for (int e = 0; e < 3; e++) {
        cddp_sampler_set_epoch(s, 5);
        iterate(s, e1);
        assert_int_equal(cddp_sampler_epoch(s), 5);
    }
    cddp_sampler_indices(s, 5, ref);
    assert_memory_equal(e1, ref, sizeof ref);
    /* After an explicit epoch, the next unannounced iteration moves on from it. */
    iterate(s, e1);
    assert_int_equal(cddp_sampler_epoch(s), 6);
    cddp_sampler_destroy(s);
}

/* A job stopped in the middle of an epoch resumes with the next unseen sample. */
static void test_resume_mid_epoch(void **state) {
    (void)state;
    for (int64_t stop_at = 0; stop_at <= 26; stop_at += 13) {
        cddp_sampler *s = make(77, 3, 2, true, false, false, 9);
        cddp_sampler_set_epoch(s, 4);
        int64_t full[26], got[26];
        cddp_sampler_indices(s, 4, full);
        assert_int_equal(cddp_sampler_begin(s), 26);
        for (int64_t k = 0; k < stop_at; k++) got[k] = cddp_sampler_next(s);
        cddp_sampler_state st = cddp_sampler_get_state(s);
        assert_int_equal(st.epoch, 4);
        assert_int_equal(st.consumed, stop_at);
        cddp_sampler_destroy(s);
        /* A new process: same options, the saved state. */
        cddp_sampler *r = make(77, 3, 2, true, false, false, 9);
        cddp_error err = {0};
        assert_int_equal(cddp_sampler_set_state(r, st, &err), CDDP_OK);
        assert_int_equal(cddp_sampler_begin(r), 26 - stop_at);
        for (int64_t k = stop_at; k < 26; k++) got[k] = cddp_sampler_next(r);
        assert_int_equal(cddp_sampler_next(r), -1);
        assert_memory_equal(got, full, sizeof full);
        /* A state without the ranks' position (a rank's count alone) does not fit a sampler of
         * another world size. */
        cddp_sampler *other = make(77, 7, 0, true, false, false, 9);
        st.consumed = 20;
        st.position = 0;
        assert_int_equal(cddp_sampler_set_state(other, st, &err), CDDP_ERANGE);
        assert_non_null(strstr(err.msg, "another world size"));
        cddp_sampler_destroy(other);
        cddp_sampler_destroy(r);
    }
}

/* Takes the next b samples of each of the world's samplers (one per rank) into out, in rank
 * order; returns how many (fewer at the end of the epoch). */
static int64_t take_step(cddp_sampler **ranks, int world, int64_t b, int64_t *out) {
    int64_t n = 0;
    for (int r = 0; r < world; r++)
        for (int64_t k = 0, i; k < b && (i = cddp_sampler_next(ranks[r])) >= 0; k++) out[n++] = i;
    return n;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A checkpoint of 4 ranks (batch 3, global batch 12) taken after 2 steps resumes on 1, 2, 3 and 6
 * ranks with the global batch held: every later step takes the same samples as the uninterrupted
 * run (as a set), and over the epoch each of the 96 samples is seen exactly once. On 5 ranks,
 * which cannot hold the global batch, the uneven mode still sees each sample exactly once. */
static void test_resume_on_other_world_sizes(void **state) {
    (void)state;
    enum { N = 96, GB = 12, STOP = 2 };
    cddp_error err = {0};
    for (int drop = 0; drop <= 1; drop++) {
        cddp_sampler *four[4];
        for (int r = 0; r < 4; r++) {
            four[r] = make(N, 4, r, true, drop, false, 5);
            cddp_sampler_set_epoch(four[r], 3);
            cddp_sampler_begin(four[r]);
        }
        int64_t straight[N / GB][GB], before[STOP * GB];
        for (int t = 0; t < N / GB; t++) {
            assert_int_equal(take_step(four, 4, GB / 4, straight[t]), GB);
            qsort(straight[t], GB, sizeof(int64_t), cmp_i64);
        }
        for (int t = 0; t < STOP; t++) memcpy(before + t * GB, straight[t], sizeof straight[t]);
        /* The state rank 0 saved after STOP steps. */
        cddp_sampler_state st = {3, STOP * GB / 4, STOP * GB};
        for (int M = 1; M <= 6; M++) {
            if (GB % M || M == 4 || M == 5) continue;
            cddp_sampler *ranks[6];
            for (int r = 0; r < M; r++) {
                ranks[r] = make(N, M, r, true, drop, false, 5);
                assert_int_equal(cddp_sampler_set_state(ranks[r], st, &err), CDDP_OK);
                assert_int_equal(cddp_sampler_begin(ranks[r]), (N - STOP * GB) / M);
            }
            int64_t seen[N] = {0}, got[GB];
            for (int i = 0; i < STOP * GB; i++) seen[before[i]]++;
            for (int t = STOP; t < N / GB; t++) {
                assert_int_equal(take_step(ranks, M, GB / M, got), GB);
                for (int i = 0; i < GB; i++) seen[got[i]]++;
                qsort(got, GB, sizeof(int64_t), cmp_i64);
                assert_memory_equal(got, straight[t], sizeof got);
            }
            assert_int_equal(take_step(ranks, M, 1, got), 0);
            for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
            for (int r = 0; r < M; r++) cddp_sampler_destroy(ranks[r]);
        }
        for (int r = 0; r < 4; r++) cddp_sampler_destroy(four[r]);
    }
    /* Uneven, 4 ranks to 5 after 7 samples each: the rest of the epoch, each sample once. */
    enum { U = 101 };
    int64_t seen[U] = {0};
    for (int r = 0; r < 4; r++) {
        cddp_sampler *s = make(U, 4, r, true, false, true, 8);
        cddp_sampler_set_epoch(s, 1);
        cddp_sampler_begin(s);
        for (int k = 0; k < 7; k++) seen[cddp_sampler_next(s)]++;
        cddp_sampler_destroy(s);
    }
    for (int r = 0; r < 5; r++) {
        cddp_sampler *s = make(U, 5, r, true, false, true, 8);
        assert_int_equal(cddp_sampler_set_state(s, (cddp_sampler_state){1, 7, 28}, &err), CDDP_OK);
        cddp_sampler_begin(s);
        for (int64_t i; (i = cddp_sampler_next(s)) >= 0;) seen[i]++;
        cddp_sampler_state at = cddp_sampler_get_state(s);
        assert_int_equal(at.epoch, 1);
        cddp_sampler_destroy(s);
    }
    for (int i = 0; i < U; i++) assert_int_equal(seen[i], 1);
    /* A position beyond the dataset is refused (padding aside, which drop_last has not). */
    cddp_sampler *s = make(U, 2, 0, true, true, false, 8);
    assert_int_equal(cddp_sampler_set_state(s, (cddp_sampler_state){1, 0, U + 1}, &err),
                     CDDP_ERANGE);
    assert_non_null(strstr(err.msg, "samples of the epoch handed out, but the dataset has 101"));
    cddp_sampler_destroy(s);
}

static void test_options_and_environment(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_sampler_options o = cddp_sampler_defaults();
    assert_true(o.shuffle);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    cddp_sampler *s = cddp_sampler_create(10, &o, &err);
    assert_non_null(s);
    assert_int_equal(cddp_sampler_rank(s), 2);
    assert_int_equal(cddp_sampler_num_replicas(s), 3);
    cddp_sampler_destroy(s);
    setenv("RANK", "5", 1); /* torchrun's variables come first, and this pair is wrong */
    setenv("WORLD_SIZE", "4", 1);
    assert_null(cddp_sampler_create(10, &o, &err));
    assert_int_equal(err.code, CDDP_EINVAL);
    assert_non_null(strstr(err.msg, "RANK=5 and WORLD_SIZE=4"));
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    s = cddp_sampler_create(10, &o, &err); /* no launcher: one replica */
    assert_int_equal(cddp_sampler_num_replicas(s), 1);
    assert_int_equal(cddp_sampler_rank(s), 0);
    cddp_sampler_destroy(s);
    o = (cddp_sampler_options){.num_replicas = 2, .rank = 2};
    assert_null(cddp_sampler_create(10, &o, &err));
    assert_non_null(strstr(err.msg, "rank 2 is out of range for 2 replicas"));
    o = (cddp_sampler_options){.num_replicas = 2, .rank = 0, .uneven = true, .drop_last = true};
    assert_null(cddp_sampler_create(10, &o, &err));
    assert_non_null(strstr(err.msg, "exclude each other"));
    /* An empty dataset yields nothing. */
    o = (cddp_sampler_options){.num_replicas = 2, .rank = 1, .shuffle = true};
    s = cddp_sampler_create(0, &o, &err);
    assert_int_equal(cddp_sampler_len(s), 0);
    assert_int_equal(cddp_sampler_begin(s), 0);
    assert_int_equal(cddp_sampler_next(s), -1);
    cddp_sampler_destroy(s);
}

/* The bijection itself: a permutation of [0, N) for N from 1 to 700 and around powers of 2, other
 * for another epoch or seed; and on ten billion samples (a corpus of billions of tokens at stride
 * 1), a sampler that keeps nothing per sample: its entries in range and distinct. */
static void test_rule(void **state) {
    (void)state;
    cddp__sampler_list_max = 0;
    int64_t sizes[720], ns = 0;
    for (int64_t n = 1; n <= 700; n++) sizes[ns++] = n;
    for (int b = 10; b <= 16; b += 3)
        for (int d = -1; d <= 1; d++) sizes[ns++] = ((int64_t)1 << b) + d;
    for (int64_t k = 0; k < ns; k++) {
        int64_t n = sizes[k];
        int64_t *a = malloc(sizeof(int64_t) * (size_t)n), *b = malloc(sizeof(int64_t) * (size_t)n);
        char *seen = calloc((size_t)n, 1);
        cddp_sampler *s = make(n, 1, 0, true, false, false, 3);
        cddp_sampler_indices(s, 0, a);
        cddp_sampler_indices(s, 1, b);
        for (int64_t i = 0; i < n; i++) {
            assert_true(a[i] >= 0 && a[i] < n);
            assert_int_equal(seen[a[i]]++, 0);
        }
        if (n >= 8) assert_memory_not_equal(a, b, sizeof(int64_t) * (size_t)n);
        cddp_sampler_destroy(s);
        free(a);
        free(b);
        free(seen);
    }
    cddp__sampler_list_max = (int64_t)1 << 24; /* the default */
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    int64_t big = 10000000000, out[4096];
    cddp_sampler *s = make(big, 4, 3, true, true, false, 1);
    assert_int_equal(cddp_sampler_len(s), big / 4);
    assert_int_equal(cddp_sampler_begin(s), big / 4);
    for (int k = 0; k < 4096; k++) {
        out[k] = cddp_sampler_next(s);
        assert_true(out[k] >= 0 && out[k] < big);
        for (int j = 0; j < k; j++) assert_true(out[j] != out[k]);
    }
    getrusage(RUSAGE_SELF, &after);
    assert_true(after.ru_maxrss - before.ru_maxrss < 16 * 1024); /* KB: nothing per sample */
    cddp_sampler_destroy(s);
}

/* Every case with the lists, then by the rule. */
static int lists(void **state) {
    (void)state;
    cddp__sampler_list_max = (int64_t)1 << 24;
    return 0;
}

static int rules(void **state) {
    (void)state;
    cddp__sampler_list_max = 0;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_pytorch_without_shuffle),
        cmocka_unit_test(test_partition_properties),
        cmocka_unit_test(test_mindspore_shards),
        cmocka_unit_test(test_epochs_change_and_repeat),
        cmocka_unit_test(test_automatic_epoch_advance),
        cmocka_unit_test(test_resume_mid_epoch),
        cmocka_unit_test(test_resume_on_other_world_sizes),
        cmocka_unit_test(test_options_and_environment),
    };
    const struct CMUnitTest rule[] = {cmocka_unit_test(test_rule)};
    int failed = cmocka_run_group_tests_name("lists", tests, lists, NULL);
    failed += cmocka_run_group_tests_name("rules", tests, rules, NULL);
    return failed + cmocka_run_group_tests_name("rule", rule, NULL, NULL);
}
