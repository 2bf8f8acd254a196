/* cddp-ckpt: looks into a checkpoint, checks it, and writes the model's tensors alone.
 *
 *   cddp-ckpt show runs/gpt/checkpoint.safetensors
 *   cddp-ckpt verify runs/gpt/checkpoint.safetensors
 *   cddp-ckpt consolidate runs/gpt/checkpoint.safetensors model.safetensors
 *
 * A checkpoint is one safetensors file however many ranks wrote it (DistributedDataParallel's
 * rank 0 writes it; with the sharded optimizer the ranks gather the state first): the model's
 * tensors under their names, the optimizer's state as "optim.<state>.<name>", and metadata
 * (the optimizer, its steps, the run's position). consolidate keeps the model's tensors (and,
 * with --with_optimizer, the state), which PyTorch's load_state_dict(strict=True) takes.
 */
#include <cddp/cddp.h>

#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE "optim."

static void usage(FILE *out) {
    fprintf(out,
            "usage: cddp-ckpt show FILE\n"
            "       cddp-ckpt verify FILE\n"
            "       cddp-ckpt consolidate [--with_optimizer] FILE OUT\n"
            "Reads a cddp checkpoint (safetensors: the model's tensors, the optimizer's state as\n"
            "optim.<state>.<name>, metadata).\n\n"
            "  show         the metadata, the model's tensors and elements, the optimizer's state\n"
            "  verify       every tensor readable, every state tensor beside a model tensor of\n"
            "               its shape, the same parameters in every state, every number finite;\n"
            "               exits 1 naming each problem\n"
            "  consolidate  writes OUT with the model's tensors alone (PyTorch's state_dict, for\n"
            "               load_state_dict(strict=True)); --with_optimizer keeps the state too\n"
            "  -h, --help   show this help\n");
}

/* The metadata cddp writes: the checkpoint's, the optimizer's, the examples' run. */
static const char *const keys[] = {"cddp_format", "model",         "optimizer", "optimizer_steps",
                                   "lr",          "iter",          "epoch",     "world",
                                   "data_epoch",  "data_position", "n_layer",   "n_head",
                                   "n_embd",      "block_size",    "vocab_size"};
#define NKEYS (sizeof keys / sizeof keys[0])

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

static int show(const cddp_safetensors *f, const char *path) {
    int n = cddp_safetensors_count(f), nmodel = 0, nstate = 0;
    int64_t emodel = 0, estate = 0;
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = cddp_safetensors_at(f, i);
        if (is_state(t->name))
            nstate++, estate += numel(t);
        else
            nmodel++, emodel += numel(t);
    }
    printf("%s\n", path);
    for (size_t k = 0; k < NKEYS; k++) {
        const char *v = cddp_safetensors_meta(f, keys[k]);
        if (v) printf("  %-16s %s\n", keys[k], v);
    }
    printf("  model tensors    %d (%" PRId64 " elements)\n", nmodel, emodel);
    printf("  optimizer state  %d tensors (%" PRId64 " elements)\n", nstate, estate);
    return 0;
}

static int verify(const cddp_safetensors *f, const char *path) {
    int n = cddp_safetensors_count(f), bad = 0, kinds = 0;
    char seen_kind[4][32] = {{0}};
    int per_kind[4] = {0};
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = cddp_safetensors_at(f, i);
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
        const cddp_st_tensor *m = target ? cddp_safetensors_find(f, target) : NULL;
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
    if (kinds > 0 && !cddp_safetensors_meta(f, "optimizer"))
        bad++, fprintf(stderr,
                       "cddp-ckpt: %s: optimizer state but no 'optimizer' in the "
                       "metadata\n",
                       path);
    if (bad) return 1;
    printf("ok: %s: %d tensors, %d optimizer state%s over %d tensors, every number finite\n", path,
           n, kinds, kinds == 1 ? "" : "s", kinds ? per_kind[0] : 0);
    return 0;
}

static int consolidate(const cddp_safetensors *f, const char *out, bool with_optimizer) {
    int n = cddp_safetensors_count(f), k = 0;
    cddp_st_tensor *list = calloc((size_t)(n ? n : 1), sizeof *list);
    if (!list) {
        fprintf(stderr, "cddp-ckpt: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const cddp_st_tensor *t = cddp_safetensors_at(f, i);
        if (with_optimizer || !is_state(t->name)) list[k++] = *t;
    }
    /* PyTorch's mark; with the state, the optimizer's metadata (and the run's) as well. */
    const char *meta[2 * NKEYS + 3] = {"format", "pt"};
    int nm = 2;
    for (size_t i = 0; i < NKEYS && with_optimizer; i++) {
        const char *v = cddp_safetensors_meta(f, keys[i]);
        if (v) meta[nm++] = keys[i], meta[nm++] = v;
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

int main(int argc, char **argv) {
    bool with_optimizer = false;
    static const struct option longopts[] = {
        {"with_optimizer", no_argument, 0, 'w'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'w') {
            with_optimizer = true;
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
    bool known = (!strcmp(cmd, "show") || !strcmp(cmd, "verify")) ? left == 2
                 : !strcmp(cmd, "consolidate")                    ? left == 3
                                                                  : false;
    if (!known) {
        usage(stderr);
        return 2;
    }
    if (with_optimizer && strcmp(cmd, "consolidate") != 0) {
        fprintf(stderr, "cddp-ckpt: --with_optimizer goes with consolidate\n");
        return 2;
    }
    const char *path = argv[optind + 1];
    cddp_error err = {0};
    cddp_safetensors *f = cddp_safetensors_read(path, &err);
    if (!f) {
        fprintf(stderr, "cddp-ckpt: %s\n", err.msg);
        return 1;
    }
    int rc = !strcmp(cmd, "show")     ? show(f, path)
             : !strcmp(cmd, "verify") ? verify(f, path)
                                      : consolidate(f, argv[optind + 2], with_optimizer);
    cddp_safetensors_destroy(f);
    return rc;
}
