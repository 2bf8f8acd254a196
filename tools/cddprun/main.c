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
#include "cddprun.h"

#include "cddp/launch.h"
#include "cddp/net.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the run ----------------------------------------------------------------------------- */

/* ROUND_GROW: a node came to join (an elastic job below its MAX); the next round admits it. */
typedef enum { ROUND_OK, ROUND_FAILED, ROUND_SIGNALLED, ROUND_GROW } round_result;

/* Whether a node's root cause is a rank that was killed by a signal or stopped answering, or a
 * node that is gone: the failures that other ranks' failures follow from, not the other way
 * round. */
static bool primary(const char *cause) {
    return strstr(cause, " was killed by SIG") || strstr(cause, " stopped answering") ||
           strstr(cause, ") is gone: ");
}

/* Whether cause a (at wall-clock time aw) is the job's root cause rather than b: the earlier,
 * except that a primary failure beats an exit by code less than a second apart (a rank whose
 * peer was killed exits within milliseconds, and its node may reap it first; clocks of nodes
 * differ a little too). */
static bool earlier_cause(double aw, const char *a, double bw, const char *b) {
    bool pa = primary(a), pb = primary(b);
    if (pa != pb && (aw > bw ? aw - bw : bw - aw) < 1.0) return pa;
    return aw < bw;
}

/* How a round ended: the first failed (or stopped) worker of this node, another node's failure
 * or a node that came (remote), whether node 0 found a node silent (remote says which); once
 * settled, this node's root cause (text, at wall-clock time when; have: there is one). */
typedef struct round_end {
    worker *first;
    char remote[CDDP_ERROR_MSG_MAX];
    bool silent, have;
    char text[CDDP_ERROR_MSG_MAX];
    double when;
} round_end;

/* Watches the workers until one fails or stops too long, all have ended, a signal came, or (on
 * several nodes, at each look) another node failed, a node came to join or went silent. */
static void watch(job *j, round_end *e) {
    const options *o = &j->o;
    cddp_error err = {0};
    char key[64];
    double next_look = cddp_now_s() + o->monitor_interval;
    j->next_beat = 0;
    while (cddprun_reap(j, &e->first) > 0 && !e->first && !cddprun_got_signal) {
        cddprun_pump(j, o->monitor_interval);
        cddprun_flight_watch(j);
        worker *h = cddprun_halted(j);
        if (h && o->stopped_timeout > 0 && cddp_now_s() - h->halted_since >= o->stopped_timeout) {
            e->first = h; /* the root cause, stopped too long (--stopped_timeout) */
            break;
        }
        if (o->nnodes > 1 && cddp_now_s() >= next_look) {
            next_look = cddp_now_s() + o->monitor_interval;
            if (cddprun_remote_failure(j, e->remote, sizeof e->remote)) break;
            if (cddprun_newcomer(j, e->remote, sizeof e->remote)) break;
            if ((e->silent = cddprun_heartbeat(j, e->remote, sizeof e->remote))) { /* node 0 */
                snprintf(key, sizeof key, "r%d/failed", j->round);
                cddp_store_set_str(j->store, key, e->remote, &err);
                break;
            }
        }
    }
}

/* What the first failure seen is not: a rank that exited with an error right after a peer was
 * killed, a rank stopped by node 0's restart for a newcomer, or (a --hosts node) the head's stop
 * reaching this node late. */
