/* util.c: the launcher's small helpers that its other files share, on the floor below them
 * (they call nothing of the launcher's own): folders, the wall clock, random ids. */
#include "cddprun.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* mkdir -p: every missing folder of path. */
int cddprun_make_dirs(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++)
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) return errno;
            if (!(*p = c)) return 0;
        }
}

double cddprun_wall_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* bytes random bytes (/dev/urandom) as 2 * bytes hex digits into out (at most 32 bytes). */
void cddprun_random_hex(char *out, size_t bytes) {
    unsigned char raw[32] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t r = fd >= 0 ? read(fd, raw, bytes) : -1;
    if (fd >= 0) close(fd);
    if (r != (ssize_t)bytes) { /* no /dev/urandom: time and pid, still unique enough for an id */
        uint64_t x = (uint64_t)cddp_now_s() * 1000003u ^ (uint64_t)getpid() << 32;
        memcpy(raw, &x, sizeof x);
    }
    for (size_t i = 0; i < bytes; i++) sprintf(out + 2 * i, "%02x", raw[i]);
}
