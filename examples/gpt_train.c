/* gpt_train.c: train a GPT on text, data-parallel, with nanoGPT's recipe and option names.
 *
 *   cddprun --nproc_per_node 2 build/bin/gpt_train --max_iters 2000          (Debian's fortunes)
 *   build/bin/gpt_train --data input.txt --n_layer 6 --n_embd 192 --json    (one process)
 *
 * A text file or a folder of them is read with the byte tokenizer (every byte a token, vocabulary
 * 256) and split 90/10 into training and validation text; a token file in llm.c's format named
 * ...train.bin is read with its ...val.bin (cddp-tokenize writes them, with the byte tokenizer or
 * a real one: GPT-2's, Llama 3's), and a pattern of them (llm.c's shards, fineweb_train_*.bin)
 * with the same pattern's val shards. A token file that records its tokenizer's vocabulary must
 * be of the model's (a model of --init_from or a checkpoint): GPT-2's weights on byte tokens are
 * refused, not trained. Training samples are
 * windows of block_size tokens (every offset of the training text: stride 1), drawn by a
 * DistributedSampler so that the ranks see disjoint windows each epoch.
 *
 * One iteration is nanoGPT's: the learning rate from the schedule (linear warmup, cosine decay to
 * min_lr), grad_accum micro-steps whose gradients accumulate (DDP reduces only on the last one:
 * no_sync), the gradients' global norm clipped at grad_clip (after DDP's reduction, so every rank
 * clips alike), an AdamW step with weight decay on the matrices only. Every eval_interval
 * iterations rank 0 prints the training and validation losses (eval_iters batches each, spread
 * over the text and shared by the ranks) and saves OUT/checkpoint.safetensors; at the end the
 * whole validation text is evaluated and rank 0 samples --sample tokens of text (after --prompt,
 * encoded with --tokenizer for a model of another vocabulary than bytes, which every rank checks
 * before training), a token at a time with the model's key/value cache (cddp_gpt_generate).
 */
#include <cddp/cddp.h>

#include "corpus.h"
#include "curves.h"
#include "run.h"
#include "text.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_WARMUP 5 /* --bench's iterations before the timed ones */

typedef struct options {
    int64_t n_layer, n_head, n_embd, block_size, vocab_size;
    int64_t batch_size, grad_accum, max_iters, warmup_iters, lr_decay_iters;
    int64_t eval_interval, eval_iters, final_eval, log_interval, sample, stride, top_k, save_every,
        keep, bench, powersgd_rank, powersgd_start;
    double lr, min_lr, weight_decay, grad_clip, beta1, beta2, temperature, peak_tflops;
    const char *data, *out, *resume, *init_from, *device, *dtype, *prompt, *tensorboard, *hook,
        *tokenizer, *prompt_ids, *arch, *optimizer;
    uint64_t seed;
    bool json, stop;
    bool recompute; /* --activation_checkpointing */
    int zero;       /* the ZeRO stage */
    /* --arch llama: the Llama's own sizes, and its whole shape once read from a file */
    int64_t n_kv_head, intermediate_size;
    double rope_theta;
    bool llama, llama_read;
    cddp_llama_config lc;
    bool n_head_given;     /* --n_head was given (a file of weights alone may need it) */
    const char *transport; /* NULL: auto */
} options;

/* The help's second half: data, output, training and throughput. */
static void usage_training(FILE *out);

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: [cddprun --nproc_per_node N] gpt_train [options]\n"
        "Trains a GPT (nanoGPT's model and recipe) on text, data-parallel over the launcher's\n"
        "ranks: text files with the byte tokenizer, or token files of any tokenizer\n"
        "(cddp-tokenize --tokenizer tokenizer.json TEXT DIR; --data DIR/train.bin).\n\n"
        "model:\n"
        "  --arch gpt|llama    the GPT (nanoGPT's, GPT-2's; default) or a Llama-family\n"
        "                      transformer (RMSNorm, rotary positions, grouped-query\n"
        "                      attention, SwiGLU; Hugging Face's names); a checkpoint or\n"
        "                      --init_from of a Llama (its config.json) sets it\n"
        "  --n_kv_head N       llama: key/value heads, dividing --n_head (default: n_head)\n"
        "  --intermediate_size N  llama: the MLP's width (default: 8/3 n_embd, to 32s)\n"
        "  --rope_theta X      llama: the rotary base (default 10000)\n"
        "  --n_layer N         transformer blocks (default 4)\n"
        "  --n_head N          attention heads (default 4)\n"
        "  --n_embd N          width, a multiple of n_head (default 128)\n"
        "  --block_size N      context length in tokens (default 64)\n"
        "  --vocab_size N      vocabulary (default: the one the token files record, else\n"
        "                      --tokenizer's, else 256 or the data's largest token + 1, which\n"
        "                      reads every token at the start; tokens are checked as they\n"
        "                      are read: 50257 for GPT-2's)\n"
        "training (nanoGPT's CPU recipe by default):\n"
        "  --batch_size N      sequences per micro-step on each rank (default 12)\n"
        "  --grad_accum N      micro-steps per iteration (default 1)\n"
        "  --max_iters N       iterations (default 2000)\n"
        "  --lr X              peak learning rate (default 1e-3)\n"
        "  --min_lr X          learning rate after the decay (default 1e-4)\n"
        "  --warmup_iters N    linear warmup (default 100)\n"
        "  --lr_decay_iters N  cosine decay ends here (default max_iters)\n"
        "  --optimizer NAME    adamw (default) or lion (the sign of a momentum: give it a\n"
        "                      3-10x smaller --lr and larger --weight_decay than AdamW's)\n"
        "  --weight_decay X    the optimizer's, on matrices only (default 0.1)\n"
        "  --beta1 X, --beta2 X  its betas (default 0.9, 0.99)\n"
        "  --grad_clip X       clip the gradients' global norm (default 1.0; 0: never)\n"
        "  --seed N            weights and data order (default 1337)\n" RUN_ZERO_HELP
        "  --activation_checkpointing  keep each transformer block's input only, and run the\n"
        "                      block again in backward: less memory, about a third more compute\n"
        "  --hook NAME         gradient compression: none, bf16, fp16 or powersgd (low-rank\n"
        "                      with error feedback, PyTorch's PowerSGD) (default none)\n"
        "  --powersgd_rank R   PowerSGD's rank (default 1)\n"
        "  --powersgd_start S  the first step PowerSGD compresses, counted from 1 (default\n"
        "                      1001)\n" RUN_TRANSPORT_HELP
        "  --device NAME       where to train: cpu, emu (the emulated device), cuda; a kind\n"
        "                      without :N is the local rank's device of it (default cpu)\n"
        "  --dtype NAME        fp32, or bf16: mixed precision, the matrix products in bf16\n"
        "                      with float32 sums (AVX512-BF16 or AMX, a GPU's tensor cores),\n"
        "                      the rest in float32 (default fp32)\n");
    usage_training(out);
}

