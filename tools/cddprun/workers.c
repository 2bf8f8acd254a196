/* workers.c: starting, watching and stopping cddprun's workers; their output and logs. */
#include "cddprun.h"

#include "cddp/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t cddprun_got_signal;
int cddprun_wake_pipe[2] = {-1, -1};

void cddprun_on_signal(int sig) {
    int saved = errno;
    if (sig != SIGCHLD) cddprun_got_signal = sig;
    ssize_t r = write(cddprun_wake_pipe[1], "x", 1);
    (void)r;
    errno = saved;
}

void cddprun_default_signals(void) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
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
    /* Whole lines only, so that ranks sharing the console never cut into each other's: a line
     * ends at '\n' (or, unprefixed, at a progress bar's '\r'), or when the buffer is full. */
    for (size_t i = 0; i < n; i++) {
        if (s->len < sizeof s->line - 1) s->line[s->len++] = data[i];
        bool end = data[i] == '\n' || (!s->prefix && data[i] == '\r');
        if (end || s->len == sizeof s->line - 1) {
            if (s->prefix) {
                fprintf(s->to, "[rank %d]: %.*s", w->rank, (int)s->len, s->line);
                if (s->line[s->len - 1] != '\n') fputc('\n', s->to);
            } else {
                fwrite(s->line, 1, s->len, s->to);
            }
            fflush(s->to);
            s->len = 0;
        }
    }
}

void cddprun_drain(worker *w, stream *s) {
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

static int open_log(const job *j, int local, const char *name, int *fd, char *path, size_t n) {
    char dir[PATH_MAX - 16];
    snprintf(dir, sizeof dir, "%s%s/rank.%d", j->o.logdir, j->o.log_mpirun ? "/1" : "",
             j->base + local);
    int e = cddprun_make_dirs(dir);
    if (e) return e;
    snprintf(path, n, "%s/%s", dir, name);
    /* The first attempt overwrites an earlier run's files; restarts append. */
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (j->round == 0 ? O_TRUNC : O_APPEND);
    *fd = open(path, flags, 0666);
    return *fd < 0 ? errno : 0;
}

/* ---- the guardian ------------------------------------------------------------------------ */

/* Workers die with cddprun (PR_SET_PDEATHSIG), but their own children would not: SIGKILL of
 * cddprun leaves them no one to stop them. So a guardian process, started once, holds the read
 * end of a pipe from cddprun and the process group of every worker cddprun told it about
 * ("+pgid", "-pgid" once reaped); when the pipe closes while groups remain, cddprun died with
 * its workers running: the guardian kills those groups, children and all, and exits. It ignores
 * the terminal's signals, which cddprun handles, in a process group of its own. A worker that
 * exits, failed or not, has its group killed when it is reaped: nothing it started outlives it
 * (a child that made a session of its own, setsid, escapes the group). */
static int guardian_fd = -1;

static void guardian(int in) {
    /* A process group of its own: a signal to cddprun's group (kill -9 -PGID, Ctrl-\ or Ctrl-C
     * at the terminal) does not reach it, so it is there to clean up after cddprun's death. */
    setpgid(0, 0);
    const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) signal(ignored[i], SIG_IGN);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3 && null >= 0; fd++) dup2(null, fd); /* never holds the console */
    /* every descriptor but the pipe: two calls, or one each on a kernel before close_range */
    if ((in > 3 && close_range(3, (unsigned)in - 1, 0) != 0) ||
        close_range((unsigned)in + 1, ~0u, 0) != 0)
        for (int fd = 3; fd < 4096; fd++)
            if (fd != in) close(fd);
    static pid_t groups[4096];
    int n = 0;
    char buf[4096], line[32];
    size_t len = 0;
    ssize_t r;
    while ((r = read(in, buf, sizeof buf)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] != '\n') {
                if (len < sizeof line - 1) line[len++] = buf[i];
                continue;
            }
            line[len] = '\0';
            len = 0;
            pid_t g = (pid_t)atoi(line + 1);
            if (line[0] == '+' && g > 0 && n < 4096) groups[n++] = g;
            for (int k = 0; line[0] == '-' && k < n; k++)
                if (groups[k] == g) groups[k--] = groups[--n];
        }
    }
    for (int k = 0; k < n; k++) kill(-groups[k], SIGKILL);
    _exit(0);
}

