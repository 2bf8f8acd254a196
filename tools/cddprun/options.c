/* options.c: cddprun's options: the table, parsing (command line and CDDPRUN_*), --help. The
 * checks before anything starts are in validate.c. */
#include "cddprun.h"
#include "cddp/launch.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

void cddprun_die_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cddprun: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(cddprun --help lists the options)\n");
    va_end(ap);
    exit(2);
}

/* A number option, checked by cddp's one parser (cddp_parse_int/_double). */
static long parse_int(const char *opt, const char *v, long lo, long hi) {
    char what[80];
    snprintf(what, sizeof what, "--%s", opt);
    int64_t x = 0;
    cddp_error err = {0};
    if (cddp_parse_int(what, v, lo, hi, &x, &err) != CDDP_OK) cddprun_die_usage("%s", err.msg);
    return (long)x;
}

static double parse_seconds(const char *opt, const char *v) {
    char what[80];
    snprintf(what, sizeof what, "--%s", opt);
    double x = 0;
    cddp_error err = {0};
    if (cddp_parse_double(what, v, 0, 86400, true, &x, &err) != CDDP_OK)
        cddprun_die_usage("%s (seconds)", err.msg);
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
        if (x < 0 || x > 3) cddprun_die_usage("--%s %s: %s", opt, v, expect);
        s->all = (int)x;
        return;
    }
    for (const char *p = v; *p;) {
        long r = strtol(p, &end, 10);
        if (end == p || *end != ':' || r < 0 || r > 65535)
            cddprun_die_usage("--%s %s: %s", opt, v, expect);
        p = end + 1;
        x = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || x < 0 || x > 3)
            cddprun_die_usage("--%s %s: %s", opt, v, expect);
        if (s->nmap == MAX_STREAM_MAP)
            cddprun_die_usage("--%s %s: at most %d local ranks in a map", opt, v, MAX_STREAM_MAP);
        s->map[s->nmap].local_rank = (int)r;
        s->map[s->nmap++].value = (int)x;
        p = *end ? end + 1 : end;
    }
}

/* The streams (1 stdout, 2 stderr, 3 both) that spec s names for a local rank. */
int cddprun_streams_for(const stream_spec *s, int local_rank) {
    if (!s->nmap) return s->all;
    for (int i = 0; i < s->nmap; i++)
        if (s->map[i].local_rank == local_rank) return s->map[i].value;
    return 0;
}

static bool parse_bool(const char *name, const char *v) {
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes")) return true;
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !*v) return false;
    cddprun_die_usage("%s=%s: expected 1/true/yes or 0/false/no", name, v);
}

/* A word msrun's booleans take (True, False; also yes/no, 1/0), which is no program's name. */
static bool looks_like_bool(const char *v) {
    static const char *const words[] = {"true", "false", "yes", "no", "1", "0"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strcasecmp(v, words[i])) return true;
    return false;
}

/* A switch's value given with '=' (--join=True) or as the next word (--join True). */
static bool option_bool(const char *name, const char *v) {
    char flag[80];
    snprintf(flag, sizeof flag, "--%s", name);
    return parse_bool(flag, v);
}

/* --nproc_per_node gpu (torchrun's): the GPUs this process sees (CUDA_VISIBLE_DEVICES applies),
 * one rank each; each rank's program picks its local rank's (--device cuda). None: why, and exit.
 *
 * They are counted through the NVIDIA driver's own library, opened here and only here: linking
 * cddp's device table instead would make every start of cddprun load the kernels' libraries
 * (OpenBLAS, oneDNN, the CUDA runtime) for an option few jobs use. */
static int visible_gpus(const char *name) {
    typedef int (*cu_init_fn)(unsigned);
    typedef int (*cu_count_fn)(int *);
    typedef int (*cu_string_fn)(int, const char **);
    char why[512];
    int n = 0;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        snprintf(why, sizeof why, "no CUDA device: no NVIDIA driver on this machine (%s)",
                 dlerror());
    } else {
        cu_init_fn init = (cu_init_fn)dlsym(cuda, "cuInit");
        cu_count_fn count = (cu_count_fn)dlsym(cuda, "cuDeviceGetCount");
        cu_string_fn str = (cu_string_fn)dlsym(cuda, "cuGetErrorString");
        const char *text = NULL;
        int rc = init && count ? init(0) : -1;
        if (rc == 0) rc = count(&n);
        if (rc == 100 /* CUDA_ERROR_NO_DEVICE */ || (rc == 0 && n == 0))
            snprintf(why, sizeof why,
                     "no CUDA device: the driver sees no GPU (CUDA_VISIBLE_DEVICES=%s)",
                     getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
        else if (rc != 0)
            snprintf(why, sizeof why, "no CUDA device: the driver reports %s (error %d)",
                     str && rc > 0 && str(rc, &text) == 0 && text ? text : "that it cannot start",
                     rc);
        dlclose(cuda);
    }
    if (n > 0) return n;
    cddprun_die_usage("--%s gpu: %s: give the number of processes (--%s N), or auto for one per "
                      "core",
                      name, why, name);
}

