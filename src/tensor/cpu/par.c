/* par.c: a kernel's work split across the CPU's threads.
 *
 * The threads are OpenMP's, the pool oneDNN's primitives run on (Debian's oneDNN is built on GNU
 * OpenMP, libgomp): between two of its GEMMs or convolutions the pool's threads wait, spinning,
 * for the next one, so a loop of cddp's own split across them costs no thread of its own and takes
 * no core a GEMM needs. Their number is the process's math threads (cddp_set_num_threads,
 * OMP_NUM_THREADS): one per rank under cddprun with several ranks on a host, every core for one
 * process alone. The runtime is oneDNN's dependency, not cddp's: its entry points are found where
 * oneDNN loaded it (GOMP_parallel, what `#pragma omp parallel` compiles to with GCC, which LLVM's
 * runtime provides too), so that cddp joins oneDNN's pool whichever compiler built cddp, and
 * without a runtime every kernel runs on the calling thread.
 *
 * oneDNN's float32 GEMM kernels (2.x, Debian's; fixed in 3.11.2) point the stack pointer into a
 * heap buffer while they run, so a signal handled on a thread inside one writes its frame over
 * the heap (the process aborts later in free(): `cddprun --dump`'s SIGUSR1 did so within seconds
 * on AVX-512). So a thread never takes an asynchronous signal inside oneDNN: the caller blocks
 * them for the call (cddp__cpu_shield, where a signal waits until the call returns or goes to a
 * thread that is not computing), and the pool's threads, which run nothing but kernels, block
 * them for good: made with them blocked (find_omp makes the pool so, once), and blocked by the
 * first part of cddp's they run (a pool grown by a split of cddp's).
 */
#include "tensor/cpu/cpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>

static struct {
    void (*parallel)(void (*fn)(void *), void *data, unsigned threads, unsigned flags);
    int (*max_threads)(void), (*thread_num)(void), (*num_threads)(void), (*in_parallel)(void);
} omp;
static pthread_once_t omp_once = PTHREAD_ONCE_INIT;
static sigset_t async_signals; /* every signal but those a fault raises on the faulting thread */
static _Thread_local bool pool_blocked;

static void no_part(void *data) {
    (void)data;
}

/* Once, before the first split or shield: the runtime's entry points, the signals the pool's
 * threads block, and the pool at its size, made with them blocked (a thread starts with its
 * maker's mask). */
static void find_omp(void) {
    sigfillset(&async_signals);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t k = 0; k < CDDP_ARRAY_LEN(faults); k++) sigdelset(&async_signals, faults[k]);
    *(void **)&omp.parallel = dlsym(RTLD_DEFAULT, "GOMP_parallel");
    *(void **)&omp.max_threads = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
    *(void **)&omp.thread_num = dlsym(RTLD_DEFAULT, "omp_get_thread_num");
    *(void **)&omp.num_threads = dlsym(RTLD_DEFAULT, "omp_get_num_threads");
    *(void **)&omp.in_parallel = dlsym(RTLD_DEFAULT, "omp_in_parallel");
    if (!omp.max_threads || !omp.thread_num || !omp.num_threads || !omp.in_parallel)
        omp.parallel = NULL;
    if (omp.parallel && !omp.in_parallel() && omp.max_threads() > 1) {
        sigset_t old;
        pthread_sigmask(SIG_BLOCK, &async_signals, &old);
        omp.parallel(no_part, NULL, (unsigned)omp.max_threads(), 0);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
}

int cddp__cpu_parts(int64_t n, int64_t grain) {
    pthread_once(&omp_once, find_omp);
    if (n < 2 || !omp.parallel || omp.in_parallel()) return 1;
    int64_t most = grain > 1 ? n / grain : n;
    int t = omp.max_threads();
    return most < t ? (most < 1 ? 1 : (int)most) : t;
}

int cddp__cpu_row_parts(int64_t rows, int64_t cols) {
    int parts = cddp__cpu_parts(rows * cols, CDDP__CPU_GRAIN);
    return parts > rows ? (int)rows : parts;
}

int cddp__cpu_col_parts(int64_t rows, int64_t cols) {
    int parts = cddp__cpu_parts(rows * cols, CDDP__CPU_GRAIN);
    return parts > cols / 64 ? (cols / 64 > 1 ? (int)(cols / 64) : 1) : parts;
}

typedef struct {
    int64_t n, align;
    cddp__cpu_part fn;
    void *arg;
} split_job;

/* On each thread of the team: its part, starting on a multiple of align. */
static void run_part(void *data) {
    const split_job *j = data;
    int64_t k = omp.num_threads(), i = omp.thread_num();
    if (i != 0 && !pool_blocked) { /* a pool thread (0 is the caller's own) */
        pthread_sigmask(SIG_BLOCK, &async_signals, NULL);
        pool_blocked = true;
    }
    int64_t units = (j->n + j->align - 1) / j->align;
    int64_t lo = units * i / k * j->align, hi = i + 1 == k ? j->n : units * (i + 1) / k * j->align;
    if (hi > j->n) hi = j->n;
    if (lo < hi) j->fn(lo, hi, (int)i, j->arg);
}

void cddp__cpu_shield(sigset_t *old) {
    pthread_once(&omp_once, find_omp);
    pthread_sigmask(SIG_BLOCK, &async_signals, old);
}

void cddp__cpu_unshield(const sigset_t *old) {
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

void cddp__cpu_split(int64_t n, int64_t align, int parts, cddp__cpu_part fn, void *arg) {
    if (parts <= 1 || !omp.parallel) {
        fn(0, n, 0, arg);
        return;
    }
    split_job j = {n, align < 1 ? 1 : align, fn, arg};
    omp.parallel(run_part, &j, (unsigned)parts, 0);
}

void cddp__cpu_split_values(int64_t n, cddp__cpu_part fn, const void *arg) {
    cddp__cpu_split(n, 16, cddp__cpu_parts(n, CDDP__CPU_GRAIN), fn, (void *)arg);
}

void cddp__cpu_split_rows(int64_t rows, int64_t cols, cddp__cpu_part fn, const void *arg) {
    cddp__cpu_split(rows, 1, cddp__cpu_row_parts(rows, cols), fn, (void *)arg);
}

void cddp__cpu_split_cols(int64_t rows, int64_t cols, cddp__cpu_part fn, const void *arg) {
    cddp__cpu_split(cols, 16, cddp__cpu_col_parts(rows, cols), fn, (void *)arg);
}
