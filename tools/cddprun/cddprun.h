/* cddprun.h: what the launcher's files share (the launcher is described in main.c).
 *
 *   options.c     the options: table, parsing (command line and CDDPRUN_*), --help
 *   validate.c    the checks before anything starts, the job's secret, the workers' argv
 *   hosts.c       one command, many hosts: --hosts starts every node's launcher (ssh)
 *   workers.c     starting, watching, stopping workers; their output and logs
 *   rendezvous.c  meeting the other nodes in the store; failures they post
 *   report.c      what the report says about a worker that failed
 *   main.c        a round, restarts, the end of the job
 *   flight.c      the workers' flight records, and cddprun --dump
 *   util.c        helpers for the others: folders, the wall clock, random ids
 *
 * No two files call each other, round about (tests/house/check_house.py holds it): util.c and
 * options.c call none of the others.
 */
#ifndef CDDPRUN_H
#define CDDPRUN_H

#include "cddp/core.h"
#include "cddp/net.h"
#include "cddp/store.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

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

#define CDDPRUN_MAX_TOKEN CDDP_NET_MAX_SECRET /* bytes of a job token, at most */
#define MAX_FORWARDED     64                  /* -x NAME[=VALUE] options, at most */

typedef struct options {
    int nnodes, node_rank, nproc_per_node, master_port, max_restarts;
    int nnodes_min; /* an elastic job when below nnodes (--nnodes MIN:MAX) */
    const char *master_addr, *logdir, *local_addr, *token, *token_file, *run_id;
    bool module, no_python, standalone;
    bool token_in_argv;    /* --token was given on the command line (visible to every local user) */
    stream_spec tee;       /* console lines of these streams are prefixed with [rank N] */
    stream_spec redirects; /* these streams go to the log files only, not the console */
    const char *redirect_name; /* the option that asked for redirects, for its error */
    double monitor_interval, grace_period;
    double stopped_timeout; /* stop the job when a rank is stopped this long; 0: never */
    const char *shown;      /* --local_ranks_filter as given: "0,2" */
    bool *show;        /* parsed by cddprun_validate: show[r], local rank r's output on the console;
                          NULL: every rank's */
    int worker_num;    /* msrun's --worker_num: every node's workers together; 0: not given */
    bool nproc_given;  /* --nproc_per_node (or msrun's --local_worker_num) was given */
    bool nnodes_given; /* --nnodes was given */
    bool node_rank_given, addr_given, port_given; /* --node_rank, --master_addr, --master_port */
    bool node_rank_from_step;                     /* srun's step gave the node rank */
    bool bind_core;  /* msrun's --bind_core: each worker on its own share of the CPUs */
    bool log_mpirun; /* --log_layout mpirun: DIR/1/rank.N/ instead of DIR/rank.N/ */
    char **program;  /* the program and its arguments */
    /* One command, many hosts (hosts.c): --hosts or --hostfile makes this launcher the head,
     * which starts every node's launcher (--ssh), forwarding env[] (-x) too. */
    const char *hosts, *hostfile, *ssh;
    const char *env[MAX_FORWARDED];
    int nenv;
    const char *nproc_text; /* --nproc_per_node as given (auto: each host counts its own) */
    char **pass;            /* the options given, as given, that the head passes to every node */
    int npass;
    bool stdin_control; /* the secret and environment come on stdin; its end stops the node */
} options;

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
    double start_mono; /* when it started, CLOCK_MONOTONIC seconds */
    double end_time;
    double end_wall;     /* when it ended, wall-clock seconds (comparable across nodes) */
    double halted_since; /* when it was seen stopped by a signal (state T), 0 when it runs */
    bool halted_said;    /* cddprun said so */
    stream out, err;
    char log_path[PATH_MAX];
} worker;

typedef struct job {
    options o;
    char host[256];
    char run_id[64], token[CDDPRUN_MAX_TOKEN + 1];
    char claim[80]; /* this launcher's identity in the rendezvous: host, pid and a random nonce */
    char **argv;
    int world, base, round;
    char worker_port[16];
    cddp_store_server *server;
    cddp_store *store;
    worker *w;
    long oom_kills_at_start;
    bool *lost; /* node 0: the nodes its report found gone (nnodes entries) */
    bool *in;   /* the nodes of this round (nnodes entries; all of them unless elastic) */
    int nodes, group_rank; /* how many, and this node's place among them */
    /* Heartbeats: every node's launcher counts r<round>/beat/<node> up once a second; node 0
     * keeps each node's last count and when it changed (nnodes entries). */
    int64_t *beat;
    double *beat_at, next_beat;
    double lost_wall; /* node 0: when the node its heartbeat found lost went (wall clock) */
    int failures;     /* rounds that failed (restarts counted against --max_restarts) */
} job;

/* options.c */
void cddprun_parse_options(int argc, char **argv, options *o);
void cddprun_validate(options *o);
/* The program exists (on PATH, or python3 for a script): a usage error otherwise. */
void cddprun_check_program(const options *o);
/* The job's secret into out (CDDPRUN_MAX_TOKEN + 1 bytes): from --token_file, --token (or their
 * CDDPRUN_ variables), or random for a job of one node; a usage error otherwise. */
void cddprun_job_token(const options *o, char *out);
/* The argv to exec: python3 for .py programs and -m, the program itself otherwise. */
char **cddprun_worker_argv(const options *o);
/* The streams (1 stdout, 2 stderr, 3 both) that spec s names for a local rank. */
int cddprun_streams_for(const stream_spec *s, int local_rank);
/* Whether the console shows local rank r's output (--local_ranks_filter). */
bool cddprun_rank_shown(const options *o, int local_rank);
/* A usage error: says it with a pointer to --help and exits 2. */
void cddprun_die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* workers.c */
extern volatile sig_atomic_t cddprun_got_signal;
extern int cddprun_wake_pipe[2];
void cddprun_on_signal(int sig);
/* In a child before exec: no signal blocked, the ones the launcher handles back to default. */
void cddprun_default_signals(void);
void cddprun_start_workers(job *j);
/* The CPUs --bind_core gives each of n workers: those cddprun may run on divided among them (at
 * least 1). */
