/* comm_check.c: collectives checked across real processes, started by cddprun.
 *
 *   cddprun --nproc_per_node W comm_check matrix      every op x dtype x count, exact results
 *   cddprun --nproc_per_node W comm_check kill [async] the last rank SIGKILLs itself mid-stream
 *                                                     (async: with 8 queued collectives in flight)
 *   cddprun --nproc_per_node W comm_check abort       rank 1 aborts the group from a second thread
 *   cddprun --nproc_per_node W comm_check stop        rank 1 is SIGSTOPped; the others time out
 *   cddprun --nproc_per_node W comm_check mismatch K  rank 1 passes another count/op/dtype/root
 *   cddprun --nproc_per_node W comm_check deadline    rank 0 alone in a barrier with 0.5 s
 *   cddprun --nproc_per_node W comm_check loop S [halt]  allreduces for S seconds (a test stops
 *                                                     or kills a rank meanwhile; SIGUSR2 makes a
 *                                                     rank exit with code 3); halt: a rank whose
 *                                                     call fails stops itself (SIGSTOP) on its
 *                                                     way out, as a leak checker stops a
 *                                                     process's threads at its exit
 * Prints "ok: ..." and exits 0 when every check holds on this rank; exits 1 with the reason
 * otherwise. In the failure modes a survivor exits 0 when it got the right error in time.
 */
#include <cddp/cddp.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, world;
static const char *backend = "?";

static void leave_3(int sig) {
    (void)sig;
    _exit(3);
}

static void die(const char *fmt, const char *a, double b) {
    fprintf(stderr, "comm_check rank %d: ", rank);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(1);
}

/* Element i of a buffer of dtype, as double, and back (the test's own conversions). */
static double get(const void *b, cddp_comm_dtype dt, int64_t i) {
    switch (dt) {
    case CDDP_COMM_F32:
        return ((const float *)b)[i];
    case CDDP_COMM_F64:
        return ((const double *)b)[i];
    case CDDP_COMM_I32:
        return ((const int32_t *)b)[i];
    case CDDP_COMM_I64:
        return (double)((const int64_t *)b)[i];
    case CDDP_COMM_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)b)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CDDP_COMM_F16:
        return (double)((const _Float16 *)b)[i];
    }
    return NAN;
}

/* Small integers only: exact in every dtype. */
static void set(void *b, cddp_comm_dtype dt, int64_t i, int v) {
    switch (dt) {
    case CDDP_COMM_F32:
        ((float *)b)[i] = (float)v;
        break;
    case CDDP_COMM_F64:
        ((double *)b)[i] = v;
        break;
    case CDDP_COMM_I32:
        ((int32_t *)b)[i] = v;
        break;
    case CDDP_COMM_I64:
        ((int64_t *)b)[i] = v;
        break;
    case CDDP_COMM_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16); /* exact for small integers */
        break;
    }
    case CDDP_COMM_F16:
        ((_Float16 *)b)[i] = (_Float16)v;
        break;
    }
}

/* Rank r contributes r + 1 + (i mod 3); for products, r + 1 at i mod 3 == 0 and 1 elsewhere. */
static int input(cddp_comm_op op, int r, int64_t i) {
    if (op == CDDP_COMM_PRODUCT) return i % 3 == 0 ? r + 1 : 1;
    return r + 1 + (int)(i % 3);
}

static double expected(cddp_comm_op op, cddp_comm_dtype dt, int64_t i) {
    int k = (int)(i % 3);
    double sum = world * (world + 1) / 2.0 + world * k, prod = 1;
    for (int r = 1; r <= world; r++) prod *= r;
    switch (op) {
    case CDDP_COMM_SUM:
        return sum;
    case CDDP_COMM_MEAN:
        if (dt == CDDP_COMM_I32 || dt == CDDP_COMM_I64) return (double)((int64_t)sum / world);
        return sum / world;
    case CDDP_COMM_MIN:
        return 1 + k;
    case CDDP_COMM_MAX:
        return world + k;
    case CDDP_COMM_PRODUCT:
        return k == 0 ? prod : 1;
    }
    return NAN;
}

/* b[0..n) = input(op, r, i), and the first i where b differs from expected(op, dt, first + i),
 * or -1 (its value in *got): both repeat every 3 elements, so each of the 3 values is made once,
 * not per element (the matrix checks millions of elements per rank). */