static void start_guardian(void) {
    int p[2];
    if (guardian_fd >= 0 || pipe2(p, O_CLOEXEC) != 0) return;
    pid_t g = fork();
    if (g == 0) guardian(p[0]);
    close(p[0]);
    if (g < 0) {
        close(p[1]);
        return;
    }
    guardian_fd = p[1];
}

/* Tells the guardian of a worker's process group: '+' started, '-' reaped. */
static void guard(char sign, pid_t pgid) {
    char b[24];
    int n = snprintf(b, sizeof b, "%c%d\n", sign, (int)pgid);
    if (guardian_fd >= 0 && write(guardian_fd, b, (size_t)n) != n) {
        close(guardian_fd); /* the guardian is gone: nothing to tell any more */
        guardian_fd = -1;
    }
}

/* ---- starting workers -------------------------------------------------------------------- */

/* The CPUs cddprun may run on, in order; their count (0 when they cannot be read). */
static int usable_cpus(int cpus[CPU_SETSIZE]) {
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return 0;
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) cpus[n++] = c;
    return n;
}

int cddprun_cpu_share(int n) {
    int cpus[CPU_SETSIZE], ncpu = usable_cpus(cpus);
    return ncpu >= n ? ncpu / n : 1;
}

/* --bind_core, in worker local_rank of n: its share of the CPUs cddprun may run on, in order
 * (with 8 CPUs and 4 workers, worker 1 gets the 3rd and 4th); with fewer CPUs than workers, one
 * CPU each, round the CPUs. The CPUs it was bound to, 0 when it stays unbound. */
static int bind_core(int local_rank, int n) {
    cpu_set_t mine;
    int cpus[CPU_SETSIZE], ncpu = usable_cpus(cpus);
    if (!ncpu) return 0;
    int share = cddprun_cpu_share(n);
    CPU_ZERO(&mine);
    for (int k = 0; k < share; k++) CPU_SET(cpus[(local_rank * share + k) % ncpu], &mine);
    if (sched_setaffinity(0, sizeof mine, &mine) == 0) return share;
    fprintf(stderr, "cddprun: --bind_core: local rank %d stays unbound: %s\n", local_rank,
            strerror(errno));
    return 0;
}

/* In the forked worker: its own process group (so stopping it stops its children too), death
 * with the launcher, default signal handling, its streams (the pipes, its logs, or none), the
 * environment torchrun sets and cddp's, its math threads, then the program. */
__attribute__((noreturn)) static void exec_worker(job *j, worker *w, bool pipes, const int po[2],
                                                  const int pe[2], pid_t launcher) {
    const options *o = &j->o;
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(1);
    cddprun_default_signals();
    if (o->stdin_control) { /* the head's control stream is the launcher's alone */
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        dup2(null, 0);
    }
    if (pipes) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
    } else if (o->logdir) {
        dup2(w->out.log, 1);
        dup2(w->err.log, 2);
    } else if (!w->out.console) { /* --local_ranks_filter leaves it out, no logs */
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        dup2(null, 1);
        dup2(null, 2);
    }
    /* math threads: the CPUs bound to it, else one when it shares the CPUs (unless set) */
    int threads = o->nproc_per_node > 1 ? 1 : 0, bound = 0;
    if (o->bind_core) bound = bind_core(w->local_rank, o->nproc_per_node);
    if (bound) threads = bound;
    set_env_int("RANK", w->rank);
    set_env_int("LOCAL_RANK", w->local_rank);
    set_env_int("WORLD_SIZE", j->world);
    set_env_int("LOCAL_WORLD_SIZE", o->nproc_per_node);
    set_env_int("GROUP_RANK", j->group_rank);
    set_env_int("GROUP_WORLD_SIZE", j->nodes);
    set_env_int("ROLE_RANK", w->rank);
    set_env_int("ROLE_WORLD_SIZE", j->world);
    setenv("MASTER_ADDR", o->master_addr, 1);
    setenv("MASTER_PORT", j->worker_port, 1);
    setenv(CDDP_ENV_RUN_ID, j->run_id, 1);
    setenv("TORCHELASTIC_RUN_ID", j->run_id, 1);
    set_env_int(CDDP_ENV_RESTART_COUNT, j->round);
    set_env_int("TORCHELASTIC_RESTART_COUNT", j->round);
    set_env_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
    setenv(CDDP_ENV_STORE_ADDR, o->master_addr, 1);
    setenv(CDDP_ENV_STORE_TOKEN, j->token, 1);
    setenv(CDDP_ENV_LOCAL_ADDR, j->host, 1);
    if (threads) {
        char v[16];
        snprintf(v, sizeof v, "%d", threads);
        setenv("OMP_NUM_THREADS", v, 0);
        setenv("OPENBLAS_NUM_THREADS", v, 0);
    }
    execvp(j->argv[0], j->argv);
    fprintf(stderr, "cddprun: cannot run %s: %s\n", j->argv[0], strerror(errno));
    _exit(127);
}

