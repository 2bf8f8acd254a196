/* fashion_mnist.c: train the MindSpore seed's MLP (784-512-512-10) or a small CNN on
 * Fashion-MNIST, data-parallel, and report test accuracy every epoch.
 *
 *   cddprun --nproc_per_node 2 build/bin/fashion_mnist --epochs 2
 *   build/bin/fashion_mnist --model cnn --optimizer adamw --lr 1e-3 --json     (one process)
 *
 * The loop is the one every cddp program has: reset the step context, forward, loss, zero the
 * gradients, backward, optimizer step. Data parallelism adds the seeds' two changes: a
 * DistributedSampler gives each rank its part of every epoch (set_epoch reshuffles), and the
 * model is wrapped with DistributedDataParallel, which averages the gradients during backward.
 * The DataLoader rescales and normalises ((x / 255 - 0.1307) / 0.3081) on a background thread
 * while the step runs. The test set is sharded across ranks and the correct counts summed.
 *
 * Rank 0 prints progress (a bar on a terminal, lines otherwise), writes a checkpoint after every
 * epoch (model, optimizer, epoch, random state) to OUT/checkpoint.safetensors, the metrics to
 * OUT/metrics.csv, and the curves (its loss at every step, the test accuracy after every epoch)
 * to OUT/loss.csv, OUT/eval.csv and OUT/curves.svg. --resume continues from a checkpoint.
 */
#include <cddp/cddp.h>

