/* bench_data.c: the data pipeline's speed, and how much of a training step waits for data.
 *
 *   bench_data [--batch-size 64] [--prefetch 4] [--data DIR | --npy DIR]
 *
 * 1. Loading + collation: one epoch of Fashion-MNIST's 60000 training images through
 *    DistributedSampler + DataLoader (rescale and normalise, as the seeds do), no training.
 * 2. Training: the MLP (784-512-512-10), SGD lr 0.01 momentum 0.9, one BLAS thread, one epoch
 *    fed by the loader; the share of the loop's time spent inside cddp_loader_next.
 * Both with prefetch 0 (loading on the training thread) and with --prefetch (a worker thread).
 * With --npy DIR the images and labels come from DIR/images.npy (uint8, (N, 1, 28, 28)) and
 * DIR/labels.npy (int64), as docs/GUIDE.md's Python saves them (cddp_dataset_from_files: each
 * sample read from the files as the loader takes it), instead of Fashion-MNIST in memory.
 * Prints one JSON line per measurement and a table.
 */
#include "common.h"

#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

static cddp_loader *make_loader(cddp_dataset *ds, cddp_sampler *s, int64_t batch, int prefetch) {
    cddp_loader_options lo = {.batch_size = batch,
                              .prefetch = prefetch,
                              .rescale = true,
                              .rescale_scale = 1.0f / 255.0f,
                              .normalize_channels = 1,
                              .mean = {0.1307f},
                              .std = {0.3081f}};
    cddp_error err = {0};
    cddp_loader *l = cddp_loader_create(ds, s, &lo, &err);
    if (!l) {
        fprintf(stderr, "bench_data: %s\n", err.msg);
        exit(1);
    }
    return l;
}

static void fail(const char *msg) {
    fprintf(stderr, "bench_data: %s\n", msg);
    exit(1);
}

int main(int argc, char **argv) {
    int64_t batch = 64;
    int prefetch = 4;
    const char *data = NULL, *npy = NULL;
    static const struct option longopts[] = {{"batch-size", required_argument, 0, 'b'},
                                             {"npy", required_argument, 0, 'n'},
                                             {"prefetch", required_argument, 0, 'p'},
                                             {"data", required_argument, 0, 'd'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'b':
            batch = atoll(optarg);
            break;
        case 'p':
            prefetch = atoi(optarg);
            break;
        case 'd':
            data = optarg;
            break;
        case 'n':
            npy = optarg;
            break;
        case 'h':
            printf("usage: bench_data [--batch-size N] [--prefetch N] [--data DIR | --npy DIR]\n");
            return 0;
        default:
            return 2;
        }
    }
    if (batch < 1 || prefetch < 1) fail("--batch-size and --prefetch must be >= 1");
    openblas_set_num_threads(1);
    cddp_error err = {0};
    char images[4096], labels[4096];
    snprintf(images, sizeof images, "%s/images.npy", npy ? npy : "");
    snprintf(labels, sizeof labels, "%s/labels.npy", npy ? npy : "");
    cddp_dataset *ds = npy ? cddp_dataset_from_files(2, (const char *const[]){images, labels},
                                                     (cddp_dtype[]){CDDP_F32, CDDP_I64}, &err)
                           : cddp_dataset_mnist(data, true, &err);
    if (!ds) fail(err.msg);
    cddp_sampler_options so = {1, 0, true, 0, false, false};
    cddp_sampler *s = cddp_sampler_create(cddp_dataset_len(ds), &so, &err);

    int depths[2] = {0, prefetch};
    double load_rate[2], wait_share[2], step_rate[2];
    for (int k = 0; k < 2; k++) {
        /* 1. Loading and collation alone. */
        cddp_loader *l = make_loader(ds, s, batch, depths[k]);
        cddp_batch b;
        int64_t n = 0;
        double t0 = cddp_now_s();
        cddp_loader_begin(l);
        while (cddp_loader_next(l, &b, &err) == 1) n += b.size;
        load_rate[k] = (double)n / (cddp_now_s() - t0);
        cddp_loader_destroy(l);

        /* 2. Training fed by the loader. */
        cddp_model *m = bench_mlp_model(true);
        cddp_optim *opt =
            cddp_optim_sgd(m, &(cddp_sgd_options){.lr = 0.01f, .momentum = 0.9f}, &err);
        cddp_ctx *ctx = cddp_ctx_create(NULL);
        l = make_loader(ds, s, batch, depths[k]);
        n = 0;
        t0 = cddp_now_s();
        cddp_loader_begin(l);
        while (cddp_loader_next(l, &b, &err) == 1) {
            cddp_ctx_reset(ctx);
            cddp_tensor *loss =
                cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, cddp_batch_tensor(ctx, &b, 0)),
                                   cddp_batch_tensor(ctx, &b, 1), CDDP_REDUCE_MEAN);
            cddp_model_zero_grad(m);
            if (cddp_backward(ctx, loss)) fail(cddp_ctx_error(ctx));
            cddp_optim_step(opt);
            n += b.size;
        }
        double total = cddp_now_s() - t0;
        wait_share[k] = cddp_loader_wait_seconds(l) / total;
        step_rate[k] = (double)n / total;
        printf(
            "{\"source\": \"%s\", \"prefetch\": %d, \"batch\": %lld, \"load_samples_per_s\": %.0f, "
            "\"train_samples_per_s\": %.0f, \"train_s\": %.3f, \"wait_s\": %.3f, "
            "\"wait_share\": %.4f}\n",
            npy ? "npy" : "memory", depths[k], (long long)batch, load_rate[k], step_rate[k], total,
            cddp_loader_wait_seconds(l), wait_share[k]);
        cddp_loader_destroy(l);
        cddp_ctx_destroy(ctx);
        cddp_optim_destroy(opt);
        cddp_model_destroy(m);
    }
    printf("\n| prefetch | loading + collation, samples/s | MLP training, samples/s | "
           "share of step time waiting for data |\n|---|---|---|---|\n");
    for (int k = 0; k < 2; k++)
        printf("| %d | %.0f | %.0f | %.2f%% |\n", depths[k], load_rate[k], step_rate[k],
               100.0 * wait_share[k]);
    cddp_sampler_destroy(s);
    cddp_dataset_destroy(ds);
    return 0;
}
