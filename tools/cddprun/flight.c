/* flight.c: the workers' flight records (cddp/flight.h): where they go, asking for them, and the
 * report of where every rank stands.
 *
 * The records go to CDDP_FLIGHT_DIR (the user's), else --logdir's flight/, else
 * $TMPDIR/cddp-flight-RUN (/tmp without TMPDIR); each round starts with the folder's old records
 * removed. When a rank writes one of its own accord (its group failed, a collective stalled),
 * cddprun asks the other workers for theirs (SIGUSR1, only to a process that handles it: its /proc
 * status says so) and prints the report a second later; the job goes on. `cddprun --dump` (or
 * --status) from another shell signals the running cddprun (its pid is in the folder), which does
 * the same, and prints the report itself too. When the job fails, the live workers are asked before
 * they are stopped, and the report follows cddprun's own.
 *
 * Across nodes (--nnodes > 1) it goes through the job's store: a node that asks its workers adds
 * one to r<round>/flight/asks, and every node's watch asks its own when that count moves; each
 * node then posts its workers' records (r<round>/flight/rank<R>: "<posted> <written>\n" and the
 * record, written 0 when the rank left none), and node 0, or the node that --dump reached, puts
 * the other nodes' records into its own folder before it prints the report, so that it covers
 * every rank wherever the folders are. On failure each node posts after asking its workers; each
 * report merges what the other nodes posted (node 0 waits up to 3 s for them).
 */
#include "cddprun.h"

#include <cddp/flight.h>
#include <cddp/launch.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char dir[PATH_MAX];
static volatile sig_atomic_t dump_asked;
static double next_scan, report_at, last_ask, round_start_wall;
static bool in_tmp; /* the folder is cddprun's choice in /tmp (no --logdir, no CDDP_FLIGHT_DIR) */
static int64_t asks_seen; /* the store's count of asks this node has answered */
static double post_at;    /* when this node posts its workers' records to the store; 0: not due */
static double asked_wall; /* when this node last asked its workers (wall clock) */
static bool asked_here;   /* --dump reached this node: it prints the report and says it did */

static void on_usr1(int sig) {
    (void)sig;
    int saved = errno;
    dump_asked = 1;
    ssize_t r = write(cddprun_wake_pipe[1], "x", 1);
    (void)r;
    errno = saved;
}

/* The folder's name for a job of run id run, with --logdir logdir (may be NULL): the library's
 * (CDDP_FLIGHT_DIR, else in $TMPDIR by run id) but for --logdir's. */
static void dir_for(const char *logdir, const char *run, char *out, size_t n) {
    const char *mine = getenv("CDDP_FLIGHT_DIR");
    if (!(mine && *mine) && logdir) {
        snprintf(out, n, "%s/flight", logdir);
        return;
    }
    setenv(CDDP_ENV_RUN_ID, run, 1); /* the workers get it too */
    cddp_flight_dir(out, n);
}

/* Whether process pid handles SIGUSR1 (its SigCgt mask in /proc). */
static bool handles_usr1(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long mask = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "SigCgt: %llx", &mask) == 1;
    fclose(f);
    return found && (mask >> (SIGUSR1 - 1) & 1);
}

static bool several(const job *j) {
    return j->o.nnodes > 1 && j->store;
}

/* The worker running rank r on this node, or NULL. */
static const worker *local(const job *j, int r) {
    for (int i = 0; i < j->o.nproc_per_node; i++)
        if (j->w[i].rank == r) return &j->w[i];
    return NULL;
}

/* When path was last written (wall clock), 0 when it is not there. */
static double written(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 : 0;
}

/* The contents of path in a new buffer (*len bytes), or NULL. */
static char *contents(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
        fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        text = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return text;
}

/* Asks every running worker of this node that can answer for its record. */
static void ask(job *j) {
    for (int i = 0; i < j->o.nproc_per_node; i++)
        if (j->w[i].running && handles_usr1(j->w[i].pid)) kill(j->w[i].pid, SIGUSR1);
    last_ask = cddp_now_s();
    asked_wall = cddprun_wall_s();
    post_at = several(j) ? last_ask + 0.8 : 0;
}

