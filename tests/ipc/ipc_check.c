/* ipc_check.c: one rank of the checks of collectives on device memory (cddp/dcomm.h), through
 * CUDA IPC or host copies, under the launcher, on the emulated device (or a GPU):
 * rounds of allreduce (sum out of place, mean in place),
 * reduce-scatter and allgather, queued back to back with no wait of the host between them, each
 * round's results read back once and compared with what the ranks' values must give. The values
 * are eighths of small integers, so every sum is exact whatever the order of its terms, and the
 * mean is the sum times 1 / world as CUDA IPC computes it (divided by world through the host):
 * every element must match bit for bit. The last rank's device is made late before each round's
 * first collective (a hundred passes over 16 MiB queued first) and, every other round, its host too
 * (10 ms asleep before it queues), so a collective that read another rank's scratch before that
 * rank's copy into it had run would read NaNs (fresh device memory) or the last round's values.
 *
 *   ipc_check [--device emu|cuda] [--transport ipc|host] [--scratch BYTES] [--rounds N]
 *             [--die-at K] [--timeout S] [--mismatch]
 *
 * --scratch (default 64 KiB) is small, so that the larger collectives run in pieces and the
 * scratch starts over many times a round. --die-at K: the last rank exits (status 3) before its
 * K-th collective; the others must then fail with the group's words, not hang. Prints
 * "rank R: ipc ok (...)" and exits 0, or prints what is wrong and exits 1 (2: a collective or
 * the communicator failed, with its message). */
#include <cddp/cddp.h>
#include <cddp/dcomm.h>
#include <cddp/internal/device.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank, world;
static bool through_host;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("rank %d: ", rank);                                                                 \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        exit(1);                                                                                   \
    } while (0)

/* Rank r's value i in round t: an eighth of a small integer. */
static float value(int r, int64_t i, int t) {
    return (float)((r + 1) * (int)(i % 97) + t - 40) / 8.0f;
}

static float sum_of(int64_t i, int t) {
    float s = 0;
    for (int r = 0; r < world; r++) s += value(r, i, t);
    return s;
}

static void *dalloc(cddp_device *dev, size_t bytes) {
    cddp_error err = {0};
    void *p = cddp_device_alloc(dev, bytes, &err);
    if (!p) FAIL("%s", err.msg);
    return p;
}

static void check(int rc, const cddp_error *err, const char *what) {
    if (rc == CDDP_OK) return;
    printf("rank %d: %s: %s\n", rank, what, err->msg);
    exit(2);
}

/* got's len elements against want(i, t, n), n the collective's count. */
static void compare(const float *got, int64_t len, float (*want)(int64_t i, int t, int64_t n),
                    int64_t n, int t, const char *what) {
    for (int64_t i = 0; i < len; i++)
        if (memcmp(&got[i], &(float){want(i, t, n)}, sizeof(float)) != 0)
            FAIL("round %d: %s of %lld: element %lld is %g, not %g", t, what, (long long)n,
                 (long long)i, got[i], want(i, t, n));
}

static float want_sum(int64_t i, int t, int64_t n) {
    (void)n;
    return sum_of(i, t);
}
static float want_mean(int64_t i, int t, int64_t n) {
    (void)n;
    return through_host ? sum_of(i, t) / (float)world : sum_of(i, t) * (1.0f / (float)world);
}
/* reduce-scatter: this rank's part (count n) of blocks whose element j of rank r's block b is
 * value(r, b n + j) */
static float want_part(int64_t i, int t, int64_t n) {
    return sum_of(rank * n + i, t);
}
/* allgather: rank r sent value(r, j) for its n elements */
static float want_gathered(int64_t i, int t, int64_t n) {
    return value((int)(i / n), i % n, t);
}

int main(int argc, char **argv) {
    const char *device = "emu";
    size_t scratch = 64 << 10;
    int rounds = 6, die_at = -1;
    bool mismatch = false;
    double timeout = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--transport") && i + 1 < argc)
            through_host = !strcmp(argv[++i], "host");
        else if (!strcmp(argv[i], "--scratch") && i + 1 < argc)
            scratch = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--die-at") && i + 1 < argc)
            die_at = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--mismatch"))
            mismatch = true;
        else {
            fprintf(stderr, "usage: ipc_check [--device emu|cuda] [--transport ipc|host] "
                            "[--scratch BYTES] [--rounds N] [--die-at K] [--timeout S] "
                            "[--mismatch]\n");
            return 64;
        }
    }
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) {
        fprintf(stderr, "ipc_check: %s\n", err.msg);
        return 1;
    }
    rank = cddp_comm_rank(g), world = cddp_comm_size(g);
    cddp_device *dev = cddp_device_for_rank(device, &err);
    if (!dev) FAIL("%s", err.msg);
    cddp_dcomm *c =
        cddp_dcomm_create(g, dev,
                          &(cddp_dcomm_options){.transport = through_host ? "host" : "ipc",
                                                .scratch_bytes = scratch,
                                                .timeout_s = timeout},
                          &err);
    check(c ? CDDP_OK : err.code, &err, "cddp_dcomm_create");

    /* CUDA IPC refuses a double, saying what it takes */
    if (!through_host && (cddp_dcomm_allreduce(c, NULL, NULL, 4, CDDP_COMM_F64, CDDP_COMM_SUM,
                                               &err) != CDDP_EUNSUPPORTED ||
                          !strstr(err.msg, "float32 sums and means only")))
        FAIL("a float64 allreduce was not refused as it should be: '%s'", err.msg);

    /* 0, 1, a few, not a multiple of the world, and more than the scratch holds */
    const int64_t counts[] = {0, 1, 7, 1001, (int64_t)(scratch / sizeof(float)) * 2 + 13};
    const int ncounts = (int)(sizeof counts / sizeof counts[0]);
    int64_t most = counts[ncounts - 1];
    size_t big = (size_t)4 << 20; /* floats: 16 MiB of work to make the last rank late */
    float *slow = dalloc(dev, big * sizeof(float));
    float *host = malloc(sizeof(float) * (size_t)most * (size_t)world);
    float *src = dalloc(dev, sizeof(float) * (size_t)most * (size_t)world);
    float *out[4][8];
    if (!host) FAIL("out of memory");
    check(cddp_device_memset(dev, slow, 0, big * sizeof(float), &err), &err, "a fill");
    for (int k = 0; k < ncounts; k++)
        for (int j = 0; j < 4; j++)
            out[j][k] =
                dalloc(dev, sizeof(float) * (size_t)(counts[k] ? counts[k] : 1) * (size_t)world);
    int calls = 0;
