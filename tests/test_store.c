/* test_store.c: the rendezvous store: every operation, waits, many clients, hostile frames, the
 * job token, and the errors users meet (port in use, unreachable or unresolvable master). */
#include "helpers.h"

#include <cddp/net.h>

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static cddp_store_server *srv;
static int port;

static int setup(void **state) {
    (void)state;
    cddp_error err = {0};
    srv = cddp_store_server_start("127.0.0.1", 0, "secret", &err);
    if (!srv) fprintf(stderr, "%s\n", err.msg);
    port = srv ? cddp_store_server_port(srv) : 0;
    return srv ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cddp_store_server_stop(srv);
    return 0;
}

static cddp_store *client(void) {
    cddp_error err = {0};
    cddp_store_options o = {"127.0.0.1", port, "secret", 5.0, NULL};
    cddp_store *s = cddp_store_connect(&o, &err);
    if (!s) fail_msg("%s", err.msg);
    return s;
}

/* The proof is HMAC-SHA256(secret, label NUL first second), as every cddp version computes it:
 * the value here is Python's hmac module's for the same bytes. Proofs compare equal only to
 * themselves, never to the all-zero proof. */
static void test_proof_is_hmac_sha256(void **state) {
    (void)state;
    uint8_t first[CDDP_NET_NONCE], second[CDDP_NET_NONCE], proof[CDDP_NET_PROOF],
        want[] = {0x92, 0xd0, 0x93, 0x29, 0x44, 0xa8, 0x98, 0xcd, 0x7a, 0x6c, 0xfc,
                  0xe1, 0x91, 0xc5, 0x4f, 0x57, 0x33, 0x69, 0xa4, 0x1e, 0xb4, 0x25,
                  0x87, 0x4b, 0xd1, 0xe1, 0x0b, 0x50, 0x34, 0xea, 0x8a, 0xfc};
    for (int i = 0; i < CDDP_NET_NONCE; i++) first[i] = (uint8_t)i, second[i] = (uint8_t)(100 + i);
    cddp_net_proof("job-secret", "cddp store: client", first, second, proof);
    assert_memory_equal(proof, want, sizeof want);
    assert_true(cddp_net_proof_equal(proof, want));
    want[31] ^= 1;
    assert_false(cddp_net_proof_equal(proof, want));
    uint8_t zero[CDDP_NET_PROOF] = {0};
    assert_false(cddp_net_proof_equal(zero, zero));
}

