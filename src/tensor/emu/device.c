/* device.c: the emulated device, CI's stand-in for a GPU: the CPU's kernels, run later on a queue
 * thread of the device's own, on memory the host cannot touch (emu.h).
 *
 * Each kernel call is copied onto the queue with its device pointers moved to where the queue
 * thread reaches the same memory; scratch a kernel asks for comes from its context's arena (made
 * of device memory) and is moved alike. So a program that reads device memory on the host, reads
 * a result before the work that makes it has run, or forgets a copy, faults or reads NaNs on this
 * device, where the CPU would have let it pass. Copies to the device take the host's data at
 * once (the host may reuse its buffer when the call returns); copies to the host wait for the
 * queue. Freeing memory waits for the queue too, as cudaFree does.
 *
 * A process that forks keeps its devices in the child (a test that checks an abort in a child):
 * the child gets a queue thread of its own, and its writes to device memory stay its own. What was
 * queued before the fork has run by then (the fork waits for every queue). */
#include "tensor/cpu/cpu.h"
#include "tensor/emu/emu.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_EMU    8
#define MAX_QUEUES 16 /* queues of their own (cddp_queue_create) per device */

typedef struct emu {
    cddp_device dev;
    cddp__emu_mem *mem;
    cddp__emu_queue *queue;             /* the default queue: kernels and contexts' copies */
    cddp__emu_queue *extra[MAX_QUEUES]; /* the others, under `lock` */
    /* set once, by a queue's wait for another process's event that process ended before
     * recording: every later wait of the host reports it */
    atomic_bool lost;
    char lost_msg[160];
} emu;

static emu *of(const cddp_device *dev) {
    return dev->impl;
}

/* The queue a call names: its own, or the device's default one (NULL). */
static cddp__emu_queue *queue_of(const cddp_device *dev, void *queue) {
    return queue ? queue : of(dev)->queue;
}

/* A host wait's end: CDDP_OK, or the device's latched loss of another process's event. */
static int still_whole(const cddp_device *dev, cddp_error *err) {
    const emu *e = of(dev);
    if (!atomic_load(&e->lost)) return CDDP_OK;
    return cddp_error_set(err, CDDP_EIO, "%s", e->lost_msg);
}

/* ---- kernels ------------------------------------------------------------------------------- */

/* A kernel call on the queue: the CPU kernel, the caller's kq (for scratch and failures), and a
 * copy of the arguments. */
typedef struct kcall {
    void (*fn)(cddp__kq *q, const void *a);
    cddp__kq caller;
    max_align_t args[];
} kcall;

/* Scratch for a kernel on the queue thread: the caller's, where this thread reaches it. */
static void *queue_scratch(cddp__kq *q, size_t bytes) {
    kcall *c = q->user;
    void *p = cddp__kq_scratch(&c->caller, bytes);
    return p ? cddp__emu_mem_reach(of(q->dev)->mem, p) : NULL;
}

static void queue_fail(cddp__kq *q, int code, const char *msg) {
    kcall *c = q->user;
    cddp__kq_fail(&c->caller, code, "%s", msg);
}

static void run_kcall(void *arg) {
    kcall *c = arg;
    cddp__kq q = {.dev = c->caller.dev, .scratch = queue_scratch, .fail = queue_fail, .user = c};
    c->fn(&q, c->args);
    cddp_free(c);
}

/* Whether an argument is a pointer (which may be device memory: moved where the thread reaches
 * it) or a value. Every argument type of kernels.h must be one or the other (the compiler checks):
 * a new pointer type must join IS_POINTER, or the queue thread would be handed the host's view. */
#define IS_POINTER(x)                                                                              \
    _Generic((x), void * : 1, const void * : 1, void ** : 1, float * : 1, const float * : 1,       \
             double * : 1, int32_t * : 1, const int32_t * : 1, int64_t * : 1, const int64_t * : 1, \
             uint16_t * : 1, const uint16_t * : 1, default : 0)
#define IS_VALUE(x)                                                                                \
    _Generic((x), bool : 1, int : 1, int64_t : 1, uint64_t : 1, float : 1,                         \
             const char * : 1, /* a message's format: host memory, read by the kernel as it is */  \
             cddp_dtype : 1, cddp__binop : 1, cddp__unop : 1, cddp__bcast : 1,                     \
             cddp__conv_geom : 1, cddp_sgd_hparams : 1, cddp_adamw_hparams : 1,                    \
             cddp_lion_hparams : 1, default : 0)