static void settle(job *j, round_end *e) {
    const options *o = &j->o;
    /* A rank that exited with an error may only have found a peer dead: the peers of a rank
     * killed by a signal fail within milliseconds of it, and may be reaped first. So a failure
     * by exit code waits 0.2 s for the others, and a rank killed meanwhile is the root cause. */
    if (!cddprun_got_signal && e->first && !e->first->running && WIFEXITED(e->first->status)) {
        worker *more = NULL;
        double until = cddp_now_s() + 0.2;
        while (cddp_now_s() < until && cddprun_reap(j, &more) > 0) cddprun_pump(j, 0.02);
        for (int i = 0; i < o->nproc_per_node; i++)
            if (j->w[i].failed && WIFSIGNALED(j->w[i].status)) {
                e->first = &j->w[i];
                break;
            }
    }
    /* A rank that exited with an error because node 0 restarts the group for a node that came to
     * join (it stopped its ranks, this rank's peers): node 0 posted the restart before it stopped
     * them, so the store has it now, though this node's next look at it was still to come. The
     * round ends in that restart, not in a failure of this node's (which would use up a restart,
     * or end this node's part of the job). */
    if (e->first && !e->first->running && WIFEXITED(e->first->status) && !e->remote[0] &&
        o->nnodes > 1 && !cddprun_got_signal &&
        cddprun_remote_failure(j, e->remote, sizeof e->remote)) {
        if (!strncmp(e->remote, CDDPRUN_GROW, strlen(CDDPRUN_GROW)))
            e->first = NULL;
        else
            e->remote[0] = 0; /* another node's failure: this node's own report, as before */
    }
    /* A node that cddprun --hosts started waits up to a second for the head before it reports a
     * failure: when the head stops the job (Ctrl-C), the end of its control stream reaches this
     * node over ssh after this node's ranks may have seen their peers on the other nodes stop,
     * or this node the store go. The job was stopped then (watch_head's SIGHUP), not failed. */
    if (o->stdin_control && (e->first || e->remote[0])) {
        double until = cddp_now_s() + 1.0;
        while (!cddprun_got_signal && cddp_now_s() < until)
            if (cddprun_reap(j, NULL) > 0)
                cddprun_pump(j, 0.02);
            else
                usleep(20000); /* the signal cuts it short */
    }
}

/* This node's root cause in words (e->text, at e->when): a stopped rank the others waited for, the
 * first failed rank, or the node that node 0 found silent. */
static void root_cause(job *j, round_end *e) {
    /* A rank stopped by a signal is why the others failed (they timed out waiting for it): it is
     * the root cause, not the first of them to give up, also when another node's failure (its
     * ranks timed out first) ended this node's round. */
    worker *first = e->first,
           *halted = first || (e->remote[0] && !e->silent) ? cddprun_halted(j) : NULL;
    /* ... but not one that stopped after the first failure, on its way out (LeakSanitizer stops
     * a process's threads at its exit to read their stacks), nor before a rank killed by a
     * signal: a stopped rank makes the others time out and exit, never kills one. */
    if (halted && first && first != halted && !first->running &&
        (WIFSIGNALED(first->status) ||
         cddprun_wall_s() - (cddp_now_s() - halted->halted_since) >= first->end_wall))
        halted = NULL;
    if (halted && halted->halted_since > 0) {
        char since[32];
        time_t t = (time_t)(time(NULL) - (cddp_now_s() - halted->halted_since));
        strftime(since, sizeof since, "%H:%M:%S", localtime(&t));
        snprintf(e->text, sizeof e->text,
                 "rank %d (local rank %d, host %s, pid %d) stopped answering: it was stopped "
                 "(by SIGSTOP or a debugger) at %s, and the ranks below waited for it",
                 halted->rank, halted->local_rank, j->host, (int)halted->pid, since);
        e->when = cddprun_wall_s() - (cddp_now_s() - halted->halted_since);
        e->first = halted;
    } else if (first) {
        cddprun_describe(j, first, e->text, sizeof e->text);
        e->when = first->end_wall;
    } else if (e->silent) {
        /* A node node 0's heartbeat found gone, or silent since CDDP_STORE_REPLY_S: before the
         * exits of the ranks that lost it once this node stopped its own. */
        snprintf(e->text, sizeof e->text, "%s", e->remote);
        e->when = j->lost_wall;
    }
    e->have = e->first || e->silent;
}

/* The workers stopped (after a failure, with the flight records first) or waited for, their last
 * output drained and their logs closed. */
static void end_workers(job *j, const round_end *e) {
    const options *o = &j->o;
    if (e->first || e->remote[0]) {
        cddprun_flight_collect(j);
        cddprun_stop_workers(j, SIGTERM);
    } else
        while (cddprun_reap(j, NULL) > 0) cddprun_pump(j, o->monitor_interval);
    for (int i = 0; i < o->nproc_per_node; i++) { /* output written just before the exit */
        if (j->w[i].out.fd >= 0) cddprun_drain(&j->w[i], &j->w[i].out);
        if (j->w[i].err.fd >= 0) cddprun_drain(&j->w[i], &j->w[i].err);
    }
    for (int i = 0; i < o->nproc_per_node; i++) {
        if (j->w[i].out.log >= 0) close(j->w[i].out.log);
        if (j->w[i].err.log >= 0) close(j->w[i].err.log);
    }
}

