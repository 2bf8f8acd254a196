/* flight.c: the workers' flight records (cddp/flight.h): where they go, asking for them, and the
 * report of where every rank stands.
 *
 * The records go to CDDP_FLIGHT_DIR (the user's), else --logdir's flight/, else
 * /tmp/cddp-flight-RUN; each round starts with the folder's old records removed. When a rank
 * writes one of its own accord (its group failed, a collective stalled), cddprun asks the other
 * workers for theirs (SIGUSR1, only to a process that handles it: its /proc status says so) and
 * prints the report a second later; the job goes on. `cddprun --dump` (or --status) from another
 * shell signals the running cddprun (its pid is in the folder), which does the same, and prints
 * the report itself too. When the job fails, the live workers are asked before they are stopped,
 * and the report follows cddprun's own.
 */
#include "cddprun.h"

#include <cddp/flight.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[PATH_MAX];
static volatile sig_atomic_t dump_asked;
static double next_scan, report_at, last_ask, round_start_wall;
static bool in_tmp; /* the folder is cddprun's choice in /tmp (no --logdir, no CDDP_FLIGHT_DIR) */

static void on_usr1(int sig) {
    (void)sig;
    int saved = errno;
    dump_asked = 1;
    ssize_t r = write(cddprun_wake_pipe[1], "x", 1);
    (void)r;
    errno = saved;
}

/* The folder's name for a job of run id run, with --logdir logdir (may be NULL). */
static void dir_for(const char *logdir, const char *run, char *out, size_t n) {
    const char *mine = getenv("CDDP_FLIGHT_DIR");
    if (mine && *mine)
        snprintf(out, n, "%s", mine);
    else if (logdir)
        snprintf(out, n, "%s/flight", logdir);
    else
        snprintf(out, n, "/tmp/cddp-flight-%s", run);
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

/* Asks every running worker that can answer for its record. */
static void ask(job *j) {
    for (int i = 0; i < j->o.nproc_per_node; i++)
        if (j->w[i].running && handles_usr1(j->w[i].pid)) kill(j->w[i].pid, SIGUSR1);
    last_ask = cddp_now_s();
}

/* Whether a record newer than `since` (wall clock) is in the folder; with own, only one a rank
 * wrote of its own accord (not asked by SIGUSR1). */
static bool new_record(double since, bool own) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        int r, used = 0;
        if (sscanf(de->d_name, "rank-%d.json%n", &r, &used) != 1 || de->d_name[used]) continue;
        char path[PATH_MAX + 300], head[512];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 < since) continue;
        if (!own) {
            found = true;
            continue;
        }
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
    DIR *d = opendir(dir); /* an earlier round's or run's records would mislead the report */
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int r, used = 0;
        if (sscanf(de->d_name, "rank-%d.json%n", &r, &used) == 1 && !de->d_name[used]) {
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    }
    if (d) closedir(d);
    round_start_wall = cddprun_wall_s();
    report_at = 0;
}

void cddprun_flight_watch(job *j) {
    double now = cddp_now_s();
    if (dump_asked) {
        dump_asked = 0;
        ask(j);
        report_at = now + 1.0;
    }
    if (now >= next_scan) {
        next_scan = now + 0.5;
        if (now - last_ask > 10 && new_record(cddprun_wall_s() - 1.0, true)) {
            ask(j);
            report_at = now + 1.0;
        }
    }
    if (report_at > 0 && now >= report_at) {
        report_at = 0;
        print_report(j->world, stderr, "where every rank stands, from their flight records");
    }
}

void cddprun_flight_collect(job *j) {
    ask(j);
    double asked = cddprun_wall_s(), until = cddp_now_s() + 1.0;
    int alive = 0;
    for (int i = 0; i < j->o.nproc_per_node; i++) alive += j->w[i].running;
    while (alive && cddp_now_s() < until) {
        int fresh = 0;
        for (int i = 0; i < j->o.nproc_per_node; i++) {
            char path[PATH_MAX + 32];
            struct stat st;
            snprintf(path, sizeof path, "%s/rank-%d.json", dir, j->w[i].rank);
            fresh += j->w[i].running && stat(path, &st) == 0 &&
                     st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 >= asked - 0.01;
        }
        if (fresh >= alive) break;
        cddprun_pump(j, 0.05);
    }
}

void cddprun_flight_final(job *j, FILE *rep) {
    if (dir[0] && new_record(round_start_wall, false))
        print_report(j->world, rep, "the ranks' flight records");
}

void cddprun_flight_end(job *j, bool ok) {
    if (!dir[0]) return;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/cddprun-node%d.pid", dir, j->o.node_rank);
    unlink(path);
    if (new_record(0, false)) {
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
    int asked = 0;
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
            asked++;
        }
        if (f) fclose(f);
    }
    closedir(d);
    if (!asked) {
        fprintf(stderr,
                "cddprun: no running cddprun of this job on this host (%s); the records "
                "already there:\n",
                dir);
    } else {
        double until = cddprun_wall_s() + 2.0;
        while (cddprun_wall_s() < until) usleep(100000);
    }
    print_report(0, stdout, "where every rank stands");
    return 0;
}