static void usage_training(FILE *out) {
    fprintf(
        out,
        "data and output:\n"
        "  --data PATH         a text file, a folder of text files, a token file *train.bin\n"
        "                      (with its *val.bin), or a pattern of token files: llm.c's\n"
        "                      shards, 'fineweb_train_*.bin' (with 'fineweb_val_*.bin');\n"
        "                      token files are mapped, not copied (default Debian's\n"
        "                      fortunes, " CORPUS_FORTUNES ")\n"
        "  --stride N          training windows start every N tokens (default 1)\n"
        "  --eval_interval N   evaluate and save every N iterations (default 250)\n"
        "  --save_every N      save a checkpoint every N iterations too (default 0: at\n"
        "                      evaluations only)\n"
        "  --keep K            save each checkpoint as a set, OUT/checkpoints/step-N, every\n"
        "                      rank writing its part at once, and keep the newest K sets\n"
        "                      (default 0: one file, OUT/checkpoint.safetensors)\n"
        "  --eval_iters N      batches per evaluation (default 20)\n"
        "  --final_eval N      batches for the last evaluation (default 0: the whole\n"
        "                      validation text)\n"
        "  --log_interval N    print the loss every N iterations (default 10)\n"
        "  --out DIR           rank 0 writes checkpoint.safetensors, loss.csv, eval.csv and\n"
        "                      curves.svg here (default runs/gpt; 'none': no files); a\n"
        "                      restart of the job (cddprun --max_restarts) goes on from it\n"
        "  --resume[=PATH]     continue from a checkpoint: a file, a set, or a folder of sets\n"
        "                      (its newest complete set) (default OUT/checkpoint.safetensors,\n"
        "                      with --keep OUT/checkpoints)\n"
        "  --init_from PATH    start from a model's weights, of its shape: a checkpoint,\n"
        "                      nanoGPT's or Hugging Face's GPT-2 safetensors (n_head from\n"
        "                      config.json beside it, else --n_head, which is then needed),\n"
        "                      or llm.c's model file\n"
        "                      (gpt2_124M.bin); a fresh optimizer, iteration 0\n"
        "  --sample N          rank 0 ends by writing N tokens of generated text (default 200)\n"
        "  --prompt TEXT       ... after this text (default: from the tokenizer's start token,\n"
        "                      GPT-2's <|endoftext|>, or a newline for bytes), checked before\n"
        "                      training\n"
        "  --prompt_ids IDS    ... after these token ids (\"50256,464\")\n"
        "  --tokenizer FILE    the model's tokenizer, to encode --prompt and print the sample\n"
        "                      as text: Hugging Face's tokenizer.json, GPT-2's vocab.json\n"
        "                      (merges.txt beside it), a model's folder, or llm.c's\n"
        "                      gpt2_tokenizer.bin (printing only)\n"
        "  --stop              end the sample at the end-of-text token\n"
        "  --temperature X     sampling temperature (default 0.8; 0: the likeliest byte)\n"
        "  --top_k N           sample among the N likeliest tokens (default 200; 0: all)\n"
        "  --tensorboard DIR   rank 0 also writes TensorBoard's event files to DIR: loss,\n"
        "                      lr and tokens_per_s every iteration, train_loss and val_loss\n"
        "                      at each evaluation\n"
        "  --json              end with one JSON line of results\n"
        "throughput:\n"
        "  --bench N           time N iterations after 5 warm-up ones, with no evaluation,\n"
        "                      files or sample: the median iteration and its spread,\n"
        "                      tokens/s and the model FLOPs utilisation (MFU)\n"
        "  --peak_tflops X     the device's peak for MFU (default: an H100's or H200's\n"
        "                      dense bf16 989.4, an A100's 312; else MFU is not given)\n"
        "  -h, --help          show this help\n"
        "SIGTERM (cddprun's stop, a scheduler's) or Ctrl-C while training: every rank stops\n"
        "after the same step with a checkpoint in OUT and exits 128 + the signal; again: at "
        "once.\n");
}

/* The largest GPT gpt_train builds: its options' bounds, and those of a checkpoint's shape. */
enum {
    MOST_LAYERS = 1024,
    MOST_HEADS = 1024,
    MOST_EMBD = 65536,
    MOST_BLOCK = 1 << 20,
    MOST_VOCAB = 1 << 22 /* uint32 token files: Llama 3's 128256 and past */
};

/* What parse_args's own options need besides the options. */
typedef struct parsing {
    options *o;
    bool resume; /* --resume given (its path may come later, from --out) */
} parsing;

/* --resume [PATH] (also --resume PATH): the table's one option of gpt_train's own. */
static bool own_option(void *user, int code, const char *arg, int argc, char **argv) {
    (void)code;
    parsing *p = user;
    if (!arg && optind < argc && argv[optind][0] != '-') arg = argv[optind++];
    p->o->resume = arg;
    return true;
}

static int check_args(options *o, bool resume);

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.n_layer = 4,
                   .n_head = 4,
                   .n_embd = 128,
                   .block_size = 64,
                   .batch_size = 12,
                   .grad_accum = 1,
                   .max_iters = 2000,
                   .warmup_iters = 100,
                   .lr_decay_iters = -1,
                   .eval_interval = 250,
                   .eval_iters = 20,
                   .log_interval = 10,
                   .sample = 200,
                   .stride = 1,
                   .top_k = 200,
                   .lr = 1e-3,
                   .min_lr = 1e-4,
                   .weight_decay = 0.1,
                   .grad_clip = 1.0,
                   .beta1 = 0.9,
                   .beta2 = 0.99,
                   .temperature = 0.8,
                   .out = "runs/gpt",
                   .device = "cpu",
                   .hook = "none",
                   .dtype = "fp32",
                   .arch = "gpt",
                   .optimizer = "adamw",
                   .seed = 1337};
    int64_t seed = (int64_t)o->seed;
    parsing pp = {o, false}, *p = &pp;
    const run_opt opts[] = {
        RUN_NUM("n_layer", NULL, 'i', &o->n_layer, 1, MOST_LAYERS, false),
        {.name = "n_head",
         .kind = 'i',
         .at = &o->n_head,
         .lo = 1,
         .hi = MOST_HEADS,
         .given = &o->n_head_given},
        RUN_NUM("n_embd", NULL, 'i', &o->n_embd, 1, MOST_EMBD, false),
        RUN_NUM("block_size", NULL, 'i', &o->block_size, 1, MOST_BLOCK, false),
        RUN_NUM("vocab_size", NULL, 'i', &o->vocab_size, 1, MOST_VOCAB, false),
        RUN_NUM("batch_size", NULL, 'i', &o->batch_size, 1, 1 << 20, false),
        RUN_NUM("grad_accum", NULL, 'i', &o->grad_accum, 1, 1 << 20, false),
        RUN_NUM("max_iters", NULL, 'i', &o->max_iters, 0, (double)INT64_MAX, false),
        RUN_NUM("warmup_iters", NULL, 'i', &o->warmup_iters, 0, (double)INT64_MAX, false),
        RUN_NUM("lr_decay_iters", NULL, 'i', &o->lr_decay_iters, 0, (double)INT64_MAX, false),
        RUN_NUM("eval_interval", NULL, 'i', &o->eval_interval, 1, (double)INT64_MAX, false),
        RUN_NUM("eval_iters", NULL, 'i', &o->eval_iters, 1, (double)INT64_MAX, false),
        RUN_NUM("final_eval", NULL, 'i', &o->final_eval, 0, (double)INT64_MAX, false),
        RUN_NUM("log_interval", NULL, 'i', &o->log_interval, 0, (double)INT64_MAX, false),
        RUN_NUM("sample", NULL, 'i', &o->sample, 0, 1 << 30, false),
        RUN_NUM("stride", NULL, 'i', &o->stride, 1, (double)INT64_MAX, false),
        RUN_NUM("top_k", NULL, 'i', &o->top_k, 0, 65536, false),
        RUN_NUM("save_every", NULL, 'i', &o->save_every, 0, (double)INT64_MAX, false),
        RUN_NUM("keep", NULL, 'i', &o->keep, 0, 1000000, false),
        RUN_NUM("bench", NULL, 'i', &o->bench, 0, 1e9, false),
        RUN_NUM("peak_tflops", NULL, 'f', &o->peak_tflops, 0, 1e6, false),
        RUN_NUM("seed", NULL, 'i', &seed, 0, (double)INT64_MAX, false),
        RUN_NUM("lr", NULL, 'f', &o->lr, 0, 10, true),
        RUN_NUM("min_lr", NULL, 'f', &o->min_lr, 0, 10, false),
        RUN_NUM("weight_decay", NULL, 'f', &o->weight_decay, 0, 100, false),
        RUN_NUM("grad_clip", NULL, 'f', &o->grad_clip, 0, 1e6, false),
        RUN_NUM("beta1", NULL, 'f', &o->beta1, 0, 1, false),
        RUN_NUM("beta2", NULL, 'f', &o->beta2, 0, 1, false),
        RUN_NUM("temperature", NULL, 'f', &o->temperature, 0, 100, false),
        RUN_STR("data", NULL, &o->data),
        RUN_STR("out", NULL, &o->out),
        RUN_STR("init_from", NULL, &o->init_from),
        RUN_STR("prompt", NULL, &o->prompt),
        RUN_STR("prompt_ids", NULL, &o->prompt_ids),
        RUN_STR("arch", NULL, &o->arch),
        RUN_STR("optimizer", NULL, &o->optimizer),
        RUN_NUM("n_kv_head", NULL, 'i', &o->n_kv_head, 1, MOST_HEADS, false),
        RUN_NUM("intermediate_size", NULL, 'i', &o->intermediate_size, 1, MOST_EMBD * 8, false),
        RUN_NUM("rope_theta", NULL, 'f', &o->rope_theta, 0, 1e12, true),
        RUN_STR("tokenizer", NULL, &o->tokenizer),
        RUN_STR("tensorboard", NULL, &o->tensorboard),
        RUN_STR("device", NULL, &o->device),
        RUN_STR("dtype", NULL, &o->dtype),
        RUN_STR("hook", NULL, &o->hook),
        RUN_NUM("powersgd_rank", NULL, 'i', &o->powersgd_rank, 1, 65536, false),
        RUN_NUM("powersgd_start", NULL, 'i', &o->powersgd_start, 1, (double)INT64_MAX, false),
        RUN_SWITCH("json", NULL, &o->json),
        RUN_SWITCH("stop", NULL, &o->stop),
        RUN_SWITCH("activation_checkpointing", NULL, &o->recompute),
        {.name = "resume", .code = 'R', .has_arg = optional_argument, .given = &p->resume},
        RUN_ZERO_AND_TRANSPORT(&o->zero, &o->transport),
    };
    if (run_parse("gpt_train", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), own_option, p,
                  usage) != 0)
        return -1;
    o->seed = (uint64_t)seed;
    return check_args(o, p->resume);
}

