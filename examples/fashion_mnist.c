/* fashion_mnist.c: train the MindSpore seed's MLP (784-512-512-10) or a small CNN on
 * Fashion-MNIST, in one process, and report test accuracy every epoch.
 *
 *   build/bin/fashion_mnist --epochs 3 --model mlp
 *   build/bin/fashion_mnist --model cnn --optimizer adamw --lr 1e-3 --json
 *
 * The loop is the one every cddp program has: reset the step context, forward, loss, zero the
 * gradients, backward, optimizer step. The data comes as in the seeds: a dataset, a
 * DistributedSampler (set_epoch every epoch), and a DataLoader that rescales and normalises
 * ((x / 255 - 0.1307) / 0.3081) on a background thread while the step runs.
 */
#include <cddp/cddp.h>

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MEAN 0.1307f
#define STD  0.3081f

/* The seed's transforms: Rescale(1/255), Normalize(0.1307, 0.3081), two batches prepared ahead. */
static cddp_loader_options loader_options(int64_t batch) {
    return (cddp_loader_options){.batch_size = batch,
                                 .prefetch = 2,
                                 .rescale = true,
                                 .rescale_scale = 1.0f / 255.0f,
                                 .normalize_channels = 1,
                                 .mean = {MEAN},
                                 .std = {STD}};
}

