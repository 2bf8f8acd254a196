/* test_mesh.c: the TCP mesh between ranks proves the job token both ways. A process that found a
 * rank's port, but not the token, cannot take another rank's place: two ranks in threads of this
 * process, and a stranger between them that claims to be rank 1; nor can strangers that say
 * nothing hold the mesh up. */
#include "helpers.h"

#include <cddp/net.h>
#include <cddp/store.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

static int port;
static const char *const token = "mesh-secret";

typedef struct rank_arg {
    int rank, rc;
    float sum;
    char msg[512];
} rank_arg;

static void *run_rank(void *p) {
    rank_arg *a = p;
    cddp_error err = {0};
    cddp_comm_options o = {a->rank, 2, "127.0.0.1", port, token, 20};
    cddp_comm *c = cddp_comm_create(&o, &err);
    if (c) {
        float x = (float)(a->rank + 1);
        a->rc = cddp_comm_allreduce(c, &x, &x, 1, CDDP_COMM_F32, CDDP_COMM_SUM, -1, &err);
        a->sum = x;
    } else {
        a->rc = err.code;
    }
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    cddp_comm_destroy(c);
    return NULL;
}

/* What a rank's connection says first (tcp.c's hello): magic, rank, channel, pid, a nonce. */
typedef struct hello {
    uint64_t magic;
    int32_t rank, channel, pid, pad;
    uint8_t nonce[CDDP_NET_NONCE];
} hello;

/* Starts rank 0 in thread t0 on the TCP transport and returns where its mesh listens: the test,
 * with the token, stands in for rank 1's host entry so that rank 0 goes on to the mesh alone. */
static struct sockaddr_in start_rank0(pthread_t *t0, rank_arg *r0) {
    setenv("CDDP_TRANSPORT", "tcp", 1);
    setenv("CDDP_HOST_ID", "mesh-test", 1);
    int fd = -1;
    cddp_error err = {0};
    assert_int_equal(cddp_net_listen("127.0.0.1", 0, &fd, &port, &err), 0);
    close(fd);
    pthread_create(t0, NULL, run_rank, r0);
    cddp_store_options so = {"127.0.0.1", port, token, 10, NULL};
    cddp_store *st = cddp_store_connect(&so, &err);
    if (!st) fail_msg("%s", err.msg);
    assert_int_equal(cddp_store_set_str(st, "comm/host/1", "mesh-test", &err), 0);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(cddp_store_get(st, "comm/tcp/0", 10, &v, &n, &err), 0);
    char host[64];
    int mesh_port = 0;
    assert_int_equal(sscanf(v, "%63s %d", host, &mesh_port), 2);
    cddp_free(v);
    cddp_store_close(st);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)mesh_port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    return a;
}

static void test_stranger_cannot_pose_as_a_rank(void **state) {
    (void)state;
    pthread_t t0, t1;
    rank_arg r0 = {0, -1, 0, ""}, r1 = {1, -1, 0, ""};
    struct sockaddr_in a = start_rank0(&t0, &r0);
    /* The stranger: says it is rank 1 on the data channel, and cannot prove the token. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
    hello h = {0x43444450544350ull, 1, 0, (int32_t)getpid(), 0, {7}};
    assert_int_equal(send(s, &h, sizeof h, 0), (ssize_t)sizeof h);
    struct {
        hello h;
        uint8_t proof[CDDP_NET_PROOF];
    } answer;
    assert_int_equal(recv(s, &answer, sizeof answer, MSG_WAITALL), (ssize_t)sizeof answer);
    assert_int_equal(answer.h.rank, 0);
    uint8_t guess[CDDP_NET_PROOF];
    memset(guess, 0x42, sizeof guess);
    assert_int_equal(send(s, guess, sizeof guess, 0), (ssize_t)sizeof guess);
    struct timeval tv = {5, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[16];
    assert_int_equal(recv(s, b, sizeof b, 0), 0); /* rank 0 closed it */
    close(s);
    /* The real rank 1 takes its place, and the group works. */
    pthread_create(&t1, NULL, run_rank, &r1);
    pthread_join(t1, NULL);
    pthread_join(t0, NULL);
    if (r0.rc || r1.rc) fail_msg("rank 0: %s; rank 1: %s", r0.msg, r1.msg);
    assert_true(r0.sum == 3.0f && r1.sum == 3.0f);
    unsetenv("CDDP_TRANSPORT");
    unsetenv("CDDP_HOST_ID");
}

/* Strangers that connect to rank 0's mesh port and say nothing (60) or half a hello (10) do not
 * hold up the mesh: rank 0 runs handshakes side by side, each with 5 s to finish. One at a time,
 * they would take 350 s, past the group's 20 s. */
static void test_silent_strangers_delay_no_one(void **state) {
    (void)state;
    pthread_t t0, t1;
    rank_arg r0 = {0, -1, 0, ""}, r1 = {1, -1, 0, ""};
    struct sockaddr_in a = start_rank0(&t0, &r0);
    enum { SILENT = 60, HALF = 10 };
    int strangers[SILENT + HALF];
    hello h = {0x43444450544350ull, 1, 0, (int32_t)getpid(), 0, {7}};
    for (int i = 0; i < SILENT + HALF; i++) {
        strangers[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(strangers[i], (struct sockaddr *)&a, sizeof a), 0);
        if (i >= SILENT) assert_int_equal(send(strangers[i], &h, sizeof h / 2, 0), sizeof h / 2);
    }
    double start = cddp_now_s();
    pthread_create(&t1, NULL, run_rank, &r1);
    pthread_join(t1, NULL);
    pthread_join(t0, NULL);
    double took = cddp_now_s() - start;
    for (int i = 0; i < SILENT + HALF; i++) close(strangers[i]);
    if (r0.rc || r1.rc) fail_msg("rank 0: %s; rank 1: %s", r0.msg, r1.msg);
    assert_true(r0.sum == 3.0f && r1.sum == 3.0f);
    print_message("the group formed %.2f s after rank 1 started, past %d strangers\n", took,
                  SILENT + HALF);
    unsetenv("CDDP_TRANSPORT");
    unsetenv("CDDP_HOST_ID");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stranger_cannot_pose_as_a_rank),
        cmocka_unit_test(test_silent_strangers_delay_no_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
