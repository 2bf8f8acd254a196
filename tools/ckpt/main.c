/* cddp-ckpt: looks into a checkpoint, checks it, and writes the model's tensors alone.
 *
 *   cddp-ckpt show runs/gpt/checkpoint.safetensors
 *   cddp-ckpt verify runs/gpt/checkpoints
 *   cddp-ckpt consolidate runs/gpt/checkpoints/step-00000500 model.safetensors
 *   cddp-ckpt export-hf --tokenizer gpt2 runs/gpt/checkpoint.safetensors my-gpt2
 *
 * A checkpoint is one safetensors file (rank 0 writes it: the model's tensors under their names,
 * the optimizer's state as "optim.<state>.<name>", and metadata: the optimizer, its steps, the
 * run's position), or a set (cddp/checkpoint.h: one shard per rank and a manifest), or a folder
 * of sets (its newest complete one). A set is read into the same view as a file: its parameters
 * and state under their names, its buffers, its tied names, its manifest's metadata; verify
 * also checks each shard's checksum. consolidate keeps the model's tensors (and, with
 * --with_optimizer, the state), which PyTorch's load_state_dict(strict=True) takes. export-hf
 * writes a GPT as Hugging Face's GPT2LMHeadModel saves one (cddp_gpt_export_hf), with the
 * tokenizer's files beside it, for transformers' from_pretrained.
 */
#include <cddp/cddp.h>

#include <getopt.h>
#include <libgen.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STATE "optim."

static void usage(FILE *out) {
    fprintf(out,
            "usage: cddp-ckpt show PATH\n"
            "       cddp-ckpt verify PATH\n"
            "       cddp-ckpt consolidate [--with_optimizer] PATH OUT\n"
            "       cddp-ckpt export-hf [--dtype f32|bf16|f16] [--tokenizer FILE] PATH OUTDIR\n"
            "Reads a cddp checkpoint: a safetensors file (the model's tensors, the optimizer's\n"
            "state as optim.<state>.<name>, metadata), a set (a folder with one shard per rank\n"
            "and manifest.safetensors), or a folder of sets (its newest complete one).\n\n"
            "  show         the metadata, the model's tensors and elements, the optimizer's state\n"
            "               (and a set's folder, shards and commit number)\n"
            "  verify       every tensor readable, every state tensor beside a model tensor of\n"
            "               its shape, the same parameters in every state, every number finite,\n"
            "               a set's every shard with its size and checksum; exits 1 naming each\n"
            "               problem\n"
            "  consolidate  writes OUT, one file with the model's tensors alone (PyTorch's\n"
            "               state_dict, for load_state_dict(strict=True)); --with_optimizer keeps\n"
            "               the state too\n"
            "  export-hf    writes a GPT's checkpoint as Hugging Face's GPT2LMHeadModel saves\n"
            "               one (a Llama's as LlamaForCausalLM does):\n"
            "               OUTDIR/model.safetensors (--dtype, default f32) and\n"
            "               OUTDIR/config.json, which transformers' from_pretrained(OUTDIR)\n"
            "               loads; --tokenizer (a tokenizer.json, vocab.json or a folder) puts\n"
            "               its files beside them and its tokens in config.json\n"
            "  -h, --help   show this help\n");
}

/* The metadata cddp writes: the checkpoint's, the optimizer's, the examples' run. */
static const char *const keys[] = {
    "cddp_format", "model",      "optimizer",  "optimizer_steps", "lr",        "iter",
    "epoch",       "world",      "data_epoch", "data_position",   "n_layer",   "n_head",
    "n_embd",      "block_size", "vocab_size", "run_id",          "zero_stage"};
#define NKEYS (sizeof keys / sizeof keys[0])

/* A checkpoint as named tensors and metadata, whether a file or a set. */
typedef struct view {
    cddp_st_tensor *t;
    int n;
    const cddp_safetensors *meta;
    cddp_safetensors *file;
    cddp_ckpt_set *set;
    float *blocks; /* a set's parameters, then each state, read whole */
    char **names;
} view;