#include "curves.h"
#include "run.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    int epochs, batch, log_every, save_every, keep;
    float lr, momentum, target_acc;
    const char *optimizer, *model, *data, *save, *out, *resume, *hook, *init_from, *schedule,
        *sample_log, *device, *dtype, *tensorboard;
    double bucket_cap_mb;
    uint64_t seed;
    int64_t limit;
    bool json, zero, sync_bn;
    int64_t powersgd_rank, powersgd_start;
    const char *transport; /* NULL: auto */
} options;

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: [cddprun --nproc_per_node N] fashion_mnist [options]\n"
        "Trains an MLP, a CNN or a ResNet on Fashion-MNIST, data-parallel over the launcher's\n"
        "ranks, and prints test accuracy every epoch.\n\n"
        "  --epochs N          epochs to train (default 3)\n"
        "  --batch-size N      samples per step on each rank (default 64)\n"
        "  --lr X              learning rate (default 0.01)\n"
        "  --momentum X        SGD momentum (default 0.9)\n"
        "  --lr-schedule NAME  constant, or cosine: from --lr down to 0 over all the epochs'\n"
        "                      steps (default constant)\n"
        "  --optimizer NAME    sgd, adamw or lion (default sgd)\n"
        "  --model NAME        mlp (784-512-512-10), cnn (2 conv + pool + 2 fc) or resnet (a\n"
        "                      3x3 stem and three stages of basic blocks, 16, 32 and 64\n"
        "                      channels, BatchNorm, global average pooling) (default mlp)\n"
        "  --data DIR          folder with the IDX files (default $CDDP_DATA or Debian's\n"
        "                      /usr/share/datasets/fashion-mnist)\n"
        "  --seed N            seed for weights and shuffling (default 0)\n"
        "  --device NAME       where to train: cpu, emu (the emulated device), cuda; a kind\n"
        "                      without :N is the local rank's device of it (default cpu)\n"
        "  --dtype NAME        fp32, or bf16: mixed precision, the linear layers' and the\n"
        "                      convolutions' products in bf16 with float32 sums (AVX512-BF16\n"
        "                      or AMX, a GPU's tensor cores), the rest in float32 (default fp32)\n"
        "  --limit N           train on the first N samples only, reading the training\n"
        "                      files no further (default: all)\n"
        "  --log-every N       print the loss every N steps (default 100; 0: never)\n"
        "  --target-acc X      stop after the first epoch whose test accuracy reaches X\n"
        "  --save PATH         write a safetensors checkpoint after the last epoch\n"
        "  --out DIR           rank 0 writes checkpoint.safetensors (every epoch), metrics.csv\n"
        "                      and curves.svg here (default runs/fashion_mnist; 'none': no\n"
        "                      files); a restart of the job (cddprun --max_restarts) goes on\n"
        "                      from it\n"
        "  --tensorboard DIR   rank 0 also writes TensorBoard's event files to DIR: loss and\n"
        "                      lr every step, test_accuracy and samples_per_s every epoch\n"
        "  --init-from PATH    start from a model's weights (a checkpoint or a safetensors file\n"
        "                      with the model's names): a new optimizer, epoch 0\n"
        "  --save-every N      also write the checkpoint every N steps, mid-epoch (default 0:\n"
        "                      after each epoch only)\n"
        "  --keep K            write each checkpoint as a set, OUT/checkpoints/step-N, every\n"
        "                      rank its part at once, and keep the newest K sets (default 0:\n"
        "                      one file, OUT/checkpoint.safetensors)\n"
        "  --resume PATH       continue from a checkpoint written by --out or --save (a file,\n"
        "                      a set, or a folder of sets: its newest complete one), also\n"
        "                      mid-epoch and on another number of ranks (keep the global batch\n"
        "                      for the same steps: ranks x --batch-size)\n"
        "  --hook NAME         gradient compression: none, bf16, fp16 or powersgd (low-rank\n"
        "                      with error feedback, PyTorch's PowerSGD) (default none)\n"
        "  --powersgd-rank R   PowerSGD's rank: the columns each matrix travels as (default 1)\n"
        "  --powersgd-start S  the first step PowerSGD compresses, counted from 1 (default\n"
        "                      1001: 1000 plain steps first)\n"
        "  --bucket-cap-mb X   DDP bucket size in MiB (default 25)\n"
        "  --zero              shard the optimizer state across the ranks "
        "(ZeRO-1)\n"
        "  --sync-bn           the ResNet's BatchNorms take their statistics over every rank's\n"
        "                      batch (PyTorch's SyncBatchNorm): as one process on the whole\n"
        "                      batch\n" RUN_TRANSPORT_HELP
        "  --json              end with one JSON line of results\n"
        "  --sample-log PATH   each rank appends a line 'epoch step index' for every sample it\n"
        "                      trains on to PATH.<rank> (to check which samples a job saw)\n"
        "  -h, --help          show this help\n"
        "SIGTERM (cddprun's stop, a scheduler's) or Ctrl-C while training: every rank stops\n"
        "after the same step with a checkpoint in OUT and exits 128 + the signal; again: at "
        "once.\n");
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.epochs = 3,
                   .batch = 64,
                   .log_every = 100,
                   .lr = 0.01f,
                   .momentum = 0.9f,
                   .optimizer = "sgd",
                   .model = "mlp",
                   .out = "runs/fashion_mnist",
                   .hook = "none",
                   .schedule = "constant",
                   .device = "cpu",
                   .dtype = "fp32",
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
                                             {"out", required_argument, 0, 'O'},
                                             {"resume", required_argument, 0, 'R'},
                                             {"hook", required_argument, 0, 'H'},
                                             {"powersgd-rank", required_argument, 0, 'W'},
                                             {"powersgd_rank", required_argument, 0, 'W'},
                                             {"powersgd-start", required_argument, 0, 'V'},
                                             {"powersgd_start", required_argument, 0, 'V'},
                                             {"lr-schedule", required_argument, 0, 'C'},
                                             {"bucket-cap-mb", required_argument, 0, 'B'},
                                             {"json", no_argument, 0, 'j'},
                                             {"zero", no_argument, 0, 'z'},
                                             {"sync-bn", no_argument, 0, 'Y'},
                                             {"sync_bn", no_argument, 0, 'Y'},
                                             {"nccl", no_argument, 0, 'N'},
                                             {"ipc", no_argument, 0, 'Q'},
                                             {"transport", required_argument, 0, 'X'},
                                             {"save-every", required_argument, 0, 'E'},
                                             {"save_every", required_argument, 0, 'E'},
                                             {"keep", required_argument, 0, 'K'},
                                             {"init-from", required_argument, 0, 'I'},
                                             {"init_from", required_argument, 0, 'I'},
                                             {"sample-log", required_argument, 0, 'G'},
                                             {"device", required_argument, 0, 'D'},
                                             {"dtype", required_argument, 0, 'P'},
                                             {"tensorboard", required_argument, 0, 'T'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    int64_t i = 0;
    double x = 0;
    bool ok = true;
    const char *P = "fashion_mnist";
    while (ok && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'e':
            if ((ok = run_int(P, "--epochs", optarg, 1, 1000000, &i))) o->epochs = (int)i;
            break;
        case 'b':
            if ((ok = run_int(P, "--batch-size", optarg, 1, 1 << 20, &i))) o->batch = (int)i;
            break;
        case 'l':
            if ((ok = run_double(P, "--lr", optarg, 0, 10, true, &x))) o->lr = (float)x;
            break;
        case 'M':
            if ((ok = run_double(P, "--momentum", optarg, 0, 1, false, &x))) o->momentum = (float)x;
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
            if ((ok = run_int(P, "--seed", optarg, 0, INT64_MAX, &i))) o->seed = (uint64_t)i;
            break;
        case 'n':
            if ((ok = run_int(P, "--limit", optarg, 1, INT64_MAX, &i))) o->limit = i;
            break;
        case 'L':
            if ((ok = run_int(P, "--log-every", optarg, 0, INT32_MAX, &i))) o->log_every = (int)i;
            break;
        case 't':
            if ((ok = run_double(P, "--target-acc", optarg, 0, 1, false, &x)))
                o->target_acc = (float)x;
            break;
        case 'S':
            o->save = optarg;
            break;
        case 'O':
            o->out = optarg;
            break;
        case 'R':
            o->resume = optarg;
            break;
        case 'C':
            o->schedule = optarg;
            break;
        case 'H':
            o->hook = optarg;
            break;
        case 'W':
            ok = run_int(P, "--powersgd-rank", optarg, 1, 1 << 16, &o->powersgd_rank);
            break;
        case 'V':
            ok = run_int(P, "--powersgd-start", optarg, 1, INT64_MAX, &o->powersgd_start);
            break;
        case 'B':
            ok = run_double(P, "--bucket-cap-mb", optarg, 0, 4096, true, &o->bucket_cap_mb);
            break;
        case 'j':
            o->json = true;
            break;
        case 'z':
            o->zero = true;
            break;
        case 'Y':
            o->sync_bn = true;
            break;
        case 'N':
            o->transport = "nccl";
            break;
        case 'Q':
            o->transport = "ipc";
            break;
        case 'X':
            ok = run_transport(P, optarg, &o->transport);
            break;
        case 'I':
            o->init_from = optarg;
            break;
        case 'G':
            o->sample_log = optarg;
            break;
        case 'D':
            o->device = optarg;
            break;
        case 'P':
            o->dtype = optarg;
            break;
        case 'T':
            o->tensorboard = optarg;
            break;
        case 'E':
            if ((ok = run_int(P, "--save-every", optarg, 0, INT32_MAX, &i))) o->save_every = (int)i;
            break;
        case 'K':
            if ((ok = run_int(P, "--keep", optarg, 0, 1000000, &i))) o->keep = (int)i;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (!ok) return -1;
    if (optind < argc) {
        fprintf(stderr, "fashion_mnist: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->resume && o->init_from) {
        fprintf(stderr, "fashion_mnist: --resume continues a run (weights, optimizer, epoch, "
                        "data); --init-from starts a new one from weights: choose one\n");
        return -1;
    }
    if (strcmp(o->optimizer, "sgd") != 0 && strcmp(o->optimizer, "adamw") != 0 &&
        strcmp(o->optimizer, "lion") != 0) {
        fprintf(stderr, "fashion_mnist: --optimizer must be sgd, adamw or lion, not '%s'\n",
                o->optimizer);
        return -1;
    }
    if (strcmp(o->schedule, "constant") && strcmp(o->schedule, "cosine")) {
        fprintf(stderr, "fashion_mnist: --lr-schedule must be constant or cosine, not '%s'\n",
                o->schedule);
        return -1;
    }
    if ((o->powersgd_rank || o->powersgd_start) && strcmp(o->hook, "powersgd") != 0) {
        fprintf(stderr,
                "fashion_mnist: --powersgd-rank and --powersgd-start need --hook powersgd\n");
        return -1;
    }
    if (o->sync_bn && strcmp(o->model, "resnet") != 0) {
        fprintf(stderr, "fashion_mnist: --sync-bn: the %s has no BatchNorm (--model resnet has)\n",
                o->model);
        return -1;
    }
    if (run_hook(o->hook) < 0) {
        fprintf(stderr, "fashion_mnist: --hook must be none, bf16, fp16 or powersgd, not '%s'\n",
                o->hook);
        return -1;
    }
    if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0 &&
        strcmp(o->model, "resnet") != 0) {
        fprintf(stderr, "fashion_mnist: --model must be mlp, cnn or resnet, not '%s'\n", o->model);
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

/* A ResNet for 28x28 images: the stem at 16 channels, then one basic block per stage at 16
 * (28x28), 32 (14x14) and 64 channels (7x7), torchvision's names (conv1.weight,
 * layer2.0.downsample.0.weight, fc.bias, ...). */
static cddp_model *make_resnet(cddp_error *err) {
    cddp_resnet_config c = {.in_channels = 1, .classes = 10, .widths = {16, 32, 64}, .blocks = 1};
    return cddp_model_create_with(cddp_nn_resnet(&c), err);
}

/* The images of a batch as the model wants them: (B,1,28,28) for the CNN and the ResNet, (B,784)
 * for the MLP. */
static cddp_tensor *images(cddp_ctx *ctx, const cddp_batch *b, bool cnn) {
    cddp_tensor *x = cddp_batch_tensor(ctx, b, 0);
    return cnn ? x : cddp_flatten(ctx, x);
}

/* Test accuracy over the whole split, in evaluation mode, 250 images at a time (the CNN's
 * im2col columns for a batch of B take B * 0.6 MB of arena): each rank counts its shard, and an
 * allreduce sums the counts. */
static int evaluate(cddp_model *m, cddp_ctx *ctx, cddp_loader *test, bool cnn, cddp_comm *group,
                    double *acc, cddp_error *err) {
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
    if (rc < 0) return rc;
    int64_t counts[2] = {correct, seen};
    if (cddp_comm_allreduce(group, counts, counts, 2, CDDP_COMM_I64, CDDP_COMM_SUM, -1, err))
        return -1;
    *acc = counts[1] ? (double)counts[0] / (double)counts[1] : 0.0;
    return 0;
}

/* A progress bar on a terminal, a line every log_every steps otherwise. */
static void progress(const options *o, bool tty, int epoch, int64_t step, int64_t steps,
                     double loss) {
    if (tty) {
        int filled = steps ? (int)(30 * (step + 1) / steps) : 30;
        if (step % 10 && step + 1 != steps) return;
        printf("\repoch %d [%.*s%*s] %3d%% loss %.4f", epoch, filled,
               "##############################", 30 - filled, "",
               steps ? (int)(100 * (step + 1) / steps) : 100, loss);
        if (step + 1 == steps) printf("\n");
        fflush(stdout);
    } else if (o->log_every && step % o->log_every == 0) {
        printf("epoch: %d, step: %lld, loss is %.6f\n", epoch, (long long)step, loss);
    }
}

/* The checkpoint: model, optimizer, every rank's random state, the epochs done and the data's
 * position in the current epoch (the ranks' together, so any number of ranks resumes it). */
static int save_checkpoint(cddp_ddp *ddp, cddp_comm *group, cddp_ctx *ctx, cddp_optim *opt,
                           const char *path, const options *o, int epochs_done, int64_t step,
                           cddp_sampler_state st, cddp_error *err) {
    char ep[24], de[24], pos[24];
    snprintf(ep, sizeof ep, "%d", epochs_done);
    snprintf(de, sizeof de, "%lld", (long long)st.epoch);
    snprintf(pos, sizeof pos, "%lld", (long long)st.position);
    const char *meta[2 * RUN_MAX_RNG + 12] = {"epoch",      ep, "model",         o->model,
                                              "data_epoch", de, "data_position", pos};
    int nm = 8;
    if (*run_job_id()) meta[nm++] = "run_id", meta[nm++] = run_job_id();
    run_rng_meta rngs; /* every rank's random state travels to rank 0 */
    if (run_rng_gather(group, cddp_ctx_rng(ctx), &rngs, meta, &nm, err)) return -1;
    meta[nm] = NULL;
    if (o->keep > 0) return cddp_ddp_save_set(ddp, path, step, o->keep, opt, meta, err);
    return cddp_ddp_save(ddp, path, opt, meta, err);
}

int main(int argc, char **argv) {
    run_stop_watch("fashion_mnist"); /* before any thread: SIGTERM, SIGINT to one of their own */
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    int status = 1;
    cddp_error err = {0};
    cddp_device *dev;
    cddp_dtype compute;
    if (!run_device("fashion_mnist", o.device, o.dtype, &dev, &compute)) return 2;
    cddp_comm *group = NULL;
    cddp_ddp *ddp = NULL;
    cddp_dataset *train = NULL, *test = NULL;
    cddp_sampler *sampler = NULL;
    cddp_loader *train_loader = NULL, *test_loader = NULL;
    cddp_model *m = NULL;
    cddp_optim *opt = NULL;
    cddp_ctx *ctx = NULL;
    FILE *csv = NULL, *sample_log = NULL;
    char title[160] = "";
    curves curve = {.title = title, .eval_label = "test accuracy", .eval_is_fraction = true};
    bool cnn = strcmp(o.model, "mlp") != 0, resnet = strcmp(o.model, "resnet") == 0;
    bool cosine = strcmp(o.schedule, "cosine") == 0;
    bool files = strcmp(o.out, "none") != 0 && *o.out;

    /* The group: one process on its own, or the ranks cddprun (or mpirun) started. */
    if (!(group = cddp_comm_create(NULL, &err))) goto fail;
    int rank = cddp_comm_rank(group), world = cddp_comm_size(group);
    if (rank == 0 && o.save && run_check_writable("--save", o.save, &err) != CDDP_OK) goto fail;
    char restart_at[4096]; /* a restart of the job goes on from the job's last save */
    if (files && run_restart_from(group, "fashion_mnist", o.out, restart_at, sizeof restart_at,
                                  &o.resume, &o.init_from, &err) != CDDP_OK)
        goto fail;
    bool tty = rank == 0 && isatty(STDOUT_FILENO);
    snprintf(title, sizeof title, "fashion_mnist: %s, %s, %d rank%s x batch %d (loss: rank 0's)",
             o.model, o.optimizer, world, world > 1 ? "s" : "", o.batch);
    if (o.sample_log) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s.%d", o.sample_log, rank) >= (int)sizeof path) {
            cddp_error_set(&err, CDDP_EINVAL, "--sample-log %s: the path is too long",
                           o.sample_log);
            goto fail;
        }
        if (!(sample_log = fopen(path, "a"))) {
            cddp_error_set(&err, CDDP_EIO, "cannot open --sample-log %s: %s", path,
                           strerror(errno));
            goto fail;
        }
    }

    train = cddp_dataset_mnist_first(o.data, true, o.limit, &err); /* --limit: its first N */
    test = train ? cddp_dataset_mnist(o.data, false, &err) : NULL;
    if (!test) goto fail;
    if (cddp_field_bytes(cddp_dataset_field(train, 0)) != 784 * sizeof(float)) {
        cddp_error_set(&err, CDDP_EFORMAT, "expected 28x28 images");
        goto fail;
    }
    /* Each rank trains on its part of every epoch and evaluates its shard of the test set. */
    cddp_sampler_options so = cddp_sampler_defaults();
    so.seed = o.seed;
    so.rank = rank; /* the group's place, whichever launcher started us */
    so.num_replicas = world;
    sampler = cddp_sampler_create(cddp_dataset_len(train), &so, &err);
    if (!sampler) goto fail;
    if (world > 1) {
        cddp_dataset *shard = cddp_dataset_shard(test, world, rank, &err);
        if (!shard) goto fail;
        test = shard;
    }
    cddp_loader_options lo = loader_options(o.batch);
    lo.device = dev; /* batches copied to the device ahead of the step that needs them */
    train_loader = cddp_loader_create(train, sampler, &lo, &err);
    lo = loader_options(250);
    lo.device = dev;
    test_loader = train_loader ? cddp_loader_create(test, NULL, &lo, &err) : NULL;
    if (!test_loader) goto fail;

    m = resnet ? make_resnet(&err) : cddp_model_create();
    ctx = cddp_ctx_create(
        &(cddp_ctx_options){.seed = o.seed + (uint64_t)rank, .device = dev, .compute = compute});
    if (!m || !ctx) {
        if (!err.msg[0]) cddp_error_set(&err, CDDP_ENOMEM, "out of memory");
        goto fail;
    }
    if ((resnet ? 0 : cnn ? build_cnn(m) : build_mlp(m)) || cddp_model_build(m, o.seed)) {
        cddp_error_set(&err, CDDP_EINVAL, "%s", cddp_model_error(m));
        goto fail;
    }
    if (cddp_model_to(m, dev, &err) != CDDP_OK) goto fail;
    if (o.sync_bn) {
        int nbn = cddp_model_sync_batch_norm(m, group);
        if (rank == 0)
            printf("sync BatchNorm: %d BatchNorms take their statistics over the %d ranks' "
                   "batches\n",
                   nbn, world);
    }
    /* The one call that makes it data-parallel. */
    cddp_ddp_options dopt = {.bucket_cap_mb = o.bucket_cap_mb,
                             .shard_optimizer = o.zero,
                             .transport = o.transport,
                             .powersgd_rank = (int)o.powersgd_rank,
                             .powersgd_start_step = o.powersgd_start,
                             .hook = (cddp_ddp_hook)run_hook(o.hook)};
    if (!(ddp = cddp_ddp_wrap(m, group, &dopt, &err))) goto fail;
    /* After the wrap, so that under --zero the state is the shard's from the start. */
    if (strcmp(o.optimizer, "sgd") == 0)
        opt = cddp_optim_sgd(m, &(cddp_sgd_options){.lr = o.lr, .momentum = o.momentum}, &err);
    else if (strcmp(o.optimizer, "lion") == 0) {
        cddp_lion_options lion = cddp_lion_defaults(o.lr);
        opt = cddp_optim_lion(m, &lion, &err);
    } else {
        cddp_adamw_options aw = cddp_adamw_defaults(o.lr);
        opt = cddp_optim_adamw(m, &aw, &err);
    }
    if (!opt) goto fail;

    if (o.init_from) {
        if (cddp_ddp_load(ddp, o.init_from, NULL, NULL, &err) != CDDP_OK) goto fail;
        cddp_ddp_print0(ddp, "initialised from %s (weights only: a new optimizer, epoch 0)\n",
                        o.init_from);
    }
    int first_epoch = 0;
    cddp_sampler_state mid = {0}; /* a checkpoint from the middle of an epoch */
    char resume_at[4096];         /* a folder of sets: its newest complete one */
    if (o.resume) {
        /* from a folder of sets, a set that fails its checks gives way to the one before it:
         * resume_at says which was loaded */
        cddp_safetensors *f = NULL;
        if (cddp_ddp_load_from(ddp, o.resume, opt, &f, resume_at, sizeof resume_at, &err) !=
            CDDP_OK)
            goto fail;
        o.resume = resume_at;
        int64_t ep = 0, de = -1, pos = 0;
        int rc = run_meta_int(f, o.resume, "epoch", 0, 1000000, 0, &ep, &err);
        if (!rc) rc = run_meta_int(f, o.resume, "data_epoch", 0, 1000000, -1, &de, &err);
        if (!rc) rc = run_meta_int(f, o.resume, "data_position", 0, INT64_MAX, 0, &pos, &err);
        if (rc) {
            cddp_safetensors_destroy(f);
            goto fail;
        }
        first_epoch = (int)ep;
        if (de >= 0 && pos > 0) { /* mid-epoch: the same epoch goes on */
            mid = (cddp_sampler_state){.epoch = de, .position = pos};
            first_epoch = (int)mid.epoch;
            rc = cddp_sampler_set_state(sampler, mid, &err);
        }
        if (!rc) rc = run_rng_restore(f, o.resume, rank, cddp_ctx_rng(ctx), &err);
        cddp_safetensors_destroy(f);
        if (rc != CDDP_OK) goto fail;
        if (mid.position > 0)
            cddp_ddp_print0(ddp, "resumed from %s in epoch %d, after %lld of its samples\n",
                            o.resume, first_epoch, (long long)mid.position);
        else
            cddp_ddp_print0(ddp, "resumed from %s after epoch %d\n", o.resume, first_epoch);
    }
    if (rank == 0 && o.tensorboard && !curves_tensorboard(&curve, o.tensorboard, &err)) goto fail;
    /* Steps are numbered epoch * steps + the step in the epoch; a mid-epoch checkpoint had taken
     * the first epoch's first `done` steps, and the numbers go on from there. */
    int64_t steps = (cddp_sampler_len(sampler) + o.batch - 1) / o.batch;
    int64_t done = mid.position / ((int64_t)o.batch * world);
    /* A checkpoint from an epoch's last step (--save_every, or a stop there) whose epoch-end save
     * a kill prevented: the epoch's training is whole, its evaluation and checkpoint are not. */
    bool trained_whole = mid.position > 0 && mid.position >= cddp_sampler_len(sampler) * world;
    if (trained_whole) done = steps;
    if (o.resume && first_epoch >= o.epochs)
        cddp_ddp_print0(ddp,
                        "nothing to train: %s is from the end of epoch %d, and --epochs is %d "
                        "(training was complete; a larger --epochs goes on)\n",
                        o.resume, first_epoch - 1, o.epochs);
    char ckpt[4096] = "", csv_path[4096] = "", svg_path[4096] = "";
    if (files) {
        if (rank == 0 && run_make_dirs(o.out, &err) != CDDP_OK) goto fail;
        snprintf(ckpt, sizeof ckpt, "%s/%s", o.out,
                 o.keep ? "checkpoints" : "checkpoint.safetensors");
        snprintf(csv_path, sizeof csv_path, "%s/metrics.csv", o.out);
        snprintf(svg_path, sizeof svg_path, "%s/curves.svg", o.out);
        if (rank == 0 && o.resume) { /* the curves so far, up to the checkpoint's epoch */
            curves_load(&curve, o.out);
            while (curve.nloss && curve.loss[curve.nloss - 1].step >= first_epoch * steps + done)
                curve.nloss--; /* the steps from the checkpoint's on */
            while (curve.neval && curve.eval[curve.neval - 1].epoch >= first_epoch) curve.neval--;
        }
        if (rank == 0 && !(csv = fopen(csv_path, o.resume ? "a" : "w"))) {
            cddp_error_set(&err, CDDP_EIO, "cannot write %s: %s", csv_path, strerror(errno));
            goto fail;
        }
        if (csv && !o.resume) fprintf(csv, "epoch,loss,test_acc,samples_per_s,world\n");
    }

    double train_s = 0.0, acc = 0.0, last_loss = NAN;
    int64_t samples = 0, since_save = 0;
    int epochs_run = 0, epochs_trained = 0;
    /* SIGTERM, Ctrl-C: a checkpoint after the step, then the end */
    cddp_stop_catch(rank == 0 ? RUN_STOP_SAY : NULL);
    for (int epoch = first_epoch; epoch < o.epochs; epoch++) {
        if (!(epoch == first_epoch && mid.position > 0)) cddp_sampler_set_epoch(sampler, epoch);
        double t0 = cddp_now_s();
        int64_t epoch_samples = 0;
        cddp_batch b;
        int rc = 0;
        bool train_epoch = !(epoch == first_epoch && trained_whole);
        epochs_trained += train_epoch;
        if (!train_epoch) {
            cddp_ddp_print0(ddp,
                            "epoch %d was trained whole before the checkpoint: its "
                            "evaluation and end-of-epoch checkpoint follow\n",
                            epoch);
            if (curve.nloss) last_loss = curve.loss[curve.nloss - 1].value; /* its last step's */
        }
        if (train_epoch) cddp_loader_begin(train_loader);
        while (train_epoch && (rc = cddp_loader_next(train_loader, &b, &err)) == 1) {
            int64_t step = (epoch == first_epoch ? done : 0) + b.index; /* in the epoch */
            cddp_ctx_reset(ctx);
            cddp_tensor *loss =
                cddp_cross_entropy(ctx, cddp_model_forward(m, ctx, images(ctx, &b, cnn)),
                                   cddp_batch_tensor(ctx, &b, 1), CDDP_REDUCE_MEAN);
            cddp_model_zero_grad(m);
            if (cddp_backward(ctx, loss) != CDDP_OK) {
                cddp_error_set(&err, cddp_ctx_status(ctx), "%s", cddp_ctx_error(ctx));
                goto fail;
            }
            if (cosine)
                cddp_optim_set_lr(opt, cddp_lr_warmup_cosine(epoch * steps + step, o.lr, 0.0f, 0,
                                                             o.epochs * steps));
            cddp_optim_step(opt);
            last_loss = cddp_get(loss, 0);
            if (!isfinite(last_loss)) {
                cddp_error_set(&err, CDDP_ERANGE,
                               "the loss became %g in epoch %d, step %" PRId64
                               ": training diverged (a smaller --lr, now %g?)",
                               last_loss, epoch, step, (double)o.lr);
                goto fail;
            }
            epoch_samples += b.size;
            if (sample_log) { /* flushed every step: a killed job's log ends at its last step */
                for (int64_t k = 0; k < b.size; k++)
                    fprintf(sample_log, "%d %" PRId64 " %" PRId64 "\n", epoch, step, b.indices[k]);
                fflush(sample_log);
            }
            bool saved = files && o.save_every > 0 && ++since_save % o.save_every == 0;
            int sig = 0;
            if (cddp_stop_agreed(group, &sig, &err) != CDDP_OK) goto fail;
            if ((saved || (sig && files)) &&
                save_checkpoint(ddp, group, ctx, opt, ckpt, &o, epoch, epoch * steps + step + 1,
                                cddp_sampler_get_state(sampler), &err) != CDDP_OK)
                goto fail;
            if (sig) {
                if (files && rank == 0) { /* the losses up to here */
                    curves_add_loss(&curve, epoch * steps + step, epoch, last_loss);
                    if (!curves_save(&curve, o.out))
                        fprintf(stderr, "fashion_mnist: cannot write the curves in %s: %s\n", o.out,
                                strerror(errno));
                }
                char after[64];
                snprintf(after, sizeof after, "step %" PRId64 " of epoch %d", step, epoch);
                status = run_stopped(ddp, sig, after, files ? ckpt : NULL);
                goto done;
            }
            if (rank == 0) {
                progress(&o, tty, epoch, step, steps, last_loss);
                if (files) curves_add_loss(&curve, epoch * steps + step, epoch, last_loss);
                curves_scalar(&curve, "loss", epoch * steps + step, last_loss);
                curves_scalar(&curve, "lr", epoch * steps + step, (double)cddp_optim_lr(opt));
                curves_ddp(&curve, ddp, epoch * steps + step);
            }
        }
        if (train_epoch && rc < 0) goto fail;
        double epoch_s = cddp_now_s() - t0;
        train_s += epoch_s;
        samples += epoch_samples;
        epochs_run++;
        if (evaluate(m, ctx, test_loader, cnn, group, &acc, &err) < 0) goto fail;
        cddp_ddp_print0(ddp, "epoch: %d, test accuracy: %.4f\n", epoch, acc);
        if (rank == 0) {
            curves_scalar(&curve, "test_accuracy", (epoch + 1) * steps - 1, acc);
            if (train_epoch) /* the time of an epoch trained before the checkpoint is not known */
                curves_scalar(&curve, "samples_per_s", (epoch + 1) * steps - 1,
                              epoch_s > 0 ? (double)epoch_samples * world / epoch_s : 0.0);
        }
        if (files) { /* the checkpoint, then the metrics that point to it */
            if (save_checkpoint(ddp, group, ctx, opt, ckpt, &o, epoch + 1, (epoch + 1) * steps,
                                (cddp_sampler_state){.epoch = epoch + 1}, &err) != CDDP_OK)
                goto fail;
            double sps = !train_epoch  ? NAN
                         : epoch_s > 0 ? (double)epoch_samples * world / epoch_s
                                       : 0;
            if (csv) {
                fprintf(csv, "%d,%.6f,%.4f,%.1f,%d\n", epoch, last_loss, acc, sps, world);
                fflush(csv);
            }
            if (rank == 0) {
                curves_add_eval(&curve, (epoch + 1) * steps - 1, epoch, acc);
                if (!curves_save(&curve, o.out))
                    fprintf(stderr, "fashion_mnist: cannot write the curves in %s: %s\n", o.out,
                            strerror(errno));
            }
        }
        fflush(stdout);
        if (o.target_acc > 0 && acc >= o.target_acc) break;
    }
    cddp_stop_release();
    if (o.save) {
        char ep[16];
        snprintf(ep, sizeof ep, "%d", first_epoch + epochs_run);
        const char *meta[] = {"epoch", ep, "model", o.model, NULL};
        if (cddp_ddp_save(ddp, o.save, opt, meta, &err) != CDDP_OK) goto fail;
        cddp_ddp_print0(ddp, "saved %s\n", o.save);
    }
    if (files)
        cddp_ddp_print0(ddp, "checkpoint: %s\nmetrics: %s\ncurves: %s\n", ckpt, csv_path, svg_path);
    int64_t total = samples;
    if (cddp_comm_allreduce(group, &total, &total, 1, CDDP_COMM_I64, CDDP_COMM_SUM, -1, &err))
        goto fail;
    if (epochs_trained > 0 && total == 0) {
        cddp_error_set(&err, CDDP_EINVAL, "trained on no samples in %d epoch%s: is %s empty?",
                       epochs_trained, epochs_trained > 1 ? "s" : "", o.data ? o.data : "the data");
        goto fail;
    }
    if (o.json && rank == 0) {
        cddp_ddp_stats st = cddp_ddp_stats_get(ddp);
        printf("{\"model\": \"%s\", \"dtype\": \"%s\", \"optimizer\": \"%s\", \"epochs\": %d, "
               "\"batch_per_rank\": %d, "
               "\"world\": %d, \"hook\": \"%s\", \"zero\": %s, \"optim_state_bytes\": %lld, "
               "\"peak_rss_bytes\": %lld, \"train_samples\": %lld, \"train_s\": %.3f, "
               "\"samples_per_s\": %.1f, \"final_loss\": %.6f, \"test_acc\": %.4f, "
               "\"last_step\": {\"forward_ms\": %.3f, \"backward_ms\": %.3f, \"allreduce_ms\": "
               "%.3f, \"wait_ms\": %.3f, \"overlap\": %.3f}}\n",
               o.model, cddp_dtype_name(compute), o.optimizer, epochs_run, o.batch, world, o.hook,
               o.zero ? "true" : "false", run_optim_state_bytes(opt), run_peak_rss_bytes(),
               (long long)total, train_s, train_s > 0 ? (double)total / train_s : 0.0, last_loss,
               acc, st.forward_s * 1e3, st.backward_s * 1e3, st.comm_s * 1e3, st.wait_s * 1e3,
               st.overlap);
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "fashion_mnist: %s\n", cddp_error_msg(&err));
done:
    if (csv) fclose(csv);
    if (sample_log) fclose(sample_log);
    curves_free(&curve);
    cddp_ddp_destroy(ddp);
    cddp_optim_destroy(opt);
    cddp_model_destroy(m);
    cddp_ctx_destroy(ctx);
    cddp_loader_destroy(train_loader);
    cddp_loader_destroy(test_loader);
    cddp_sampler_destroy(sampler);
    cddp_dataset_destroy(train);
    cddp_dataset_destroy(test);
    cddp_comm_destroy(group);
    return status;
}
