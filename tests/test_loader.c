/* test_loader.c: datasets (custom, in-memory, MNIST, MindSpore-style shards) and the DataLoader:
 * it yields exactly the sampler's choice, in order, the same with and without prefetching, in host
 * memory or copied to a device; the cases with a sampler twice, with the sampler's lists and
 * with its rule (cddp__sampler_list_max 0: the loader computes the indices as it goes instead of
 * copying them). */
#include "helpers.h"

#include "data/internal.h"

/* A custom dataset: sample i is a (1,2,3) image whose pixels encode (i, pixel) and label i. It
 * fails on the index `fail_at` (-1: never). */
typedef struct probe {
    int64_t n, fail_at;
} probe;

static int64_t probe_len(void *self) {
    return ((probe *)self)->n;
}

static int probe_get(void *self, int64_t i, void *const *out, cddp_error *err) {
    probe *p = self;
    if (i == p->fail_at)
        return cddp_error_set(err, CDDP_EIO, "probe: sample %lld is unreadable", (long long)i);
    float *img = out[0];
    for (int k = 0; k < 6; k++) img[k] = (float)(i * 10 + k);
    *(int64_t *)out[1] = i;
    return CDDP_OK;
}

static void probe_destroy(void *self) {
    free(self);
}

static cddp_dataset *probe_dataset(int64_t n, int64_t fail_at) {
    static const cddp_dataset_ops ops = {probe_len, probe_get, probe_destroy};
    probe *p = malloc(sizeof *p);
    *p = (probe){n, fail_at};
    cddp_field f[2] = {{"image", CDDP_F32, 3, {1, 2, 3}}, {"label", CDDP_I64, 0, {0}}};
    cddp_error err = {0};
    cddp_dataset *ds = cddp_dataset_create(&ops, p, 2, f, &err);
    if (!ds) fail_msg("%s", err.msg);
    return ds;
}

