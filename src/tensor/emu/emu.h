/* tensor/emu/emu.h: the emulated device's memory and queue, which its device.c puts together.
 *
 * memory.c  one memory file mapped twice: the addresses the host is given (no access: a host
 *           read or write of device memory faults at once) and, at a fixed distance, the same
 *           pages read- and writable, where the queue thread works; an allocator over it that
 *           fills what it hands out with NaNs
 * queue.c   the queue thread: tasks (kernels, copies, fills) run in the order they were queued
 */
#ifndef CDDP_TENSOR_EMU_H
#define CDDP_TENSOR_EMU_H

#include "tensor/device.h"

#include <pthread.h>

/* ---- memory.c ------------------------------------------------------------------------------ */

typedef struct cddp__emu_mem cddp__emu_mem;

/* The device memory of `bytes` (its pages taken as touched); NULL with err on failure. */
cddp__emu_mem *cddp__emu_mem_create(size_t bytes, cddp_error *err);
void cddp__emu_mem_destroy(cddp__emu_mem *m);
/* 64-byte aligned device addresses, filled with NaNs (all bits set); NULL with err when full. */
void *cddp__emu_mem_alloc(cddp__emu_mem *m, size_t bytes, cddp_error *err);
void cddp__emu_mem_free(cddp__emu_mem *m, void *p);
/* Where the queue thread reaches device address p (p itself when it is not device memory); and
 * whether p is device memory. */
void *cddp__emu_mem_reach(const cddp__emu_mem *m, const void *p);
bool cddp__emu_mem_owns(const cddp__emu_mem *m, const void *p);
/* Device allocation p's memory file, offset and size in it (what another process maps): 0, or -1
 * when p is not where an allocation starts. */
int cddp__emu_mem_extent(cddp__emu_mem *m, const void *p, int *fd, size_t *at, size_t *size);
/* Process pid's allocation (its memory file fd, at offset at, of size bytes) mapped here as this
 * memory is (owns and reach take it) until _unimport; NULL with err when it cannot be. */
void *cddp__emu_mem_import(cddp__emu_mem *m, int pid, int fd, size_t at, size_t size,
                           cddp_error *err);
void cddp__emu_mem_unimport(cddp__emu_mem *m, void *p);
/* Around fork(): _lock before it (no allocation half done), _unlock after it in both processes;
 * _private in the child, after unlocking: its writes to device memory stay its own. */
void cddp__emu_mem_lock(cddp__emu_mem *m);
void cddp__emu_mem_unlock(cddp__emu_mem *m);
void cddp__emu_mem_private(cddp__emu_mem *m);

/* ---- queue.c ------------------------------------------------------------------------------- */

typedef struct cddp__emu_queue cddp__emu_queue;
typedef void (*cddp__emu_fn)(void *arg);

/* A queue and its thread. NULL with err on failure. */
cddp__emu_queue *cddp__emu_queue_create(const char *name, cddp_error *err);
/* In a forked child (the parent's thread is not there, and everything queued before the fork has
 * run): a new thread for q, its marks going on from where they were. */
void cddp__emu_queue_respawn(cddp__emu_queue *q);
/* Runs what was queued, then ends the thread. Accepts NULL. */
void cddp__emu_queue_destroy(cddp__emu_queue *q);
/* Queues fn(arg) and returns; fn runs on the queue's thread after everything queued before it,
 * and frees arg when it is the owner's. */
void cddp__emu_queue_push(cddp__emu_queue *q, cddp__emu_fn fn, void *arg);
/* Waits until everything queued so far has run. */
void cddp__emu_queue_wait(cddp__emu_queue *q);
/* A mark: how many tasks were queued so far; and waiting until that many have run. */
uint64_t cddp__emu_queue_mark(cddp__emu_queue *q);
void cddp__emu_queue_wait_mark(cddp__emu_queue *q, uint64_t mark);
/* Whether that many have run (the host does not wait). */
bool cddp__emu_queue_ran(cddp__emu_queue *q, uint64_t mark);
/* Called by a task on q's thread: returns once a wait on q waits for this task (or a later one),
 * the queue is being destroyed, or max_s has passed. */
void cddp__emu_queue_hold(cddp__emu_queue *q, double max_s);

#endif
