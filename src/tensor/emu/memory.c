/* memory.c: the emulated device's memory (emu.h): one memory file, mapped once without access
 * (the device addresses the host is given) and once read- and writable (where the queue thread
 * reaches the same pages). First-fit allocation over the whole of it, free blocks kept in address
 * order and merged with their neighbours; every block handed out is filled with NaNs first. */
#include "tensor/emu/emu.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALIGN 64

typedef struct block {
    struct block *next;
    size_t at, size; /* offsets in the region */
} block;

struct cddp__emu_mem {
    char *host;  /* PROT_NONE: what cddp__emu_mem_alloc returns */
    char *reach; /* PROT_READ | PROT_WRITE: the same pages */
    size_t size;
    int fd; /* the memory file */
    pthread_mutex_t lock;
    block *free;  /* free blocks by address */
    block *taken; /* taken blocks (unordered) */
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

bool cddp__emu_mem_owns(const cddp__emu_mem *m, const void *p) {
    return (const char *)p >= m->host && (const char *)p < m->host + m->size;
}

void *cddp__emu_mem_reach(const cddp__emu_mem *m, const void *p) {
    if (!cddp__emu_mem_owns(m, p)) return (void *)p;
    return m->reach + ((const char *)p - m->host);
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
