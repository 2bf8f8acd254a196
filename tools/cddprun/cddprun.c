/* cddprun: start, watch and stop a data-parallel job on one or many hosts.
 *
 *   cddprun --nproc_per_node 2 ./train --epochs 3
 *   cddprun --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --nproc_per_node 4 ./train
 *
 * One cddprun runs per node. Node 0's launcher hosts the rendezvous store on
 * --master_addr:--master_port; every launcher registers its node there, learns the others, and
 * starts its workers with ranks contiguous per node and the environment torchrun sets (RANK,
 * LOCAL_RANK, WORLD_SIZE, ..., MASTER_ADDR/MASTER_PORT where rank 0 hosts its own store).
 *
 * Then it watches. The first worker to fail (non-zero exit or a signal) stops every other worker
 * on every node: the failing node posts the failure in the store, the others see it at their
 * next look (every --monitor_interval), and each stops its workers with SIGTERM, then SIGKILL
 * after --grace_period. The launcher exits non-zero with a report naming each failed rank, its
 * host, exit code or signal, the time and the log, with the first failure marked as the root
 * cause; or, with --max_restarts, starts the whole group again. SIGINT/SIGTERM/SIGHUP reach the
 * workers, and workers die with their launcher (PR_SET_PDEATHSIG).
 */
#include "cddp/store.h"
#include "core/internal.h"
#include "core/net.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- options ----------------------------------------------------------------------------- */

/* Which of a worker's streams an option applies to, as torchrun spells it: 0 none, 1 stdout,
 * 2 stderr, 3 both, for every local rank, or a map "local_rank:value,..." (ranks not in the map:
 * none). */
#define MAX_STREAM_MAP 64
typedef struct stream_spec {
    int all;  /* the value for every local rank, when there is no map */
    int nmap; /* entries in the map */
    struct {
        int local_rank, value;
    } map[MAX_STREAM_MAP];
} stream_spec;

typedef struct options {
    int nnodes, node_rank, nproc_per_node, master_port, max_restarts;
    const char *master_addr, *logdir, *local_addr, *token, *run_id;
    bool module, no_python, standalone;
    stream_spec tee;           /* console lines of these streams are prefixed with [rank N] */
    stream_spec redirects;     /* these streams go to the log files only, not the console */
    const char *redirect_name; /* the option that asked for redirects, for its error */
    double monitor_interval, grace_period;
    char **program; /* the program and its arguments */
} options;

enum {
    OPT_NNODES = 256,
    OPT_NODE_RANK,
    OPT_NPROC,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_NO_PYTHON,
    OPT_REDIRECT,
    OPT_LOGDIR,
    OPT_STANDALONE,
    OPT_MAX_RESTARTS,
    OPT_TEE,
    OPT_MONITOR,
    OPT_GRACE,
    OPT_LOCAL_ADDR,
    OPT_TOKEN,
    OPT_RUN_ID,
    OPT_REDIRECTS
};

/* Each option once, with the environment variable it can also come from. Dash spellings
 * (torchrun's) are accepted for every underscore spelling. has_arg 2: the value is optional and,
 * when given, is the next argument if that looks like one (--tee 3), or follows '=' (--tee=3). */
