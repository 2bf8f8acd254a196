/* report.c: what cddprun's report says about a worker that failed. */
#include "cddprun.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <time.h>

/* The "oom_kill N" count in a cgroup file of "key value" lines, or -1. */
static long oom_kill_count(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char key[64];
    long v, found = -1;
    while (fscanf(f, "%63s %ld", key, &v) == 2)
        if (!strcmp(key, "oom_kill")) found = v;
    fclose(f);
    return found;
}

/* The OOM kills in this process's memory cgroup, where its workers run: cgroup v2's
 * memory.events, or v1's memory.oom_control (the memory controller's line of /proc/self/cgroup
 * names the group); -1 where neither can be read. */
long cddprun_oom_kills(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[1024], path[1200];
    long found = -1;
    while (f && found < 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':'),
             *group = controllers ? strchr(controllers + 1, ':') : NULL;
        if (!group) continue;
        *group++ = '\0';
        controllers++;
        if (!*controllers) /* v2: "0::/path" */
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.events", group);
        else if (!strcmp(controllers, "memory")) /* v1: "4:memory:/path" */
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.oom_control", group);
        else
            continue;
        found = oom_kill_count(path);
    }
    if (f) fclose(f);
    return found >= 0 ? found : oom_kill_count("/sys/fs/cgroup/memory.events");
}

/* Whether the kernel log says its OOM killer killed process pid after since (CLOCK_MONOTONIC
 * seconds, the log's clock): a record "... Killed process <pid> (comm) ...". Reading /dev/kmsg
 * needs CAP_SYSLOG where dmesg_restrict is set; false when it cannot be read. */
static bool kernel_log_oom(pid_t pid, double since) {
    int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    char rec[8192], want[48];
    snprintf(want, sizeof want, "Killed process %d (", (int)pid);
    bool found = false;
    for (;;) { /* one record per read: "priority,sequence,microseconds,flags;text\n..." */
        ssize_t n = read(fd, rec, sizeof rec - 1);
        if (n < 0 && errno == EPIPE) continue; /* records overwritten while reading */
        if (n <= 0) break;
        rec[n] = '\0';
        unsigned long long us = 0;
        const char *text = strchr(rec, ';');
        if (text && sscanf(rec, "%*u,%*u,%llu", &us) == 1 && (double)us * 1e-6 >= since - 1 &&
            strstr(text, want))
            found = true;
    }
    close(fd);
    return found;
}

void cddprun_describe(const job *j, const worker *w, char *out, size_t n) {
    char when[32];
    time_t t = (time_t)w->end_time;
    strftime(when, sizeof when, "%H:%M:%S", localtime(&t));
    if (WIFEXITED(w->status)) {
        snprintf(out, n, "rank %d (local rank %d, host %s) exited with code %d at %s", w->rank,
                 w->local_rank, j->host, WEXITSTATUS(w->status), when);
    } else {
        int sig = WTERMSIG(w->status);
        const char *why = "";
        if (sig == SIGBUS) /* what a process meets on a mapped file, not on its own memory */
            why = " (a file mapped into its memory was cut short or could not be read: a token "
                  "file rewritten or truncated while training reads it, or a disk error?)";
        if (sig == SIGKILL) {
            long now = cddprun_oom_kills();
            bool counted = now >= 0 && j->oom_kills_at_start >= 0;
            why = counted && now > j->oom_kills_at_start
                      ? " (the kernel's OOM killer: the memory cgroup counts a new oom_kill; give "
                        "the job more memory or use less)"
                  : kernel_log_oom(w->pid, w->start_mono)
                      ? " (the kernel's OOM killer: the kernel log says it killed this process; "
                        "give the job more memory or use less)"
                  : counted ? " (not the kernel's OOM killer)"
                            : " (cddprun cannot tell whether the kernel's OOM killer did it)";
        }
        snprintf(out, n,
                 "rank %d (local rank %d, host %s) was killed by SIG%s (signal %d) at "
                 "%s%s",
                 w->rank, w->local_rank, j->host, sigabbrev_np(sig), sig, when, why);
    }
}