/* Runs one epoch and returns the concatenated indices and image bytes (caller frees). */
static int64_t run_epoch(cddp_loader *l, int64_t bs, int64_t **indices, float **images) {
    cddp_error err = {0};
    int64_t nb = cddp_loader_begin(l), n = 0, b = 0;
    *indices = malloc(sizeof(int64_t) * (size_t)(nb * bs + 1));
    *images = malloc(sizeof(float) * 6 * (size_t)(nb * bs + 1));
    cddp_batch batch;
    int rc;
    while ((rc = cddp_loader_next(l, &batch, &err)) == 1) {
        assert_int_equal(batch.index, b++);
        assert_true(batch.size >= 1 && batch.size <= bs);
        memcpy(*indices + n, batch.indices, sizeof(int64_t) * (size_t)batch.size);
        memcpy(*images + 6 * n, batch.data[0], sizeof(float) * 6 * (size_t)batch.size);
        /* The labels field agrees with the indices. */
        for (int64_t j = 0; j < batch.size; j++)
            assert_int_equal(((int64_t *)batch.data[1])[j], batch.indices[j]);
        n += batch.size;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(b, nb);
    return n;
}

static void test_loader_yields_the_samplers_choice(void **state) {
    (void)state;
    cddp_dataset *ds = probe_dataset(103, -1);
    cddp_error err = {0};
    for (int prefetch = 0; prefetch <= 3; prefetch += 1)
        for (int drop = 0; drop < 2; drop++) {
            cddp_sampler_options so = {3, 1, true, 5, false, false};
            cddp_sampler *s = cddp_sampler_create(103, &so, &err);
            cddp_loader_options lo = {.batch_size = 8, .drop_last = drop, .prefetch = prefetch};
            cddp_loader *l = cddp_loader_create(ds, s, &lo, &err);
            assert_non_null(l);
            for (int epoch = 0; epoch < 2; epoch++) {
                cddp_sampler_set_epoch(s, epoch);
                int64_t *idx, want[35];
                float *img;
                int64_t n = run_epoch(l, 8, &idx, &img);
                cddp_sampler_indices(s, epoch, want);
                assert_int_equal(n, drop ? 32 : 35); /* 35 per rank; 4 whole batches of 8 */
                assert_memory_equal(idx, want, sizeof(int64_t) * (size_t)n);
                for (int64_t j = 0; j < n; j++)
                    for (int k = 0; k < 6; k++)
                        assert_true(img[6 * j + k] == (float)(want[j] * 10 + k));
                free(idx);
                free(img);
            }
            cddp_loader_destroy(l);
            cddp_sampler_destroy(s);
        }
    /* Without a sampler: every sample in order. */
    cddp_loader_options lo = {.batch_size = 10, .prefetch = 2};
    cddp_loader *l = cddp_loader_create(ds, NULL, &lo, &err);
    int64_t *idx;
    float *img;
    assert_int_equal(run_epoch(l, 10, &idx, &img), 103);
    for (int64_t j = 0; j < 103; j++) assert_int_equal(idx[j], j);
    free(idx);
    free(img);
    cddp_loader_destroy(l);
    cddp_dataset_destroy(ds);
}

/* Random transforms and all: a batch depends on (seed, epoch, position), not on threads. */
static void test_prefetch_changes_nothing(void **state) {
    (void)state;
    cddp_dataset *ds = cddp_dataset_mnist(NULL, false, &(cddp_error){0});
    assert_non_null(ds);
    cddp_error err = {0};
    uint8_t *ref = NULL;
    size_t bytes = 0;
    for (int prefetch = 0; prefetch <= 4; prefetch += 4) {
        cddp_sampler_options so = {2, 0, true, 11, false, false};
        cddp_sampler *s = cddp_sampler_create(cddp_dataset_len(ds), &so, &err);
        cddp_loader_options lo = {.batch_size = 64,
                                  .prefetch = prefetch,
                                  .rescale = true,
                                  .rescale_scale = 1 / 255.0f,
                                  .normalize_channels = 1,
                                  .mean = {0.1307f},
                                  .std = {0.3081f},
                                  .random_hflip = true,
                                  .random_crop_padding = 2,
                                  .seed = 3};
        cddp_loader *l = cddp_loader_create(ds, s, &lo, &err);
        assert_non_null(l);
        uint8_t *all = malloc(5000 * 784 * 4 + 5000 * 8);
        size_t k = 0;
        cddp_batch b;
        cddp_sampler_set_epoch(s, 1);
        cddp_loader_begin(l);
        while (cddp_loader_next(l, &b, &err) == 1) {
            memcpy(all + k, b.data[0], (size_t)b.size * 784 * 4);
            k += (size_t)b.size * 784 * 4;
            memcpy(all + k, b.data[1], (size_t)b.size * 8);
            k += (size_t)b.size * 8;
        }
        if (!ref) {
            ref = all;
            bytes = k;
        } else {
            assert_int_equal(k, bytes);
            assert_memory_equal(all, ref, k);
            free(all);
        }
        cddp_loader_destroy(l);
        cddp_sampler_destroy(s);
    }
    free(ref);
    cddp_dataset_destroy(ds);
}

static void test_transforms(void **state) {
    (void)state;
    cddp_error err = {0};
    /* One 2-channel 3x4 image, values 1..24, copied 200 times. */
    int64_t n = 200;
    float *img = malloc(sizeof(float) * 24 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < 24; k++) img[i * 24 + k] = (float)(k + 1);
    cddp_field f = {"image", CDDP_F32, 3, {2, 3, 4}};
    cddp_dataset *ds = cddp_dataset_from_arrays(n, 1, &f, (const void *const[]){img}, &err);
    img[0] = -100; /* the dataset holds a copy */
    /* Rescale then per-channel normalise. */
    cddp_loader_options lo = {.batch_size = n,
                              .rescale = true,
                              .rescale_scale = 0.5f,
                              .rescale_shift = 1.0f,
                              .normalize_channels = 2,
                              .mean = {1, 2},
                              .std = {2, 4}};
    cddp_loader *l = cddp_loader_create(ds, NULL, &lo, &err);
    cddp_batch b;
    cddp_loader_begin(l);
    assert_int_equal(cddp_loader_next(l, &b, &err), 1);
    const float *x = b.data[0];
    for (int k = 0; k < 24; k++) {
        int c = k / 12;
        float want = ((k + 1) * 0.5f + 1.0f - (c ? 2.0f : 1.0f)) / (c ? 4.0f : 2.0f);
        assert_close(x[k], want, 1e-6, 1e-7);
    }
    cddp_loader_destroy(l);
    /* Flips: each sample is the image or its mirror, and both happen. */
    lo = (cddp_loader_options){.batch_size = n, .random_hflip = true, .seed = 1};
    l = cddp_loader_create(ds, NULL, &lo, &err);
    cddp_loader_begin(l);
    assert_int_equal(cddp_loader_next(l, &b, &err), 1);
    int flipped = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *s = (const float *)b.data[0] + i * 24;
        bool mirror = s[0] == 4.0f;
        flipped += mirror;
        for (int r = 0; r < 6; r++)
            for (int c = 0; c < 4; c++)
                assert_true(s[r * 4 + c] == (float)(r * 4 + (mirror ? 3 - c : c) + 1));
    }
    assert_true(flipped > 60 && flipped < 140);
    cddp_loader_destroy(l);
    /* Crops with padding 1: a shift by (dy, dx) in [-1, 1]^2 with zeros coming in. */
    lo = (cddp_loader_options){.batch_size = n, .random_crop_padding = 1, .seed = 2};
    l = cddp_loader_create(ds, NULL, &lo, &err);
    cddp_loader_begin(l);
    assert_int_equal(cddp_loader_next(l, &b, &err), 1);
    int shifts[9] = {0};
    for (int64_t i = 0; i < n; i++) {
        const float *s = (const float *)b.data[0] + i * 24;
        int found = -1;
        for (int dy = -1; dy <= 1 && found < 0; dy++)
            for (int dx = -1; dx <= 1 && found < 0; dx++) {
                bool ok = true;
                for (int c = 0; c < 2; c++)
                    for (int y = 0; y < 3; y++)
                        for (int xx = 0; xx < 4; xx++) {
                            int sy = y + dy, sx = xx + dx;
                            float want = (sy >= 0 && sy < 3 && sx >= 0 && sx < 4)
                                             ? (float)(c * 12 + sy * 4 + sx + 1)
                                             : 0.0f;
                            ok &= s[c * 12 + y * 4 + xx] == want;
                        }
                if (ok) found = (dy + 1) * 3 + dx + 1;
            }
        assert_true(found >= 0);
        shifts[found]++;
    }
    for (int k = 0; k < 9; k++) assert_true(shifts[k] > 0); /* every offset occurs */
    cddp_loader_destroy(l);
    /* Invalid transform options. */
    lo = (cddp_loader_options){.batch_size = 4, .normalize_channels = 3, .std = {1, 1, 1}};
    assert_null(cddp_loader_create(ds, NULL, &lo, &err));
    assert_non_null(strstr(err.msg, "normalize_channels 3"));
    lo = (cddp_loader_options){.batch_size = 4, .normalize_channels = 1};
    assert_null(cddp_loader_create(ds, NULL, &lo, &err));
    assert_non_null(strstr(err.msg, "std[0] is 0"));
    cddp_dataset_destroy(ds);
    free(img);
}

