/* threads.c: how many threads each process's math libraries use.
 *
 * OpenBLAS starts its thread pool when it is loaded, sized by OPENBLAS_NUM_THREADS (or
 * OMP_NUM_THREADS, or every core); a process that learns later that it shares the host with other
 * ranks must tell the library, not only the environment. The same holds for the OpenMP runtime
 * that runs oneDNN (GEMMs and convolutions): it read OMP_NUM_THREADS when it was loaded, so it is
 * told through omp_set_num_threads, found at run time (the runtime is oneDNN's dependency, not
 * cddp's). The environment is set as well, so that libraries loaded afterwards and child
 * processes agree.
 */
#include "cddp/core.h"

#include <cblas.h>
#include <dlfcn.h>

/* Weak: a program that links cddp statically without any BLAS kernel (cddprun, linked
 * --as-needed, as Debian's compiler links every program) does not load OpenBLAS, and start its
 * thread pool, for these two; the library itself links it. */
#pragma weak openblas_set_num_threads
#pragma weak openblas_get_num_threads
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void cddp_set_num_threads(int n) {
    if (n < 1) n = 1;
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    setenv("OMP_NUM_THREADS", v, 1);
    setenv("OPENBLAS_NUM_THREADS", v, 1);
    if (openblas_set_num_threads) openblas_set_num_threads(n);
    void (*omp_set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (omp_set) omp_set(n);
}

int cddp_num_threads(void) {
    if (openblas_get_num_threads) return openblas_get_num_threads();
    /* Not loaded (a program without a BLAS kernel): what it would start with. */
    long n = cddp_env_int("OPENBLAS_NUM_THREADS");
    if (n < 1) n = cddp_env_int("OMP_NUM_THREADS");
    return n >= 1 && n < (1 << 20) ? (int)n : cddp_num_cores();
}

int cddp_num_cores(void) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? cores : 1;
}