/* ---- each option's handling ----------------------------------------------------------------
 * name: the spelling used (for messages); v: its value (NULL for an option without one, or an
 * optional value not given). */

static void on_nnodes(options *o, const char *name, const char *v) {
    /* torchrun's MIN:MAX: a fixed count when MIN = MAX */
    const char *colon = strchr(v, ':');
    if (colon) {
        char lo[32];
        snprintf(lo, sizeof lo, "%.*s", (int)CDDP_MIN(colon - v, 31), v);
        long a = parse_int(name, lo, 1, 65536), b = parse_int(name, colon + 1, 1, 65536);
        if (a > b) cddprun_die_usage("--%s %s: MIN:MAX with MIN above MAX", name, v);
        o->nnodes_min = (int)a; /* an elastic job when a < b */
        o->nnodes = (int)b;
    } else {
        o->nnodes = o->nnodes_min = (int)parse_int(name, v, 1, 65536);
    }
    o->nnodes_given = true;
}

static void on_node_rank(options *o, const char *name, const char *v) {
    o->node_rank = (int)parse_int(name, v, 0, 65535);
    o->node_rank_given = true;
}

static void on_nproc(options *o, const char *name, const char *v) {
    /* torchrun's auto and cpu: one process per core this process may run on */
    if (!strcmp(v, "auto") || !strcmp(v, "cpu"))
        o->nproc_per_node = cddp_num_cores();
    else if (!strcmp(v, "gpu"))
        o->nproc_per_node = visible_gpus(name);
    else if (!strcmp(v, "xpu"))
        cddprun_die_usage("--%s xpu: cddp runs on CPUs and NVIDIA GPUs: --%s gpu for one process "
                          "per GPU, auto for one per core, or a number",
                          name, name);
    else
        o->nproc_per_node = (int)parse_int(name, v, 1, 4096);
    o->nproc_given = true;
    o->nproc_text = v;
}

static void on_local_worker_num(options *o, const char *name, const char *v) { /* msrun's */
    o->nproc_per_node = (int)parse_int(name, v, 1, 4096);
    o->nproc_given = true;
    o->nproc_text = v;
}

static void on_worker_num(options *o, const char *name, const char *v) {
    o->worker_num = (int)parse_int(name, v, 1, 1 << 24);
}

static void on_master_addr(options *o, const char *name, const char *v) {
    (void)name;
    o->master_addr = v;
    o->addr_given = true;
}

static void on_master_port(options *o, const char *name, const char *v) {
    o->master_port = (int)parse_int(name, v, 1, 65535);
    o->port_given = true;
}

static void on_module(options *o, const char *name, const char *v) {
    (void)name, (void)v;
    o->module = true;
}

static void on_no_python(options *o, const char *name, const char *v) {
    (void)name, (void)v;
    o->no_python = true;
}

static void on_redirect_all(options *o, const char *name, const char *v) {
    (void)name, (void)v;
    o->redirects = (stream_spec){.all = 3};
    o->redirect_name = "redirect_stdout_and_stderr";
}

static void on_redirects(options *o, const char *name, const char *v) {
    parse_streams(name, v, &o->redirects);
    o->redirect_name = "redirects";
}

static void on_log_layout(options *o, const char *name, const char *v) {
    if (strcmp(v, "flat") != 0 && strcmp(v, "mpirun") != 0)
        cddprun_die_usage("--%s %s: expected flat (DIR/rank.N/stdout) or mpirun "
                          "(DIR/1/rank.N/stdout)",
                          name, v);
    o->log_mpirun = !strcmp(v, "mpirun");
}

