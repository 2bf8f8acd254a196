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
    OPT_STOPPED,
    OPT_LOCAL_ADDR,
    OPT_TOKEN,
    OPT_TOKEN_FILE,
    OPT_RUN_ID,
    OPT_REDIRECTS,
    OPT_RDZV_ENDPOINT,
    OPT_RDZV_BACKEND,
    OPT_RDZV_ID,
    OPT_RANKS_FILTER,
    OPT_USE_ENV,
    OPT_WORKER_NUM,
    OPT_LOCAL_WORKER_NUM,
    OPT_JOIN,
    OPT_CLUSTER_TIME_OUT,
    OPT_BIND_CORE,
    OPT_LOG_LAYOUT,
    OPT_HOSTS,
    OPT_HOSTFILE,
    OPT_SSH,
    OPT_ENV,
    OPT_STDIN_CONTROL
};

/* Each option once, with the environment variable it can also come from. Dash spellings
 * (torchrun's) are accepted for every underscore spelling. has_arg 2: the value is optional and,
 * when given, is the next argument if that looks like one (--tee 3), or follows '=' (--tee=3);
 * has_arg 3: a switch that may say --join=True, --join True or --join=False (msrun's booleans). */
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
    {"log_layout", 1, OPT_LOG_LAYOUT},
    {"redirects", 1, OPT_REDIRECTS},
    {"standalone", 0, OPT_STANDALONE},
    {"max_restarts", 1, OPT_MAX_RESTARTS},
    {"tee", 2, OPT_TEE},
    {"monitor_interval", 1, OPT_MONITOR},
    {"grace_period", 1, OPT_GRACE},
    {"stopped_timeout", 1, OPT_STOPPED},
    {"local_addr", 1, OPT_LOCAL_ADDR},
    {"token", 1, OPT_TOKEN},
    {"token_file", 1, OPT_TOKEN_FILE},
    {"run_id", 1, OPT_RUN_ID},
    /* torchrun's and torch.distributed.launch's spellings */
    {"rdzv_endpoint", 1, OPT_RDZV_ENDPOINT},
    {"rdzv_backend", 1, OPT_RDZV_BACKEND},
    {"rdzv_id", 1, OPT_RDZV_ID},
    {"local_ranks_filter", 1, OPT_RANKS_FILTER},
    {"use_env", 0, OPT_USE_ENV},
    /* msrun's */
    {"worker_num", 1, OPT_WORKER_NUM},
    {"local_worker_num", 1, OPT_LOCAL_WORKER_NUM},
    {"join", 3, OPT_JOIN},
    {"cluster_time_out", 1, OPT_CLUSTER_TIME_OUT},
    {"bind_core", 3, OPT_BIND_CORE},
    /* one command, many hosts (hosts.c) */
    {"hosts", 1, OPT_HOSTS},
    {"hostfile", 1, OPT_HOSTFILE},
    {"ssh", 1, OPT_SSH},
    {"env", 1, OPT_ENV},
    {"stdin_control", 0, OPT_STDIN_CONTROL},
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
        "  --nnodes N              nodes in the job (default 1); MIN:MAX, an elastic job: it\n"
        "                          starts with the nodes that came (MIN at least, MAX at most),\n"
        "                          and after a failure the nodes still there start again from\n"
        "                          the program's checkpoint, with --max_restarts\n"
        "  --node_rank K           this node's rank, 0..N-1 (default 0); node 0 hosts the store\n"
        "                          (in an elastic job: its id, 0..MAX-1; node 0 must stay)\n"
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
        "  --log_layout L          flat: DIR/rank.N/ (the default); mpirun: DIR/1/rank.N/, as\n"
        "                          Open MPI's --output-filename writes them and MindSpore's\n"
        "                          tutorials read them (log_output/1/rank.*/stdout)\n"
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
        "  --stopped_timeout S     stop the job when a rank has been stopped (SIGSTOP, Ctrl-Z, a\n"
        "                          debugger) for S seconds, naming it (default 0: the other ranks\n"
        "                          wait for it up to CDDP_TIMEOUT_S, as a debugger session needs)\n"
        "  --local_addr HOST       this node's address, as other nodes see it, or an interface\n"
        "                          whose address it is (eth0) (default: CDDP_SOCKET_IFNAME's\n"
        "                          address, else the hostname)\n"
        "  --token_file FILE       the job's secret, the first line of FILE (make it readable\n"
        "                          only by you); every node needs the same one. One node makes a\n"
        "                          random one when none is given; a job on several nodes needs "
        "one\n"
        "  --token SECRET          the secret itself; other users can read a command line, so use\n"
        "                          --token_file or CDDPRUN_TOKEN instead\n"
        "  --run_id ID             the job's id, CDDP_RUN_ID in the workers (default: slurm-\n"
        "                          and SLURM_JOB_ID in a Slurm job, else random)\n"
        "  --local_ranks_filter L  the console shows only these local ranks' output (0,2)\n"
        "  --bind_core             each worker runs on its own share of the CPUs, with a math\n"
        "                          thread for each (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS)\n"
        "\n"
        "one command, many hosts (no Slurm, no mpirun; this cddprun starts every node's):\n"
        "  --hosts H1:S1,H2:S2     the hosts ([user@]name or address) and their ranks (slots; a\n"
        "                          host without :S gets --nproc_per_node); the first is node 0.\n"
        "                          Other machines are reached with ssh (it must log in without a\n"
        "                          prompt), and cddprun must be at this one's path there; each\n"
        "                          node starts in this directory and gets the job's secret and\n"
        "                          environment (CDDP_*, CDDPRUN_*, OMP_*, OPENBLAS_*, DNNL_*,\n"
        "                          NCCL_*, CUDA_*, PYTHON*, PATH, LD_LIBRARY_PATH, VIRTUAL_ENV,\n"
        "                          and -x's) on its stdin. Ctrl-C, or a node that fails, stops\n"
        "                          every node\n"
        "  --hostfile FILE         the hosts, one a line: `name slots=S` (mpirun's, DeepSpeed's)\n"
        "                          or `name:S` (Horovod's); # starts a comment\n"
        "  --ssh CMD               the ssh command and its options (default: ssh), such as\n"
        "                          \"ssh -p 2222 -i ~/.ssh/cluster\"\n"
        "  -x, --env NAME[=VALUE]  also forward NAME to every node (mpirun's -x; repeatable)\n"
        "  --stdin_control         (what --hosts starts nodes with) read the job's secret and\n"
        "                          environment from stdin; when stdin closes, stop this node\n"
        "  -h, --help              this help\n"
        "\n"
        "a running job's flight records (what each rank did last; see cddp-trace):\n"
        "  cddprun --dump [--logdir DIR | --run_id ID | FOLDER]\n"
        "                          from another shell on any node of the job: every rank, on\n"
        "                          every node, writes its record (the job goes on), and the\n"
        "                          report of where each rank stands is printed here and on\n"
        "                          node 0's console;\n"
        "                          --status is the same. Give the --logdir or --run_id the job\n"
        "                          was started with (its records: DIR/flight, else\n"
        "                          $TMPDIR/cddp-flight-ID, /tmp without TMPDIR)\n"
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

