/* queue.c: the emulated device's queue (emu.h): a thread that runs what was queued, in order.
 *
 * Tasks are a linked list under one lock; the thread takes them one at a time and counts what it
 * has run, and a wait sleeps until that count reaches what had been queued when it began. Each
 * wait also says how far it waits (`want`), so that a task may hold back until someone waits for
 * it (cddp__emu_queue_hold). */
#include "tensor/emu/emu.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

typedef struct task {
    struct task *next;
    cddp__emu_fn fn;
    void *arg;
} task;

struct cddp__emu_queue {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work, done, asked;
    task *head, *tail;
    uint64_t queued, ran;
    uint64_t want; /* the furthest mark a wait has waited for */
    bool stop;
};

static void *run(void *arg) {
    cddp__emu_queue *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->work, &q->lock);
        if (!q->head) break;
        task *t = q->head;
        q->head = t->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->lock);
        t->fn(t->arg);
        cddp_free(t);
        pthread_mutex_lock(&q->lock);
        q->ran++;
        pthread_cond_broadcast(&q->done);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

cddp__emu_queue *cddp__emu_queue_create(const char *name, cddp_error *err) {
    cddp__emu_queue *q = cddp_calloc(1, sizeof *q);
    if (!q) {
        cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for a queue", name);
        return NULL;
    }
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, NULL);
    pthread_cond_init(&q->asked, NULL);
    if (pthread_create(&q->thread, NULL, run, q) != 0) {
        cddp_error_set(err, CDDP_ENOMEM, "%s: cannot start the queue's thread", name);
        pthread_cond_destroy(&q->asked);
        pthread_cond_destroy(&q->done);
        pthread_cond_destroy(&q->work);
        pthread_mutex_destroy(&q->lock);
        cddp_free(q);
        return NULL;
    }
    return q;
}

void cddp__emu_queue_respawn(cddp__emu_queue *q) {
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, NULL);
    pthread_cond_init(&q->asked, NULL);
    q->head = q->tail = NULL; /* none: the fork waited for the queue */
    q->ran = q->queued;
    q->stop = false;
    CDDP_CHECK(pthread_create(&q->thread, NULL, run, q) == 0,
               "emu: cannot start a queue's thread in a forked child");
}

void cddp__emu_queue_destroy(cddp__emu_queue *q) {
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    q->stop = true;
    pthread_cond_signal(&q->work);
    pthread_cond_broadcast(&q->asked);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->asked);
    pthread_cond_destroy(&q->done);
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->lock);
    cddp_free(q);
}

void cddp__emu_queue_push(cddp__emu_queue *q, cddp__emu_fn fn, void *arg) {
    task *t = cddp_malloc(sizeof *t);
    CDDP_CHECK(t, "emu: out of memory for a queued task");
    *t = (task){NULL, fn, arg};
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    q->queued++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
}

uint64_t cddp__emu_queue_mark(cddp__emu_queue *q) {
    pthread_mutex_lock(&q->lock);
    uint64_t mark = q->queued;
    pthread_mutex_unlock(&q->lock);
    return mark;
}

void cddp__emu_queue_wait_mark(cddp__emu_queue *q, uint64_t mark) {
    pthread_mutex_lock(&q->lock);
    if (mark > q->want) {
        q->want = mark;
        pthread_cond_broadcast(&q->asked);
    }
    while (q->ran < mark) pthread_cond_wait(&q->done, &q->lock);
    pthread_mutex_unlock(&q->lock);
}

bool cddp__emu_queue_ran(cddp__emu_queue *q, uint64_t mark) {
    pthread_mutex_lock(&q->lock);
    bool ran = q->ran >= mark;
    pthread_mutex_unlock(&q->lock);
    return ran;
}

void cddp__emu_queue_hold(cddp__emu_queue *q, double max_s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double at = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + max_s;
    until.tv_sec = (time_t)at;
    until.tv_nsec = (long)((at - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&q->lock);
    uint64_t me = q->ran + 1; /* the task running now */
    while (q->want < me && !q->stop &&
           pthread_cond_timedwait(&q->asked, &q->lock, &until) != ETIMEDOUT) {}
    pthread_mutex_unlock(&q->lock);
}

void cddp__emu_queue_wait(cddp__emu_queue *q) {
    cddp__emu_queue_wait_mark(q, cddp__emu_queue_mark(q));
}