static void on_logdir(options *o, const char *name, const char *v) {
    (void)name;
    o->logdir = v;
}

static void on_standalone(options *o, const char *name, const char *v) {
    (void)name, (void)v;
    o->standalone = true;
}

static void on_max_restarts(options *o, const char *name, const char *v) {
    o->max_restarts = (int)parse_int(name, v, 0, 1000000);
}

static void on_tee(options *o, const char *name, const char *v) {
    if (v)
        parse_streams(name, v, &o->tee);
    else
        o->tee = (stream_spec){.all = 3};
}

static void on_monitor(options *o, const char *name, const char *v) {
    o->monitor_interval = parse_seconds(name, v);
}

static void on_grace(options *o, const char *name, const char *v) {
    o->grace_period = parse_seconds(name, v);
}

static void on_stopped(options *o, const char *name, const char *v) {
    o->stopped_timeout = parse_seconds(name, v);
}

static void on_local_addr(options *o, const char *name, const char *v) {
    (void)name;
    o->local_addr = v;
}

static void on_token(options *o, const char *name, const char *v) {
    (void)name;
    o->token = v;
}

static void on_token_file(options *o, const char *name, const char *v) {
    (void)name;
    o->token_file = v;
}

static void on_run_id(options *o, const char *name, const char *v) {
    (void)name;
    o->run_id = v;
}

static void on_rdzv_endpoint(options *o, const char *name, const char *v) {
    /* HOST, HOST:PORT or [IPv6]:PORT: node 0's store */
    static char host[256];
    const char *port = NULL;
    if (*v == '[') {
        const char *end = strchr(v, ']');
        if (!end || (end[1] && end[1] != ':'))
            cddprun_die_usage("--%s %s: expected HOST, HOST:PORT or [ADDRESS]:PORT", name, v);
        snprintf(host, sizeof host, "%.*s", (int)(end - v - 1), v + 1);
        port = end[1] ? end + 2 : NULL;
    } else {
        const char *colon = strrchr(v, ':');
        snprintf(host, sizeof host, "%.*s", (int)(colon ? colon - v : (long)strlen(v)), v);
        port = colon ? colon + 1 : NULL;
    }
    if (!*host) cddprun_die_usage("--%s %s: no host", name, v);
    o->master_addr = host;
    o->addr_given = true;
    if (port) o->master_port = (int)parse_int(name, port, 1, 65535);
    o->port_given |= port != NULL;
}

static void on_rdzv_backend(options *o, const char *name, const char *v) {
    (void)o;
    if (strcmp(v, "c10d") != 0 && strcmp(v, "static") != 0)
        cddprun_die_usage("--%s %s: cddprun's rendezvous is its own store on node 0, as c10d's "
                          "is (static works the same); use --%s c10d",
                          name, v, name);
}

static void on_ranks_filter(options *o, const char *name, const char *v) {
    (void)name;
    o->shown = v;
}

/* torch.distributed.launch's --use_env (LOCAL_RANK is always in the environment), msrun's --join
 * (cddprun always waits for its workers): accepted, nothing to do but check a value given */
static void on_accepted(options *o, const char *name, const char *v) {
    (void)o;
    if (v) option_bool(name, v);
}

static void on_cluster_time_out(options *o, const char *name, const char *v) {
    (void)o; /* msrun's: how long the cluster may take to form */
    parse_int(name, v, 1, 86400);
    setenv("CDDP_RDZV_TIMEOUT_S", v, 1);
}

static void on_bind_core(options *o, const char *name, const char *v) {
    o->bind_core = v ? option_bool(name, v) : true;
}

static void on_hosts(options *o, const char *name, const char *v) {
    (void)name;
    o->hosts = v;
}

static void on_hostfile(options *o, const char *name, const char *v) {
    (void)name;
    o->hostfile = v;
}

static void on_ssh(options *o, const char *name, const char *v) {
    (void)name;
    o->ssh = v;
}

static void on_env(options *o, const char *name, const char *v) {
    if (!*v || *v == '=') cddprun_die_usage("-x/--%s '%s': expected NAME or NAME=VALUE", name, v);
    if (o->nenv == MAX_FORWARDED)
        cddprun_die_usage("-x/--%s: at most %d variables", name, MAX_FORWARDED);
    o->env[o->nenv++] = v;
}

