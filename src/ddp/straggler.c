/* straggler.c: which rank makes the others wait, and in which phase of the step.
 *
 * An allreduce makes every rank's step as long as the slowest rank's, so each rank's own step
 * time shows nothing; what differs is how long a rank was busy before it reached the
 * communication: the time between steps (its data loading), its forward, its backward and its
 * optimizer step. The slow rank waits for the buckets the least, the others the longest. Every
 * rank adds its phases over a window of CDDP_STRAGGLER_EVERY synchronised steps (its busiest step
 * left out, so that one pause does not name a rank); at the window's end the ranks exchange the
 * means (one allgather of six doubles) and a rank busy more than CDDP_STRAGGLER_PCT percent (and
 * half a millisecond) longer than the median of the others is named by rank 0, with the phase
 * whose excess over the others' median is the largest.
 */
#include "ddp/internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *const phase_words[CDDP__PHASES] = {"data loading", "forward", "backward",
                                                      "optimizer step", "wait for communication"};

void cddp__ddp_straggler_init(cddp_ddp *d) {
    cddp__straggler *g = &d->sg;
    memset(g, 0, sizeof *g);
    g->every = CDDP_MAX(cddp_knob_int(CDDP_KNOB_STRAGGLER_EVERY), 0);
    if (g->every == 1) g->every = 2; /* a window of one step has no busiest step to leave out */
    g->pct = (double)CDDP_MAX(cddp_knob_int(CDDP_KNOB_STRAGGLER_PCT), 0);
    d->stats.straggler = d->stats.slowest = -1;
}

void cddp__ddp_straggler_forward(cddp_ddp *d, double now) {
    if (!d->sg.in_step) {
        d->sg.in_step = true;
        d->sg.t_first_forward = now;
        d->sg.b_forward = cddp_comm_blocked_s(d->group);
    }
}

void cddp__ddp_straggler_backward(cddp_ddp *d) {
    d->sg.b_backward = cddp_comm_blocked_s(d->group);
}

void cddp__ddp_straggler_optimizing(cddp_ddp *d) {
    d->sg.b_optim = cddp_comm_blocked_s(d->group);
}

