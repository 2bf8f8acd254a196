/* test_stop.c: cddp/stop.h in one process: a signal while caught is a request the program sees
 * after the step, a second one or one outside ends the process by it, a request not yet handed
 * to the program ends it at release, an ignored SIGINT stays ignored, threads made after the
 * watch block the signals. Each case runs in a child of its own (the state is the process's);
 * the multi-rank agreement runs through cddprun in example_stop. */
#include "helpers.h"

#include <cddp/stop.h>

#include <pthread.h>
#include <time.h>

/* In the child: sig from this process to itself, then up to ms milliseconds of cddp_stop_agreed
 * on no group for a request; returns the signal it saw, or 0. */
static int request(int sig, int ms) {
    kill(getpid(), sig);
    for (int i = 0; i < ms / 10; i++) {
        int got = -1;
        if (cddp_stop_agreed(NULL, &got, NULL) != CDDP_OK) return -1;
        if (got) return got;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return 0;
}

/* Runs body in a child whose stderr goes to the file err_path (NULL: /dev/null), alarm-bounded;
 * returns its wait status. */
static int in_child(void (*body)(void), const char *err_path) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20);
        if (!freopen(err_path ? err_path : "/dev/null", "w", stderr)) _exit(90);
        body();
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void expect_signal(int status, int sig) {
    if (!WIFSIGNALED(status))
        fail_msg("the child ended with status %d, not by signal %d", WEXITSTATUS(status), sig);
    assert_int_equal(WTERMSIG(status), sig);
}

static void expect_exit(int status, int code) {
    if (WIFSIGNALED(status)) fail_msg("the child ended by signal %d", WTERMSIG(status));
    assert_int_equal(WEXITSTATUS(status), code);
}

static void request_then_release(void) {
    if (cddp_stop_watch(NULL) != CDDP_OK) _exit(91);
    cddp_stop_catch("stopping after this step\n");
    if (request(SIGTERM, 5000) != SIGTERM) _exit(92);
    cddp_stop_release(); /* the request was handed over: the program goes on */
    _exit(7);
}

/* A request is seen after the step, said on stderr once, and release leaves the process to save
 * and end as it chooses. */
static void test_request(void **state) {
    (void)state;
    char path[] = "/tmp/cddp_test_stop_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int status = in_child(request_then_release, path);
    FILE *f = fopen(path, "r");
    char text[256] = {0};
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    unlink(path); /* before any check can fail */
    text[n] = '\0';
    expect_exit(status, 7);
    assert_non_null(f);
    assert_string_equal(text, "\nstopping after this step\n");
}

static void twice(void) {
    cddp_stop_watch(NULL);
    cddp_stop_catch(NULL);
    if (request(SIGINT, 5000) != SIGINT) _exit(92);
    kill(getpid(), SIGTERM); /* the second: at once */
    sleep(10);
    _exit(8);
}

static void outside(void) {
    cddp_stop_watch(NULL);
    kill(getpid(), SIGTERM); /* never caught: the default action */
    sleep(10);
    _exit(8);
}

static void released(void) {
    cddp_stop_watch(NULL);
    cddp_stop_catch(NULL);
    cddp_stop_release(); /* caught no more */
    kill(getpid(), SIGINT);
    sleep(10);
    _exit(8);
}

static void pending_at_release(void) {
    cddp_stop_watch(NULL);
    cddp_stop_catch(NULL);
    kill(getpid(), SIGTERM);
    sleep(1); /* the watcher has it; nobody asked cddp_stop_agreed */
    cddp_stop_release();
    _exit(8);
}

/* Whatever is not a first request while caught ends the process by its signal. */
static void test_ends(void **state) {
    (void)state;
    expect_signal(in_child(twice, NULL), SIGTERM);
    expect_signal(in_child(outside, NULL), SIGTERM);
    expect_signal(in_child(released, NULL), SIGINT);
    expect_signal(in_child(pending_at_release, NULL), SIGTERM);
}

static void ignored_sigint(void) {
    signal(SIGINT, SIG_IGN); /* as a script's background job starts */
    cddp_stop_watch(NULL);
    cddp_stop_catch(NULL);
    if (request(SIGINT, 1000) != 0) _exit(93); /* no request: ignored */
    cddp_stop_release();
    kill(getpid(), SIGINT); /* and still ignored outside */
    sleep(1);
    cddp_stop_catch(NULL);
    if (request(SIGTERM, 5000) != SIGTERM) _exit(94);
    _exit(9);
}

/* A SIGINT the process was started to ignore stays ignored; SIGTERM is still taken. */
static void test_ignored(void **state) {
    (void)state;
    expect_exit(in_child(ignored_sigint, NULL), 9);
}

static void *mask_of_thread(void *arg) {
    sigset_t *out = arg;
    pthread_sigmask(SIG_BLOCK, NULL, out);
    return NULL;
}

static void threads_block(void) {
    if (cddp_stop_watch(NULL) != CDDP_OK) _exit(91);
    if (cddp_stop_watch(NULL) != CDDP_OK) _exit(95); /* once is enough; again does no harm */
    sigset_t m;
    sigemptyset(&m);
    pthread_t t;
    if (pthread_create(&t, NULL, mask_of_thread, &m) != 0 || pthread_join(t, NULL) != 0) _exit(96);
    _exit(sigismember(&m, SIGTERM) == 1 && sigismember(&m, SIGINT) == 1 ? 10 : 97);
}

/* A thread made after the watch blocks both signals: no handler runs in its kernels. */
static void test_threads_block(void **state) {
    (void)state;
    expect_exit(in_child(threads_block, NULL), 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request),
        cmocka_unit_test(test_ends),
        cmocka_unit_test(test_ignored),
        cmocka_unit_test(test_threads_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