int cddprun_cpu_share(int n);
/* Looks at the running workers' state (/proc/<pid>/stat): one stopped by a signal (SIGSTOP, a
 * debugger) for 2 s is said once. Returns the worker stopped longest, or NULL. */
worker *cddprun_halted(job *j);
/* Wall-clock seconds (CLOCK_REALTIME), to order failures across nodes. */
double cddprun_wall_s(void);
/* Reaps exited workers; returns the number still running. */
int cddprun_reap(job *j, worker **first_failure);
/* One pass of the monitor: waits for output, a child exit, a signal or the interval. */
void cddprun_pump(job *j, double timeout_s);
/* Stops every running worker: SIGTERM to its process group, SIGKILL after the grace period. */
void cddprun_stop_workers(job *j, int sig);
/* mkdir -p: 0, or the errno that stopped it. */
int cddprun_make_dirs(const char *path);

/* flight.c */
/* Before a round's workers start: the flight records' folder (made, CDDP_FLIGHT_DIR for the
 * workers, this cddprun's pid in it, SIGUSR1 handled: the first time), its old records removed. */
void cddprun_flight_round(job *j);
/* In the monitor: a record a rank wrote of its own accord (or SIGUSR1 to cddprun) asks the other
 * workers for theirs, and the report is printed a second later. */
void cddprun_flight_watch(job *j);
/* The job failed: asks the live workers for their records, waits up to a second for them. */
void cddprun_flight_collect(job *j);
/* For the failure report: the records' report (the other nodes' merged in), a new string the
 * caller frees; NULL when the round has no records. */
char *cddprun_flight_final(job *j);
/* The one rank the report marks BEHIND ("rank 3 is in step 5's forward (for 8.4 s); ..."), into
 * line (n bytes): false when none is, or several. */
bool cddprun_flight_behind(const char *report, char *line, size_t n);
/* The job ended: the pid file goes; a folder cddprun chose in /tmp goes too when the job
 * succeeded and no rank wrote a record (records are kept, and named). */
void cddprun_flight_end(job *j, bool ok);
/* cddprun --dump|--status [--logdir DIR | --run_id ID | DIR]: asks the running job's cddprun for
 * its ranks' records and prints the report; the exit status. */
int cddprun_dump_main(int argc, char **argv);
/* Copies what a stream holds now to its destinations. */
void cddprun_drain(worker *w, stream *s);

/* rendezvous.c */
/* Whether host is one of this machine's addresses (it can listen there). */
bool cddprun_can_listen(const char *host);
/* A rendezvous failure: says it and exits 1. */
void cddprun_fail_rdzv(const char *what, const cddp_error *err) __attribute__((noreturn));
void cddprun_random_hex(char *out, size_t bytes);
/* The job's run id: node 0 (the store's host) posts its own (--run_id/--rdzv_id, else
 * slurm-<SLURM_JOB_ID>, else random); another node takes it, and one given an id of its own that
 * differs is refused, naming both (a launcher of another job at the same endpoint). Exits on
 * failure. */
void cddprun_run_id(job *j);
/* Registers this node for the round, waits for the others, and computes ranks. */
void cddprun_rendezvous(job *j);
/* Has another node posted a failure for this round? Fills why. */
bool cddprun_remote_failure(job *j, char *why, size_t n);
/* Once a second: counts this node's heartbeat up; on node 0, also reads every node's and, when
 * one has not moved for CDDP_STORE_REPLY_S (a node whose host died or was cut off sends
 * nothing, and its ranks' peers would wait for CDDP_TIMEOUT_S), marks that node lost, fills why
 * and returns true. */
bool cddprun_heartbeat(job *j, char *why, size_t n);
/* Node 0 of an elastic job below its MAX: whether a node registered for the next round while this
 * one runs (it came late); then the round ends at once for every node (r<N>/failed, its text
 * starting with CDDPRUN_GROW) and the next one admits it. why: what to say. */
#define CDDPRUN_GROW "scale-up: "
bool cddprun_newcomer(job *j, char *why, size_t n);
/* Another node's root cause of a failed round. */
typedef struct remote_cause {
    int node;
    double when; /* wall-clock seconds; for a lost node, when node 0 gave up waiting */
    bool lost;   /* the node posted nothing: its launcher is gone */
    char text[CDDP_ERROR_MSG_MAX];
} remote_cause;
/* Node 0: the root causes the other nodes posted for this round (r<round>/cause/<node>), waiting
 * up to --grace_period + 5 s in all; nodes without a failure of their own are left out, and a
 * node that posted nothing by then is one entry, lost (its host and ranks named). */
int cddprun_gather_causes(job *j, remote_cause *out, int max);

/* hosts.c */
/* The head (--hosts, --hostfile): starts every host's node launcher, this cddprun with
 * --stdin_control, over ssh or here, and stays until they end. Returns the exit status. */
int cddprun_hosts_main(options *o);
/* A node a head started (--stdin_control): reads the job's secret into token and the forwarded
 * environment from stdin; then, when stdin closes, says so and sends this launcher SIGHUP. */
void cddprun_stdin_control(options *o, char *token);

/* report.c */
/* The cgroup's count of OOM kills, or -1 where that cannot be read. */
long cddprun_oom_kills(void);
/* One line on how worker w ended. */
void cddprun_describe(const job *j, const worker *w, char *out, size_t n);

#endif
