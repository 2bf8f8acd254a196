/* bench_allreduce.c: allreduce speed, nccl-tests style. Run under cddprun:
 *
 *   cddprun --nproc_per_node 2 build/bin/cddp-bench-allreduce --min-bytes 4K --max-bytes 64M
 *
 * For each size (doubling from --min-bytes to --max-bytes): the mean time of --iters allreduces
 * after --warmup, out of place and in place, and the median (p50) and 99th percentile (p99) of
 * the calls (rank 0's times; the tail is where a rank that fell asleep shows; the table shows
 * them out of place, the JSON both ways),
 * algbw = bytes / mean time and busbw = algbw * 2(n-1)/n
 * (what each rank's link carries in a bandwidth-optimal allreduce), and #wrong: elements that
 * differ from the exact expected value (inputs are small integers). Rank 0 prints the table, or
 * one JSON line per size with --json. --registered places the buffers in memory from
 * cddp_comm_alloc, which the shared-memory transport reads in place (as DDP's gradients are);
 * without it they are plain memory, as a user's buffer would be.
 */
#include "quantile.h"

#include <cddp/cddp.h>

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    int64_t m = 1;
    if (*end == 'K' || *end == 'k')
        m = 1 << 10;
    else if (*end == 'M' || *end == 'm')
        m = 1 << 20;
    else if (*end == 'G' || *end == 'g')
        m = 1 << 30;
    return (int64_t)(v * (double)m);
}

