/* report.c: what cddprun's report says about a worker that failed. */
#include "cddprun.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

long cddprun_oom_kills(void) {
    FILE *f = fopen("/sys/fs/cgroup/memory.events", "r");
    if (!f) return -1;
    char key[64];
    long v, found = -1;
    while (fscanf(f, "%63s %ld", key, &v) == 2)
        if (!strcmp(key, "oom_kill")) found = v;
    fclose(f);
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
        const char *oom = "";
        if (sig == SIGKILL) {
            long now = cddprun_oom_kills();
            oom = now < 0 || j->oom_kills_at_start < 0
                      ? " (cddprun cannot tell whether the kernel's OOM killer did it)"
                  : now > j->oom_kills_at_start ? " (the kernel's OOM killer: memory.events "
                                                  "counts a new oom_kill)"
                                                : " (not the kernel's OOM killer)";
        }
        snprintf(out, n,
                 "rank %d (local rank %d, host %s) was killed by SIG%s (signal %d) at "
                 "%s%s",
                 w->rank, w->local_rank, j->host, sigabbrev_np(sig), sig, when, oom);
    }
}