static void reach_slot(const cddp__emu_mem *m, void *slot) {
    void *p;
    memcpy(&p, slot, sizeof p);
    p = cddp__emu_mem_reach(m, p);
    memcpy(slot, &p, sizeof p);
}

#define REACH(type, name)                                                                          \
    _Static_assert(IS_POINTER(a->name) + IS_VALUE(a->name) == 1,                                   \
                   "kernel argument " #name ": add its type to IS_POINTER or IS_VALUE");           \
    if (IS_POINTER(a->name) && sizeof a->name == sizeof(void *)) reach_slot(m, &a->name);

#define EMU_KERNEL(name)                                                                           \
    static void cpu_##name(cddp__kq *q, const void *a) {                                           \
        cddp__cpu_##name(q, a);                                                                    \
    }                                                                                              \
    static void emu_##name(cddp__kq *q, const cddp__k_##name *in) {                                \
        kcall *c = cddp_malloc(sizeof *c + sizeof *in);                                            \
        CDDP_CHECK(c, "emu: out of memory for a kernel call");                                     \
        c->fn = cpu_##name;                                                                        \
        c->caller = *q;                                                                            \
        cddp__k_##name *a = (cddp__k_##name *)(void *)c->args;                                     \
        *a = *in;                                                                                  \
        const cddp__emu_mem *m = of(q->dev)->mem;                                                  \
        CDDP__KA_##name(REACH) cddp__emu_queue_push(queue_of(q->dev, q->queue), run_kcall, c);     \
    }
CDDP_KERNEL_LIST(EMU_KERNEL)
#undef EMU_KERNEL

static const cddp__kernels kernels = {
#define EMU_SLOT(name) .name = emu_##name,
    CDDP_KERNEL_LIST(EMU_SLOT)
#undef EMU_SLOT
        CDDP__CPU_QUESTIONS,
    /* where the CUDA device would attend by rows, so does this stand-in for it */
    .attends_by_rows = cddp__gpu_attends_by_rows,
};

/* ---- memory and copies --------------------------------------------------------------------- */

static void *emu_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    return cddp__emu_mem_alloc(of(dev)->mem, bytes, err);
}

static void emu_free(cddp_device *dev, void *p) {
    cddp__emu_queue_wait(of(dev)->queue); /* nothing queued may still use it */
    cddp__emu_mem_free(of(dev)->mem, p);
}

/* Aborts unless [p, p + n) is this device's memory: a host pointer given as device memory is a
 * programmer's error that a GPU would answer with a fault. */
static void need_device(const cddp_device *dev, const char *what, const void *p, size_t n) {
    const cddp__emu_mem *m = of(dev)->mem;
    CDDP_CHECK(cddp__emu_mem_owns(m, p) &&
                   (n == 0 || cddp__emu_mem_owns(m, (const char *)p + n - 1)),
               "%s on %s: %p is not memory of the device (a host pointer where device memory was "
               "expected?)",
               what, dev->name, p);
}

/* How long a queued copy that nobody waits for is held back: a bound, for a program that never
 * waits (it would read stale data), not a delay a correct program sees (its wait releases it). */
#define LATE_S 0.2

typedef struct copy_task {
    void *dst;
    const void *src;
    size_t n;
    int byte;  /* for a fill */
    bool fill; /* memset, not memcpy */
    bool late; /* a queued upload or download: held until a wait asks for it (at most LATE_S), so
                * that a read without the wait reads NaNs (on the device) or stale data (on the
                * host), however late the reader runs */
    cddp__emu_queue *q; /* the queue it runs on */
    void *own;          /* freed after the copy (a staging copy of the host's data) */
} copy_task;

static void run_copy(void *arg) {
    copy_task *t = arg;
    if (t->late) cddp__emu_queue_hold(t->q, LATE_S);
    if (t->fill)
        memset(t->dst, t->byte, t->n);
    else
        memmove(t->dst, t->src, t->n);
    cddp_free(t->own);
    cddp_free(t);
}

static int push_copy(cddp_device *dev, void *queue, copy_task t, cddp_error *err) {
    copy_task *c = cddp_malloc(sizeof *c);
    if (!c) {
        cddp_free(t.own);
        return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for a copy", dev->name);
    }
    *c = t;
    c->q = queue_of(dev, queue);
    cddp__emu_queue_push(c->q, run_copy, c);
    return CDDP_OK;
}

