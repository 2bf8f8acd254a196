/* bench_mlp.c: training throughput of the MLP (784-512-512-10), or of fashion_mnist's CNN or
 * ResNet, on Fashion-MNIST, one thread per rank, on one rank or data-parallel under cddprun.
 *
 *   bench_mlp [--model mlp|cnn|resnet] [--batch-size 32] [--lr 0.01] [--epochs 1] [--threads 1]
 *             [--data DIR] [--bucket-cap-mb X] [--device cpu|emu|cuda]
 *             [--hook none|bf16|fp16|powersgd|user] [--powersgd-rank R] [--powersgd-start S]
 *   cddprun --nproc_per_node 2 bench_mlp ...
 *
 * The setting of bench/mlp_torch.py, so that bench/mlp_vs_torch.sh and bench/ddp_vs_torch.sh can
 * compare the two in one run: the training set normalised once up front, a seeded shuffle (the
 * DistributedSampler's, each rank its part), plain SGD, the batch size per rank, and the clock
 * around the training loop only (batch gathering included). With more than one rank the model is
 * wrapped with DistributedDataParallel (default options: CDDP_DDP_OVERLAP picks where the buckets
 * are reduced). Rank 0 prints one JSON line: samples/s over all ranks, and the last step's DDP
 * time split. --hook user takes the buckets through a communication hook of the program's (the
 * mean by one blocking allreduce in the hook: what DDP does itself), for the hook path's cost.
 */
#include "common.h"

#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --hook user: the mean, as DDP's own allreduce makes it, from inside a comm_hook */
static int mean_hook(void *state, cddp_comm *group, int bucket, float *grads, int64_t count,
                     cddp_error *err) {
    (void)state, (void)bucket;
    return cddp_comm_allreduce(group, grads, grads, count, CDDP_COMM_F32, CDDP_COMM_MEAN, -1, err);
}