static void on_stdin_control(options *o, const char *name, const char *v) {
    (void)name, (void)v;
    o->stdin_control = true;
}

static void on_help(options *o, const char *name, const char *v);

/* ---- the table -----------------------------------------------------------------------------
 * Every option once: an option is a line here and its handling above. Dash spellings (torchrun's)
 * are accepted for every underscore spelling, and each option also comes from the environment as
 * CDDPRUN_<NAME> (the command line wins). */

enum {
    NONE,    /* no value: --standalone (CDDPRUN_STANDALONE=1) */
    VALUE,   /* a value: --nnodes 2, --nnodes=2 */
    STREAMS, /* an optional stream value: --tee, --tee 3, --tee=3 (CDDPRUN_TEE=3, or true) */
    SWITCH,  /* an optional boolean, msrun's: --join, --join True, --join=False */
};

typedef struct optdef {
    const char *name;
    int value;   /* NONE, VALUE, STREAMS or SWITCH */
    char letter; /* its one-letter spelling (-m), or 0 */
    bool head;   /* under --hosts, the head's own: not passed on to the nodes it starts */
    void (*on)(options *o, const char *name, const char *v);
    const char *arg;  /* the value's name in --help ("" none); NULL: not in the list (the peers' */
    const char *help; /* spellings, said after it); "\n" breaks a line. An entry without a name
                       * is a heading of --help. */
} optdef;

