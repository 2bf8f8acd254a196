/* test_ckpt_set.c: checkpoint sets (one shard per rank + a manifest committed last): ranges read
 * across shards, a sharded optimizer reading only its ranges, --keep and killed saves, damaged
 * and crafted sets refused with the reason, the newest complete set found. The ranks' side (each
 * rank writing its shard through a real group, loading on other world sizes) is in
 * tests/ddp/zero_check.c and the examples' reshard tests.
 */
#include "helpers.h"

#include <sys/stat.h>
#include <unistd.h>

static cddp_model *net(int64_t hidden, uint64_t seed) {
    cddp_model *m = cddp_model_create();
    assert_int_equal(cddp_model_add(m, "fc", cddp_nn_linear(3, hidden)), 0);
    assert_int_equal(cddp_model_add(m, "out", cddp_nn_linear(hidden, 2)), 0);
    assert_int_equal(cddp_model_build(m, seed), 0);
    return m;
}

/* Gives every parameter and state element a distinct value, as training would. */
static void fill(cddp_model *m, cddp_optim *opt, float base) {
    float *p = cddp_model_data(m);
    for (size_t i = 0; i < cddp_model_numel(m); i++) p[i] = base + (float)i;
    for (int s = 0; s < cddp_optim_num_states(opt); s++) {
        float *st = cddp_optim_state(opt, s, NULL);
        for (size_t i = 0; i < cddp_optim_state_numel(opt); i++)
            st[i] = base * (float)(s + 2) + (float)i / 8;
    }
    cddp_optim_set_steps(opt, 7);
}

/* A set of world 2 (rank 0: [0, split), rank 1: the rest) of m saved as ROOT/step-<step>. */
static void save_two(const char *root, int64_t step, int keep, cddp_model *m, cddp_optim *opt,
                     int64_t split) {
    char dir[512];
    cddp_error err = {0};
    int64_t n = (int64_t)cddp_model_numel(m), r0[] = {0, split}, r1[] = {split, n};
    cddp_ckpt_shard shards[2];
    assert_int_equal(cddp_ckpt_set_prepare(root, step, dir, sizeof dir, &err), CDDP_OK);
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 0, 2, m, opt, 1, r0, &shards[0], &err),
                     CDDP_OK);
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 1, 2, m, opt, 1, r1, &shards[1], &err),
                     CDDP_OK);
    const char *meta[] = {"epoch", "3", NULL};
    assert_int_equal(cddp_ckpt_set_commit(dir, 2, m, opt, shards, meta, keep, &err), CDDP_OK);
}

static void root_in(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", test_dir, name);
}

