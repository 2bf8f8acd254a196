/* run.c: the examples' run helpers (see run.h). */
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int run_make_dirs(const char *path, cddp_error *err) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return cddp_error_set(err, CDDP_EIO, "cannot create %s: %s", buf, strerror(errno));
            if (!(*p = c)) break;
        }
    }
    return CDDP_OK;
}

int run_check_writable(const char *what, const char *path, cddp_error *err) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s.tmp.check.%d", path, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return cddp_error_set(err, CDDP_EIO,
                              "%s %s: cannot write there: %s (found before training)", what, path,
                              strerror(errno));
    close(fd);
    unlink(probe);
    return CDDP_OK;
}

int run_rng_gather(cddp_comm *group, const cddp_rng *mine, run_rng_meta *keep, const char **meta,
                   int *n, cddp_error *err) {
    int world = cddp_comm_size(group);
    uint64_t *all = malloc(sizeof mine->s * (size_t)world);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = cddp_comm_allgather(group, mine->s, all, 4, CDDP_COMM_I64, -1, err);
    for (int r = 0; rc == CDDP_OK && r < world && r < RUN_MAX_RNG; r++) {
        for (int i = 0; i < 4; i++)
            snprintf(keep->hex[r] + 16 * i, 17, "%016" PRIx64, all[4 * r + i]);
        snprintf(keep->key[r], sizeof keep->key[r], "rng.%d", r);
        meta[(*n)++] = keep->key[r];
        meta[(*n)++] = keep->hex[r];
    }
    free(all);
    return rc;
}

int run_rng_restore(const cddp_safetensors *f, const char *path, int rank, cddp_rng *rng,
                    cddp_error *err) {
    char key[32];
    snprintf(key, sizeof key, "rng.%d", rank);
    const char *hex = cddp_safetensors_meta(f, key);
    if (!hex) return CDDP_OK; /* a rank the run did not have: its own seed */
    uint64_t s[4] = {0};
    bool ok = strlen(hex) == 64 && strspn(hex, "0123456789abcdef") == 64;
    for (int i = 0; ok && i < 4; i++) {
        char part[17];
        memcpy(part, hex + 16 * i, 16);
        part[16] = '\0';
        s[i] = strtoull(part, NULL, 16);
    }
    if (!ok || !(s[0] | s[1] | s[2] | s[3])) /* an all-zero state never leaves zero */
        return cddp_error_set(err, CDDP_EFORMAT,
                              "%s: metadata %s is '%.80s', not a generator's state (64 hex digits, "
                              "not all zero): a damaged checkpoint?",
                              path, key, hex);
    memcpy(rng->s, s, sizeof s);
    return CDDP_OK;
}

const char *run_job_id(void) {
    static char id[160];
    const char *run = getenv(CDDP_ENV_RUN_ID), *slurm = getenv("SLURM_JOB_ID");
    if (run && *run)
        snprintf(id, sizeof id, "%s", run);
    else if (slurm && *slurm)
        snprintf(id, sizeof id, "slurm-%s", slurm);
    else
        id[0] = '\0';
    return id;
}

/* Whether the variable holds a count above 0. */
static bool counts(const char *name) {
    const char *v = getenv(name);
    return v && strtol(v, NULL, 10) > 0;
}

int run_restart_from(cddp_comm *group, const char *prog, const char *out, char *buf, size_t cap,
                     const char **resume, const char **init_from, cddp_error *err) {
    if (*resume) return CDDP_OK;
    /* rank 0's answer as int32 words: whether to resume, then the path */
    int32_t msg[1 + 4096 / sizeof(int32_t)] = {0};
    char *path = (char *)(msg + 1);
    if (cddp_comm_rank(group) == 0) {
        cddp_error e = {0};
        cddp_safetensors *f = cddp_checkpoint_resolve(out, path, 4096, &e) == CDDP_OK
                                  ? cddp_checkpoint_metadata(path, &e)
                                  : NULL; /* nothing there (or nothing complete) */
        const char *job = run_job_id(), *id = f ? cddp_safetensors_meta(f, "run_id") : NULL;
        bool restart = counts(CDDP_ENV_RESTART_COUNT) || counts("SLURM_RESTART_COUNT");
        if (f && restart && *job && id && !strcmp(id, job)) {
            msg[0] = 1;
            const char *n = getenv(CDDP_ENV_RESTART_COUNT);
            printf("restart %s of job %s: on from its checkpoint %s\n",
                   counts(CDDP_ENV_RESTART_COUNT) ? n : getenv("SLURM_RESTART_COUNT"), job, path);
        } else if (f)
            fprintf(stderr,
                    "%s: %s holds the checkpoint of %s%s: this run replaces it at its first save "
                    "(--resume %s continues it instead)\n",
                    prog, path, id ? "run " : "an earlier run", id ? id : "", out);
        cddp_safetensors_destroy(f);
    }
    CDDP_TRY(cddp_comm_broadcast(group, msg, (int64_t)(sizeof msg / sizeof msg[0]), CDDP_COMM_I32,
                                 0, -1, err));
    if (!msg[0]) return CDDP_OK;
    path[4095] = '\0';
    if (strlen(path) >= cap) return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", path);
    snprintf(buf, cap, "%s", path);
    *resume = buf;
    *init_from = NULL;
    return CDDP_OK;
}

