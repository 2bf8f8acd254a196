/* device.c: the CUDA device (cuda.h): the kind, memory, copies on the device's stream, events, and
 * the data errors its kernels report.
 *
 * Each GPU this process sees is a device ("cuda:N", CUDA_VISIBLE_DEVICES applying), opened on
 * first use with a stream of its own; every call makes the GPU current on its thread first. The
 * CUDA runtime is linked statically: without a driver or a GPU the kind counts none and says why
 * ("no CUDA device: the driver reports ..."). A copy to the device returns once the host's data
 * was taken (cudaMemcpyAsync from pageable memory stages it; from page-locked memory it waits), a
 * copy to the host once it is there; a queued upload (upload_async) from page-locked memory runs
 * while the host goes on.
 *
 * A kernel cannot format a message, so a data check (check_ids: a label out of range) writes the
 * first bad value into a slot of device memory with the number of the check; the host keeps each
 * check's message and context, and the next synchronize of the device reads the slot and reports
 * the failure through the context that queued it, as the CPU's kernels do at once. */
#include "tensor/cuda/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS   16
#define MAX_CHECKS 256 /* checks remembered between two synchronizations */

typedef struct pending {
    int64_t number;
    const char *fmt;
    int64_t limit;
    cddp__kq q;
} pending;

typedef struct gpu {
    cddp_device dev;
    cudaStream_t stream;
    int64_t *slot;    /* {check number, position, value} */
    double *partials; /* CDDP__CUDA_PARTIALS: sum_squares' blocks' sums */
    pthread_mutex_t lock;
    pending checks[MAX_CHECKS];
    int nchecks;
    int64_t next_check;
} gpu;

static gpu *of(const cddp_device *dev) {
    return dev->impl;
}

static void enter(const cddp_device *dev) {
    cudaSetDevice(dev->index);
}

cudaStream_t cddp__cuda_enter(const cddp__kq *q) {
    enter(q->dev);
    return q->queue ? (cudaStream_t)q->queue : of(q->dev)->stream;
}

static int failed(cddp_device *dev, cudaError_t e, const char *what, cddp_error *err) {
    if (e == cudaSuccess) return CDDP_OK;
    cudaGetLastError(); /* a sticky error stays; this clears the others */
    return cddp_error_set(err, e == cudaErrorMemoryAllocation ? CDDP_ENOMEM : CDDP_EIO,
                          "%s: %s failed: %s (%s)", dev->name, what, cudaGetErrorString(e),
                          cudaGetErrorName(e));
}

bool cddp__cuda_failed(cddp__kq *q, cudaError_t err, const char *what) {
    if (err == cudaSuccess) return false;
    cudaGetLastError();
    cddp__kq_fail(q, CDDP_EIO, "%s: %s failed: %s", q->dev->name, what, cudaGetErrorString(err));
    return true;
}

static cudaStream_t stream_of(const cddp_device *dev, void *queue) {
    enter(dev);
    return queue ? (cudaStream_t)queue : of(dev)->stream;
}

/* ---- memory and copies --------------------------------------------------------------------- */

static void *cuda_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    void *p = NULL;
    enter(dev);
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1); /* 256-byte aligned */
    if (e != cudaSuccess) {
        failed(dev, e, "allocating device memory", err);
        return NULL;
    }
    return p;
}

static void cuda_free(cddp_device *dev, void *p) {
    enter(dev);
    cudaFree(p); /* waits for the device, as the other devices' frees do */
}

static int cuda_copy_kind(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                          enum cudaMemcpyKind kind, bool wait, cddp_error *err) {
    cudaStream_t s = stream_of(dev, queue);
    CDDP_TRY(failed(dev, cudaMemcpyAsync(dst, src, n, kind, s), "a copy", err));
    return wait ? failed(dev, cudaStreamSynchronize(s), "waiting for a copy", err) : CDDP_OK;
}

/* From pageable memory the copy has taken src when cudaMemcpyAsync returns; from page-locked
 * memory (cddp_device_host_alloc) it has not, and the caller may reuse src at once: wait. */