static const struct {
    const char *name;
    int has_arg, code;
} option_table[] = {
    {"nnodes", 1, OPT_NNODES},
    {"node_rank", 1, OPT_NODE_RANK},
    {"nproc_per_node", 1, OPT_NPROC},
    {"master_addr", 1, OPT_MASTER_ADDR},
    {"master_port", 1, OPT_MASTER_PORT},
    {"module", 0, 'm'},
    {"no_python", 0, OPT_NO_PYTHON},
    {"redirect_stdout_and_stderr", 0, OPT_REDIRECT},
    {"logdir", 1, OPT_LOGDIR},
    {"log_dir", 1, OPT_LOGDIR},
    {"redirects", 1, OPT_REDIRECTS},
    {"standalone", 0, OPT_STANDALONE},
    {"max_restarts", 1, OPT_MAX_RESTARTS},
    {"tee", 2, OPT_TEE},
    {"monitor_interval", 1, OPT_MONITOR},
    {"grace_period", 1, OPT_GRACE},
    {"local_addr", 1, OPT_LOCAL_ADDR},
    {"token", 1, OPT_TOKEN},
    {"run_id", 1, OPT_RUN_ID},
    {"help", 0, 'h'},
};
#define NOPTIONS (int)CDDP_ARRAY_LEN(option_table)

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: cddprun [options] program [program args...]\n"
        "\n"
        "Starts nproc_per_node copies of a program on this node, with the environment of a\n"
        "data-parallel job, and watches them: the first failure stops every worker on every node.\n"
        "A .py program runs under python3 (unless --no_python); -m runs `python3 -m program`.\n"
        "\n"
        "options (each also as --dash-spelling, and from the environment as CDDPRUN_<OPTION>,\n"
        "for example CDDPRUN_NPROC_PER_NODE=4 or CDDPRUN_TEE=3; the command line wins):\n"
        "  --nnodes N              nodes in the job (default 1)\n"
        "  --node_rank K           this node's rank, 0..N-1 (default 0); node 0 hosts the store\n"
        "  --nproc_per_node P      processes on this node (default 1)\n"
        "  --master_addr HOST      node 0's address (default 127.0.0.1); the store binds to it\n"
        "  --master_port PORT      node 0's store port (default 29500)\n"
        "  --standalone            one node, any free port on 127.0.0.1 (no port clashes)\n"
        "  -m, --module            run `python3 -m program`\n"
        "  --no_python             run the program directly even if it ends in .py\n"
        "  --logdir DIR            write each rank's output to DIR/rank.N/stdout and\n"
        "                          DIR/rank.N/stderr (created as needed; the files of an earlier "
        "run\n"
        "                          in DIR are overwritten; restarts append to them); also "
        "--log_dir\n"
        "  -r, --redirects V       with --logdir: streams V go only to the files, not the "
        "console\n"
        "  --redirect_stdout_and_stderr\n"
        "                          the same as --redirects 3\n"
        "  -t, --tee [V]           prefix console lines of streams V with [rank N] (alone: 3)\n"
        "                          V, as torchrun's: 0 none, 1 stdout, 2 stderr, 3 both, or a map\n"
        "                          of local ranks, 0:3,1:2 (ranks not in it: 0)\n"
        "  --max_restarts K        restart the whole group up to K times after a failure (default "
        "0)\n"
        "  --monitor_interval S    seconds between looks at the workers and the store (default "
        "0.1)\n"
        "  --grace_period S        seconds between SIGTERM and SIGKILL when stopping (default 5)\n"
        "  --local_addr HOST       this node's address, as other nodes see it (default: hostname)\n"
        "  --token SECRET          the job token for the store; every node needs the same one\n"
        "                          (default: random on one node; derived from --run_id otherwise)\n"
        "  --run_id ID             the job's id, CDDP_RUN_ID in the workers (default: random)\n"
        "  -h, --help              this help\n"
        "\n"
        "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
        "GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port where rank 0 hosts its own "
        "store,\n"
        "as torch.distributed's env:// expects; cddp programs find rank 0's store through the\n"
        "launcher's instead), CDDP_RUN_ID, CDDP_RESTART_COUNT (also as\n"
        "TORCHELASTIC_RESTART_COUNT), CDDP_STORE_ADDR/CDDP_STORE_PORT/CDDP_STORE_TOKEN (the\n"
        "launcher's store), and OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 when unset and P > "
        "1.\n"
        "\n"
        "Exit status: 0 when every worker exited 0; 1 when a worker failed (after the restarts);\n"
        "2 for a usage error; 128+signal when cddprun itself was stopped by a signal.\n"
        "Rendezvous waits at most CDDP_RDZV_TIMEOUT_S seconds (default 300).\n");
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cddprun: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(cddprun --help lists the options)\n");
    va_end(ap);
    exit(2);
}

static long parse_int(const char *opt, const char *v, long lo, long hi) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        die_usage("--%s %s: expected an integer in [%ld, %ld]", opt, v, lo, hi);
    return x;
}

static double parse_seconds(const char *opt, const char *v) {
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0) || x > 86400)
        die_usage("--%s %s: expected seconds > 0", opt, v);
    return x;
}

/* Does v look like a stream value ("3", "0:3,1:1")? Then --tee takes it rather than seeing the
 * program there. */
static bool looks_like_streams(const char *v) {
    if (!v || !isdigit((unsigned char)*v)) return false;
    for (; *v; v++)
        if (!isdigit((unsigned char)*v) && *v != ':' && *v != ',') return false;
    return true;
}

static void parse_streams(const char *opt, const char *v, stream_spec *s) {
    static const char *expect = "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both), or a map of "
                                "local ranks such as 0:3,1:2";
    *s = (stream_spec){0};
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (end != v && !*end) {
        if (x < 0 || x > 3) die_usage("--%s %s: %s", opt, v, expect);
        s->all = (int)x;
        return;
    }
    for (const char *p = v; *p;) {
        long r = strtol(p, &end, 10);
        if (end == p || *end != ':' || r < 0 || r > 65535) die_usage("--%s %s: %s", opt, v, expect);
        p = end + 1;
        x = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || x < 0 || x > 3)
            die_usage("--%s %s: %s", opt, v, expect);
        if (s->nmap == MAX_STREAM_MAP)
            die_usage("--%s %s: at most %d local ranks in a map", opt, v, MAX_STREAM_MAP);
        s->map[s->nmap].local_rank = (int)r;
        s->map[s->nmap++].value = (int)x;
        p = *end ? end + 1 : end;
    }
}

/* The streams (1 stdout, 2 stderr, 3 both) that spec s names for a local rank. */
static int streams_for(const stream_spec *s, int local_rank) {
    if (!s->nmap) return s->all;
    for (int i = 0; i < s->nmap; i++)
        if (s->map[i].local_rank == local_rank) return s->map[i].value;
    return 0;
}

static bool parse_bool(const char *name, const char *v) {
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes")) return true;
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !*v) return false;
    die_usage("%s=%s: expected 1/true/yes or 0/false/no", name, v);
}