/* On several nodes, each posts its own root cause (or none) and node 0 gathers the others' into
 * others (returns how many) and names the earliest as the job's: *root, the index in others, or
 * -1 for this node's. */
static int merge_causes(job *j, const round_end *e, remote_cause *others, int cap, int *root) {
    const options *o = &j->o;
    cddp_error err = {0};
    char key[64], mine[CDDP_ERROR_MSG_MAX + 32];
    *root = -1;
    if (o->nnodes == 1) return 0;
    snprintf(key, sizeof key, "r%d/cause/%d", j->round, o->node_rank);
    snprintf(mine, sizeof mine, "%.3f %s", e->first ? e->when : 0.0, e->first ? e->text : "");
    cddp_store_set_str(j->store, key, mine, &err);
    int n = o->node_rank == 0 ? cddprun_gather_causes(j, others, cap) : 0;
    /* A node that is gone explains the exits by code of the ranks that lost it, whenever they
     * came; a rank killed by a signal or stopped is still the likelier first cause. */
    for (int k = 0; k < n; k++) {
        const char *rt = *root < 0 ? (e->have ? e->text : "") : others[*root].text;
        bool root_lost = *root >= 0 && others[*root].lost;
        if (others[k].lost && !root_lost && !primary(rt))
            *root = k;
        else if (root_lost && primary(others[k].text))
            *root = k;
        else if ((!e->have && *root < 0) ||
                 (!others[k].lost && !root_lost &&
                  earlier_cause(others[k].when, others[k].text,
                                *root < 0 ? e->when : others[*root].when, rt)))
            *root = k;
    }
    for (int k = 0; k < n; k++) j->lost[others[k].node] |= others[k].lost;
    return n;
}

/* Where the report goes: stderr, or for a node that --hosts started, its log folder (node 0's
 * merged report alone names the root cause on the head's console: a node's own would show its
 * collateral failures as causes), saying so on stderr. */
static FILE *report_file(job *j) {
    const options *o = &j->o;
    if (!o->stdin_control || o->node_rank == 0) return stderr;
    char path[PATH_MAX] = "";
    if (o->logdir) snprintf(path, sizeof path, "%s/cddprun-node%d.report", o->logdir, o->node_rank);
    FILE *rep = *path ? fopen(path, j->round == 0 ? "w" : "a") : NULL;
    fprintf(stderr,
            "cddprun: node %d's part of the job failed; node 0's report names the root cause%s%s\n",
            o->node_rank, rep ? ", this node's own is in " : " (--logdir keeps this node's)",
            rep ? path : "");
    if (!rep) rep = fopen("/dev/null", "w");
    return rep ? rep : stderr;
}

/* The report of a failed round: the root cause, what else failed on this node and the others,
 * the rank the others waited for (the flight records, which follow). */