static int cuda_upload(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                       cddp_error *err) {
    struct cudaPointerAttributes at;
    bool locked =
        cudaPointerGetAttributes(&at, src) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError(); /* an unknown pointer is not an error here */
    return cuda_copy_kind(dev, queue, dst, src, n, cudaMemcpyHostToDevice, locked, err);
}

static int cuda_download(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                         cddp_error *err) {
    return cuda_copy_kind(dev, queue, dst, src, n, cudaMemcpyDeviceToHost, true, err);
}

static int cuda_download_async(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                               cddp_error *err) {
    return cuda_copy_kind(dev, queue, dst, src, n, cudaMemcpyDeviceToHost, false, err);
}

static int cuda_copy(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                     cddp_error *err) {
    return cuda_copy_kind(dev, queue, dst, src, n, cudaMemcpyDeviceToDevice, false, err);
}

static int cuda_memset(cddp_device *dev, void *queue, void *dst, int byte, size_t n,
                       cddp_error *err) {
    return failed(dev, cudaMemsetAsync(dst, byte, n, stream_of(dev, queue)), "a fill", err);
}

double *cddp__cuda_partials(const cddp__kq *q) {
    return of(q->dev)->partials;
}

/* ---- data checks --------------------------------------------------------------------------- */

cddp__cuda_check cddp__cuda_check_begin(cddp__kq *q, const char *fmt, int64_t limit) {
    gpu *g = of(q->dev);
    pthread_mutex_lock(&g->lock);
    int64_t number = ++g->next_check;
    if (g->nchecks < MAX_CHECKS)
        g->checks[g->nchecks++] = (pending){.number = number, .fmt = fmt, .limit = limit, .q = *q};
    pthread_mutex_unlock(&g->lock);
    return (cddp__cuda_check){g->slot, number};
}

/* After the stream is idle: the first failed check since the last time, reported through the
 * context that queued it; the slot cleared for the next ones. */
static int report_checks(cddp_device *dev, cddp_error *err) {
    gpu *g = of(dev);
    pthread_mutex_lock(&g->lock);
    int n = g->nchecks;
    g->nchecks = 0;
    pthread_mutex_unlock(&g->lock);
    if (n == 0) return CDDP_OK;
    int64_t got[3];
    CDDP_TRY(failed(dev, cudaMemcpy(got, g->slot, sizeof got, cudaMemcpyDeviceToHost),
                    "reading the kernels' checks", err));
    if (got[0] == 0) return CDDP_OK;
    /* on the device's stream, so that the next checks find it cleared (cudaMemset's default
     * stream does not order with a non-blocking stream) */
    CDDP_TRY(failed(dev, cudaMemsetAsync(g->slot, 0, sizeof got, g->stream),
                    "clearing the kernels' checks", err));
    for (int i = 0; i < n; i++) {
        pending *p = &g->checks[i];
        if (p->number != got[0]) continue;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        cddp__kq_fail(&p->q, CDDP_ERANGE, p->fmt, (long long)got[2], (long long)got[1],
                      (long long)p->limit, (long long)(p->limit - 1));
#pragma GCC diagnostic pop
        return CDDP_OK;
    }
    return cddp_error_set(err, CDDP_ERANGE, "%s: an id checked on the device was out of range",
                          dev->name);
}

static int cuda_synchronize(cddp_device *dev, void *queue, cddp_error *err) {
    CDDP_TRY(
        failed(dev, cudaStreamSynchronize(stream_of(dev, queue)), "waiting for the device", err));
    return report_checks(dev, err);
}

/* ---- events -------------------------------------------------------------------------------- */

static void *cuda_event_create(cddp_device *dev, cddp_error *err) {
    cudaEvent_t ev = NULL;
    enter(dev);
    if (failed(dev, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "making an event", err))
        return NULL;
    return ev;
}

static void cuda_event_destroy(cddp_device *dev, void *ev) {
    enter(dev);
    cudaEventDestroy((cudaEvent_t)ev);
}

static int cuda_event_record(cddp_device *dev, void *queue, void *ev, cddp_error *err) {
    return failed(dev, cudaEventRecord((cudaEvent_t)ev, stream_of(dev, queue)), "an event", err);
}

