/* shm_mem.c: memory that the shared-memory transport's collectives read in place
 * (cddp_comm_alloc; design in shm.c). */
#include "comm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- registered memory ------------------------------------------------------------------- */

void cddp__shm_unmap_reg(cddp_comm *c, reg *g) {
    for (int r = 0; r < c->world && g->base; r++)
        if (g->base[r] && g->base[r] != MAP_FAILED) munmap(g->base[r], g->bytes);
    cddp_free(g->base);
    *g = (reg){0};
}

/* Shared memory has no name: a block is an unnamed file in /dev/shm (O_TMPFILE: /dev/shm's size
 * still bounds it) that its maker holds open while the peers open it through
 * /proc/<maker>/fd/<fd>, and it goes away with the last descriptor or mapping. Nothing can be
 * left in /dev/shm, whichever process dies when. */

int cddp__shm_create(size_t bytes, uint64_t *ino) {
    int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    /* Reserve the pages now: no memory is an error here, not a SIGBUS on first touch. */
    int e = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    struct stat st;
    if (!e && fstat(fd, &st) != 0) e = errno;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    *ino = (uint64_t)st.st_ino;
    return fd;
}

void *cddp__shm_map_fd(int fd, size_t bytes) {
    return mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
}

void *cddp__shm_map_peer(int pid, int fd, uint64_t ino, size_t bytes) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int mine = open(path, O_RDWR | O_CLOEXEC);
    if (mine < 0) return MAP_FAILED;
    struct stat st;
    int e = fstat(mine, &st) != 0 ? errno : 0;
    /* The number of another process's descriptor: check that it is still the block meant. */
    if (!e && ((uint64_t)st.st_ino != ino || (size_t)st.st_size != bytes)) e = ESTALE;
    void *p = e ? MAP_FAILED : cddp__shm_map_fd(mine, bytes);
    if (!e && p == MAP_FAILED) e = errno;
    close(mine);
    errno = e;
    return p;
}

const char *cddp__shm_map_hint(int e) {
    switch (e) {
    case ENOENT:
    case ESTALE:
        return " (its process is gone)";
    case EACCES:
    case EPERM:
        return " (ranks of one host must see each other's processes: one PID namespace, the same "
               "user; or set CDDP_TRANSPORT=tcp)";
    default:
        return "";
    }
}

/* Each rank makes a block of its own and posts its descriptor; barrier; each maps every peer's
 * block; barrier; each closes its descriptor (the mappings keep the memory). A rank that could
 * not make or map a block makes every rank fail the same way, and the group stays usable.
 * CDDP_SHM_ZERO_COPY=0 gives plain memory instead. */
int cddp__shm_alloc(cddp_comm *c, size_t bytes, double deadline, void **out, cddp_error *err) {
    shm *s = priv(c);
    if (!cddp_knob_int(CDDP_KNOB_SHM_ZERO_COPY)) {
        if (!(*out = cddp_aligned_alloc(bytes)))
            return cddp_error_set(err, CDDP_ENOMEM, "out of memory (%zu bytes)", bytes);
        return CDDP_OK;
    }
    int W = c->world, me = c->rank, slot = -1, fd = -1;
    for (int i = 0; i < MAX_REGS && slot < 0; i++)
        if (!s->regs[i].id) slot = i;
    reg *g = slot >= 0 ? &s->regs[slot] : NULL;
    uint64_t id = ++s->nallocs;
    ctl *mine = ctl_of(c, me);
    mine->reg_made = ENOSPC;
    if (g && (g->base = cddp_calloc((size_t)W, sizeof *g->base))) {
        g->bytes = bytes;
        fd = cddp__shm_create(bytes, &mine->reg_ino);
        g->base[me] = fd < 0 ? MAP_FAILED : cddp__shm_map_fd(fd, bytes);
        mine->reg_made = g->base[me] == MAP_FAILED ? errno : 0;
        mine->reg_fd = fd;
    }
    int rc = cddp__shm_sync_all(c, deadline, err);
    int bad = -1, why = 0;
    for (int r = 0; r < W && bad < 0 && rc == CDDP_OK; r++)
        if (ctl_of(c, r)->reg_made) bad = r, why = ctl_of(c, r)->reg_made;
    if (bad < 0 && rc == CDDP_OK) {
        mine->reg_mapped = 0;
        for (int r = 0; r < W && !mine->reg_mapped; r++) {
            const ctl *o = ctl_of(c, r);
            if (r != me && (g->base[r] = cddp__shm_map_peer(o->pid, o->reg_fd, o->reg_ino,
                                                            bytes)) == MAP_FAILED)
                mine->reg_mapped = errno;
        }
        rc = cddp__shm_sync_all(c, deadline, err);
        for (int r = 0; r < W && bad < 0 && rc == CDDP_OK; r++)
            if (ctl_of(c, r)->reg_mapped) bad = r, why = ctl_of(c, r)->reg_mapped;
    }
    if (fd >= 0) close(fd);
    if ((rc != CDDP_OK || bad >= 0) && g) cddp__shm_unmap_reg(c, g);
    CDDP_TRY(rc);
    if (bad >= 0)
        return cddp_error_set(err, CDDP_ENOMEM,
                              "cannot allocate %zu MiB of shared memory on rank %d: %s%s (is "
                              "/dev/shm too small? under docker, raise --shm-size; or set "
                              "CDDP_SHM_ZERO_COPY=0 to use plain memory)",
                              bytes >> 20, bad, slot < 0 ? "too many allocations" : strerror(why),
                              slot < 0 ? "" : cddp__shm_map_hint(why));
    g->id = id;
    *out = g->base[me];
    return CDDP_OK;
}

bool cddp__shm_free(cddp_comm *c, void *p) {
    for (int i = 0; i < MAX_REGS; i++) {
        reg *g = &priv(c)->regs[i];
        if (g->id && g->base[c->rank] == p) {
            cddp__shm_unmap_reg(c, g);
            return true;
        }
    }
    return false;
}

/* The registration that holds [p, p + bytes) on this rank, with p's offset in it; NULL if none. */
const reg *cddp__shm_find_reg(const cddp_comm *c, const void *p, size_t bytes, size_t *offset) {
    uintptr_t at = (uintptr_t)p;
    for (int i = 0; i < MAX_REGS; i++) {
        const reg *g = &priv(c)->regs[i];
        uintptr_t b = (uintptr_t)(g->id ? g->base[c->rank] : NULL);
        if (g->id && at >= b && at + bytes <= b + g->bytes) {
            *offset = at - b;
            return g;
        }
    }
    return NULL;
}