static void fill(void *b, cddp_comm_dtype dt, int64_t n, cddp_comm_op op, int r) {
    int v[3], m = 0;
    for (int k = 0; k < 3; k++) v[k] = input(op, r, k);
    for (int64_t i = 0; i < n; i++, m = m == 2 ? 0 : m + 1) set(b, dt, i, v[m]);
}
static int64_t first_wrong(const void *b, cddp_comm_dtype dt, int64_t n, cddp_comm_op op,
                           int64_t first, double *got) {
    double want[3];
    int m = (int)(first % 3);
    for (int k = 0; k < 3; k++) want[k] = expected(op, dt, k);
    for (int64_t i = 0; i < n; i++, m = m == 2 ? 0 : m + 1)
        if ((*got = get(b, dt, i)) != want[m]) return i;
    return -1;
}

/* Whether dtype holds the integer v exactly (and without overflow). */
static bool exact(cddp_comm_dtype dt, double v) {
    switch (dt) {
    case CDDP_COMM_F32:
        return (double)(float)v == v;
    case CDDP_COMM_I32:
        return v <= INT32_MAX;
    case CDDP_COMM_BF16:  /* 8 significant bits */
    case CDDP_COMM_F16: { /* 11 significant bits, at most 65504 */
        int bits = dt == CDDP_COMM_F16 ? 11 : 8;
        if (dt == CDDP_COMM_F16 && v > 65504) return false;
        int drop = ilogb(v) - (bits - 1); /* low bits the format cannot hold */
        return drop <= 0 || fmod(v, ldexp(1.0, drop)) == 0;
    }
    default:
        return v <= 9e18;
    }
}

/* allreduce, or reduce_scatter (scatter), over every dtype x op x count, in place and out of
 * place; returns the number of checks. reduce_scatter: block q of rank r's input holds
 * input(op, r, q * n + j), so this rank's part of the result is expected(op, dt, rank * n + j). */
static int reductions(cddp_comm *c, uint8_t *in, uint8_t *out, size_t cap, bool scatter) {
    static const int64_t allreduce_counts[] = {0, 1, 7, 1000, (1 << 20) + 3},
                         scatter_counts[] = {0, 1, 7, 1000, 131075};
    const int64_t *counts = scatter ? scatter_counts : allreduce_counts;
    const char *name = scatter ? "reduce_scatter" : "allreduce";
    cddp_error err = {0};
    int checks = 0;
    for (int dt = 0; dt <= CDDP_COMM_F16; dt++) {
        /* Every dtype up to 4 ranks (the shm, tcp, mpi and ring matrices at 2, 3 and 4); beyond,
         * where the cost is the group's size (5 to 16 ranks share the suite's 2 cores), the
         * algorithms at scale with one float and one integer type. */
        if (world > 4 && dt != CDDP_COMM_F32 && dt != CDDP_COMM_I64) continue;
        for (int op = 0; op <= CDDP_COMM_PRODUCT; op++) {
            /* The product of ranks 1..world is checked where the dtype holds it exactly. */
            if (op == CDDP_COMM_PRODUCT && !exact(dt, expected(op, dt, 0))) continue;
            for (size_t ci = 0; ci < 5; ci++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    int64_t n = counts[ci], total = scatter ? n * world : n;
                    int64_t first = scatter ? rank * n : 0;
                    if ((size_t)total * 8 > cap) continue;
                    /* 16 ranks on 2 cores: the largest count in float only (the integer's at
                     * 5 and 8 ranks) */
                    if (world > 8 && ci == 4 && dt != CDDP_COMM_F32) continue;
                    fill(in, dt, total, op, rank);
                    memset(out, 0xAB, cap);
                    size_t es = cddp_comm_dtype_size(dt);
                    void *dst = inplace ? (void *)(in + (size_t)first * es) : out;
                    int rc = scatter ? cddp_comm_reduce_scatter(c, in, dst, n, dt, op, -1, &err)
                                     : cddp_comm_allreduce(c, in, dst, n, dt, op, -1, &err);
                    if (rc) {
                        char why[600];
                        snprintf(why, sizeof why, "%s failed: %s", name, err.msg);
                        die("%s%.0f", why, 0);
                    }
                    double got;
                    int64_t j = first_wrong(dst, dt, n, op, first, &got);
                    if (j >= 0) {
                        char what[160];
                        snprintf(what, sizeof what,
                                 "%s %s %s count %lld %s: element %lld is %g, want", name,
                                 cddp_comm_op_name(op), cddp_comm_dtype_name(dt), (long long)n,
                                 inplace ? "in place" : "out of place", (long long)j, got);
                        die("%s %g", what, expected(op, dt, first + j));
                    }
                    checks++;
                }
        }
    }
    return checks;
}

