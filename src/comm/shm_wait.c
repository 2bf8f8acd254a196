/* shm_wait.c: how a rank of the shared-memory transport waits for another (design in shm.c). */
#include "comm/shm.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- waiting ----------------------------------------------------------------------------- */

void cddp__shm_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Latches an abort of this group, local (on this rank) or by a peer. */
int cddp__shm_check_abort(cddp_comm *c, cddp_error *err) {
    CDDP_TRY(cddp__comm_aborted_here(c, err));
    int who = atomic_load_explicit(&header(c)->abort_rank, memory_order_acquire) - 1;
    if (who >= 0) return cddp__comm_peer_aborted(c, err, who, ctl_of(c, who)->abort_reason);
    return CDDP_OK;
}

/* Wakes every rank blocked in a wait (after an arrival or an abort), if any is. */
void cddp__shm_wake(cddp_comm *c) {
    seg_header *h = header(c);
    if (atomic_load(&h->sleepers) > 0) {
        atomic_fetch_add(&h->wake, 1);
        syscall(SYS_futex, &h->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* Blocks until a rank arrives or aborts (wake_sleepers), or for at most 10 ms, unless ready()
 * already holds. The arrival store and the sleepers load of wake_sleepers, and the sleepers
 * increment and the ready() load here, are sequentially consistent: either this rank sees the
 * arrival, or the arriving rank sees the sleeper and bumps the futex word, so a wake-up is never
 * lost. */
static void sleep_until(cddp_comm *c, bool (*ready)(const void *), const void *arg) {
    seg_header *h = header(c);
    uint32_t seen = atomic_load(&h->wake);
    atomic_fetch_add(&h->sleepers, 1);
    if (!ready(arg) && !atomic_load(&h->abort_rank) && !atomic_load(&c->aborted))
        syscall(SYS_futex, &h->wake, FUTEX_WAIT, seen, &(struct timespec){0, 10000000}, NULL, 0);
    atomic_fetch_sub(&h->sleepers, 1);
}

/* Whether rank r's process is gone (a peer that exited cleanly has no more to give either): no
 * such process, or a dead one that its parent has not reaped yet (a zombie answers kill(pid, 0)
 * as if alive, for as long as the parent leaves it). */
static bool gone(const cddp_comm *c, int r) {
    pid_t pid = ctl_of(c, r)->pid;
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[48], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *state = strrchr(stat, ')'); /* "pid (comm) S ...": the state follows the name */
    return state && (state[2] == 'Z' || state[2] == 'X');
}

/* The stall inspector's view, once the call has waited CDDP_STALL_WARN_S: the ranks that have
 * not entered it (their fingerprint is an older call's), else the one this rank waits for. */
static void say_stalled(cddp_comm *c, int who) {
    if (c->stall_warn <= 0 || cddp_now_s() - c->call_start < c->stall_warn) return;
    int late[64], n = 0;
    for (int r = 0; r < c->world && n < 64; r++) {
        ctl *k = ctl_of(c, r);
        uint64_t s0 = __atomic_load_n(&k->fp[0].seq, __ATOMIC_RELAXED);
        uint64_t s1 = __atomic_load_n(&k->fp[1].seq, __ATOMIC_RELAXED);
        if (r != c->rank && (s0 > s1 ? s0 : s1) < c->call.seq) late[n++] = r;
    }
    if (n)
        cddp__comm_stalled(c, late, n, false);
    else
        cddp__comm_stalled(c, &who, 1, true);
}

/* Whether rank who last waited on the CPU this rank runs on; this rank's CPU is published for
 * the others (written only when it changes: the block's line is what the peers poll). */
static bool beside(cddp_comm *c, int who) {
    int cpu = sched_getcpu() + 1;
    _Atomic int32_t *mine = &ctl_of(c, c->rank)->cpu;
    if (atomic_load_explicit(mine, memory_order_relaxed) != cpu)
        atomic_store_explicit(mine, cpu, memory_order_relaxed);
    return who != c->rank && cpu > 0 &&
           atomic_load_explicit(&ctl_of(c, who)->cpu, memory_order_relaxed) == cpu;
}

/* One round of a wait that found nothing ready: after the spin (cddp__comm_spin), sleep until
 * an arrival; every 10 ms, check an abort, whether peer `who` still exists (ready() says whether
 * what it owes arrived meanwhile: a peer may arrive, finish and exit between two looks) and the
 * deadline. A move (notices) also reads whether `who` failed: in a ring each rank waits for the
 * previous one only, so a failure travels around it that way (the root cause in its words). */
int cddp__shm_idle(cddp_comm *c, waiting *w, bool (*ready)(const void *), const void *arg, int who,
                   bool notices, const char *what, uint64_t num, double deadline, cddp_error *err) {
    cddp__shm_relax();
    CDDP_TRY(cddp__shm_check_abort(c, err));
    double now = cddp_now_s();
    if (cddp__comm_spin(c, &w->spin, now, beside(c, who))) return CDDP_OK;
    sleep_until(c, ready, arg);
    now = cddp_now_s();
    if (now < w->next_check) return CDDP_OK;
    w->next_check = now + 0.01;
    if (notices && atomic_load(&ctl_of(c, who)->failed) && !ready(arg))
        return cddp__comm_peer_failed(c, err, who, ctl_of(c, who)->abort_reason);
    if (atomic_load_explicit(&ctl_of(c, who)->left, memory_order_acquire) && !ready(arg))
        return cddp__comm_peer_left(c, err, who, what, num, ctl_of(c, who)->left_after);
    if (gone(c, who) && !ready(arg)) {
        CDDP_TRY(cddp__shm_check_abort(c, err)); /* it may have aborted the group, then exited */
        return cddp__comm_peer_died(c, err, who, (int)ctl_of(c, who)->pid, what, num);
    }
    if (deadline >= 0 && now > deadline) return cddp__comm_timed_out(c, err, what, num, who);
    say_stalled(c, who);
    return CDDP_OK;
}

typedef struct counter_at {
    _Atomic uint64_t *a;
    uint64_t target;
} counter_at;

static bool counter_reached(const void *arg) {
    const counter_at *t = arg;
    return atomic_load_explicit(t->a, memory_order_acquire) >= t->target;
}

/* Waits until *a (written by rank who, or by any peer when who is -1: each is looked for in
 * turn) reaches at least target, or the group fails. The errors name the wait as "what #num". */
int cddp__shm_wait_for(cddp_comm *c, _Atomic uint64_t *a, uint64_t target, int who,
                       const char *what, uint64_t num, double deadline, cddp_error *err) {
    counter_at t = {a, target};
    waiting w = {0};
    int peer = who < 0 ? c->rank : who;
    for (unsigned spins = 0; !counter_reached(&t); spins++) {
        if (spins % 64) {
            cddp__shm_relax();
            continue;
        }
        if (who < 0 && c->world > 1) do
                peer = (peer + 1) % c->world;
            while (peer == c->rank);
        CDDP_TRY(cddp__shm_idle(c, &w, counter_reached, &t, peer, false, what, num, deadline, err));
    }
    return CDDP_OK;
}

/* Every rank arrives at the next step, or the group fails (deadline, dead peer). */
int cddp__shm_sync_all(cddp_comm *c, double deadline, cddp_error *err) {
    uint64_t step = ++priv(c)->step;
    atomic_store(&ctl_of(c, c->rank)->arrive, step);
    cddp__shm_wake(c);
    for (int r = 0; r < c->world; r++)
        CDDP_TRY(cddp__shm_wait_for(c, &ctl_of(c, r)->arrive, step, r, "collective", c->seq,
                                    deadline, err));
    return CDDP_OK;
}
