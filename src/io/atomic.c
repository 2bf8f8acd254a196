/* atomic.c: write-to-temporary, fsync, rename (the contract is in io/internal.h). */
#include "cddp/core.h"
#include "io/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Removes PATH.tmp.HOST.PID files of this host whose writer is gone (killed during a save):
 * a temporary of a process that still runs, or of another host, stays. */
static void sweep(const char *path, const char *host) {
    char dir[4096], base[4096], prefix[4200];
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(base, sizeof base, "%s", path);
    snprintf(prefix, sizeof prefix, "%s.tmp.%s.", basename(base), host);
    DIR *d = opendir(dirname(dir));
    if (!d) return;
    size_t pl = strlen(prefix);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, pl) != 0) continue;
        char *end = NULL;
        long pid = strtol(e->d_name + pl, &end, 10);
        if (pid <= 0 || *end || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            unlinkat(dirfd(d), e->d_name, 0);
            cddp_log(CDDP_LOG_INFO, "io", "removed %s, left by a writer that is gone", e->d_name);
        }
    }
    closedir(d);
}

int cddp__atomic_open(cddp__atomic_file *af, const char *path, cddp_error *err) {
    af->path = path;
    af->f = NULL;
    af->bytes = 0;
    af->crc32 = 0; /* zlib's CRC-32 of nothing */
    char host[256] = "host";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "host");
    for (char *c = host; *c; c++)
        if (*c == '/' || *c == '.') *c = '_';
    sweep(path, host);
    int n = snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%s.%ld", path, host, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof af->tmp)
        return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", path);
    af->f = fopen(af->tmp, "wb");
    if (!af->f)
        return cddp_error_set(err, CDDP_EIO,
                              "cannot create %s: %s (does the folder exist and is "
                              "it writable?)",
                              af->tmp, strerror(errno));
    return CDDP_OK;
}

/* A write, flush or close of af's temporary failed with errno e: on a full file system the
 * message says what the save leaves (the temporary is removed by cddp__atomic_close). */
static int failed(const cddp__atomic_file *af, const char *doing, int e, cddp_error *err) {
    if (e != ENOSPC && e != EDQUOT)
        return cddp_error_set(err, CDDP_EIO, "%s %s: %s", doing, af->tmp, strerror(e));
    return cddp_error_set(err, CDDP_EIO, "%s %s: %s (%s %s; free space there or save elsewhere)",
                          doing, af->tmp, strerror(e), af->path,
                          access(af->path, F_OK) == 0 ? "keeps what it held" : "was not written");
}

int cddp__atomic_write(cddp__atomic_file *af, const void *data, size_t bytes, cddp_error *err) {
    if (bytes && fwrite(data, 1, bytes, af->f) != bytes) return failed(af, "writing", errno, err);
    af->bytes += bytes;
    af->crc32 = cddp__crc32(af->crc32, data, bytes);
    return CDDP_OK;
}

uint32_t cddp__crc32(uint32_t crc, const void *data, size_t bytes) {
    for (size_t at = 0; at < bytes;) { /* zlib's length is an unsigned int */
        uInt len = (uInt)CDDP_MIN(bytes - at, (size_t)1 << 30);
        crc = (uint32_t)crc32(crc, (const Bytef *)data + at, len);
        at += len;
    }
    return crc;
}

static void sync_folder(const char *path) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int cddp__atomic_close(cddp__atomic_file *af, int rc, cddp_error *err) {
    if (!af->f) return rc;
    if (rc == CDDP_OK && (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0))
        rc = failed(af, "flushing", errno, err);
    if (fclose(af->f) != 0 && rc == CDDP_OK) rc = failed(af, "closing", errno, err);
    af->f = NULL;
    if (rc == CDDP_OK && rename(af->tmp, af->path) != 0)
        rc = cddp_error_set(err, CDDP_EIO, "renaming %s to %s: %s", af->tmp, af->path,
                            strerror(errno));
    if (rc != CDDP_OK) {
        unlink(af->tmp);
        return rc;
    }
    sync_folder(af->path);
    return CDDP_OK;
}

/* mkdir -p */
int cddp__make_dirs(const char *path, cddp_error *err) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "%s", path);
    if (n <= 0 || (size_t)n >= sizeof buf)
        return cddp_error_set(err, CDDP_EINVAL, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        char c = *p;
        if (c != '/' && c != '\0') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return cddp_error_set(err, CDDP_EIO, "cannot create the folder %s: %s", buf,
                                  strerror(errno));
        *p = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return cddp_error_set(err, CDDP_EIO, "%s exists and is not a folder", path);
    return CDDP_OK;
}