/* The same reductions in memory from cddp_comm_alloc: in place, the shm transport reads every
 * rank's block where it is. Then buffers at an offset (the same on every rank: still in place;
 * different offsets, or plain memory on one rank: the staged path), and a second allocation
 * after freeing the first. */
static int registered(cddp_comm *c, uint8_t *out, size_t cap) {
    cddp_error err = {0};
    uint8_t *mem = cddp_comm_alloc(c, cap + 4096, &err), *plain = malloc(cap + 4096);
    if (!mem) die("cddp_comm_alloc failed: %s%.0f", err.msg, 0);
    int checks = reductions(c, mem, out, cap, false);
    static const size_t offsets[][2] = {{8, 8}, {0, 4096}, {64, 0}};
    for (int k = 0; k < 3; k++) {
        bool mine_plain = k == 2 && rank == world - 1;
        uint8_t *base = mine_plain ? plain : mem;
        size_t at = offsets[k][rank == world - 1];
        int64_t n = 100003;
        double got;
        fill(base + at, CDDP_COMM_F32, n, CDDP_COMM_SUM, rank);
        if (cddp_comm_allreduce(c, base + at, base + at, n, CDDP_COMM_F32, CDDP_COMM_SUM, -1, &err))
            die("allreduce at an offset failed: %s%.0f", err.msg, 0);
        if (first_wrong(base + at, CDDP_COMM_F32, n, CDDP_COMM_SUM, 0, &got) >= 0)
            die("allreduce at offset case %s%.0f wrong", "", k);
        checks++;
    }
    /* Back to back, sizes about a piece (64 KiB, which the ranks take as they come): every call
     * whole, its input overwritten by the sum everywhere (a piece missed keeps its input). */
    static const int64_t sizes[] = {1, 16383, 16384, 16385, 100003};
    for (int it = 0; it < 60; it++) {
        int64_t n = sizes[it % 5];
        float *f = (float *)mem;
        double got;
        fill(f, CDDP_COMM_F32, n, CDDP_COMM_SUM, rank);
        if (cddp_comm_allreduce(c, f, f, n, CDDP_COMM_F32, CDDP_COMM_SUM, -1, &err))
            die("back-to-back allreduce failed: %s%.0f", err.msg, 0);
        if (first_wrong(f, CDDP_COMM_F32, n, CDDP_COMM_SUM, 0, &got) >= 0)
            die("back-to-back allreduce %s%.0f wrong", "", (double)it);
    }
    checks++;
    cddp_comm_free(c, mem);
    if (!(mem = cddp_comm_alloc(c, 1 << 20, &err))) die("second alloc failed: %s%.0f", err.msg, 0);
    for (int64_t i = 0; i < 1000; i++) ((double *)mem)[i] = (double)input(3, rank, i);
    if (cddp_comm_allreduce(c, mem, mem, 1000, CDDP_COMM_F64, CDDP_COMM_MAX, -1, &err))
        die("allreduce in a second allocation failed: %s%.0f", err.msg, 0);
    for (int64_t i = 0; i < 1000; i++)
        if (((double *)mem)[i] != expected(CDDP_COMM_MAX, CDDP_COMM_F64, i))
            die("allreduce in a second allocation: %s element %.0f wrong", "", (double)i);
    cddp_comm_free(c, mem);
    free(plain);
    checks++;
    /* More than /dev/shm holds: every rank fails with a message that says so, and the group
     * stays usable. */
    if (!strcmp(cddp_comm_backend(c), "shm")) {
        if (cddp_comm_alloc(c, (size_t)1 << 50, &err))
            die("allocating a PiB of shared memory %s%.0f", "succeeded", 0);
        if (!strstr(err.msg, "cannot allocate") || !strstr(err.msg, "/dev/shm"))
            die("the failed allocation says '%s'%.0f", err.msg, 0);
        if (cddp_comm_barrier(c, -1, &err))
            die("the group failed with the allocation: %s%.0f", err.msg, 0);
        checks++;
    }
    return checks;
}

