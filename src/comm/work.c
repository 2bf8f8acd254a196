/* work.c: the group's communication thread, and the handles of queued collectives.
 *
 * One thread per group, started by the first queued call, runs queued calls in issue order. A
 * blocking call waits until the queue is empty and the thread idle, then runs on its caller's
 * thread: small blocking collectives pay no thread hand-off, and the order in which a rank
 * issues collectives is the order in which they run, whichever way each was issued (every rank
 * must run them in the same order, or the fingerprints catch it). A blocking call made by a
 * queued function (cddp_comm_call_async: DDP's communication hooks) runs at once on the thread,
 * inside that function's turn; a wait there for work queued after it could never end, and fails
 * saying so.
 *
 * Waiters sleep on condition variables, never spin: the thread that waits for a gradient
 * bucket leaves the core to the ranks still computing. Handles are recycled through a free
 * list, so a steady stream of async calls allocates nothing.
 */
#include "comm/internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int cddp__comm_work_init(cddp_comm *c) {
    pthread_condattr_t attr;
    if (pthread_mutex_init(&c->mu, NULL) != 0) return CDDP_ENOMEM;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->queued, &attr);
    pthread_cond_init(&c->finished, &attr);
    pthread_condattr_destroy(&attr);
    return CDDP_OK;
}

void cddp__comm_work_fini(cddp_comm *c) {
    pthread_mutex_lock(&c->mu);
    if (c->head || c->thread_busy) { /* work nobody will wait for: make it end now */
        snprintf(c->abort_reason, sizeof c->abort_reason,
                 "the group was destroyed with work still queued");
        atomic_store(&c->aborted, 1);
    }
    c->stopping = true;
    pthread_cond_broadcast(&c->queued);
    bool started = c->thread_started;
    pthread_mutex_unlock(&c->mu);
    if (started) pthread_join(c->thread, NULL);
    for (cddp_comm_work *w = c->all, *next; w; w = next) {
        next = w->all_next;
        cddp_free(w);
    }
    pthread_cond_destroy(&c->queued);
    pthread_cond_destroy(&c->finished);
    pthread_mutex_destroy(&c->mu);
}

static void *thread_main(void *arg) {
    cddp_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stopping && (!c->head || c->inline_busy)) pthread_cond_wait(&c->queued, &c->mu);
        cddp_comm_work *w = c->head;
        if (!w) break; /* stopping, nothing left */
        c->head = w->next;
        if (!c->head) c->tail = NULL;
        c->thread_busy = true;
        pthread_mutex_unlock(&c->mu);
        cddp_error e = {0};
        double t0 = cddp_now_s();
        int st = cddp__comm_execute(c, &w->call, &e);
        double t1 = cddp_now_s();
        pthread_mutex_lock(&c->mu);
        w->t_start = t0;
        w->t_end = t1;
        w->status = st;
        w->err = e;
        w->done = true;
        c->thread_busy = false;
        pthread_cond_broadcast(&c->finished);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Whether the caller is the group's communication thread (running a queued function). */
static bool on_thread(cddp_comm *c) {
    pthread_mutex_lock(&c->mu);
    bool here = c->thread_started && pthread_equal(pthread_self(), c->thread);
    pthread_mutex_unlock(&c->mu);
    return here;
}

static void blocked_since(cddp_comm *c, double t0) {
    atomic_fetch_add(&c->blocked_ns, (int64_t)((cddp_now_s() - t0) * 1e9));
}

double cddp_comm_blocked_s(const cddp_comm *c) {
    return (double)atomic_load(&((cddp_comm *)c)->blocked_ns) * 1e-9;
}

int cddp__comm_run(cddp_comm *c, const coll *a, cddp_error *err) {
    if (on_thread(c)) return cddp__comm_execute(c, a, err); /* its turn is this call's */
    double t0 = cddp_now_s();
    pthread_mutex_lock(&c->mu);
    while (c->head || c->thread_busy || c->inline_busy) pthread_cond_wait(&c->finished, &c->mu);
    c->inline_busy = true;
    pthread_mutex_unlock(&c->mu);
    int rc = cddp__comm_execute(c, a, err);
    pthread_mutex_lock(&c->mu);
    c->inline_busy = false;
    pthread_cond_broadcast(&c->queued);
    pthread_cond_broadcast(&c->finished);
    pthread_mutex_unlock(&c->mu);
    blocked_since(c, t0);
    return rc;
}