#define CALL(expr)                                                                                 \
    do {                                                                                           \
        if (calls++ == die_at && rank == world - 1) _exit(3);                                      \
        check((expr), &err, #expr);                                                                \
    } while (0)
    for (int t = 0; t < rounds; t++) {
        /* every rank's values for the round: world blocks of `most` (the reduce-scatter's input) */
        for (int64_t i = 0; i < most * world; i++) host[i] = value(rank, i, t);
        check(cddp_device_upload(dev, src, host, sizeof(float) * (size_t)(most * world), &err),
              &err, "an upload");
        if (rank == world - 1) {
            for (int p = 0; p < 100; p++) cddp_device_scale(dev, slow, big, 1.0f);
            if (t % 2) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
        for (int k = 0; k < ncounts; k++) {
            int64_t n = counts[k];
            float *sum = out[0][k], *mean = out[1][k], *part = out[2][k], *all = out[3][k];
            int64_t more = mismatch && rank == world - 1 && t == 0 && k == 1;
            CALL(cddp_dcomm_allreduce(c, src, sum, n + more, CDDP_COMM_F32, CDDP_COMM_SUM, &err));
            check(cddp_device_copy(dev, mean, src, sizeof(float) * (size_t)n, &err), &err, "copy");
            CALL(cddp_dcomm_allreduce(c, mean, mean, n, CDDP_COMM_F32, CDDP_COMM_MEAN, &err));
            /* reduce-scatter: block b of n elements holds value(rank, b n + j) */
            float *blocks = all; /* n x world, filled from src by the device */
            for (int b = 0; b < world; b++)
                check(cddp_device_copy(dev, blocks + b * n, src + b * n, sizeof(float) * (size_t)n,
                                       &err),
                      &err, "copy");
            CALL(cddp_dcomm_reduce_scatter(c, blocks, part, n, CDDP_COMM_F32, CDDP_COMM_SUM, &err));
            CALL(cddp_dcomm_allgather(c, src, all, n, CDDP_COMM_F32, &err));
        }
        CALL(cddp_dcomm_join(c, &err));
        for (int k = 0; k < ncounts; k++) {
            int64_t n = counts[k];
            float *got = malloc(sizeof(float) * (size_t)(n ? n : 1) * (size_t)world);
            if (!got) FAIL("out of memory");
            check(cddp_device_download(dev, got, out[0][k], sizeof(float) * (size_t)n, &err), &err,
                  "download");
            compare(got, n, want_sum, n, t, "the allreduce's sum");
            check(cddp_device_download(dev, got, out[1][k], sizeof(float) * (size_t)n, &err), &err,
                  "download");
            compare(got, n, want_mean, n, t, "the allreduce's mean, in place");
            check(cddp_device_download(dev, got, out[2][k], sizeof(float) * (size_t)n, &err), &err,
                  "download");
            compare(got, n, want_part, n, t, "the reduce-scatter");
            check(cddp_device_download(dev, got, out[3][k], sizeof(float) * (size_t)(n * world),
                                       &err),
                  &err, "download");
            compare(got, n * world, want_gathered, n, t, "the allgather");
            free(got);
        }
    }
    check(cddp_dcomm_wait(c, &err), &err, "cddp_dcomm_wait");
    printf("rank %d: %s ok (%d ranks, %d collectives, %s, %zu bytes of scratch)\n", rank,
           through_host ? "host" : "ipc", world, calls, cddp_device_name(dev), scratch);
    cddp_dcomm_destroy(c);
    for (int k = 0; k < ncounts; k++)
        for (int j = 0; j < 4; j++) cddp_device_free(dev, out[j][k]);
    cddp_device_free(dev, src);
    cddp_device_free(dev, slow);
    free(host);
    cddp_comm_destroy(g);
    return 0;
}
