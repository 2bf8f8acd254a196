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
    bool json, sync_bn;
    int zero; /* the ZeRO stage */
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
        "  --bucket-cap-mb X   DDP bucket size in MiB (default 25)\n" RUN_ZERO_HELP
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

static int check_args(const options *o);

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
    int64_t seed = 0;
    const run_opt opts[] = {
        RUN_NUM("epochs", NULL, 'n', &o->epochs, 1, 1000000, false),
        RUN_NUM("batch-size", "batch_size", 'n', &o->batch, 1, 1 << 20, false),
        RUN_NUM("lr", NULL, 'g', &o->lr, 0, 10, true),
        RUN_NUM("momentum", NULL, 'g', &o->momentum, 0, 1, false),
        RUN_STR("optimizer", NULL, &o->optimizer),
        RUN_STR("model", NULL, &o->model),
        RUN_STR("data", NULL, &o->data),
        RUN_NUM("seed", NULL, 'i', &seed, 0, (double)INT64_MAX, false),
        RUN_NUM("limit", NULL, 'i', &o->limit, 1, (double)INT64_MAX, false),
        RUN_NUM("log-every", "log_every", 'n', &o->log_every, 0, INT32_MAX, false),
        RUN_NUM("target-acc", "target_acc", 'g', &o->target_acc, 0, 1, false),
        RUN_STR("save", NULL, &o->save),
        RUN_STR("out", NULL, &o->out),
        RUN_STR("resume", NULL, &o->resume),
        RUN_STR("hook", NULL, &o->hook),
        RUN_NUM("powersgd-rank", "powersgd_rank", 'i', &o->powersgd_rank, 1, 1 << 16, false),
        RUN_NUM("powersgd-start", "powersgd_start", 'i', &o->powersgd_start, 1, (double)INT64_MAX,
                false),
        RUN_STR("lr-schedule", "lr_schedule", &o->schedule),
        RUN_NUM("bucket-cap-mb", "bucket_cap_mb", 'f', &o->bucket_cap_mb, 0, 4096, true),
        RUN_SWITCH("json", NULL, &o->json),
        RUN_SWITCH("sync-bn", "sync_bn", &o->sync_bn),
        RUN_NUM("save-every", "save_every", 'n', &o->save_every, 0, INT32_MAX, false),
        RUN_NUM("keep", NULL, 'n', &o->keep, 0, 1000000, false),
        RUN_STR("init-from", "init_from", &o->init_from),
        RUN_STR("sample-log", "sample_log", &o->sample_log),
        RUN_STR("device", NULL, &o->device),
        RUN_STR("dtype", NULL, &o->dtype),
        RUN_STR("tensorboard", NULL, &o->tensorboard),
        RUN_ZERO_AND_TRANSPORT(&o->zero, &o->transport),
    };
    if (run_parse("fashion_mnist", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), NULL,
                  NULL, usage) != 0)
        return -1;
    o->seed = (uint64_t)seed;
    return check_args(o);
}

