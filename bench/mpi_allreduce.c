/* mpi_allreduce.c: Open MPI's MPI_Allreduce measured the way cddp-bench-allreduce measures
 * cddp (float32 sum, in place, each call timed on its own after a refill of the input), for
 * bench/compare_allreduce.sh: the mean, median (p50) and 99th percentile (p99) of rank 0's
 * calls. One JSON line per size on rank 0.
 *
 *   mpirun -np 2 build/bin/mpi-bench-allreduce [--min-bytes 4K] [--max-bytes 64M] [--iters 20]
 */
#include "quantile.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    long long m = *end == 'K' ? 1 << 10 : *end == 'M' ? 1 << 20 : *end == 'G' ? 1 << 30 : 1;
    return (long long)(v * (double)m);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long long min_b = 4 << 10, max_b = 64 << 20;
    int iters = 20, warmup = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--min-bytes"))
            min_b = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-bytes"))
            max_b = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
    }
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    float *buf = malloc((size_t)max_b);
    double *times = malloc(sizeof *times * (size_t)(iters > 0 ? iters : 1));
    for (long long bytes = min_b; bytes <= max_b; bytes *= 2) {
        long long count = bytes / 4;
        double total = 0;
        long long wrong = 0;
        for (int k = 0; k < warmup + iters; k++) {
            for (long long i = 0; i < count; i++) buf[i] = (float)(rank + 1);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0;
            if (k >= warmup) total += dt, times[k - warmup] = dt;
        }
        for (long long i = 0; i < count; i++) wrong += buf[i] != (float)(n * (n + 1) / 2);
        double t = total / iters, alg = (double)bytes / t / 1e9;
        if (rank == 0)
            printf("{\"impl\": \"openmpi\", \"ranks\": %d, \"bytes\": %lld, \"time_us_inplace\": "
                   "%.2f, \"p50_us_inplace\": %.2f, \"p99_us_inplace\": %.2f, "
                   "\"busbw_inplace\": %.3f, \"wrong_inplace\": %lld}\n",
                   n, bytes, t * 1e6, bench_quantile(times, iters, 0.50) * 1e6,
                   bench_quantile(times, iters, 0.99) * 1e6, alg * 2.0 * (n - 1) / n, wrong);
    }
    free(buf);
    free(times);
    MPI_Finalize();
    return 0;
}