static void apply(options *o, int code, const char *name, const char *v) {
    switch (code) {
    case OPT_NNODES:
        o->nnodes = (int)parse_int(name, v, 1, 65536);
        break;
    case OPT_NODE_RANK:
        o->node_rank = (int)parse_int(name, v, 0, 65535);
        break;
    case OPT_NPROC:
        o->nproc_per_node = (int)parse_int(name, v, 1, 4096);
        break;
    case OPT_MASTER_ADDR:
        o->master_addr = v;
        break;
    case OPT_MASTER_PORT:
        o->master_port = (int)parse_int(name, v, 1, 65535);
        break;
    case 'm':
        o->module = true;
        break;
    case OPT_NO_PYTHON:
        o->no_python = true;
        break;
    case OPT_REDIRECT:
        o->redirects = (stream_spec){.all = 3};
        o->redirect_name = "redirect_stdout_and_stderr";
        break;
    case OPT_REDIRECTS:
        parse_streams(name, v, &o->redirects);
        o->redirect_name = "redirects";
        break;
    case OPT_LOGDIR:
        o->logdir = v;
        break;
    case OPT_STANDALONE:
        o->standalone = true;
        break;
    case OPT_MAX_RESTARTS:
        o->max_restarts = (int)parse_int(name, v, 0, 1000000);
        break;
    case OPT_TEE:
        if (v)
            parse_streams(name, v, &o->tee);
        else
            o->tee = (stream_spec){.all = 3};
        break;
    case OPT_MONITOR:
        o->monitor_interval = parse_seconds(name, v);
        break;
    case OPT_GRACE:
        o->grace_period = parse_seconds(name, v);
        break;
    case OPT_LOCAL_ADDR:
        o->local_addr = v;
        break;
    case OPT_TOKEN:
        o->token = v;
        break;
    case OPT_RUN_ID:
        o->run_id = v;
        break;
    }
}

static void parse_options(int argc, char **argv, options *o) {
    *o = (options){.nnodes = 1,
                   .nproc_per_node = 1,
                   .master_port = 29500,
                   .master_addr = "127.0.0.1",
                   .monitor_interval = 0.1,
                   .grace_period = 5.0};
    /* The environment first (CDDPRUN_NPROC_PER_NODE=4), so that the command line wins. */
    for (int i = 0; i < NOPTIONS; i++) {
        if (option_table[i].code == 'h') continue;
        char var[64] = "CDDPRUN_";
        for (int k = 0; option_table[i].name[k] && k < 50; k++)
            var[8 + k] = (char)toupper((unsigned char)option_table[i].name[k]);
        const char *v = getenv(var);
        if (!v) continue;
        if (option_table[i].has_arg == 2) /* CDDPRUN_TEE=3; true/yes: every stream */
            apply(o, option_table[i].code, option_table[i].name,
                  looks_like_streams(v) ? v
                  : parse_bool(var, v)  ? "3"
                                        : "0");
        else if (option_table[i].has_arg == 1)
            apply(o, option_table[i].code, option_table[i].name, v);
        else if (parse_bool(var, v))
            apply(o, option_table[i].code, option_table[i].name, NULL);
    }
    static struct option longopts[2 * NOPTIONS + 1];
    static char dashed[NOPTIONS][64];
    int n = 0;
    for (int i = 0; i < NOPTIONS; i++) {
        int has = option_table[i].has_arg == 2   ? optional_argument
                  : option_table[i].has_arg == 1 ? required_argument
                                                 : no_argument;
        longopts[n++] = (struct option){option_table[i].name, has, NULL, option_table[i].code};
        snprintf(dashed[i], sizeof dashed[i], "%s", option_table[i].name);
        bool any = false;
        for (char *c = dashed[i]; *c; c++)
            if (*c == '_') *c = '-', any = true;
        if (any) longopts[n++] = (struct option){dashed[i], has, NULL, option_table[i].code};
    }
    longopts[n] = (struct option){0, 0, 0, 0};
    int c, idx = 0;
    opterr = 0;
    /* "+": stop at the program, so its own options are left alone. */
    while ((c = getopt_long(argc, argv, "+hmr:t::", longopts, &idx)) != -1) {
        if (c == 'h') {
            usage(stdout);
            exit(0);
        }
        if (c == '?') {
            if (optopt) die_usage("unknown option -%c", optopt);
            die_usage("unknown option or missing value: %s", argv[optind - 1]);
        }
        const char *name = c == 'm'   ? "module"
                           : c == 'r' ? "redirects"
                           : c == 't' ? "tee"
                                      : longopts[idx].name;
        if (c == 'r') c = OPT_REDIRECTS;
        if (c == 't') c = OPT_TEE;
        /* An optional value given as the next argument: --tee 3 */
        const char *v = optarg;
        if (!v && c == OPT_TEE && optind < argc && looks_like_streams(argv[optind]))
            v = argv[optind++];
        apply(o, c, name, v);
    }
    if (optind >= argc) die_usage("no program given");
    o->program = argv + optind;
}

/* ---- checks before anything starts ------------------------------------------------------- */

static bool on_path(const char *prog) {
    if (strchr(prog, '/')) return access(prog, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    char dir[PATH_MAX];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)len, p, prog);
        if (access(dir, X_OK) == 0) return true;
        p += len + (p[len] == ':');
    }
    return false;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The argv to exec: python3 for .py programs and -m, the program itself otherwise. */
