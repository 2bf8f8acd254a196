/* cddp/device.h: where tensors live and ops run.
 *
 * Every tensor is on a device (tensor->device), and an op runs on the device of its inputs, which
 * must all be on one (an op given tensors of two devices aborts, naming both). A context has a
 * device (cddp_ctx_options.device; the CPU by default): the tensors it creates live there, and
 * cddp_to copies a tensor to another device, differentiably.
 *
 * The devices, by the names cddp_device_get takes:
 *
 *   cpu      this process's memory; ops run at once, on the calling thread (oneDNN, OpenBLAS and
 *            cddp's vectorised loops). The host reads and writes its tensors directly.
 *   emu      an emulated accelerator, for testing code meant for GPUs on machines without one:
 *            the CPU's kernels run later, in order, on a queue thread of the device's own, on
 *            memory the host cannot touch (a host read or write faults) and that holds NaNs until
 *            written (fresh memory, and a context's arena after every reset), so a missing copy,
 *            a missing wait or a host read of device memory fails visibly. "emu:1" is a second
 *            such device (CDDP_EMU_DEVICES, CDDP_EMU_MB).
 *
 * On a device that queues its work, an op returns before its kernel has run, and the host waits
 * only where it reads a value (cddp_get, cddp_item, a copy to the host) or calls
 * cddp_device_synchronize. Data errors found by a kernel (a label out of range) latch in the
 * context and show in cddp_ctx_status, which waits for the context's work first.
 */
#ifndef CDDP_DEVICE_H
#define CDDP_DEVICE_H

#include "cddp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cddp_device cddp_device;

typedef enum cddp_device_kind {
    CDDP_DEVICE_CPU = 0,
    CDDP_DEVICE_EMU = 1,
    CDDP_DEVICE_CUDA = 2,
} cddp_device_kind;

/* The CPU device (never NULL). */
CDDP_API cddp_device *cddp_device_cpu(void);
/* The device spec names: "cpu", "emu", "emu:N", "cuda", "cuda:N" (N from 0; "cuda" is "cuda:0").
 * The same device for the same name, for the life of the process. NULL, with err saying why, for
 * a name that is not a device, an index out of range, or a kind this build or machine cannot run
 * ("no CUDA device: the driver reports ..."). */
CDDP_API cddp_device *cddp_device_get(const char *spec, cddp_error *err);
/* The device a rank of a data-parallel job works on, for a program's --device option: spec as
 * cddp_device_get takes it, where a kind without an index ("cuda", "emu") names the local rank's
 * device of that kind: LOCAL_RANK (the launcher's; 0 without one) modulo how many of the kind this
 * process sees (torchrun's one process per GPU; CUDA_VISIBLE_DEVICES applies). NULL with err as
 * cddp_device_get. */
CDDP_API cddp_device *cddp_device_for_rank(const char *spec, cddp_error *err);
/* "cpu", "emu:0", "cuda:1": the name cddp_device_get takes back. */
CDDP_API const char *cddp_device_name(const cddp_device *dev);
CDDP_API cddp_device_kind cddp_device_kind_of(const cddp_device *dev);
CDDP_API int cddp_device_index(const cddp_device *dev);
/* Whether the host may read and write the device's memory directly (true for the CPU only). */
CDDP_API bool cddp_device_host_accessible(const cddp_device *dev);
/* One line about the device for logs: its name, model and memory. */
CDDP_API const char *cddp_device_describe(const cddp_device *dev);
/* Which device of the machine it is, whatever a process's numbering: a GPU's PCI address
 * ("0000:65:00.0"; CUDA_VISIBLE_DEVICES may number it cuda:0 in one process and cuda:1 in
 * another), the name for the CPU and the emulated device (every process's emu:0 is one). Two
 * ranks on one host with the same id share the device. */
CDDP_API const char *cddp_device_bus_id(const cddp_device *dev);
/* How many devices of a kind this process can use (0 when none, or the kind is not built). */
CDDP_API int cddp_device_count(cddp_device_kind kind);
/* The device's own queue in its platform's terms, for a library that queues work beside cddp's
 * (NCCL): the cudaStream_t of a CUDA device; NULL where work runs at once (the CPU) or the queue
 * is cddp's own (the emulated device). */
CDDP_API void *cddp_device_native_queue(cddp_device *dev);
/* The platform whose libraries may work on the device's memory and queues: "cuda" for a GPU;
 * NULL where only cddp touches it (the CPU's memory is the host's, the emulated device's its own).
 * A collective library serves the devices of its platform (cddp/dcomm.h). */
CDDP_API const char *cddp_device_platform(const cddp_device *dev);
/* Makes dev the calling thread's current device in its platform's terms (cudaSetDevice), for a
 * library call next that takes the current device (NCCL's communicator); CDDP_OK and nothing
 * where there is no such thing. */
CDDP_API int cddp_device_make_current(cddp_device *dev, cddp_error *err);
/* Waits until every piece of work queued on the device has run. CDDP_OK, or the device's failure
 * (err says what). */
CDDP_API int cddp_device_synchronize(cddp_device *dev, cddp_error *err);

/* Memory of a device, for programs that move their own data (a loader's batches). Allocation is
 * 64-byte aligned; NULL with err on failure. Copies are ordered with the device's work: a copy to
 * the device returns once src may be reused, a copy to the host once dst holds the data (after the
 * work queued before it). */