/* Around the ring: every rank sends to rank + 1 and receives from rank - 1 (even ranks send
 * first, so the chain unwinds), for counts of 0, 1, 1000 and several chunks, two messages in a
 * row each time (they arrive in order). Then the errors that need no peer. */
static int point_to_point(cddp_comm *c, uint8_t *in, uint8_t *out, size_t cap) {
    cddp_error err = {0};
    static const int64_t counts[] = {0, 1, 1000, (1 << 20) + 3};
    int next = (rank + 1) % world, prev = (rank + world - 1) % world, checks = 0;
    for (size_t ci = 0; ci < 4 && world > 1; ci++) {
        int64_t n = counts[ci];
        if ((size_t)n * 8 > cap) continue;
        for (int m = 0; m < 2; m++) {
            for (int64_t i = 0; i < n; i++) ((int64_t *)in)[i] = rank * 1000003 + i * 7 + m;
            memset(out, 0xAB, (size_t)n * 8);
            for (int turn = 0; turn < 2; turn++)
                if ((turn == 0) == (rank % 2 == 0)) {
                    if (cddp_comm_send(c, in, n, CDDP_COMM_I64, next, -1, &err))
                        die("send failed: %s%.0f", err.msg, (double)n);
                } else if (cddp_comm_recv(c, out, n, CDDP_COMM_I64, prev, -1, &err)) {
                    die("recv failed: %s%.0f", err.msg, (double)n);
                }
            for (int64_t i = 0; i < n; i++)
                if (((int64_t *)out)[i] != prev * 1000003 + i * 7 + m)
                    die("recv of %s: element %.0f wrong", "a message", (double)i);
            checks++;
        }
    }
    if (cddp_comm_send(c, in, 1, CDDP_COMM_I64, rank, -1, &err) != CDDP_EINVAL ||
        !strstr(err.msg, "itself"))
        die("sending to oneself: %s%.0f", err.msg, 0);
    if (cddp_comm_recv(c, out, 1, CDDP_COMM_I64, world, -1, &err) != CDDP_EINVAL ||
        !strstr(err.msg, "the group has ranks"))
        die("receiving from a rank that is not there: %s%.0f", err.msg, 0);
    if (cddp_comm_barrier(c, -1, &err))
        die("the group failed with bad arguments: %s%.0f", err.msg, 0);
    return checks + 1;
}

