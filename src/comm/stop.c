/* stop.c: SIGTERM and SIGINT as a request to stop after the step (cddp/stop.h).
 *
 * The state is the process's: the signal asked for (0: none), whether a signal is a request now
 * (between catch and release), whether the request was handed to the program by
 * cddp_stop_agreed, and what to say when it comes. The watcher thread and a handler on a thread
 * made before main both run take, which touches only these flags and write(2).
 */
#include "comm/internal.h"
#include "cddp/stop.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Atomics (lock-free, so a handler may touch them too): the watcher thread writes what the
 * training thread reads. */
static _Atomic int stop_sig, stop_armed, stop_handed;
static const char *_Atomic stop_say;
static _Atomic size_t stop_say_len;
static sigset_t stop_set; /* SIGINT and SIGTERM, but one the process was started to ignore */
static const int stop_sigs[] = {SIGINT, SIGTERM};
static pthread_once_t stop_once = PTHREAD_ONCE_INIT;
static int stop_rc; /* of the one watch: 0, or pthread_create's error */

/* The signal ends the process as if never caught: its default action, on this thread. */
static void end_now(int sig) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL); /* in a handler: once it returns */
    raise(sig);
}

/* The first signal while caught is a request to stop after the step; another, or one outside,
 * ends the process. */
static void take(int sig) {
    if (!stop_armed || stop_sig) {
        end_now(sig);
        return;
    }
    stop_sig = sig;
    const char *say = stop_say;
    if (say) {
        (void)!write(STDERR_FILENO, "\n", 1);
        (void)!write(STDERR_FILENO, say, stop_say_len);
    }
}

static void *watch(void *arg) {
    (void)arg;
    for (int sig;;)
        if (sigwait(&stop_set, &sig) == 0) take(sig);
    return NULL;
}

static void watch_once(void) {
    sigemptyset(&stop_set);
    for (int k = 0; k < 2; k++) { /* the handler: for threads made before main */
        struct sigaction old, sa = {.sa_handler = take};
        sigemptyset(&sa.sa_mask);
        if (sigaction(stop_sigs[k], NULL, &old) == 0 && old.sa_handler != SIG_IGN) {
            sigaddset(&stop_set, stop_sigs[k]);
            sigaction(stop_sigs[k], &sa, NULL);
        }
    }
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL); /* inherited by every thread made from now on */
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    stop_rc = pthread_create(&t, &attr, watch, NULL);
    pthread_attr_destroy(&attr);
    if (stop_rc != 0) { /* nobody to take them: they end the process, as they did */
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigemptyset(&dfl.sa_mask);
        for (int k = 0; k < 2; k++)
            if (sigismember(&stop_set, stop_sigs[k]) == 1) sigaction(stop_sigs[k], &dfl, NULL);
        pthread_sigmask(SIG_UNBLOCK, &stop_set, NULL);
    }
}

int cddp_stop_watch(cddp_error *err) {
    pthread_once(&stop_once, watch_once);
    if (stop_rc != 0)
        return cddp_error_set(err, CDDP_EIO,
                              "cannot start the thread that takes SIGTERM and SIGINT: %s; they "
                              "end the process at once, as without cddp_stop_watch",
                              strerror(stop_rc));
    return CDDP_OK;
}

void cddp_stop_catch(const char *say) {
    stop_say_len = say ? strlen(say) : 0;
    stop_say = say;
    stop_armed = 1;
}

void cddp_stop_release(void) {
    stop_armed = 0;
    if (stop_sig && !stop_handed) end_now(stop_sig); /* asked since the last step */
}

int cddp_stop_agreed(cddp_comm *group, int *sig, cddp_error *err) {
    int32_t s = stop_sig;
    *sig = 0;
    if (group && cddp_comm_size(group) > 1)
        CDDP_TRY(cddp_comm_allreduce(group, &s, &s, 1, CDDP_COMM_I32, CDDP_COMM_MAX, -1, err));
    if (s) stop_handed = 1;
    *sig = s;
    return CDDP_OK;
}
