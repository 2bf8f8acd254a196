/* shm_mem.c: memory that the shared-memory transport's collectives read in place
 * (cddp_comm_alloc; design in shm.c). */
#include "comm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- registered memory ------------------------------------------------------------------- */

void cddp__shm_unmap_reg(cddp_comm *c, reg *g) {
    for (int r = 0; r < c->world && g->base; r++)
        if (g->base[r] && g->base[r] != MAP_FAILED) munmap(g->base[r], g->bytes);
    cddp_free(g->base);
    *g = (reg){0};
}

/* Maps shared-memory block name (bytes); MAP_FAILED with errno set on failure. */
static void *map_block(const char *name, size_t bytes, bool create) {
    int fd =
        shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return MAP_FAILED;
    int e = 0;
    /* Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS on first touch. */
    if (create && (e = ftruncate(fd, (off_t)bytes) != 0 ? errno : 0) == 0)
        e = posix_fallocate(fd, 0, (off_t)bytes);
    void *p = e ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!e && p == MAP_FAILED) e = errno;
    close(fd);
    if (e && create) shm_unlink(name);
    errno = e;
    return p;
}

/* Each rank makes a block of its own in /dev/shm and posts its name; barrier; each maps every
 * peer's block; barrier; each unlinks its name (every rank has it mapped, so nothing stays in
 * /dev/shm). A rank that could not make or map a block makes every rank fail the same way, and
 * the group stays usable. CDDP_SHM_ZERO_COPY=0 gives plain memory instead. */
int cddp__shm_alloc(cddp_comm *c, size_t bytes, double deadline, void **out, cddp_error *err) {
    shm *s = priv(c);
    if (!cddp_knob_int(CDDP_KNOB_SHM_ZERO_COPY)) {
        if (!(*out = cddp_aligned_alloc(bytes)))
            return cddp_error_set(err, CDDP_ENOMEM, "out of memory (%zu bytes)", bytes);
        return CDDP_OK;
    }
    int W = c->world, me = c->rank, slot = -1;
    for (int i = 0; i < MAX_REGS && slot < 0; i++)
        if (!s->regs[i].id) slot = i;
    reg *g = slot >= 0 ? &s->regs[slot] : NULL;
    uint64_t id = ++s->nallocs;
    ctl *mine = ctl_of(c, me);
    snprintf(mine->reg_name, sizeof mine->reg_name, "/cddp-%d-m%" PRIu64, (int)getpid(), id);
    mine->reg_made = ENOSPC;
    if (g && (g->base = cddp_calloc((size_t)W, sizeof *g->base))) {
        g->bytes = bytes;
        g->base[me] = map_block(mine->reg_name, bytes, true);
        mine->reg_made = g->base[me] == MAP_FAILED ? errno : 0;
    }
    CDDP_TRY(cddp__shm_sync_all(c, deadline, err));
    int bad = -1, why = 0;
    for (int r = 0; r < W && bad < 0; r++)
        if (ctl_of(c, r)->reg_made) bad = r, why = ctl_of(c, r)->reg_made;
    if (bad < 0) {
        mine->reg_mapped = 0;
        for (int r = 0; r < W && !mine->reg_mapped; r++)
            if (r != me &&
                (g->base[r] = map_block(ctl_of(c, r)->reg_name, bytes, false)) == MAP_FAILED)
                mine->reg_mapped = errno;
        int rc = cddp__shm_sync_all(c, deadline, err);
        shm_unlink(mine->reg_name);
        CDDP_TRY(rc);
        for (int r = 0; r < W && bad < 0; r++)
            if (ctl_of(c, r)->reg_mapped) bad = r, why = ctl_of(c, r)->reg_mapped;
    } else if (g && g->base && g->base[me] != MAP_FAILED) {
        shm_unlink(mine->reg_name);
    }
    if (bad >= 0) {
        if (g) cddp__shm_unmap_reg(c, g);
        return cddp_error_set(err, CDDP_ENOMEM,
                              "cannot allocate %zu MiB of shared memory on rank %d: %s (is "
                              "/dev/shm too small? under docker, raise --shm-size; or set "
                              "CDDP_SHM_ZERO_COPY=0 to use plain memory)",
                              bytes >> 20, bad, slot < 0 ? "too many allocations" : strerror(why));
    }
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