static char **worker_argv(const options *o) {
    int n = 0;
    while (o->program[n]) n++;
    char **argv = cddp_calloc((size_t)n + 3, sizeof *argv);
    int k = 0;
    bool python = o->module || (!o->no_python && ends_with(o->program[0], ".py"));
    if (python) argv[k++] = "python3";
    if (o->module) argv[k++] = "-m";
    for (int i = 0; i < n; i++) argv[k++] = o->program[i];
    return argv;
}

static void validate(options *o) {
    if (o->no_python && o->module) die_usage("--no_python and -m/--module exclude each other");
    if (o->node_rank >= o->nnodes)
        die_usage("--node_rank %d is out of range for --nnodes %d (0..%d)", o->node_rank, o->nnodes,
                  o->nnodes - 1);
    if (o->standalone && o->nnodes > 1) die_usage("--standalone is for one node (--nnodes 1)");
    bool redirects = o->redirects.all != 0;
    for (int i = 0; i < o->redirects.nmap; i++) redirects |= o->redirects.map[i].value != 0;
    if (redirects && !o->logdir)
        die_usage("--%s needs --logdir (where should the output go?)", o->redirect_name);
    const stream_spec *specs[2] = {&o->tee, &o->redirects};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < specs[k]->nmap; i++)
            if (specs[k]->map[i].local_rank >= o->nproc_per_node)
                die_usage("--%s: local rank %d is not on this node (--nproc_per_node %d: 0..%d)",
                          k ? o->redirect_name : "tee", specs[k]->map[i].local_rank,
                          o->nproc_per_node, o->nproc_per_node - 1);
    bool python = o->module || (!o->no_python && ends_with(o->program[0], ".py"));
    if (python && !on_path("python3"))
        die_usage("%s needs python3, which is not on PATH (use --no_python to run it directly)",
                  o->program[0]);
    if (!o->module && !python && !on_path(o->program[0]))
        die_usage("program '%s' not found (not an executable file, not on PATH)", o->program[0]);
    if (!o->module && python && access(o->program[0], R_OK) != 0)
        die_usage("script '%s' not found", o->program[0]);
}

/* ---- workers ----------------------------------------------------------------------------- */

typedef struct stream {
    int fd;       /* pipe from the worker, -1 when closed or not used */
    int log;      /* log file, -1 when none */
    bool console; /* copy to the console */
    bool prefix;  /* ... with [rank N] before each line */
    FILE *to;     /* stdout or stderr */
    char line[4096];
    size_t len;
} stream;

typedef struct worker {
    pid_t pid;
    int rank, local_rank;
    bool running, failed, stopped; /* stopped: we stopped it */
    int status;
    double end_time;
    stream out, err;
    char log_path[PATH_MAX];
} worker;

typedef struct job {
    options o;
    char host[256];
    char run_id[64], token[80];
    char **argv;
    int world, base, round;
    char worker_port[16];
    cddp_store_server *server;
    cddp_store *store;
    worker *w;
    long oom_kills_at_start;
} job;

static volatile sig_atomic_t got_signal;
static int wake_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    if (sig != SIGCHLD) got_signal = sig;
    ssize_t r = write(wake_pipe[1], "x", 1);
    (void)r;
    errno = saved;
}

static void set_env_int(const char *name, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    setenv(name, b, 1);
}

/* Writes the text of a stream to its destinations, with the [rank N] prefix when asked. */
static void emit(const worker *w, stream *s, const char *data, size_t n) {
    if (s->log >= 0) {
        const char *p = data;
        size_t left = n;
        while (left) {
            ssize_t wr = write(s->log, p, left);
            if (wr <= 0 && errno != EINTR) break;
            if (wr > 0) p += wr, left -= (size_t)wr;
        }
    }
    if (!s->console) return;
    if (!s->prefix) {
        fwrite(data, 1, n, s->to);
        fflush(s->to);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (s->len < sizeof s->line - 1) s->line[s->len++] = data[i];
        if (data[i] == '\n' || s->len == sizeof s->line - 1) {
            fprintf(s->to, "[rank %d]: %.*s", w->rank, (int)s->len, s->line);
            if (s->line[s->len - 1] != '\n') fputc('\n', s->to);
            fflush(s->to);
            s->len = 0;
        }
    }
}

static void drain(worker *w, stream *s) {
    char buf[65536];
    for (;;) {
        ssize_t r = read(s->fd, buf, sizeof buf);
        if (r > 0) {
            emit(w, s, buf, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return;
        /* EOF: flush a last line without a newline, close. */
        if (s->len) emit(w, s, "\n", 1);
        close(s->fd);
        s->fd = -1;
        return;
    }
}

/* mkdir -p: every missing folder of path. */
static int make_dirs(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++)
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) return errno;
            if (!(*p = c)) return 0;
        }
}

static int open_log(const job *j, int local, const char *name, int *fd, char *path, size_t n) {
    char dir[PATH_MAX - 16];
    snprintf(dir, sizeof dir, "%s/rank.%d", j->o.logdir, j->base + local);
    int e = make_dirs(dir);
    if (e) return e;
    snprintf(path, n, "%s/%s", dir, name);
    /* The first attempt overwrites an earlier run's files; restarts append. */
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (j->round == 0 ? O_TRUNC : O_APPEND);
    *fd = open(path, flags, 0666);
    return *fd < 0 ? errno : 0;
}

