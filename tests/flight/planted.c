/* planted.c: a data-parallel MLP with a fault planted on one rank, for the flight recorder's and
 * straggler attribution's tests (flight_test.sh), started by cddprun.
 *
 *   planted FAULT RANK STEPS [MS]
 *
 *   none       every rank alike
 *   backward   rank RANK sleeps MS ms inside backward (in the first layer's gradient hook) on
 *              one step of three
 *   data       rank RANK sleeps MS ms before each forward (a slow data loader)
 *   optimizer  rank RANK sleeps MS ms inside each optimizer step
 *   skip       rank RANK skips the loss's allreduce at step 5: it calls the next step's
 *              collectives where the others call that one
 *   hang       rank RANK sleeps for ever in step 5's forward
 *   stop       rank RANK stops itself (SIGSTOP) in step 5's forward
 *
 * Each step: forward and backward of a batch of 32 under DDP, an optimizer step of plain SGD
 * between CDDP_EVENT_OPTIM_BEGIN and _END, and the mean loss over the ranks (one allreduce).
 * Rank 0 prints "compared at S: straggler R" for each of DDP's comparisons (R -1: none) and
 * "done" at the end.
 */
#include <cddp/cddp.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { B = 32, D = 64, H = 128, O = 10 };

static int ms;
static cddp_ready_hook ddp_hook;
static void *ddp_user;
static bool slow_now;

static void sleep_ms(int n) {
    struct timespec t = {n / 1000, (long)(n % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {}
}

/* The first layer's weight is the last gradient of backward: a sleep here is inside it. */
static void slow_hook(void *user, cddp_tensor *p) {
    if (slow_now) sleep_ms(ms);
    ddp_hook(user, p);
}

static void die(const char *what, const cddp_error *err) {
    fprintf(stderr, "planted: %s: %s\n", what, err ? cddp_error_msg(err) : "");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: planted none|backward|data|optimizer|skip|hang|stop RANK STEPS "
                        "[MS]\n");
        return 2;
    }
    const char *fault = argv[1];
    int who = atoi(argv[2]), steps = atoi(argv[3]);
    ms = argc > 4 ? atoi(argv[4]) : 20;
    cddp_error err = {0};
    cddp_comm *group = cddp_comm_create(NULL, &err);
    if (!group) die("group", &err);
    int rank = cddp_comm_rank(group);
    bool me = rank == who;
    cddp_model *m = cddp_model_create();
    if (cddp_model_add(m, "fc1", cddp_nn_linear(D, H)) ||
        cddp_model_add(m, "relu", cddp_nn_relu()) ||
        cddp_model_add(m, "fc2", cddp_nn_linear(H, H)) ||
        cddp_model_add(m, "relu2", cddp_nn_relu()) ||
        cddp_model_add(m, "fc3", cddp_nn_linear(H, O)) || cddp_model_build(m, 1))
        die("model", NULL);
    cddp_ddp *ddp = cddp_ddp_wrap(m, group, NULL, &err);
    if (!ddp) die("wrap", &err);
    cddp_tensor *w1 = cddp_model_find(m, "fc1.weight");
    if (me && !strcmp(fault, "backward")) {
        ddp_hook = w1->own.ready_hook;
        ddp_user = w1->own.ready_user;
        cddp_tensor_set_ready_hook(w1, slow_hook, ddp_user);
    }
    cddp_ctx *ctx = cddp_ctx_create(NULL);
    float x[B * D];
    int64_t y[B];
    cddp_rng r;
    cddp_rng_seed(&r, (uint64_t)rank + 7);
    int64_t compared = 0;
    for (int s = 1; s <= steps; s++) {
        if (me && !strcmp(fault, "data")) sleep_ms(ms);
        for (int i = 0; i < B * D; i++) x[i] = cddp_rng_uniform(&r) * 2 - 1;
        for (int i = 0; i < B; i++) y[i] = (int64_t)(cddp_rng_next(&r) % O);
        cddp_ctx_reset(ctx);
        cddp_tensor *xt = cddp_from_data(ctx, CDDP_F32, 2, (int64_t[]){B, D}, x);
        cddp_tensor *yt = cddp_from_data(ctx, CDDP_I64, 1, (int64_t[]){B}, y);
        cddp_tensor *out = cddp_model_forward(m, ctx, xt);
        if (me && s == 5 && !strcmp(fault, "hang"))
            for (;;) sleep_ms(1000);
        if (me && s == 5 && !strcmp(fault, "stop")) raise(SIGSTOP);
        cddp_tensor *loss = cddp_cross_entropy(ctx, out, yt, CDDP_REDUCE_MEAN);
        slow_now = s % 3 == 0;
        cddp_model_zero_grad(m);
        if (cddp_backward(ctx, loss) != CDDP_OK) die("backward", NULL);
        cddp_model_notify(m, CDDP_EVENT_OPTIM_BEGIN);
        if (me && !strcmp(fault, "optimizer")) sleep_ms(ms);
        float *p = cddp_model_data(m);
        const float *g = cddp_model_grad(m);
        for (size_t i = 0, n = cddp_model_numel(m); i < n; i++) p[i] -= 0.01f * g[i];
        cddp_model_notify(m, CDDP_EVENT_OPTIM_END);
        double l = cddp_get(loss, 0);
        if (!(me && s == 5 && !strcmp(fault, "skip")) &&
            cddp_comm_allreduce(group, &l, &l, 1, CDDP_COMM_F64, CDDP_COMM_MEAN, -1, &err))
            die("the loss's allreduce", &err);
        cddp_ddp_stats st = cddp_ddp_stats_get(ddp);
        if (rank == 0 && st.compared_at != compared) {
            compared = st.compared_at;
            printf("compared at %lld: straggler %d (slowest %d, %+.0f %%)\n", (long long)compared,
                   st.straggler, st.slowest, st.slowest_pct);
        }
    }
    if (rank == 0) printf("done\n");
    cddp_ctx_destroy(ctx);
    cddp_ddp_destroy(ddp);
    cddp_model_destroy(m);
    cddp_comm_destroy(group);
    return 0;
}