typedef struct options {
    int epochs, batch, log_every;
    float lr, momentum, target_acc;
    const char *optimizer, *model, *data, *save;
    uint64_t seed;
    int64_t limit;
    bool json;
} options;

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: fashion_mnist [options]\n"
        "Trains an MLP or a CNN on Fashion-MNIST and prints test accuracy every epoch.\n\n"
        "  --epochs N          epochs to train (default 3)\n"
        "  --batch-size N      samples per step (default 64)\n"
        "  --lr X              learning rate (default 0.01)\n"
        "  --momentum X        SGD momentum (default 0.9)\n"
        "  --optimizer NAME    sgd or adamw (default sgd)\n"
        "  --model NAME        mlp (784-512-512-10) or cnn (2 conv + pool + 2 fc) (default mlp)\n"
        "  --data DIR          folder with the IDX files (default $CDDP_DATA or Debian's\n"
        "                      /usr/share/datasets/fashion-mnist)\n"
        "  --seed N            seed for weights and shuffling (default 0)\n"
        "  --limit N           train on the first N samples only (default: all)\n"
        "  --log-every N       print the loss every N steps (default 100; 0: never)\n"
        "  --target-acc X      stop after the first epoch whose test accuracy reaches X\n"
        "  --save PATH         write a safetensors checkpoint after the last epoch\n"
        "  --json              end with one JSON line of results\n"
        "  -h, --help          show this help\n");
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.epochs = 3,
                   .batch = 64,
                   .log_every = 100,
                   .lr = 0.01f,
                   .momentum = 0.9f,
                   .optimizer = "sgd",
                   .model = "mlp",
                   .limit = -1};
    static const struct option longopts[] = {{"epochs", required_argument, 0, 'e'},
                                             {"batch-size", required_argument, 0, 'b'},
                                             {"lr", required_argument, 0, 'l'},
                                             {"momentum", required_argument, 0, 'M'},
                                             {"optimizer", required_argument, 0, 'o'},
                                             {"model", required_argument, 0, 'm'},
                                             {"data", required_argument, 0, 'd'},
                                             {"seed", required_argument, 0, 's'},
                                             {"limit", required_argument, 0, 'n'},
                                             {"log-every", required_argument, 0, 'L'},
                                             {"target-acc", required_argument, 0, 't'},
                                             {"save", required_argument, 0, 'S'},
                                             {"json", no_argument, 0, 'j'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        end = NULL;
        switch (c) {
        case 'e':
            o->epochs = (int)strtol(optarg, &end, 10);
            break;
        case 'b':
            o->batch = (int)strtol(optarg, &end, 10);
            break;
        case 'l':
            o->lr = strtof(optarg, &end);
            break;
        case 'M':
            o->momentum = strtof(optarg, &end);
            break;
        case 'o':
            o->optimizer = optarg;
            break;
        case 'm':
            o->model = optarg;
            break;
        case 'd':
            o->data = optarg;
            break;
        case 's':
            o->seed = strtoull(optarg, &end, 10);
            break;
        case 'n':
            o->limit = strtoll(optarg, &end, 10);
            break;
        case 'L':
            o->log_every = (int)strtol(optarg, &end, 10);
            break;
        case 't':
            o->target_acc = strtof(optarg, &end);
            break;
        case 'S':
            o->save = optarg;
            break;
        case 'j':
            o->json = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (end && *end) {
            fprintf(stderr, "fashion_mnist: '%s' is not a number\n", optarg);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fashion_mnist: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->epochs < 1 || o->batch < 1 || o->log_every < 0 || !(o->lr > 0)) {
        fprintf(stderr, "fashion_mnist: --epochs and --batch-size must be >= 1, --lr > 0\n");
        return -1;
    }
    if (strcmp(o->optimizer, "sgd") != 0 && strcmp(o->optimizer, "adamw") != 0) {
        fprintf(stderr, "fashion_mnist: --optimizer must be sgd or adamw, not '%s'\n",
                o->optimizer);
        return -1;
    }
    if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0) {
        fprintf(stderr, "fashion_mnist: --model must be mlp or cnn, not '%s'\n", o->model);
        return -1;
    }
    return 0;
}

/* The MindSpore seed's Network: Flatten, then Dense-ReLU-Dense-ReLU-Dense. */
static int build_mlp(cddp_model *m) {
    int rc = cddp_model_add(m, "flatten", cddp_nn_flatten());
    if (!rc) rc = cddp_model_add(m, "dense_relu_sequential.0", cddp_nn_linear(784, 512));
    if (!rc) rc = cddp_model_add(m, "dense_relu_sequential.1", cddp_nn_relu());
    if (!rc) rc = cddp_model_add(m, "dense_relu_sequential.2", cddp_nn_linear(512, 512));
    if (!rc) rc = cddp_model_add(m, "dense_relu_sequential.3", cddp_nn_relu());
    if (!rc) rc = cddp_model_add(m, "dense_relu_sequential.4", cddp_nn_linear(512, 10));
    return rc;
}

/* conv(1->16, 3x3) relu pool2, conv(16->32, 3x3) relu pool2, fc 1568->128 relu, fc 128->10. */
static int build_cnn(cddp_model *m) {
    int rc = cddp_model_add(m, "conv1", cddp_nn_conv2d(1, 16, 3, 1, 1));
    if (!rc) rc = cddp_model_add(m, "relu1", cddp_nn_relu());
    if (!rc) rc = cddp_model_add(m, "pool1", cddp_nn_max_pool2d(2, 2));
    if (!rc) rc = cddp_model_add(m, "conv2", cddp_nn_conv2d(16, 32, 3, 1, 1));
    if (!rc) rc = cddp_model_add(m, "relu2", cddp_nn_relu());
    if (!rc) rc = cddp_model_add(m, "pool2", cddp_nn_max_pool2d(2, 2));
    if (!rc) rc = cddp_model_add(m, "flatten", cddp_nn_flatten());
    if (!rc) rc = cddp_model_add(m, "fc1", cddp_nn_linear(32 * 7 * 7, 128));
    if (!rc) rc = cddp_model_add(m, "relu3", cddp_nn_relu());
    if (!rc) rc = cddp_model_add(m, "fc2", cddp_nn_linear(128, 10));
    return rc;
}

/* The images of a batch as the model wants them: (B,1,28,28) for the CNN, (B,784) for the MLP. */
static cddp_tensor *images(cddp_ctx *ctx, const cddp_batch *b, bool cnn) {
    cddp_tensor *x = cddp_batch_tensor(ctx, b, 0);
    return cnn ? x : cddp_flatten(ctx, x);
}

/* Test accuracy over the whole split, in evaluation mode, 250 images at a time (the CNN's
 * im2col columns for a batch of B take B * 0.6 MB of arena). */
static int evaluate(cddp_model *m, cddp_ctx *ctx, cddp_loader *test, bool cnn, double *acc,
                    cddp_error *err) {
    int64_t correct = 0, seen = 0;
    bool old = cddp_ctx_set_grad_enabled(ctx, false);
    cddp_model_set_training(m, false);
    cddp_batch b;
    int rc;
    cddp_loader_begin(test);
    while ((rc = cddp_loader_next(test, &b, err)) == 1) {
        cddp_ctx_reset(ctx);
        cddp_tensor *logits = cddp_model_forward(m, ctx, images(ctx, &b, cnn));
        if (!logits) break;
        correct += cddp_count_correct(logits, cddp_batch_tensor(ctx, &b, 1));
        seen += b.size;
    }
    if (rc == 1) rc = cddp_error_set(err, cddp_ctx_status(ctx), "%s", cddp_ctx_error(ctx));
    cddp_ctx_reset(ctx);
    cddp_ctx_set_grad_enabled(ctx, old);
    cddp_model_set_training(m, true);
    *acc = seen ? (double)correct / (double)seen : 0.0;
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    int status = 1;
    cddp_error err = {0};
    cddp_dataset *train = NULL, *test = NULL;
    cddp_sampler *sampler = NULL;
    cddp_loader *train_loader = NULL, *test_loader = NULL;
    cddp_model *m = NULL;
    cddp_optim *opt = NULL;
    cddp_ctx *ctx = NULL;
    bool cnn = strcmp(o.model, "cnn") == 0;

    train = cddp_dataset_mnist(o.data, true, &err);
    test = train ? cddp_dataset_mnist(o.data, false, &err) : NULL;
    if (!test) goto fail;
    if (cddp_field_bytes(cddp_dataset_field(train, 0)) != 784 * sizeof(float)) {
        cddp_error_set(&err, CDDP_EFORMAT, "expected 28x28 images");
        goto fail;
    }
    if (o.limit >= 0 && o.limit < cddp_dataset_len(train)) {
        /* --limit: the first samples, copied into an in-memory dataset. */
        int64_t n = o.limit;
        float *img = malloc(sizeof(float) * 784 * (size_t)(n ? n : 1));
        int64_t *lab = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n && img && lab; i++)
            cddp_dataset_get(train, i, (void *const[]){img + 784 * i, lab + i}, &err);
        cddp_field f[2] = {*cddp_dataset_field(train, 0), *cddp_dataset_field(train, 1)};
        cddp_dataset *prefix =
            img && lab ? cddp_dataset_from_arrays(n, 2, f, (const void *const[]){img, lab}, &err)
                       : NULL;
        free(img);
        free(lab);
        if (!prefix) goto fail;
        cddp_dataset_destroy(train);
        train = prefix;
    }
    cddp_sampler_options so = cddp_sampler_defaults();
    so.seed = o.seed;
    sampler = cddp_sampler_create(cddp_dataset_len(train), &so, &err);
    if (!sampler) goto fail;
    cddp_loader_options lo = loader_options(o.batch);
    train_loader = cddp_loader_create(train, sampler, &lo, &err);
    lo = loader_options(250);
    test_loader = train_loader ? cddp_loader_create(test, NULL, &lo, &err) : NULL;
    if (!test_loader) goto fail;

    m = cddp_model_create();
    ctx = cddp_ctx_create(&(cddp_ctx_options){.seed = o.seed});
    if (!m || !ctx) {
        cddp_error_set(&err, CDDP_ENOMEM, "out of memory");
        goto fail;
    }
    if ((cnn ? build_cnn(m) : build_mlp(m)) || cddp_model_build(m, o.seed)) {
        cddp_error_set(&err, CDDP_EINVAL, "%s", cddp_model_error(m));
        goto fail;
    }
    if (strcmp(o.optimizer, "sgd") == 0)
        opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = o.lr, .momentum = o.momentum}, &err);
    else {
        cddp_adamw_options aw = cddp_adamw_defaults(o.lr);
        opt = cddp_optim_adamw(m, &aw, &err);
    }
    if (!opt) goto fail;

    double train_s = 0.0, acc = 0.0, last_loss = NAN;
    int64_t samples = 0;
    int epochs_run = 0;
    for (int epoch = 0; epoch < o.epochs; epoch++) {
        cddp_sampler_set_epoch(sampler, epoch);
        double t0 = cddp_now_s();
        cddp_batch b;
        int rc;
        cddp_loader_begin(train_loader);
        while ((rc = cddp_loader_next(train_loader, &b, &err)) == 1) {
            cddp_ctx_reset(ctx);
            cddp_tensor *loss =
                cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, images(ctx, &b, cnn)),
                                   cddp_batch_tensor(ctx, &b, 1), CDDP_REDUCE_MEAN);
            cddp_model_zero_grad(m);
            if (cddp_backward(ctx, loss) != CDDP_OK) {
                cddp_error_set(&err, cddp_ctx_status(ctx), "%s", cddp_ctx_error(ctx));
                goto fail;
            }
            cddp_optim_step(opt);
            last_loss = cddp_get(loss, 0);
            samples += b.size;
            if (o.log_every && b.index % o.log_every == 0)
                printf("epoch: %d, step: %lld, loss is %.6f\n", epoch, (long long)b.index,
                       last_loss);
        }
        if (rc < 0) goto fail;
        train_s += cddp_now_s() - t0;
        epochs_run++;
        if (evaluate(m, ctx, test_loader, cnn, &acc, &err) < 0) goto fail;
        printf("epoch: %d, test accuracy: %.4f\n", epoch, acc);
        fflush(stdout);
        if (o.target_acc > 0 && acc >= o.target_acc) break;
    }
    if (o.save) {
        char ep[16];
        snprintf(ep, sizeof ep, "%d", epochs_run);
        const char *meta[] = {"epoch", ep, "model", o.model, NULL};
        if (cddp_checkpoint_save(o.save, m, opt, meta, &err) != CDDP_OK) goto fail;
        printf("saved %s\n", o.save);
    }
    if (o.json)
        printf("{\"model\": \"%s\", \"optimizer\": \"%s\", \"epochs\": %d, \"batch_per_rank\": %d, "
               "\"world\": 1, \"train_samples\": %lld, \"train_s\": %.3f, \"samples_per_s\": %.1f, "
               "\"final_loss\": %.6f, \"test_acc\": %.4f}\n",
               o.model, o.optimizer, epochs_run, o.batch, (long long)samples, train_s,
               train_s > 0 ? (double)samples / train_s : 0.0, last_loss, acc);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "fashion_mnist: %s\n", cddp_error_msg(&err));
done:
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    cddp_ctx_destroy(ctx);
    cddp_loader_destroy(train_loader);
    cddp_loader_destroy(test_loader);
    cddp_sampler_destroy(sampler);
    cddp_dataset_destroy(train);
    cddp_dataset_destroy(test);
    return status;
}