static int matrix(cddp_comm *c) {
    cddp_error err = {0};
    int checks = 0;
    /* Room for the largest allreduce, and for the allgather of world x 300001 floats below. */
    size_t cap = ((1 << 20) + 3) * 8;
    if ((size_t)world * 300001 * 4 > cap) cap = (size_t)world * 300001 * 4;
    uint8_t *in = malloc(cap), *out = malloc(cap);
    checks += reductions(c, in, out, cap, false);
    /* Broadcast from every root, allgather, barrier. */
    for (int root = 0; root < world; root++) {
        int64_t n = 1000 + root;
        for (int64_t i = 0; i < n; i++) ((int64_t *)in)[i] = rank == root ? 7 * i + root : -1;
        if (cddp_comm_broadcast(c, in, n, CDDP_COMM_I64, root, -1, &err))
            die("broadcast failed: %s%.0f", err.msg, 0);
        for (int64_t i = 0; i < n; i++)
            if (((int64_t *)in)[i] != 7 * i + root)
                die("broadcast from %s: element %.0f wrong", "root", (double)i);
        checks++;
    }
    int64_t n = 300001;
    for (int64_t i = 0; i < n; i++) ((float *)in)[i] = (float)(rank * 1000 + i % 1000);
    if (cddp_comm_allgather(c, in, out, n, CDDP_COMM_F32, -1, &err))
        die("allgather failed: %s%.0f", err.msg, 0);
    for (int r = 0; r < world; r++)
        for (int64_t i = 0; i < n; i++)
            if (((float *)out)[r * n + i] != (float)(r * 1000 + i % 1000))
                die("allgather: %s element %.0f wrong", "an", (double)(r * n + i));
    checks++;
    checks += reductions(c, in, out, cap, true);
    /* gather to and scatter from every root, with a count that does not divide evenly into
     * rounds. */
    for (int root = 0; root < world; root++) {
        int64_t m = 70001 + root;
        for (int64_t i = 0; i < m; i++) ((int32_t *)in)[i] = (int32_t)(rank * 100000 + i);
        memset(out, 0xAB, cap);
        if (cddp_comm_gather(c, in, rank == root ? out : NULL, m, CDDP_COMM_I32, root, -1, &err))
            die("gather failed: %s%.0f", err.msg, 0);
        if (rank == root)
            for (int r = 0; r < world; r++)
                for (int64_t i = 0; i < m; i++)
                    if (((int32_t *)out)[r * m + i] != (int32_t)(r * 100000 + i))
                        die("gather to %s: element %.0f wrong", "root", (double)(r * m + i));
        if (rank == root)
            for (int64_t i = 0; i < m * world; i++) ((int32_t *)in)[i] = (int32_t)(3 * i + root);
        memset(out, 0xAB, cap);
        if (cddp_comm_scatter(c, rank == root ? in : NULL, out, m, CDDP_COMM_I32, root, -1, &err))
            die("scatter failed: %s%.0f", err.msg, 0);
        for (int64_t i = 0; i < m; i++)
            if (((int32_t *)out)[i] != (int32_t)(3 * (rank * m + i) + root))
                die("scatter from %s: element %.0f wrong", "root", (double)i);
        checks += 2;
    }
    /* 1000 queued allreduces in flight at once, then each checked; a blocking barrier in the
     * middle of the stream runs after the first half, as issued. */
    enum { INFLIGHT = 1000 };
    int64_t(*bufs)[4] = malloc(sizeof *bufs * INFLIGHT);
    cddp_comm_work **works = malloc(sizeof *works * INFLIGHT);
    for (int k = 0; k < INFLIGHT; k++) {
        for (int j = 0; j < 4; j++) bufs[k][j] = (int64_t)k * 10 + j + rank;
        works[k] = cddp_comm_allreduce_async(c, bufs[k], bufs[k], 4, CDDP_COMM_I64,
                                             k % 2 ? CDDP_COMM_MAX : CDDP_COMM_SUM, -1, &err);
        if (!works[k]) die("queueing allreduce failed: %s%.0f", err.msg, k);
        if (k == INFLIGHT / 2 && cddp_comm_barrier(c, -1, &err))
            die("barrier among queued work: %s%.0f", err.msg, 0);
    }
    for (int k = 0; k < INFLIGHT; k++) {
        if (cddp_comm_wait(works[k], -1, &err)) die("queued allreduce failed: %s%.0f", err.msg, k);
        for (int j = 0; j < 4; j++) {
            int64_t base = (int64_t)k * 10 + j;
            int64_t want = k % 2 ? base + world - 1 : base * world + world * (world - 1) / 2;
            if (bufs[k][j] != want) die("queued allreduce %s%.0f wrong", "", k);
        }
    }
    free(bufs);
    free(works);
    checks++;
    /* Many small collectives back to back, each checked (sequence numbers, slot reuse). */
    for (int k = 0; k < 1000; k++) {
        int64_t v[3] = {k, rank, 1};
        if (cddp_comm_allreduce(c, v, v, 3, CDDP_COMM_I64, CDDP_COMM_SUM, -1, &err))
            die("allreduce #%s%.0f failed", err.msg, k);
        if (v[0] != (int64_t)k * world || v[1] != world * (world - 1) / 2 || v[2] != world)
            die("%s small allreduce %.0f wrong", "", k);
        if (k % 100 == 0 && cddp_comm_barrier(c, -1, &err)) die("barrier: %s%.0f", err.msg, 0);
    }
    checks++;
    checks += registered(c, out, cap);
    checks += point_to_point(c, in, out, cap);
    printf("ok: rank %d of %d (%s backend): %d collective checks exact; %d ranks on this host\n",
           rank, world, cddp_comm_backend(c), checks, cddp_comm_local_size(c));
    free(in);
    free(out);
    return 0;
}

/* The survivors' side of the failure modes: the collective must fail with text, in time. */
static int expect_failure(int rc, const cddp_error *err, const char *text, double t0, double min_s,
                          double max_s) {
    double took = cddp_now_s() - t0;
    if (rc == CDDP_OK) die("the collective %ssucceeded; expected a failure%.0f", "", 0);
    if (!strstr(err->msg, text))
        die("the error '%s' lacks the expected text (%g s)", err->msg, took);
    if (took < min_s || took > max_s) die("the error came after %s%g s", "", took);
    printf("ok: rank %d (%s backend) failed as expected after %.2f s: %s\n", rank, backend, took,
           err->msg);
    fflush(stdout);
    return 0;
}