void run_stop_watch(const char *prog) {
    cddp_error err = {0};
    if (cddp_stop_watch(&err) != CDDP_OK) fprintf(stderr, "%s: %s\n", prog, err.msg);
}

int run_stopped(const cddp_ddp *ddp, int sig, const char *after, const char *ckpt) {
    cddp_ddp_print0(ddp, "stopped by SIG%s after %s: %s%s\n", sigabbrev_np(sig), after,
                    ckpt ? "--resume continues from " : "nothing saved (--out none)",
                    ckpt ? ckpt : "");
    return 128 + sig;
}

int run_group(cddp_comm **group, int *rank, int *world, cddp_error *err) {
    if (!(*group = cddp_comm_create(NULL, err))) return err->code;
    *rank = cddp_comm_rank(*group);
    *world = cddp_comm_size(*group);
    return CDDP_OK;
}

int run_exit(const char *prog, int rc, int stopped, const cddp_error *err) {
    if (rc) fprintf(stderr, "%s: %s\n", prog, cddp_error_msg(err));
    return rc ? 1 : stopped >= 0 ? stopped : 0;
}

/* One table option's value, checked and stored; false when it is not one. */
static bool store_value(const char *prog, const run_opt *r, const char *arg) {
    char what[80];
    snprintf(what, sizeof what, "--%s", r->name);
    int64_t i;
    double x;
    int64_t hi = r->hi >= (double)INT64_MAX ? INT64_MAX : (int64_t)r->hi;
    switch (r->kind) {
    case 's':
        *(const char **)r->at = arg;
        return true;
    case 'b':
        *(bool *)r->at = true;
        return true;
    case 'c':
        *(const char **)r->at = r->value;
        return true;
    case 't':
        return run_transport(prog, arg, (const char **)r->at);
    case 'i':
        return run_int(prog, what, arg, (int64_t)r->lo, hi, (int64_t *)r->at);
    case 'n':
        if (!run_int(prog, what, arg, (int64_t)r->lo, hi, &i)) return false;
        *(int *)r->at = (int)i;
        return true;
    case 'f':
        return run_double(prog, what, arg, r->lo, r->hi, r->lo_open, (double *)r->at);
    default: /* 'g' */
        if (!run_double(prog, what, arg, r->lo, r->hi, r->lo_open, &x)) return false;
        *(float *)r->at = (float)x;
        return true;
    }
}

int run_parse(const char *prog, int argc, char **argv, const run_opt *opts, int n,
              bool (*own)(void *user, int code, const char *arg, int argc, char **argv), void *user,
              void (*usage)(FILE *out)) {
    struct option *longopts = cddp_calloc((size_t)(2 * n + 2), sizeof *longopts);
    if (!longopts) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return -1;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        char kind = opts[i].kind;
        int has = kind == 'b' || kind == 'c' ? no_argument
                  : kind == 'z'              ? optional_argument
                  : kind                     ? required_argument
                                             : opts[i].has_arg;
        longopts[k++] = (struct option){opts[i].name, has, 0, i};
        if (opts[i].alias) longopts[k++] = (struct option){opts[i].alias, has, 0, i};
    }
    longopts[k++] = (struct option){"help", no_argument, 0, n};
    int c, rc = 0;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == n || (c == 'h' && c > n)) { /* --help, -h */
            usage(stdout);
            exit(0);
        }
        if (c < 0 || c >= n) {
            fprintf(stderr, "%s: see --help for the options\n", prog);
            rc = -1;
            break;
        }
        const run_opt *r = &opts[c];
        bool ok = r->kind == 'z' ? run_zero(prog, optarg, argc, argv, (int *)r->at)
                  : r->kind      ? store_value(prog, r, optarg)
                                 : own(user, r->code, optarg, argc, argv);
        if (!ok) rc = -1;
        if (ok && r->given) *r->given = true;
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        rc = -1;
    }
    cddp_free(longopts);
    return rc;
}

bool run_zero(const char *prog, const char *optarg_, int argc, char **argv, int *stage) {
    const char *text = optarg_;
    if (!text && optind < argc && argv[optind][0] >= '0' && argv[optind][0] <= '9')
        text = argv[optind++];
    if (!text) {
        *stage = 1;
        return true;
    }
    if (!strcmp(text, "3")) {
        fprintf(stderr,
                "%s: --zero 3 (the parameters sharded too, FSDP) is not available yet: 1 shards "
                "the optimizer state, 2 the gradients too\n",
                prog);
        return false;
    }
    int64_t v;
    if (!run_int(prog, "--zero", text, 0, 2, &v)) return false;
    *stage = (int)v;
    return true;
}

