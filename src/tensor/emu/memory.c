/* memory.c: the emulated device's memory (emu.h): one memory file, mapped once without access
 * (the device addresses the host is given) and once read- and writable (where the queue thread
 * reaches the same pages). First-fit allocation over the whole of it, free blocks kept in address
 * order and merged with their neighbours; every block handed out is filled with NaNs first. */
#include "tensor/emu/emu.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALIGN   64
#define IMPORTS 32 /* other processes' allocations open at once */

typedef struct block {
    struct block *next;
    size_t at, size; /* offsets in the region */
} block;

/* Another process's allocation, mapped as the device's own memory is: map and map_reach are the
 * whole pages, host and reach the allocation in them. */
typedef struct imported {
    char *map, *map_reach, *host, *reach;
    size_t map_size, size;
} imported;

struct cddp__emu_mem {
    char *host;  /* PROT_NONE: what cddp__emu_mem_alloc returns */
    char *reach; /* PROT_READ | PROT_WRITE: the same pages */
    size_t size;
    int fd; /* the memory file */
    pthread_mutex_t lock;
    block *free;  /* free blocks by address */
    block *taken; /* taken blocks (unordered) */
    pthread_mutex_t import_lock;
    imported imports[IMPORTS]; /* under import_lock; a free slot has map NULL */
};

cddp__emu_mem *cddp__emu_mem_create(size_t bytes, cddp_error *err) {
    cddp__emu_mem *m = cddp_calloc(1, sizeof *m);
    block *all = cddp_calloc(1, sizeof *all);
    int fd = memfd_create("cddp-emu", MFD_CLOEXEC);
    if (!m || !all || fd < 0) {
        cddp_error_set(err, CDDP_ENOMEM, "emu: cannot make the device memory: %s",
                       fd < 0 ? strerror(errno) : "out of memory");
        goto fail;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        cddp_error_set(err, CDDP_ENOMEM, "emu: cannot size the device memory to %zu MiB: %s",
                       bytes >> 20, strerror(errno));
        goto fail;
    }
    m->host = mmap(NULL, bytes, PROT_NONE, MAP_SHARED, fd, 0);
    m->reach = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m->host == MAP_FAILED || m->reach == MAP_FAILED) {
        cddp_error_set(err, CDDP_ENOMEM, "emu: cannot map %zu MiB of device memory: %s",
                       bytes >> 20, strerror(errno));
        if (m->host != MAP_FAILED) munmap(m->host, bytes);
        if (m->reach != MAP_FAILED) munmap(m->reach, bytes);
        goto fail;
    }
    m->fd = fd;
    m->size = bytes;
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->import_lock, NULL);
    *all = (block){NULL, 0, bytes};
    m->free = all;
    return m;
fail:
    if (fd >= 0) close(fd);
    cddp_free(all);
    cddp_free(m);
    return NULL;
}

static void blocks_free(block *b) {
    for (block *n; b; b = n) {
        n = b->next;
        cddp_free(b);
    }
}

void cddp__emu_mem_destroy(cddp__emu_mem *m) {
    if (!m) return;
    munmap(m->host, m->size);
    munmap(m->reach, m->size);
    for (int i = 0; i < IMPORTS; i++)
        if (m->imports[i].map) {
            munmap(m->imports[i].map, m->imports[i].map_size);
            munmap(m->imports[i].map_reach, m->imports[i].map_size);
        }
    pthread_mutex_destroy(&m->import_lock);
    close(m->fd);
    blocks_free(m->free);
    blocks_free(m->taken);
    pthread_mutex_destroy(&m->lock);
    cddp_free(m);
}