static void apply(options *o, int code, const char *name, const char *v) {
    switch (code) {
    case OPT_NNODES: {
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
        break;
    }
    case OPT_NODE_RANK:
        o->node_rank = (int)parse_int(name, v, 0, 65535);
        o->node_rank_given = true;
        break;
    case OPT_NPROC:
    case OPT_LOCAL_WORKER_NUM:
        /* torchrun's auto and cpu: one process per core this process may run on */
        if (code == OPT_NPROC && (!strcmp(v, "auto") || !strcmp(v, "cpu")))
            o->nproc_per_node = cddp_num_cores();
        else if (code == OPT_NPROC && !strcmp(v, "gpu"))
            o->nproc_per_node = visible_gpus(name);
        else if (code == OPT_NPROC && !strcmp(v, "xpu"))
            cddprun_die_usage("--%s xpu: cddp runs on CPUs and NVIDIA GPUs: --%s gpu for one "
                              "process per GPU, auto for one per core, or a number",
                              name, name);
        else
            o->nproc_per_node = (int)parse_int(name, v, 1, 4096);
        o->nproc_given = true;
        o->nproc_text = v;
        break;
    case OPT_WORKER_NUM:
        o->worker_num = (int)parse_int(name, v, 1, 1 << 24);
        break;
    case OPT_MASTER_ADDR:
        o->master_addr = v;
        o->addr_given = true;
        break;
    case OPT_MASTER_PORT:
        o->master_port = (int)parse_int(name, v, 1, 65535);
        o->port_given = true;
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
    case OPT_LOG_LAYOUT:
        if (strcmp(v, "flat") != 0 && strcmp(v, "mpirun") != 0)
            cddprun_die_usage("--%s %s: expected flat (DIR/rank.N/stdout) or mpirun "
                              "(DIR/1/rank.N/stdout)",
                              name, v);
        o->log_mpirun = !strcmp(v, "mpirun");
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
    case OPT_STOPPED:
        o->stopped_timeout = parse_seconds(name, v);
        break;
    case OPT_LOCAL_ADDR:
        o->local_addr = v;
        break;
    case OPT_TOKEN:
        o->token = v;
        break;
    case OPT_TOKEN_FILE:
        o->token_file = v;
        break;
    case OPT_RUN_ID:
    case OPT_RDZV_ID:
        o->run_id = v;
        break;
    case OPT_RDZV_ENDPOINT: { /* HOST, HOST:PORT or [IPv6]:PORT: node 0's store */
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
        break;
    }
    case OPT_RDZV_BACKEND:
        if (strcmp(v, "c10d") != 0 && strcmp(v, "static") != 0)
            cddprun_die_usage("--%s %s: cddprun's rendezvous is its own store on node 0, as "
                              "c10d's is (static works the same); use --%s c10d",
                              name, v, name);
        break;
    case OPT_RANKS_FILTER:
        o->shown = v;
        break;
    case OPT_USE_ENV: /* torch.distributed.launch: LOCAL_RANK is always in the environment */
        break;
    case OPT_JOIN: /* msrun: cddprun always waits for its workers */
        if (v) option_bool(name, v);
        break;
    case OPT_CLUSTER_TIME_OUT: /* msrun: how long the cluster may take to form */
        parse_int(name, v, 1, 86400);
        setenv("CDDP_RDZV_TIMEOUT_S", v, 1);
        break;
    case OPT_BIND_CORE:
        o->bind_core = v ? option_bool(name, v) : true;
        break;
    case OPT_HOSTS:
        o->hosts = v;
        break;
    case OPT_HOSTFILE:
        o->hostfile = v;
        break;
    case OPT_SSH:
        o->ssh = v;
        break;
    case OPT_ENV:
        if (!*v || *v == '=')
            cddprun_die_usage("-x/--%s '%s': expected NAME or NAME=VALUE", name, v);
        if (o->nenv == MAX_FORWARDED)
            cddprun_die_usage("-x/--%s: at most %d variables", name, MAX_FORWARDED);
        o->env[o->nenv++] = v;
        break;
    case OPT_STDIN_CONTROL:
        o->stdin_control = true;
        break;
    }
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
        int has = option_table[i].has_arg >= 2   ? optional_argument
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
    int c, idx = 0, last = 1;
    o->pass = cddp_calloc((size_t)argc + 1, sizeof *o->pass);
    opterr = 0;
    /* "+": stop at the program, so its own options are left alone. */
    while ((c = getopt_long(argc, argv, "+hmr:t::x:", longopts, &idx)) != -1) {
        if (c == 'h') {
            usage(stdout);
            exit(0);
        }
        if (c == '?') {
            if (optopt) cddprun_die_usage("unknown option -%c", optopt);
            cddprun_die_usage("unknown option or missing value: %s", argv[optind - 1]);
        }
        const char *name = c == 'm'   ? "module"
                           : c == 'r' ? "redirects"
                           : c == 't' ? "tee"
                           : c == 'x' ? "env"
                                      : longopts[idx].name;
        if (c == 'r') c = OPT_REDIRECTS;
        if (c == 't') c = OPT_TEE;
        if (c == 'x') c = OPT_ENV;
        if (c == OPT_TOKEN) o->token_in_argv = true;
        /* An optional value given as the next argument: --tee 3, --join True (msrun's) */
        const char *v = optarg;
        if (!v && c == OPT_TEE && optind < argc && looks_like_streams(argv[optind]))
            v = argv[optind++];
        if (!v && (c == OPT_JOIN || c == OPT_BIND_CORE) && optind < argc &&
            looks_like_bool(argv[optind]))
            v = argv[optind++];
        apply(o, c, name, v);
        /* The words of this option, for the nodes that --hosts starts, unless the head gives
         * them their own value (or keeps it). A bundle of short options (-mt) is passed whole
         * once getopt leaves it. */
        bool mine = c == OPT_HOSTS || c == OPT_HOSTFILE || c == OPT_SSH || c == OPT_ENV ||
                    c == OPT_NNODES || c == OPT_NODE_RANK || c == OPT_NPROC ||
                    c == OPT_LOCAL_WORKER_NUM || c == OPT_WORKER_NUM || c == OPT_MASTER_ADDR ||
                    c == OPT_MASTER_PORT || c == OPT_RDZV_ENDPOINT || c == OPT_RDZV_BACKEND ||
                    c == OPT_RDZV_ID || c == OPT_RUN_ID || c == OPT_TOKEN || c == OPT_TOKEN_FILE ||
                    c == OPT_STANDALONE || c == OPT_LOCAL_ADDR || c == OPT_STDIN_CONTROL;
        for (; last < optind; last++)
            if (!mine) o->pass[o->npass++] = argv[last];
    }
    if (optind >= argc) cddprun_die_usage("no program given");
    o->program = argv + optind;
}
