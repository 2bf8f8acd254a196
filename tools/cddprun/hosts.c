/* hosts.c: one command, many hosts. `cddprun --hosts h0:2,h1:2 ./train` (or --hostfile FILE)
 * makes this launcher the head: it starts one node launcher per host, this cddprun at this path,
 * over ssh where the host is another machine and directly where it is this one, and stays with
 * them until they end.
 *
 * A node's launcher gets its rank (the host's place in the list), its slots, node 0's address
 * (the first host) and the options given here, and --stdin_control: the head writes the job's
 * secret and the environment the job needs to its stdin (never on a command line, where other
 * users read it), then keeps that stdin open. When it closes (the head stops the job, or dies, or
 * its ssh connection breaks) the node stops its workers and exits. So nothing outlives the head,
 * and no agent of ours runs on the other hosts: only ssh's server and cddprun itself.
 *
 * The stream on a node's stdin: the secret, '\n', then NAME=VALUE entries each ending in '\0',
 * then an empty entry ('\0'). */
#include "cddprun.h"

#include "cddp/net.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_HOSTS 4096

typedef struct host {
    char login[256];  /* as ssh takes it: [user@]name */
    const char *name; /* in login, after the user */
    char addr[256];   /* name without an IPv6 address's brackets */
    char slots[16];   /* its ranks, as its launcher's --nproc_per_node */
    bool here;        /* this machine: started without ssh */
    pid_t pid;        /* its launcher (or the ssh running it); 0 once reaped */
    int control;      /* the write end of its stdin; -1 once closed */
    int status;
} host;

/* The head's heartbeat on each node's control stream; a node that goes CDDP_HEAD_SILENT_S without
 * it stops as if the head had stopped the job (docs/DISTRIBUTED.md states the bound). */
#define HEAD_BEAT_S 1.0

/* ---- the host list ------------------------------------------------------------------------ */

static void strip(char *s) {
    char *a = s;
    while (isspace((unsigned char)*a)) a++;
    memmove(s, a, strlen(a) + 1);
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
}

/* One host, "[user@]name[:slots]" or "[user@][v6]:slots", with the slots of a hostfile's
 * "slots=N" already split off (slots, or NULL). where: what to name in an error. */