void cddprun_start_workers(job *j) {
    const options *o = &j->o;
    start_guardian();
    int on_console = 0; /* workers of this node that write to the console */
    bool terminal = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
    for (int i = 0; i < o->nproc_per_node; i++)
        on_console += cddprun_rank_shown(o, i) && cddprun_streams_for(&o->redirects, i) != 3;
    for (int i = 0; i < o->nproc_per_node; i++) {
        worker *w = &j->w[i];
        *w = (worker){.rank = j->base + i, .local_rank = i, .running = true};
        int redirect = cddprun_streams_for(&o->redirects, i), tee = cddprun_streams_for(&o->tee, i);
        w->out = (stream){
            .fd = -1, .log = -1, .console = !(redirect & 1), .prefix = tee & 1, .to = stdout};
        w->err = (stream){
            .fd = -1, .log = -1, .console = !(redirect & 2), .prefix = tee & 2, .to = stderr};
        if (!cddprun_rank_shown(o, i)) w->out.console = w->err.console = false;
        /* Through cddprun when a stream is prefixed, goes both to a file and the console, or
         * shares a console that is a file or a pipe with another worker's: there the workers'
         * stdio writes whole buffers, cut mid-line, and cddprun writes whole lines instead. On a
         * terminal their stdio writes line by line already, and a worker keeps the terminal (its
         * output at once, its progress bars). Else straight to its file, or to the console. */
        bool console = w->out.console || w->err.console;
        bool pipes = w->out.prefix || w->err.prefix || (o->logdir && console) ||
                     (on_console > 1 && console && !terminal);
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
        if (pid == 0) exec_worker(j, w, pipes, po, pe, launcher);
        w->pid = pid;
        w->start_mono = cddp_now_s();
        setpgid(pid, pid); /* also here, so a signal sent right away finds the group */
        guard('+', pid);
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

/* The state letter of process pid (R, S, D, T, t, Z, ...), or 0 when it cannot be read. */
static char proc_state(pid_t pid) {
    char path[48], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0) return 0;
    stat[n] = '\0';
    const char *p = strrchr(stat, ')'); /* "pid (comm) S ...": the state follows the name */
    return p && p[1] == ' ' ? p[2] : 0;
}

worker *cddprun_halted(job *j) {
    worker *longest = NULL;
    double now = cddp_now_s();
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        worker *w = &j->w[i];
        char st = w->running ? proc_state(w->pid) : 0;
        if (st != 'T' && st != 't') {
            w->halted_since = 0;
            w->halted_said = false;
            continue;
        }
        if (w->halted_since == 0) w->halted_since = now;
        if (!longest || w->halted_since < longest->halted_since) longest = w;
        if (!w->halted_said && now - w->halted_since >= 2) {
            w->halted_said = true;
            char then[96];
            if (j->o.stopped_timeout > 0)
                snprintf(then, sizeof then,
                         "cddprun stops the job if it is still stopped after "
                         "%.0f s (--stopped_timeout)",
                         j->o.stopped_timeout);
            else
                snprintf(then, sizeof then, "--stopped_timeout S stops the job sooner");
            fprintf(stderr,
                    "cddprun: rank %d (local rank %d, pid %d) is stopped (by SIGSTOP or a "
                    "debugger); the other ranks wait for it in their next collective, logging "
                    "after CDDP_STALL_WARN_S and failing after CDDP_TIMEOUT_S (%lld s); %s\n",
                    w->rank, w->local_rank, (int)w->pid,
                    (long long)cddp_knob_int(CDDP_KNOB_TIMEOUT_S), then);
        }
    }
    return longest;
}