static const cddp_st_tensor *find(const view *v, const char *name) {
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->t[i].name, name) == 0) return &v->t[i];
    return NULL;
}

static int64_t numel(const cddp_st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

static bool is_state(const char *name) {
    return strncmp(name, STATE, strlen(STATE)) == 0;
}

/* The model tensor a state tensor belongs to ("optim.exp_avg.fc1.weight" -> "fc1.weight"), and
 * the state's name in kind (up to cap bytes). */
static const char *state_target(const char *name, char *kind, size_t cap) {
    const char *rest = name + strlen(STATE), *dot = strchr(rest, '.');
    if (!dot) return NULL;
    snprintf(kind, cap, "%.*s", (int)(dot - rest), rest);
    return dot + 1;
}

static int show(const view *v, const char *path) {
    int n = v->n, nmodel = 0, nstate = 0;
    int64_t emodel = 0, estate = 0;
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = &v->t[i];
        if (is_state(t->name))
            nstate++, estate += numel(t);
        else
            nmodel++, emodel += numel(t);
    }
    printf("%s\n", path);
    if (v->set)
        printf("  %-16s %s: %d shard%s, step %s, commit %s\n", "set", cddp_ckpt_set_dir(v->set),
               cddp_ckpt_set_world(v->set), cddp_ckpt_set_world(v->set) == 1 ? "" : "s",
               cddp_safetensors_meta(v->meta, "cddp_step"),
               cddp_safetensors_meta(v->meta, "cddp_seq"));
    for (size_t k = 0; k < NKEYS; k++) {
        const char *value = cddp_safetensors_meta(v->meta, keys[k]);
        if (value) printf("  %-16s %s\n", keys[k], value);
    }
    printf("  model tensors    %d (%" PRId64 " elements)\n", nmodel, emodel);
    printf("  optimizer state  %d tensors (%" PRId64 " elements)\n", nstate, estate);
    return 0;
}

static int verify(const view *v, const char *path) {
    int n = v->n, bad = 0, kinds = 0;
    char seen_kind[4][32] = {{0}};
    int per_kind[4] = {0};
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = &v->t[i];
        if (t->dtype == CDDP_F32) {
            const float *x = t->data;
            int64_t nonfinite = 0;
            for (int64_t e = 0; e < numel(t); e++) nonfinite += !isfinite(x[e]);
            if (nonfinite)
                bad++, fprintf(stderr,
                               "cddp-ckpt: %s: '%s' holds %" PRId64 " NaN or infinite "
                               "values\n",
                               path, t->name, nonfinite);
        }
        if (!is_state(t->name)) continue;
        char kind[32];
        const char *target = state_target(t->name, kind, sizeof kind);
        const cddp_st_tensor *m = target ? find(v, target) : NULL;
        if (!m || is_state(m->name)) {
            bad++, fprintf(stderr, "cddp-ckpt: %s: '%s' is the state of no model tensor\n", path,
                           t->name);
            continue;
        }
        if (m->ndim != t->ndim || memcmp(m->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim))
            bad++, fprintf(stderr, "cddp-ckpt: %s: '%s' has another shape than '%s'\n", path,
                           t->name, m->name);
        int k = 0;
        while (k < kinds && strcmp(seen_kind[k], kind) != 0) k++;
        if (k == kinds && kinds < 4) snprintf(seen_kind[kinds++], sizeof seen_kind[0], "%s", kind);
        if (k < 4) per_kind[k]++;
    }
    for (int k = 1; k < kinds; k++)
        if (per_kind[k] != per_kind[0])
            bad++, fprintf(stderr,
                           "cddp-ckpt: %s: the optimizer's %s covers %d tensors but its "
                           "%s %d\n",
                           path, seen_kind[0], per_kind[0], seen_kind[k], per_kind[k]);
    cddp_error err = {0};
    if (v->set && cddp_ckpt_set_verify(v->set, &err) != CDDP_OK)
        bad++, fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
    if (kinds > 0 && !cddp_safetensors_meta(v->meta, "optimizer"))
        bad++, fprintf(stderr,
                       "cddp-ckpt: %s: optimizer state but no 'optimizer' in the "
                       "metadata\n",
                       path);
    if (bad) return 1;
    printf("ok: %s: %d tensors, %d optimizer state%s over %d tensors, every number finite%s\n",
           path, n, kinds, kinds == 1 ? "" : "s", kinds ? per_kind[0] : 0,
           v->set ? ", every shard's checksum right" : "");
    return 0;
}