static void test_operations(void **state) {
    (void)state;
    cddp_store *s = client();
    cddp_error err = {0};
    void *v;
    size_t n;
    int64_t count0, count;
    assert_int_equal(cddp_store_num_keys(s, &count0, &err), 0);
    assert_int_equal(cddp_store_set_str(s, "key0", "value0", &err), 0);
    assert_int_equal(cddp_store_set(s, "bin", "\0\1\2", 3, &err), 0);
    assert_int_equal(cddp_store_get(s, "key0", 1, &v, &n, &err), 0);
    assert_string_equal(v, "value0");
    assert_int_equal(n, 6);
    cddp_free(v);
    assert_int_equal(cddp_store_get(s, "bin", 1, &v, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "\0\1\2", 3);
    cddp_free(v);
    /* add accumulates (PyTorch's StoreTestBase: 6 + 15 = 21) and reads back as text. */
    int64_t r;
    assert_int_equal(cddp_store_add(s, "key3", 6, &r, &err), 0);
    assert_int_equal(r, 6);
    assert_int_equal(cddp_store_add(s, "key3", 15, &r, &err), 0);
    assert_int_equal(r, 21);
    assert_int_equal(cddp_store_get(s, "key3", 1, &v, &n, &err), 0);
    assert_string_equal(v, "21");
    cddp_free(v);
    assert_int_equal(cddp_store_add(s, "key0", 1, &r, &err), CDDP_ESTATE); /* not a number */
    assert_non_null(strstr(err.msg, "not an integer"));
    /* A counter never wraps around: past INT64_MAX (or below INT64_MIN) add is refused and the
     * counter keeps its value. */
    assert_int_equal(cddp_store_add(s, "big", INT64_MAX - 1, &r, &err), 0);
    assert_int_equal(cddp_store_add(s, "big", 2, &r, &err), CDDP_ESTATE);
    assert_non_null(strstr(err.msg, "would overflow"));
    assert_int_equal(cddp_store_add(s, "big", 1, &r, &err), 0);
    assert_true(r == INT64_MAX);
    assert_int_equal(cddp_store_add(s, "small", INT64_MIN + 1, &r, &err), 0);
    assert_int_equal(cddp_store_add(s, "small", -2, &r, &err), CDDP_ESTATE);
    assert_int_equal(cddp_store_add(s, "small", -1, &r, &err), 0);
    assert_true(r == INT64_MIN);
    bool gone;
    assert_int_equal(cddp_store_delete(s, "big", &gone, &err), 0);
    assert_int_equal(cddp_store_delete(s, "small", &gone, &err), 0);
    /* compare_set: missing key with empty expected sets; missing with a value does not; a wrong
     * expected value leaves the key; the right one replaces it. */
    assert_int_equal(cddp_store_compare_set(s, "cs", "", 0, "first", 5, &v, &n, &err), 0);
    assert_string_equal(v, "first");
    cddp_free(v);
    assert_int_equal(cddp_store_compare_set(s, "cs2", "x", 1, "y", 1, &v, &n, &err), 0);
    assert_string_equal(v, "x");
    cddp_free(v);
    assert_int_equal(cddp_store_wait(s, (const char *[]){"cs2"}, 1, 0, &err), CDDP_ETIMEDOUT);
    assert_int_equal(cddp_store_compare_set(s, "cs", "wrong", 5, "second", 6, &v, &n, &err), 0);
    assert_string_equal(v, "first");
    cddp_free(v);
    assert_int_equal(cddp_store_compare_set(s, "cs", "first", 5, "second", 6, &v, &n, &err), 0);
    assert_string_equal(v, "second");
    cddp_free(v);
    /* num_keys and delete. */
    assert_int_equal(cddp_store_num_keys(s, &count, &err), 0);
    assert_int_equal(count, count0 + 4); /* key0, bin, key3, cs */
    bool deleted;
    assert_int_equal(cddp_store_delete(s, "key0", &deleted, &err), 0);
    assert_true(deleted);
    assert_int_equal(cddp_store_delete(s, "key0", &deleted, &err), 0);
    assert_false(deleted);
    assert_int_equal(cddp_store_num_keys(s, &count, &err), 0);
    assert_int_equal(count, count0 + 3);
    assert_int_equal(cddp_store_get(s, "key0", 0.05, &v, &n, &err), CDDP_ETIMEDOUT);
    cddp_store_close(s);
}

typedef struct later {
    const char *key;
    double delay;
} later;

static void *set_later(void *arg) {
    later *l = arg;
    usleep((useconds_t)(l->delay * 1e6));
    cddp_store *s = client();
    cddp_store_set_str(s, l->key, "arrived", NULL);
    cddp_store_close(s);
    return NULL;
}

static void test_waits(void **state) {
    (void)state;
    cddp_store *s = client();
    cddp_error err = {0};
    /* A wait on missing keys times out after the timeout, not before, naming what is missing. */
    double t0 = cddp_now_s();
    assert_int_equal(cddp_store_wait(s, (const char *[]){"w1", "w2"}, 2, 0.25, &err),
                     CDDP_ETIMEDOUT);
    double took = cddp_now_s() - t0;
    assert_true(took >= 0.25 && took < 2.0);
    assert_non_null(strstr(err.msg, "waiting for keys: w1, w2"));
    cddp_store_set_str(s, "w1", "x", &err);
    assert_int_equal(cddp_store_wait(s, (const char *[]){"w1", "w2"}, 2, 0.1, &err),
                     CDDP_ETIMEDOUT);
    assert_non_null(strstr(err.msg, "keys: w2"));
    assert_null(strstr(err.msg, "w1,"));
    /* A get blocks until another client sets the key. */
    pthread_t th;
    later l = {"w3", 0.2};
    pthread_create(&th, NULL, set_later, &l);
    void *v;
    size_t n;
    t0 = cddp_now_s();
    assert_int_equal(cddp_store_get(s, "w3", 5, &v, &n, &err), 0);
    assert_true(cddp_now_s() - t0 >= 0.15);
    assert_string_equal(v, "arrived");
    cddp_free(v);
    pthread_join(th, NULL);
    /* Present keys return at once. */
    assert_int_equal(cddp_store_wait(s, (const char *[]){"w1", "w3"}, 2, 0, &err), 0);
    cddp_store_close(s);
}

/* A connection's wills: set by the server when the connection ends (a waiter sees them at once),
 * also when its process dies without closing; a later will for a key replaces it, one withdrawn
 * is not set, and one connection may leave several. */
static void test_will(void **state) {
    (void)state;
    cddp_store *s = client(), *w = client();
    cddp_error err = {0};
    void *v;
    size_t n;
    assert_int_equal(cddp_store_set_will(w, "will/gone", "no", 2, &err), 0);
    assert_int_equal(cddp_store_set_will(w, "will/gone", "yes", 3, &err), 0); /* replaces */
    assert_int_equal(cddp_store_set_will(w, "will/free", "", 0, &err), 0);
    assert_int_equal(cddp_store_set_will(w, "will/withdrawn", "x", 1, &err), 0);
    assert_int_equal(cddp_store_clear_will(w, "will/withdrawn", &err), 0);
    assert_int_equal(cddp_store_set_will(w, NULL, "x", 1, &err), CDDP_EINVAL);
    assert_int_equal(cddp_store_wait(s, (const char *[]){"will/gone"}, 1, 0, &err), CDDP_ETIMEDOUT);
    cddp_store_close(w);
    assert_int_equal(cddp_store_get(s, "will/gone", 5, &v, &n, &err), 0);
    assert_string_equal(v, "yes");
    cddp_free(v);
    assert_int_equal(cddp_store_get(s, "will/free", 5, &v, &n, &err), 0);
    assert_int_equal(n, 0);
    cddp_free(v);
    assert_int_equal(cddp_store_wait(s, (const char *[]){"will/withdrawn"}, 1, 0, &err),
                     CDDP_ETIMEDOUT);
    /* every will withdrawn: nothing is set when it closes */
    w = client();
    assert_int_equal(cddp_store_set_will(w, "will/none", "x", 1, &err), 0);
    assert_int_equal(cddp_store_clear_will(w, NULL, &err), 0);
    cddp_store_close(w);
    assert_int_equal(cddp_store_set_str(s, "after", "1", &err), 0); /* the close is handled */
    assert_int_equal(cddp_store_get(s, "after", 5, &v, &n, &err), 0);
    cddp_free(v);
    assert_int_equal(cddp_store_wait(s, (const char *[]){"will/none"}, 1, 0.2, &err),
                     CDDP_ETIMEDOUT);
    /* a process that dies (SIGKILL) with a will: a waiter already parked gets it */
    pid_t pid = fork();
    if (pid == 0) {
        cddp_store *c = client();
        cddp_error e = {0};
        if (cddp_store_set_will(c, "will/killed", "1", 1, &e) ||
            cddp_store_set_str(c, "ready", "1", &e))
            _exit(1);
        pause();
        _exit(0);
    }
    assert_int_equal(cddp_store_get(s, "ready", 5, &v, &n, &err), 0);
    cddp_free(v);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    double t0 = cddp_now_s();
    assert_int_equal(cddp_store_wait(s, (const char *[]){"will/killed"}, 1, 5, &err), 0);
    assert_true(cddp_now_s() - t0 < 2);
    cddp_store_close(s);
}

#define CLIENTS 16
#define ROUNDS  50

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    cddp_store *s = client();
    cddp_error err = {0};
    char key[32], val[32];
    for (int r = 0; r < ROUNDS; r++) {
        snprintf(key, sizeof key, "c%d/%d", id, r);
        snprintf(val, sizeof val, "%d", id * 1000 + r);
        if (cddp_store_set_str(s, key, val, &err)) fail_msg("%s", err.msg);
        if (cddp_store_add(s, "total", 1, NULL, &err)) fail_msg("%s", err.msg);
    }
    /* Everyone's keys, once they exist. */
    for (int other = 0; other < CLIENTS; other++) {
        snprintf(key, sizeof key, "c%d/%d", other, ROUNDS - 1);
        void *v;
        size_t n;
        if (cddp_store_get(s, key, 10, &v, &n, &err)) fail_msg("%s", err.msg);
        if (atoi(v) != other * 1000 + ROUNDS - 1) fail_msg("%s holds %s", key, (char *)v);
        cddp_free(v);
    }
    cddp_store_close(s);
    return NULL;
}