void cddp__ddp_straggler_optimized(cddp_ddp *d, double now) {
    double b = cddp_comm_blocked_s(d->group);
    if (d->t_optim > 0 && now > d->t_optim)
        d->sg.optim += CDDP_MAX(now - d->t_optim - (b - d->sg.b_optim), 0.0);
    d->sg.t_end = now;
    d->sg.b_end = b;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[r * stride] over the ranks but `skip`. */
static double median_of_others(const double *v, int world, int stride, int skip, double *tmp) {
    int n = 0;
    for (int r = 0; r < world; r++)
        if (r != skip) tmp[n++] = v[r * stride];
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/* The window's means of every rank, all[r * 8 + p] (p < CDDP__PHASES; [7]: the busy sum), judged.
 */
static void judge(cddp_ddp *d, double *all, int steps) {
    cddp_ddp_stats *s = &d->stats;
    int world = d->world, was = s->straggler;
    double *tmp = cddp_malloc(sizeof(double) * (size_t)world);
    if (!tmp) return;
    s->compared_at = d->steps;
    s->straggler = s->slowest = -1;
    s->slowest_pct = 0;
    for (int r = 0; r < world; r++) {
        double busy = all[r * 8 + 7], med = median_of_others(all + 7, world, 8, r, tmp);
        double pct = med > 0 ? 100.0 * (busy - med) / med : 0;
        if (s->slowest < 0 || pct > s->slowest_pct) s->slowest = r, s->slowest_pct = pct;
    }
    int r = s->slowest;
    double busy = all[r * 8 + 7], med = median_of_others(all + 7, world, 8, r, tmp);
    if (s->slowest_pct > d->sg.pct && busy - med > 0.5e-3) {
        int worst = 0;
        double excess = -1;
        for (int p = 0; p < CDDP__PH_WAIT; p++) {
            double m = median_of_others(all + p, world, 8, r, tmp);
            if (all[r * 8 + p] - m > excess) excess = all[r * 8 + p] - m, worst = p;
        }
        s->straggler = r;
        s->straggler_phase = phase_words[worst];
        s->straggler_phase_s = all[r * 8 + worst];
        s->median_phase_s = median_of_others(all + worst, world, 8, r, tmp);
        if (d->rank == 0)
            cddp_log(CDDP_LOG_WARN, "ddp",
                     "straggler: rank %d is %.0f %% slower than the median of the others over "
                     "the last %d steps (to step %" PRId64 "): its %s (%.1f ms against %.1f ms a "
                     "step); every rank waits for it",
                     r, s->slowest_pct, steps, d->steps, s->straggler_phase,
                     s->straggler_phase_s * 1e3, s->median_phase_s * 1e3);
    } else if (was >= 0 && d->rank == 0) {
        cddp_log(CDDP_LOG_INFO, "ddp",
                 "straggler: rank %d keeps up again (the slowest, rank %d, is %.0f %% over the "
                 "others' median in the steps to %" PRId64 ")",
                 was, r, s->slowest_pct, d->steps);
    }
    cddp_free(tmp);
}

int cddp__ddp_straggler_step(cddp_ddp *d, double t_backward, double t_walk_end, double t_done,
                             cddp_error *err) {
    cddp__straggler *g = &d->sg;
    double ph[CDDP__PHASES] = {0}, b_done = cddp_comm_blocked_s(d->group);
    /* each phase's time, less what the program spent blocked in the group's calls then (its own
     * collectives, a broadcast of buffers, the buckets when they are reduced inline) */
    if (g->in_step && g->t_end > 0 && g->t_first_forward > g->t_end)
        ph[CDDP__PH_DATA] = g->t_first_forward - g->t_end - (g->b_forward - g->b_end);
    if (g->in_step && t_backward > g->t_first_forward)
        ph[CDDP__PH_FORWARD] = t_backward - g->t_first_forward - (g->b_backward - g->b_forward);
    ph[CDDP__PH_BACKWARD] = t_walk_end - t_backward;
    if (g->b_backward >= g->b_forward) ph[CDDP__PH_BACKWARD] -= b_done - g->b_backward;
    ph[CDDP__PH_OPTIM] = g->optim;
    double busy = 0;
    for (int p = 0; p < CDDP__PH_WAIT; p++) busy += ph[p] = CDDP_MAX(ph[p], 0.0);
    ph[CDDP__PH_WAIT] = CDDP_MAX(t_done - (g->in_step ? g->t_end : t_backward) - busy, 0.0);
    g->optim = 0;
    g->in_step = false;
    g->t_end = t_done;
    g->b_end = b_done;
    if (!g->every || d->world < 2 || d->o.join) return CDDP_OK;
    double worst = 0;
    for (int p = 0; p < CDDP__PH_WAIT; p++) worst += g->worst[p];
    if (busy > worst) memcpy(g->worst, ph, sizeof ph);
    for (int p = 0; p < CDDP__PHASES; p++) g->sum[p] += ph[p];
    g->steps++;
    if (d->steps % g->every != 0 || g->steps < 2) return CDDP_OK;
    double mine[8] = {0};
    int n = g->steps - 1; /* the busiest step left out */
    for (int p = 0; p < CDDP__PHASES; p++) mine[p] = (g->sum[p] - g->worst[p]) / n;
    for (int p = 0; p < CDDP__PH_WAIT; p++) mine[7] += mine[p];
    memset(g->sum, 0, sizeof g->sum);
    memset(g->worst, 0, sizeof g->worst);
    g->steps = 0;
    double *all = cddp_malloc(sizeof(double) * 8 * (size_t)d->world);
    if (!all) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    int rc = cddp_comm_allgather(d->group, mine, all, 8, CDDP_COMM_F64, cddp__ddp_timeout(d), err);
    if (rc == CDDP_OK) judge(d, all, n + 1);
    cddp_free(all);
    return rc;
}