cddp_comm_work *cddp__comm_enqueue(cddp_comm *c, const coll *a, cddp_error *err) {
    if (cddp__comm_check(c, a, err) != CDDP_OK) return NULL;
    pthread_mutex_lock(&c->mu);
    if (!c->thread_started) {
        int e = pthread_create(&c->thread, NULL, thread_main, c);
        if (e != 0) {
            pthread_mutex_unlock(&c->mu);
            cddp_error_set(err, CDDP_EIO, "cannot start the communication thread: %s", strerror(e));
            return NULL;
        }
        c->thread_started = true;
    }
    cddp_comm_work *w = c->free_list;
    if (w) {
        c->free_list = w->next;
    } else if ((w = cddp_calloc(1, sizeof *w))) {
        w->all_next = c->all;
        c->all = w;
    } else {
        pthread_mutex_unlock(&c->mu);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    w->call = *a;
    w->call.flight = cddp__flight_call(c, a);
    w->group = c;
    w->done = false;
    w->status = CDDP_OK;
    w->next = NULL;
    if (c->tail)
        c->tail->next = w;
    else
        c->head = w;
    c->tail = w;
    pthread_cond_signal(&c->queued);
    pthread_mutex_unlock(&c->mu);
    return w;
}

bool cddp_comm_test(cddp_comm_work *w) {
    pthread_mutex_lock(&w->group->mu);
    bool done = w->done;
    pthread_mutex_unlock(&w->group->mu);
    return done;
}

int cddp_comm_wait(cddp_comm_work *w, double timeout_s, cddp_error *err) {
    return cddp_comm_wait_timed(w, timeout_s, NULL, NULL, err);
}

int cddp_comm_wait_timed(cddp_comm_work *w, double timeout_s, double *t_start, double *t_end,
                         cddp_error *err) {
    cddp_comm *c = w->group;
    bool timed_out = false;
    double t0 = cddp_now_s();
    if (on_thread(c) && !cddp_comm_test(w))
        return cddp_error_set(err, CDDP_ESTATE,
                              "a function queued on the group's communication thread waits for "
                              "work queued after it, which that thread would run only once the "
                              "function returns: use the blocking collectives there");
    pthread_mutex_lock(&c->mu);
    if (timeout_s >= 0 && !w->done) {
        struct timespec at;
        clock_gettime(CLOCK_MONOTONIC, &at);
        double t = (double)at.tv_sec + at.tv_nsec * 1e-9 + timeout_s;
        at.tv_sec = (time_t)t;
        at.tv_nsec = (long)((t - (double)at.tv_sec) * 1e9);
        while (!w->done && pthread_cond_timedwait(&c->finished, &c->mu, &at) != ETIMEDOUT) {}
        if (!w->done) {
            timed_out = true;
            pthread_mutex_unlock(&c->mu);
            char why[96];
            snprintf(why, sizeof why, "a wait for queued work timed out after %g s", timeout_s);
            cddp__comm_abort(c, why);
            pthread_mutex_lock(&c->mu);
        }
    }
    while (!w->done) pthread_cond_wait(&c->finished, &c->mu);
    int st = w->status;
    if (st != CDDP_OK && err && !timed_out) *err = w->err;
    if (t_start) *t_start = w->t_start;
    if (t_end) *t_end = w->t_end;
    w->next = c->free_list;
    c->free_list = w;
    pthread_mutex_unlock(&c->mu);
    blocked_since(c, t0);
    if (timed_out)
        return cddp_error_set(err, CDDP_ETIMEDOUT,
                              "waiting for queued work took longer than %g s; the group is "
                              "aborted",
                              timeout_s);
    return st;
}
