/* cddp/internal/device.h: what the library's own modules ask of a device across their floors,
 * and no program needs: the optimizers' kernels on flat blocks (optim), the 16-bit conversions
 * of DDP's compression and the checkpoints' (ddp, io), memory and events shared between the
 * processes of a host (dcomm's CUDA IPC), kernels on a queue of one's own (dcomm), and a copy
 * between two devices (nn, moving a model). Not installed, and not exported by the shared
 * library (no CDDP_API): the public API is cddp/device.h. Tests link the static library. */
#ifndef CDDP_INTERNAL_DEVICE_H
#define CDDP_INTERNAL_DEVICE_H

#include "cddp/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* On a queue of one's own, as the calls above on the default queue: a copy within the device
 * (memory opened by cddp_device_ipc_open included), dst = src or dst += src (assign), x *= s
 * (n floats each). Queued, not waited for. */
int cddp_queue_copy(cddp_queue *q, void *dst, const void *src, size_t bytes, cddp_error *err);
void cddp_queue_accumulate(cddp_queue *q, float *dst, const float *src, size_t n, bool assign);
void cddp_queue_scale(cddp_queue *q, float *x, size_t n, float s);

/* ---- Shared with other processes on this host ------------------------------------------------
 * A process exports an allocation of its device (a pointer cddp_device_alloc returned) or an event
 * made for sharing as a handle of bytes and sends it to another process on the host (a collective
 * of the group, the store); that process opens it on its own device. Opened memory is device
 * memory there, for copies and kernels on its queues; an opened event orders a queue after the
 * exporter's work (cddp_queue_wait), as far as the exporter's last record before the wait was
 * queued, so the two agree through the host when a record is made (a barrier) before the other
 * queues its wait. A GPU shares through CUDA IPC (both processes on GPUs of one machine, the same
 * GPU included); the emulated device through its memory file and a counter in shared memory, so
 * that CI proves the same ordering; the CPU not at all (CDDP_EUNSUPPORTED: its ranks share
 * memory through the group's shared-memory transport). */
#define CDDP_IPC_HANDLE_BYTES 96
typedef struct cddp_ipc_handle {
    unsigned char bytes[CDDP_IPC_HANDLE_BYTES];
} cddp_ipc_handle;
/* Whether the device shares memory and events with other processes (false for the CPU). */
bool cddp_device_ipc_capable(const cddp_device *dev);
int cddp_device_ipc_export(cddp_device *dev, void *p, cddp_ipc_handle *h, cddp_error *err);
/* Another process's allocation, until cddp_device_ipc_close (before that process frees it). NULL
 * with err: not a handle of this device's kind, or the process or its memory is gone. */
void *cddp_device_ipc_open(cddp_device *dev, const cddp_ipc_handle *h, cddp_error *err);
void cddp_device_ipc_close(cddp_device *dev, void *p); /* accepts NULL */
/* An event other processes open (cddp_event_open_shared): record it here, they wait for it. */
cddp_event *cddp_event_create_shared(cddp_device *dev, cddp_ipc_handle *h, cddp_error *err);
cddp_event *cddp_event_open_shared(cddp_device *dev, const cddp_ipc_handle *h, cddp_error *err);

/* bytes at p (device memory) read as zero from now on, and the device may take the memory behind
 * them back until they are written again: the CPU returns every whole page inside the range to
 * the system (a private page with madvise's MADV_DONTNEED, a shared one by punching a hole in its
 * file), the bytes at the ends are set to zero; where the system keeps a page (page-locked
 * memory) or on a device whose allocator cannot give back part of a block, the bytes are set to
 * zero. Ordered as cddp_device_memset. What ZeRO-2 (DDP's shard_gradients) does to the gradients
 * outside a rank's shard. */
int cddp_device_release(cddp_device *dev, void *p, size_t bytes, cddp_error *err);

/* n bytes from src on device from to dst on device to: a copy within a device, to or from the
 * host's memory (the CPU), or between two devices through host memory. Ordered as the copies
 * above (a copy that ends on the CPU waits for it). */
int cddp_device_transfer(cddp_device *to, void *dst, cddp_device *from, const void *src,
                         size_t bytes, cddp_error *err);

/* ---- Kernels on flat blocks -------------------------------------------------------------------
 * The optimizers' arithmetic on a model's parameter, gradient and state blocks (nn.h, optim.h),
 * queued on the device like any kernel. Arithmetic is float32 in the order of PyTorch's kernels,
 * so that results agree to rounding. */

/* SGD (PyTorch's rule): with momentum, buf = grad + wd p on the first step (first), else
 * buf = momentum buf + (1 - dampening) (grad + wd p); p -= lr (grad + wd p + momentum buf)
 * with nesterov, else lr buf. Without momentum (buf NULL): p -= lr (grad + wd p). */
typedef struct cddp_sgd_hparams {
    float lr, momentum, dampening, weight_decay;
    bool nesterov, first;
} cddp_sgd_hparams;
void cddp_device_sgd(cddp_device *dev, float *p, const float *grad, float *buf, size_t n,
                     const cddp_sgd_hparams *h);
/* AdamW, decoupled weight decay, step t (the caller works out the bias corrections once, in
 * double, as Python does): p *= decay (1 - lr wd); m = beta1 m + (1 - beta1) g;
 * v = beta2 v + (1 - beta2) g^2; p -= step_size m / (sqrt(v) / bc2_sqrt + eps), with
 * step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t). */
typedef struct cddp_adamw_hparams {
    float beta1, beta2, eps, step_size, bc2_sqrt, decay;
} cddp_adamw_hparams;
void cddp_device_adamw(cddp_device *dev, float *p, const float *grad, float *m, float *v, size_t n,
                       const cddp_adamw_hparams *h);
/* Lion: c = beta1 m + (1 - beta1) g; p = p decay - lr sign(c) (sign(0) = 0), decay = 1 - lr wd;
 * m = beta2 m + (1 - beta2) g. */
typedef struct cddp_lion_hparams {
    float lr, beta1, beta2, decay;
} cddp_lion_hparams;
void cddp_device_lion(cddp_device *dev, float *p, const float *grad, float *m, size_t n,
                      const cddp_lion_hparams *h);
/* *out = the sum of x[i]^2 in double, added in a fixed order (the same on every device and rank);
 * waits for the device. */
int cddp_device_sum_squares(cddp_device *dev, const float *x, size_t n, double *out,
                            cddp_error *err);
/* x *= s (n elements). */
void cddp_device_scale(cddp_device *dev, float *x, size_t n, float s);
/* dst += src (n floats), as cddp_queue_accumulate on the default queue. */
void cddp_device_accumulate(cddp_device *dev, float *dst, const float *src, size_t n);
/* 16-bit floats for the wire, as DDP's bf16/fp16 compression sends them: h = x rounded to nearest
 * even, to bfloat16 or (f16) IEEE half; and back, x = scale h (n elements each). */
void cddp_device_to_half(cddp_device *dev, uint16_t *h, const float *x, size_t n, bool f16);
void cddp_device_from_half(cddp_device *dev, float *x, const uint16_t *h, size_t n, bool f16,
                           float scale);

/* Host memory of `bytes` the device copies from and to: page-locked where the device has such
 * memory (its queued copies then run while the host goes on), else plain (where page-locked
 * memory cannot be had: a debug line says why); *locked says which, for the free. DDP's staged
 * blocks and dcomm's host copies. */
void *cddp_device_host_copy(cddp_device *dev, size_t bytes, bool *locked);
void cddp_device_host_copy_free(cddp_device *dev, void *p, bool locked);

#ifdef __cplusplus
}
#endif
#endif