static int emu_upload(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                      cddp_error *err) {
    need_device(dev, "a copy to the device", dst, n);
    void *stage = cddp_malloc(n);
    if (!stage) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for a copy", dev->name);
    memcpy(stage, src, n);
    return push_copy(
        dev, queue,
        (copy_task){
            .dst = cddp__emu_mem_reach(of(dev)->mem, dst), .src = stage, .n = n, .own = stage},
        err);
}

static int emu_download(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                        cddp_error *err) {
    need_device(dev, "a copy to the host", src, n);
    CDDP_TRY(push_copy(
        dev, queue, (copy_task){.dst = dst, .src = cddp__emu_mem_reach(of(dev)->mem, src), .n = n},
        err));
    cddp__emu_queue_wait(queue_of(dev, queue));
    return still_whole(dev, err);
}

/* A queued download writes the host's dst when it runs (when waited for: LATE_S): whoever reads dst
 * must wait until an event recorded after it is done, or reads what was there before. */
static int emu_download_async(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                              cddp_error *err) {
    need_device(dev, "a copy to the host", src, n);
    return push_copy(
        dev, queue,
        (copy_task){
            .dst = dst, .src = cddp__emu_mem_reach(of(dev)->mem, src), .n = n, .late = true},
        err);
}

/* A queued upload reads the host's data when it runs (when waited for: LATE_S): the caller must
 * leave src alone, and whoever reads dst must wait, until an event recorded after it is done. */
static int emu_upload_async(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                            cddp_error *err) {
    need_device(dev, "a copy to the device", dst, n);
    return push_copy(
        dev, queue,
        (copy_task){
            .dst = cddp__emu_mem_reach(of(dev)->mem, dst), .src = src, .n = n, .late = true},
        err);
}

/* An event is a mark in a queue: done once that queue has run that many tasks (a queue's counter
 * only grows, in a forked child too). A shared event (cddp_event_create_shared) is two counters
 * in a memory file other processes map: how many records were made, and how many of them their
 * queue has run; a wait waits for the records made before it. */
typedef struct shared_ev {
    _Atomic uint64_t recorded, done;
} shared_ev;

typedef struct emu_event {
    cddp__emu_queue *q; /* NULL until recorded: done */
    uint64_t mark;
    shared_ev *s; /* shared: the counters (then q and mark are unused) */
    int fd;       /* shared and made here: the counters' memory file */
    int pid;      /* shared: the process that made it */
} emu_event;

static void *emu_event_create(cddp_device *dev, cddp_error *err) {
    emu_event *e = cddp_calloc(1, sizeof *e);
    if (!e) cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for an event", dev->name);
    if (e) e->fd = -1;
    return e;
}

static void emu_event_destroy(cddp_device *dev, void *ev) {
    emu_event *e = ev;
    if (e->s) {
        cddp__emu_queue_wait(of(dev)->queue); /* its record's task may still be queued */
        munmap(e->s, sizeof *e->s);
    }
    if (e->fd >= 0) close(e->fd);
    cddp_free(ev);
}

typedef struct shared_task {
    emu *dev;
    shared_ev *s;
    uint64_t gen;
    int pid;
} shared_task;

static void run_shared_record(void *arg) {
    shared_task *t = arg;
    /* the largest record run: a record on another queue may run before an earlier one here */
    uint64_t was = atomic_load(&t->s->done);
    while (was < t->gen && !atomic_compare_exchange_weak(&t->s->done, &was, t->gen)) {}
    cddp_free(t);
}

/* Waits until the shared event's queue has run record gen; false (the device's loss latched) when
 * the process that records it ended first. */
static bool await_shared(emu *dev, const shared_ev *s, uint64_t gen, int pid) {
    for (long spins = 0; atomic_load(&s->done) < gen; spins++) {
        if (spins < 200) {
            sched_yield();
            continue;
        }
        if (spins % 256 == 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH &&
            atomic_load(&s->done) < gen) {
            if (!atomic_exchange(&dev->lost, true))
                snprintf(dev->lost_msg, sizeof dev->lost_msg,
                         "%s: waited for an event of process %d, which ended before its work "
                         "was done (a peer that died)",
                         dev->dev.name, pid);
            cddp_log(CDDP_LOG_ERROR, "device", "%s", dev->lost_msg);
            return false;
        }
        nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
    }
    return true;
}