void run_zero_options(int stage, cddp_ddp_options *o) {
    o->shard_optimizer = stage >= 1;
    o->shard_gradients = stage >= 2;
}

static double mib(size_t bytes) {
    return (double)bytes / (1024.0 * 1024.0);
}

void run_memory_line(const char *prog, const cddp_ddp *ddp, const cddp_optim *opt) {
    cddp_ddp_memory m = cddp_ddp_memory_get(ddp, opt);
    static const char *grads[] = {"", "", " (ZeRO-2: its shard)"},
                      *state[] = {"", " (ZeRO-1: its shard)", " (its shard)"};
    fprintf(stderr,
            "%s: rank %d holds parameters %.1f MiB, gradients %.1f MiB%s, optimizer state %.1f "
            "MiB%s; peak resident %.1f MiB\n",
            prog, cddp_ddp_rank(ddp), mib(m.params), mib(m.grads), grads[m.stage], mib(m.optimizer),
            state[m.stage], mib(m.peak_rss));
}

int run_memory_json(char *buf, size_t cap, const cddp_ddp *ddp, const cddp_optim *opt) {
    cddp_ddp_memory m = cddp_ddp_memory_get(ddp, opt);
    return snprintf(buf, cap,
                    "\"zero_stage\": %d, \"param_bytes\": %zu, \"grad_bytes\": %zu, "
                    "\"optim_state_bytes\": %zu, \"peak_rss_bytes\": %zu",
                    m.stage, m.params, m.grads, m.optimizer, m.peak_rss);
}

bool run_int(const char *prog, const char *what, const char *text, int64_t lo, int64_t hi,
             int64_t *out) {
    cddp_error err = {0};
    if (cddp_parse_int(what, text, lo, hi, out, &err) == CDDP_OK) return true;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return false;
}

bool run_double(const char *prog, const char *what, const char *text, double lo, double hi,
                bool lo_open, double *out) {
    cddp_error err = {0};
    if (cddp_parse_double(what, text, lo, hi, lo_open, out, &err) == CDDP_OK) return true;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return false;
}

int run_meta_int(const cddp_safetensors *f, const char *path, const char *key, int64_t lo,
                 int64_t hi, int64_t dflt, int64_t *out, cddp_error *err) {
    const char *v = cddp_safetensors_meta(f, key);
    *out = dflt;
    if (!v) return CDDP_OK;
    char what[512];
    snprintf(what, sizeof what, "%.400s: metadata %s", path, key);
    if (cddp_parse_int(what, v, lo, hi, out, err) == CDDP_OK) return CDDP_OK;
    err->code = CDDP_EFORMAT;
    return CDDP_EFORMAT;
}

bool run_device(const char *prog, const char *device, const char *name, cddp_device **out_dev,
                cddp_dtype *out) {
    cddp_error err = {0};
    cddp_device *dev = cddp_device_for_rank(device, &err);
    if (!dev) {
        fprintf(stderr, "%s: --device %s: %s\n", prog, device, err.msg);
        return false;
    }
    cddp_dtype d;
    if (!strcmp(name, "fp32") || !strcmp(name, "float32")) {
        d = CDDP_F32;
    } else if (!strcmp(name, "bf16") || !strcmp(name, "bfloat16")) {
        d = CDDP_BF16;
    } else {
        fprintf(stderr, "%s: --dtype %s: expected fp32 or bf16\n", prog, name);
        return false;
    }
    const char *how = NULL;
    if (cddp_device_computes(dev, d, &how, &err) != CDDP_OK) {
        fprintf(stderr, "%s: --dtype %s: %s: %s\n", prog, name, cddp_device_name(dev), err.msg);
        return false;
    }
    cddp_log(CDDP_LOG_INFO, prog, "%s: %s", cddp_device_name(dev), how);
    *out_dev = dev;
    *out = d;
    return true;
}

int run_hook(const char *name) {
    static const char *const names[] = {[CDDP_DDP_HOOK_NONE] = "none",
                                        [CDDP_DDP_HOOK_BF16] = "bf16",
                                        [CDDP_DDP_HOOK_FP16] = "fp16",
                                        [CDDP_DDP_HOOK_POWERSGD] = "powersgd"};
    for (int h = 0; h < (int)(sizeof names / sizeof names[0]); h++)
        if (!strcmp(name, names[h])) return h;
    return -1;
}

bool run_transport(const char *prog, const char *text, const char **t) {
    cddp_error err = {0};
    const cddp_dcomm_transport_info *info = cddp_dcomm_transport_find(text, &err);
    if (info) {
        *t = info->name;
        return true;
    }
    fprintf(stderr, "%s: --transport %s: %s\n", prog, text, err.msg);
    return false;
}
