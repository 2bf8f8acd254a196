/* slow_shm.c: an LD_PRELOAD shim that slows one rank's shared memory, for the start-up leak test.
 *
 * In the process whose RANK is SLOW_SHM_RANK, every open() of a path that contains
 * SLOW_SHM_MATCH first sleeps SLOW_SHM_S seconds (default 30). cddp makes its shared memory by
 * opening /dev/shm (an unnamed file) and maps a peer's through /proc/<pid>/fd/<fd>: with "/dev/shm"
 * the rank is slow to make its own, with "/proc/" slow to map what a peer made, when the test
 * kills the job. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int open(const char *path, int flags, ...) {
    static int (*real)(const char *, int, ...);
    if (!real) real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    const char *slow = getenv("SLOW_SHM_RANK"), *rank = getenv("RANK");
    const char *match = getenv("SLOW_SHM_MATCH"), *secs = getenv("SLOW_SHM_S");
    if (slow && rank && match && !strcmp(slow, rank) && strstr(path, match))
        sleep(secs ? (unsigned)atoi(secs) : 30);
    return real(path, flags, mode);
}
