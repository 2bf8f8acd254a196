/* tensor/device.h: the compute seam: what a device is to the rest of the tensor module.
 *
 * A device is a few tables (ggml's backends, NCCL's transports): memory and copies, queues with
 * events (cddp__device_ops), and the kernels (cddp__kernels, tensor/kernels.h), plus one entry in
 * the list of device kinds (devices.c). Nothing above asks which device it runs on: an op calls
 * its kernel through the table of its tensors' device, a context allocates from that device's
 * arena, and copies go through the ops.
 *
 * Queues. Work on a device runs in the order it was queued on one of its queues (a CUDA stream; the
 * CPU's is the calling thread, where everything has run by the time a call returns). NULL names
 * the device's default queue, the one contexts use. Events order queues between them and the
 * host.
 *
 *   cpu/   the CPU (oneDNN, OpenBLAS, cddp's vector loops): every other device is tested against
 *          its kernels
 *   emu/   the CPU's kernels run on a queue thread, on memory the host cannot touch (CI's
 *          stand-in for a GPU)
 *   cuda/  NVIDIA GPUs (cuBLASLt, cddp's .cu kernels), when built with the CUDA toolkit
 */
#ifndef CDDP_TENSOR_DEVICE_H
#define CDDP_TENSOR_DEVICE_H

#include "cddp/device.h"
#include "cddp/internal/device.h"
#include "tensor/kernels.h"

/* What a kernel runs with: its device and queue, and where its scratch memory and its failures
 * go (the calling context's arena and error latch; see kernels.h). */
struct cddp__kq {
    cddp_device *dev;
    void *queue; /* the device's queue (NULL: its default) */
    /* scratch: device memory valid until the caller's context resets, NULL when there is none
     * (the failure already reported); fail: records a kernel's failure (the first one counts) */
    void *(*scratch)(cddp__kq *q, size_t bytes);
    void (*fail)(cddp__kq *q, int code, const char *msg);
    void *user;
};

