/* gpt_generate.c: text from a GPT's weights.
 *
 *   build/bin/gpt_generate runs/gpt/checkpoint.safetensors --prompt "Q: " --tokens 300
 *   build/bin/gpt_generate gpt2/model.safetensors --tokenizer gpt2 --prompt "Hello," (GPT-2)
 *   build/bin/gpt_generate gpt2_124M.bin --tokenizer gpt2_tokenizer.bin --device cuda (llm.c's)
 *
 * MODEL is any file cddp_gpt_load_weights reads: a checkpoint of gpt_train (a file or a set),
 * nanoGPT's or Hugging Face's safetensors (n_head from the config.json beside it, or --n_head),
 * or llm.c's model file; or a Llama: gpt_train --arch llama's checkpoint, or Hugging Face's
 * Llama (its folder, config.json and weights, which cddp_model_load_hf reads). The tokens are drawn
 * one at a time with the model's key/value cache (cddp_gpt_generate) and printed as they come: as
 * bytes for a model of the byte tokenizer, through the tokenizer --tokenizer names (Hugging Face's
 * tokenizer.json, GPT-2's vocab.json, a model's folder, or llm.c's tokenizer file), else as token
 * ids. --prompt is encoded by that tokenizer; without a prompt the text starts from its
 * beginning-of-text token (GPT-2's <|endoftext|>).
 * --json ends with the generation's speed.
 */
#include <cddp/cddp.h>

#include "run.h"
#include "text.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: gpt_generate MODEL [options]\n"
            "Prints text a GPT generates, a token at a time.\n"
            "  MODEL               a gpt_train checkpoint (file or set), nanoGPT's or Hugging\n"
            "                      Face's model.safetensors, or llm.c's gpt2_124M.bin\n"
            "  --prompt TEXT       start after this text (encoded by --tokenizer, or as bytes\n"
            "                      for a byte-tokenizer model; default: from the tokenizer's\n"
            "                      start token, GPT-2's <|endoftext|>, or a newline for bytes)\n"
            "  --prompt_ids IDS    start after these token ids (\"50256,464\")\n"
            "  --stop              end at the end-of-text token\n"
            "  --tokens N          tokens to generate (default 200)\n"
            "  --temperature X     divide the logits by X (default 0.8; 0: the likeliest token)\n"
            "  --top_k N           draw among the N likeliest tokens (default 200; 0: all)\n"
            "  --seed N            the draws' seed (default 1337)\n"
            "  --tokenizer FILE    the model's tokenizer, to encode --prompt and print text\n"
            "                      instead of token ids: Hugging Face's tokenizer.json, GPT-2's\n"
            "                      vocab.json (merges.txt beside it), a model's folder holding\n"
            "                      either, or llm.c's gpt2_tokenizer.bin (printing only)\n"
            "  --n_head N          heads, for a safetensors file without config.json beside it\n"
            "  --device NAME       cpu (default), cuda, cuda:N, emu\n"
            "  --dtype fp32|bf16   the precision of the matrix products (default fp32)\n"
            "  --no_cache          recompute the whole context for every token (slower; the\n"
            "                      same tokens)\n"
            "  --json              end with one JSON line: tokens, seconds, tokens per second\n"
            "  -h, --help          show this help\n");
}