/* The options against each other, and what they imply; resume: --resume was given. */
static int check_args(options *o, bool resume) {
    if (o->bench > 0) { /* a throughput run: nothing but the timed iterations */
        o->max_iters = BENCH_WARMUP + o->bench;
        o->out = "none";
        o->sample = 0;
        o->save_every = 0;
    }
    if (o->lr_decay_iters < 0) o->lr_decay_iters = o->max_iters;
    const struct {
        bool bad;
        const char *what;
    } checks[] = {
        {o->n_layer < 1 || o->n_head < 1 || o->n_embd < 1 || o->block_size < 1,
         "--n_layer, --n_head, --n_embd and --block_size must be >= 1"},
        {o->n_embd % o->n_head != 0, "--n_embd must be a multiple of --n_head"},
        {o->batch_size < 1 || o->grad_accum < 1, "--batch_size and --grad_accum must be >= 1"},
        {o->max_iters < 0 || o->warmup_iters < 0, "--max_iters and --warmup_iters must be >= 0"},
        {o->eval_interval < 1 || o->eval_iters < 1 || o->final_eval < 0 || o->log_interval < 0 ||
             o->sample < 0 || o->stride < 1 || o->top_k < 0 || o->save_every < 0,
         "--eval_interval, --eval_iters and --stride must be >= 1; --log_interval, --sample, "
         "--top_k and --save_every >= 0"},
        {!(o->lr > 0) || o->min_lr < 0 || o->min_lr > o->lr,
         "--lr must be > 0 and --min_lr in [0, lr]"},
        {o->weight_decay < 0 || o->grad_clip < 0, "--weight_decay and --grad_clip must be >= 0"},
        {!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1),
         "--beta1 and --beta2 must be in [0, 1)"},
        {o->vocab_size < 0 || o->vocab_size > MOST_VOCAB, "--vocab_size must be in [1, 4194304]"},
        {run_hook(o->hook) < 0, "--hook must be none, bf16, fp16 or powersgd"},
        {(o->powersgd_rank || o->powersgd_start) && strcmp(o->hook, "powersgd"),
         "--powersgd_rank and --powersgd_start need --hook powersgd"},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (checks[i].bad) {
            fprintf(stderr, "gpt_train: %s\n", checks[i].what);
            return -1;
        }
    if (resume && o->init_from) {
        fprintf(stderr, "gpt_train: --resume continues a run (weights, optimizer, iteration, "
                        "data); --init_from starts a new one from weights: choose one\n");
        return -1;
    }
    if (resume && !o->resume) o->resume = ""; /* OUT/checkpoint.safetensors, once OUT is known */
    if (strcmp(o->arch, "gpt") != 0 && strcmp(o->arch, "llama") != 0) {
        fprintf(stderr, "gpt_train: --arch %s: gpt or llama\n", o->arch);
        return -1;
    }
    o->llama = strcmp(o->arch, "llama") == 0;
    if (strcmp(o->optimizer, "adamw") != 0 && strcmp(o->optimizer, "lion") != 0) {
        fprintf(stderr, "gpt_train: --optimizer %s: adamw or lion\n", o->optimizer);
        return -1;
    }
    if (!o->llama && (o->n_kv_head || o->intermediate_size || o->rope_theta)) {
        fprintf(stderr, "gpt_train: --n_kv_head, --intermediate_size and --rope_theta go with "
                        "--arch llama\n");
        return -1;
    }
    return 0;
}

/* ---- data ------------------------------------------------------------------------------------*/

/* ---- evaluation --------------------------------------------------------------------------- */

/* The mean loss over n windows of ds spread evenly over it (all of them when n >= its length),
 * each rank taking every world-th, in batches of up to b; an allreduce sums over ranks. */