static int consolidate(const view *v, const char *out, bool with_optimizer) {
    int n = v->n, k = 0;
    cddp_st_tensor *list = calloc((size_t)(n ? n : 1), sizeof *list);
    if (!list) {
        fprintf(stderr, "cddp-ckpt: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = &v->t[i];
        if (with_optimizer || !is_state(t->name)) list[k++] = *t;
    }
    /* PyTorch's mark; with the state, the optimizer's metadata (and the run's) as well. */
    const char *meta[2 * NKEYS + 3] = {"format", "pt"};
    int nm = 2;
    for (size_t i = 0; i < NKEYS && with_optimizer; i++) {
        const char *value = cddp_safetensors_meta(v->meta, keys[i]);
        if (value) meta[nm++] = keys[i], meta[nm++] = value;
    }
    meta[nm] = NULL;
    cddp_error err = {0};
    int rc = cddp_safetensors_write(out, list, k, meta, &err);
    free(list);
    if (rc != CDDP_OK) {
        fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %d tensors%s\n", out, k,
           with_optimizer ? " (with the optimizer's state)" : "");
    return 0;
}

/* from into to, whole; 0, or 1 after saying why. */
static int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[65536];
    size_t n;
    bool ok = out != NULL;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = false;
    if (!ok) fprintf(stderr, "cddp-ckpt: export-hf: cannot copy %s to %s\n", from, to);
    return ok ? 0 : 1;
}

/* The tokenizer's files into dir under the names transformers looks for: path itself (a
 * tokenizer.json of any name, or a vocab.json with the merges.txt beside it) or, a folder, the
 * tokenizer files it holds; and the tokenizer_config.json and special_tokens_map.json beside. */
static int copy_tokenizer(const char *path, const char *dir, int *copied) {
    static const char *const names[] = {"tokenizer.json", "vocab.json", "merges.txt",
                                        "tokenizer_config.json", "special_tokens_map.json"};
    char from[4200], to[4200], folder[4096], base[4096];
    struct stat st;
    bool is_folder = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(folder, sizeof folder, "%s", path);
    snprintf(base, sizeof base, "%s", path);
    if (!is_folder) snprintf(folder, sizeof folder, "%s", dirname(folder));
    const char *file = is_folder ? NULL : basename(base);
    bool gpt2 = file && strlen(file) >= 10 && !strcmp(file + strlen(file) - 10, "vocab.json");
    *copied = 0;
    if (file) { /* the file given, under its usual name */
        snprintf(to, sizeof to, "%s/%s", dir, gpt2 ? "vocab.json" : "tokenizer.json");
        if (copy_file(path, to)) return 1;
        ++*copied;
    }
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        if (file && k < 2) continue;           /* the file given stands for these */
        if (file && !gpt2 && k == 2) continue; /* merges.txt goes with vocab.json */
        snprintf(from, sizeof from, "%s/%s", folder, names[k]);
        snprintf(to, sizeof to, "%s/%s", dir, names[k]);
        if (stat(from, &st) != 0) continue;
        if (copy_file(from, to)) return 1;
        ++*copied;
    }
    return 0;
}