static int cuda_event_synchronize(cddp_device *dev, void *ev, cddp_error *err) {
    enter(dev);
    return failed(dev, cudaEventSynchronize((cudaEvent_t)ev), "waiting for an event", err);
}

static int cuda_event_query(cddp_device *dev, void *ev, bool *done, cddp_error *err) {
    enter(dev);
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    return e == cudaErrorNotReady ? CDDP_OK : failed(dev, e, "asking after an event", err);
}

static int cuda_queue_wait(cddp_device *dev, void *queue, void *ev, cddp_error *err) {
    return failed(dev, cudaStreamWaitEvent(stream_of(dev, queue), (cudaEvent_t)ev, 0),
                  "a wait for an event", err);
}

/* ---- page-locked host memory and streams of their own --------------------------------------- */

static void *cuda_host_alloc(cddp_device *dev, size_t bytes, cddp_error *err) {
    void *p = NULL;
    enter(dev);
    if (failed(dev, cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
               "allocating page-locked memory", err))
        return NULL;
    return p; /* 4 KiB aligned */
}

static void cuda_host_free(cddp_device *dev, void *p) {
    enter(dev);
    cudaFreeHost(p);
}

static int cuda_host_register(cddp_device *dev, void *p, size_t bytes, cddp_error *err) {
    enter(dev);
    return failed(dev, cudaHostRegister(p, bytes, cudaHostRegisterPortable),
                  "making host memory page-locked", err);
}

static void cuda_host_unregister(cddp_device *dev, void *p) {
    enter(dev);
    cudaHostUnregister(p);
}

static void *cuda_queue_create(cddp_device *dev, bool first, cddp_error *err) {
    cudaStream_t s = NULL;
    int least = 0, greatest = 0;
    enter(dev);
    if (first && failed(dev, cudaDeviceGetStreamPriorityRange(&least, &greatest),
                        "asking for the streams' priorities", err))
        return NULL;
    if (failed(dev, cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, first ? greatest : 0),
               "making a stream", err))
        return NULL;
    return s;
}

static void cuda_queue_destroy(cddp_device *dev, void *queue) {
    enter(dev);
    cudaStreamSynchronize((cudaStream_t)queue);
    cudaStreamDestroy((cudaStream_t)queue);
}

static int cuda_upload_async(cddp_device *dev, void *queue, void *dst, const void *src, size_t n,
                             cddp_error *err) {
    return cuda_copy_kind(dev, queue, dst, src, n, cudaMemcpyHostToDevice, false, err);
}

static void *cuda_native_queue(cddp_device *dev, void *queue) {
    return queue ? queue : of(dev)->stream;
}

static int cuda_make_current(cddp_device *dev, cddp_error *err) {
    return failed(dev, cudaSetDevice(dev->index), "making the GPU current", err);
}

/* ---- shared with other processes: CUDA IPC --------------------------------------------------- */

/* A handle's payload (device.c writes and checks the rest): CUDA's handle. */
_Static_assert(sizeof(cudaIpcMemHandle_t) <= CDDP__IPC_PAYLOAD &&
                   sizeof(cudaIpcEventHandle_t) <= CDDP__IPC_PAYLOAD,
               "CUDA's handles fit a cddp_ipc_handle");