/* The sampler's state counts what the caller received, so a checkpoint resumes exactly. */
static void test_resume_through_the_loader(void **state) {
    (void)state;
    cddp_dataset *ds = probe_dataset(64, -1);
    cddp_error err = {0};
    cddp_sampler_options so = {2, 1, true, 3, false, false};
    cddp_sampler *s = cddp_sampler_create(64, &so, &err);
    cddp_loader_options lo = {.batch_size = 5, .prefetch = 3};
    cddp_loader *l = cddp_loader_create(ds, s, &lo, &err);
    cddp_sampler_set_epoch(s, 2);
    cddp_loader_begin(l);
    int64_t got[32], want[32], n = 0;
    cddp_batch b;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(cddp_loader_next(l, &b, &err), 1);
        memcpy(got + n, b.indices, sizeof(int64_t) * (size_t)b.size);
        n += b.size;
    }
    cddp_sampler_state st = cddp_sampler_get_state(s); /* prefetched batches do not count */
    assert_int_equal(st.epoch, 2);
    assert_int_equal(st.consumed, 15);
    cddp_loader_destroy(l); /* stopped mid-epoch with the worker ahead: no hang */
    cddp_sampler_destroy(s);
    s = cddp_sampler_create(64, &so, &err);
    assert_int_equal(cddp_sampler_set_state(s, st, &err), CDDP_OK);
    l = cddp_loader_create(ds, s, &lo, &err);
    assert_int_equal(cddp_loader_begin(l), 4); /* 17 samples left: 3 of 5 and one of 2 */
    while (cddp_loader_next(l, &b, &err) == 1) {
        memcpy(got + n, b.indices, sizeof(int64_t) * (size_t)b.size);
        n += b.size;
    }
    cddp_sampler_indices(s, 2, want);
    assert_int_equal(n, 32);
    assert_memory_equal(got, want, sizeof want);
    /* Abandoning an epoch and starting the next. */
    cddp_loader_begin(l);
    assert_int_equal(cddp_loader_next(l, &b, &err), 1);
    assert_int_equal(cddp_loader_begin(l), 7);
    assert_int_equal(cddp_sampler_epoch(s), 4);
    cddp_loader_destroy(l);
    cddp_sampler_destroy(s);
    cddp_dataset_destroy(ds);
}