void *cddp__emu_mem_alloc(cddp__emu_mem *m, size_t bytes, cddp_error *err) {
    size_t need = (CDDP_MAX(bytes, 1) + ALIGN - 1) / ALIGN * ALIGN;
    block *t = cddp_malloc(sizeof *t);
    if (!t) {
        cddp_error_set(err, CDDP_ENOMEM, "emu: out of host memory");
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    block **at = &m->free;
    while (*at && (*at)->size < need) at = &(*at)->next;
    block *f = *at;
    if (!f) {
        pthread_mutex_unlock(&m->lock);
        cddp_free(t);
        cddp_error_set(err, CDDP_ENOMEM,
                       "emu: out of device memory: %zu MiB wanted, of %zu MiB (CDDP_EMU_MB)",
                       need >> 20, m->size >> 20);
        return NULL;
    }
    *t = (block){m->taken, f->at, need};
    m->taken = t;
    f->at += need;
    f->size -= need;
    if (f->size == 0) {
        *at = f->next;
        cddp_free(f);
    }
    pthread_mutex_unlock(&m->lock);
    memset(m->reach + t->at, 0xff, need); /* NaN in every float: nothing written reads as data */
    return m->host + t->at;
}

void cddp__emu_mem_free(cddp__emu_mem *m, void *p) {
    if (!p) return;
    size_t at = (size_t)((char *)p - m->host);
    pthread_mutex_lock(&m->lock);
    block **tp = &m->taken;
    while (*tp && (*tp)->at != at) tp = &(*tp)->next;
    CDDP_CHECK(*tp, "emu: freeing %p, which is not an allocation of the device", p);
    block *b = *tp;
    *tp = b->next;
    /* back into the free list, in address order, merged with its neighbours */
    block **fp = &m->free, *prev = NULL;
    while (*fp && (*fp)->at < b->at) {
        prev = *fp;
        fp = &(*fp)->next;
    }
    b->next = *fp;
    *fp = b;
    if (b->next && b->at + b->size == b->next->at) {
        block *n = b->next;
        b->size += n->size;
        b->next = n->next;
        cddp_free(n);
    }
    if (prev && prev->at + prev->size == b->at) {
        prev->size += b->size;
        prev->next = b->next;
        cddp_free(b);
    }
    pthread_mutex_unlock(&m->lock);
}

/* The import holding p (NULL: none); m's import_lock held. */
static const imported *import_of(const cddp__emu_mem *m, const void *p) {
    for (int i = 0; i < IMPORTS; i++) {
        const imported *im = &m->imports[i];
        if (im->map && (const char *)p >= im->host && (const char *)p < im->host + im->size)
            return im;
    }
    return NULL;
}

bool cddp__emu_mem_owns(const cddp__emu_mem *m, const void *p) {
    if ((const char *)p >= m->host && (const char *)p < m->host + m->size) return true;
    cddp__emu_mem *w = (cddp__emu_mem *)m; /* the lock only */
    pthread_mutex_lock(&w->import_lock);
    bool found = import_of(m, p) != NULL;
    pthread_mutex_unlock(&w->import_lock);
    return found;
}

void *cddp__emu_mem_reach(const cddp__emu_mem *m, const void *p) {
    if ((const char *)p >= m->host && (const char *)p < m->host + m->size)
        return m->reach + ((const char *)p - m->host);
    cddp__emu_mem *w = (cddp__emu_mem *)m;
    pthread_mutex_lock(&w->import_lock);
    const imported *im = import_of(m, p);
    void *r = im ? im->reach + ((const char *)p - im->host) : (void *)p;
    pthread_mutex_unlock(&w->import_lock);
    return r;
}

int cddp__emu_mem_extent(cddp__emu_mem *m, const void *p, int *fd, size_t *at, size_t *size) {
    pthread_mutex_lock(&m->lock);
    const block *b = m->taken;
    while (b && m->host + b->at != (const char *)p) b = b->next;
    if (b) *fd = m->fd, *at = b->at, *size = b->size;
    pthread_mutex_unlock(&m->lock);
    return b ? 0 : -1;
}

void *cddp__emu_mem_import(cddp__emu_mem *m, int pid, int fd, size_t at, size_t size,
                           cddp_error *err) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0) {
        cddp_error_set(err, CDDP_ENOENT,
                       "emu: cannot open process %d's device memory (%s): %s (has it ended?)", pid,
                       path, strerror(errno));
        return NULL;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE), from = at / page * page;
    size_t map_size = (at + size - from + page - 1) / page * page;
    char *map = mmap(NULL, map_size, PROT_NONE, MAP_SHARED, f, (off_t)from);
    char *reach = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, f, (off_t)from);
    int e = errno;
    close(f);
    if (map == MAP_FAILED || reach == MAP_FAILED) {
        if (map != MAP_FAILED) munmap(map, map_size);
        if (reach != MAP_FAILED) munmap(reach, map_size);
        cddp_error_set(err, CDDP_ENOMEM, "emu: cannot map process %d's device memory: %s", pid,
                       strerror(e));
        return NULL;
    }
    pthread_mutex_lock(&m->import_lock);
    int i = 0;
    while (i < IMPORTS && m->imports[i].map) i++;
    if (i < IMPORTS)
        m->imports[i] =
            (imported){map, reach, map + (at - from), reach + (at - from), map_size, size};
    pthread_mutex_unlock(&m->import_lock);
    if (i == IMPORTS) {
        munmap(map, map_size);
        munmap(reach, map_size);
        cddp_error_set(err, CDDP_ENOMEM,
                       "emu: at most %d other processes' allocations open at once", IMPORTS);
        return NULL;
    }
    return map + (at - from);
}

void cddp__emu_mem_unimport(cddp__emu_mem *m, void *p) {
    pthread_mutex_lock(&m->import_lock);
    imported *im = (imported *)import_of(m, p);
    CDDP_CHECK(im && im->host == p, "emu: closing %p, which is not another process's memory", p);
    imported gone = *im;
    im->map = NULL;
    pthread_mutex_unlock(&m->import_lock);
    munmap(gone.map, gone.map_size);
    munmap(gone.map_reach, gone.map_size);
}

void cddp__emu_mem_lock(cddp__emu_mem *m) {
    pthread_mutex_lock(&m->lock);
}

void cddp__emu_mem_unlock(cddp__emu_mem *m) {
    pthread_mutex_unlock(&m->lock);
}

/* The queue thread's view mapped again, privately: the child's writes copy the pages they touch
 * instead of reaching the parent's device memory. (The host's view is never read or written.) */
void cddp__emu_mem_private(cddp__emu_mem *m) {
    void *p = mmap(m->reach, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, m->fd, 0);
    CDDP_CHECK(p == m->reach, "emu: cannot remap the device memory in a forked child: %s",
               strerror(errno));
}