static void test_saved_by_two_read_anywhere(void **state) {
    (void)state;
    char root[512], dir[600];
    root_in(root, sizeof root, "two");
    cddp_error err = {0};
    cddp_adamw_options aw = cddp_adamw_defaults(0.01f);
    cddp_model *a = net(5, 1);
    cddp_optim *oa = cddp_optim_adamw(a, &aw, &err);
    fill(a, oa, 1);
    int64_t n = (int64_t)cddp_model_numel(a), split = n / 3;
    save_two(root, 12, 0, a, oa, split);
    snprintf(dir, sizeof dir, "%s/step-00000012", root);
    cddp_ckpt_set *s = cddp_ckpt_set_open(root, &err);
    assert_non_null(s);
    assert_string_equal(cddp_ckpt_set_dir(s), dir);
    assert_int_equal(cddp_ckpt_set_world(s), 2);
    assert_int_equal(cddp_ckpt_set_numel(s), n);
    assert_int_equal(cddp_ckpt_set_num_params(s), 4);
    int64_t off = -1;
    assert_string_equal(cddp_ckpt_set_param(s, 2, &off)->name, "out.weight");
    assert_int_equal(off, (int64_t)cddp_model_param_offset(a, 2));
    assert_int_equal(cddp_ckpt_set_num_states(s), 2);
    assert_string_equal(cddp_ckpt_set_state(s, 1), "exp_avg_sq");
    assert_string_equal(cddp_safetensors_meta(cddp_ckpt_set_manifest(s), "epoch"), "3");
    /* A range across the two shards, and a state's. */
    float got[16];
    assert_int_equal(cddp_ckpt_set_read(s, NULL, split - 3, split + 5, got, &err), CDDP_OK);
    assert_memory_equal(got, cddp_model_data(a) + split - 3, 8 * sizeof(float));
    assert_int_equal(cddp_ckpt_set_read(s, "exp_avg_sq", split - 1, split + 2, got, &err), CDDP_OK);
    assert_memory_equal(got, cddp_optim_state(oa, 1, NULL) + split - 1, 3 * sizeof(float));
    assert_int_equal(cddp_ckpt_set_read(s, "momentum", 0, 1, got, &err), CDDP_ENOENT);
    assert_int_equal(cddp_ckpt_set_read(s, NULL, 0, n + 1, got, &err), CDDP_EINVAL);
    assert_int_equal(cddp_ckpt_set_verify(s, &err), CDDP_OK);
    cddp_ckpt_set_close(s);
    /* One process loads it whole: parameters, state, steps, metadata. */
    cddp_model *b = net(5, 2);
    cddp_optim *ob = cddp_optim_adamw(b, &aw, &err);
    cddp_safetensors *f = NULL;
    assert_int_equal(cddp_checkpoint_load(root, b, ob, &f, &err), CDDP_OK);
    assert_string_equal(cddp_safetensors_meta(f, "epoch"), "3");
    cddp_safetensors_destroy(f);
    assert_memory_equal(cddp_model_data(a), cddp_model_data(b), (size_t)n * sizeof(float));
    for (int k = 0; k < 2; k++)
        assert_memory_equal(cddp_optim_state(oa, k, NULL), cddp_optim_state(ob, k, NULL),
                            (size_t)n * sizeof(float));
    assert_int_equal(cddp_optim_steps(ob), 7);
    /* A sharded optimizer (ZeRO-1's) takes only its ranges of the state, from the set and from a
     * file of the same checkpoint. */
    char file[600];
    snprintf(file, sizeof file, "%s/two.safetensors", test_dir);
    assert_int_equal(cddp_checkpoint_save(file, a, oa, NULL, &err), CDDP_OK);
    for (int from_file = 0; from_file < 2; from_file++) {
        cddp_model *c = net(5, 3);
        int64_t mine[] = {2, 9, split + 1, n - 1};
        assert_int_equal(cddp_model_set_shard(c, 2, mine, NULL, NULL, &err), CDDP_OK);
        cddp_optim *oc = cddp_optim_adamw(c, &aw, &err);
        f = NULL;
        assert_int_equal(cddp_checkpoint_load(from_file ? file : dir, c, oc, &f, &err), CDDP_OK);
        assert_true(cddp_optim_sharded(oc));
        assert_int_equal(cddp_optim_state_numel(oc), 7 + (n - 1 - split - 1));
        for (int k = 0; k < 2; k++) {
            const float *want = cddp_optim_state(oa, k, NULL),
                        *have = cddp_optim_state(oc, k, NULL);
            assert_memory_equal(have, want + 2, 7 * sizeof(float));
            assert_memory_equal(have + 7, want + split + 1,
                                (size_t)(n - split - 2) * sizeof(float));
        }
        assert_memory_equal(cddp_model_data(a), cddp_model_data(c), (size_t)n * sizeof(float));
        assert_int_equal(cddp_optim_steps(oc), 7);
        /* A file's handle names its tensors without their data (which was read in ranges). */
        if (from_file) assert_null(cddp_safetensors_find(f, "optim.exp_avg.fc.weight")->data);
        cddp_safetensors_destroy(f);
        cddp_optim_destroy(oc);
        cddp_model_destroy(c);
    }
    cddp_optim_destroy(oa);
    cddp_optim_destroy(ob);
    cddp_model_destroy(a);
    cddp_model_destroy(b);
}

static int count_sets(const char *root) {
    int n = 0;
    for (int64_t step = 0; step < 20; step++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/step-%08lld", root, (long long)step);
        struct stat st;
        n += stat(dir, &st) == 0;
    }
    return n;
}