static void test_dataset_errors_reach_the_caller(void **state) {
    (void)state;
    cddp_dataset *ds = probe_dataset(40, 17);
    cddp_error err = {0};
    for (int prefetch = 0; prefetch <= 2; prefetch += 2) {
        cddp_loader_options lo = {.batch_size = 4, .prefetch = prefetch};
        cddp_loader *l = cddp_loader_create(ds, NULL, &lo, &err);
        cddp_loader_begin(l);
        cddp_batch b;
        int rc, batches = 0;
        while ((rc = cddp_loader_next(l, &b, &err)) == 1) batches++;
        assert_int_equal(rc, CDDP_EIO);
        assert_int_equal(batches, 4); /* sample 17 is in batch 4 */
        assert_non_null(strstr(err.msg, "sample 17 is unreadable"));
        assert_int_equal(cddp_loader_next(l, &b, &err), 0);
        cddp_loader_destroy(l);
    }
    /* Direct access checks the range. */
    float img[6];
    int64_t label;
    assert_int_equal(cddp_dataset_get(ds, 40, (void *const[]){img, &label}, &err), CDDP_ERANGE);
    assert_int_equal(cddp_dataset_get(ds, 3, (void *const[]){img, &label}, &err), CDDP_OK);
    assert_int_equal(label, 3);
    cddp_dataset_destroy(ds);
    /* A sampler made for another dataset. */
    cddp_sampler_options so = {1, 0, false, 0, false, false};
    cddp_sampler *s = cddp_sampler_create(41, &so, &err);
    cddp_loader_options lo = {.batch_size = 4};
    ds = probe_dataset(40, -1);
    assert_null(cddp_loader_create(ds, s, &lo, &err));
    assert_non_null(strstr(err.msg, "made for 41 samples but the dataset has 40"));
    cddp_sampler_destroy(s);
    cddp_dataset_destroy(ds);
    /* Bad field descriptions. */
    cddp_field bad = {"x", CDDP_F32, 2, {3, 0}};
    assert_null(cddp_dataset_from_arrays(1, 1, &bad, (const void *const[]){img}, &err));
    assert_non_null(strstr(err.msg, "dimension 1 is 0"));
}

/* MindSpore's num_shards/shard_id on Fashion-MNIST: every sample in exactly one shard. The
 * check compares the multiset of (image, label) fingerprints of the shards with the whole set. */
static uint64_t fingerprint(const float *img, int64_t label) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)label;
    for (int k = 0; k < 784; k++) h = (h ^ (uint64_t)img[k]) * 1099511628211ull;
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_shards_partition_fashion_mnist(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_dataset *all = cddp_dataset_mnist(NULL, true, &err);
    assert_non_null(all);
    int64_t n = cddp_dataset_len(all);
    assert_int_equal(n, 60000);
    uint64_t *want = malloc(sizeof(uint64_t) * (size_t)n),
             *got = malloc(sizeof(uint64_t) * (size_t)n);
    float img[784];
    int64_t label;
    for (int64_t i = 0; i < n; i++) {
        assert_int_equal(cddp_dataset_get(all, i, (void *const[]){img, &label}, &err), 0);
        want[i] = fingerprint(img, label);
    }
    qsort(want, (size_t)n, sizeof *want, cmp_u64);
    int counts[] = {2, 3, 7};
    for (int c = 0; c < 3; c++) {
        int S = counts[c];
        int64_t k = 0;
        for (int id = 0; id < S; id++) {
            cddp_dataset *sh =
                cddp_dataset_shard(cddp_dataset_mnist(NULL, true, &err), S, id, &err);
            assert_non_null(sh);
            int64_t len = cddp_dataset_len(sh);
            assert_true(len == n / S || len == n / S + 1);
            for (int64_t i = 0; i < len; i++) {
                assert_int_equal(cddp_dataset_get(sh, i, (void *const[]){img, &label}, &err), 0);
                got[k++] = fingerprint(img, label);
            }
            cddp_dataset_destroy(sh);
        }
        assert_int_equal(k, n);
        qsort(got, (size_t)n, sizeof *got, cmp_u64);
        assert_memory_equal(got, want, sizeof(uint64_t) * (size_t)n);
    }
    assert_null(cddp_dataset_shard(cddp_dataset_mnist(NULL, true, &err), 3, 3, &err));
    assert_non_null(strstr(err.msg, "shard_id 3 is out of range for num_shards 3"));
    free(want);
    free(got);
    cddp_dataset_destroy(all);
}