static void *abort_later(void *c) {
    usleep(300000);
    cddp_comm_abort(c, "test abort");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: comm_check matrix|launch|kill [async]|leave [exit]|abort|stop|"
                        "mismatch KIND|deadline|loop S\n");
        return 2;
    }
    const char *mode = argv[1];
    cddp_error err = {0};
    bool survivor_mode = strcmp(mode, "matrix") != 0;
    if (survivor_mode) signal(SIGTERM, SIG_IGN); /* outlive cddprun's stop long enough to report */
    cddp_comm *c = cddp_comm_create(NULL, &err);
    if (!c) die("cannot create the group: %s%.0f", err.msg, 0);
    rank = cddp_comm_rank(c);
    world = cddp_comm_size(c);
    backend = cddp_comm_backend(c);
    int status = 0;
    double t0;
    float buf[64] = {0};
    if (!strcmp(mode, "matrix")) {
        status = matrix(c);
    } else if (!strcmp(mode, "launch")) {
        /* What the group made of the launcher's environment: one allreduce, the layout and the
         * math libraries' threads. */
        int64_t v = rank + 1;
        if (cddp_comm_allreduce(c, &v, &v, 1, CDDP_COMM_I64, CDDP_COMM_SUM, -1, &err))
            die("allreduce: %s%.0f", err.msg, 0);
        if (v != (int64_t)world * (world + 1) / 2) die("%sallreduce gave %.0f", "", (double)v);
        const char *omp = getenv("OMP_NUM_THREADS"), *blas = getenv("OPENBLAS_NUM_THREADS");
        printf("ok: rank %d of %d (%s backend), local rank %d of %d, threads %d, "
               "OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s, cores of its own %d\n",
               rank, world, backend, cddp_comm_local_rank(c), cddp_comm_local_size(c),
               cddp_num_threads(), omp ? omp : "unset", blas ? blas : "unset",
               cddp_comm_local_cores(c));
    } else if (!strcmp(mode, "kill")) {
        /* The last rank dies at the 50th collective; the others must say so within 5 s. With
         * "async", 8 queued collectives are in flight when it dies, and every one must fail. */
        bool async = argc > 2 && !strcmp(argv[2], "async");
        enum { DEPTH = 8 };
        float bufs[DEPTH][64] = {{0}};
        cddp_comm_work *w[DEPTH] = {0};
        int rc = 0;
        t0 = 0;
        for (int k = 0; k < 100000 && rc == 0; k++) {
            if (k == 50 && rank == world - 1) raise(SIGKILL);
            if (k == 50) t0 = cddp_now_s();
            if (!async) {
                rc = cddp_comm_allreduce(c, buf, buf, 64, CDDP_COMM_F32, CDDP_COMM_SUM, 60, &err);
                continue;
            }
            int slot = k % DEPTH;
            if (w[slot]) rc = cddp_comm_wait(w[slot], -1, &err);
            w[slot] = NULL;
            if (rc == 0)
                w[slot] = cddp_comm_allreduce_async(c, bufs[slot], bufs[slot], 64, CDDP_COMM_F32,
                                                    CDDP_COMM_SUM, 60, &err);
            if (rc == 0 && !w[slot]) rc = err.code;
        }
        for (int i = 0; i < DEPTH; i++) { /* the rest fail too, with the same error */
            cddp_error e2 = {0};
            if (w[i] && cddp_comm_wait(w[i], -1, &e2) == CDDP_OK)
                die("queued work %s%.0f succeeded after the failure", "", i);
        }
        char text[64];
        snprintf(text, sizeof text, "rank %d (pid", world - 1);
        status = expect_failure(rc, &err, text, t0, 0, 5.0);
    } else if (!strcmp(mode, "leave")) {
        /* The last rank leaves at the 50th collective while the others go on: by
         * cddp_comm_destroy, then staying alive 1.5 s (the others must fail within 1 s saying it
         * left, not wait for its end), or with "exit" by ending with status 0 without it (_exit, so
         * that a sanitizer's leak check does not turn it into a failure; the others find it gone
         * and then exit 3, so that the launcher's report names the rank that finished before
         * them). Over MPI, which cannot tell, the others' calls time out at
         * their 1 s deadline instead of hanging. */
        bool destroy = !(argc > 2 && !strcmp(argv[2], "exit")), mpi = !strcmp(backend, "mpi");
        int rc = 0;
        t0 = 0;
        for (int k = 0; k < 100000 && rc == 0; k++) {
            if (k == 50 && rank == world - 1) {
                if (!destroy) _exit(0);
                cddp_comm_destroy(c);
                usleep(1500000);
                return 0;
            }
            if (k == 50) t0 = cddp_now_s();
            rc = cddp_comm_allreduce(c, buf, buf, 64, CDDP_COMM_F32, CDDP_COMM_SUM, mpi ? 1 : 60,
                                     &err);
        }
        char text[96];
        snprintf(text, sizeof text,
                 mpi       ? "timed out: not every rank reached it"
                 : destroy ? "rank %d left the group (cddp_comm_destroy) after "
                           : "rank %d (pid",
                 world - 1);
        status = mpi ? expect_failure(rc, &err, text, t0, 1.0, 2.0)
                     : expect_failure(rc, &err, text, t0, 0, destroy ? 1.0 : 5.0);
        if (!destroy && !status) status = 3;
    } else if (!strcmp(mode, "stop")) {
        if (rank == 1) {
            /* A helper wakes this rank after the others have timed out; it then just leaves. */
            pid_t me = getpid();
            if (fork() == 0) {
                sleep(3);
                kill(me, SIGCONT);
                _exit(0);
            }
            raise(SIGSTOP);
            status = 0;
        } else {
            t0 = cddp_now_s();
            int rc = cddp_comm_allreduce(c, buf, buf, 64, CDDP_COMM_F32, CDDP_COMM_SUM, 1.0, &err);
            status = expect_failure(rc, &err, "timed out waiting for rank 1", t0, 1.0, 2.0);
        }
    } else if (!strcmp(mode, "wire") && argc > 3) {
        /* One allreduce (sum) of N elements of f32 or bf16 (with "rs": a reduce_scatter of
         * world x N into N), each rank's rank + 1 at every element: every element must be
         * world (world + 1) / 2 (exact in both). The test (wire_test.sh) counts the bytes that
         * crossed. */
        bool half = !strcmp(argv[2], "bf16"), rs = argc > 4 && !strcmp(argv[4], "rs");
        int64_t n = atoll(argv[3]), in = rs ? n * world : n;
        size_t es = half ? 2 : 4;
        cddp_comm_dtype dt = half ? CDDP_COMM_BF16 : CDDP_COMM_F32;
        uint8_t *v = malloc((size_t)in * es);
        float *f = malloc((size_t)in * sizeof(float));
        for (int64_t i = 0; i < in; i++) f[i] = (float)(rank + 1);
        if (half)
            cddp_comm_from_f32(CDDP_COMM_BF16, f, v, in);
        else
            memcpy(v, f, (size_t)in * es);
        if (rs ? cddp_comm_reduce_scatter(c, v, v, n, dt, CDDP_COMM_SUM, -1, &err)
               : cddp_comm_allreduce(c, v, v, n, dt, CDDP_COMM_SUM, -1, &err))
            die("collective: %s%.0f", err.msg, 0);
        if (half)
            cddp_comm_to_f32(CDDP_COMM_BF16, v, f, n);
        else
            memcpy(f, v, (size_t)n * es);
        for (int64_t i = 0; i < n; i++)
            if (f[i] != (float)(world * (world + 1) / 2))
                die("%selement %.0f is wrong", "", (double)i);
        printf("ok: rank %d: %s allreduce of %lld elements\n", rank, argv[2], (long long)n);
        free(v);
        free(f);
    } else if (!strcmp(mode, "loop") && argc > 2) {
        /* Allreduces for SECONDS while a test stops or kills a rank: 0 when every call worked,
         * else 1 with the error. */
        double until = cddp_now_s() + atof(argv[2]);
        long calls = 0;
        signal(SIGUSR2, leave_3);
        while (cddp_now_s() < until) {
            if (cddp_comm_allreduce(c, buf, buf, 64, CDDP_COMM_F32, CDDP_COMM_SUM, -1, &err)) {
                printf("failed: rank %d after %ld calls: %s\n", rank, calls, err.msg);
                fflush(stdout);
                if (argc > 3 && !strcmp(argv[3], "halt")) raise(SIGSTOP);
                status = 1;
                break;
            }
            calls++;
            usleep(10000);
        }
        if (!status) printf("ok: rank %d: %ld allreduces\n", rank, calls);
    } else if (!strcmp(mode, "mismatch") && argc > 2) {
        const char *kind = argv[2];
        bool odd = rank == 1;
        int64_t count = odd && !strcmp(kind, "count") ? 999 : 1000;
        cddp_comm_op op = odd && !strcmp(kind, "op") ? CDDP_COMM_MAX : CDDP_COMM_SUM;
        cddp_comm_dtype dt = odd && !strcmp(kind, "dtype") ? CDDP_COMM_I32 : CDDP_COMM_F32;
        float *big = calloc(1000, sizeof(float));
        /* A few good collectives first, so the mismatch is not at the start. */
        for (int k = 0; k < 5; k++)
            if (cddp_comm_allreduce(c, big, big, 1000, CDDP_COMM_F32, CDDP_COMM_SUM, 10, &err))
                die("a good allreduce failed: %s%.0f", err.msg, 0);
        t0 = cddp_now_s();
        int rc;
        if (!strcmp(kind, "p2p")) { /* rank 0 sends float32, rank 1 expects int32 */
            rc = rank == 0 ? cddp_comm_send(c, big, 1000, CDDP_COMM_F32, 1, 10, &err)
                           : cddp_comm_recv(c, big, 1000, CDDP_COMM_I32, 0, 10, &err);
            status = expect_failure(rc, &err,
                                    rank ? "but rank 0 sends count 1000 float32"
                                         : "but rank 1 receives count 1000 int32",
                                    t0, 0, 2.0);
            if (cddp_comm_barrier(c, 1, &err) == CDDP_OK) die("the group still works%s%.0f", "", 0);
            free(big);
            goto done;
        }
        if (!strcmp(kind, "root"))
            rc = cddp_comm_broadcast(c, big, 1000, CDDP_COMM_F32, odd ? 1 : 0, 10, &err);
        else if (!strcmp(kind, "alloc"))
            rc = cddp_comm_alloc(c, odd ? 8192 : 4096, &err) ? CDDP_OK : err.code;
        else if (!strcmp(kind, "kind") && odd)
            rc = cddp_comm_broadcast(c, big, 1000, CDDP_COMM_F32, 0, 10, &err);
        else
            rc = cddp_comm_allreduce(c, big, big, count, dt, op, 10, &err);
        status = expect_failure(rc, &err, "differs between ranks", t0, 0, 2.0);
        if (status == 0 && !strstr(err.msg, "collective #6"))
            die("no sequence number in '%s'%.0f", err.msg, 0);
        /* The failure latches. */
        if (cddp_comm_barrier(c, 1, &err) == CDDP_OK) die("the group still works%s%.0f", "", 0);
        free(big);
    } else if (!strcmp(mode, "abort")) {
        /* Rank 1's second thread aborts the group while every rank's main thread is in a stream
         * of collectives: every rank's stream must fail, naming rank 1 and the reason. */
        if (rank == 1) {
            pthread_t th;
            pthread_create(&th, NULL, abort_later, c);
            pthread_detach(th);
        }
        int rc = 0;
        t0 = cddp_now_s();
        for (int k = 0; k < 10000000 && rc == 0; k++)
            rc = cddp_comm_allreduce(c, buf, buf, 64, CDDP_COMM_F32, CDDP_COMM_SUM, 60, &err);
        status = expect_failure(rc, &err,
                                rank == 1 ? "aborted on this rank: test abort"
                                          : "rank 1 aborted the group: test abort",
                                t0, 0.2, 3.0);
    } else if (!strcmp(mode, "deadline")) {
        if (rank == 0) {
            t0 = cddp_now_s();
            int rc = cddp_comm_barrier(c, 0.5, &err);
            status = expect_failure(rc, &err, "timed out", t0, 0.5, 1.0);
        } else {
            sleep(2);
        }
    } else {
        die("unknown mode %s%.0f", mode, 0);
    }
done:
    cddp_comm_destroy(c);
    return status;
}