CDDP_API void *cddp_device_alloc(cddp_device *dev, size_t bytes, cddp_error *err);
CDDP_API void cddp_device_free(cddp_device *dev, void *p); /* accepts NULL */
CDDP_API int cddp_device_upload(cddp_device *dev, void *dst, const void *src, size_t bytes,
                                cddp_error *err);
CDDP_API int cddp_device_download(cddp_device *dev, void *dst, const void *src, size_t bytes,
                                  cddp_error *err);
/* Copies between two places of one device's memory, or sets bytes of it (ordered, not waited). */
CDDP_API int cddp_device_copy(cddp_device *dev, void *dst, const void *src, size_t bytes,
                              cddp_error *err);
CDDP_API int cddp_device_memset(cddp_device *dev, void *dst, int byte, size_t bytes,
                                cddp_error *err);

/* A copy to the host that is queued, not waited for: dst holds the data once an event recorded
 * after it is done (cddp_event_synchronize). On the CPU it is done when the call returns. */
CDDP_API int cddp_device_download_async(cddp_device *dev, void *dst, const void *src, size_t bytes,
                                        cddp_error *err);
/* A copy to the device that is queued, not waited for: src must stay unchanged until an event
 * recorded after it is done (from cddp_device_host_alloc memory it then runs while the host goes
 * on; cddp_device_upload from such memory waits for it). On the CPU it is done when the call
 * returns. */
CDDP_API int cddp_device_upload_async(cddp_device *dev, void *dst, const void *src, size_t bytes,
                                      cddp_error *err);

/* Events: a point in the device's queue. Record one after some work, and whoever must not go on
 * before that work has run (a thread that reads what it wrote) synchronizes with it. An event is
 * done as soon as it is made, and again after every record once the work before it has run.
 * cddp_event_record records on the device's default queue (cddp_queue_record: on another). */
typedef struct cddp_event cddp_event;
CDDP_API cddp_event *cddp_event_create(cddp_device *dev, cddp_error *err);
CDDP_API void cddp_event_destroy(cddp_event *ev); /* accepts NULL */
CDDP_API int cddp_event_record(cddp_event *ev, cddp_error *err);
/* Waits until the work queued before the last record has run. */
CDDP_API int cddp_event_synchronize(cddp_event *ev, cddp_error *err);
/* Whether that work has run (*done), without waiting: for a watchdog that must never block on a
 * device a dead peer's work may hold for ever. CDDP_OK, or the device's failure. */
CDDP_API int cddp_event_query(cddp_event *ev, bool *done, cddp_error *err);

/* Host memory the device copies from and to directly: page-locked on a GPU (so that a queued copy
 * runs while the host goes on, as PyTorch's pin_memory), plain memory elsewhere. 64-byte aligned;
 * NULL with err on failure. Free it with the same device. */
CDDP_API void *cddp_device_host_alloc(cddp_device *dev, size_t bytes, cddp_error *err);
CDDP_API void cddp_device_host_free(cddp_device *dev, void *p); /* accepts NULL */
/* Host memory of one's own (malloc's, shared memory) made page-locked as cddp_device_host_alloc's
 * is, until cddp_device_host_unregister (before it is freed). CDDP_OK, also where copies need no
 * such memory (the CPU, the emulated device); else err says why and the memory stays as it was,
 * its copies working as before, only not beside the host. */
CDDP_API int cddp_device_host_register(cddp_device *dev, void *p, size_t bytes, cddp_error *err);
CDDP_API void cddp_device_host_unregister(cddp_device *dev, void *p); /* accepts NULL */

/* A queue of one's own on a device (a second CUDA stream): its work runs in order, beside the
 * device's default queue, where contexts' work runs, so that a loader's copies overlap the
 * training step. Events order the two: record one on a queue after some work, and make another
 * queue (or the default one, cddp_device_wait_event) wait for it; the host waits for none of it.
 * On the CPU, whose work runs when it is called, all of this is done at once. */
typedef struct cddp_queue cddp_queue;
CDDP_API cddp_queue *cddp_queue_create(cddp_device *dev, cddp_error *err);
/* A queue whose work the device takes before the other queues' when both wait (a CUDA stream of
 * the highest priority): for collectives the rest of a step waits on. */
CDDP_API cddp_queue *cddp_queue_create_first(cddp_device *dev, cddp_error *err);
/* q in its platform's terms (its cudaStream_t), as cddp_device_native_queue: NULL where work runs
 * at once (the CPU) or the queue is cddp's own (the emulated device). */
CDDP_API void *cddp_queue_native(cddp_queue *q);
/* Waits for the queue's work, then ends it. Accepts NULL. */
CDDP_API void cddp_queue_destroy(cddp_queue *q);
CDDP_API cddp_device *cddp_queue_device(const cddp_queue *q);
/* A copy to the device queued on q: src must stay unchanged, and dst holds the data, once an event
 * recorded on q after it is done. From cddp_device_host_alloc memory it runs while the host goes
 * on. */
CDDP_API int cddp_queue_upload(cddp_queue *q, void *dst, const void *src, size_t bytes,
                               cddp_error *err);
/* Records ev after the work queued on q so far (ev of q's device). */
CDDP_API int cddp_queue_record(cddp_queue *q, cddp_event *ev, cddp_error *err);
/* What is queued on q from now on runs after the work before ev's last record. */
CDDP_API int cddp_queue_wait(cddp_queue *q, cddp_event *ev, cddp_error *err);
/* The same for the device's default queue: a context's next ops run after ev's work. */
CDDP_API int cddp_device_wait_event(cddp_device *dev, cddp_event *ev, cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