static void test_sixteen_clients(void **state) {
    (void)state;
    pthread_t th[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
    cddp_store *s = client();
    void *v;
    size_t n;
    cddp_error err = {0};
    assert_int_equal(cddp_store_get(s, "total", 1, &v, &n, &err), 0);
    assert_int_equal(atoi(v), CLIENTS * ROUNDS);
    cddp_free(v);
    cddp_store_close(s);
}

static int raw_connect_to(int to) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)to),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static int raw_connect(void) {
    return raw_connect_to(port);
}

/* Reads until the server closes the connection; true if it did within 2 s. */
static bool closed_by_server(int fd) {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[256];
    ssize_t r;
    while ((r = recv(fd, b, sizeof b, 0)) > 0) {}
    return r == 0;
}

static void test_hostile_frames(void **state) {
    (void)state;
    /* Garbage instead of a frame. */
    int fd = raw_connect();
    assert_int_equal(send(fd, "GET / HTTP/1.1\r\n\r\n", 18, 0), 18);
    assert_true(closed_by_server(fd));
    close(fd);
    /* A header announcing more than the limit. */
    uint8_t h[12] = {'C', 'D', 'D', 'S', 2, 0, 1, 0, 0xff, 0xff, 0xff, 0x7f};
    fd = raw_connect();
    assert_int_equal(send(fd, h, 12, 0), 12);
    assert_true(closed_by_server(fd));
    close(fd);
    /* A request before the token. */
    uint8_t nk[12] = {'C', 'D', 'D', 'S', 2, 0, 7, 0, 0, 0, 0, 0};
    fd = raw_connect();
    assert_int_equal(send(fd, nk, 12, 0), 12);
    assert_true(closed_by_server(fd));
    close(fd);
    /* A truncated frame left open while others work, then abandoned: nobody stalls. */
    uint8_t part[12] = {'C', 'D', 'D', 'S', 2, 0, 1, 0, 100, 0, 0, 0};
    int stuck = raw_connect();
    assert_int_equal(send(stuck, part, 12, 0), 12);
    assert_int_equal(send(stuck, "abc", 3, 0), 3);
    cddp_store *s = client();
    cddp_error err = {0};
    int64_t count;
    assert_int_equal(cddp_store_set_str(s, "still", "serving", &err), 0);
    assert_int_equal(cddp_store_num_keys(s, &count, &err), 0);
    close(stuck);
    /* A malformed payload (a field longer than the frame). */
    uint8_t bad[16] = {'C', 'D', 'D', 'S', 2, 0, 1, 0, 4, 0, 0, 0, 0xff, 0xff, 0, 0};
    fd = raw_connect();
    assert_int_equal(send(fd, bad, 16, 0), 16);
    assert_true(closed_by_server(fd));
    close(fd);
    void *v;
    size_t n;
    assert_int_equal(cddp_store_get(s, "still", 1, &v, &n, &err), 0);
    assert_string_equal(v, "serving");
    cddp_free(v);
    cddp_store_close(s);
}