/* The options against each other. */
static int check_args(const options *o) {
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

/* ---- the job ----------------------------------------------------------------------------- */

/* What a run holds, from the options to the loop's counts. */
typedef struct job {
    options o;
    int stopped; /* the status a stop asked for (train), else -1 */
    cddp_device *dev;
    cddp_dtype compute;
    cddp_comm *group;
    int rank, world;
    cddp_ddp *ddp;
    cddp_dataset *train, *test;
    cddp_sampler *sampler;
    cddp_loader *train_loader, *test_loader;
    cddp_model *m;
    cddp_optim *opt;
    cddp_ctx *ctx;
    FILE *csv, *sample_log;
    /* restart_at: a restart's checkpoint, which o.resume may point to */
    char title[160], ckpt[4096], csv_path[4096], svg_path[4096], resume_at[4096], restart_at[4096];
    curves curve;
    bool cnn, resnet, cosine, files, tty;
    /* where training starts: the epoch, a checkpoint's place in it (mid-epoch), the steps of an
     * epoch and how many of the first one were done */
    int first_epoch;
    cddp_sampler_state mid;
    int64_t steps, done;
    bool trained_whole;
    /* the loop */
    double train_s, acc, last_loss;
    int64_t samples, since_save;
    int epochs_run, epochs_trained;
} job;

/* The run's files before training: --save writable, a restart's checkpoint, --sample-log. */
static int open_files(job *j, cddp_error *err) {
    options *o = &j->o;
    if (j->rank == 0 && o->save) CDDP_TRY(run_check_writable("--save", o->save, err));
    if (j->files) /* a restart of the job goes on from the job's last save */
        CDDP_TRY(run_restart_from(j->group, "fashion_mnist", o->out, j->restart_at,
                                  sizeof j->restart_at, &o->resume, &o->init_from, err));
    j->tty = j->rank == 0 && isatty(STDOUT_FILENO);
    snprintf(j->title, sizeof j->title,
             "fashion_mnist: %s, %s, %d rank%s x batch %d (loss: rank 0's)", o->model, o->optimizer,
             j->world, j->world > 1 ? "s" : "", o->batch);
    if (!o->sample_log) return CDDP_OK;
    char path[4096];
    if (snprintf(path, sizeof path, "%s.%d", o->sample_log, j->rank) >= (int)sizeof path)
        return cddp_error_set(err, CDDP_EINVAL, "--sample-log %s: the path is too long",
                              o->sample_log);
    if (!(j->sample_log = fopen(path, "a")))
        return cddp_error_set(err, CDDP_EIO, "cannot open --sample-log %s: %s", path,
                              strerror(errno));
    return CDDP_OK;
}

/* The datasets: each rank trains on its part of every epoch (the sampler) and evaluates its
 * shard of the test set; the loaders copy batches to the device ahead of the step that needs
 * them. */
static int open_data(job *j, cddp_error *err) {
    const options *o = &j->o;
    j->train = cddp_dataset_mnist_first(o->data, true, o->limit, err); /* --limit: its first N */
    j->test = j->train ? cddp_dataset_mnist(o->data, false, err) : NULL;
    if (!j->test) return err->code;
    if (cddp_field_bytes(cddp_dataset_field(j->train, 0)) != 784 * sizeof(float))
        return cddp_error_set(err, CDDP_EFORMAT, "expected 28x28 images");
    cddp_sampler_options so = cddp_sampler_defaults();
    so.seed = o->seed;
    so.rank = j->rank; /* the group's place, whichever launcher started us */
    so.num_replicas = j->world;
    if (!(j->sampler = cddp_sampler_create(cddp_dataset_len(j->train), &so, err))) return err->code;
    if (j->world > 1) {
        cddp_dataset *shard = cddp_dataset_shard(j->test, j->world, j->rank, err);
        if (!shard) return err->code;
        j->test = shard;
    }
    cddp_loader_options lo = loader_options(o->batch);
    lo.device = j->dev;
    j->train_loader = cddp_loader_create(j->train, j->sampler, &lo, err);
    lo = loader_options(250);
    lo.device = j->dev;
    j->test_loader = j->train_loader ? cddp_loader_create(j->test, NULL, &lo, err) : NULL;
    return j->test_loader ? CDDP_OK : err->code;
}

/* The model on its device, its context, the one call that makes it data-parallel, and its
 * optimizer (after the wrap, so that under --zero the state is the shard's from the start). */
static int open_model(job *j, cddp_error *err) {
    const options *o = &j->o;
    j->m = j->resnet ? make_resnet(err) : cddp_model_create();
    j->ctx = cddp_ctx_create(&(cddp_ctx_options){
        .seed = o->seed + (uint64_t)j->rank, .device = j->dev, .compute = j->compute});
    if (!j->m || !j->ctx)
        return err->msg[0] ? err->code : cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    if ((j->resnet ? 0
         : j->cnn  ? build_cnn(j->m)
                   : build_mlp(j->m)) ||
        cddp_model_build(j->m, o->seed))
        return cddp_error_set(err, CDDP_EINVAL, "%s", cddp_model_error(j->m));
    CDDP_TRY(cddp_model_to(j->m, j->dev, err));
    if (o->sync_bn) {
        int nbn = cddp_model_sync_batch_norm(j->m, j->group);
        if (j->rank == 0)
            printf("sync BatchNorm: %d BatchNorms take their statistics over the %d ranks' "
                   "batches\n",
                   nbn, j->world);
    }
    cddp_ddp_options dopt = {.bucket_cap_mb = o->bucket_cap_mb,
                             .transport = o->transport,
                             .powersgd_rank = (int)o->powersgd_rank,
                             .powersgd_start_step = o->powersgd_start,
                             .hook = (cddp_ddp_hook)run_hook(o->hook)};
    run_zero_options(o->zero, &dopt);
    if (!(j->ddp = cddp_ddp_wrap(j->m, j->group, &dopt, err))) return err->code;
    if (strcmp(o->optimizer, "sgd") == 0) {
        j->opt =
            cddp_optim_sgd(j->m, &(cddp_sgd_options){.lr = o->lr, .momentum = o->momentum}, err);
    } else if (strcmp(o->optimizer, "lion") == 0) {
        cddp_lion_options lion = cddp_lion_defaults(o->lr);
        j->opt = cddp_optim_lion(j->m, &lion, err);
    } else {
        cddp_adamw_options aw = cddp_adamw_defaults(o->lr);
        j->opt = cddp_optim_adamw(j->m, &aw, err);
    }
    return j->opt ? CDDP_OK : err->code;
}

/* --resume: the model, the optimizer, the epoch, the place in it (a checkpoint from the middle
 * of an epoch goes on there) and each rank's random numbers. From a folder of sets, a set that
 * fails its checks gives way to the one before it: resume_at says which was loaded. */
static int resume(job *j, cddp_error *err) {
    options *o = &j->o;
    cddp_safetensors *f = NULL;
    CDDP_TRY(
        cddp_ddp_load_from(j->ddp, o->resume, j->opt, &f, j->resume_at, sizeof j->resume_at, err));
    o->resume = j->resume_at;
    int64_t ep = 0, de = -1, pos = 0;
    int rc = run_meta_int(f, o->resume, "epoch", 0, 1000000, 0, &ep, err);
    if (!rc) rc = run_meta_int(f, o->resume, "data_epoch", 0, 1000000, -1, &de, err);
    if (!rc) rc = run_meta_int(f, o->resume, "data_position", 0, INT64_MAX, 0, &pos, err);
    if (!rc) {
        j->first_epoch = (int)ep;
        if (de >= 0 && pos > 0) { /* mid-epoch: the same epoch goes on */
            j->mid = (cddp_sampler_state){.epoch = de, .position = pos};
            j->first_epoch = (int)j->mid.epoch;
            rc = cddp_sampler_set_state(j->sampler, j->mid, err);
        }
    }
    if (!rc) rc = run_rng_restore(f, o->resume, j->rank, cddp_ctx_rng(j->ctx), err);
    cddp_safetensors_destroy(f);
    CDDP_TRY(rc);
    if (j->mid.position > 0)
        cddp_ddp_print0(j->ddp, "resumed from %s in epoch %d, after %lld of its samples\n",
                        o->resume, j->first_epoch, (long long)j->mid.position);
    else
        cddp_ddp_print0(j->ddp, "resumed from %s after epoch %d\n", o->resume, j->first_epoch);
    return CDDP_OK;
}

/* Where training starts: --init_from's weights, --resume's state, TensorBoard; the steps'
 * numbering; the output folder, the curves so far and the metrics file. */
static int start(job *j, cddp_error *err) {
    const options *o = &j->o;
    if (o->init_from) {
        CDDP_TRY(cddp_ddp_load(j->ddp, o->init_from, NULL, NULL, err));
        cddp_ddp_print0(j->ddp, "initialised from %s (weights only: a new optimizer, epoch 0)\n",
                        o->init_from);
    }
    if (o->resume) CDDP_TRY(resume(j, err));
    if (j->rank == 0 && o->tensorboard && !curves_tensorboard(&j->curve, o->tensorboard, err))
        return err->code;
    /* Steps are numbered epoch * steps + the step in the epoch; a mid-epoch checkpoint had taken
     * the first epoch's first `done` steps, and the numbers go on from there. */
    j->steps = (cddp_sampler_len(j->sampler) + o->batch - 1) / o->batch;
    j->done = j->mid.position / ((int64_t)o->batch * j->world);
    /* A checkpoint from an epoch's last step (--save_every, or a stop there) whose epoch-end save
     * a kill prevented: the epoch's training is whole, its evaluation and checkpoint are not. */
    j->trained_whole =
        j->mid.position > 0 && j->mid.position >= cddp_sampler_len(j->sampler) * j->world;
    if (j->trained_whole) j->done = j->steps;
    if (o->resume && j->first_epoch >= o->epochs)
        cddp_ddp_print0(j->ddp,
                        "nothing to train: %s is from the end of epoch %d, and --epochs is %d "
                        "(training was complete; a larger --epochs goes on)\n",
                        o->resume, j->first_epoch - 1, o->epochs);
    if (!j->files) return CDDP_OK;
    if (j->rank == 0) CDDP_TRY(run_make_dirs(o->out, err));
    snprintf(j->ckpt, sizeof j->ckpt, "%s/%s", o->out,
             o->keep ? "checkpoints" : "checkpoint.safetensors");
    snprintf(j->csv_path, sizeof j->csv_path, "%s/metrics.csv", o->out);
    snprintf(j->svg_path, sizeof j->svg_path, "%s/curves.svg", o->out);
    if (j->rank == 0 && o->resume) { /* the curves so far, up to the checkpoint's epoch */
        curves *c = &j->curve;
        curves_load(c, o->out);
        while (c->nloss && c->loss[c->nloss - 1].step >= j->first_epoch * j->steps + j->done)
            c->nloss--; /* the steps from the checkpoint's on */
        while (c->neval && c->eval[c->neval - 1].epoch >= j->first_epoch) c->neval--;
    }
    if (j->rank == 0 && !(j->csv = fopen(j->csv_path, o->resume ? "a" : "w")))
        return cddp_error_set(err, CDDP_EIO, "cannot write %s: %s", j->csv_path, strerror(errno));
    if (j->csv && !o->resume) fprintf(j->csv, "epoch,loss,test_acc,samples_per_s,world\n");
    return CDDP_OK;
}

/* One step of the epoch on batch b: forward, backward, the schedule, the optimizer; the loss
 * checked, the samples logged, a checkpoint where --save_every or a stop asks. A stop the ranks
 * agree on sets *stopped to the program's status. */
static int train_step(job *j, int epoch, const cddp_batch *b, int *stopped, cddp_error *err) {
    const options *o = &j->o;
    int64_t step = (epoch == j->first_epoch ? j->done : 0) + b->index; /* in the epoch */
    int64_t at = epoch * j->steps + step;
    cddp_ctx_reset(j->ctx);
    cddp_tensor *loss =
        cddp_cross_entropy(j->ctx, cddp_model_forward(j->m, j->ctx, images(j->ctx, b, j->cnn)),
                           cddp_batch_tensor(j->ctx, b, 1), CDDP_REDUCE_MEAN);
    cddp_model_zero_grad(j->m);
    if (cddp_backward(j->ctx, loss) != CDDP_OK)
        return cddp_error_set(err, cddp_ctx_status(j->ctx), "%s", cddp_ctx_error(j->ctx));
    if (j->cosine)
        cddp_optim_set_lr(j->opt, cddp_lr_warmup_cosine(at, o->lr, 0.0f, 0, o->epochs * j->steps));
    cddp_optim_step(j->opt);
    j->last_loss = cddp_get(loss, 0);
    if (!isfinite(j->last_loss))
        return cddp_error_set(err, CDDP_ERANGE,
                              "the loss became %g in epoch %d, step %" PRId64
                              ": training diverged (a smaller --lr, now %g?)",
                              j->last_loss, epoch, step, (double)o->lr);
    if (j->sample_log) { /* flushed every step: a killed job's log ends at its last step */
        for (int64_t k = 0; k < b->size; k++)
            fprintf(j->sample_log, "%d %" PRId64 " %" PRId64 "\n", epoch, step, b->indices[k]);
        fflush(j->sample_log);
    }
    bool saved = j->files && o->save_every > 0 && ++j->since_save % o->save_every == 0;
    int sig = 0;
    CDDP_TRY(cddp_stop_agreed(j->group, &sig, err));
    if (saved || (sig && j->files))
        CDDP_TRY(save_checkpoint(j->ddp, j->group, j->ctx, j->opt, j->ckpt, o, epoch, at + 1,
                                 cddp_sampler_get_state(j->sampler), err));
    if (sig) {
        if (j->files && j->rank == 0) { /* the losses up to here */
            curves_add_loss(&j->curve, at, epoch, j->last_loss);
            if (!curves_save(&j->curve, o->out))
                fprintf(stderr, "fashion_mnist: cannot write the curves in %s: %s\n", o->out,
                        strerror(errno));
        }
        char after[64];
        snprintf(after, sizeof after, "step %" PRId64 " of epoch %d", step, epoch);
        *stopped = run_stopped(j->ddp, sig, after, j->files ? j->ckpt : NULL);
        return CDDP_OK;
    }
    if (j->rank == 0) {
        progress(o, j->tty, epoch, step, j->steps, j->last_loss);
        if (j->files) curves_add_loss(&j->curve, at, epoch, j->last_loss);
        curves_scalar(&j->curve, "loss", at, j->last_loss);
        curves_scalar(&j->curve, "lr", at, (double)cddp_optim_lr(j->opt));
        curves_ddp(&j->curve, j->ddp, at);
    }
    return CDDP_OK;
}

/* The end of an epoch: the test accuracy, the curves, the checkpoint, then the metrics that
 * point to it. */
static int end_epoch(job *j, int epoch, bool trained, double epoch_s, int64_t epoch_samples,
                     cddp_error *err) {
    const options *o = &j->o;
    int64_t at = (epoch + 1) * j->steps - 1;
    if (evaluate(j->m, j->ctx, j->test_loader, j->cnn, j->group, &j->acc, err) < 0)
        return err->code;
    cddp_ddp_print0(j->ddp, "epoch: %d, test accuracy: %.4f\n", epoch, j->acc);
    double sps = epoch_s > 0 ? (double)epoch_samples * j->world / epoch_s : 0.0;
    if (j->rank == 0) {
        curves_scalar(&j->curve, "test_accuracy", at, j->acc);
        if (trained) /* the time of an epoch trained before the checkpoint is not known */
            curves_scalar(&j->curve, "samples_per_s", at, sps);
    }
    if (!j->files) return CDDP_OK;
    CDDP_TRY(save_checkpoint(j->ddp, j->group, j->ctx, j->opt, j->ckpt, o, epoch + 1, at + 1,
                             (cddp_sampler_state){.epoch = epoch + 1}, err));
    if (j->csv) {
        fprintf(j->csv, "%d,%.6f,%.4f,%.1f,%d\n", epoch, j->last_loss, j->acc, trained ? sps : NAN,
                j->world);
        fflush(j->csv);
    }
    if (j->rank == 0) {
        curves_add_eval(&j->curve, at, epoch, j->acc);
        if (!curves_save(&j->curve, o->out))
            fprintf(stderr, "fashion_mnist: cannot write the curves in %s: %s\n", o->out,
                    strerror(errno));
    }
    return CDDP_OK;
}

/* The epochs, from where training starts to --epochs (or --target_acc reached). A stop the ranks
 * agree on (SIGTERM, Ctrl-C) saves after the step and ends: j->stopped then holds the program's
 * status. */
static int train(job *j, cddp_error *err) {
    const options *o = &j->o;
    cddp_stop_catch(j->rank == 0 ? RUN_STOP_SAY : NULL);
    for (int epoch = j->first_epoch; epoch < o->epochs; epoch++) {
        bool mid_epoch = epoch == j->first_epoch && j->mid.position > 0;
        if (!mid_epoch) cddp_sampler_set_epoch(j->sampler, epoch);
        double t0 = cddp_now_s();
        int64_t epoch_samples = 0;
        bool trained = !(epoch == j->first_epoch && j->trained_whole);
        j->epochs_trained += trained;
        if (!trained) {
            cddp_ddp_print0(j->ddp,
                            "epoch %d was trained whole before the checkpoint: its "
                            "evaluation and end-of-epoch checkpoint follow\n",
                            epoch);
            if (j->curve.nloss) j->last_loss = j->curve.loss[j->curve.nloss - 1].value;
        }
        cddp_batch b;
        int rc = 0;
        if (trained) cddp_loader_begin(j->train_loader);
        while (trained && (rc = cddp_loader_next(j->train_loader, &b, err)) == 1) {
            CDDP_TRY(train_step(j, epoch, &b, &j->stopped, err));
            if (j->stopped >= 0) return CDDP_OK;
            epoch_samples += b.size;
        }
        if (trained && rc < 0) return err->code;
        double epoch_s = cddp_now_s() - t0;
        j->train_s += epoch_s;
        j->samples += epoch_samples;
        j->epochs_run++;
        CDDP_TRY(end_epoch(j, epoch, trained, epoch_s, epoch_samples, err));
        fflush(stdout);
        if (o->target_acc > 0 && j->acc >= o->target_acc) break;
    }
    cddp_stop_release();
    return CDDP_OK;
}

/* After the loop: --save, where things went, the samples over the ranks (none is an error) and
 * the JSON line. */
static int finish(job *j, cddp_error *err) {
    const options *o = &j->o;
    if (j->stopped >= 0) return CDDP_OK; /* stopped: nothing to finish */
    if (o->save) {
        char ep[16];
        snprintf(ep, sizeof ep, "%d", j->first_epoch + j->epochs_run);
        const char *meta[] = {"epoch", ep, "model", o->model, NULL};
        CDDP_TRY(cddp_ddp_save(j->ddp, o->save, j->opt, meta, err));
        cddp_ddp_print0(j->ddp, "saved %s\n", o->save);
    }
    if (j->files)
        cddp_ddp_print0(j->ddp, "checkpoint: %s\nmetrics: %s\ncurves: %s\n", j->ckpt, j->csv_path,
                        j->svg_path);
    int64_t total = j->samples;
    CDDP_TRY(
        cddp_comm_allreduce(j->group, &total, &total, 1, CDDP_COMM_I64, CDDP_COMM_SUM, -1, err));
    if (j->epochs_trained > 0 && total == 0)
        return cddp_error_set(err, CDDP_EINVAL, "trained on no samples in %d epoch%s: is %s empty?",
                              j->epochs_trained, j->epochs_trained > 1 ? "s" : "",
                              o->data ? o->data : "the data");
    run_memory_line("fashion_mnist", j->ddp, j->opt);
    if (!o->json || j->rank != 0) return CDDP_OK;
    cddp_ddp_stats st = cddp_ddp_stats_get(j->ddp);
    char mem[200];
    run_memory_json(mem, sizeof mem, j->ddp, j->opt);
    printf("{\"model\": \"%s\", \"dtype\": \"%s\", \"optimizer\": \"%s\", \"epochs\": %d, "
           "\"batch_per_rank\": %d, "
           "\"world\": %d, \"hook\": \"%s\", \"zero\": %s, %s, "
           "\"train_samples\": %lld, \"train_s\": %.3f, "
           "\"samples_per_s\": %.1f, \"final_loss\": %.6f, \"test_acc\": %.4f, "
           "\"last_step\": {\"forward_ms\": %.3f, \"backward_ms\": %.3f, \"allreduce_ms\": "
           "%.3f, \"wait_ms\": %.3f, \"overlap\": %.3f}}\n",
           o->model, cddp_dtype_name(j->compute), o->optimizer, j->epochs_run, o->batch, j->world,
           o->hook, o->zero ? "true" : "false", mem, (long long)total, j->train_s,
           j->train_s > 0 ? (double)total / j->train_s : 0.0, j->last_loss, j->acc,
           st.forward_s * 1e3, st.backward_s * 1e3, st.comm_s * 1e3, st.wait_s * 1e3, st.overlap);
    return CDDP_OK;
}

static void job_close(job *j) {
    if (j->csv) fclose(j->csv);
    if (j->sample_log) fclose(j->sample_log);
    curves_free(&j->curve);
    cddp_ddp_destroy(j->ddp);
    cddp_optim_destroy(j->opt);
    cddp_model_destroy(j->m);
    cddp_ctx_destroy(j->ctx);
    cddp_loader_destroy(j->train_loader);
    cddp_loader_destroy(j->test_loader);
    cddp_sampler_destroy(j->sampler);
    cddp_dataset_destroy(j->train);
    cddp_dataset_destroy(j->test);
    cddp_comm_destroy(j->group);
}

int main(int argc, char **argv) {
    run_stop_watch("fashion_mnist"); /* before any thread: SIGTERM, SIGINT to one of their own */
    static job j = {.stopped = -1, .last_loss = NAN};
    options *o = &j.o;
    if (parse_args(argc, argv, o) != 0) return 2;
    if (!run_device("fashion_mnist", o->device, o->dtype, &j.dev, &j.compute)) return 2;
    j.curve = (curves){.title = j.title, .eval_label = "test accuracy", .eval_is_fraction = true};
    j.cnn = strcmp(o->model, "mlp") != 0;
    j.resnet = strcmp(o->model, "resnet") == 0;
    j.cosine = strcmp(o->schedule, "cosine") == 0;
    j.files = strcmp(o->out, "none") != 0 && *o->out;
    int (*const parts[])(job *, cddp_error *) = {open_files, open_data, open_model,
                                                 start,      train,     finish};
    cddp_error err = {0};
    int rc = run_group(&j.group, &j.rank, &j.world, &err);
    for (size_t k = 0; !rc && k < sizeof parts / sizeof parts[0]; k++) rc = parts[k](&j, &err);
    job_close(&j);
    return run_exit("fashion_mnist", rc, j.stopped, &err);
}
