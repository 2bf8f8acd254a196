/* fuzz_ckpt_set.c: a checkpoint set whose manifest is any bytes. The set's two shards are real
 * (the model of the safetensors harness, fc 3->4 and out 4->2, with AdamW's state, written once
 * into a temporary folder); the input becomes its manifest.safetensors. Opening it gives a clear
 * error, or a set whose every range, state and shard can be read and checked, and which loads
 * into the model or says why not.
 *
 * FUZZ_CKPT_SET_SEED=PATH: also copies the real manifest to PATH (how
 * tests/fuzz/corpus/ckpt_set/set was made). */
#include "fuzz.h"

static cddp_model *model;
static cddp_optim *optim;
static char dir[64];

static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz_ckpt_set: cannot remove %s\n", dir);
}

static void setup(void) {
    cddp_error err = {0};
    model = fuzz_small_model(&optim);
    snprintf(dir, sizeof dir, "/tmp/cddp-fuzz-set-XXXXXX");
    if (!mkdtemp(dir)) abort();
    atexit(remove_dir);
    char set[256];
    int64_t ranges[] = {0, 11, 11, (int64_t)cddp_model_numel(model)};
    cddp_ckpt_shard shards[2];
    if (cddp_ckpt_set_prepare(dir, 1, set, sizeof set, &err) ||
        cddp_ckpt_set_write_shard(set, 0, 2, model, optim, 1, ranges, &shards[0], &err) ||
        cddp_ckpt_set_write_shard(set, 1, 2, model, optim, 1, ranges + 2, &shards[1], &err) ||
        cddp_ckpt_set_commit(set, 2, model, optim, shards, NULL, 0, &err)) {
        fprintf(stderr, "fuzz_ckpt_set: %s\n", err.msg);
        abort();
    }
    const char *seed = getenv("FUZZ_CKPT_SET_SEED");
    if (seed) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "cp '%s/" CDDP_CKPT_MANIFEST "' '%s'", set, seed);
        if (system(cmd) != 0) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model) setup();
    char path[256];
    snprintf(path, sizeof path, "%s/step-00000001/" CDDP_CKPT_MANIFEST, dir);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
    cddp_error err = {0};
    cddp_ckpt_set *s = cddp_ckpt_set_open(dir, &err);
    if (!s) {
        if (!err.msg[0]) abort();
        return 0;
    }
    int64_t n = cddp_ckpt_set_numel(s);
    float *buf = malloc(sizeof(float) * (size_t)(n + 1));
    if (!buf) abort();
    for (int k = -1; k < cddp_ckpt_set_num_states(s); k++) {
        const char *state = k < 0 ? NULL : cddp_ckpt_set_state(s, k);
        if (cddp_ckpt_set_read(s, state, 0, n, buf, &err) == CDDP_OK)
            for (int64_t i = 0; i < n; i++) fuzz_sink ^= ((const uint8_t *)buf)[4 * i];
        else if (!err.msg[0])
            abort();
    }
    free(buf);
    for (int i = 0; i < cddp_ckpt_set_num_params(s); i++) {
        int64_t offset;
        const cddp_st_tensor *t = cddp_ckpt_set_param(s, i, &offset);
        if (offset < 0 || offset > n) abort();
        fuzz_sink ^= (uint8_t)strlen(t->name);
    }
    for (int i = 0; i < cddp_ckpt_set_num_ties(s); i++) {
        const char *param;
        fuzz_sink ^= (uint8_t)strlen(cddp_ckpt_set_tie(s, i, &param));
        fuzz_sink ^= (uint8_t)strlen(param);
    }
    if (cddp_ckpt_set_verify(s, &err) != CDDP_OK && !err.msg[0]) abort();
    cddp_ckpt_set_close(s);
    cddp_safetensors *meta = NULL;
    if (cddp_checkpoint_load(dir, model, optim, &meta, &err) == CDDP_OK)
        cddp_safetensors_destroy(meta);
    else if (!err.msg[0])
        abort();
    return 0;
}