static void run_shared_wait(void *arg) {
    shared_task *t = arg;
    await_shared(t->dev, t->s, t->gen, t->pid);
    cddp_free(t);
}

static int push_shared(cddp_device *dev, void *queue, const emu_event *e, uint64_t gen,
                       cddp__emu_fn fn, cddp_error *err) {
    shared_task *t = cddp_malloc(sizeof *t);
    if (!t) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for an event", dev->name);
    *t = (shared_task){of(dev), e->s, gen, e->pid};
    cddp__emu_queue_push(queue_of(dev, queue), fn, t);
    return CDDP_OK;
}

static int emu_event_record(cddp_device *dev, void *queue, void *ev, cddp_error *err) {
    emu_event *e = ev;
    if (e->s)
        return push_shared(dev, queue, e, atomic_fetch_add(&e->s->recorded, 1) + 1,
                           run_shared_record, err);
    e->q = queue_of(dev, queue);
    e->mark = cddp__emu_queue_mark(e->q);
    return CDDP_OK;
}

static int emu_event_synchronize(cddp_device *dev, void *ev, cddp_error *err) {
    emu_event *e = ev;
    if (e->s)
        await_shared(of(dev), e->s, atomic_load(&e->s->recorded), e->pid);
    else if (e->q)
        cddp__emu_queue_wait_mark(e->q, e->mark);
    return still_whole(dev, err);
}

static int emu_event_query(cddp_device *dev, void *ev, bool *done, cddp_error *err) {
    const emu_event *e = ev;
    *done = e->s   ? atomic_load(&e->s->done) >= atomic_load(&e->s->recorded)
            : e->q ? cddp__emu_queue_ran(e->q, e->mark)
                   : true;
    return still_whole(dev, err);
}

/* A task on one queue that waits for a mark of another. */
static void run_wait(void *arg) {
    emu_event *e = arg;
    cddp__emu_queue_wait_mark(e->q, e->mark);
    cddp_free(e);
}

static int emu_queue_wait(cddp_device *dev, void *queue, void *ev, cddp_error *err) {
    const emu_event *e = ev;
    cddp__emu_queue *q = queue_of(dev, queue);
    if (e->s) { /* the records made so far, as cudaStreamWaitEvent on an IPC event */
        uint64_t gen = atomic_load(&e->s->recorded);
        return gen ? push_shared(dev, queue, e, gen, run_shared_wait, err) : CDDP_OK;
    }
    if (!e->q || e->q == q) return CDDP_OK; /* a queue runs in order anyway */
    emu_event *copy =
        cddp_malloc(sizeof *copy); /* the mark as it is now: ev may be recorded again */
    if (!copy) return cddp_error_set(err, CDDP_ENOMEM, "%s: out of memory for a wait", dev->name);
    *copy = *e;
    cddp__emu_queue_push(q, run_wait, copy);
    return CDDP_OK;
}

/* ---- shared with other processes (what CUDA IPC does on a GPU) ------------------------------ */

/* A handle's payload (device.c writes and checks the rest, the exporting process among it): its
 * memory file, and an allocation's place in it (an event's file holds the event alone). */
typedef struct emu_handle {
    int32_t fd;
    uint64_t at, size;
} emu_handle;

_Static_assert(sizeof(emu_handle) <= CDDP__IPC_PAYLOAD, "an emu handle fits a cddp_ipc_handle");

static int emu_ipc_export(cddp_device *dev, void *p, unsigned char *payload, cddp_error *err) {
    emu_handle h;
    int fd;
    size_t at, size;
    if (cddp__emu_mem_extent(of(dev)->mem, p, &fd, &at, &size) != 0)
        return cddp_error_set(err, CDDP_EINVAL,
                              "%s: %p is not where an allocation of the device starts (export what "
                              "cddp_device_alloc returned)",
                              dev->name, p);
    h = (emu_handle){fd, at, size};
    memcpy(payload, &h, sizeof h);
    return CDDP_OK;
}

static void *emu_ipc_open(cddp_device *dev, const unsigned char *payload, int pid,
                          cddp_error *err) {
    emu_handle h;
    memcpy(&h, payload, sizeof h);
    return cddp__emu_mem_import(of(dev)->mem, pid, h.fd, h.at, h.size, err);
}