static const optdef table[] = {
    {"nnodes", VALUE, 0, true, on_nnodes, "N",
     "nodes in the job (default 1); MIN:MAX, an elastic job: it starts with the nodes that came "
     "(MIN at least, MAX at most), and after a failure the nodes still there start again from "
     "the program's checkpoint, with --max_restarts"},
    {"node_rank", VALUE, 0, true, on_node_rank, "K",
     "this node's rank, 0..N-1 (default 0); node 0 hosts the store (in an elastic job: its id, "
     "0..MAX-1; node 0 must stay)"},
    {"nproc_per_node", VALUE, 0, true, on_nproc, "P", "processes on this node (default 1)"},
    {"master_addr", VALUE, 0, true, on_master_addr, "HOST",
     "node 0's address (default 127.0.0.1); the store binds to it"},
    {"master_port", VALUE, 0, true, on_master_port, "PORT", "node 0's store port (default 29500)"},
    {"standalone", NONE, 0, true, on_standalone, "",
     "one node, any free port on 127.0.0.1 (no port clashes)"},
    {"module", NONE, 'm', false, on_module, "", "run `python3 -m program`"},
    {"no_python", NONE, 0, false, on_no_python, "",
     "run the program directly even if it ends in .py"},
    {"logdir", VALUE, 0, false, on_logdir, "DIR",
     "write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr (created as needed; "
     "the files of an earlier run in DIR are overwritten; restarts append to them); also "
     "--log_dir"},
    {.name = "log_dir", .value = VALUE, .head = false, .on = on_logdir},
    {"log_layout", VALUE, 0, false, on_log_layout, "L",
     "flat: DIR/rank.N/ (the default); mpirun: DIR/1/rank.N/, as Open MPI's --output-filename "
     "writes them and MindSpore's tutorials read them (log_output/1/rank.*/stdout)"},
    {"redirects", VALUE, 'r', false, on_redirects, "V",
     "with --logdir: streams V go only to the files, not the console"},
    {"redirect_stdout_and_stderr", NONE, 0, false, on_redirect_all, "",
     "the same as --redirects 3"},
    {"tee", STREAMS, 't', false, on_tee, "[V]",
     "prefix console lines of streams V with [rank N] (alone: 3)\nV, as torchrun's: 0 none, 1 "
     "stdout, 2 stderr, 3 both, or a map of local ranks, 0:3,1:2 (ranks not in it: 0)"},
    {"max_restarts", VALUE, 0, false, on_max_restarts, "K",
     "restart the whole group up to K times after a failure (default 0)"},
    {"monitor_interval", VALUE, 0, false, on_monitor, "S",
     "seconds between looks at the workers and the store (default 0.1)"},
    {"grace_period", VALUE, 0, false, on_grace, "S",
     "seconds between SIGTERM and SIGKILL when stopping (default 5)"},
    {"stopped_timeout", VALUE, 0, false, on_stopped, "S",
     "stop the job when a rank has been stopped (SIGSTOP, Ctrl-Z, a debugger) for S seconds, "
     "naming it (default 0: the other ranks wait for it up to CDDP_TIMEOUT_S, as a debugger "
     "session needs)"},
    {"local_addr", VALUE, 0, true, on_local_addr, "HOST",
     "this node's address, as other nodes see it, or an interface whose address it is (eth0) "
     "(default: CDDP_SOCKET_IFNAME's address, else the hostname)"},
    {"token_file", VALUE, 0, true, on_token_file, "FILE",
     "the job's secret, the first line of FILE (make it readable only by you); every node needs "
     "the same one. One node makes a random one when none is given; a job on several nodes "
     "needs one"},
    {"token", VALUE, 0, true, on_token, "SECRET",
     "the secret itself; other users can read a command line, so use --token_file or "
     "CDDPRUN_TOKEN instead"},
    {"run_id", VALUE, 0, true, on_run_id, "ID",
     "the job's id, CDDP_RUN_ID in the workers (default: slurm- and SLURM_JOB_ID in a Slurm job, "
     "else random)"},
    {"local_ranks_filter", VALUE, 0, false, on_ranks_filter, "L",
     "the console shows only these local ranks' output (0,2)"},
    {"bind_core", SWITCH, 0, false, on_bind_core, "",
     "each worker runs on its own share of the CPUs, with a math thread for each "
     "(OMP_NUM_THREADS, OPENBLAS_NUM_THREADS)"},
    /* torchrun's and torch.distributed.launch's spellings */
    {.name = "rdzv_endpoint", .value = VALUE, .head = true, .on = on_rdzv_endpoint},
    {.name = "rdzv_backend", .value = VALUE, .head = true, .on = on_rdzv_backend},
    {.name = "rdzv_id", .value = VALUE, .head = true, .on = on_run_id},
    {.name = "use_env", .value = NONE, .head = false, .on = on_accepted},
    /* msrun's */
    {.name = "worker_num", .value = VALUE, .head = true, .on = on_worker_num},
    {.name = "local_worker_num", .value = VALUE, .head = true, .on = on_local_worker_num},
    {.name = "join", .value = SWITCH, .head = false, .on = on_accepted},
    {.name = "cluster_time_out", .value = VALUE, .head = false, .on = on_cluster_time_out},
    /* one command, many hosts (hosts.c) */
    {.help = "one command, many hosts (no Slurm, no mpirun; this cddprun starts every node's):"},
    {"hosts", VALUE, 0, true, on_hosts, "H1:S1,H2:S2",
     "the hosts ([user@]name or address) and their ranks (slots; a host without :S gets "
     "--nproc_per_node); the first is node 0. Other machines are reached with ssh (it must log "
     "in without a prompt), and cddprun must be at this one's path there; each node starts in "
     "this directory and gets the job's secret and environment (CDDP_*, CDDPRUN_*, OMP_*, "
     "OPENBLAS_*, DNNL_*, NCCL_*, CUDA_*, PYTHON*, PATH, LD_LIBRARY_PATH, VIRTUAL_ENV, and -x's) "
     "on its stdin. Ctrl-C, or a node that fails, stops every node"},
    {"hostfile", VALUE, 0, true, on_hostfile, "FILE",
     "the hosts, one a line: `name slots=S` (mpirun's, DeepSpeed's) or `name:S` (Horovod's); # "
     "starts a comment"},
    {"ssh", VALUE, 0, true, on_ssh, "CMD",
     "the ssh command and its options (default: ssh), such as \"ssh -p 2222 -i ~/.ssh/cluster\""},
    {"env", VALUE, 'x', true, on_env, "NAME[=VALUE]",
     "also forward NAME to every node (mpirun's -x; repeatable)"},
    {"stdin_control", NONE, 0, true, on_stdin_control, "",
     "(what --hosts starts nodes with) read the job's secret and environment from stdin; when "
     "stdin closes, stop this node"},
    {"help", NONE, 'h', false, on_help, "", "this help"},
};
#define NOPTIONS (int)CDDP_ARRAY_LEN(table)
/* getopt_long returns an option's index, or a short option's letter, or '?': never the same */
_Static_assert(CDDP_ARRAY_LEN(table) < '?', "more options than getopt's values can tell apart");

/* Writes text wrapped to 92 columns, each line indented by indent, the first starting at column
 * at (a newline in text breaks the line there). */