typedef struct options {
    const char *model, *prompt, *prompt_ids, *tokenizer, *device, *dtype;
    int64_t tokens, top_k, seed, n_head;
    double temperature;
    bool no_cache, json, stop;
} options;

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.tokens = 200,
                   .top_k = 200,
                   .seed = 1337,
                   .temperature = 0.8,
                   .device = "cpu",
                   .dtype = "fp32"};
    static const struct option longopts[] = {{"prompt", required_argument, 0, 'p'},
                                             {"prompt_ids", required_argument, 0, 'i'},
                                             {"stop", no_argument, 0, 'S'},
                                             {"tokens", required_argument, 0, 'n'},
                                             {"temperature", required_argument, 0, 't'},
                                             {"top_k", required_argument, 0, 'k'},
                                             {"seed", required_argument, 0, 's'},
                                             {"tokenizer", required_argument, 0, 'T'},
                                             {"n_head", required_argument, 0, 'H'},
                                             {"device", required_argument, 0, 'd'},
                                             {"dtype", required_argument, 0, 'D'},
                                             {"no_cache", no_argument, 0, 'c'},
                                             {"json", no_argument, 0, 'j'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    bool ok = true;
    while (ok && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'p':
            o->prompt = optarg;
            break;
        case 'n':
            ok = run_int("gpt_generate", "--tokens", optarg, 0, 1 << 24, &o->tokens);
            break;
        case 't':
            ok =
                run_double("gpt_generate", "--temperature", optarg, 0, 100, false, &o->temperature);
            break;
        case 'k':
            ok = run_int("gpt_generate", "--top_k", optarg, 0, 1 << 24, &o->top_k);
            break;
        case 's':
            ok = run_int("gpt_generate", "--seed", optarg, 0, INT64_MAX, &o->seed);
            break;
        case 'T':
            o->tokenizer = optarg;
            break;
        case 'H':
            ok = run_int("gpt_generate", "--n_head", optarg, 1, 1 << 20, &o->n_head);
            break;
        case 'd':
            o->device = optarg;
            break;
        case 'D':
            o->dtype = optarg;
            break;
        case 'c':
            o->no_cache = true;
            break;
        case 'i':
            o->prompt_ids = optarg;
            break;
        case 'S':
            o->stop = true;
            break;
        case 'j':
            o->json = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            ok = false;
        }
    }
    if (!ok) {
        fprintf(stderr, "gpt_generate: see --help for the options\n");
        return -1;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "gpt_generate: %s\n",
                optind >= argc ? "which model? (gpt_generate MODEL; --help)"
                               : "one MODEL only (see --help)");
        return -1;
    }
    o->model = argv[optind];
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    cddp_device *dev;
    cddp_dtype compute;
    if (!run_device("gpt_generate", o.device, o.dtype, &dev, &compute)) return 2;
    cddp_error err = {0};
    cddp_model *m = NULL;
    cddp_ctx *ctx = NULL;
    text_vocab vocab = {0};
    int status = 1;
    cddp_gpt_config g = {.n_head = o.n_head};
    cddp_llama_config lc; /* a Llama (its config.json, or gpt_train --arch llama's checkpoint) */
    bool llama = cddp_llama_config_read(o.model, &lc, &(cddp_error){0}) == CDDP_OK;
    if (llama)
        g = (cddp_gpt_config){.vocab_size = lc.vocab_size,
                              .block_size = lc.max_positions,
                              .n_layer = lc.n_layer,
                              .n_head = lc.n_head,
                              .n_embd = lc.n_embd};
    else if (cddp_gpt_config_read(o.model, &g, &err) != CDDP_OK)
        goto fail;
    if (o.tokenizer && text_vocab_load(o.tokenizer, &vocab, &err) != CDDP_OK) goto fail;
    if (!(m = cddp_model_create_with(llama ? cddp_nn_llama(&lc) : cddp_nn_gpt(&g), &err)) ||
        cddp_model_build(m, 0) != CDDP_OK || cddp_model_to(m, dev, &err) != CDDP_OK)
        goto fail;
    if ((llama ? cddp_model_load_hf(m, o.model, &err) : cddp_gpt_load_weights(m, o.model, &err)) !=
        CDDP_OK)
        goto fail;
    if (!(ctx = cddp_ctx_create(&(cddp_ctx_options){.device = dev, .compute = compute}))) {
        cddp_error_set(&err, CDDP_ENOMEM, "out of memory");
        goto fail;
    }
    text_sample_options so = {.prompt = o.prompt,
                              .prompt_ids = o.prompt_ids,
                              .stop = o.stop,
                              .n = o.tokens,
                              .top_k = o.top_k,
                              .vocab_size = g.vocab_size,
                              .temperature = o.temperature,
                              .seed = (uint64_t)o.seed,
                              .no_cache = o.no_cache,
                              .vocab = o.tokenizer ? &vocab : NULL};
    double t0 = now_s();
    int64_t drawn = 0;
    if (text_sample(m, ctx, &so, stdout, &drawn, &err) != CDDP_OK) goto fail;
    double s = now_s() - t0;
    if (o.json)
        printf("{\"tokens\": %" PRId64 ", \"seconds\": %.4f, \"tokens_per_s\": %.1f, "
               "\"ms_per_token\": %.3f, \"cache\": %s, \"block_size\": %" PRId64
               ", \"n_layer\": %" PRId64 ", \"n_embd\": %" PRId64 "}\n",
               drawn, s, s > 0 ? (double)drawn / s : 0.0, drawn ? s * 1e3 / (double)drawn : 0.0,
               o.no_cache ? "false" : "true", g.block_size, g.n_layer, g.n_embd);
    status = 0;
    goto done;
fail:
    fflush(stdout);
    fprintf(stderr, "gpt_generate: %s\n", err.msg[0] ? err.msg : cddp_model_error(m));
done:
    cddp_ctx_destroy(ctx);
    cddp_model_destroy(m);
    text_vocab_free(&vocab);
    return status;
}