static void expect_newest(const char *root, const char *want) {
    char got[600], path[600];
    cddp_error err = {0};
    assert_int_equal(cddp_checkpoint_resolve(root, got, sizeof got, &err), CDDP_OK);
    snprintf(path, sizeof path, "%s/%s", root, want);
    assert_string_equal(got, path);
}

static void test_keep_and_killed_saves(void **state) {
    (void)state;
    char root[512], dir[600];
    root_in(root, sizeof root, "keep");
    cddp_error err = {0};
    cddp_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
    cddp_model *a = net(4, 1);
    cddp_optim *oa = cddp_optim_sgd(a, &so, &err);
    fill(a, oa, 1);
    int64_t split = (int64_t)cddp_model_numel(a) / 2;
    for (int64_t step = 1; step <= 3; step++) save_two(root, step, 2, a, oa, split);
    assert_int_equal(count_sets(root), 2); /* step 1 went */
    expect_newest(root, "step-00000003");
    /* A save killed before its manifest: never taken, removed by the next commit. */
    assert_int_equal(cddp_ckpt_set_prepare(root, 9, dir, sizeof dir, &err), CDDP_OK);
    int64_t r0[] = {0, split};
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 0, 2, a, oa, 1, r0, NULL, &err), CDDP_OK);
    expect_newest(root, "step-00000003");
    save_two(root, 4, 2, a, oa, split);
    assert_int_equal(count_sets(root), 2); /* 4 and 3; the killed 9 and the old 2 went */
    expect_newest(root, "step-00000004");
    /* The newest is the last committed, not the highest step (a run resumed from earlier). */
    save_two(root, 1, 2, a, oa, split);
    expect_newest(root, "step-00000001");
    assert_int_equal(count_sets(root), 2);
    /* Temporaries of writers killed while saving into a folder (another world size's, another
     * host's, a dead process of this one) go when a save into it commits; nothing else does. */
    assert_int_equal(cddp_ckpt_set_prepare(root, 4, dir, sizeof dir, &err), CDDP_OK);
    const char *left[] = {"shard-00002-of-00003.safetensors.tmp.otherhost.4242",
                          "shard-00001-of-00002.safetensors.tmp.thishost.999999",
                          "manifest.safetensors.tmp.otherhost.77"};
    char path[800];
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, left[i]);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs("half a shard", f);
        fclose(f);
    }
    save_two(root, 4, 2, a, oa, split);
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, left[i]);
        assert_int_equal(access(path, F_OK), -1);
    }
    snprintf(path, sizeof path, "%s/shard-00001-of-00002.safetensors", dir);
    assert_int_equal(access(path, F_OK), 0);
    expect_newest(root, "step-00000004");
    /* Saving over a set hides it first: until the new commit, the one before is the newest. */
    assert_int_equal(cddp_ckpt_set_prepare(root, 1, dir, sizeof dir, &err), CDDP_OK);
    expect_newest(root, "step-00000004");
    cddp_optim_destroy(oa);
    cddp_model_destroy(a);
}

static void truncate_to(const char *path, off_t size) {
    assert_int_equal(truncate(path, size), 0);
}