static void start_workers(job *j) {
    const options *o = &j->o;
    for (int i = 0; i < o->nproc_per_node; i++) {
        worker *w = &j->w[i];
        *w = (worker){.rank = j->base + i, .local_rank = i, .running = true};
        int redirect = streams_for(&o->redirects, i), tee = streams_for(&o->tee, i);
        w->out = (stream){
            .fd = -1, .log = -1, .console = !(redirect & 1), .prefix = tee & 1, .to = stdout};
        w->err = (stream){
            .fd = -1, .log = -1, .console = !(redirect & 2), .prefix = tee & 2, .to = stderr};
        /* Through cddprun when a stream is prefixed or goes both to a file and the console;
         * else straight to its file, or to the console. */
        bool pipes =
            w->out.prefix || w->err.prefix || (o->logdir && (w->out.console || w->err.console));
        snprintf(w->log_path, sizeof w->log_path, "the console (use --logdir to keep logs)");
        if (o->logdir) {
            char p[PATH_MAX];
            int e = open_log(j, i, "stdout", &w->out.log, p, sizeof p);
            if (!e) e = open_log(j, i, "stderr", &w->err.log, w->log_path, sizeof w->log_path);
            if (e) {
                fprintf(stderr,
                        "cddprun: cannot write logs under %s: %s (is it a writable "
                        "folder?)\n",
                        o->logdir, strerror(e));
                exit(2);
            }
        }
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        if (pipes && (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC))) {
            fprintf(stderr, "cddprun: pipe: %s\n", strerror(errno));
            exit(1);
        }
        pid_t launcher = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "cddprun: cannot start a worker: %s\n", strerror(errno));
            exit(1);
        }
        if (pid == 0) {
            /* The worker: its own process group (so stopping it stops its children too), dies
             * with the launcher, default signal handling, then the environment and exec. */
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != launcher) _exit(1);
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            signal(SIGCHLD, SIG_DFL);
            signal(SIGPIPE, SIG_DFL);
            if (pipes) {
                dup2(po[1], 1);
                dup2(pe[1], 2);
            } else if (o->logdir) {
                dup2(w->out.log, 1);
                dup2(w->err.log, 2);
            }
            set_env_int("RANK", w->rank);
            set_env_int("LOCAL_RANK", i);
            set_env_int("WORLD_SIZE", j->world);
            set_env_int("LOCAL_WORLD_SIZE", o->nproc_per_node);
            set_env_int("GROUP_RANK", o->node_rank);
            set_env_int("GROUP_WORLD_SIZE", o->nnodes);
            set_env_int("ROLE_RANK", w->rank);
            set_env_int("ROLE_WORLD_SIZE", j->world);
            setenv("MASTER_ADDR", o->master_addr, 1);
            setenv("MASTER_PORT", j->worker_port, 1);
            setenv("CDDP_RUN_ID", j->run_id, 1);
            setenv("TORCHELASTIC_RUN_ID", j->run_id, 1);
            set_env_int("CDDP_RESTART_COUNT", j->round);
            set_env_int("TORCHELASTIC_RESTART_COUNT", j->round);
            set_env_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
            setenv("CDDP_STORE_ADDR", o->master_addr, 1);
            setenv("CDDP_STORE_TOKEN", j->token, 1);
            setenv("CDDP_LOCAL_ADDR", j->host, 1);
            if (o->nproc_per_node > 1) {
                setenv("OMP_NUM_THREADS", "1", 0);
                setenv("OPENBLAS_NUM_THREADS", "1", 0);
            }
            execvp(j->argv[0], j->argv);
            fprintf(stderr, "cddprun: cannot run %s: %s\n", j->argv[0], strerror(errno));
            _exit(127);
        }
        w->pid = pid;
        setpgid(pid, pid); /* also here, so a signal sent right away finds the group */
        if (pipes) {
            close(po[1]);
            close(pe[1]);
            w->out.fd = po[0];
            w->err.fd = pe[0];
            fcntl(po[0], F_SETFL, O_NONBLOCK);
            fcntl(pe[0], F_SETFL, O_NONBLOCK);
        }
    }
}

/* Reaps exited workers; returns the number still running. */
static int reap(job *j, worker **first_failure) {
    int status, running = 0;
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        worker *w = &j->w[i];
        if (!w->running) continue;
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r == w->pid) {
            w->running = false;
            w->status = status;
            w->end_time = (double)time(NULL);
            bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok && !w->stopped) {
                w->failed = true;
                if (first_failure && !*first_failure) *first_failure = w;
            }
        } else {
            running++;
        }
    }
    return running;
}

/* One pass of the monitor: waits for output, a child exit, a signal or the interval. */
static void pump(job *j, double timeout_s) {
    struct pollfd pf[1 + 2 * 4096];
    worker *who[1 + 2 * 4096];
    stream *what[1 + 2 * 4096];
    int n = 0;
    pf[n++] = (struct pollfd){wake_pipe[0], POLLIN, 0};
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        stream *ss[2] = {&j->w[i].out, &j->w[i].err};
        for (int k = 0; k < 2; k++)
            if (ss[k]->fd >= 0) {
                who[n] = &j->w[i];
                what[n] = ss[k];
                pf[n++] = (struct pollfd){ss[k]->fd, POLLIN, 0};
            }
    }
    int r = poll(pf, (nfds_t)n, (int)(timeout_s * 1000));
    if (r <= 0) return;
    if (pf[0].revents & POLLIN) {
        char b[64];
        while (read(wake_pipe[0], b, sizeof b) > 0) {}
    }
    for (int i = 1; i < n; i++)
        if (pf[i].revents) drain(who[i], what[i]);
}