/* A server with the given stranger limits (CDDP_STORE_AUTH_TIMEOUT_S, CDDP_STORE_MAX_PENDING). */
static cddp_store_server *server_with(const char *auth_timeout_s, const char *max_pending) {
    setenv("CDDP_STORE_AUTH_TIMEOUT_S", auth_timeout_s, 1);
    setenv("CDDP_STORE_MAX_PENDING", max_pending, 1);
    cddp_error err = {0};
    cddp_store_server *s = cddp_store_server_start("127.0.0.1", 0, "secret", &err);
    unsetenv("CDDP_STORE_AUTH_TIMEOUT_S");
    unsetenv("CDDP_STORE_MAX_PENDING");
    if (!s) fail_msg("%s", err.msg);
    return s;
}

/* Connections without the token: small frames only, a deadline, and a cap on how many are kept
 * (the oldest goes, told to connect again); the job's clients get in meanwhile. */
static void test_strangers(void **state) {
    (void)state;
    cddp_store_server *s2 = server_with("1", "4");
    int p2 = cddp_store_server_port(s2);
    /* A frame above the limit before the token: closed at once, nothing buffered. */
    uint8_t big[12] = {'C', 'D', 'D', 'S', 2, 0, 1, 0, 0x88, 0x13, 0, 0}; /* 5000 bytes */
    int fd = raw_connect_to(p2);
    assert_int_equal(send(fd, big, 12, 0), 12);
    assert_true(closed_by_server(fd));
    close(fd);
    /* 8 idle strangers: the server keeps the newest 4 and tells the oldest to connect again. */
    int idle[8];
    for (int i = 0; i < 8; i++) {
        idle[i] = raw_connect_to(p2);
        usleep(20000);
    }
    uint8_t h[12];
    assert_int_equal(recv(idle[0], h, 12, MSG_WAITALL), 12);
    assert_memory_equal(h, "CDDS", 4);
    assert_int_equal(h[6], 105); /* REP_BUSY */
    for (int i = 0; i < 4; i++) assert_true(closed_by_server(idle[i]));
    /* A client of the job gets in past them and is served. */
    cddp_error err = {0};
    cddp_store_options o = {"127.0.0.1", p2, "secret", 5.0, NULL};
    cddp_store *c = cddp_store_connect(&o, &err);
    if (!c) fail_msg("%s", err.msg);
    assert_int_equal(cddp_store_set_str(c, "k", "v", &err), 0);
    /* The rest are closed when their second runs out, and the client stays. */
    double t0 = cddp_now_s();
    for (int i = 4; i < 8; i++) assert_true(closed_by_server(idle[i]));
    assert_true(cddp_now_s() - t0 < 2.0);
    int64_t n = 0;
    assert_int_equal(cddp_store_num_keys(c, &n, &err), 0);
    assert_int_equal(n, 1);
    cddp_store_close(c);
    for (int i = 0; i < 8; i++) close(idle[i]);
    cddp_store_server_stop(s2);
}