int main(int argc, char **argv) {
    int64_t min_bytes = 4 << 10, max_bytes = 64 << 20;
    int iters = 100, warmup = 5;
    bool json = false, registered = false;
    cddp_comm_op op = CDDP_COMM_SUM;
    static const struct option lo[] = {{"min-bytes", required_argument, 0, 'b'},
                                       {"max-bytes", required_argument, 0, 'e'},
                                       {"iters", required_argument, 0, 'n'},
                                       {"warmup", required_argument, 0, 'w'},
                                       {"op", required_argument, 0, 'o'},
                                       {"json", no_argument, 0, 'j'},
                                       {"registered", no_argument, 0, 'r'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'b':
            min_bytes = parse_size(optarg);
            break;
        case 'e':
            max_bytes = parse_size(optarg);
            break;
        case 'n':
            iters = atoi(optarg);
            break;
        case 'w':
            warmup = atoi(optarg);
            break;
        case 'o':
            op = !strcmp(optarg, "max")   ? CDDP_COMM_MAX
                 : !strcmp(optarg, "min") ? CDDP_COMM_MIN
                                          : CDDP_COMM_SUM;
            break;
        case 'j':
            json = true;
            break;
        case 'r':
            registered = true;
            break;
        case 'h':
            printf("usage: cddp-bench-allreduce [--min-bytes 4K] [--max-bytes 64M] [--iters 100] "
                   "[--warmup 5] [--op sum|min|max] [--registered] [--json]\n"
                   "   (float32; run under cddprun)\n");
            return 0;
        default:
            return 2;
        }
    }
    if (min_bytes < 4 || max_bytes < min_bytes || iters < 1 || warmup < 0) {
        fprintf(stderr,
                "cddp-bench-allreduce: need 4 <= --min-bytes <= --max-bytes, --iters >= 1\n");
        return 2;
    }
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) {
        fprintf(stderr, "cddp-bench-allreduce: %s\n", err.msg);
        return 1;
    }
    int rank = cddp_comm_rank(g), n = cddp_comm_size(g);
    float *send = registered ? cddp_comm_alloc(g, (size_t)max_bytes, &err)
                             : cddp_aligned_alloc((size_t)max_bytes);
    float *recv = registered ? cddp_comm_alloc(g, (size_t)max_bytes, &err)
                             : cddp_aligned_alloc((size_t)max_bytes);
    if (!send || !recv) {
        fprintf(stderr, "cddp-bench-allreduce: %s\n", err.code ? err.msg : "out of memory");
        return 1;
    }
    double *times = malloc(sizeof(double) * (size_t)iters);
    if (!times) return 1;
    if (rank == 0 && !json)
        printf("# cddp allreduce, %d ranks, float32 %s, %s buffers; out of place: mean, p50 and "
               "p99 of %d calls\n#%12s %12s %10s %9s %9s %10s %10s %7s %10s %10s %10s %7s\n",
               n, cddp_comm_op_name(op), registered ? "registered" : "plain", iters, "size(B)",
               "count", "time(us)", "p50(us)", "p99(us)", "algbw(GB/s)", "busbw", "#wrong",
               "time(us)", "algbw", "busbw", "#wrong");
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        int64_t count = bytes / 4;
        double t[2], wrong[2], p50[2] = {0}, p99[2] = {0};
        for (int inplace = 0; inplace < 2; inplace++) {
            float *dst = inplace ? send : recv;
            /* Each call timed on its own: the input is refilled between calls (in place would
             * otherwise grow without bound), and the refill is not the collective's time. */
            double total = 0;
            for (int k = 0; k < warmup + iters; k++) {
                for (int64_t i = 0; i < count; i++) send[i] = (float)(rank + 1);
                double t0 = cddp_now_s();
                if (cddp_comm_allreduce(g, send, dst, count, CDDP_COMM_F32, op, -1, &err)) {
                    fprintf(stderr, "cddp-bench-allreduce: %s\n", err.msg);
                    return 1;
                }
                double dt = cddp_now_s() - t0;
                if (k >= warmup) total += dt;
                if (k >= warmup) times[k - warmup] = dt;
            }
            t[inplace] = total / iters;
            p50[inplace] = bench_quantile(times, iters, 0.50);
            p99[inplace] = bench_quantile(times, iters, 0.99);
            float want = op == CDDP_COMM_SUM   ? (float)(n * (n + 1) / 2)
                         : op == CDDP_COMM_MAX ? (float)n
                                               : 1.0f;
            int64_t bad = 0;
            for (int64_t i = 0; i < count; i++) bad += dst[i] != want;
            wrong[inplace] = (double)bad;
        }
        double alg[2] = {bytes / t[0] / 1e9, bytes / t[1] / 1e9};
        double f = n > 1 ? 2.0 * (n - 1) / n : 1.0;
        if (rank != 0) continue;
        if (json)
            printf("{\"impl\": \"cddp\", \"registered\": %s, \"ranks\": %d, \"bytes\": %lld, "
                   "\"time_us\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f, \"algbw\": %.3f, "
                   "\"busbw\": %.3f, \"wrong\": %.0f, \"time_us_inplace\": %.2f, "
                   "\"p50_us_inplace\": %.2f, \"p99_us_inplace\": %.2f, "
                   "\"busbw_inplace\": %.3f, \"wrong_inplace\": %.0f}\n",
                   registered ? "true" : "false", n, (long long)bytes, t[0] * 1e6, p50[0] * 1e6,
                   p99[0] * 1e6, alg[0], alg[0] * f, wrong[0], t[1] * 1e6, p50[1] * 1e6,
                   p99[1] * 1e6, alg[1] * f, wrong[1]);
        else
            printf(" %12lld %12lld %10.2f %9.2f %9.2f %10.3f %10.3f %7.0f %10.2f %10.3f %10.3f "
                   "%7.0f\n",
                   (long long)bytes, (long long)count, t[0] * 1e6, p50[0] * 1e6, p99[0] * 1e6,
                   alg[0], alg[0] * f, wrong[0], t[1] * 1e6, alg[1], alg[1] * f, wrong[1]);
    }
    if (registered) {
        cddp_comm_free(g, send);
        cddp_comm_free(g, recv);
    } else {
        cddp_aligned_free(send);
        cddp_aligned_free(recv);
    }
    free(times);
    cddp_comm_destroy(g);
    return 0;
}