/* Stops every running worker: SIGTERM to its process group, SIGKILL after the grace period. */
static void stop_workers(job *j, int sig) {
    for (int i = 0; i < j->o.nproc_per_node; i++)
        if (j->w[i].running) {
            j->w[i].stopped = true;
            kill(-j->w[i].pid, sig);
        }
    double deadline = cddp_now_s() + j->o.grace_period;
    while (reap(j, NULL) > 0 && cddp_now_s() < deadline) pump(j, 0.05);
    if (reap(j, NULL) > 0) {
        for (int i = 0; i < j->o.nproc_per_node; i++)
            if (j->w[i].running) kill(-j->w[i].pid, SIGKILL);
        while (reap(j, NULL) > 0) pump(j, 0.05);
    }
    /* Whatever the workers wrote before they went. */
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        if (j->w[i].out.fd >= 0) drain(&j->w[i], &j->w[i].out);
        if (j->w[i].err.fd >= 0) drain(&j->w[i], &j->w[i].err);
    }
}

/* The cgroup's count of OOM kills, or -1 where that cannot be read. */
static long oom_kills(void) {
    FILE *f = fopen("/sys/fs/cgroup/memory.events", "r");
    if (!f) return -1;
    char key[64];
    long v, found = -1;
    while (fscanf(f, "%63s %ld", key, &v) == 2)
        if (!strcmp(key, "oom_kill")) found = v;
    fclose(f);
    return found;
}

static void describe(const job *j, const worker *w, char *out, size_t n) {
    char when[32];
    time_t t = (time_t)w->end_time;
    strftime(when, sizeof when, "%H:%M:%S", localtime(&t));
    if (WIFEXITED(w->status)) {
        snprintf(out, n, "rank %d (local rank %d, host %s) exited with code %d at %s", w->rank,
                 w->local_rank, j->host, WEXITSTATUS(w->status), when);
    } else {
        int sig = WTERMSIG(w->status);
        const char *oom = "";
        if (sig == SIGKILL) {
            long now = oom_kills();
            oom = now < 0 || j->oom_kills_at_start < 0
                      ? " (cddprun cannot tell whether the kernel's OOM killer did it)"
                  : now > j->oom_kills_at_start ? " (the kernel's OOM killer: memory.events "
                                                  "counts a new oom_kill)"
                                                : " (not the kernel's OOM killer)";
        }
        snprintf(out, n,
                 "rank %d (local rank %d, host %s) was killed by SIG%s (signal %d) at "
                 "%s%s",
                 w->rank, w->local_rank, j->host, sigabbrev_np(sig), sig, when, oom);
    }
}

/* ---- rendezvous -------------------------------------------------------------------------- */

static void fail_rdzv(const char *what, const cddp_error *err) {
    fprintf(stderr, "cddprun: %s: %s\n", what, cddp_error_msg(err));
    exit(1);
}

static void random_hex(char *out, size_t bytes) {
    unsigned char raw[32] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t r = fd >= 0 ? read(fd, raw, bytes) : -1;
    if (fd >= 0) close(fd);
    if (r != (ssize_t)bytes) { /* no /dev/urandom: time and pid, still unique enough for an id */
        uint64_t x = (uint64_t)cddp_now_s() * 1000003u ^ (uint64_t)getpid() << 32;
        memcpy(raw, &x, sizeof x);
    }
    for (size_t i = 0; i < bytes; i++) sprintf(out + 2 * i, "%02x", raw[i]);
}