static void test_batch_tensor(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_dataset *ds = cddp_dataset_mnist(NULL, false, &err);
    cddp_loader_options lo = {.batch_size = 32};
    cddp_loader *l = cddp_loader_create(ds, NULL, &lo, &err);
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    cddp_batch b;
    cddp_loader_begin(l);
    assert_int_equal(cddp_loader_next(l, &b, &err), 1);
    cddp_tensor *x = cddp_batch_tensor(ctx, &b, 0), *y = cddp_batch_tensor(ctx, &b, 1);
    assert_int_equal(x->ndim, 4);
    assert_int_equal(x->shape[0], 32);
    assert_int_equal(x->shape[1], 1);
    assert_int_equal(x->shape[2], 28);
    assert_int_equal(y->ndim, 1);
    assert_int_equal(y->dtype, CDDP_I64);
    assert_ptr_equal(x->data, b.data[0]);
    assert_int_equal(cddp_get(y, 0), 9); /* t10k's first label: ankle boot */
    cddp_ctx_destroy(ctx);
    cddp_loader_destroy(l);
    cddp_dataset_destroy(ds);
}

/* With a device (the emulated one, whose queued copies run late on a queue thread of their own):
 * every batch reaches the step there, as a view of the loader's copy (no copy in the step), with
 * the values of the host's batch, epoch after epoch, with and without prefetching; a context on the
 * CPU still gets the host's batch. A step that did not wait for the copy would read NaNs (the
 * device's fresh memory) or an older batch. */
static void test_loader_on_the_device(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_device *emu = cddp_device_get("emu:0", &err);
    assert_non_null(emu);
    cddp_dataset *ds = probe_dataset(103, -1);
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = emu});
    cddp_ctx *cpu = cddp_ctx_create(NULL);
    for (int prefetch = 0; prefetch <= 2; prefetch++) {
        cddp_sampler_options so = {1, 0, true, 7, false, false};
        cddp_sampler *s = cddp_sampler_create(103, &so, &err);
        cddp_loader_options lo = {.batch_size = 8, .prefetch = prefetch, .device = emu};
        cddp_loader *l = cddp_loader_create(ds, s, &lo, &err);
        assert_non_null(l);
        for (int epoch = 0; epoch < 2; epoch++) {
            int64_t nb = cddp_loader_begin(l), seen = 0;
            cddp_batch b;
            while (cddp_loader_next(l, &b, &err) == 1) {
                assert_ptr_equal(b.device, emu);
                cddp_ctx_reset(ctx);
                cddp_tensor *x = cddp_batch_tensor(ctx, &b, 0), *y = cddp_batch_tensor(ctx, &b, 1);
                assert_ptr_equal(x->data, b.device_data[0]);
                assert_ptr_equal(y->data, b.device_data[1]);
                double want = 0;
                for (int64_t k = 0; k < 6 * b.size; k++) want += ((const float *)b.data[0])[k];
                double got = cddp_item(cddp_sum(ctx, x));
                assert_true(fabs(got - want) <= 1e-6 * want); /* a NaN fails too */
                for (int64_t j = 0; j < b.size; j++) assert_int_equal(cddp_get(y, j), b.indices[j]);
                cddp_ctx_reset(cpu);
                cddp_tensor *hx = cddp_batch_tensor(cpu, &b, 0);
                assert_ptr_equal(hx->data, b.data[0]);
                seen++;
            }
            assert_int_equal(seen, nb);
            assert_int_equal(cddp_ctx_status(ctx), CDDP_OK);
        }
        cddp_loader_destroy(l);
        cddp_sampler_destroy(s);
    }
    cddp_ctx_destroy(cpu);
    cddp_ctx_destroy(ctx);
    cddp_dataset_destroy(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_yields_the_samplers_choice),
        cmocka_unit_test(test_prefetch_changes_nothing),
        cmocka_unit_test(test_transforms),
        cmocka_unit_test(test_resume_through_the_loader),
        cmocka_unit_test(test_dataset_errors_reach_the_caller),
        cmocka_unit_test(test_shards_partition_fashion_mnist),
        cmocka_unit_test(test_batch_tensor),
        cmocka_unit_test(test_loader_on_the_device),
    };
    /* the cases with a sampler again, by its rule */
    const struct CMUnitTest by_rule[] = {
        cmocka_unit_test(test_loader_yields_the_samplers_choice),
        cmocka_unit_test(test_prefetch_changes_nothing),
        cmocka_unit_test(test_resume_through_the_loader),
        cmocka_unit_test(test_dataset_errors_reach_the_caller),
        cmocka_unit_test(test_loader_on_the_device),
    };
    int failed = cmocka_run_group_tests_name("lists", tests, NULL, NULL);
    cddp__sampler_list_max = 0;
    return failed + cmocka_run_group_tests_name("rules", by_rule, NULL, NULL);
}
