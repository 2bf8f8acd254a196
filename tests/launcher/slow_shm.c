/* slow_shm.c: an LD_PRELOAD shim that slows one rank's shared memory, for the start-up leak test.
 *
 * In the process whose RANK is SLOW_SHM_RANK, every shm_open of a name that contains
 * SLOW_SHM_MATCH (any name when unset) first sleeps SLOW_SHM_S seconds (default 30): that rank
 * has not yet opened what a peer created when the test kills the job. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int shm_open(const char *name, int oflag, mode_t mode) {
    static int (*real)(const char *, int, mode_t);
    if (!real) real = (int (*)(const char *, int, mode_t))dlsym(RTLD_NEXT, "shm_open");
    const char *slow = getenv("SLOW_SHM_RANK"), *rank = getenv("RANK");
    const char *match = getenv("SLOW_SHM_MATCH"), *secs = getenv("SLOW_SHM_S");
    if (slow && rank && !strcmp(slow, rank) && (!match || strstr(name, match)))
        sleep(secs ? (unsigned)atoi(secs) : 30);
    return real(name, oflag, mode);
}