/* Out of file descriptors with every connection authenticated: the server rests its listener
 * instead of spinning on it, and keeps serving its clients. Runs in a child process whose
 * descriptor limit leaves the server room for two clients. */
static void test_no_descriptors(void **state) {
    (void)state;
    int to_parent[2];
    assert_int_equal(pipe(to_parent), 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* gone even if the parent's checks fail before it kills this process */
        dup2(to_parent[1], 3);
        for (int f = 4; f < 1024; f++) close(f);
        /* 0-3 taken; the server's listener, spare descriptor and wake-up pipe take 4 more: room
         * for 2 clients. */
        struct rlimit rl = {10, 10};
        setrlimit(RLIMIT_NOFILE, &rl);
        cddp_error err = {0};
        cddp_store_server *s = cddp_store_server_start("127.0.0.1", 0, "secret", &err);
        int p = s ? cddp_store_server_port(s) : 0;
        if (write(3, &p, sizeof p) != sizeof p) _exit(1);
        sleep(1); /* the parent connects its clients, then strangers that cannot be accepted */
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        sleep(2);
        getrusage(RUSAGE_SELF, &r1);
        double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) +
                     (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                     1e-6 * (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec +
                                     r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
        if (write(3, &cpu, sizeof cpu) != sizeof cpu) _exit(1);
        for (;;) pause();
    }
    close(to_parent[1]);
    int p = 0;
    assert_int_equal(read(to_parent[0], &p, sizeof p), sizeof p);
    assert_true(p > 0);
    cddp_error err = {0};
    cddp_store_options o = {"127.0.0.1", p, "secret", 5.0, NULL};
    cddp_store *a = cddp_store_connect(&o, &err), *b = cddp_store_connect(&o, &err);
    assert_non_null(a);
    assert_non_null(b);
    int strangers[5];
    for (int i = 0; i < 5; i++) strangers[i] = raw_connect_to(p);
    double cpu = -1;
    assert_int_equal(read(to_parent[0], &cpu, sizeof cpu), sizeof cpu);
    assert_true(cpu >= 0 && cpu < 0.5); /* a spinning listener takes the whole 2 s */
    assert_int_equal(cddp_store_set_str(a, "still", "serving", &err), 0);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(cddp_store_get(b, "still", 1, &v, &n, &err), 0);
    assert_string_equal(v, "serving");
    cddp_free(v);
    cddp_store_close(a);
    cddp_store_close(b);
    for (int i = 0; i < 5; i++) close(strangers[i]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(to_parent[0]);
}

/* A store frame's header: magic, version 2, type, payload length. */
static void frame_header(uint8_t h[12], int type, uint32_t len) {
    memcpy(h, "CDDS", 4);
    h[4] = 2;
    h[5] = 0;
    h[6] = (uint8_t)type;
    h[7] = 0;
    for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(len >> (8 * i));
}

/* Sends a frame of one field. */
static void send_field_frame(int fd, int type, const uint8_t *data, uint32_t n) {
    uint8_t f[12 + 4 + 64];
    frame_header(f, type, 4 + n);
    uint8_t len[4] = {(uint8_t)n, 0, 0, 0};
    memcpy(f + 12, len, 4);
    memcpy(f + 16, data, n);
    assert_int_equal(send(fd, f, 16 + n, 0), 16 + n);
}

/* Reads one frame; returns its type, the payload in p (up to cap bytes). */
static int read_frame(int fd, uint8_t *p, size_t cap) {
    uint8_t h[12];
    assert_int_equal(recv(fd, h, 12, MSG_WAITALL), 12);
    uint32_t len = h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
    assert_true(len <= cap);
    if (len) assert_int_equal(recv(fd, p, len, MSG_WAITALL), (ssize_t)len);
    return h[6];
}

/* The handshake by hand: a proof made with the token opens the store; the same proof replayed
 * on another connection (another server nonce) does not. */
static void test_proof_cannot_be_replayed(void **state) {
    (void)state;
    uint8_t nonce[CDDP_NET_NONCE] = {1, 2, 3}, p[128], proof[CDDP_NET_PROOF];
    int fd = raw_connect();
    send_field_frame(fd, 1, nonce, sizeof nonce);       /* HELLO */
    assert_int_equal(read_frame(fd, p, sizeof p), 106); /* CHALLENGE: {nonce_s, proof_s} */
    uint8_t server_nonce[CDDP_NET_NONCE], server_proof[CDDP_NET_PROOF];
    memcpy(server_nonce, p + 4, sizeof server_nonce);
    cddp_net_proof("secret", "cddp store: server", nonce, server_nonce, server_proof);
    assert_memory_equal(p + 4 + 16 + 4, server_proof, CDDP_NET_PROOF);
    cddp_net_proof("secret", "cddp store: client", nonce, server_nonce, proof);
    send_field_frame(fd, 9, proof, sizeof proof);       /* AUTH */
    assert_int_equal(read_frame(fd, p, sizeof p), 100); /* OK */
    close(fd);
    fd = raw_connect();
    send_field_frame(fd, 1, nonce, sizeof nonce);
    assert_int_equal(read_frame(fd, p, sizeof p), 106);
    assert_memory_not_equal(p + 4, server_nonce, CDDP_NET_NONCE);
    send_field_frame(fd, 9, proof, sizeof proof);
    assert_int_equal(read_frame(fd, p, sizeof p), 104); /* ERROR */
    assert_non_null(memmem(p, 100, "wrong job token", 15));
    assert_true(closed_by_server(fd));
    close(fd);
}

/* A connection that proved the token by hand; its requests are then raw frames. */
static int raw_authed(void) {
    uint8_t nonce[CDDP_NET_NONCE] = {9}, p[128], proof[CDDP_NET_PROOF];
    int fd = raw_connect();
    send_field_frame(fd, 1, nonce, sizeof nonce);
    assert_int_equal(read_frame(fd, p, sizeof p), 106);
    cddp_net_proof("secret", "cddp store: client", nonce, p + 4, proof);
    send_field_frame(fd, 9, proof, sizeof proof);
    assert_int_equal(read_frame(fd, p, sizeof p), 100);
    return fd;
}

/* A key with a NUL byte in it (the fuzzer's find: such keys collided when the table grew, and
 * leaked) is a malformed request. */
static void test_key_with_nul(void **state) {
    (void)state;
    int fd = raw_authed();
    send_field_frame(fd, 3, (const uint8_t *)"a\0b", 3); /* GET "a\0b" */
    assert_true(closed_by_server(fd));
    close(fd);
}

typedef struct connect_arg {
    int port;
    cddp_error err;
    bool ok;
} connect_arg;

static void *connect_thread(void *p) {
    connect_arg *a = p;
    cddp_store_options o = {"127.0.0.1", a->port, "secret-token-value", 5.0, NULL};
    cddp_store *s = cddp_store_connect(&o, &a->err);
    a->ok = s != NULL;
    cddp_store_close(s);
    return NULL;
}

/* A listener of the test's own on a free port (returned, its port in a->port) and a client thread
 * connecting to it (cddp_store_connect with the test's token: a->ok, a->err when it returns). */
static int listener_with_client(connect_arg *a, pthread_t *th) {
    int lfd = -1;
    cddp_error err = {0};
    assert_int_equal(cddp_net_listen("127.0.0.1", 0, &lfd, &a->port, &err), 0);
    pthread_create(th, NULL, connect_thread, a);
    return lfd;
}

/* A client meets a listener that does not know the token: the token never goes on the wire, the
 * client sends no proof of its own, and it says the store belongs to another job. */
static void test_token_stays_home(void **state) {
    (void)state;
    connect_arg a = {0};
    pthread_t th;
    int lfd = listener_with_client(&a, &th);
    int fd = accept(lfd, NULL, NULL);
    uint8_t p[128];
    assert_int_equal(read_frame(fd, p, sizeof p), 1); /* HELLO: a nonce, not the token */
    assert_null(memmem(p, 20, "secret", 6));
    uint8_t challenge[12 + 4 + 16 + 4 + 32] = {0};
    frame_header(challenge, 106, 56);
    challenge[12] = 16;
    challenge[12 + 4 + 16] = 32; /* a zero nonce and a zero proof: not the token's */
    assert_int_equal(send(fd, challenge, sizeof challenge, 0), (ssize_t)sizeof challenge);
    pthread_join(th, NULL);
    assert_false(a.ok);
    assert_non_null(strstr(a.err.msg, "wrong job token: this store belongs to another job"));
    assert_int_equal(recv(fd, p, sizeof p, 0), 0); /* closed, no AUTH sent */
    close(fd);
    close(lfd);
}

/* Accepts one connection on lfd, reads its HELLO and resets it (a store being stopped with the
 * request unanswered). */
static void reset_one(int lfd) {
    int fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    uint8_t p[128];
    assert_int_equal(read_frame(fd, p, sizeof p), 1);
    struct linger hard = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    close(fd);
}

/* Two jobs given one port: this job's client met the other job's store as it stopped, which reset
 * the connection under the handshake. The client connects again, and meets this job's store,
 * which took the port next. */
static void test_store_stopping_under_handshake(void **state) {
    (void)state;
    connect_arg a = {0};
    pthread_t th;
    int lfd = listener_with_client(&a, &th);
    reset_one(lfd);
    close(lfd);
    cddp_error err = {0};
    cddp_store_server *mine =
        cddp_store_server_start("127.0.0.1", a.port, "secret-token-value", &err);
    assert_non_null(mine);
    pthread_join(th, NULL);
    assert_true(a.ok);
    cddp_store_server_stop(mine);
}

typedef struct resetter_arg {
    int lfd, resets;
    _Atomic bool stop;
} resetter_arg;

static void *resetter(void *p) {
    resetter_arg *a = p;
    while (!a->stop) {
        struct pollfd pf = {a->lfd, POLLIN, 0};
        if (poll(&pf, 1, 50) == 1) reset_one(a->lfd), a->resets++;
    }
    return NULL;
}

/* A program on the port that resets every connection: the client gives up within its deadline
 * and says what it met, how often, and what to check. */
static void test_port_that_resets(void **state) {
    (void)state;
    resetter_arg r = {-1, 0, false};
    int lport = 0;
    cddp_error err = {0};
    assert_int_equal(cddp_net_listen("127.0.0.1", 0, &r.lfd, &lport, &err), 0);
    pthread_t th;
    pthread_create(&th, NULL, resetter, &r);
    cddp_store_options o = {"127.0.0.1", lport, "t", 1.5, NULL};
    double t0 = cddp_now_s();
    assert_null(cddp_store_connect(&o, &err));
    double took = cddp_now_s() - t0;
    r.stop = true;
    pthread_join(th, NULL);
    close(r.lfd);
    assert_true(took >= 1.0 && took < 3.0);
    assert_true(r.resets >= 3);
    assert_int_equal(err.code, CDDP_EIO);
    char want[96];
    snprintf(want, sizeof want, "store at 127.0.0.1:%d: the connection was closed before", lport);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "(recv failed: Connection reset by peer)"));
    assert_non_null(strstr(err.msg, "check --master_addr and --master_port"));
}

