/* arena.c: the per-step bump allocator.
 *
 * A step's tensors and tape nodes are allocated here and released all at once by a reset. The
 * arena is a list of chunks; allocation bumps an offset in the newest chunk and opens a new one
 * when it does not fit. A reset after a step that needed more than one chunk replaces them by a
 * single chunk of the high-water size, so the steady state is one chunk and zero mallocs a step.
 * A chunk's header lives apart from its memory, which may be a device's (cddp_arena_create_on):
 * the arena never touches the memory it hands out.
 *
 * On the heap the arena is instead one chunk of the whole limit, reserved as address space only
 * (MAP_NORESERVE: the kernel gives a page when it is first written): the first step touches what
 * it uses and no step after it adds, merges or touches new memory again, where chunks made the
 * second step fault in a fresh copy of the first one's. The reservation asks for transparent huge
 * pages (2 MiB: a 512th of the faults, and fewer TLB misses in the products). Where the address
 * space cannot be had (RLIMIT_AS, strict overcommit) the arena falls back to chunks.
 */
#include "cddp/core.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#define ARENA_ALIGN 64

typedef struct chunk {
    struct chunk *prev;
    char *data;  /* ARENA_ALIGN aligned */
    size_t size; /* bytes at data */
    size_t used;
} chunk;

struct cddp_arena {
    chunk *head;
    size_t max_bytes;
    size_t total;      /* bytes in all chunks */
    size_t used;       /* bytes handed out since the last reset (including padding) */
    size_t high_water; /* the largest `used` seen */
    cddp_arena_memory mem;
    pthread_mutex_t lock; /* held by cddp_arena_alloc when mem.shared */
    void *map;            /* the reservation (the heap's arena), or NULL: chunks */
    size_t map_len;
};

#define HUGE_PAGE ((size_t)2 << 20)
#define GROW_MAX  ((size_t)1 << 30)

/* The heap arena's one chunk: max_bytes of address space from a 2 MiB boundary. */
static chunk *reserve(cddp_arena *a) {
    size_t len = a->max_bytes + HUGE_PAGE;
    void *p =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    chunk *c = cddp_malloc(sizeof *c);
    if (!c) {
        munmap(p, len);
        return NULL;
    }
    uintptr_t at = ((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    *c = (chunk){.prev = NULL, .data = (char *)at, .size = a->max_bytes, .used = 0};
    madvise(c->data, c->size, MADV_HUGEPAGE); /* advice: refused, 4 KiB pages */
    a->map = p;
    a->map_len = len;
    return c;
}

static void *heap_alloc(void *user, size_t bytes) {
    (void)user;
    return cddp_aligned_alloc(bytes);
}

static void heap_free(void *user, void *p) {
    (void)user;
    cddp_aligned_free(p);
}

static chunk *chunk_new(cddp_arena *a, size_t size, chunk *prev) {
    chunk *c = cddp_malloc(sizeof *c);
    if (!c) return NULL;
    if (!(c->data = a->mem.alloc(a->mem.user, size))) {
        cddp_free(c);
        return NULL;
    }
    c->prev = prev;
    c->size = size;
    c->used = 0;
    return c;
}

static void chunks_free(cddp_arena *a, chunk *c) {
    for (chunk *p; c; c = p) {
        p = c->prev;
        a->mem.free(a->mem.user, c->data);
        cddp_free(c);
    }
}

cddp_arena *cddp_arena_create_on(size_t initial_bytes, size_t max_bytes,
                                 const cddp_arena_memory *mem) {
    cddp_arena *a = cddp_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->mem = mem ? *mem : (cddp_arena_memory){heap_alloc, heap_free, NULL, false, NULL};
    pthread_mutex_init(&a->lock, NULL);
    a->max_bytes = max_bytes ? max_bytes : (size_t)cddp_knob_int(CDDP_KNOB_ARENA_MB) << 20;
    if (initial_bytes > a->max_bytes)
        initial_bytes = a->max_bytes; /* the limit holds from the first */
    if (initial_bytes < (1u << 16)) initial_bytes = 1u << 16;
    a->head = mem ? NULL : reserve(a);
    if (a->head) {
        a->total = a->max_bytes;
        return a;
    }
    a->head = chunk_new(a, initial_bytes, NULL);
    if (!a->head) {
        pthread_mutex_destroy(&a->lock);
        cddp_free(a);
        return NULL;
    }
    a->total = initial_bytes;
    return a;
}

cddp_arena *cddp_arena_create(size_t initial_bytes, size_t max_bytes) {
    return cddp_arena_create_on(initial_bytes, max_bytes, NULL);
}

void cddp_arena_destroy(cddp_arena *a) {
    if (!a) return;
    if (a->map) {
        cddp_free(a->head);
        munmap(a->map, a->map_len);
    } else {
        chunks_free(a, a->head);
    }
    pthread_mutex_destroy(&a->lock);
    cddp_free(a);
}

static void *bump(cddp_arena *a, size_t bytes, cddp_error *err) {
    size_t need = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (need == 0) need = ARENA_ALIGN;
    chunk *c = a->head;
    if (!c || c->size - c->used < need) {
        if (a->used + need > a->max_bytes) {
            cddp_error_set(err, CDDP_ENOMEM,
                           "step arena exhausted: this step needs at least %zu MiB but the limit "
                           "is %zu MiB; raise CDDP_ARENA_MB or use a smaller batch",
                           (a->used + need + (1u << 20) - 1) >> 20, a->max_bytes >> 20);
            return NULL;
        }
        /* Grow geometrically so that a big step costs O(log n) chunks, GROW_MAX at most. */
        size_t size = CDDP_MAX(need, CDDP_MIN(CDDP_MAX(a->total, (size_t)1 << 16), GROW_MAX));
        c = chunk_new(a, size, a->head);
        if (!c) {
            cddp_error_set(err, CDDP_ENOMEM,
                           "step arena: cannot allocate %zu MiB more (used %zu "
                           "MiB so far)",
                           size >> 20, a->used >> 20);
            return NULL;
        }
        a->head = c;
        a->total += size;
    }
    void *p = c->data + c->used;
    c->used += need;
    a->used += need;
    if (a->used > a->high_water) a->high_water = a->used;
    return p;
}

void *cddp_arena_alloc(cddp_arena *a, size_t bytes, cddp_error *err) {
    if (!a->mem.shared) return bump(a, bytes, err);
    pthread_mutex_lock(&a->lock);
    void *p = bump(a, bytes, err);
    pthread_mutex_unlock(&a->lock);
    return p;
}

void cddp_arena_reset(cddp_arena *a) {
    if (a->head && a->head->prev) {
        /* Several chunks: replace them by one that holds the whole high-water mark, taken after
         * they are given back. Where it cannot be had, the next step grows chunks again. */
        chunks_free(a, a->head);
        a->head = chunk_new(a, a->high_water, NULL);
        a->total = a->head ? a->high_water : 0;
    }
    for (chunk *c = a->head; c; c = c->prev) {
        if (a->mem.reset && c->used) a->mem.reset(a->mem.user, c->data, c->used);
        c->used = 0;
    }
    a->used = 0;
}

size_t cddp_arena_used(const cddp_arena *a) {
    return a->used;
}

size_t cddp_arena_high_water(const cddp_arena *a) {
    return a->high_water;
}