static void report(job *j, round_end *e) {
    const options *o = &j->o;
    remote_cause others[64];
    int root, nothers = merge_causes(j, e, others, 64, &root);
    worker *first = e->first;
    /* The flight records say which rank the others waited for: a rank that timed out waiting
     * (the root cause by time) names it too, but the report should say it first. */
    char *flight = cddprun_flight_final(j), behind[512];
    FILE *rep = report_file(j);
    fprintf(rep, "cddprun: the job failed (run %s, attempt %d of %d, node %d of %d)\n", j->run_id,
            j->failures + 1, o->max_restarts + 1, o->node_rank, j->nodes);
    if (root >= 0 && others[root].lost)
        fprintf(rep, "  root cause: %s\n", others[root].text);
    else if (root >= 0)
        fprintf(rep, "  root cause, on node %d: %s\n", others[root].node, others[root].text);
    else if (first)
        fprintf(rep, "  root cause: %s\n    log: %s\n", e->text, first->log_path);
    else
        fprintf(rep, "  root cause%s: %s\n", e->silent ? "" : ", on another node", e->remote);
    if (flight && cddprun_flight_behind(flight, behind, sizeof behind))
        fprintf(rep, "  the others waited for: %s (the flight records, below)\n", behind);
    if (root >= 0 && first)
        fprintf(rep, "  also failed, here: %s\n    log: %s\n", e->text, first->log_path);
    for (int k = 0; k < nothers; k++)
        if (k != root && others[k].lost)
            fprintf(rep, "  also: %s\n", others[k].text);
        else if (k != root)
            fprintf(rep, "  also failed, on node %d: %s\n", others[k].node, others[k].text);
    if (o->nnodes > 1 && o->node_rank != 0)
        fprintf(rep, "  (node 0's report merges every node's)\n");
    char text[CDDP_ERROR_MSG_MAX];
    for (int i = 0; i < o->nproc_per_node; i++) {
        worker *w = &j->w[i];
        if (w == first) continue;
        if (w->failed) {
            cddprun_describe(j, w, text, sizeof text);
            fprintf(rep, "  also failed: %s\n    log: %s\n", text, w->log_path);
        } else if (w->stopped) {
            fprintf(rep, "  stopped: rank %d (local rank %d) by cddprun\n", w->rank, w->local_rank);
        } else if (first && !w->running && WIFEXITED(w->status) && !WEXITSTATUS(w->status) &&
                   w->end_wall <= e->when + o->monitor_interval + 0.2) {
            /* A rank that finished while its peers still called collectives with it is why they
             * failed, though it did nothing wrong by itself. (Exits are seen at the monitor's
             * looks, and the failure waited 0.2 s for others: one that came then counts too.) */
            cddprun_describe(j, w, text, sizeof text);
            fprintf(rep,
                    "  finished before it: %s (if the failure is a collective that waited for "
                    "it, the ranks took different numbers of steps)\n",
                    text);
        }
    }
    if (flight) fputs(flight, rep);
    free(flight);
    if (rep != stderr) fclose(rep);
}

/* Runs one round: rendezvous, start, watch. On failure prints the report. */
static round_result run_round(job *j) {
    const options *o = &j->o;
    cddp_error err = {0};
    cddprun_rendezvous(j);
    j->oom_kills_at_start = cddprun_oom_kills();
    cddprun_flight_round(j);
    cddprun_start_workers(j);
    round_end e = {0};
    watch(j, &e);
    settle(j, &e);
    if (cddprun_got_signal) {
        fprintf(stderr, "cddprun: got SIG%s; stopping the workers\n",
                sigabbrev_np(cddprun_got_signal));
        cddprun_stop_workers(j, SIGTERM);
        return ROUND_SIGNALLED;
    }
    root_cause(j, &e);
    if (e.first && !e.remote[0] && o->nnodes > 1) {
        char key[64];
        snprintf(key, sizeof key, "r%d/failed", j->round);
        cddp_store_set_str(j->store, key, e.text, &err);
    }
    end_workers(j, &e);
    if (!e.first && !e.remote[0]) return ROUND_OK;
    if (!e.first && !strncmp(e.remote, CDDPRUN_GROW, strlen(CDDPRUN_GROW))) {
        fprintf(stderr, "cddprun: %s (round %d)\n", e.remote + strlen(CDDPRUN_GROW), j->round + 1);
        return ROUND_GROW;
    }
    report(j, &e);
    return ROUND_FAILED;
}

/* Without --node_rank: this node's rank in the job, 0 when it hosts the store, else the lowest
 * free one, in the order the nodes join; one launcher per host (its identity, cddp_host_id,
 * claimed first). Both claims are freed by wills when the launcher goes, so that a new launcher on
 * the host, or a new host in a dead one's place, takes them. */