static int mean_loss(cddp_model *m, cddp_ctx *ctx, cddp_comm *group, cddp_dataset *ds, int64_t n,
                     int64_t b, double *out, cddp_error *err) {
    int64_t len = cddp_dataset_len(ds), T = cddp_dataset_field(ds, 0)->shape[0];
    if (n > len) n = len;
    int rank = cddp_comm_rank(group), world = cddp_comm_size(group);
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(b * T)),
            *y = malloc(sizeof(int64_t) * (size_t)(b * T));
    if (!x || !y) {
        free(x);
        free(y);
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    }
    bool grad = cddp_ctx_set_grad_enabled(ctx, false);
    cddp_model_set_training(m, false);
    double sum[2] = {0, 0}; /* loss sum over tokens, tokens */
    int rc = CDDP_OK;
    for (int64_t i = rank; i < n && rc == CDDP_OK;) {
        int64_t k = 0;
        for (; k < b && i < n; k++, i += world) {
            int64_t w = n == len ? i : i * len / n;
            rc = cddp_dataset_get(ds, w, (void *const[]){x + k * T, y + k * T}, err);
            if (rc != CDDP_OK) break;
        }
        if (rc != CDDP_OK || k == 0) break;
        cddp_ctx_reset(ctx);
        int64_t rows = k * T, flat[2] = {rows, 0};
        cddp_tensor *logits =
            cddp_model_forward(m, ctx, cddp_from_host(ctx, CDDP_I64, 2, (int64_t[]){k, T}, x));
        if (logits) flat[1] = logits->shape[2];
        cddp_tensor *loss =
            cddp_cross_entropy(ctx, logits ? cddp_reshape(ctx, logits, 2, flat) : NULL,
                               cddp_from_host(ctx, CDDP_I64, 1, &rows, y), CDDP_REDUCE_SUM);
        if (!loss) {
            rc = cddp_error_set(err, cddp_ctx_status(ctx), "%s", cddp_ctx_error(ctx));
            break;
        }
        sum[0] += cddp_get(loss, 0);
        sum[1] += (double)rows;
    }
    cddp_ctx_reset(ctx);
    cddp_ctx_set_grad_enabled(ctx, grad);
    cddp_model_set_training(m, true);
    free(x);
    free(y);
    if (rc != CDDP_OK) return rc;
    CDDP_TRY(cddp_comm_allreduce(group, sum, sum, 2, CDDP_COMM_F64, CDDP_COMM_SUM, -1, err));
    *out = sum[1] > 0 ? sum[0] / sum[1] : NAN;
    return CDDP_OK;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* Seconds spent in each part of an iteration, summed over the timed iterations. */