/* Asks this node's workers, and through the store every other node's. */
static void ask_all(job *j) {
    ask(j);
    if (!several(j)) return;
    char key[64];
    cddp_error err = {0};
    snprintf(key, sizeof key, "r%d/flight/asks", j->round);
    if (cddp_store_add(j->store, key, 1, &asks_seen, &err) != CDDP_OK)
        fprintf(stderr, "cddprun: cannot ask the other nodes for their records: %s\n",
                cddp_error_msg(&err));
}

/* Whether another node asked since this one last answered. */
static bool asked_elsewhere(job *j) {
    char key[64];
    cddp_error err = {0};
    int64_t v = 0;
    snprintf(key, sizeof key, "r%d/flight/asks", j->round);
    if (cddp_store_add(j->store, key, 0, &v, &err) != CDDP_OK || v <= asks_seen) return false;
    asks_seen = v;
    return true;
}

/* Posts this node's workers' records (or that a rank left none this round) to the store. */
static void post(job *j) {
    post_at = 0;
    if (!several(j) || cddp_store_fd(j->store) < 0) return;
    for (int i = 0; i < j->o.nproc_per_node; i++) {
        char path[PATH_MAX + 32], key[64], head[64];
        snprintf(path, sizeof path, "%s/rank-%d.json", dir, j->w[i].rank);
        double at = written(path);
        size_t len = 0;
        char *text = at >= round_start_wall ? contents(path, &len) : NULL;
        if (!text) at = 0;
        int h = snprintf(head, sizeof head, "%.6f %.6f\n", cddprun_wall_s(), at);
        char *v = malloc((size_t)h + len);
        if (v) {
            memcpy(v, head, (size_t)h);
            if (at > 0) memcpy(v + h, text, len);
            snprintf(key, sizeof key, "r%d/flight/rank%d", j->round, j->w[i].rank);
            cddp_error err = {0};
            if (cddp_store_set(j->store, key, v, (size_t)h + (at > 0 ? len : 0), &err) != CDDP_OK)
                i = j->o.nproc_per_node; /* the store is gone: no more tries */
        }
        free(v);
        free(text);
    }
}

/* Puts into this node's folder the records the other nodes posted since `since` (wall clock),
 * waiting up to wait_s for a node to answer for each of its ranks. */
static void merge(job *j, double since, double wait_s) {
    if (!several(j) || j->world > 4096) return;
    bool done[4096] = {false};
    double until = cddp_now_s() + wait_s;
    for (;;) {
        int missing = 0;
        for (int r = 0; r < j->world; r++) {
            if (done[r] || local(j, r)) continue;
            char key[64];
            void *v = NULL;
            size_t len = 0;
            cddp_error err = {0};
            snprintf(key, sizeof key, "r%d/flight/rank%d", j->round, r);
            double posted = 0, at = 0;
            int used = 0;
            if (cddp_store_get(j->store, key, 0.001, &v, &len, &err) != CDDP_OK ||
                sscanf(v, "%lf %lf\n%n", &posted, &at, &used) != 2 || posted < since) {
                cddp_free(v);
                missing += cddp_store_fd(j->store) >= 0;
                continue;
            }
            done[r] = true;
            char path[PATH_MAX + 32], tmp[PATH_MAX + 48];
            snprintf(path, sizeof path, "%s/rank-%d.json", dir, r);
            snprintf(tmp, sizeof tmp, "%s.merge", path);
            FILE *f = at > written(path) ? fopen(tmp, "w") : NULL;
            if (f) {
                bool ok = fwrite((char *)v + used, 1, len - (size_t)used, f) == len - (size_t)used;
                ok = fclose(f) == 0 && ok;
                /* when its rank wrote it (the other node's clock), so that a later post of the
                 * same node is newer, whatever the clocks of the nodes are */
                struct timespec t[2] = {{0, UTIME_OMIT},
                                        {(time_t)at, (long)((at - (double)(time_t)at) * 1e9)}};
                if (ok) utimensat(AT_FDCWD, tmp, t, 0);
                if (!ok || rename(tmp, path) != 0) unlink(tmp);
            }
            cddp_free(v);
        }
        if (!missing || cddp_now_s() >= until) return;
        cddprun_pump(j, 0.1);
    }
}

/* Whether a record newer than `since` (wall clock) is in the folder; with own, only one a rank
 * of this node wrote of its own accord (not asked by SIGUSR1). */