int main(int argc, char **argv) {
    int batch = 32, epochs = 1, threads = 1;
    float lr = 0.01f;
    double cap_mb = 0;
    const char *data = NULL, *model = "mlp", *device = "cpu", *hook = "none";
    int psgd_rank = 0;
    int64_t psgd_start = 0;
    static const struct option longopts[] = {{"batch-size", required_argument, 0, 'b'},
                                             {"lr", required_argument, 0, 'l'},
                                             {"epochs", required_argument, 0, 'e'},
                                             {"threads", required_argument, 0, 't'},
                                             {"data", required_argument, 0, 'd'},
                                             {"bucket-cap-mb", required_argument, 0, 'B'},
                                             {"model", required_argument, 0, 'm'},
                                             {"device", required_argument, 0, 'D'},
                                             {"hook", required_argument, 0, 'H'},
                                             {"powersgd-rank", required_argument, 0, 'r'},
                                             {"powersgd-start", required_argument, 0, 's'},
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
        case 'B':
            cap_mb = strtod(optarg, NULL);
            break;
        case 'D':
            device = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case 'H':
            hook = optarg;
            break;
        case 'r':
            psgd_rank = atoi(optarg);
            break;
        case 's':
            psgd_start = atoll(optarg);
            break;
        case 'h':
            printf("usage: [cddprun --nproc_per_node N] bench_mlp [--model mlp|cnn|resnet] "
                   "[--batch-size N] "
                   "[--lr X] "
                   "[--epochs N] [--threads N] [--data DIR] [--bucket-cap-mb X] "
                   "[--device NAME] [--hook none|bf16|fp16|powersgd|user] [--powersgd-rank R] "
                   "[--powersgd-start S]\n");
            return 0;
        default:
            return 2;
        }
    }
    bool resnet = strcmp(model, "resnet") == 0, cnn = resnet || strcmp(model, "cnn") == 0;
    if (!cnn && strcmp(model, "mlp") != 0) {
        fprintf(stderr, "bench_mlp: --model must be mlp, cnn or resnet, not '%s'\n", model);
        return 2;
    }
    cddp_ddp_hook h = !strcmp(hook, "bf16")       ? CDDP_DDP_HOOK_BF16
                      : !strcmp(hook, "fp16")     ? CDDP_DDP_HOOK_FP16
                      : !strcmp(hook, "powersgd") ? CDDP_DDP_HOOK_POWERSGD
                                                  : CDDP_DDP_HOOK_NONE;
    bool user = !strcmp(hook, "user");
    if (h == CDDP_DDP_HOOK_NONE && strcmp(hook, "none") != 0 && !user) {
        fprintf(stderr, "bench_mlp: --hook must be none, bf16, fp16, powersgd or user, not '%s'\n",
                hook);
        return 2;
    }
    if (batch < 1 || epochs < 1 || threads < 1) {
        fprintf(stderr, "bench_mlp: --batch-size, --epochs and --threads must be >= 1\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    cddp_error err = {0};
    cddp_device *dev = cddp_device_for_rank(device, &err);
    if (!dev) {
        fprintf(stderr, "bench_mlp: --device %s: %s\n", device, err.msg);
        return 2;
    }
    cddp_mnist train;
    if (cddp_mnist_load(data, true, &train, &err) != CDDP_OK) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    cddp_comm *group = cddp_comm_create(NULL, &err);
    if (!group) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    int rank = cddp_comm_rank(group), world = cddp_comm_size(group);
    int64_t n = train.n;
    float *images = malloc(sizeof(float) * (size_t)(n * 784));
    float *x = malloc(sizeof(float) * (size_t)batch * 784);
    int64_t *y = malloc(sizeof(int64_t) * (size_t)batch),
            *order = malloc(sizeof(int64_t) * (size_t)n);
    cddp_mnist_normalize(&train, 0, n, 0.1307f, 0.3081f, images);

    cddp_model *m = resnet ? bench_resnet_model()
                    : cnn  ? bench_cnn_model()
                           : bench_mlp_model(false);
    if (cddp_model_to(m, dev, &err) != CDDP_OK) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    cddp_ddp *ddp = NULL;
    if (world > 1 && !(ddp = cddp_ddp_wrap(m, group,
                                           &(cddp_ddp_options){.bucket_cap_mb = cap_mb,
                                                               .hook = h,
                                                               .comm_hook = user ? mean_hook : NULL,
                                                               .powersgd_rank = psgd_rank,
                                                               .powersgd_start_step = psgd_start},
                                           &err))) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    cddp_optim *opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = lr}, &err);
    cddp_ctx *ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev});
    /* The library's shuffle: the DistributedSampler, a new order every epoch, each rank its
     * part (n / world samples). */
    cddp_sampler_options so = {.num_replicas = world, .rank = rank, .shuffle = true};
    cddp_sampler *sampler = cddp_sampler_create(n, &so, &err);
    int64_t per_rank = sampler ? cddp_sampler_len(sampler) : 0;
    if (!sampler) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    double train_s = 0, loss = 0;
    int64_t samples = 0;
    for (int e = 0; e < epochs; e++) {
        cddp_sampler_indices(sampler, e, order);
        double t0 = cddp_now_s();
        for (int64_t first = 0; first < per_rank; first += batch) {
            int64_t b = per_rank - first < batch ? per_rank - first : batch;
            for (int64_t i = 0; i < b; i++) {
                memcpy(x + i * 784, images + order[first + i] * 784, 784 * sizeof(float));
                y[i] = train.labels[order[first + i]];
            }
            cddp_ctx_reset(ctx);
            cddp_tensor *in = cnn ? cddp_from_host(ctx, CDDP_F32, CDDP_SHAPE(b, 1, 28, 28), x)
                                  : cddp_from_host(ctx, CDDP_F32, CDDP_SHAPE(b, 784), x);
            cddp_tensor *l = cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, in),
                                                cddp_from_host(ctx, CDDP_I64, CDDP_SHAPE(b), y),
                                                CDDP_REDUCE_MEAN);
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
    /* Every rank's samples over the slowest rank's time. */
    double sums[2] = {(double)samples, 0}, slowest = train_s;
    if (cddp_comm_allreduce(group, sums, sums, 1, CDDP_COMM_F64, CDDP_COMM_SUM, -1, &err) ||
        cddp_comm_allreduce(group, &slowest, &slowest, 1, CDDP_COMM_F64, CDDP_COMM_MAX, -1, &err)) {
        fprintf(stderr, "bench_mlp: %s\n", err.msg);
        return 1;
    }
    cddp_ddp_stats st = ddp ? cddp_ddp_stats_get(ddp) : (cddp_ddp_stats){0};
    if (rank == 0)
        printf("{\"impl\": \"cddp\", \"device\": \"%s\", \"model\": \"%s\", \"world\": %d, "
               "\"batch\": %d, \"threads\": %d, "
               "\"samples\": %.0f, \"train_s\": %.3f, \"samples_per_s\": %.1f, "
               "\"final_loss\": %.4f, \"forward_ms\": %.3f, \"backward_ms\": %.3f, "
               "\"allreduce_ms\": %.3f, \"wait_ms\": %.3f, \"overlap\": %.2f, \"buckets\": %d, "
               "\"comm_inline\": %s, \"hook\": \"%s\", \"bytes_per_step\": %zu}\n",
               cddp_device_name(dev), model, world, batch, threads, sums[0], slowest,
               sums[0] / slowest, loss, st.forward_s * 1e3, st.backward_s * 1e3, st.comm_s * 1e3,
               st.wait_s * 1e3, st.overlap, st.buckets, st.comm_inline ? "true" : "false", hook,
               st.bytes);
    cddp_ddp_destroy(ddp);
    cddp_comm_destroy(group);
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