static void test_damaged_sets(void **state) {
    (void)state;
    char root[512], path[700], dir[600];
    root_in(root, sizeof root, "damaged");
    cddp_error err = {0};
    cddp_sgd_options so = {.lr = 0.1f, .momentum = 0.9f};
    cddp_model *a = net(4, 1);
    cddp_optim *oa = cddp_optim_sgd(a, &so, &err);
    fill(a, oa, 1);
    int64_t split = 5;
    save_two(root, 1, 0, a, oa, split);
    save_two(root, 2, 0, a, oa, split);
    /* A shard cut short: the set is refused naming the file; the folder's newest is the other. */
    snprintf(path, sizeof path, "%s/step-00000002/shard-00001-of-00002.safetensors", root);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    truncate_to(path, st.st_size - 4);
    snprintf(dir, sizeof dir, "%s/step-00000002", root);
    assert_null(cddp_ckpt_set_open(dir, &err));
    assert_non_null(strstr(err.msg, "but the set's manifest says"));
    expect_newest(root, "step-00000001");
    /* A shard of the same size from another save (the same model, other values): open passes
     * (the sizes), a load is refused naming the shard, and changes nothing. */
    cddp_model *other_m = net(4, 1);
    cddp_optim *other_o = cddp_optim_sgd(other_m, &so, &err);
    fill(other_m, other_o, 2);
    save_two(root, 3, 0, other_m, other_o, split);
    char other[700];
    snprintf(path, sizeof path, "%s/step-00000003/shard-00000-of-00002.safetensors", root);
    snprintf(other, sizeof other, "%s/step-00000001/shard-00000-of-00002.safetensors", root);
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "cp %s %s.keep && cp %s %s", path, path, other, path);
    assert_int_equal(system(cmd), 0);
    snprintf(dir, sizeof dir, "%s/step-00000003", root);
    cddp_model *into = net(4, 1);
    cddp_optim *into_o = cddp_optim_sgd(into, &so, &err);
    float first = cddp_model_data(into)[0];
    assert_int_equal(cddp_checkpoint_load(dir, into, into_o, NULL, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "shard-00000-of-00002.safetensors is not the shard this set's "
                                    "manifest recorded"));
    assert_true(cddp_model_data(into)[0] == first);
    /* A changed byte in a range's data: the rank that reads the range refuses it, naming the
     * shard, the bytes and the tensor; the model is left as it was. */
    snprintf(cmd, sizeof cmd, "mv %s.keep %s", path, path);
    assert_int_equal(system(cmd), 0);
    FILE *g = fopen(path, "r+b");
    assert_non_null(g);
    fseek(g, -6, SEEK_END); /* the last range's last state */
    int was = fgetc(g);
    fseek(g, -6, SEEK_END);
    fputc(was ^ 0x40, g);
    fclose(g);
    assert_int_equal(cddp_checkpoint_load(dir, into, into_o, NULL, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "shard-00000-of-00002.safetensors: bytes "));
    assert_non_null(strstr(err.msg, "the shard changed after the save"));
    assert_true(cddp_model_data(into)[0] == first);
    cddp_ckpt_set *cs = cddp_ckpt_set_open(dir, &err); /* the parameters alone still read */
    assert_non_null(cs);
    float *p0 = malloc(sizeof(float) * (size_t)split);
    assert_int_equal(cddp_ckpt_set_read(cs, NULL, 0, split, p0, &err), CDDP_OK);
    free(p0);
    cddp_ckpt_set_close(cs);
    cddp_optim_destroy(into_o);
    cddp_model_destroy(into);
    cddp_optim_destroy(other_o);
    cddp_model_destroy(other_m);
    snprintf(cmd, sizeof cmd, "rm -r %s", dir);
    assert_int_equal(system(cmd), 0);
    /* A changed byte keeps the size: open passes, verify names the file and its checksum. */
    snprintf(path, sizeof path, "%s/step-00000001/shard-00000-of-00002.safetensors", root);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, -2, SEEK_END);
    fputc(0x55, f);
    fclose(f);
    cddp_ckpt_set *s = cddp_ckpt_set_open(root, &err);
    assert_non_null(s);
    assert_int_equal(cddp_ckpt_set_verify(s, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "CRC-32"));
    assert_non_null(strstr(err.msg, "shard-00000-of-00002"));
    cddp_ckpt_set_close(s);
    /* No manifest: an incomplete set, said so; a folder with none complete, said so. */
    snprintf(path, sizeof path, "%s/step-00000001/" CDDP_CKPT_MANIFEST, root);
    assert_int_equal(unlink(path), 0);
    snprintf(dir, sizeof dir, "%s/step-00000001", root);
    assert_null(cddp_ckpt_set_open(dir, &err));
    assert_int_equal(err.code, CDDP_ENOENT);
    assert_non_null(strstr(err.msg, "incomplete checkpoint set"));
    char got[600];
    /* the damaged set (step 2) is named with its damage, and the one without a manifest counted */
    assert_int_equal(cddp_checkpoint_resolve(root, got, sizeof got, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "holds no complete checkpoint set: 1 damaged (the newest: "));
    assert_non_null(strstr(err.msg, "bytes but the set's manifest says"));
    assert_non_null(strstr(err.msg, "1 without a manifest"));
    /* A model of another shape: every difference named, nothing changed. */
    save_two(root, 3, 0, a, oa, split);
    cddp_model *b = net(6, 2);
    cddp_optim *ob = cddp_optim_sgd(b, &so, &err);
    float before = cddp_model_data(b)[0];
    assert_int_equal(cddp_checkpoint_load(root, b, ob, NULL, &err), CDDP_ESHAPE);
    assert_non_null(
        strstr(err.msg, "(3 differences): 'fc.weight' has shape (4,3) in the file but (6,3)"));
    assert_true(cddp_model_data(b)[0] == before);
    /* An optimizer of another kind. */
    cddp_adamw_options aw = cddp_adamw_defaults(0.01f);
    cddp_model *c = net(4, 2);
    cddp_optim *oc = cddp_optim_adamw(c, &aw, &err);
    assert_int_equal(cddp_checkpoint_load(root, c, oc, NULL, &err), CDDP_ESHAPE);
    assert_non_null(strstr(err.msg, "the set holds sgd state but the optimizer is adamw"));
    cddp_optim_destroy(oa);
    cddp_optim_destroy(ob);
    cddp_optim_destroy(oc);
    cddp_model_destroy(a);
    cddp_model_destroy(b);
    cddp_model_destroy(c);
}