/* Scratch for a kernel: NULL when there is none (the failure reported through q). */
void *cddp__kq_scratch(cddp__kq *q, size_t bytes);
/* Reports a kernel's failure through q, printf-style. */
void cddp__kq_fail(cddp__kq *q, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Causal self-attention and its gradients (the attention and attention_grad kernels' arguments
 * and results) as batched products on q's device's gemm and its causal_softmax and
 * causal_softmax_grad kernels (attn_products.c): for a device whose matrix products are its fastest
 * kernels. */
void cddp__attention_by_products(cddp__kq *q, const cddp__k_attention *a);
void cddp__attention_grad_by_products(cddp__kq *q, const cddp__k_attention_grad *a);

/* Calls kernel `name` of q's device with the designated arguments. */
#define CDDP__K(q, name, ...) ((q)->dev->k->name((q), &(const cddp__k_##name){__VA_ARGS__}))

/* Memory, copies, queues and events. Every call that can fail returns a status and fills err. */
typedef struct cddp__device_ops {
    void *(*alloc)(cddp_device *dev, size_t bytes, cddp_error *err); /* 64-byte aligned */
    void (*free)(cddp_device *dev, void *p);
    /* host -> device: returns once src may be reused; device -> host: once dst holds the data
     * (the queue's earlier work done); within the device, and memset: ordered, not waited */
    int (*upload)(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                  cddp_error *err);
    int (*download)(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                    cddp_error *err);
    int (*copy)(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                cddp_error *err);
    int (*memset)(cddp_device *dev, void *queue, void *dst, int byte, size_t n, cddp_error *err);
    /* the host waits for everything queued on queue */
    int (*synchronize)(cddp_device *dev, void *queue, cddp_error *err);
    /* device -> host, queued: dst holds the data once an event recorded after it is done */
    int (*download_async)(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                          cddp_error *err);
    /* events: a point in a queue's work (record: everything queued on it so far); synchronize:
     * the host waits until that work has run */
    void *(*event_create)(cddp_device *dev, cddp_error *err);
    void (*event_destroy)(cddp_device *dev, void *ev);
    int (*event_record)(cddp_device *dev, void *queue, void *ev, cddp_error *err);
    int (*event_synchronize)(cddp_device *dev, void *ev, cddp_error *err);
    /* whether the work before ev's last record has run (*done), without waiting; NULL: always
     * (a device whose work runs when it is called) */
    int (*event_query)(cddp_device *dev, void *ev, bool *done, cddp_error *err);
    /* may be NULL: marks n bytes at p as holding nothing any more (the emulated device fills them
     * with NaNs, ordered on its default queue): a context's arena at every reset, so that a step
     * never reads what the last one left */
    void (*scrub)(cddp_device *dev, void *p, size_t n);
    /* may be NULL (then a memset to zero): n bytes at p read as zero from now on, and the device
     * may take back the memory behind them until they are written again (the CPU returns the
     * whole pages inside the range to the system): what a sharded gradient drops */
    int (*release)(cddp_device *dev, void *p, size_t n, cddp_error *err);
    /* The rest may be NULL on a device whose work runs at once (the CPU): plain host memory, one
     * queue, copies that are done when they return, nothing to wait for.
     * host_alloc: host memory the device copies from and to directly (page-locked on a GPU, so
     * that a queued copy runs while the host goes on); 64-byte aligned */
    void *(*host_alloc)(cddp_device *dev, size_t bytes, cddp_error *err);
    void (*host_free)(cddp_device *dev, void *p);
    /* host memory of the caller's (malloc's, shared memory) made page-locked as host_alloc's is,
     * and back */
    int (*host_register)(cddp_device *dev, void *p, size_t bytes, cddp_error *err);
    void (*host_unregister)(cddp_device *dev, void *p);
    /* a queue of its own beside the default one (a second CUDA stream; first: one whose work
     * the device takes before the others' when both wait), and its end (after its work has run) */
    void *(*queue_create)(cddp_device *dev, bool first, cddp_error *err);
    void (*queue_destroy)(cddp_device *dev, void *queue);
    /* host -> device, queued: src must stay unchanged, and dst holds the data, once an event
     * recorded after it is done */
    int (*upload_async)(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                        cddp_error *err);
    /* what is queued on queue from now on runs after ev's work (the host does not wait) */
    int (*queue_wait)(cddp_device *dev, void *queue, void *ev, cddp_error *err);
    /* a queue (NULL: the default one) in the platform's terms (a cudaStream_t), for libraries
     * that queue work beside cddp's (NCCL) */
    void *(*native_queue)(cddp_device *dev, void *queue);
    /* makes the device the calling thread's current one in its platform (cudaSetDevice), for a
     * library that takes the current device (NCCL's communicator) */
    int (*make_current)(cddp_device *dev, cddp_error *err);
    /* May be NULL (the CPU): memory and events other processes on this host open (cddp/device.h's
     * "shared with other processes"). device.c writes and checks what every handle opens with
     * (which kind of device, memory or event, which process); a device fills and reads the rest,
     * CDDP__IPC_PAYLOAD bytes. ipc_export: the allocation at p (alloc's pointer); ipc_open: process
     * pid's, as device memory of dev (copies and kernels take it) until ipc_close;
     * ipc_event_create: an event ipc_event_open opens in another process (the events' other calls
     * take both) */
    int (*ipc_export)(cddp_device *dev, void *p, unsigned char *payload, cddp_error *err);
    void *(*ipc_open)(cddp_device *dev, const unsigned char *payload, int pid, cddp_error *err);
    void (*ipc_close)(cddp_device *dev, void *p);
    void *(*ipc_event_create)(cddp_device *dev, unsigned char *payload, cddp_error *err);
    void *(*ipc_event_open)(cddp_device *dev, const unsigned char *payload, int pid,
                            cddp_error *err);
} cddp__device_ops;

/* The bytes of a cddp_ipc_handle a device fills (after device.c's 24). */
#define CDDP__IPC_PAYLOAD 72

struct cddp_device {
    char name[32];
    cddp_device_kind kind;
    int index;
    bool host_access; /* the host reads and writes its memory directly (the CPU) */
    bool in_order;    /* a kernel has run when its call returns (the CPU) */
    size_t memory;    /* bytes of memory of its own (a GPU's, the emulated one's); 0: the host's */
    const cddp__device_ops *ops;
    const cddp__kernels *k;
    char describe[256];
    char bus_id[32]; /* a GPU's PCI address; empty: the name stands for it */
    /* the platform whose libraries may queue work on it ("cuda"), NULL where only cddp touches its
     * memory (the CPU's is the host's, the emulated device's its own) */
    const char *platform;
    void *impl;
    void *slot; /* 64 bytes of its memory for results the host reads back (device.c) */
};

/* One kind of device: "cpu", "emu", "cuda". count: how many this process can use, or a negative
 * status with err saying why none can be used; open: device `index` (made on first use, kept for
 * the process's life). */
typedef struct cddp__device_kind_ops {
    const char *name;
    cddp_device_kind kind;
    int (*count)(cddp_error *err);
    cddp_device *(*open)(int index, cddp_error *err);
} cddp__device_kind_ops;

extern const cddp__device_kind_ops cddp__cpu_kind, cddp__emu_kind;
#ifdef CDDP_HAVE_CUDA
extern const cddp__device_kind_ops cddp__cuda_kind;
#endif

/* The device's default queue for kernels run outside a context (no scratch; failures logged). */
cddp__kq cddp__device_kq(cddp_device *dev);

#endif
