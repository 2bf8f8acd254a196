/* bench_mlp.c: training throughput of the MLP (784-512-512-10) on Fashion-MNIST, one thread.
 *
 *   bench_mlp [--batch-size 32] [--lr 0.01] [--epochs 1] [--threads 1] [--data DIR]
 *
 * The setting of bench/mlp_torch.py, so that bench/mlp_vs_torch.sh can compare the two in one
 * run: the training set normalised once up front, a seeded shuffle (the sampler's), plain SGD, and
 * the clock around the training loop only (batch gathering included). Prints one JSON line.
 */
#include "common.h"

#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int batch = 32, epochs = 1, threads = 1;
    float lr = 0.01f;
    const char *data = NULL;
    static const struct option longopts[] = {{"batch-size", required_argument, 0, 'b'},
                                             {"lr", required_argument, 0, 'l'},
                                             {"epochs", required_argument, 0, 'e'},
                                             {"threads", required_argument, 0, 't'},
                                             {"data", required_argument, 0, 'd'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'b':
            batch = atoi(optarg);
            break;
        case 'l':
            lr = strtof(optarg, NULL);
            break;
        case 'e':
            epochs = atoi(optarg);
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 'd':
            data = optarg;
            break;
        case 'h':
            printf("usage: bench_mlp [--batch-size N] [--lr X] [--epochs N] [--threads N] "
                   "[--data DIR]\n");
            return 0;
        default:
            return 2;
        }
    }
    if (batch < 1 || epochs < 1 || threads < 1) {
        fprintf(stderr, "bench_mlp: --batch-size, --epochs and --threads must be >= 1\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    cddp_error err = {0};
    cddp_mnist train;
    if (cddp_mnist_load(data, true, &train, &err) != CDDP_OK) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    int64_t n = train.n;
    float *images = malloc(sizeof(float) * (size_t)(n * 784));
    float *x = malloc(sizeof(float) * (size_t)batch * 784);
    int64_t *y = malloc(sizeof(int64_t) * (size_t)batch),
            *order = malloc(sizeof(int64_t) * (size_t)n);
    cddp_mnist_normalize(&train, 0, n, 0.1307f, 0.3081f, images);

    cddp_model *m = bench_mlp_model(false);
    cddp_optim *opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = lr}, &err);
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    /* The library's shuffle: a one-replica DistributedSampler, a new order every epoch. */
    cddp_sampler_options so = {.num_replicas = 1, .rank = 0, .shuffle = true};
    cddp_sampler *sampler = cddp_sampler_create(n, &so, &err);
    if (!sampler) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    double train_s = 0, loss = 0;
    int64_t samples = 0;
    for (int e = 0; e < epochs; e++) {
        cddp_sampler_indices(sampler, e, order);
        double t0 = cddp_now_s();
        for (int64_t first = 0; first < n; first += batch) {
            int64_t b = n - first < batch ? n - first : batch;
            for (int64_t i = 0; i < b; i++) {
                memcpy(x + i * 784, images + order[first + i] * 784, 784 * sizeof(float));
                y[i] = train.labels[order[first + i]];
            }
            cddp_ctx_reset(ctx);
            cddp_tensor *in = cddp_wrap(ctx, CDDP_F32, CDDP_SHAPE(b, 784), x);
            cddp_tensor *l =
                cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, in),
                                   cddp_wrap(ctx, CDDP_I64, CDDP_SHAPE(b), y), CDDP_REDUCE_MEAN);
            cddp_model_zero_grad(m);
            if (cddp_backward(ctx, l) != CDDP_OK) {
                fprintf(stderr, "bench_mlp: %s\n", cddp_ctx_error(ctx));
                return 1;
            }
            cddp_optim_step(opt);
            loss = cddp_get(l, 0);
            samples += b;
        }
        train_s += cddp_now_s() - t0;
    }
    printf("{\"impl\": \"cddp\", \"batch\": %d, \"threads\": %d, \"samples\": %lld, "
           "\"train_s\": %.3f, \"samples_per_s\": %.1f, \"final_loss\": %.4f}\n",
           batch, threads, (long long)samples, train_s, (double)samples / train_s, loss);
    cddp_sampler_destroy(sampler);
    cddp_ctx_destroy(ctx);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    cddp_mnist_free(&train);
    free(images);
    free(x);
    free(y);
    free(order);
    return 0;
}