/* Closing waits until nothing queued on any of the device's queues may still read it. */
static void drain(emu *e);

static void emu_ipc_close(cddp_device *dev, void *p) {
    drain(of(dev));
    cddp__emu_mem_unimport(of(dev)->mem, p);
}

static void *emu_ipc_event_create(cddp_device *dev, unsigned char *payload, cddp_error *err) {
    emu_event *e = emu_event_create(dev, err);
    if (!e) return NULL;
    int fd = memfd_create("cddp-emu-event", MFD_CLOEXEC);
    void *s = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, sizeof(shared_ev)) == 0)
        s = mmap(NULL, sizeof(shared_ev), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED) {
        cddp_error_set(err, CDDP_ENOMEM, "%s: cannot make a shared event: %s", dev->name,
                       strerror(errno));
        if (fd >= 0) close(fd);
        cddp_free(e);
        return NULL;
    }
    e->s = s, e->fd = fd, e->pid = getpid();
    emu_handle h = {fd, 0, sizeof(shared_ev)};
    memcpy(payload, &h, sizeof h);
    return e;
}

static void *emu_ipc_event_open(cddp_device *dev, const unsigned char *payload, int pid,
                                cddp_error *err) {
    emu_handle h;
    memcpy(&h, payload, sizeof h);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    void *s = fd < 0 ? MAP_FAILED
                     : mmap(NULL, sizeof(shared_ev), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    if (fd >= 0) close(fd);
    if (s == MAP_FAILED) {
        cddp_error_set(err, CDDP_ENOENT,
                       "%s: cannot open process %d's event (%s): %s (has it ended?)", dev->name,
                       pid, path, strerror(e));
        return NULL;
    }
    emu_event *ev = emu_event_create(dev, err);
    if (!ev) {
        munmap(s, sizeof(shared_ev));
        return NULL;
    }
    ev->s = s, ev->pid = pid;
    return ev;
}

static void *emu_queue_create(cddp_device *dev, bool first, cddp_error *err);
static void emu_queue_destroy(cddp_device *dev, void *queue);

static int emu_copy(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                    cddp_error *err) {
    need_device(dev, "a copy within the device", dst, n);
    need_device(dev, "a copy within the device", src, n);
    const cddp__emu_mem *m = of(dev)->mem;
    return push_copy(
        dev, queue,
        (copy_task){.dst = cddp__emu_mem_reach(m, dst), .src = cddp__emu_mem_reach(m, src), .n = n},
        err);
}

static int emu_memset(cddp_device *dev, void *queue, void *dst, int byte, size_t n,
                      cddp_error *err) {
    need_device(dev, "a fill", dst, n);
    return push_copy(
        dev, queue,
        (copy_task){
            .dst = cddp__emu_mem_reach(of(dev)->mem, dst), .n = n, .byte = byte, .fill = true},
        err);
}

static int emu_synchronize(cddp_device *dev, void *queue, cddp_error *err) {
    cddp__emu_queue_wait(queue_of(dev, queue));
    return still_whole(dev, err);
}

static void emu_scrub(cddp_device *dev, void *p, size_t n) {
    emu_memset(dev, NULL, p, 0xff, n, NULL);
}

static const cddp__device_ops ops = {
    .alloc = emu_alloc,
    .free = emu_free,
    .upload = emu_upload,
    .download = emu_download,
    .copy = emu_copy,
    .memset = emu_memset,
    .synchronize = emu_synchronize,
    .download_async = emu_download_async,
    .event_create = emu_event_create,
    .event_destroy = emu_event_destroy,
    .event_record = emu_event_record,
    .event_synchronize = emu_event_synchronize,
    .event_query = emu_event_query,
    .scrub = emu_scrub,
    .queue_create = emu_queue_create,
    .queue_destroy = emu_queue_destroy,
    .upload_async = emu_upload_async,
    .queue_wait = emu_queue_wait,
    .ipc_export = emu_ipc_export,
    .ipc_open = emu_ipc_open,
    .ipc_close = emu_ipc_close,
    .ipc_event_create = emu_ipc_event_create,
    .ipc_event_open = emu_ipc_event_open,
};

/* ---- the kind ------------------------------------------------------------------------------ */

static emu *devices[MAX_EMU];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *emu_queue_create(cddp_device *dev, bool first, cddp_error *err) {
    (void)first; /* one thread a queue: none goes first */
    emu *e = of(dev);
    pthread_mutex_lock(&lock);
    int k = 0;
    while (k < MAX_QUEUES && e->extra[k]) k++;
    cddp__emu_queue *q = NULL;
    if (k == MAX_QUEUES)
        cddp_error_set(err, CDDP_ENOMEM, "%s: at most %d queues besides the default one", dev->name,
                       MAX_QUEUES);
    else if ((q = cddp__emu_queue_create(dev->name, err)))
        e->extra[k] = q;
    pthread_mutex_unlock(&lock);
    return q;
}

static void emu_queue_destroy(cddp_device *dev, void *queue) {
    emu *e = of(dev);
    pthread_mutex_lock(&lock);
    for (int k = 0; k < MAX_QUEUES; k++)
        if (e->extra[k] == queue) e->extra[k] = NULL;
    pthread_mutex_unlock(&lock);
    cddp__emu_queue_destroy(queue);
}

static void drain(emu *e) {
    pthread_mutex_lock(&lock);
    cddp__emu_queue_wait(e->queue);
    for (int k = 0; k < MAX_QUEUES; k++)
        if (e->extra[k]) cddp__emu_queue_wait(e->extra[k]);
    pthread_mutex_unlock(&lock);
}

/* fork(): every queue drained and every allocator locked before, unlocked after; in the child
 * each queue has a new thread (the parent's are not there) and each device private memory. */
static void before_fork(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_EMU; i++)
        if (devices[i]) {
            cddp__emu_queue_wait(devices[i]->queue);
            for (int k = 0; k < MAX_QUEUES; k++)
                if (devices[i]->extra[k]) cddp__emu_queue_wait(devices[i]->extra[k]);
            cddp__emu_mem_lock(devices[i]->mem);
        }
}