static bool new_record(const job *j, double since, bool own) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        int r, used = 0;
        if (sscanf(de->d_name, "rank-%d.json%n", &r, &used) != 1 || de->d_name[used]) continue;
        char path[PATH_MAX + 300], head[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (written(path) < since) continue;
        if (!own) {
            found = true;
            continue;
        }
        if (!local(j, r)) continue;
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
        if (f) fclose(f);
        head[n] = '\0';
        found = !strstr(head, "\"why\": \"SIGUSR1");
    }
    closedir(d);
    return found;
}

/* world: the job's ranks (0: the records say). */
static void print_report(int world, FILE *out, const char *title) {
    fflush(stdout);
    fprintf(out, "cddprun: %s (cddp-trace %s says it again)\n", title, dir);
    cddp_error err = {0};
    if (cddp_flight_report(dir, world, out, NULL, &err) != CDDP_OK) fprintf(out, "  %s\n", err.msg);
    fflush(out);
}

void cddprun_flight_round(job *j) {
    if (!dir[0]) {
        const char *mine = getenv("CDDP_FLIGHT_DIR");
        in_tmp = !j->o.logdir && !(mine && *mine);
        dir_for(j->o.logdir, j->run_id, dir, sizeof dir);
        int e = cddprun_make_dirs(dir);
        if (e)
            fprintf(stderr, "cddprun: cannot make %s for the flight records: %s\n", dir,
                    strerror(e));
        setenv("CDDP_FLIGHT_DIR", dir, 1);
        char pid_path[PATH_MAX + 32];
        snprintf(pid_path, sizeof pid_path, "%s/cddprun-node%d.pid", dir, j->o.node_rank);
        FILE *f = fopen(pid_path, "w");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
        struct sigaction sa = {.sa_handler = on_usr1};
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
    }
    /* an earlier round's or run's records would mislead the report (and a rank killed while it
     * wrote one left its temporary) */
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int r, used = 0;
        size_t rest = 0;
        if (sscanf(de->d_name, "rank-%d.json%n", &r, &used) == 1 &&
            ((rest = strlen(de->d_name + used)) == 0 ||
             (rest > 4 && !strcmp(de->d_name + used + rest - 4, ".tmp")))) {
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    }
    if (d) closedir(d);
    round_start_wall = cddprun_wall_s();
    report_at = post_at = 0;
    asks_seen = 0;
    asked_here = false;
}

/* The marker a --dump waits for: this node's cddprun printed the report it asked for. */
static void answered_path(const job *j, char *out, size_t n) {
    snprintf(out, n, "%s/cddprun-node%d.answered", dir, j->o.node_rank);
}

void cddprun_flight_watch(job *j) {
    double now = cddp_now_s();
    if (dump_asked) { /* a report under way here answers the requests that come meanwhile */
        dump_asked = 0;
        if (!(asked_here && report_at > 0)) {
            asked_here = true;
            ask_all(j);
            report_at = now + 1.0;
        }
    }
    if (now >= next_scan) {
        next_scan = now + 0.5;
        if (several(j) && asked_elsewhere(j)) {
            ask(j);
            report_at = now + 1.0;
        } else if (now - last_ask > 10 && new_record(j, cddprun_wall_s() - 1.0, true)) {
            ask_all(j);
            report_at = now + 1.0;
        }
    }
    if (post_at > 0 && now >= post_at) post(j);
    if (report_at > 0 && now >= report_at) {
        report_at = 0;
        /* Across nodes, node 0's console has the report, and the shell of a --dump */
        if (several(j) && j->o.node_rank != 0 && !asked_here) return;
        merge(j, asked_wall - 2.0, 2.0);
        print_report(j->world, stderr, "where every rank stands, from their flight records");
        if (asked_here) {
            char path[PATH_MAX + 48];
            answered_path(j, path, sizeof path);
            FILE *f = fopen(path, "w");
            if (f) fclose(f);
            asked_here = false;
        }
    }
}

void cddprun_flight_collect(job *j) {
    ask(j);
    double asked = asked_wall, until = cddp_now_s() + 1.0;
    int alive = 0;
    for (int i = 0; i < j->o.nproc_per_node; i++) alive += j->w[i].running;
    while (alive && cddp_now_s() < until) {
        int fresh = 0;
        for (int i = 0; i < j->o.nproc_per_node; i++) {
            char path[PATH_MAX + 32];
            snprintf(path, sizeof path, "%s/rank-%d.json", dir, j->w[i].rank);
            fresh += j->w[i].running && written(path) >= asked - 0.01;
        }
        if (fresh >= alive) break;
        cddprun_pump(j, 0.05);
    }
    post(j);
}