/* Registers this node for the round, waits for the others, and computes ranks. */
static void rendezvous(job *j) {
    const options *o = &j->o;
    cddp_error err = {0};
    char key[128], val[512];
    snprintf(key, sizeof key, "r%d/node/%d", j->round, o->node_rank);
    snprintf(val, sizeof val, "%d %s", o->nproc_per_node, j->host);
    if (cddp_store_set_str(j->store, key, val, &err)) fail_rdzv("rendezvous", &err);
    if (o->node_rank == 0) {
        /* MASTER_PORT for the workers: a free port on the master address, for rank 0's store. */
        int fd, port;
        if (cddp__net_listen(o->master_addr, 0, &fd, &port, &err)) fail_rdzv("rendezvous", &err);
        close(fd);
        snprintf(val, sizeof val, "%d", port);
        snprintf(key, sizeof key, "r%d/worker_port", j->round);
        if (cddp_store_set_str(j->store, key, val, &err)) fail_rdzv("rendezvous", &err);
    }
    const char **keys = cddp_calloc((size_t)o->nnodes + 1, sizeof *keys);
    char(*names)[64] = cddp_calloc((size_t)o->nnodes + 1, 64);
    for (int k = 0; k < o->nnodes; k++) {
        snprintf(names[k], 64, "r%d/node/%d", j->round, k);
        keys[k] = names[k];
    }
    snprintf(names[o->nnodes], 64, "r%d/worker_port", j->round);
    keys[o->nnodes] = names[o->nnodes];
    if (cddp_store_wait(j->store, keys, o->nnodes + 1, -1, &err)) {
        char missing[512] = "";
        size_t len = 0;
        for (int k = 0; k < o->nnodes && len < sizeof missing - 16; k++) {
            cddp_error e2 = {0};
            if (cddp_store_wait(j->store, &keys[k], 1, 0, &e2) == CDDP_ETIMEDOUT)
                len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                                        len ? ", " : "", k);
        }
        fprintf(stderr,
                "cddprun: rendezvous failed: node(s) %s of %d did not arrive within %ld s "
                "(CDDP_RDZV_TIMEOUT_S) at %s:%d\n"
                "cddprun: start cddprun on every node with --nnodes %d, its own --node_rank, and "
                "the same --master_addr, --master_port and --token\n",
                missing[0] ? missing : "?", o->nnodes, cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S),
                o->master_addr, o->master_port, o->nnodes);
        exit(1);
    }
    j->world = j->base = 0;
    for (int k = 0; k < o->nnodes; k++) {
        void *v;
        size_t n;
        if (cddp_store_get(j->store, keys[k], -1, &v, &n, &err)) fail_rdzv("rendezvous", &err);
        int p = atoi(v);
        cddp_free(v);
        if (k < o->node_rank) j->base += p;
        j->world += p;
    }
    void *v;
    size_t n;
    if (cddp_store_get(j->store, keys[o->nnodes], -1, &v, &n, &err)) fail_rdzv("rendezvous", &err);
    snprintf(j->worker_port, sizeof j->worker_port, "%s", (char *)v);
    cddp_free(v);
    if (cddp_store_get(j->store, "run_id", -1, &v, &n, &err)) fail_rdzv("rendezvous", &err);
    snprintf(j->run_id, sizeof j->run_id, "%s", (char *)v);
    cddp_free(v);
    cddp_free(keys);
    cddp_free(names);
}

/* Has another node posted a failure for this round? Fills why. A store that went away counts
 * as a failure too: node 0's launcher is gone. */
static bool remote_failure(job *j, char *why, size_t n) {
    char key[64];
    snprintf(key, sizeof key, "r%d/failed", j->round);
    const char *k = key;
    cddp_error err = {0};
    int rc = cddp_store_wait(j->store, &k, 1, 0, &err);
    if (rc == CDDP_ETIMEDOUT) return false;
    if (rc != CDDP_OK) {
        snprintf(why, n, "lost the rendezvous store (%s); node 0's launcher is gone",
                 cddp_error_msg(&err));
        return true;
    }
    void *v;
    size_t len;
    if (cddp_store_get(j->store, key, 1, &v, &len, &err) == CDDP_OK) {
        snprintf(why, n, "%s", (char *)v);
        cddp_free(v);
    } else {
        snprintf(why, n, "another node failed");
    }
    return true;
}

/* ---- the run ----------------------------------------------------------------------------- */

typedef enum { ROUND_OK, ROUND_FAILED, ROUND_SIGNALLED } round_result;

/* Runs one round: rendezvous, start, watch. On failure prints the report. */
static round_result run_round(job *j) {
    const options *o = &j->o;
    cddp_error err = {0};
    rendezvous(j);
    j->oom_kills_at_start = oom_kills();
    start_workers(j);
    worker *first = NULL;
    char remote[CDDP_ERROR_MSG_MAX] = "";
    double next_look = cddp_now_s() + o->monitor_interval;
    while (reap(j, &first) > 0 && !first && !got_signal) {
        pump(j, o->monitor_interval);
        if (o->nnodes > 1 && cddp_now_s() >= next_look) {
            next_look = cddp_now_s() + o->monitor_interval;
            if (remote_failure(j, remote, sizeof remote)) break;
        }
    }
    if (got_signal) {
        fprintf(stderr, "cddprun: got SIG%s; stopping the workers\n", sigabbrev_np(got_signal));
        stop_workers(j, SIGTERM);
        return ROUND_SIGNALLED;
    }
    char key[64], text[CDDP_ERROR_MSG_MAX];
    if (first) {
        describe(j, first, text, sizeof text);
        snprintf(key, sizeof key, "r%d/failed", j->round);
        if (o->nnodes > 1) cddp_store_set_str(j->store, key, text, &err);
    }
    if (first || remote[0])
        stop_workers(j, SIGTERM);
    else
        while (reap(j, NULL) > 0) pump(j, o->monitor_interval);
    for (int i = 0; i < o->nproc_per_node; i++) { /* output written just before the exit */
        if (j->w[i].out.fd >= 0) drain(&j->w[i], &j->w[i].out);
        if (j->w[i].err.fd >= 0) drain(&j->w[i], &j->w[i].err);
    }
    for (int i = 0; i < o->nproc_per_node; i++) {
        if (j->w[i].out.log >= 0) close(j->w[i].out.log);
        if (j->w[i].err.log >= 0) close(j->w[i].err.log);
    }
    if (!first && !remote[0]) return ROUND_OK;

    /* The report. */
    fprintf(stderr, "cddprun: the job failed (run %s, attempt %d of %d, node %d of %d)\n",
            j->run_id, j->round + 1, o->max_restarts + 1, o->node_rank, o->nnodes);
    if (first) {
        fprintf(stderr, "  root cause: %s\n    log: %s\n", text, first->log_path);
    } else {
        fprintf(stderr, "  root cause, on another node: %s\n", remote);
    }
    for (int i = 0; i < o->nproc_per_node; i++) {
        worker *w = &j->w[i];
        if (w == first) continue;
        if (w->failed) {
            describe(j, w, text, sizeof text);
            fprintf(stderr, "  also failed: %s\n    log: %s\n", text, w->log_path);
        } else if (w->stopped) {
            fprintf(stderr, "  stopped: rank %d (local rank %d) by cddprun\n", w->rank,
                    w->local_rank);
        }
    }
    return ROUND_FAILED;
}