static int export_hf(const char *path, const char *dir, const char *dtype, const char *tokenizer) {
    cddp_dtype dt = !strcmp(dtype, "f32") || !strcmp(dtype, "fp32")   ? CDDP_F32
                    : !strcmp(dtype, "bf16")                          ? CDDP_BF16
                    : !strcmp(dtype, "f16") || !strcmp(dtype, "fp16") ? CDDP_F16
                                                                      : CDDP_I32;
    if (dt == CDDP_I32) {
        fprintf(stderr, "cddp-ckpt: export-hf: --dtype %s: f32, bf16 or f16\n", dtype);
        return 2;
    }
    cddp_error err = {0};
    char at[4096], real_at[4096], real_dir[4096];
    cddp_gpt_config g = {0};
    cddp_model *m = NULL;
    cddp_tokenizer *tok = NULL;
    int64_t bos = -1, eos = -1;
    int rc = cddp_checkpoint_resolve(path, at, sizeof at, &err);
    if (!rc && realpath(at, real_at) && realpath(dir, real_dir) &&
        !strncmp(real_dir, real_at, strlen(real_at)))
        rc = cddp_error_set(&err, CDDP_EINVAL,
                            "export-hf: %s is inside the checkpoint %s: "
                            "choose another OUTDIR",
                            dir, at);
    cddp_llama_config lc; /* a Llama's checkpoint (gpt_train --arch llama), else a GPT's */
    bool llama = !rc && cddp_llama_config_read(at, &lc, &(cddp_error){0}) == CDDP_OK;
    if (llama)
        g = (cddp_gpt_config){
            .vocab_size = lc.vocab_size, .n_layer = lc.n_layer, .n_embd = lc.n_embd};
    else if (!rc)
        rc = cddp_gpt_config_read(at, &g, &err);
    if (!rc && !(m = cddp_model_create_with(llama ? cddp_nn_llama(&lc) : cddp_nn_gpt(&g), &err)))
        rc = err.code;
    if (!rc && cddp_model_build(m, 0) != CDDP_OK)
        rc = cddp_error_set(&err, CDDP_EINVAL, "%s", cddp_model_error(m));
    if (!rc)
        rc = llama ? cddp_checkpoint_load(at, m, NULL, NULL, &err)
                   : cddp_gpt_load_weights(m, at, &err);
    if (!rc && tokenizer && !(tok = cddp_tokenizer_load(tokenizer, &err))) rc = err.code;
    if (!rc && tok && cddp_tokenizer_vocab_size(tok) > g.vocab_size)
        rc = cddp_error_set(&err, CDDP_EINVAL,
                            "export-hf: the tokenizer %s has %" PRId64 " tokens, more than the "
                            "model's vocabulary of %" PRId64 ": not this model's tokenizer",
                            tokenizer, cddp_tokenizer_vocab_size(tok), g.vocab_size);
    if (tok) {
        bos = cddp_tokenizer_bos(tok);
        eos = cddp_tokenizer_eos(tok);
    }
    if (!rc && llama) {
        rc = cddp_model_save_hf(m, dir, dt, &err);
        if (!rc) rc = cddp_llama_config_write(&lc, dir, dt, &err);
    } else if (!rc) {
        rc = cddp_gpt_export_hf(m, dir, dt, bos, eos, &err);
    }
    cddp_tokenizer_destroy(tok);
    cddp_model_destroy(m);
    if (rc) {
        fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
        return 1;
    }
    int copied = 0;
    if (tokenizer && copy_tokenizer(tokenizer, dir, &copied)) return 1;
    printf("wrote %s/model.safetensors (%s, %" PRId64 " layers, width %" PRId64
           ", vocabulary %" PRId64
           ") and %s/config.json%s%s: transformers' %s.from_pretrained(\"%s\") loads it\n",
           dir, cddp_dtype_name(dt), g.n_layer, g.n_embd, g.vocab_size, dir,
           copied ? ", with the tokenizer's files" : "",
           tokenizer && !copied ? " (no tokenizer file copied)" : "",
           llama ? "LlamaForCausalLM" : "GPT2LMHeadModel", dir);
    return 0;
}

/* consolidate never writes over what it reads, nor over a training checkpoint (a file with
 * optimizer state): it would leave the weights alone where the run's state was. 0, or 1 after
 * saying why. */