char *cddprun_flight_final(job *j) {
    if (!dir[0]) return NULL;
    merge(j, asked_wall - 2.0, j->o.node_rank == 0 ? 3.0 : 1.0);
    if (!new_record(j, round_start_wall, false)) return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    fprintf(f, "cddprun: the ranks' flight records (cddp-trace %s says it again)\n", dir);
    cddp_error err = {0};
    if (cddp_flight_report(dir, j->world, f, NULL, &err) != CDDP_OK) fprintf(f, "  %s\n", err.msg);
    fclose(f);
    return text;
}

bool cddprun_flight_behind(const char *report, char *line, size_t n) {
    const char *mark = "  <- BEHIND", *at = report ? strstr(report, mark) : NULL;
    if (!at || strstr(at + strlen(mark), mark)) return false; /* none, or more than one */
    const char *start = at;
    while (start > report && start[-1] != '\n') start--;
    while (*start == ' ') start++;
    snprintf(line, n, "%.*s", (int)(at - start), start);
    return true;
}

void cddprun_flight_end(job *j, bool ok) {
    if (!dir[0]) return;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/cddprun-node%d.pid", dir, j->o.node_rank);
    unlink(path);
    answered_path(j, path, sizeof path);
    unlink(path);
    snprintf(path, sizeof path, "%s/cddprun-node%d.pid", dir, j->o.node_rank);
    if (new_record(j, 0, false)) {
        if (!ok) fprintf(stderr, "cddprun: the ranks' flight records are in %s\n", dir);
    } else if (in_tmp) {
        rmdir(dir);
    }
}

int cddprun_dump_main(int argc, char **argv) {
    const char *logdir = NULL, *run = getenv("CDDP_RUN_ID"), *given = NULL;
    for (int i = 2; i < argc; i++) {
        if ((!strcmp(argv[i], "--logdir") || !strcmp(argv[i], "--log_dir")) && i + 1 < argc)
            logdir = argv[++i];
        else if ((!strcmp(argv[i], "--run_id") || !strcmp(argv[i], "--rdzv_id")) && i + 1 < argc)
            run = argv[++i];
        else if (argv[i][0] != '-' && !given)
            given = argv[i];
        else
            cddprun_die_usage("%s: unexpected %s (cddprun %s [--logdir DIR | --run_id ID | DIR])",
                              argv[1], argv[i], argv[1]);
    }
    if (given)
        snprintf(dir, sizeof dir, "%s", given);
    else if (logdir || run)
        dir_for(logdir, run ? run : "", dir, sizeof dir);
    else
        cddprun_die_usage("%s needs the job: --logdir DIR (as it was started with), --run_id ID, "
                          "or the flight folder",
                          argv[1]);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr,
                "cddprun: %s: no such folder: is the job running, started with this "
                "--logdir or --run_id?\n",
                dir);
        return 1;
    }
    int asked = 0, nodes[64];
    double request = cddprun_wall_s();
    struct dirent *de;
    while ((de = readdir(d))) {
        int node, used = 0;
        if (sscanf(de->d_name, "cddprun-node%d.pid%n", &node, &used) != 1 || de->d_name[used])
            continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r");
        int pid = 0;
        if (f && fscanf(f, "%d", &pid) == 1 && pid > 0 && kill(pid, SIGUSR1) == 0) {
            fprintf(stderr, "cddprun: asked node %d's cddprun (pid %d) for its ranks' records\n",
                    node, pid);
            if (asked < 64) nodes[asked++] = node;
        }
        if (f) fclose(f);
    }
    closedir(d);
    if (!asked) {
        fprintf(stderr,
                "cddprun: no running cddprun of this job on this host (%s); the records "
                "already there:\n",
                dir);
    } else { /* until each has printed its report (it merged the other nodes' records) */
        double until = cddprun_wall_s() + 8.0;
        for (int k = 0; k < asked && cddprun_wall_s() < until; usleep(50000)) {
            char path[PATH_MAX + 48];
            snprintf(path, sizeof path, "%s/cddprun-node%d.answered", dir, nodes[k]);
            if (written(path) >= request - 0.01) k++;
        }
    }
    print_report(0, stdout, "where every rank stands");
    return 0;
}