int main(int argc, char **argv) {
    job j = {0};
    parse_options(argc, argv, &j.o);
    validate(&j.o);
    options *o = &j.o;
    j.argv = worker_argv(o);
    j.w = cddp_calloc((size_t)o->nproc_per_node, sizeof *j.w);
    if (o->local_addr)
        snprintf(j.host, sizeof j.host, "%s", o->local_addr);
    else if (gethostname(j.host, sizeof j.host) != 0)
        snprintf(j.host, sizeof j.host, "localhost");
    if (o->standalone) {
        o->master_addr = "127.0.0.1";
        o->master_port = 0;
    }
    /* The job token: given, random on one node, or derived from the run id across nodes. */
    if (o->token)
        snprintf(j.token, sizeof j.token, "%s", o->token);
    else if (o->nnodes == 1)
        random_hex(j.token, 16);
    else {
        snprintf(j.token, sizeof j.token, "cddp-run-%s", o->run_id ? o->run_id : "default");
        if (o->node_rank == 0)
            fprintf(stderr,
                    "cddprun: no --token: any process that can reach %s:%d can join this "
                    "job; pass the same --token to every node to prevent that\n",
                    o->master_addr, o->master_port);
    }
    if (o->nproc_per_node > 1 && (!getenv("OMP_NUM_THREADS") || !getenv("OPENBLAS_NUM_THREADS")))
        fprintf(stderr,
                "cddprun: setting OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 for each "
                "worker (unset here) so that %d processes do not oversubscribe the cores; set "
                "them to tune\n",
                o->nproc_per_node);

    /* Signals: SIGINT/TERM/HUP stop the job; SIGCHLD wakes the monitor. */
    if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    cddp_error err = {0};
    if (o->node_rank == 0) {
        j.server = cddp_store_server_start(o->master_addr, o->master_port, j.token, &err);
        if (!j.server) {
            fprintf(stderr, "cddprun: %s\n", cddp_error_msg(&err));
            return 1;
        }
        o->master_port = cddp_store_server_port(j.server);
    }
    cddp_store_options so = {o->master_addr, o->master_port, j.token, 0, NULL};
    j.store = cddp_store_connect(&so, &err);
    if (!j.store) fail_rdzv("cannot join the job's rendezvous", &err);
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", o->master_port);
    setenv("CDDP_STORE_PORT", port_text, 1); /* inherited by the workers */
    if (o->node_rank == 0) {
        char id[64];
        if (o->run_id)
            snprintf(id, sizeof id, "%s", o->run_id);
        else
            random_hex(id, 8);
        if (cddp_store_set_str(j.store, "run_id", id, &err)) fail_rdzv("rendezvous", &err);
    }

    int status = 1;
    for (j.round = 0;; j.round++) {
        round_result r = run_round(&j);
        if (r == ROUND_OK) {
            status = 0;
            break;
        }
        if (r == ROUND_SIGNALLED) {
            status = 128 + got_signal;
            break;
        }
        if (j.round >= o->max_restarts) break;
        fprintf(stderr, "cddprun: restarting the group (restart %d of %d)\n", j.round + 1,
                o->max_restarts);
    }
    /* Node 0 hosts the store: it waits for the other nodes to finish with it. */
    char key[64];
    snprintf(key, sizeof key, "r%d/left/%d", j.round, o->node_rank);
    cddp_store_set_str(j.store, key, status == 0 ? "ok" : "failed", &err);
    if (o->node_rank == 0 && o->nnodes > 1) {
        for (int k = 1; k < o->nnodes && !got_signal; k++) {
            char other[64];
            snprintf(other, sizeof other, "r%d/left/%d", j.round, k);
            const char *ks = other;
            double until = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
            while (!got_signal && cddp_now_s() < until &&
                   cddp_store_wait(j.store, &ks, 1, 0.2, &err) == CDDP_ETIMEDOUT) {
                char why[CDDP_ERROR_MSG_MAX];
                if (status == 0 && remote_failure(&j, why, sizeof why)) {
                    fprintf(stderr, "cddprun: another node failed after this one finished: %s\n",
                            why);
                    status = 1;
                }
            }
        }
    }
    cddp_store_close(j.store);
    cddp_store_server_stop(j.server);
    cddp_free(j.w);
    cddp_free(j.argv);
    return status;
}
