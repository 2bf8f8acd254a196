/* device.c: the CPU device: this process's memory, the calling thread as its queue (every call
 * has finished when it returns, so there is nothing to wait for), and its kernel table. */
#include "tensor/cpu/dnnl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *cpu_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    void *p = cddp_aligned_alloc(bytes ? bytes : 1);
    if (!p) cddp_error_set(err, CDDP_ENOMEM, "%s: cannot allocate %zu MiB", dev->name, bytes >> 20);
    return p;
}

static void cpu_free(cddp_device *dev, void *p) {
    (void)dev;
    cddp_aligned_free(p);
}

static int cpu_copy(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                    cddp_error *err) {
    (void)dev, (void)queue, (void)err;
    memmove(dst, src, n);
    return CDDP_OK;
}

static int cpu_memset(cddp_device *dev, void *queue, void *dst, int byte, size_t n,
                      cddp_error *err) {
    (void)dev, (void)queue, (void)err;
    memset(dst, byte, n);
    return CDDP_OK;
}

/* The whole pages inside [p, p + n) go back to the system, the bytes at the ends are set to zero.
 * A shared mapping (the group's shared memory) loses its pages by a hole punched in its file
 * (MADV_REMOVE, which a private mapping refuses); a private one by MADV_DONTNEED, after which its
 * pages read as zero. Where neither applies (page-locked memory), a memset. */
static int cpu_release(cddp_device *dev, void *p, size_t n, cddp_error *err) {
    (void)dev, (void)err;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p, hi = lo + n;
    uintptr_t a = (lo + page - 1) & ~(page - 1), b = hi & ~(page - 1);
    if (a >= b) {
        memset(p, 0, n);
        return CDDP_OK;
    }
    memset(p, 0, a - lo);
    memset((void *)b, 0, hi - b);
    if (madvise((void *)a, b - a, MADV_REMOVE) == 0) return CDDP_OK;
    if (madvise((void *)a, b - a, MADV_DONTNEED) != 0) {
        memset((void *)a, 0, b - a);
        return CDDP_OK;
    }
    /* What is released is written again soon (the next backward): in huge pages where the system
     * has them, one fault a 2 MiB instead of one a 4 KiB */
    madvise((void *)a, b - a, MADV_HUGEPAGE);
    return CDDP_OK;
}

static int cpu_synchronize(cddp_device *dev, void *queue, cddp_error *err) {
    (void)dev, (void)queue, (void)err;
    return CDDP_OK;
}

/* The CPU's events: its work has run when a call returns, so every event is always done. */
static char cpu_event;

static void *cpu_event_create(cddp_device *dev, cddp_error *err) {
    (void)dev, (void)err;
    return &cpu_event;
}

static void cpu_event_destroy(cddp_device *dev, void *ev) {
    (void)dev, (void)ev;
}

static int cpu_event_record(cddp_device *dev, void *queue, void *ev, cddp_error *err) {
    (void)dev, (void)queue, (void)ev, (void)err;
    return CDDP_OK;
}

static int cpu_event_synchronize(cddp_device *dev, void *ev, cddp_error *err) {
    (void)dev, (void)ev, (void)err;
    return CDDP_OK;
}

static const cddp__device_ops ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .release = cpu_release,
    .synchronize = cpu_synchronize,
    .download_async = cpu_copy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_synchronize = cpu_event_synchronize,
};

int cddp__cpu_blocked_size(void) {
    return cddp__dnnl_block();
}

static const cddp__kernels kernels = {
#define CDDP__CPU_SLOT(name) .name = cddp__cpu_##name,
    CDDP_KERNEL_LIST(CDDP__CPU_SLOT)
#undef CDDP__CPU_SLOT
        CDDP__CPU_QUESTIONS,
    .attends_by_rows = cddp__cpu_attends_by_rows,
};

static cddp_device cpu = {
    .name = "cpu",
    .kind = CDDP_DEVICE_CPU,
    .index = 0,
    .host_access = true,
    .in_order = true,
    .ops = &ops,
    .k = &kernels,
};

static int cpu_count(cddp_error *err) {
    (void)err;
    return 1;
}

static pthread_once_t described = PTHREAD_ONCE_INIT;

static void describe(void) {
    snprintf(cpu.describe, sizeof cpu.describe,
             "cpu: this process's memory, %d cores (oneDNN, OpenBLAS)", cddp_num_cores());
}

static cddp_device *cpu_open(int index, cddp_error *err) {
    (void)err;
    if (index != 0) return NULL;
    pthread_once(&described, describe);
    return &cpu;
}

const cddp__device_kind_ops cddp__cpu_kind = {"cpu", CDDP_DEVICE_CPU, cpu_count, cpu_open};