static void take_node_rank(job *j) {
    options *o = &j->o;
    cddp_error err = {0};
    char id[256], key[300], mine[64], *held = NULL;
    size_t len = 0;
    cddp_host_id(id, sizeof id);
    snprintf(key, sizeof key, "auto/host/%s", id);
    snprintf(mine, sizeof mine, "pid %d at %.40s", (int)getpid(), j->host);
    if (cddp_store_compare_set(j->store, key, "", 0, mine, strlen(mine), (void **)&held, &len,
                               &err))
        cddprun_fail_rdzv("rendezvous", &err);
    if (!held || strcmp(held, mine) != 0) {
        fprintf(stderr,
                "cddprun: another launcher on this host (%s) joined this job already: start one "
                "cddprun per host (--nproc_per_node for its ranks), or set CDDP_HOST_ID to tell "
                "launchers on one machine apart\n",
                held ? held : "?");
        exit(1);
    }
    cddp_free(held);
    if (cddp_store_set_will(j->store, key, "", 0, &err)) cddprun_fail_rdzv("rendezvous", &err);
    for (int k = 1; o->node_rank < 0 && k < o->nnodes; k++) {
        snprintf(key, sizeof key, "auto/rank/%d", k);
        held = NULL;
        if (cddp_store_compare_set(j->store, key, "", 0, mine, strlen(mine), (void **)&held, &len,
                                   &err))
            cddprun_fail_rdzv("rendezvous", &err);
        if (held && !strcmp(held, mine)) {
            o->node_rank = k;
            if (cddp_store_set_will(j->store, key, "", 0, &err))
                cddprun_fail_rdzv("rendezvous", &err);
        }
        cddp_free(held);
    }
    if (o->node_rank < 0) {
        fprintf(stderr,
                "cddprun: the job has its %d nodes already (--nnodes %d): this launcher, on %s, "
                "is one too many\n",
                o->nnodes, o->nnodes, j->host);
        exit(1);
    }
    fprintf(stderr, "cddprun: node %d of %d (no --node_rank: %s; node 0 hosts the store at %s)\n",
            o->node_rank, o->nnodes,
            o->node_rank == 0 ? "this node listens on the endpoint's address"
                              : "the order the nodes joined in",
            CDDP_NET_ENDPOINT(o->master_addr, o->master_port));
}

/* SIGINT/TERM/HUP while this node joins the rendezvous: nothing to stop yet (async-signal-safe). */
static void quit_joining(int sig) {
    static const char msg[] = "cddprun: stopped by a signal while joining the job's rendezvous\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(128 + sig);
}