static int cuda_ipc_export(cddp_device *dev, void *p, unsigned char *payload, cddp_error *err) {
    cudaIpcMemHandle_t h;
    enter(dev);
    CDDP_TRY(failed(dev, cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle", err));
    memcpy(payload, &h, sizeof h);
    return CDDP_OK;
}

static void *cuda_ipc_open(cddp_device *dev, const unsigned char *payload, int pid,
                           cddp_error *err) {
    cudaIpcMemHandle_t h;
    void *p = NULL;
    (void)pid;
    memcpy(&h, payload, sizeof h);
    enter(dev);
    if (failed(dev, cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
               "cudaIpcOpenMemHandle (another process's memory)", err))
        return NULL;
    return p;
}

static void cuda_ipc_close(cddp_device *dev, void *p) {
    enter(dev);
    cudaDeviceSynchronize(); /* nothing queued may still read it */
    cudaIpcCloseMemHandle(p);
}

static void *cuda_ipc_event_create(cddp_device *dev, unsigned char *payload, cddp_error *err) {
    cudaIpcEventHandle_t h;
    cudaEvent_t ev = NULL;
    enter(dev);
    if (failed(dev, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess),
               "making an inter-process event", err))
        return NULL;
    if (failed(dev, cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle", err)) {
        cudaEventDestroy(ev);
        return NULL;
    }
    memcpy(payload, &h, sizeof h);
    return ev;
}

static void *cuda_ipc_event_open(cddp_device *dev, const unsigned char *payload, int pid,
                                 cddp_error *err) {
    cudaIpcEventHandle_t h;
    cudaEvent_t ev = NULL;
    (void)pid;
    memcpy(&h, payload, sizeof h);
    enter(dev);
    if (failed(dev, cudaIpcOpenEventHandle(&ev, h),
               "cudaIpcOpenEventHandle (another process's event)", err))
        return NULL;
    return ev;
}

static const cddp__device_ops ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .synchronize = cuda_synchronize,
    .download_async = cuda_download_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_synchronize = cuda_event_synchronize,
    .event_query = cuda_event_query,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .queue_create = cuda_queue_create,
    .queue_destroy = cuda_queue_destroy,
    .upload_async = cuda_upload_async,
    .queue_wait = cuda_queue_wait,
    .native_queue = cuda_native_queue,
    .make_current = cuda_make_current,
    .ipc_export = cuda_ipc_export,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .ipc_event_create = cuda_ipc_event_create,
    .ipc_event_open = cuda_ipc_event_open,
};

/* ---- the kernel table ---------------------------------------------------------------------- */

/* A kernel the CUDA device does not have yet: the op fails its context, naming it. */
#define MISSING(name)                                                                              \
    static void missing_##name(cddp__kq *q, const cddp__k_##name *a) {                             \
        (void)a;                                                                                   \
        cddp__kq_fail(q, CDDP_EUNSUPPORTED,                                                        \
                      "the CUDA device has no %s kernel yet: run this model on the CPU "           \
                      "(--device cpu)",                                                            \
                      #name);                                                                      \
    }
CDDP_KERNEL_LIST(MISSING)
#undef MISSING

/* float32 (CUBLAS_COMPUTE_32F: no TF32) and bf16 (CUBLAS_COMPUTE_32F_FAST_16BF: float32 operands
 * rounded to bf16 for the tensor cores, float32 accumulation), sm_80 and later */
static int computes(cddp_dtype dtype, const char **how, cddp_error *err) {
    if (dtype != CDDP_F32 && dtype != CDDP_BF16)
        return cddp_error_set(err, CDDP_EINVAL,
                              "the CUDA device multiplies in float32 or bf16, not %s",
                              cddp_dtype_name(dtype));
    if (how)
        *how = dtype == CDDP_F32 ? "float32 products (cuBLASLt, no TF32)"
               : cddp_knob_int(CDDP_KNOB_FLASH_ATTENTION)
                   ? "bf16 products on the tensor cores (cuBLASLt, float32 sums); attention by "
                     "rows (flash attention) for heads of 32 or 64"
                   : "bf16 products on the tensor cores (cuBLASLt, float32 sums); attention "
                     "keeping its weights (CDDP_FLASH_ATTENTION=0)";
    return CDDP_OK;
}

static int no_blocks(void) {
    return 0; /* its convolutions (when it has them) take plain tensors */
}

static bool never_fuses(const cddp__conv_geom *g) {
    (void)g;
    return false;
}

static bool no_conv_grad(const cddp__conv_geom *g) {
    (void)g;
    return false; /* no convolutions yet */
}

static bool takes_bf16(void) {
    return true; /* bf16 operands (CUDA_R_16BF) and a bias epilogue: gemm.c */
}

static cddp__kernels kernels;

static void fill_table(void) {
#define SLOT(name) kernels.name = missing_##name;
    CDDP_KERNEL_LIST(SLOT)
#undef SLOT
#define HAS(name) kernels.name = cddp__cuda_##name;
    CDDP_CUDA_KERNELS(HAS)
#undef HAS
    kernels.attention = cddp__attention_by_products; /* cuBLASLt's products, batched by head */
    kernels.attention_grad = cddp__attention_grad_by_products;
    kernels.blocked_size = no_blocks;
    kernels.conv_pool_fuses = never_fuses;
    kernels.computes = computes;
    kernels.gemm_takes_bf16 = takes_bf16;
    kernels.conv_grad_takes_bf16 = no_conv_grad;
    kernels.attends_by_rows = cddp__gpu_attends_by_rows; /* the shapes flash.cu takes */
}

/* ---- the kind ------------------------------------------------------------------------------ */

static gpu *gpus[MAX_GPUS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static int cuda_count(cddp_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        /* The runtime says "driver version is insufficient" where there is no driver at all. */
        void *driver = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY) : NULL;
        if (e == cudaErrorInsufficientDriver && !driver)
            return cddp_error_set(err, CDDP_EUNSUPPORTED,
                                  "no CUDA device: no NVIDIA driver on this machine (libcuda.so.1 "
                                  "is not installed)");
        if (driver) dlclose(driver);
        return cddp_error_set(err, CDDP_EUNSUPPORTED, "no CUDA device: the driver reports %s (%s)",
                              cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (n == 0)
        return cddp_error_set(err, CDDP_EUNSUPPORTED,
                              "no CUDA device: the driver sees no GPU (CUDA_VISIBLE_DEVICES=%s)",
                              getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                             : "unset");
    return CDDP_MIN(n, MAX_GPUS);
}

static gpu *open_gpu(int index, cddp_error *err) {
    gpu *g = cddp_calloc(1, sizeof *g);
    if (!g) {
        cddp_error_set(err, CDDP_ENOMEM, "cuda:%d: out of memory", index);
        return NULL;
    }
    snprintf(g->dev.name, sizeof g->dev.name, "cuda:%d", index);
    g->dev.kind = CDDP_DEVICE_CUDA;
    g->dev.platform = "cuda";
    g->dev.index = index;
    g->dev.ops = &ops;
    g->dev.k = &kernels;
    g->dev.impl = g;
    pthread_mutex_init(&g->lock, NULL);
    struct cudaDeviceProp prop;
    cudaSetDevice(index);
    if (failed(&g->dev, cudaGetDeviceProperties(&prop, index), "asking for the GPU", err) ||
        failed(&g->dev, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking),
               "making a stream", err) ||
        !(g->slot = cuda_alloc(&g->dev, 3 * sizeof(int64_t), err)) ||
        !(g->partials = cuda_alloc(&g->dev, CDDP__CUDA_PARTIALS * sizeof(double), err)) ||
        failed(&g->dev, cudaMemsetAsync(g->slot, 0, 3 * sizeof(int64_t), g->stream),
               "clearing memory", err) ||
        cddp__cuda_lt_init(err) != CDDP_OK) {
        pthread_mutex_destroy(&g->lock);
        cddp_free(g);
        return NULL;
    }
    g->dev.memory = prop.totalGlobalMem;
    if (cudaDeviceGetPCIBusId(g->dev.bus_id, (int)sizeof g->dev.bus_id, index) != cudaSuccess)
        g->dev.bus_id[0] = 0;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    snprintf(g->dev.describe, sizeof g->dev.describe,
             "%s: %.64s, sm_%d%d, %.1f GiB, driver %d.%d, runtime %d.%d", g->dev.name, prop.name,
             prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30), driver / 1000,
             driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return g;
}

static cddp_device *cuda_open(int index, cddp_error *err) {
    pthread_once(&table_once, fill_table);
    if (index < 0 || index >= MAX_GPUS) {
        cddp_error_set(err, CDDP_ERANGE, "cuda:%d: at most %d GPUs", index, MAX_GPUS);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    if (!gpus[index]) gpus[index] = open_gpu(index, err);
    gpu *g = gpus[index];
    pthread_mutex_unlock(&lock);
    return g ? &g->dev : NULL;
}

const cddp__device_kind_ops cddp__cuda_kind = {"cuda", CDDP_DEVICE_CUDA, cuda_count, cuda_open};