static void test_crafted_sets(void **state) {
    (void)state;
    char root[512], dir[600], path[700];
    root_in(root, sizeof root, "crafted");
    cddp_error err = {0};
    cddp_model *a = net(4, 1);
    int64_t n = (int64_t)cddp_model_numel(a);
    /* Shards that leave a gap, or overlap: the commit refuses, naming the element. */
    int64_t r0[] = {0, 5}, gap[] = {6, n}, overlap[] = {4, n};
    cddp_ckpt_shard shards[2];
    assert_int_equal(cddp_ckpt_set_prepare(root, 1, dir, sizeof dir, &err), CDDP_OK);
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 0, 2, a, NULL, 1, r0, &shards[0], &err), 0);
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 1, 2, a, NULL, 1, gap, &shards[1], &err), 0);
    assert_int_equal(cddp_ckpt_set_commit(dir, 2, a, NULL, shards, NULL, 0, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "element 5 is in none"));
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 1, 2, a, NULL, 1, overlap, &shards[1], &err),
                     0);
    assert_int_equal(cddp_ckpt_set_commit(dir, 2, a, NULL, shards, NULL, 0, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "element 4 is in two shards"));
    /* Ranges out of order are refused before anything is written. */
    int64_t backwards[] = {5, 9, 0, 4};
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 0, 1, a, NULL, 2, backwards, NULL, &err),
                     CDDP_EINVAL);
    /* A good set, then its manifest with one value changed: each change is refused at open, the
     * manifest as it was opens. */
    int64_t r1[] = {5, n};
    assert_int_equal(cddp_ckpt_set_write_shard(dir, 1, 2, a, NULL, 1, r1, &shards[1], &err), 0);
    assert_int_equal(cddp_ckpt_set_commit(dir, 2, a, NULL, shards, NULL, 0, &err), CDDP_OK);
    snprintf(path, sizeof path, "%s/" CDDP_CKPT_MANIFEST, dir);
    cddp_safetensors *good = cddp_safetensors_read(path, &err);
    assert_non_null(good);
    const char *keys[] = {"cddp_format", "cddp_world",  "cddp_numel",  "cddp_seq",   "cddp_params",
                          "cddp_ties",   "cddp_states", "cddp_shards", "cddp_ranges"};
    enum { NK = sizeof keys / sizeof keys[0] };
    char far[64];
    snprintf(far, sizeof far, "[[0, 0, 5, %lld], [1, 5, %lld, 64]]", (long long)shards[0].bytes - 8,
             (long long)n);
    const char *bad[][2] = {{"cddp_params", "[[\"fc.weight\", -1, [4, 3]]]"},
                            {"cddp_params", "[[\"fc.weight\", 0, [4000000, 3000000]]]"},
                            {"cddp_params", "{\"not\": \"a list\"}"},
                            {"cddp_shards", "[[10, 1]]"},
                            {"cddp_states", "[\"a.b\"]"},
                            {"cddp_world", "0"},
                            {"cddp_world", "3"},
                            {"cddp_ranges", "[[0, 0, 5, 64], [2, 5, 26, 64]]"}, /* no shard 2 */
                            {"cddp_ranges", "[[0, 0, 6, 64], [1, 5, 26, 64]]"}, /* overlap */
                            {"cddp_ranges", "[[0, 0, 5, 64]]"},                 /* a gap */
                            {"cddp_ranges", far},                               /* past the end */
                            {"cddp_ranges", "[[0, 0, 5, 64, 99], [1, 5, 26, 64]]"}, /* a state */
                            {"cddp_format", "checkpoint-set-9"},
                            {NULL, NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *meta[2 * NK + 1];
        for (int k = 0; k < NK; k++) {
            meta[2 * k] = keys[k];
            meta[2 * k + 1] = cddp_safetensors_meta(good, keys[k]);
            assert_non_null(meta[2 * k + 1]);
            if (bad[i][0] && !strcmp(keys[k], bad[i][0])) meta[2 * k + 1] = bad[i][1];
        }
        meta[2 * NK] = NULL;
        assert_int_equal(cddp_safetensors_write(path, NULL, 0, meta, &err), CDDP_OK);
        cddp_ckpt_set *s = cddp_ckpt_set_open(dir, &err);
        if (!bad[i][0]) { /* the control */
            assert_non_null(s);
            cddp_ckpt_set_close(s);
            continue;
        }
        if (s) fail_msg("a manifest with %s = %s was opened", bad[i][0], bad[i][1]);
        assert_int_equal(err.code, CDDP_EFORMAT);
    }
    /* Ranges inside the files but at other offsets than the shard's header says: the set opens
     * (only the manifest is read), and the first read from that shard refuses it. */
    const char *ranges = cddp_safetensors_meta(good, "cddp_ranges"),
               *first = strstr(ranges, "[0,0,5,");
    assert_non_null(first);
    char moved[512];
    snprintf(moved, sizeof moved, "%.*s[0,0,5,8]%s", (int)(first - ranges), ranges,
             strchr(first, ']') + 1);
    const char *meta[2 * NK + 1];
    for (int k = 0; k < NK; k++) {
        meta[2 * k] = keys[k];
        meta[2 * k + 1] =
            strcmp(keys[k], "cddp_ranges") ? cddp_safetensors_meta(good, keys[k]) : moved;
    }
    meta[2 * NK] = NULL;
    assert_int_equal(cddp_safetensors_write(path, NULL, 0, meta, &err), CDDP_OK);
    cddp_ckpt_set *s = cddp_ckpt_set_open(dir, &err);
    assert_non_null(s);
    float got[32];
    assert_int_equal(cddp_ckpt_set_read(s, NULL, 6, 9, got, &err), CDDP_OK); /* shard 1 is right */
    assert_memory_equal(got, cddp_model_data(a) + 6, 3 * sizeof(float));
    assert_int_equal(cddp_ckpt_set_read(s, NULL, 0, n, got, &err), CDDP_EFORMAT);
    assert_non_null(strstr(err.msg, "disagree on where the ranges lie"));
    cddp_ckpt_set_close(s);
    cddp_safetensors_destroy(good);
    cddp_model_destroy(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_saved_by_two_read_anywhere),
        cmocka_unit_test(test_keep_and_killed_saves),
        cmocka_unit_test(test_damaged_sets),
        cmocka_unit_test(test_crafted_sets),
    };
    return cmocka_run_group_tests(tests, temp_dir_setup, temp_dir_teardown);
}