static int check_out(const char *in, const char *out) {
    struct stat a, b;
    bool exists = stat(out, &b) == 0;
    char rin[4096], rdir[4096], dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    const char *why = NULL;
    if (exists && S_ISDIR(b.st_mode))
        why = "is a folder: give the file to write";
    else if (exists && stat(in, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        why = "is the checkpoint it reads";
    else if (realpath(in, rin) && realpath(dirname(dir), rdir) &&
             !strncmp(rdir, rin, strlen(rin)) && (!rdir[strlen(rin)] || rdir[strlen(rin)] == '/'))
        why = "is inside the checkpoint it reads";
    cddp_error err = {0};
    cddp_safetensors *f = why || !exists ? NULL : cddp_safetensors_read(out, &err);
    for (int i = 0; f && !why && i < cddp_safetensors_count(f); i++)
        if (is_state(cddp_safetensors_at(f, i)->name))
            why = "is a training checkpoint (it holds optimizer state): writing the weights alone "
                  "over it would lose that state";
    cddp_safetensors_destroy(f);
    if (!why) return 0;
    fprintf(stderr, "cddp-ckpt: consolidate: %s %s; choose another OUT\n", out, why);
    return 1;
}

static void close_view(view *v) {
    for (int i = 0; v->names && i < v->n; i++) free(v->names[i]);
    free(v->names);
    free(v->t);
    free(v->blocks);
    cddp_ckpt_set_close(v->set);
    cddp_safetensors_destroy(v->file);
}

/* "optim.<state>.<param>" (state NULL: param alone), allocated. */
static char *file_name(const char *state, const char *param) {
    size_t n = strlen(STATE) + (state ? strlen(state) : 0) + strlen(param) + 2;
    char *s = malloc(n);
    if (s && state)
        snprintf(s, n, STATE "%s.%s", state, param);
    else if (s)
        snprintf(s, n, "%s", param);
    return s;
}

/* Appends parameter j of the set with its data in block (the parameters' or a state's): under
 * "optim.<state>.<name>" with a state, under alias (a tied name) with one, else its own name. */
static int add(view *v, int j, const float *block, const char *state, const char *alias) {
    int64_t off = 0;
    cddp_st_tensor *t = &v->t[v->n];
    *t = *cddp_ckpt_set_param(v->set, j, &off);
    t->data = block + off;
    if (state || alias) {
        t->name = v->names[v->n] = file_name(state, state || !alias ? t->name : alias);
        if (!t->name) {
            fprintf(stderr, "cddp-ckpt: out of memory\n");
            return 1;
        }
    }
    v->n++;
    return 0;
}

/* A set's tensors under a file's names: parameters (and their tied names), buffers, states. */
static int set_view(view *v) {
    cddp_ckpt_set *s = v->set;
    int np = cddp_ckpt_set_num_params(s), nt = cddp_ckpt_set_num_ties(s);
    int ns = cddp_ckpt_set_num_states(s), nb = cddp_safetensors_count(v->meta);
    int64_t total = cddp_ckpt_set_numel(s);
    size_t cap = (size_t)(np * (1 + ns) + nt + nb + 1);
    cddp_error err = {0};
    v->t = calloc(cap, sizeof *v->t);
    v->names = calloc(cap, sizeof *v->names);
    v->blocks = malloc(sizeof(float) * (size_t)(total * (1 + ns) + 1));
    if (!v->t || !v->names || !v->blocks) {
        fprintf(stderr, "cddp-ckpt: out of memory for %s\n", cddp_ckpt_set_dir(s));
        return 1;
    }
    for (int b = 0; b <= ns; b++)
        if (cddp_ckpt_set_read(s, b ? cddp_ckpt_set_state(s, b - 1) : NULL, 0, total,
                               v->blocks + total * b, &err) != CDDP_OK) {
            fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
            return 1;
        }
    int rc = 0;
    for (int i = 0; i < np && !rc; i++) rc = add(v, i, v->blocks, NULL, NULL); /* parameters */
    for (int k = 0; k < nt && !rc; k++) { /* a tied parameter under its second name too */
        const char *param, *name = cddp_ckpt_set_tie(s, k, &param);
        int j = 0;
        while (j < np && strcmp(cddp_ckpt_set_param(s, j, NULL)->name, param)) j++;
        if (j == np) {
            fprintf(stderr, "cddp-ckpt: %s: '%s' is tied to '%s', which is no parameter\n",
                    cddp_ckpt_set_dir(s), name, param);
            return 1;
        }
        rc = add(v, j, v->blocks, NULL, name);
    }
    for (int b = 1; b <= ns && !rc; b++) /* each state, as optim.<state>.<name> */
        for (int i = 0; i < np && !rc; i++)
            rc = add(v, i, v->blocks + total * b, cddp_ckpt_set_state(s, b - 1), NULL);
    if (rc) return rc;
    for (int i = 0; i < nb; i++) v->t[v->n++] = *cddp_safetensors_at(v->meta, i);
    return 0;
}

static int open_view(view *v, const char *path) {
    cddp_error err = {0};
    char at[4096];
    if (cddp_checkpoint_resolve(path, at, sizeof at, &err) != CDDP_OK) {
        fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
        return 1;
    }
    struct stat st;
    if (stat(at, &st) != 0 || !S_ISDIR(st.st_mode)) {
        if (!(v->file = cddp_safetensors_read(at, &err))) {
            fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
            return 1;
        }
        v->meta = v->file;
        v->n = cddp_safetensors_count(v->file);
        if (!(v->t = calloc((size_t)v->n + 1, sizeof *v->t))) return 1;
        for (int i = 0; i < v->n; i++) v->t[i] = *cddp_safetensors_at(v->file, i);
        return 0;
    }
    if (!(v->set = cddp_ckpt_set_open(at, &err))) {
        fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
        return 1;
    }
    v->meta = cddp_ckpt_set_manifest(v->set);
    return set_view(v);
}

int main(int argc, char **argv) {
    bool with_optimizer = false;
    const char *dtype = NULL, *tokenizer = NULL;
    static const struct option longopts[] = {{"with_optimizer", no_argument, 0, 'w'},
                                             {"dtype", required_argument, 0, 'd'},
                                             {"tokenizer", required_argument, 0, 't'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'w') {
            with_optimizer = true;
        } else if (c == 'd') {
            dtype = optarg;
        } else if (c == 't') {
            tokenizer = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    int left = argc - optind;
    const char *cmd = left > 0 ? argv[optind] : "";
    bool known = (!strcmp(cmd, "show") || !strcmp(cmd, "verify"))           ? left == 2
                 : !strcmp(cmd, "consolidate") || !strcmp(cmd, "export-hf") ? left == 3
                                                                            : false;
    if (!known) {
        usage(stderr);
        return 2;
    }
    if (with_optimizer && strcmp(cmd, "consolidate") != 0) {
        fprintf(stderr, "cddp-ckpt: --with_optimizer goes with consolidate\n");
        return 2;
    }
    if ((dtype || tokenizer) && strcmp(cmd, "export-hf") != 0) {
        fprintf(stderr, "cddp-ckpt: --dtype and --tokenizer go with export-hf\n");
        return 2;
    }
    const char *path = argv[optind + 1];
    if (!strcmp(cmd, "export-hf"))
        return export_hf(path, argv[optind + 2], dtype ? dtype : "f32", tokenizer);
    if (!strcmp(cmd, "consolidate") && check_out(path, argv[optind + 2])) return 1;
    view v = {0};
    if (open_view(&v, path) != 0) {
        close_view(&v); /* what it opened before it failed */
        return 1;
    }
    int rc = !strcmp(cmd, "show")     ? show(&v, path)
             : !strcmp(cmd, "verify") ? verify(&v, path)
                                      : consolidate(&v, argv[optind + 2], with_optimizer);
    close_view(&v);
    return rc;
}