static void after_fork_parent(void) {
    for (int i = 0; i < MAX_EMU; i++)
        if (devices[i]) cddp__emu_mem_unlock(devices[i]->mem);
    pthread_mutex_unlock(&lock);
}

static void after_fork_child(void) {
    for (int i = 0; i < MAX_EMU; i++) {
        emu *e = devices[i];
        if (!e) continue;
        cddp__emu_mem_unlock(e->mem);
        cddp__emu_mem_private(e->mem);
        cddp__emu_queue_respawn(e->queue);
        for (int k = 0; k < MAX_QUEUES; k++)
            if (e->extra[k]) cddp__emu_queue_respawn(e->extra[k]);
    }
    pthread_mutex_unlock(&lock);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void watch_forks(void) {
    CDDP_CHECK(pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0,
               "emu: cannot register the fork handlers");
}

static int emu_count(cddp_error *err) {
    (void)err;
    return (int)CDDP_MIN(cddp_knob_int(CDDP_KNOB_EMU_DEVICES), MAX_EMU);
}

static cddp_device *emu_open(int index, cddp_error *err) {
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&lock);
    emu *e = devices[index];
    if (!e && (e = cddp_calloc(1, sizeof *e))) {
        size_t mb = (size_t)cddp_knob_int(CDDP_KNOB_EMU_MB);
        snprintf(e->dev.name, sizeof e->dev.name, "emu:%d", index);
        e->mem = cddp__emu_mem_create(mb << 20, err);
        e->queue = e->mem ? cddp__emu_queue_create(e->dev.name, err) : NULL;
        if (!e->queue) {
            cddp__emu_mem_destroy(e->mem);
            cddp_free(e);
            e = NULL;
        } else {
            e->dev.kind = CDDP_DEVICE_EMU;
            e->dev.index = index;
            e->dev.ops = &ops;
            e->dev.k = &kernels;
            e->dev.impl = e;
            e->dev.memory = mb << 20;
            snprintf(e->dev.describe, sizeof e->dev.describe,
                     "%s: emulated, the CPU's kernels on a queue thread, %zu MiB of device memory "
                     "the host cannot touch",
                     e->dev.name, mb);
            devices[index] = e;
        }
    } else if (!e) {
        cddp_error_set(err, CDDP_ENOMEM, "emu: out of memory");
    }
    pthread_mutex_unlock(&lock);
    return e ? &e->dev : NULL;
}

const cddp__device_kind_ops cddp__emu_kind = {"emu", CDDP_DEVICE_EMU, emu_count, emu_open};