static void wrap(FILE *out, const char *text, int at, int indent) {
    const int width = 92;
    while (*text) {
        int room = width - at, n = 0, cut = -1;
        while (text[n] && text[n] != '\n' && n < room) {
            if (text[n] == ' ') cut = n;
            n++;
        }
        if (text[n] && text[n] != '\n' && cut > 0) n = cut; /* break at the last space */
        fprintf(out, "%.*s\n", n, text);
        text += n;
        while (*text == ' ' || *text == '\n') text++;
        if (*text) fprintf(out, "%*s", indent, "");
        at = indent;
    }
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: cddprun [options] program [program args...]\n"
            "\n"
            "Starts nproc_per_node copies of a program on this node, with the environment of a\n"
            "data-parallel job, and watches them: the first failure stops every worker on every "
            "node.\n"
            "A .py program runs under python3 (unless --no_python); -m runs `python3 -m "
            "program`.\n"
            "\n"
            "options (each also as --dash-spelling, and from the environment as CDDPRUN_<OPTION>,\n"
            "for example CDDPRUN_NPROC_PER_NODE=4 or CDDPRUN_TEE=3; the command line wins):\n");
    for (int i = 0; i < NOPTIONS; i++) {
        const optdef *d = &table[i];
        if (!d->name) fprintf(out, "\n%s\n", d->help);
        if (!d->name || !d->arg) continue;
        char spelled[64], letter[8] = "";
        if (d->letter) snprintf(letter, sizeof letter, "-%c, ", d->letter);
        int n = snprintf(spelled, sizeof spelled, "  %s--%s%s%s", letter, d->name,
                         *d->arg ? " " : "", d->arg);
        if (n > 24)
            fprintf(out, "%s\n%26s", spelled, "");
        else
            fprintf(out, "%-26s", spelled);
        wrap(out, d->help, 26, 26);
    }
    fprintf(
        out,
        "\n"
        "a running job's flight records (what each rank did last; see cddp-trace):\n"
        "  cddprun --dump [--logdir DIR | --run_id ID | FOLDER]\n"
        "                          from another shell on any node of the job: every rank, on\n"
        "                          every node, writes its record (the job goes on), and the\n"
        "                          report of where each rank stands is printed here and on\n"
        "                          node 0's console; --status is the same. Give the --logdir or\n"
        "                          --run_id the job was started with (its records: DIR/flight,\n"
        "                          else $TMPDIR/cddp-flight-ID, /tmp without TMPDIR)\n"
        "\n"
        "torchrun's spellings: --nnodes MIN:MAX (N:N, a fixed count), --nproc_per_node\n"
        "auto|cpu (one per core) or gpu (one per visible GPU; the program gives each rank\n"
        "its GPU with --device cuda), --rdzv_endpoint HOST[:PORT] (node 0's\n"
        "store: --master_addr and --master_port), --rdzv_backend c10d|static, --rdzv_id ID\n"
        "(--run_id), --use_env (accepted: LOCAL_RANK is always in the environment).\n"
        "msrun's: --worker_num N (every node's workers; N / --local_worker_num nodes),\n"
        "--local_worker_num P (--nproc_per_node), --log_dir, --master_addr, --master_port,\n"
        "--node_rank, --join[=True] (accepted: cddprun always waits), --cluster_time_out S\n"
        "(CDDP_RDZV_TIMEOUT_S), --bind_core[=True].\n"
        "\n"
        "Inside an srun step of one task per node (srun --ntasks-per-node=1 cddprun ...), the\n"
        "node count, this node's rank and node 0's address and port come from the step unless\n"
        "given.\n"
        "\n"
        "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
        "GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port where rank 0 hosts its own "
        "store,\n"
        "as torch.distributed's env:// expects; cddp programs find rank 0's store through the\n"
        "launcher's instead), CDDP_RUN_ID, CDDP_RESTART_COUNT (also as\n"
        "TORCHELASTIC_RESTART_COUNT), CDDP_STORE_ADDR/CDDP_STORE_PORT/CDDP_STORE_TOKEN (the\n"
        "launcher's store), and OMP_NUM_THREADS and OPENBLAS_NUM_THREADS when unset: 1 when\n"
        "P > 1, the count of its CPUs with --bind_core.\n"
        "\n"
        "Exit status: 0 when every worker exited 0; 1 when a worker failed (after the restarts);\n"
        "2 for a usage error; 128+signal when cddprun itself was stopped by a signal.\n"
        "Rendezvous waits at most CDDP_RDZV_TIMEOUT_S seconds (default 300).\n");
}