/* Reaps exited workers; returns the number still running. */
/* Says in the job's store that worker w ended (comm/r<round>/exited/<rank>): ranks forming their
 * group wait for each other, and one that ended first, whatever its exit code, is then named at
 * once (the library reads it while it waits) instead of at CDDP_RDZV_TIMEOUT_S. */
static void exited(job *j, const worker *w) {
    char key[64], how[64];
    snprintf(key, sizeof key, "comm/r%d/exited/%d", j->round, w->rank);
    if (WIFEXITED(w->status))
        snprintf(how, sizeof how, "exited with code %d", WEXITSTATUS(w->status));
    else
        snprintf(how, sizeof how, "was killed by SIG%s",
                 sigabbrev_np(WTERMSIG(w->status)) ? sigabbrev_np(WTERMSIG(w->status)) : "?");
    cddp_error err = {0};
    if (j->store) cddp_store_set_str(j->store, key, how, &err);
}

int cddprun_reap(job *j, worker **first_failure) {
    int status, running = 0;
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        worker *w = &j->w[i];
        if (!w->running) continue;
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r == w->pid) {
            w->end_wall = cddprun_wall_s();
            kill(-w->pid, SIGKILL); /* what the worker started and left behind: its group */
            guard('-', w->pid);
            w->running = false;
            w->status = status;
            w->end_time = (double)time(NULL);
            bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            exited(j, w);
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
void cddprun_pump(job *j, double timeout_s) {
    struct pollfd pf[1 + 2 * 4096];
    worker *who[1 + 2 * 4096];
    stream *what[1 + 2 * 4096];
    int n = 0;
    pf[n++] = (struct pollfd){cddprun_wake_pipe[0], POLLIN, 0};
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
        while (read(cddprun_wake_pipe[0], b, sizeof b) > 0) {}
    }
    for (int i = 1; i < n; i++)
        if (pf[i].revents) cddprun_drain(who[i], what[i]);
}

/* Stops every running worker: SIGTERM to its process group, SIGKILL after the grace period. */
void cddprun_stop_workers(job *j, int sig) {
    for (int i = 0; i < j->o.nproc_per_node; i++)
        if (j->w[i].running) {
            j->w[i].stopped = true;
            kill(-j->w[i].pid, sig);
            kill(-j->w[i].pid, SIGCONT); /* a stopped worker acts on the signal only once it runs */
        }
    double deadline = cddp_now_s() + j->o.grace_period;
    while (cddprun_reap(j, NULL) > 0 && cddp_now_s() < deadline) cddprun_pump(j, 0.05);
    if (cddprun_reap(j, NULL) > 0) {
        for (int i = 0; i < j->o.nproc_per_node; i++)
            if (j->w[i].running) kill(-j->w[i].pid, SIGKILL);
        while (cddprun_reap(j, NULL) > 0) cddprun_pump(j, 0.05);
    }
    /* Whatever the workers wrote before they went. */
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        if (j->w[i].out.fd >= 0) cddprun_drain(&j->w[i], &j->w[i].out);
        if (j->w[i].err.fd >= 0) cddprun_drain(&j->w[i], &j->w[i].err);
    }
}

/* The cgroup's count of OOM kills, or -1 where that cannot be read. */
