/* validate.c: cddprun's checks before anything starts, the job's secret and the workers' argv. */
#include "cddprun.h"
#include "cddp/launch.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

void cddprun_job_token(const options *o, char *out) {
    if (o->token && o->token_file)
        cddprun_die_usage("--token and --token_file both give the job's secret: give one");
    if (o->token_file) {
        unsigned mode = 0;
        cddp_error err = {0};
        if (cddp_net_read_secret(o->token_file, out, &mode, &err) != CDDP_OK)
            cddprun_die_usage("--token_file %s", err.msg);
        if (mode & 077)
            fprintf(stderr,
                    "cddprun: warning: --token_file %s can be read by other users (mode %04o); "
                    "chmod 600 it\n",
                    o->token_file, mode);
    } else if (o->token) {
        if (!*o->token || strlen(o->token) > CDDPRUN_MAX_TOKEN)
            cddprun_die_usage("--token: the secret must have 1 to %d bytes", CDDPRUN_MAX_TOKEN);
        snprintf(out, CDDPRUN_MAX_TOKEN + 1, "%s", o->token);
        if (o->token_in_argv)
            fprintf(stderr,
                    "cddprun: warning: every user of this machine can read --token on the "
                    "command line (ps, /proc/%d/cmdline); put the secret in a file only you can "
                    "read and pass --token_file FILE, or set CDDPRUN_TOKEN\n",
                    (int)getpid());
    } else if (o->nnodes == 1) {
        cddprun_random_hex(out, 16);
    } else {
        cddprun_die_usage(
            "a job on %d nodes needs a secret that every node shares, or any process that can "
            "reach %s could join it. Make one and give it to cddprun on every node:\n"
            "    (umask 077; head -c 32 /dev/urandom | base64 > ~/.cddp-token)\n"
            "    cddprun --token_file ~/.cddp-token ...\n"
            "(or set CDDPRUN_TOKEN in every node's environment)",
            o->nnodes, CDDP_NET_ENDPOINT(o->master_addr, o->master_port));
    }
}

/* The argv to exec: python3 for .py programs and -m, the program itself otherwise. */
char **cddprun_worker_argv(const options *o) {
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

bool cddprun_rank_shown(const options *o, int local_rank) {
    return !o->show || o->show[local_rank];
}

/* msrun's --worker_num (every node's workers): the node count, unless --nnodes gives it. */
static void check_worker_num(options *o) {
    if (!o->worker_num) return;
    if (!o->nproc_given)
        cddprun_die_usage("--worker_num %d needs --local_worker_num (workers on this node)",
                          o->worker_num);
    if (o->nnodes_given && o->worker_num != o->nnodes * o->nproc_per_node)
        cddprun_die_usage("--worker_num %d is not --nnodes %d x %d workers per node", o->worker_num,
                          o->nnodes, o->nproc_per_node);
    if (o->worker_num % o->nproc_per_node)
        cddprun_die_usage("--worker_num %d is not a multiple of --local_worker_num %d (cddprun "
                          "starts as many workers on every node)",
                          o->worker_num, o->nproc_per_node);
    o->nnodes = o->nnodes_min = o->worker_num / o->nproc_per_node;
}

/* --local_ranks_filter: local ranks of this node, separated by commas, into o->show. */
static void check_shown(options *o) {
    if (!o->shown) return;
    o->show = cddp_calloc((size_t)o->nproc_per_node, sizeof *o->show);
    if (!o->show) cddprun_die_usage("out of memory");
    for (const char *p = o->shown; *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r >= o->nproc_per_node || (*end && *end != ','))
            cddprun_die_usage("--local_ranks_filter %s: expected local ranks of this node "
                              "(0..%d) separated by commas, such as 0,1",
                              o->shown, o->nproc_per_node - 1);
        o->show[r] = true;
        p = *end ? end + 1 : end;
    }
}

/* Inside an srun step, one cddprun per node: the node count, this node's rank and node 0's
 * address and port come from the step (the port as its tasks derive it, cddp_slurm_step_read),
 * unless given. A step of several tasks on a node would start several node 0s. */
static void slurm_defaults(options *o) {
    cddp_slurm_step s;
    if (o->standalone || o->nnodes_given || o->node_rank_given || o->worker_num ||
        !cddp_slurm_step_read(&s))
        return;
    if (s.nnodes < 1 || s.node < 0 || s.ntasks != s.nnodes)
        cddprun_die_usage(
            "started by srun as task %d of %d on %d node%s: cddprun starts a node's workers "
            "itself, so start one per node (srun --ntasks-per-node=1 cddprun ...), or give "
            "--nnodes and --node_rank",
            s.task, s.ntasks, s.nnodes, s.nnodes == 1 ? "" : "s");
    o->nnodes = o->nnodes_min = s.nnodes;
    o->node_rank = s.node;
    o->node_rank_from_step = true;
    static char host[sizeof s.first_host];
    snprintf(host, sizeof host, "%s", s.first_host);
    if (!o->addr_given) o->master_addr = host;
    if (!o->port_given) o->master_port = s.port;
    if (s.node == 0)
        fprintf(stderr, "cddprun: srun step %d.%d: %d node%s, node 0's store at %s\n", s.job,
                s.step, s.nnodes, s.nnodes == 1 ? "" : "s",
                CDDP_NET_ENDPOINT(o->master_addr, o->master_port));
}

void cddprun_validate(options *o) {
    slurm_defaults(o);
    check_worker_num(o);
    check_shown(o);
    if (o->node_rank >= o->nnodes)
        cddprun_die_usage("--node_rank %d is out of range for --nnodes %d (0..%d)", o->node_rank,
                          o->nnodes, o->nnodes - 1);
    if (o->standalone && o->nnodes > 1)
        cddprun_die_usage("--standalone is for one node (--nnodes 1)");
    bool redirects = o->redirects.all != 0;
    for (int i = 0; i < o->redirects.nmap; i++) redirects |= o->redirects.map[i].value != 0;
    if (redirects && !o->logdir)
        cddprun_die_usage("--%s needs --logdir (where should the output go?)", o->redirect_name);
    if (o->log_mpirun && !o->logdir)
        cddprun_die_usage("--log_layout needs --logdir (where should the output go?)");
    const stream_spec *specs[2] = {&o->tee, &o->redirects};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < specs[k]->nmap; i++)
            if (specs[k]->map[i].local_rank >= o->nproc_per_node)
                cddprun_die_usage(
                    "--%s: local rank %d is not on this node (--nproc_per_node %d: 0..%d)",
                    k ? o->redirect_name : "tee", specs[k]->map[i].local_rank, o->nproc_per_node,
                    o->nproc_per_node - 1);
    cddprun_check_program(o);
}

void cddprun_check_program(const options *o) {
    if (o->no_python && o->module)
        cddprun_die_usage("--no_python and -m/--module exclude each other");
    bool python = o->module || (!o->no_python && ends_with(o->program[0], ".py"));
    if (python && !on_path("python3"))
        cddprun_die_usage(
            "%s needs python3, which is not on PATH (use --no_python to run it directly)",
            o->program[0]);
    if (!o->module && !python && !on_path(o->program[0]))
        cddprun_die_usage("program '%s' not found (not an executable file, not on PATH)",
                          o->program[0]);
    if (!o->module && python && access(o->program[0], R_OK) != 0)
        cddprun_die_usage("script '%s' not found", o->program[0]);
}
