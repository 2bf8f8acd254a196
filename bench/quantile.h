/* quantile.h: percentiles of per-call times, for the allreduce benchmarks (cddp's and Open
 * MPI's are measured and summed up the same way). */
#ifndef CDDP_BENCH_QUANTILE_H
#define CDDP_BENCH_QUANTILE_H

#include <math.h>
#include <stdlib.h>

static inline int bench_by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of n values (nearest rank); sorts them. */
static inline double bench_quantile(double *values, int n, double q) {
    qsort(values, (size_t)n, sizeof *values, bench_by_value);
    int k = (int)ceil(q * n) - 1;
    return values[k < 0 ? 0 : k >= n ? n - 1 : k];
}

#endif