/* SIGINT, SIGTERM and SIGHUP (what stops cddprun) to handler. */
static void on_stop_signals(void (*handler)(int)) {
    struct sigaction sa = {.sa_handler = handler};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* Says once what math threads the workers get where cddprun chooses (OMP_NUM_THREADS or
 * OPENBLAS_NUM_THREADS unset, several workers): the CPUs --bind_core gives each, else one. */
static void say_threads(const options *o) {
    int n = o->nproc_per_node, share = cddprun_cpu_share(n), k = o->bind_core ? share : 1;
    bool omp = !getenv("OMP_NUM_THREADS"), blas = !getenv("OPENBLAS_NUM_THREADS");
    if (n < 2 || (!omp && !blas)) return;
    char set[96] = "";
    if (omp) snprintf(set, sizeof set, "OMP_NUM_THREADS=%d", k);
    if (blas)
        snprintf(set + strlen(set), sizeof set - strlen(set), "%sOPENBLAS_NUM_THREADS=%d",
                 omp ? " and " : "", k);
    if (o->bind_core)
        fprintf(stderr,
                "cddprun: --bind_core: each of the %d workers is bound to %d CPU%s, with %s "
                "(unset here); set to tune\n",
                n, share, share == 1 ? "" : "s", set);
    else
        fprintf(stderr,
                "cddprun: setting %s for each worker (unset here) so that %d processes do not "
                "oversubscribe the cores; set to tune%s\n",
                set, n,
                share > 1 ? ", or --bind_core: each worker on CPUs of its own, a thread for each"
                          : "");
}

/* This node's address for the others (j->host): --local_addr (an address, a host name, or an
 * interface's name), else CDDP_SOCKET_IFNAME's address, else the hostname; checked now. */
static void choose_host(job *j) {
    const options *o = &j->o;
    const char *ifname = cddp_knob_str(CDDP_KNOB_SOCKET_IFNAME);
    cddp_error e = {0};
    bool by_interface = false;
    if (o->local_addr) {
        if (cddp_net_local_host(o->local_addr, j->host, sizeof j->host, &by_interface, &e))
            cddprun_die_usage("--local_addr %s: %s", o->local_addr, e.msg);
    } else if (*ifname) {
        if (cddp_net_interface_addr(ifname, j->host, sizeof j->host, &e))
            cddprun_die_usage("CDDP_SOCKET_IFNAME=%s: %s", ifname, e.msg);
        by_interface = true;
    } else if (gethostname(j->host, sizeof j->host) != 0) {
        snprintf(j->host, sizeof j->host, "localhost");
    }
    if (by_interface)
        fprintf(stderr, "cddprun: this node's address is %s (interface %s)\n", j->host,
                o->local_addr ? o->local_addr : ifname);
}

/* Joins the job's rendezvous store (node 0 starting it first) and takes this node's rank when it
 * has none yet; says what address the other nodes reach this one at. 0, or 1 when node 0 cannot
 * start the store. */
static int join_store(job *j) {
    options *o = &j->o;
    cddp_error err = {0};
    /* torchrun's c10d line: the same command on every node, no --node_rank. The node that can
     * listen on the endpoint's address hosts the store and is node 0; the others take 1, 2, ...
     * in the order they join (auto_rank), once for the whole job. */
    bool auto_rank = o->nnodes > 1 && !o->node_rank_given && !o->node_rank_from_step;
    if (auto_rank) o->node_rank = cddprun_can_listen(o->master_addr) ? 0 : -1;
    /* A master address naming this machine but loopback here, in a job of several nodes
     * (Debian's /etc/hosts maps a host's own name to 127.0.1.1): the store listens on every
     * interface, where the other nodes reach it at the address the name has for them. */
    bool everywhere =
        o->node_rank == 0 && o->nnodes > 1 && cddp_net_own_name_loopback(o->master_addr);
    if (everywhere)
        fprintf(stderr,
                "cddprun: --master_addr %s is a loopback address on this machine (/etc/hosts "
                "maps a host's own name to 127.0.1.1): node 0's store listens on every "
                "interface, for the other nodes to reach it at %s's network address\n",
                o->master_addr, o->master_addr);
    else if (o->node_rank == 0 && o->nnodes > 1 && cddp_net_is_loopback(o->master_addr))
        fprintf(stderr,
                "cddprun: warning: --master_addr %s is a loopback address: only nodes on this "
                "machine can reach the job's store; for nodes on other machines give "
                "--master_addr this machine's network address or name\n",
                o->master_addr);
    if (o->node_rank == 0) {
        j->server = cddp_store_server_start(everywhere ? NULL : o->master_addr, o->master_port,
                                            j->token, &err);
        if (!j->server && auto_rank && cddp_net_in_use(&err)) {
            o->node_rank = -1; /* another launcher on this machine hosts it, or another job */
        } else if (!j->server) {
            fprintf(stderr, "cddprun: %s\n", cddp_error_msg(&err));
            return 1;
        } else {
            o->master_port = cddp_store_server_port(j->server);
        }
    }
    cddp_store_options so = {o->master_addr, o->master_port, j->token, 0, NULL};
    j->store = cddp_store_connect(&so, &err);
    if (!j->store) cddprun_fail_rdzv("cannot join the job's rendezvous", &err);
    cddprun_run_id(j); /* before a node rank is taken: a node of another job takes none */
    if (auto_rank) take_node_rank(j);
    if (o->nnodes > 1 && !o->local_addr && !*cddp_knob_str(CDDP_KNOB_SOCKET_IFNAME) &&
        (everywhere || !cddp_net_is_loopback(o->master_addr))) {
        /* what the other nodes reach, said */
        char dev[64];
        const char *how;
        if (cddp_net_peer_addr(cddp_store_fd(j->store), true, j->host, sizeof j->host, dev,
                               sizeof dev, &how) == CDDP_OK)
            fprintf(stderr,
                    "cddprun: node %d's address for the others is %s%s%s (%s; --local_addr "
                    "or CDDP_SOCKET_IFNAME choose another)\n",
                    o->node_rank, j->host, *dev ? ", interface " : "", dev, how);
    }
    return 0;
}

/* Rounds until one ends well, a signal came, or the restarts are spent; the exit status. */
static int run_rounds(job *j) {
    const options *o = &j->o;
    for (j->round = 0;; j->round++) {
        round_result r = run_round(j);
        if (r == ROUND_OK) return 0;
        if (r == ROUND_SIGNALLED) return 128 + cddprun_got_signal;
        if (r == ROUND_GROW) continue; /* not a failure: no restart is counted */
        if (j->failures++ >= o->max_restarts) return 1;
        fprintf(stderr, "cddprun: restarting the group (restart %d of %d)\n", j->failures,
                o->max_restarts);
    }
}

/* This node's end posted in the store. Node 0 hosts the store: it waits for the other nodes to
 * finish with it, while their launchers beat (one whose workers still run, beats); one silent for
 * CDDP_STORE_REPLY_S (its launcher frozen, its host gone) is not waited for, and said. Returns
 * the status, 1 when another node failed after this one finished. */
static int leave(job *j, int status) {
    const options *o = &j->o;
    cddp_error err = {0};
    char key[64];
    snprintf(key, sizeof key, "r%d/left/%d", j->round, o->node_rank);
    cddp_store_set_str(j->store, key, status == 0 ? "ok" : "failed", &err);
    if (o->node_rank == 0) /* for a node waiting for a round that will not form */
        cddp_store_set_str(j->store, "ended", status == 0 ? "ok" : "failed", &err);
    for (int k = 1; o->node_rank == 0 && k < o->nnodes && !cddprun_got_signal; k++) {
        char other[64], why[CDDP_ERROR_MSG_MAX];
        snprintf(other, sizeof other, "r%d/left/%d", j->round, k);
        const char *ks = other;
        double until = cddp_now_s() + (double)cddp_knob_int(CDDP_KNOB_RDZV_TIMEOUT_S);
        while (!j->lost[k] && j->in[k] && !cddprun_got_signal && cddp_now_s() < until &&
               cddp_store_wait(j->store, &ks, 1, 0.2, &err) == CDDP_ETIMEDOUT) {
            if (status == 0 && cddprun_remote_failure(j, why, sizeof why)) {
                fprintf(stderr, "cddprun: another node failed after this one finished: %s\n", why);
                status = 1;
            }
            if (cddprun_heartbeat(j, why, sizeof why)) {
                fprintf(stderr,
                        "cddprun: %s, after this node's workers finished: not waiting for "
                        "it; its part of the job did not report an end\n",
                        why);
                status = 1;
            }
        }
    }
    return status;
}

int main(int argc, char **argv) {
    job j = {0};
    if (argc > 1 && (!strcmp(argv[1], "--dump") || !strcmp(argv[1], "--status")))
        return cddprun_dump_main(argc, argv);
    cddprun_parse_options(argc, argv, &j.o);
    if (j.o.hosts || j.o.hostfile) {
        int status = cddprun_hosts_main(&j.o);
        cddp_free(j.o.pass);
        return status;
    }
    static char control_token[CDDPRUN_MAX_TOKEN + 1];
    if (j.o.stdin_control) cddprun_stdin_control(&j.o, control_token); /* before PATH is used */
    cddprun_validate(&j.o);
    options *o = &j.o;
    j.argv = cddprun_worker_argv(o);
    j.w = cddp_calloc((size_t)o->nproc_per_node, sizeof *j.w);
    j.lost = cddp_calloc((size_t)o->nnodes, sizeof *j.lost);
    j.in = cddp_calloc((size_t)o->nnodes, sizeof *j.in);
    j.beat = cddp_calloc((size_t)o->nnodes, sizeof *j.beat);
    j.beat_at = cddp_calloc((size_t)o->nnodes, sizeof *j.beat_at);
    choose_host(&j);
    if (o->standalone) {
        o->master_addr = "127.0.0.1";
        o->master_port = 0;
    }
    cddprun_job_token(o, j.token);
    say_threads(o);

    /* Signals: while this node joins the rendezvous (no worker yet; a connection is retried for
     * up to CDDP_RDZV_TIMEOUT_S) SIGINT/TERM/HUP end cddprun at once; then they stop the job. */
    if (pipe2(cddprun_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
    on_stop_signals(quit_joining);
    signal(SIGPIPE, SIG_IGN);
    if (join_store(&j) != 0) return 1;
    on_stop_signals(cddprun_on_signal);
    struct sigaction sa = {.sa_handler = cddprun_on_signal}; /* SIGCHLD wakes the monitor */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, NULL);
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", o->master_port);
    setenv(CDDP_ENV_STORE_PORT, port_text, 1); /* inherited by the workers */
    int status = leave(&j, run_rounds(&j));
    cddp_store_close(j.store);
    cddp_store_server_stop(j.server);
    cddp_free(j.w);
    cddp_free(j.lost);
    cddp_free(j.in);
    cddp_free(j.beat);
    cddp_free(j.beat_at);
    cddp_free(j.argv);
    cddp_free(j.o.show);
    cddp_free(j.o.pass);
    cddprun_flight_end(&j, status == 0);
    return status;
}