static void add_host(host *h, int *n, char *entry, const char *slots, const char *where,
                     const options *o) {
    strip(entry);
    if (*n == MAX_HOSTS) cddprun_die_usage("%s: at most %d hosts", where, MAX_HOSTS);
    char *colon = NULL, *at = strchr(entry, '@');
    char *name = at ? at + 1 : entry;
    if (*name == '[') {
        char *end = strchr(name, ']');
        if (!end || (end[1] && end[1] != ':'))
            cddprun_die_usage("%s: '%s': expected [ADDRESS]:SLOTS", where, entry);
        colon = end[1] ? end + 1 : NULL;
    } else {
        colon = strchr(name, ':');
    }
    if (colon && slots)
        cddprun_die_usage("%s: '%s' gives the slots twice (name:S or name slots=S)", where, entry);
    if (colon) *colon = 0, slots = colon + 1;
    /* A name ssh and a shell take as they are: no option (-o...), no spaces or quotes. */
    bool ok = *name && *name != '-' && *entry != '-' && (!at || at > entry);
    for (const char *c = entry; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || strchr("._-@[]:%", *c);
    if (!ok) cddprun_die_usage("%s: '%s' is not a host name, [user@]name or address", where, entry);
    host *x = &h[*n];
    snprintf(x->login, sizeof x->login, "%s", entry);
    x->name = x->login + (name - entry);
    snprintf(x->addr, sizeof x->addr, "%.*s", (int)strcspn(x->name + (*x->name == '['), "]"),
             x->name + (*x->name == '['));
    if (slots) {
        char what[300];
        snprintf(what, sizeof what, "%s: %s's slots", where, x->name);
        int64_t s = 0;
        cddp_error err = {0};
        if (cddp_parse_int(what, slots, 1, 4096, &s, &err)) cddprun_die_usage("%s", err.msg);
        snprintf(x->slots, sizeof x->slots, "%d", (int)s);
    } else {
        snprintf(x->slots, sizeof x->slots, "%s", o->nproc_text ? o->nproc_text : "1");
    }
    for (int k = 0; k < *n; k++)
        if (!strcmp(h[k].name, x->name))
            cddprun_die_usage("%s: host %s is listed twice: give it once, with all its slots",
                              where, x->name);
    (*n)++;
}

/* --hosts h0:2,h1:2 or --hostfile FILE into h; returns how many. */
static int read_hosts(const options *o, host *h) {
    int n = 0;
    if (o->hosts && o->hostfile) cddprun_die_usage("--hosts and --hostfile both list the hosts");
    if (o->hosts) {
        char *list = cddp_strdup(o->hosts), *save = NULL;
        for (char *e = strtok_r(list, ",", &save); e; e = strtok_r(NULL, ",", &save))
            add_host(h, &n, e, NULL, "--hosts", o);
        /* the entries were copied */
        cddp_free(list);
        if (!n) cddprun_die_usage("--hosts '%s': no host", o->hosts);
        return n;
    }
    FILE *f = fopen(o->hostfile, "r");
    if (!f) cddprun_die_usage("--hostfile %s: %s", o->hostfile, strerror(errno));
    char line[1024], where[PATH_MAX + 32];
    for (int ln = 1; fgets(line, sizeof line, f); ln++) {
        snprintf(where, sizeof where, "--hostfile %s, line %d", o->hostfile, ln);
        line[strcspn(line, "#\n")] = 0;
        strip(line);
        if (!*line) continue;
        char *save = NULL, *name = strtok_r(line, " \t", &save), *slots = NULL;
        for (char *w = strtok_r(NULL, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
            if (strncmp(w, "slots=", 6) != 0)
                cddprun_die_usage("%s: '%s': expected `name slots=N`, `name:N` or `name`", where,
                                  w);
            slots = w + 6;
        }
        add_host(h, &n, name, slots, where, o);
    }
    fclose(f);
    if (!n) cddprun_die_usage("--hostfile %s lists no host", o->hostfile);
    return n;
}

/* Whether name is this machine (its launcher starts without ssh). */
static bool is_here(const char *name) {
    char me[256] = "";
    gethostname(me, sizeof me);
    return !strcmp(name, me) || !strcmp(name, "localhost") || cddp_net_is_loopback(name) ||
           cddprun_can_listen(name);
}

/* ---- what every node gets ----------------------------------------------------------------- */

/* Whether the head forwards variable NAME=... (env: the entry): the job's own settings, the
 * libraries', and where programs are; not what describes one host or one job's launcher (the
 * head gives those per node, or they are the head's own). */
static bool forwarded(const char *env) {
    static const char *const prefixes[] = {"CDDP_", "CDDPRUN_", "OMP_",   "OPENBLAS_",
                                           "GOTO_", "MKL_",     "DNNL_",  "ONEDNN_",
                                           "NCCL_", "CUDA_",    "PYTHON", "TORCH_"};
    static const char *const names[] = {"PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV"};
    static const char *const never[] = {"CDDP_HOST_ID",
                                        "CDDP_LOCAL_ADDR",
                                        "CDDP_STORE_ADDR",
                                        "CDDP_STORE_PORT",
                                        "CDDP_STORE_TOKEN",
                                        "CDDP_RUN_ID",
                                        "CDDP_RESTART_COUNT",
                                        "CDDPRUN_HOSTS",
                                        "CDDPRUN_HOSTFILE",
                                        "CDDPRUN_SSH",
                                        "CDDPRUN_ENV",
                                        "CDDPRUN_NNODES",
                                        "CDDPRUN_NODE_RANK",
                                        "CDDPRUN_NPROC_PER_NODE",
                                        "CDDPRUN_LOCAL_WORKER_NUM",
                                        "CDDPRUN_WORKER_NUM",
                                        "CDDPRUN_MASTER_ADDR",
                                        "CDDPRUN_MASTER_PORT",
                                        "CDDPRUN_RDZV_ENDPOINT",
                                        "CDDPRUN_RDZV_ID",
                                        "CDDPRUN_RUN_ID",
                                        "CDDPRUN_TOKEN",
                                        "CDDPRUN_TOKEN_FILE",
                                        "CDDPRUN_STANDALONE",
                                        "CDDPRUN_LOCAL_ADDR",
                                        "CDDPRUN_STDIN_CONTROL"};
    size_t len = strcspn(env, "=");
    for (size_t i = 0; i < CDDP_ARRAY_LEN(never); i++)
        if (strlen(never[i]) == len && !strncmp(env, never[i], len)) return false;
    for (size_t i = 0; i < CDDP_ARRAY_LEN(names); i++)
        if (strlen(names[i]) == len && !strncmp(env, names[i], len)) return true;
    for (size_t i = 0; i < CDDP_ARRAY_LEN(prefixes); i++)
        if (!strncmp(env, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

typedef struct text {
    char *p;
    size_t n, cap;
} text;

static void put(text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->p = cddp_realloc(t->p, t->cap);
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void puts_(text *t, const char *s) {
    put(t, s, strlen(s));
}

/* s quoted for a POSIX shell: 'it'\''s'. */
static void put_quoted(text *t, const char *s) {
    put(t, "'", 1);
    for (; *s; s++)
        if (*s == '\'')
            put(t, "'\\''", 4);
        else
            put(t, s, 1);
    put(t, "'", 1);
}

/* The control stream: the secret, then the forwarded environment, -x's last. */
static text control_stream(const options *o, const char *token) {
    extern char **environ;
    text t = {0};
    puts_(&t, token);
    puts_(&t, "\n");
    for (char **e = environ; *e; e++)
        if (forwarded(*e)) put(&t, *e, strlen(*e) + 1);
    for (int i = 0; i < o->nenv; i++) {
        bool given = strchr(o->env[i], '=') != NULL; /* NAME=VALUE */
        const char *v = given ? NULL : getenv(o->env[i]);
        if (!given && !v) {
            fprintf(stderr, "cddprun: warning: -x %s: not set here, not forwarded\n", o->env[i]);
            continue;
        }
        puts_(&t, o->env[i]);
        if (v) puts_(&t, "="), puts_(&t, v);
        put(&t, "", 1);
    }
    put(&t, "", 1);
    return t;
}

/* The node launcher's argv for host k of n. */
static char **node_argv(const options *o, const host *h, int k, int n, const char *self,
                        const char *addr) {
    static char nnodes[32], rank[16], port[16];
    int extra = 16, m = 0;
    for (char **p = o->program; *p; p++) extra++;
    char **argv = cddp_calloc((size_t)(o->npass + extra), sizeof *argv);
    if (o->nnodes_min < n)
        snprintf(nnodes, sizeof nnodes, "%d:%d", o->nnodes_min, n);
    else
        snprintf(nnodes, sizeof nnodes, "%d", n);
    snprintf(rank, sizeof rank, "%d", k);
    snprintf(port, sizeof port, "%d", o->master_port);
    const char *fixed[] = {self,
                           "--stdin_control",
                           "--nnodes",
                           nnodes,
                           "--node_rank",
                           rank,
                           "--nproc_per_node",
                           h[k].slots,
                           "--master_addr",
                           addr,
                           "--master_port",
                           port};
    for (size_t i = 0; i < CDDP_ARRAY_LEN(fixed); i++) argv[m++] = (char *)fixed[i];
    if (o->run_id) argv[m++] = "--run_id", argv[m++] = (char *)o->run_id;
    for (int i = 0; i < o->npass; i++) argv[m++] = o->pass[i];
    argv[m++] = "--";
    for (char **p = o->program; *p; p++) argv[m++] = *p;
    return argv;
}

/* The remote command for ssh: in this directory, this cddprun, argv quoted. */
static text remote_command(const char *cwd, const char *name, char **argv) {
    text t = {0}, msg = {0};
    puts_(&msg, "cddprun: ");
    puts_(&msg, name);
    puts_(&msg, " has no directory ");
    puts_(&msg, cwd);
    puts_(&msg, " (cddprun --hosts starts every node in the directory it was started in)");
    puts_(&t, "cd ");
    put_quoted(&t, cwd);
    puts_(&t, " 2>/dev/null || { echo ");
    put_quoted(&t, msg.p);
    puts_(&t, " >&2; exit 2; }; exec");
    for (char **a = argv; *a; a++) puts_(&t, " "), put_quoted(&t, *a);
    cddp_free(msg.p);
    return t;
}

/* ---- the head ------------------------------------------------------------------------------ */

/* Starts host x's launcher with argv (over ssh unless it is here); its stdin the control pipe,
 * fed the control stream. */
static void start_node(host *x, char **argv, const char *cwd, const options *o,
                       const text *control) {
    char *ssh[64];
    int m = 0;
    /* ssh's words: at most 48 of the user's, then ours, the host and the command */
    text cmd = {0};
    char *words = NULL;
    if (!x->here) {
        words = cddp_strdup(o->ssh ? o->ssh : "ssh");
        char *save = NULL;
        for (char *w = strtok_r(words, " \t", &save); w && m < 48; w = strtok_r(NULL, " \t", &save))
            ssh[m++] = w;
        if (!m) cddprun_die_usage("--ssh '%s': no command", o->ssh);
        /* after the user's options, which win (ssh takes an option's first value) */
        const char *ours[] = {"-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-T", "-x"};
        for (size_t i = 0; i < CDDP_ARRAY_LEN(ours); i++) ssh[m++] = (char *)ours[i];
        ssh[m++] = x->login;
        cmd = remote_command(cwd, x->name, argv);
        ssh[m++] = cmd.p;
        ssh[m] = NULL;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "cddprun: pipe: %s\n", strerror(errno));
        exit(1);
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "cddprun: cannot start host %s's launcher: %s\n", x->name, strerror(errno));
        exit(1);
    }
    if (pid == 0) {
        /* Its own process group: Ctrl-C reaches the head, which stops the nodes in order (an
         * ssh that got SIGINT itself would drop its node's last words). */
        setpgid(0, 0);
        dup2(p[0], 0);
        cddprun_default_signals();
        char **run = x->here ? argv : ssh;
        execvp(run[0], run);
        fprintf(stderr, "cddprun: cannot run %s: %s\n", run[0], strerror(errno));
        _exit(127);
    }
    close(p[0]);
    x->pid = pid;
    x->control = p[1];
    for (size_t off = 0; off < control->n;) {
        ssize_t w = write(x->control, control->p + off, control->n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* it ended already: its exit says why */
        off += (size_t)w;
    }
    fcntl(x->control, F_SETFL, O_NONBLOCK); /* the heartbeats never block the head */
    cddp_free(cmd.p);
    cddp_free(words);
}

/* What host k's launcher's exit says, when it is not 0. */
static void explain(const options *o, const host *x, int k) {
    int st = x->status;
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "cddprun: node %d (host %s): its %s was killed by SIG%s\n", k, x->name,
                x->here ? "launcher" : "ssh", sigabbrev_np(WTERMSIG(st)));
        return;
    }
    int c = WEXITSTATUS(st);
    if (!x->here && c == 255)
        fprintf(stderr,
                "cddprun: node %d (host %s): ssh exited 255: it could not reach or log in to "
                "%s, or the connection broke (ssh's message is above). --hosts needs ssh to "
                "every host without a prompt: `%s %s true` must work\n",
                k, x->name, x->login, o->ssh ? o->ssh : "ssh", x->login);
    else if (c == 127 || c == 126)
        fprintf(stderr,
                "cddprun: node %d (host %s): could not run cddprun there (exit %d): it must be "
                "at this one's path on every host\n",
                k, x->name, c);
    else if (c != 1) /* 1: the job failed, and the node's report above says how */
        fprintf(stderr, "cddprun: node %d (host %s): its launcher exited %d\n", k, x->name, c);
}

/* Closes every node's control stream: each stops its workers and exits. */
static void stop_nodes(host *h, int n) {
    for (int k = 0; k < n; k++)
        if (h[k].control >= 0) close(h[k].control), h[k].control = -1;
}

/* The options that do not go with --hosts, refused; --nnodes against the n hosts. */
static void check_with_hosts(options *o, int n) {
    if (o->node_rank_given)
        cddprun_die_usage("--node_rank with --hosts: each host's rank is its place in the list");
    if (o->standalone) cddprun_die_usage("--standalone is for one node, --hosts for several");
    if (o->local_addr)
        cddprun_die_usage("--local_addr with --hosts: each node finds its own address (set "
                          "CDDP_SOCKET_IFNAME to choose the interface on every host)");
    if (o->worker_num)
        cddprun_die_usage("--worker_num with --hosts: the slots give each host's workers");
    if (o->stdin_control) cddprun_die_usage("--stdin_control is for the nodes --hosts starts");
    if (o->nnodes_given && o->nnodes != n)
        cddprun_die_usage("--nnodes %d:%d with %d hosts: with --hosts, MAX is the number of hosts",
                          o->nnodes_min, o->nnodes, n);
    if (!o->nnodes_given) o->nnodes_min = n;
    o->nnodes = n;
}

/* Node 0's store: at the first host's name, but where that is a loopback name of this machine
 * (localhost) and other machines take part (remote), at this machine's name; into addr. */
static void store_address(const options *o, const host *h, bool remote, char *addr, size_t cap) {
    if (o->addr_given) {
        snprintf(addr, cap, "%s", o->master_addr);
    } else if (remote && (!strcmp(h[0].addr, "localhost") || cddp_net_is_loopback(h[0].addr))) {
        if (gethostname(addr, cap) != 0) snprintf(addr, cap, "%s", h[0].addr);
        fprintf(stderr,
                "cddprun: node 0 is this machine, as %s, which the other hosts cannot reach: "
                "they reach its store at %s (--master_addr chooses)\n",
                h[0].addr, addr);
    } else {
        snprintf(addr, cap, "%s", h[0].addr);
    }
}

/* The nodes that ended since the last look, reaped: each failure explained, the status of the
 * first taken, and when the others are to be stopped (*stop_at: node 0 ended, or a node failed
 * in a fixed-size job; at once when it never joined). Returns how many ended. */
static int reap_nodes(const options *o, host *h, int n, bool elastic, int running, double kill_at,
                      int *status, double *stop_at) {
    int st, ended = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
        for (int k = 0; k < n; k++) {
            if (h[k].pid != pid) continue;
            h[k].pid = 0, h[k].status = st;
            ended++;
            if (h[k].control >= 0) close(h[k].control), h[k].control = -1;
            bool failed = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
            /* one the head stopped says so itself (exit 129: its SIGHUP) */
            bool stopped = kill_at >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGHUP;
            if (failed && !stopped) explain(o, &h[k], k);
            if (failed && !*status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
            int c = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            bool never = c == 255 || c == 127 || c == 126 || c == 2;
            double at = cddp_now_s() + (never && !elastic ? 0 : o->grace_period + 10);
            if ((k == 0 || (failed && !elastic)) && running - ended > 0 &&
                (*stop_at < 0 || at < *stop_at))
                *stop_at = at;
        }
    return ended;
}

/* Watch. A node that ended with an error in a fixed-size job ends the job: the others end by
 * themselves once its failure is in the store (node 0 after its report); after --grace_period +
 * 10 s, or at once when that node never joined (ssh failed, no cddprun there, a usage error),
 * they are stopped. Node 0 ending ends every job. Each node hears the head's heartbeat on its
 * control stream. Returns the job's status. */
static int watch_nodes(const options *o, host *h, int n) {
    bool elastic = o->nnodes_min < n;
    int running = 0, status = 0;
    for (int k = 0; k < n; k++) running += h[k].pid > 0;
    double stop_at = cddprun_got_signal ? 0 : -1, kill_at = -1;
    bool said = false;
    double beat = 0;
    while (running > 0) {
        struct pollfd pf = {cddprun_wake_pipe[0], POLLIN, 0};
        poll(&pf, 1, 200);
        if (cddp_now_s() >= beat) { /* the heartbeat: a node that hears none stops (watch_head) */
            for (int k = 0; k < n; k++)
                if (h[k].control >= 0) { /* a node that ended is reaped below; a full pipe hears
                                            the next beat */
                    ssize_t w = write(h[k].control, ".", 1);
                    (void)w;
                }
            beat = cddp_now_s() + HEAD_BEAT_S;
        }
        char b[64];
        while (read(cddprun_wake_pipe[0], b, sizeof b) > 0) {}
        running -= reap_nodes(o, h, n, elastic, running, kill_at, &status, &stop_at);
        if (cddprun_got_signal && !said) {
            fprintf(stderr, "cddprun: got SIG%s; stopping every node\n",
                    sigabbrev_np(cddprun_got_signal));
            stop_at = 0;
        }
        if (stop_at >= 0 && cddp_now_s() >= stop_at && kill_at < 0 && running > 0) {
            if (!said && !cddprun_got_signal)
                fprintf(stderr, "cddprun: stopping the %d node%s still running\n", running,
                        running == 1 ? "" : "s");
            stop_nodes(h, n);
            kill_at = cddp_now_s() + o->grace_period + 5;
        }
        said |= cddprun_got_signal != 0;
        if (kill_at >= 0 && cddp_now_s() >= kill_at) {
            for (int k = 0; k < n; k++)
                if (h[k].pid > 0) {
                    fprintf(stderr, "cddprun: node %d (host %s) did not stop: killing its %s\n", k,
                            h[k].name, h[k].here ? "launcher" : "ssh");
                    kill(h[k].pid, SIGKILL);
                }
            kill_at = cddp_now_s() + 3600;
        }
    }
    /* An elastic job's result is node 0's (a node lost on the way is what it is for). */
    if (elastic) status = WIFEXITED(h[0].status) ? WEXITSTATUS(h[0].status) : 1;
    return cddprun_got_signal ? 128 + cddprun_got_signal : status;
}

int cddprun_hosts_main(options *o) {
    host *h = cddp_calloc(MAX_HOSTS, sizeof *h);
    int n = read_hosts(o, h);
    check_with_hosts(o, n);
    cddprun_check_program(o);
    char token[CDDPRUN_MAX_TOKEN + 1];
    if (o->token || o->token_file) {
        cddprun_job_token(o, token);
    } else {
        cddprun_random_hex(token, 16); /* made here, known only to the nodes */
    }
    bool remote = false;
    for (int k = 0; k < n; k++) {
        h[k].here = is_here(h[k].addr);
        h[k].control = -1;
        remote |= !h[k].here;
    }
    static char addr[256];
    store_address(o, h, remote, addr, sizeof addr);
    char self[PATH_MAX], cwd[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || !getcwd(cwd, sizeof cwd)) {
        fprintf(stderr, "cddprun: cannot find this program's path or the working directory\n");
        return 1;
    }
    self[len] = 0;
    fprintf(stderr, "cddprun: %d host%s:", n, n == 1 ? "" : "s");
    for (int k = 0; k < n; k++) {
        fprintf(stderr, "%s %s (%s rank%s, %s)", k ? "," : "", h[k].name, h[k].slots,
                strcmp(h[k].slots, "1") ? "s" : "",
                h[k].here ? "here"
                : o->ssh  ? o->ssh
                          : "ssh");
    }
    fprintf(stderr, "; node 0's store at %s\n", CDDP_NET_ENDPOINT(addr, o->master_port));

    if (pipe2(cddprun_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
    struct sigaction sa = {.sa_handler = cddprun_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    text control = control_stream(o, token);
    for (int k = 0; k < n && !cddprun_got_signal; k++) {
        char **argv = node_argv(o, h, k, n, self, addr);
        start_node(&h[k], argv, cwd, o, &control);
        cddp_free(argv);
    }
    cddp_free(control.p);
    int status = watch_nodes(o, h, n);
    cddp_free(h);
    return status;
}

/* ---- a node the head started ---------------------------------------------------------------- */

/* Waits for the head's end of stdin, or CDDP_HEAD_SILENT_S without its heartbeat (a head whose host
 * or link vanished closes nothing: its ssh session lingers on this host); then stops this
 * launcher as SIGHUP does. */
static void *watch_head(void *arg) {
    char b[64];
    const double *limits = arg; /* the grace period, then CDDP_HEAD_SILENT_S */
    double silent_s = limits[1];
    double heard = cddp_now_s();
    bool silent = false;
    for (;;) {
        struct pollfd pf = {STDIN_FILENO, POLLIN, 0};
        double left = heard + silent_s - cddp_now_s();
        if (left <= 0) {
            silent = true;
            break;
        }
        /* a second at a time at most: the time is looked at again above */
        if (poll(&pf, 1, (int)(CDDP_MIN(left, 1.0) * 1000) + 1) <= 0) continue;
        ssize_t r = read(STDIN_FILENO, b, sizeof b);
        if (r > 0) heard = cddp_now_s();
        if (r > 0 || (r < 0 && (errno == EINTR || errno == EAGAIN))) continue;
        break;
    }
    static const char closed[] = "cddprun: stopping this node: the cddprun --hosts that started "
                                 "it stopped the job or is gone (its control stream closed)\n";
    char msg[256];
    int len = snprintf(msg, sizeof msg,
                       "cddprun: stopping this node: the cddprun --hosts that started it sent "
                       "nothing for %.0f s (CDDP_HEAD_SILENT_S: its host, or the network to it, "
                       "is gone)\n",
                       silent_s);
    ssize_t w = silent ? write(STDERR_FILENO, msg, (size_t)len)
                       : write(STDERR_FILENO, closed, sizeof closed - 1);
    (void)w;
    kill(getpid(), SIGHUP);
    if (!silent) return NULL;
    /* The head's host is gone, and node 0's store most likely with it: this launcher's last words
     * to the store would wait for its replies (CDDP_STORE_REPLY_S). It ends once its workers had
     * their grace period; the guardian then ends what of theirs is left. */
    double grace = limits[0];
    struct timespec ts = {(time_t)(grace + 3), 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    _exit(128 + SIGHUP);
}

void cddprun_stdin_control(options *o, char *token) {
    text t = {0};
    char b[4096];
    /* the secret's line, then entries up to an empty one: "...\0\0" after the '\n' */
    for (;;) {
        char *nl = t.n ? memchr(t.p, '\n', t.n) : NULL;
        if (nl) {
            size_t at = (size_t)(nl - t.p) + 1;
            bool end = t.n > at && t.p[at] == 0;
            for (size_t i = at; !end && i + 1 < t.n; i++) end = !t.p[i] && !t.p[i + 1];
            if (end) break;
        }
        ssize_t r = read(STDIN_FILENO, b, sizeof b);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fprintf(stderr, "cddprun: --stdin_control: stdin ended before the job's secret and "
                            "environment (this option is for the nodes cddprun --hosts starts)\n");
            exit(2);
        }
        put(&t, b, (size_t)r);
    }
    char *nl = memchr(t.p, '\n', t.n);
    *nl = 0;
    if (!*t.p || strlen(t.p) > CDDPRUN_MAX_TOKEN) {
        fprintf(stderr, "cddprun: --stdin_control: no job secret on stdin\n");
        exit(2);
    }
    snprintf(token, CDDPRUN_MAX_TOKEN + 1, "%s", t.p);
    for (char *e = nl + 1; *e; e += strlen(e) + 1) {
        char *eq = strchr(e, '=');
        if (!eq) continue;
        *eq = 0;
        setenv(e, eq + 1, 1);
        *eq = '=';
    }
    cddp_free(t.p);
    o->token = token;
    o->token_file = NULL;
    o->token_in_argv = false;
    pthread_t tid;
    static double limits[2]; /* read after the environment above is set: the head's */
    limits[0] = o->grace_period;
    limits[1] = (double)CDDP_MAX(cddp_knob_int(CDDP_KNOB_HEAD_SILENT_S), 1);
    if (pthread_create(&tid, NULL, watch_head, limits) != 0) {
        fprintf(stderr, "cddprun: cannot watch stdin: %s\n", strerror(errno));
        exit(1);
    }
    pthread_detach(tid);
}