static void on_help(options *o, const char *name, const char *v) {
    (void)o, (void)name, (void)v;
    usage(stdout);
    exit(0);
}

void cddprun_parse_options(int argc, char **argv, options *o) {
    *o = (options){.nnodes = 1,
                   .nnodes_min = 1,
                   .nproc_per_node = 1,
                   .master_port = 29500,
                   .master_addr = "127.0.0.1",
                   .monitor_interval = 0.1,
                   .grace_period = 5.0};
    /* The environment first (CDDPRUN_NPROC_PER_NODE=4), so that the command line wins. */
    for (int i = 0; i < NOPTIONS; i++) {
        const optdef *d = &table[i];
        if (!d->name || d->on == on_help) continue;
        char var[64] = "CDDPRUN_";
        for (int k = 0; d->name[k] && k < 50; k++)
            var[8 + k] = (char)toupper((unsigned char)d->name[k]);
        const char *v = getenv(var);
        if (!v) continue;
        if (d->value == STREAMS) /* CDDPRUN_TEE=3; true/yes: every stream */
            d->on(o, d->name, looks_like_streams(v) ? v : parse_bool(var, v) ? "3" : "0");
        else if (d->value == VALUE)
            d->on(o, d->name, v);
        else if (parse_bool(var, v))
            d->on(o, d->name, NULL);
    }
    /* getopt's table: each option (val: its index) and its dash spelling; its short letters */
    static struct option longopts[2 * NOPTIONS + 1];
    static char dashed[NOPTIONS][64];
    char letters[2 * NOPTIONS + 2] = "+"; /* "+": stop at the program, whose options are its own */
    int n = 0, nl = 1;
    for (int i = 0; i < NOPTIONS; i++) {
        const optdef *d = &table[i];
        if (!d->name) continue;
        int has = d->value == VALUE  ? required_argument
                  : d->value == NONE ? no_argument
                                     : optional_argument;
        longopts[n++] = (struct option){d->name, has, NULL, i};
        snprintf(dashed[i], sizeof dashed[i], "%s", d->name);
        bool any = false;
        for (char *c = dashed[i]; *c; c++)
            if (*c == '_') *c = '-', any = true;
        if (any) longopts[n++] = (struct option){dashed[i], has, NULL, i};
        if (d->letter) {
            letters[nl++] = d->letter;
            if (d->value == VALUE) letters[nl++] = ':';
            if (d->value == STREAMS || d->value == SWITCH) nl += sprintf(letters + nl, "::");
        }
    }
    longopts[n] = (struct option){0, 0, 0, 0};
    letters[nl] = '\0';
    int c, idx = 0, last = 1;
    o->pass = cddp_calloc((size_t)argc + 1, sizeof *o->pass);
    opterr = 0;
    while ((c = getopt_long(argc, argv, letters, longopts, &idx)) != -1) {
        if (c == '?') {
            if (optopt) cddprun_die_usage("unknown option -%c", optopt);
            cddprun_die_usage("unknown option or missing value: %s", argv[optind - 1]);
        }
        const optdef *d = c < NOPTIONS ? &table[c] : NULL;
        const char *name = d ? longopts[idx].name : NULL;
        for (int i = 0; !d && i < NOPTIONS; i++) /* a short letter: its option */
            if (table[i].letter == c) name = (d = &table[i])->name;
        if (d->on == on_token) o->token_in_argv = true;
        /* An optional value given as the next argument: --tee 3, --join True (msrun's) */
        const char *v = optarg;
        if (!v && d->value == STREAMS && optind < argc && looks_like_streams(argv[optind]))
            v = argv[optind++];
        if (!v && d->value == SWITCH && optind < argc && looks_like_bool(argv[optind]))
            v = argv[optind++];
        d->on(o, name, v);
        /* The words of this option, for the nodes that --hosts starts, unless the head gives
         * them their own value (or keeps it). A bundle of short options (-mt) is passed whole
         * once getopt leaves it. */
        for (; last < optind; last++)
            if (!d->head) o->pass[o->npass++] = argv[last];
    }
    if (optind >= argc) cddprun_die_usage("no program given");
    o->program = argv + optind;
}