typedef struct split {
    double forward, backward, optimizer, comm, wait;
    int64_t iters;
} split;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v); 0 when n is 0. */
static double median(double *v, int64_t n) {
    if (!v || n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* x with 4 decimals in buf, or null when it is not a number (JSON has no NaN). */
static const char *json_number(char *buf, double x) {
    if (isfinite(x))
        snprintf(buf, 32, "%.4f", x);
    else
        snprintf(buf, 32, "null");
    return buf;
}

/* --bench's report: the timed iterations' median and range, tokens/s at the median (every rank's
 * tokens), the model's FLOPs a token (6 per parameter, forward and backward, and 6 L C T for
 * causal attention's products: llm.c's and PaLM's count) and MFU, the share of the device's peak
 * (each rank's device: world of them) that those FLOPs are at that speed. */
typedef struct bench {
    int64_t iters;
    double median_ms, min_ms, max_ms, tokens_per_s, flops_per_token, peak_tflops, mfu;
    char mfu_text[32]; /* mfu for JSON, or null */
} bench;

/* A device's dense bf16 peak in TFLOP/s from its description (0: not known). */
static double peak_of(const char *describe) {
    if (strstr(describe, "H100") || strstr(describe, "H200")) return 989.4;
    if (strstr(describe, "A100")) return 312.0;
    return 0.0;
}

static bench bench_of(const options *o, double *iter_s, int64_t n, int64_t params, int world,
                      cddp_device *dev) {
    if (n < 0) n = 0;
    bench b = {.iters = n, .peak_tflops = o->peak_tflops};
    for (int64_t i = 0; i < n; i++) {
        b.min_ms = i == 0 || iter_s[i] * 1e3 < b.min_ms ? iter_s[i] * 1e3 : b.min_ms;
        b.max_ms = iter_s[i] * 1e3 > b.max_ms ? iter_s[i] * 1e3 : b.max_ms;
    }
    b.median_ms = median(iter_s, n) * 1e3;
    double tokens = (double)(o->grad_accum * o->batch_size * o->block_size * world);
    b.tokens_per_s = b.median_ms > 0 ? tokens / (b.median_ms / 1e3) : 0;
    b.flops_per_token =
        6.0 * (double)params + 6.0 * (double)(o->n_layer * o->n_embd * o->block_size);
    if (b.peak_tflops == 0) b.peak_tflops = peak_of(cddp_device_describe(dev));
    b.mfu =
        b.peak_tflops > 0 ? b.flops_per_token * b.tokens_per_s / (b.peak_tflops * 1e12 * world) : 0;
    if (b.peak_tflops > 0)
        snprintf(b.mfu_text, sizeof b.mfu_text, "%.4f", b.mfu);
    else
        snprintf(b.mfu_text, sizeof b.mfu_text, "null");
    return b;
}

/* A Llama's shape as metadata (cddp_llama_config_read reads it back) from meta[n] on; the values
 * in v. Returns the new n. */
static size_t llama_meta(const cddp_llama_config *g, const char **meta, size_t n, char v[][32]) {
    const struct {
        const char *key;
        double value;
        bool integer;
    } f[] = {{"max_positions", (double)g->max_positions, true},
             {"n_kv_head", (double)g->n_kv_head, true},
             {"intermediate_size", (double)g->intermediate_size, true},
             {"rope_theta", g->rope_theta, false},
             {"rms_norm_eps", (double)g->rms_norm_eps, false},
             {"rope_factor", g->rope_factor, false},
             {"rope_low_freq_factor", g->rope_low_freq_factor, false},
             {"rope_high_freq_factor", g->rope_high_freq_factor, false},
             {"rope_original_max", (double)g->rope_original_max, true}};
    for (size_t k = 0; k < sizeof f / sizeof *f; k++) {
        if (k >= 5 && !(g->rope_factor > 0)) break; /* no scaling: no scaling keys */
        snprintf(v[k], 32, f[k].integer ? "%.0f" : "%.17g", f[k].value);
        meta[n++] = f[k].key;
        meta[n++] = v[k];
    }
    meta[n++] = "tie_embeddings";
    meta[n++] = g->tie_embeddings ? "true" : "false";
    return n;
}

static int save(cddp_ddp *ddp, cddp_optim *opt, const char *path, const options *o, int64_t iter,
                cddp_sampler_state st, int world, cddp_error *err) {
    char v[10][32], lv[9][32];
    snprintf(v[0], 32, "%" PRId64, iter);
    snprintf(v[1], 32, "%" PRId64, o->n_layer);
    snprintf(v[2], 32, "%" PRId64, o->n_head);
    snprintf(v[3], 32, "%" PRId64, o->n_embd);
    snprintf(v[4], 32, "%" PRId64, o->block_size);
    snprintf(v[5], 32, "%" PRId64, o->vocab_size);
    snprintf(v[6], 32, "%" PRId64, st.epoch);
    snprintf(v[7], 32, "%" PRId64, st.consumed);
    snprintf(v[8], 32, "%d", world);
    snprintf(v[9], 32, "%" PRId64, st.position);
    const char *meta[64] = {"iter",          v[0], "n_layer",       v[1],
                            "n_head",        v[2], "n_embd",        v[3],
                            "block_size",    v[4], "vocab_size",    v[5],
                            "data_epoch",    v[6], "data_consumed", v[7],
                            "world",         v[8], "model",         o->llama ? "llama" : "gpt",
                            "data_position", v[9]};
    size_t n = 22;
    if (o->llama) n = llama_meta(&o->lc, meta, n, lv);
    if (*run_job_id()) { /* outside a launcher and Slurm: no job to name */
        meta[n++] = "run_id";
        meta[n++] = run_job_id();
    }
    meta[n] = NULL;
    if (o->keep > 0) return cddp_ddp_save_set(ddp, path, iter, (int)o->keep, opt, meta, err);
    return cddp_ddp_save(ddp, path, opt, meta, err);
}

/* A Llama's shape (a cddp checkpoint of one, or Hugging Face's config.json) into the options;
 * CDDP_ENOENT when path holds none and --arch llama was not given (then it is a GPT's). */
static int peek_llama(const char *path, options *o, cddp_error *err) {
    cddp_llama_config g;
    cddp_error e = {0};
    int rc = cddp_llama_config_read(path, &g, &e);
    if (rc != CDDP_OK && !o->llama) return CDDP_ENOENT;
    if (rc != CDDP_OK) return cddp_error_set(err, rc, "%s", e.msg);
    if (g.n_layer > MOST_LAYERS || g.n_head > MOST_HEADS || g.n_embd > MOST_EMBD ||
        g.vocab_size > MOST_VOCAB)
        return cddp_error_set(err, CDDP_EFORMAT, "%s: a Llama beyond what gpt_train builds", path);
    o->llama = o->llama_read = true;
    o->lc = g;
    o->vocab_size = g.vocab_size;
    o->n_layer = g.n_layer;
    o->n_head = g.n_head;
    o->n_embd = g.n_embd;
    o->n_kv_head = g.n_kv_head;
    o->intermediate_size = g.intermediate_size;
    if (o->block_size > g.max_positions) o->block_size = g.max_positions;
    return CDDP_OK;
}

/* The GPT's shape in a checkpoint or a file of weights (cddp_gpt_config_read) into the options,
 * within the bounds the options have; or a Llama's (peek_llama). */
static int peek_shape(const char *path, options *o, cddp_error *err) {
    int llama = peek_llama(path, o, err);
    if (llama != CDDP_ENOENT) return llama;
    /* A file of weights alone that does not say its head count takes --n_head, never its
     * default: GPT-2's weights read with 4 heads instead of 12 train, wrongly. */
    cddp_gpt_config g = {.n_head = o->n_head_given ? o->n_head : 0};
    int rc = cddp_gpt_config_read(path, &g, err);
    const struct {
        const char *name;
        int64_t value, most;
    } sizes[] = {{"n_layer", g.n_layer, MOST_LAYERS},
                 {"n_head", g.n_head, MOST_HEADS},
                 {"n_embd", g.n_embd, MOST_EMBD},
                 {"block_size", g.block_size, MOST_BLOCK},
                 {"vocab_size", g.vocab_size, MOST_VOCAB}};
    for (size_t i = 0; rc == CDDP_OK && i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value > sizes[i].most)
            rc = cddp_error_set(err, CDDP_EFORMAT,
                                "%s: a GPT of %s %" PRId64 ", beyond what gpt_train builds (at "
                                "most %" PRId64 "): a damaged file?",
                                path, sizes[i].name, sizes[i].value, sizes[i].most);
    if (rc == CDDP_OK) {
        o->vocab_size = g.vocab_size;
        o->block_size = g.block_size;
        o->n_layer = g.n_layer;
        o->n_head = g.n_head;
        o->n_embd = g.n_embd;
    }
    return rc;
}

/* ---- the job ----------------------------------------------------------------------------- */

/* What a run holds, from the options to the loop's statistics. */
typedef struct job {
    options o;
    int stopped; /* the status a stop asked for (train), else -1 */
    cddp_device *dev;
    cddp_dtype compute;
    cddp_comm *group;
    int rank, world;
    cddp_ddp *ddp;
    corpus train_text, val_text;
    text_vocab vocab;
    text_sample_options ts;
    cddp_dataset *train, *val;
    cddp_sampler *sampler;
    cddp_loader *loader;
    cddp_model *m;
    cddp_optim *opt;
    cddp_ctx *ctx;
    double *iter_s; /* the loop's iteration times */
    int64_t n_iter_s, check, params;
    /* restart_at: a restart's checkpoint, which o.resume may point to */
    char title[200], ckpt[4096], resume_path[4096], restart_at[4096];
    curves curve;
    bool files;
    /* the loop */
    int64_t iter, first, tokens;
    split sp;
    double train_s, val_loss, train_loss, last_loss;
} job;

/* The run's checkpoint, where --out says, and the path --resume names (a restart of the job goes
 * on from the job's last save); the model's shape from the file it starts from. */
static int open_paths(job *j, cddp_error *err) {
    options *o = &j->o;
    if (j->files)
        snprintf(j->ckpt, sizeof j->ckpt, "%s/%s", o->out,
                 o->keep ? "checkpoints" : "checkpoint.safetensors");
    if (j->files &&
        run_restart_from(j->group, "gpt_train", o->out, j->restart_at, sizeof j->restart_at,
                         &o->resume, &o->init_from, err) != CDDP_OK)
        return err->code;
    if (o->resume) {
        if (!*o->resume && !*j->ckpt)
            return cddp_error_set(err, CDDP_EINVAL, "--resume needs a PATH when --out is none");
        CDDP_TRY(cddp_checkpoint_resolve(*o->resume ? o->resume : j->ckpt, j->resume_path,
                                         sizeof j->resume_path, err));
        CDDP_TRY(peek_shape(j->resume_path, o, err));
    }
    /* its shape, from the file (a file of weights alone: n_head as given) */
    return o->init_from ? peek_shape(o->init_from, o, err) : CDDP_OK;
}

/* The text: every rank reads it (it is small next to the model's work). The model's vocabulary:
 * a checkpoint's or --vocab_size, else the one the token files record (cddp-tokenize writes it),
 * else the tokenizer's, else the data's largest token + 1, every token read now. Otherwise each
 * window's tokens are checked as training and evaluation read them, and the start reads none (a
 * corpus of billions of tokens, mapped, starts at once). A vocabulary the files record must be
 * the model's, as must the tokenizer's. */
static int open_text(job *j, cddp_error *err) {
    options *o = &j->o;
    CDDP_TRY(corpus_load(o->data, &j->train_text, &j->val_text, err));
    int64_t data_vocab = 0;
    CDDP_TRY(corpus_vocab(&j->train_text, &data_vocab, err));
    CDDP_TRY(corpus_vocab(&j->val_text, &data_vocab, err));
    if (o->tokenizer) CDDP_TRY(text_vocab_load(o->tokenizer, &j->vocab, err));
    if (o->vocab_size == 0 && (data_vocab || j->vocab.size))
        o->vocab_size = data_vocab ? data_vocab : j->vocab.size;
    j->check = o->vocab_size;
    if (o->vocab_size == 0) {
        int64_t top = CDDP_MAX(corpus_max_token(&j->train_text), corpus_max_token(&j->val_text));
        o->vocab_size = CDDP_MAX(256, top + 1);
    }
    CDDP_TRY(text_vocab_check(o->vocab_size, data_vocab, "the data", j->train_text.name[0], err));
    j->ts = (text_sample_options){.prompt = o->prompt,
                                  .prompt_ids = o->prompt_ids,
                                  .n = o->sample,
                                  .top_k = o->top_k,
                                  .vocab_size = o->vocab_size,
                                  .temperature = o->temperature,
                                  .seed = o->seed + 7,
                                  .stop = o->stop,
                                  .vocab = o->tokenizer ? &j->vocab : NULL};
    if (o->sample > 0) { /* the prompt, the tokenizer: refused now, not after the training */
        int64_t *ids, n_ids, stop;
        CDDP_TRY(text_prompt(&j->ts, &ids, &n_ids, &stop, err));
        free(ids);
    }
    return CDDP_OK;
}

/* The windows, the DistributedSampler over the training ones, and the loader. */
static int open_data(job *j, cddp_error *err) {
    const options *o = &j->o;
    if (!(j->train = corpus_windows(&j->train_text, o->block_size, o->stride, j->check, err)) ||
        !(j->val = corpus_windows(&j->val_text, o->block_size, o->block_size, j->check, err)))
        return err->code;
    cddp_sampler_options so = cddp_sampler_defaults();
    so.seed = o->seed;
    so.rank = j->rank;
    so.num_replicas = j->world;
    so.drop_last = true;
    if (!(j->sampler = cddp_sampler_create(cddp_dataset_len(j->train), &so, err))) return err->code;
    cddp_loader_options lo = {
        .batch_size = o->batch_size, .drop_last = true, .prefetch = 2, .device = j->dev};
    return (j->loader = cddp_loader_create(j->train, j->sampler, &lo, err)) ? CDDP_OK : err->code;
}

/* The model on its device and the context its steps run in. */
static int open_model(job *j, cddp_error *err) {
    options *o = &j->o;
    cddp_gpt_config g = {.vocab_size = o->vocab_size,
                         .block_size = o->block_size,
                         .n_layer = o->n_layer,
                         .n_head = o->n_head,
                         .n_embd = o->n_embd};
    if (o->llama && !o->llama_read) /* from the options; a file's shape is its own */
        o->lc = (cddp_llama_config){.max_positions = o->block_size,
                                    .n_layer = o->n_layer,
                                    .n_head = o->n_head,
                                    .n_embd = o->n_embd,
                                    .n_kv_head = o->n_kv_head ? o->n_kv_head : o->n_head,
                                    .intermediate_size = o->intermediate_size
                                                             ? o->intermediate_size
                                                             : (8 * o->n_embd / 3 + 31) / 32 * 32,
                                    .rope_theta = o->rope_theta > 0 ? o->rope_theta : 10000.0,
                                    .rms_norm_eps = 1e-5f};
    o->lc.vocab_size = o->vocab_size;
    if (!(j->m = cddp_model_create_with(o->llama ? cddp_nn_llama(&o->lc) : cddp_nn_gpt(&g), err))) {
        if (!err->msg[0])
            cddp_error_set(err, CDDP_EINVAL,
                           "%s of %" PRId64 " heads, %" PRId64 " key/value heads and width %" PRId64
                           ": the width a multiple of the heads (an even number each), the heads "
                           "of the key/value heads",
                           o->llama ? "a Llama" : "a GPT", o->n_head, o->lc.n_kv_head, o->n_embd);
        return CDDP_EINVAL;
    }
    if (cddp_model_build(j->m, o->seed) != CDDP_OK)
        return cddp_error_set(err, CDDP_EINVAL, "%s", cddp_model_error(j->m));
    CDDP_TRY(cddp_model_to(j->m, j->dev, err));
    if (o->recompute) cddp_model_recompute_blocks(j->m, true);
    if (!(j->ctx = cddp_ctx_create(&(cddp_ctx_options){
              .seed = o->seed + (uint64_t)j->rank, .device = j->dev, .compute = j->compute})))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    j->params = (int64_t)cddp_model_numel(j->m);
    return CDDP_OK;
}

/* The wrap that makes the model data-parallel, then its optimizer (under --zero its state is the
 * shard's from the start). */
static int open_training(job *j, cddp_error *err) {
    const options *o = &j->o;
    cddp_adamw_options aw = cddp_adamw_defaults((float)o->lr);
    aw.beta1 = (float)o->beta1;
    aw.beta2 = (float)o->beta2;
    aw.weight_decay = (float)o->weight_decay;
    aw.decay_matrices_only = true;
    cddp_lion_options lion = {(float)o->lr, aw.beta1, aw.beta2, aw.weight_decay, true};
    cddp_ddp_options d = {.transport = o->transport,
                          .hook = (cddp_ddp_hook)run_hook(o->hook),
                          .powersgd_rank = (int)o->powersgd_rank,
                          .powersgd_start_step = o->powersgd_start};
    run_zero_options(o->zero, &d);
    if (!(j->ddp = cddp_ddp_wrap(j->m, j->group, &d, err))) return err->code;
    j->opt = strcmp(o->optimizer, "lion") ? cddp_optim_adamw(j->m, &aw, err)
                                          : cddp_optim_lion(j->m, &lion, err);
    return j->opt ? CDDP_OK : err->code;
}

/* --resume: the model, the optimizer, the iteration and the ranks' position in the epoch (any
 * number of ranks continues the same order). */
static int resume(job *j, cddp_error *err) {
    const options *o = &j->o;
    cddp_safetensors *f = NULL;
    /* the path asked for: from a folder of sets, a set that fails its checks gives way to the one
     * before it, and resume_path says which was loaded */
    CDDP_TRY(cddp_ddp_load_from(j->ddp, *o->resume ? o->resume : j->ckpt, j->opt, &f,
                                j->resume_path, sizeof j->resume_path, err));
    cddp_sampler_state st = {0};
    int64_t was = j->world;
    const char *at = j->resume_path;
    int rc = run_meta_int(f, at, "iter", 0, INT64_MAX, 0, &j->iter, err);
    if (!rc) rc = run_meta_int(f, at, "data_epoch", 0, INT32_MAX, 0, &st.epoch, err);
    if (!rc) rc = run_meta_int(f, at, "data_consumed", 0, INT64_MAX, 0, &st.consumed, err);
    if (!rc) rc = run_meta_int(f, at, "data_position", 0, INT64_MAX, 0, &st.position, err);
    if (!rc) rc = run_meta_int(f, at, "world", 1, 1 << 20, j->world, &was, err);
    cddp_safetensors_destroy(f);
    CDDP_TRY(rc);
    if (was != j->world && st.position == 0 && st.consumed > 0) {
        cddp_ddp_print0(j->ddp,
                        "resuming on %d ranks from a checkpoint of %" PRId64
                        " without the data's position: epoch %" PRId64 " starts over\n",
                        j->world, was, st.epoch);
        st.consumed = 0;
    } else if (was != j->world) {
        cddp_ddp_print0(j->ddp,
                        "resuming on %d ranks from a checkpoint of %" PRId64 ": epoch %" PRId64
                        " goes on after its %" PRId64 " windows seen\n",
                        j->world, was, st.epoch, st.position);
    }
    CDDP_TRY(cddp_sampler_set_state(j->sampler, st, err));
    cddp_ddp_print0(j->ddp, "resumed from %s at iteration %" PRId64 "\n", j->resume_path, j->iter);
    return CDDP_OK;
}

/* Where training starts: --init_from's weights, --resume's state; TensorBoard, the output folder
 * and the curves so far; the title line. */
static int start(job *j, cddp_error *err) {
    const options *o = &j->o;
    if (o->init_from) {
        CDDP_TRY(o->llama ? cddp_model_load_hf(j->m, o->init_from, err)
                          : cddp_gpt_load_weights(j->m, o->init_from, err));
        cddp_ddp_print0(j->ddp,
                        "initialised from %s (weights only: a new optimizer, iteration 0)\n",
                        o->init_from);
    }
    if (o->resume) CDDP_TRY(resume(j, err));
    if (j->rank == 0 && o->tensorboard && !curves_tensorboard(&j->curve, o->tensorboard, err))
        return err->code;
    if (j->files) {
        if (j->rank == 0) CDDP_TRY(run_make_dirs(o->out, err));
        if (j->rank == 0 && o->resume) { /* the curves so far, up to the checkpoint's iteration */
            curves *c = &j->curve;
            curves_load(c, o->out);
            while (c->nloss && c->loss[c->nloss - 1].step >= j->iter) c->nloss--;
            while (c->neval && c->eval[c->neval - 1].step > j->iter) c->neval--;
        }
    }
    snprintf(j->title, sizeof j->title,
             "gpt_train: %" PRId64 " layers, %" PRId64 " heads, width %" PRId64
             ", vocabulary %" PRId64 ", %.2fM parameters, "
             "%d rank%s x batch %" PRId64 " x %" PRId64 " tokens",
             o->n_layer, o->n_head, o->n_embd, o->vocab_size, (double)j->params / 1e6, j->world,
             j->world > 1 ? "s" : "", o->batch_size * o->grad_accum, o->block_size);
    cddp_ddp_print0(j->ddp,
                    "%s\ntraining windows: %" PRId64 " (%" PRId64 " tokens), validation: %" PRId64
                    " tokens\n",
                    j->title, cddp_dataset_len(j->train), j->train_text.tokens, j->val_text.tokens);
    /* each iteration's time, for the median (a run's speed once warm, as benchmarks compare) */
    int64_t n = o->max_iters - j->iter + 1;
    j->iter_s = calloc((size_t)(n > 0 ? n : 1), sizeof *j->iter_s);
    j->first = j->iter;
    return CDDP_OK;
}

/* This iteration's checkpoint, where the options ask for one. */
static int save_now(job *j, int64_t iter, cddp_error *err) {
    return save(j->ddp, j->opt, j->ckpt, &j->o, iter, cddp_sampler_get_state(j->sampler), j->world,
                err);
}

/* Every eval_interval iterations and at the end: the training and validation losses (at the
 * end the whole validation text, or --final_eval batches), the curves and the checkpoint. */
static int evaluate(job *j, bool last, cddp_error *err) {
    const options *o = &j->o;
    int64_t b = o->batch_size, iter = j->iter;
    CDDP_TRY(
        mean_loss(j->m, j->ctx, j->group, j->train, o->eval_iters * b, b, &j->train_loss, err));
    CDDP_TRY(mean_loss(j->m, j->ctx, j->group, j->val,
                       !last           ? o->eval_iters * b
                       : o->final_eval ? o->final_eval * b
                                       : INT64_MAX,
                       b, &j->val_loss, err));
    cddp_ddp_print0(j->ddp, "step %" PRId64 ": train loss %.4f, val loss %.4f%s\n", iter,
                    j->train_loss, j->val_loss,
                    last && !o->final_eval ? " (the whole validation text)" : "");
    if (j->rank == 0 && iter > j->first) { /* as eval.csv: not again at a resumed iteration */
        curves_scalar(&j->curve, "train_loss", iter, j->train_loss);
        curves_scalar(&j->curve, "val_loss", iter, j->val_loss);
    }
    if (!j->files || iter <= j->first) return CDDP_OK;
    CDDP_TRY(save_now(j, iter, err));
    if (j->rank == 0) {
        curves_add_eval(&j->curve, iter, 0, j->val_loss);
        if (!curves_save(&j->curve, o->out))
            fprintf(stderr, "gpt_train: cannot write the curves in %s: %s\n", o->out,
                    strerror(errno));
    }
    return CDDP_OK;
}

/* grad_accum micro-steps (DDP reduces only on the last: no_sync): the loss summed into *loss_sum,
 * forward's and backward's seconds into tf and tb. */
static int micro_steps(job *j, double *loss_sum, double *tf, double *tb, cddp_error *err) {
    const options *o = &j->o;
    int64_t T = o->block_size, flat[2] = {o->batch_size * T, o->vocab_size},
            rows = o->batch_size * T;
    for (int64_t micro = 0; micro < o->grad_accum; micro++) {
        cddp_batch b;
        int rc = cddp_loader_next(j->loader, &b, err);
        if (rc == 0) { /* the epoch is over: the next one (a new order) */
            cddp_loader_begin(j->loader);
            rc = cddp_loader_next(j->loader, &b, err);
        }
        if (rc == 0)
            return cddp_error_set(err, CDDP_ERANGE,
                                  "the training text has fewer windows than one batch per rank");
        if (rc != 1) return err->code;
        cddp_ddp_no_sync(j->ddp, micro < o->grad_accum - 1);
        double tm = cddp_now_s();
        cddp_ctx_reset(j->ctx);
        cddp_tensor *logits = cddp_model_forward(j->m, j->ctx, cddp_batch_tensor(j->ctx, &b, 0));
        cddp_tensor *loss = cddp_cross_entropy(
            j->ctx, cddp_reshape(j->ctx, logits, 2, flat),
            cddp_from_host(j->ctx, CDDP_I64, 1, &rows, b.data[1]), CDDP_REDUCE_MEAN);
        if (o->grad_accum > 1) loss = cddp_scale(j->ctx, loss, 1.0f / (float)o->grad_accum);
        double tm2 = cddp_now_s();
        *tf += tm2 - tm;
        if (cddp_backward(j->ctx, loss) != CDDP_OK)
            return cddp_error_set(err, cddp_ctx_status(j->ctx), "%s", cddp_ctx_error(j->ctx));
        *tb += cddp_now_s() - tm2;
        *loss_sum += cddp_get(loss, 0);
    }
    cddp_ddp_no_sync(j->ddp, false);
    return CDDP_OK;
}

/* One iteration: the schedule's learning rate, the micro-steps, clipping, the optimizer's step;
 * its times, the loss's mean over the ranks, the curves and the log line. */
static int train_step(job *j, cddp_error *err) {
    const options *o = &j->o;
    int64_t iter = j->iter, step_tokens = o->grad_accum * o->batch_size * o->block_size * j->world;
    double t0 = cddp_now_s(), tf = 0, tb = 0, loss_sum = 0;
    cddp_optim_set_lr(j->opt, cddp_lr_warmup_cosine(iter, (float)o->lr, (float)o->min_lr,
                                                    o->warmup_iters, o->lr_decay_iters));
    cddp_model_zero_grad(j->m);
    CDDP_TRY(micro_steps(j, &loss_sum, &tf, &tb, err));
    double to = cddp_now_s();
    if (o->grad_clip > 0) cddp_clip_grad_norm(j->m, o->grad_clip);
    cddp_optim_step(j->opt);
    double t1 = cddp_now_s();
    j->train_s += t1 - t0;
    if (j->iter_s) j->iter_s[j->n_iter_s++] = t1 - t0;
    j->tokens += step_tokens;
    if (iter - j->first >= 3) { /* the first iterations warm the caches and the arena up */
        cddp_ddp_stats st = cddp_ddp_stats_get(j->ddp);
        j->sp.forward += tf;
        j->sp.backward += tb;
        j->sp.optimizer += t1 - to;
        j->sp.comm += st.comm_s;
        j->sp.wait += st.wait_s;
        j->sp.iters++;
    }
    /* The step's loss: the mean over the ranks (each rank's is its own batch's). */
    if (j->world > 1)
        CDDP_TRY(cddp_comm_allreduce(j->group, &loss_sum, &loss_sum, 1, CDDP_COMM_F64,
                                     CDDP_COMM_MEAN, -1, err));
    j->last_loss = loss_sum;
    if (!isfinite(j->last_loss)) /* the mean over the ranks: every rank stops here */
        return cddp_error_set(err, CDDP_ERANGE,
                              "the loss became %g at iteration %" PRId64
                              ": training diverged (a smaller --lr, now %g, or --grad_clip?)",
                              j->last_loss, iter, o->lr);
    if (j->rank == 0) {
        if (j->files) curves_add_loss(&j->curve, iter, 0, j->last_loss);
        curves_scalar(&j->curve, "loss", iter, j->last_loss);
        curves_scalar(&j->curve, "lr", iter, (double)cddp_optim_lr(j->opt));
        curves_scalar(&j->curve, "tokens_per_s", iter,
                      t1 > t0 ? (double)step_tokens / (t1 - t0) : 0.0);
        curves_ddp(&j->curve, j->ddp, iter);
    }
    if (o->log_interval && iter % o->log_interval == 0)
        cddp_ddp_print0(j->ddp, "iter %" PRId64 ": loss %.4f, time %.1fms, lr %.2e\n", iter,
                        j->last_loss, (t1 - t0) * 1e3, (double)cddp_optim_lr(j->opt));
    return CDDP_OK;
}

/* The loop, from the first iteration to max_iters: evaluations, checkpoints, steps. A stop the
 * ranks agree on (SIGTERM, Ctrl-C) saves after the iteration and ends: j->stopped then holds the
 * program's status. */
static int train(job *j, cddp_error *err) {
    const options *o = &j->o;
    cddp_loader_begin(j->loader);
    /* SIGTERM, Ctrl-C: a checkpoint after the iteration, then the end */
    cddp_stop_catch(j->rank == 0 ? RUN_STOP_SAY : NULL);
    for (; j->iter <= o->max_iters; j->iter++) {
        int64_t iter = j->iter;
        bool last = iter == o->max_iters;
        bool at_eval = !o->bench &&
                       ((iter % o->eval_interval == 0 && !(o->resume && iter == j->first)) || last);
        if (!at_eval && j->files && o->save_every > 0 && iter % o->save_every == 0 &&
            iter > j->first)
            CDDP_TRY(save_now(j, iter, err));
        if (at_eval) CDDP_TRY(evaluate(j, last, err));
        if (last) break;
        CDDP_TRY(train_step(j, err));
        int sig = 0;
        CDDP_TRY(cddp_stop_agreed(j->group, &sig, err));
        if (sig) {
            if (j->files) CDDP_TRY(save_now(j, iter + 1, err));
            if (j->files && j->rank == 0 && !curves_save(&j->curve, o->out)) /* the losses so far */
                fprintf(stderr, "gpt_train: cannot write the curves in %s: %s\n", o->out,
                        strerror(errno));
            char after[64];
            snprintf(after, sizeof after, "iteration %" PRId64, iter);
            j->stopped = run_stopped(j->ddp, sig, after, j->files ? j->ckpt : NULL);
            return CDDP_OK;
        }
    }
    cddp_stop_release();
    return CDDP_OK;
}

/* After the loop, on rank 0: where things went, the sample, --bench's line and the JSON line. */
static int finish(job *j, cddp_error *err) {
    const options *o = &j->o;
    if (j->stopped >= 0) return CDDP_OK; /* stopped: nothing to finish */
    run_memory_line("gpt_train", j->ddp, j->opt);
    if (j->rank != 0) return CDDP_OK;
    if (j->files)
        printf("checkpoint: %s\ncurves: %s/curves.svg (loss.csv, eval.csv)\n", j->ckpt, o->out);
    if (o->sample > 0) {
        printf("sample (%" PRId64 " %s, temperature %.2f, top_k %" PRId64 "):\n", o->sample,
               o->vocab_size == 256 ? "bytes" : "tokens", o->temperature, o->top_k);
        CDDP_TRY(text_sample(j->m, j->ctx, &j->ts, stdout, NULL, err));
    }
    bench b = {0};
    if (o->bench) {
        b = bench_of(o, j->iter_s + BENCH_WARMUP, j->n_iter_s - BENCH_WARMUP, j->params, j->world,
                     j->dev);
        printf("bench: %" PRId64 " iterations after %d: median %.2f ms (%.2f..%.2f), %.0f "
               "tokens/s, %.3g FLOPs a token",
               b.iters, BENCH_WARMUP, b.median_ms, b.min_ms, b.max_ms, b.tokens_per_s,
               b.flops_per_token);
        if (b.peak_tflops > 0)
            printf(", MFU %.1f%% of %.1f TFLOP/s\n", 100 * b.mfu, b.peak_tflops);
        else
            printf(" (no peak known for %s: --peak_tflops)\n", cddp_device_describe(j->dev));
    }
    fflush(stdout);
    if (!o->json) return CDDP_OK;
    char extra[256] = "", tl[32], ll[32], vl[32]; /* the losses: null when none (--bench) */
    char mem[200];
    run_memory_json(mem, sizeof mem, j->ddp, j->opt);
    if (o->bench)
        snprintf(extra, sizeof extra,
                 ", \"bench\": {\"iters\": %" PRId64 ", \"median_ms\": %.3f, "
                 "\"min_ms\": %.3f, \"max_ms\": %.3f, \"tokens_per_s\": %.1f, "
                 "\"flops_per_token\": %.6g, \"peak_tflops\": %.1f, \"mfu\": %s}",
                 b.iters, b.median_ms, b.min_ms, b.max_ms, b.tokens_per_s, b.flops_per_token,
                 b.peak_tflops, b.mfu_text);
    const split *sp = &j->sp;
    double n = sp->iters ? (double)sp->iters : 1;
    printf("{\"iters\": %" PRId64 ", \"world\": %d, \"dtype\": \"%s\", \"params\": %" PRId64
           ", \"tokens\": %" PRId64 ", \"train_s\": %.3f, \"tokens_per_s\": %.1f, "
           "\"train_loss\": %s, \"last_loss\": %s, \"val_loss\": %s, "
           "\"median_iter_ms\": %.3f, "
           "\"zero\": %s, \"hook\": \"%s\", %s, "
           "\"iter_ms\": {\"forward\": %.3f, \"backward\": %.3f, \"allreduce\": %.3f, "
           "\"allreduce_wait\": %.3f, \"optimizer\": %.3f}%s}\n",
           j->iter - j->first, j->world, cddp_dtype_name(j->compute), j->params, j->tokens,
           j->train_s, j->train_s > 0 ? (double)j->tokens / j->train_s : 0.0,
           json_number(tl, j->train_loss), json_number(ll, j->last_loss),
           json_number(vl, j->val_loss), median(j->iter_s, j->n_iter_s) * 1e3,
           o->zero ? "true" : "false", o->hook, mem, sp->forward / n * 1e3, sp->backward / n * 1e3,
           sp->comm / n * 1e3, sp->wait / n * 1e3, sp->optimizer / n * 1e3, extra);
    return CDDP_OK;
}

static void job_close(job *j) {
    free(j->iter_s);
    curves_free(&j->curve);
    cddp_ddp_destroy(j->ddp);
    cddp_optim_destroy(j->opt);
    cddp_model_destroy(j->m);
    cddp_ctx_destroy(j->ctx);
    cddp_loader_destroy(j->loader);
    cddp_sampler_destroy(j->sampler);
    cddp_dataset_destroy(j->train);
    cddp_dataset_destroy(j->val);
    corpus_free(&j->train_text);
    corpus_free(&j->val_text);
    text_vocab_free(&j->vocab);
    cddp_comm_destroy(j->group);
}

int main(int argc, char **argv) {
    run_stop_watch("gpt_train"); /* before any thread: SIGTERM, SIGINT to one of their own */
    static job j = {.stopped = -1, .val_loss = NAN, .train_loss = NAN, .last_loss = NAN};
    if (parse_args(argc, argv, &j.o) != 0) return 2;
    if (!run_device("gpt_train", j.o.device, j.o.dtype, &j.dev, &j.compute)) return 2;
    j.curve = (curves){.title = j.title, .eval_label = "validation loss"};
    j.files = strcmp(j.o.out, "none") != 0 && *j.o.out;
    int (*const parts[])(job *, cddp_error *) = {open_paths,    open_text, open_data, open_model,
                                                 open_training, start,     train,     finish};
    cddp_error err = {0};
    int rc = run_group(&j.group, &j.rank, &j.world, &err);
    for (size_t k = 0; !rc && k < sizeof parts / sizeof parts[0]; k++) rc = parts[k](&j, &err);
    job_close(&j);
    return run_exit("gpt_train", rc, j.stopped, &err);
}