static void test_wrong_token(void **state) {
    (void)state;
    cddp_error err = {0};
    cddp_store_options o = {"127.0.0.1", port, "guess", 2.0, NULL};
    assert_null(cddp_store_connect(&o, &err));
    assert_non_null(strstr(err.msg, "wrong job token"));
    o.token = NULL;
    assert_null(cddp_store_connect(&o, &err));
    assert_non_null(strstr(err.msg, "wrong job token"));
}

static void test_user_errors(void **state) {
    (void)state;
    cddp_error err = {0};
    /* The port is taken. */
    assert_null(cddp_store_server_start("127.0.0.1", port, "t", &err));
    char want[128];
    snprintf(want, sizeof want,
             "127.0.0.1:%d is already in use — another job? choose "
             "--master_port or --standalone",
             port);
    assert_string_equal(err.msg, want);
    /* Nobody listens: retried until the deadline, then named. */
    cddp_store_server *tmp = cddp_store_server_start("127.0.0.1", 0, "t", &err);
    int dead_port = cddp_store_server_port(tmp);
    cddp_store_server_stop(tmp);
    cddp_store_options o = {"127.0.0.1", dead_port, "t", 0.5, NULL};
    double t0 = cddp_now_s();
    assert_null(cddp_store_connect(&o, &err));
    assert_true(cddp_now_s() - t0 >= 0.4);
    assert_int_equal(err.code, CDDP_ETIMEDOUT);
    snprintf(want, sizeof want, "cannot reach 127.0.0.1:%d", dead_port);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "--master_addr and --master_port"));
    /* A name that does not resolve. */
    o.host = "no-such-host.invalid";
    assert_null(cddp_store_connect(&o, &err));
    assert_non_null(strstr(err.msg, "cannot resolve 'no-such-host.invalid'"));
    /* An address that is not this machine's. */
    assert_null(cddp_store_server_start("192.0.2.1", 0, "t", &err));
    assert_non_null(strstr(err.msg, "cannot listen on 192.0.2.1:0"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proof_is_hmac_sha256),
        cmocka_unit_test(test_operations),
        cmocka_unit_test(test_waits),
        cmocka_unit_test(test_will),
        cmocka_unit_test(test_sixteen_clients),
        cmocka_unit_test(test_hostile_frames),
        cmocka_unit_test(test_wrong_token),
        cmocka_unit_test(test_user_errors),
        cmocka_unit_test(test_strangers),
        cmocka_unit_test(test_no_descriptors),
        cmocka_unit_test(test_proof_cannot_be_replayed),
        cmocka_unit_test(test_token_stays_home),
        cmocka_unit_test(test_store_stopping_under_handshake),
        cmocka_unit_test(test_port_that_resets),
        cmocka_unit_test(test_key_with_nul),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
