/* tensor.c: the step context, tensor creation and the random generator.
 *
 * Every tensor made here is a header and its data in the context's arena; nothing is freed one
 * by one. A failed allocation latches an error in the context and returns NULL, and every
 * function given a NULL tensor returns NULL, so a step's errors surface once, at its end.
 */
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cddp_dtype_name(cddp_dtype dtype) {
    switch (dtype) {
    case CDDP_F32:
        return "float32";
    case CDDP_I32:
        return "int32";
    case CDDP_I64:
        return "int64";
    case CDDP_BF16:
        return "bfloat16";
    case CDDP_F16:
        return "float16";
    }
    return "unknown";
}

size_t cddp_dtype_size(cddp_dtype dtype) {
    return dtype == CDDP_I64 ? 8 : dtype == CDDP_BF16 || dtype == CDDP_F16 ? 2 : 4;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cddp_rng_seed(cddp_rng *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t cddp_rng_next(cddp_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float cddp_rng_uniform(cddp_rng *rng) {
    return (float)(cddp_rng_next(rng) >> 40) * (1.0f / 16777216.0f);
}

double cddp_rng_normal(cddp_rng *rng) {
    /* Box-Muller on (0, 1] x [0, 1) so that log never sees 0. */
    double u1 = ((double)(cddp_rng_next(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(cddp_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t cddp_rng_below(cddp_rng *rng, uint64_t n) {
    CDDP_CHECK(n > 0, "cddp_rng_below: n must be positive");
    /* Rejection sampling: drop the top partial block so every residue is equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = cddp_rng_next(rng);
    while (x >= limit);
    return x % n;
}

/* ---- the context on its devices -------------------------------------------------------- */

/* A kernel's scratch: the context's arena on the device (a failure reported as the kernel's). */
static void *scratch(cddp__kq *q, size_t bytes) {
    cddp__cdev *d = q->user;
    if (d->arena == d->ctx->arena) return cddp__ctx_alloc(d->ctx, bytes);
    cddp_error e = {0};
    void *p = cddp_arena_alloc(d->arena, bytes, &e);
    if (!p) q->fail(q, e.code, e.msg);
    return p;
}

/* A failure of a kernel that ran in order: the context's error at once. */
static void fail_now(cddp__kq *q, int code, const char *msg) {
    cddp__cdev *d = q->user;
    cddp_ctx_fail(d->ctx, code, "%s", msg);
}

/* A failure of a kernel that ran later, on the device's queue: kept until the context waits. */
static void fail_late(cddp__kq *q, int code, const char *msg) {
    cddp__cdev *d = q->user;
    pthread_mutex_lock(&d->lock);
    if (!d->late.code) cddp_error_set(&d->late, code, "%s", msg);
    pthread_mutex_unlock(&d->lock);
}

static void *dev_alloc(void *user, size_t bytes) {
    cddp_device *dev = user;
    return dev->ops->alloc(dev, bytes, NULL);
}

static void dev_free(void *user, void *p) {
    cddp_device *dev = user;
    dev->ops->free(dev, p);
}

static void dev_reset(void *user, void *p, size_t n) {
    cddp_device *dev = user;
    if (dev->ops->scrub) dev->ops->scrub(dev, p, n);
}

static void cdev_destroy(cddp__cdev *d) {
    if (!d) return;
    if (d->reuse) d->q.dev->ops->free(d->q.dev, d->reuse);
    if (d->arena != d->ctx->arena) cddp_arena_destroy(d->arena);
    pthread_mutex_destroy(&d->lock);
    cddp_free(d);
}

/* The most a step may take of a device's memory: what the context asked for, else CDDP_ARENA_MB
 * where it is set, else all the device has (a GPT-2 step on a GPU takes tens of GiB; the device
 * says so itself when it has less free). */
static size_t arena_limit(const cddp_device *dev, size_t asked) {
    const char *knob = getenv(cddp_knob_name(CDDP_KNOB_ARENA_MB));
    if (asked || (knob && *knob) || !dev->memory) return asked;
    return dev->memory;
}

static cddp__cdev *cdev_create(cddp_ctx *ctx, cddp_device *dev, size_t initial, size_t max) {
    cddp__cdev *d = cddp_calloc(1, sizeof *d);
    if (!d) return NULL;
    pthread_mutex_init(&d->lock, NULL);
    d->ctx = ctx;
    d->q = (cddp__kq){
        .dev = dev, .scratch = scratch, .fail = dev->in_order ? fail_now : fail_late, .user = d};
    /* The CPU's data and the host's share the context's arena; another device has its own, in its
     * memory (its kernels may allocate scratch from their queue's thread: shared). */
    if (dev->host_access && dev->in_order)
        d->arena = ctx->arena;
    else
        d->arena =
            cddp_arena_create_on(initial, arena_limit(dev, max),
                                 &(cddp_arena_memory){dev_alloc, dev_free, dev, true, dev_reset});
    if (!d->arena) {
        cdev_destroy(d);
        return NULL;
    }
    return d;
}

/* Waits for the context's work on every device and takes a late failure into the context. */
static void ctx_wait(cddp_ctx *ctx) {
    for (int i = 0; i < ctx->ndev; i++) {
        cddp__cdev *d = ctx->dev[i];
        if (d->q.dev->in_order) continue;
        cddp_error e = {0};
        if (d->q.dev->ops->synchronize(d->q.dev, d->q.queue, &e) != CDDP_OK)
            cddp_ctx_fail(ctx, e.code, "%s", e.msg);
        pthread_mutex_lock(&d->lock);
        if (d->late.code) cddp_ctx_fail(ctx, d->late.code, "%s", d->late.msg);
        cddp_error_clear(&d->late);
        pthread_mutex_unlock(&d->lock);
    }
}

cddp_ctx *cddp_ctx_create(const cddp_ctx_options *opts) {
    cddp_ctx_options o = opts ? *opts : (cddp_ctx_options){0};
    cddp_ctx *ctx = cddp_calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    size_t initial = o.arena_initial_bytes ? o.arena_initial_bytes : 16u << 20;
    ctx->arena = cddp_arena_create(initial, o.arena_max_bytes);
    cddp_device *dev = o.device ? o.device : cddp_device_cpu();
    if (ctx->arena) ctx->dev[0] = cdev_create(ctx, dev, initial, o.arena_max_bytes);
    if (!ctx->dev[0]) {
        cddp_arena_destroy(ctx->arena);
        cddp_free(ctx);
        return NULL;
    }
    ctx->ndev = 1;
    cddp_rng_seed(&ctx->rng, o.seed);
    ctx->grad_enabled = true;
    ctx->compute = o.compute;
    ctx->options = o;
    return ctx;
}

cddp_ctx *cddp_ctx_scratch(cddp_ctx *ctx) {
    if (!ctx->scratch) {
        cddp_ctx_options o = ctx->options;
        o.device = cddp_ctx_device(ctx);
        o.compute = ctx->compute;
        if (!(ctx->scratch = cddp_ctx_create(&o)))
            cddp_ctx_fail(ctx, CDDP_ENOMEM, "out of memory for a scratch context");
    }
    if (ctx->scratch) ctx->scratch->compute = ctx->compute;
    return ctx->scratch;
}

cddp_dtype cddp_ctx_compute(const cddp_ctx *ctx) {
    return ctx->compute;
}

cddp_dtype cddp_ctx_set_compute(cddp_ctx *ctx, cddp_dtype dtype) {
    cddp_dtype old = ctx->compute;
    ctx->compute = dtype;
    return old;
}

void cddp_ctx_destroy(cddp_ctx *ctx) {
    if (!ctx) return;
    cddp_ctx_destroy(ctx->scratch);
    ctx_wait(ctx); /* nothing may still run on the arenas */
    for (int i = 0; i < ctx->ndev; i++) cdev_destroy(ctx->dev[i]);
    cddp_arena_destroy(ctx->arena);
    cddp_free(ctx);
}

void cddp_ctx_reset(cddp_ctx *ctx) {
    ctx_wait(ctx);
    for (int i = 0; i < ctx->ndev; i++) {
        if (ctx->dev[i]->arena != ctx->arena) cddp_arena_reset(ctx->dev[i]->arena);
        ctx->dev[i]->nspare = 0;
    }
    cddp_arena_reset(ctx->arena);
    ctx->tape = NULL;
    ctx->nnodes = 0;
    ctx->step_state = NULL;
    cddp_error_clear(&ctx->err);
}

int cddp_ctx_status(const cddp_ctx *ctx) {
    ctx_wait((cddp_ctx *)ctx);
    return ctx->err.code;
}

const char *cddp_ctx_error(const cddp_ctx *ctx) {
    ctx_wait((cddp_ctx *)ctx);
    return cddp_error_msg(&ctx->err);
}

bool cddp_ctx_failed(const cddp_ctx *ctx) {
    return ctx->err.code != CDDP_OK;
}

cddp_device *cddp_ctx_device(const cddp_ctx *ctx) {
    return ctx->dev[0]->q.dev;
}

int cddp_ctx_synchronize(cddp_ctx *ctx) {
    ctx_wait(ctx);
    return ctx->err.code;
}

int cddp_ctx_fail(cddp_ctx *ctx, int code, const char *fmt, ...) {
    if (ctx->err.code != CDDP_OK) return ctx->err.code; /* the first error is the cause */
    va_list ap;
    va_start(ap, fmt);
    cddp_error_vset(&ctx->err, code, fmt, ap);
    va_end(ap);
    return code;
}

cddp_rng *cddp_ctx_rng(cddp_ctx *ctx) {
    return &ctx->rng;
}

cddp_arena *cddp_ctx_arena(cddp_ctx *ctx) {
    return ctx->arena;
}

bool cddp_ctx_set_grad_enabled(cddp_ctx *ctx, bool enabled) {
    bool old = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return old;
}

bool cddp_ctx_grad_enabled(const cddp_ctx *ctx) {
    return ctx->grad_enabled;
}

void *cddp__ctx_alloc(cddp_ctx *ctx, size_t bytes) {
    if (ctx->err.code != CDDP_OK) return NULL;
    cddp_error e = {0};
    void *p = cddp_arena_alloc(ctx->arena, bytes, &e);
    if (!p) cddp_ctx_fail(ctx, e.code, "%s", e.msg);
    return p;
}

void **cddp_ctx_step_state(cddp_ctx *ctx) {
    return &ctx->step_state;
}

cddp__cdev *cddp__ctx_dev(cddp_ctx *ctx, cddp_device *dev) {
    for (int i = 0; i < ctx->ndev; i++)
        if (ctx->dev[i]->q.dev == dev) return ctx->dev[i];
    if (CDDP__FAILED(ctx)) return NULL;
    if (ctx->ndev == CDDP__CTX_DEVICES) {
        cddp_ctx_fail(ctx, CDDP_EUNSUPPORTED, "a context works on at most %d devices",
                      CDDP__CTX_DEVICES);
        return NULL;
    }
    cddp__cdev *d = cdev_create(ctx, dev, 1u << 20, 0);
    if (!d) {
        cddp_ctx_fail(ctx, CDDP_ENOMEM, "out of memory for the context's arena on %s", dev->name);
        return NULL;
    }
    ctx->dev[ctx->ndev++] = d;
    return d;
}

cddp__cdev *cddp__on(cddp_ctx *ctx, const char *op, int n, cddp_tensor *const *in) {
    cddp_device *dev = NULL;
    const cddp_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (!dev) {
            dev = in[i]->device;
            first = in[i];
            continue;
        }
        CDDP_CHECK(in[i]->device == dev,
                   "%s: expected all tensors to be on the same device, but found at least two "
                   "devices, %s (a tensor %s) and %s (a tensor %s): move one with cddp_to",
                   op, dev->name, CDDP__SHAPE(first), in[i]->device->name, CDDP__SHAPE(in[i]));
    }
    return cddp__ctx_dev(ctx, dev ? dev : ctx->dev[0]->q.dev);
}

cddp__cdev *cddp__node_dev(cddp_ctx *ctx, const cddp__node *n) {
    return cddp__ctx_dev(ctx, n->out->device);
}

void *cddp__dalloc(cddp__cdev *d, size_t bytes) {
    if (d->arena == d->ctx->arena || CDDP__FAILED(d->ctx)) return cddp__ctx_alloc(d->ctx, bytes);
    cddp_error e = {0};
    void *p = cddp_arena_alloc(d->arena, bytes, &e);
    if (!p) cddp_ctx_fail(d->ctx, e.code, "%s", e.msg);
    return p;
}

void *cddp__dreuse(cddp__cdev *d, size_t bytes) {
    if (CDDP__FAILED(d->ctx)) return NULL;
    if (d->reuse_bytes >= bytes) return d->reuse;
    cddp_device *dev = d->q.dev;
    if (d->reuse) dev->ops->free(dev, d->reuse); /* a device frees after its queued kernels */
    d->reuse_bytes = 0;
    cddp_error e = {0};
    if (!(d->reuse = dev->ops->alloc(dev, bytes, &e))) {
        cddp_ctx_fail(d->ctx, e.code ? e.code : CDDP_ENOMEM, "%s",
                      e.code ? e.msg : "out of memory for an op's temporary");
        return NULL;
    }
    d->reuse_bytes = bytes;
    return d->reuse;
}

bool cddp__dzero(cddp__cdev *d, void *p, size_t bytes) {
    cddp_error e = {0};
    if (bytes && d->q.dev->ops->memset(d->q.dev, d->q.queue, p, 0, bytes, &e) != CDDP_OK) {
        cddp_ctx_fail(d->ctx, e.code, "%s", e.msg);
        return false;
    }
    return true;
}

void *cddp__dalloc_zero(cddp__cdev *d, size_t bytes) {
    void *p = cddp__dalloc(d, bytes);
    return p && cddp__dzero(d, p, bytes) ? p : NULL;
}

void *cddp__staging(cddp__cdev *d, void *dst, size_t n) {
    return d->q.dev->host_access ? dst : cddp__ctx_alloc(d->ctx, n);
}

void cddp__upload(cddp__cdev *d, void *dst, const void *src, size_t n) {
    cddp_error e = {0};
    if (src != dst && n && d->q.dev->ops->upload(d->q.dev, d->q.queue, dst, src, n, &e) != CDDP_OK)
        cddp_ctx_fail(d->ctx, e.code, "%s", e.msg);
}

/* ---- tensors ----------------------------------------------------------------------------- */

static void check_shape(int ndim, const int64_t *shape) {
    CDDP_CHECK(ndim >= 0 && ndim <= CDDP_MAX_DIMS, "tensors have 0 to %d dimensions, not %d",
               CDDP_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        CDDP_CHECK(shape[i] >= 0, "dimension %d has negative size %lld", i, (long long)shape[i]);
}

cddp_tensor *cddp__tensor_header(cddp_ctx *ctx, cddp__cdev *d, cddp_dtype dtype, int ndim,
                                 const int64_t *shape) {
    check_shape(ndim, shape);
    CDDP_CHECK(dtype != CDDP_F16, "a float16 tensor: CDDP_F16 is a file's type (safetensors' "
                                  "F16), read into float32; tensors are F32, BF16, I32 or I64");
    cddp_tensor *t = cddp__ctx_alloc(ctx, sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->param_index = -1;
    t->device = (d ? d : ctx->dev[0])->q.dev;
    return t;
}

cddp_tensor *cddp__empty(cddp__cdev *d, cddp_dtype dtype, int ndim, const int64_t *shape) {
    if (!d) return NULL;
    cddp_tensor *t = cddp__tensor_header(d->ctx, d, dtype, ndim, shape);
    if (!t) return NULL;
    t->data = cddp__dalloc(d, (size_t)t->numel * cddp_dtype_size(dtype));
    return t->data ? t : NULL;
}

cddp_tensor *cddp_empty(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    return cddp__empty(ctx->dev[0], dtype, ndim, shape);
}

cddp_tensor *cddp_zeros(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    cddp_tensor *t = cddp_empty(ctx, dtype, ndim, shape);
    if (!t) return NULL;
    cddp__cdev *d = ctx->dev[0];
    CDDP__K(&d->q, fill, .dst = t->data, .n = t->numel, .size = (int)cddp_dtype_size(dtype));
    return t;
}

/* The bits of one element of dtype holding v. */
static uint64_t bits_of(cddp_dtype dtype, double v) {
    uint64_t b = 0;
    switch (dtype) {
    case CDDP_F32: {
        float f = (float)v;
        memcpy(&b, &f, sizeof f);
        break;
    }
    case CDDP_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        b = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* round to nearest even */
        break;
    }
    case CDDP_I32:
        b = (uint32_t)(int32_t)v;
        break;
    case CDDP_I64:
        b = (uint64_t)(int64_t)v;
        break;
    case CDDP_F16: /* no tensor holds it (cddp__tensor_header) */
        break;
    }
    return b;
}

cddp_tensor *cddp_ones(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    cddp_tensor *t = cddp_empty(ctx, dtype, ndim, shape);
    if (!t) return NULL;
    cddp__cdev *d = ctx->dev[0];
    CDDP__K(&d->q, fill, .dst = t->data, .n = t->numel, .size = (int)cddp_dtype_size(dtype),
            .bits = bits_of(dtype, 1.0));
    return t;
}

cddp_tensor *cddp_from_data(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape,
                            const void *data) {
    cddp_tensor *t = cddp_empty(ctx, dtype, ndim, shape);
    if (!t) return NULL;
    size_t n = (size_t)t->numel * cddp_dtype_size(dtype);
    cddp__cdev *d = ctx->dev[0];
    if (d->q.dev->host_access)
        memcpy(t->data, data, n);
    else
        cddp__upload(d, t->data, data, n);
    return CDDP__FAILED(ctx) ? NULL : t;
}

cddp_tensor *cddp_wrap(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape,
                       void *data) {
    cddp_tensor *t = cddp__tensor_header(ctx, NULL, dtype, ndim, shape);
    if (t) t->data = data;
    return t;
}

cddp_tensor *cddp_from_host(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape,
                            void *data) {
    if (ctx->dev[0]->q.dev->host_access) return cddp_wrap(ctx, dtype, ndim, shape, data);
    return cddp_from_data(ctx, dtype, ndim, shape, data);
}

/* Fills t's float32 elements on the host through gen, then puts them on t's device. */
static void fill_host(cddp_tensor *t, const char *what, void (*gen)(float *, int64_t, void *),
                      void *arg) {
    CDDP_CHECK(t->dtype == CDDP_F32, "%s needs a float32 tensor", what);
    size_t n = (size_t)t->numel * sizeof(float);
    if (t->device->host_access) {
        gen(t->data, t->numel, arg);
        return;
    }
    float *host = cddp_malloc(n ? n : 1);
    CDDP_CHECK(host, "%s: out of memory for %zu bytes", what, n);
    gen(host, t->numel, arg);
    cddp_error e = {0};
    int rc = cddp_device_upload(t->device, t->data, host, n, &e);
    cddp_free(host);
    CDDP_CHECK(rc == CDDP_OK, "%s: %s", what, e.msg);
}

typedef struct fill_arg {
    float a, b;
    cddp_rng *rng;
} fill_arg;

static void gen_value(float *x, int64_t n, void *arg) {
    const fill_arg *f = arg;
    for (int64_t i = 0; i < n; i++) x[i] = f->a;
}

static void gen_uniform(float *x, int64_t n, void *arg) {
    const fill_arg *f = arg;
    for (int64_t i = 0; i < n; i++) x[i] = f->a + (f->b - f->a) * cddp_rng_uniform(f->rng);
}

static void gen_normal(float *x, int64_t n, void *arg) {
    const fill_arg *f = arg;
    for (int64_t i = 0; i < n; i++) x[i] = f->a + f->b * (float)cddp_rng_normal(f->rng);
}

void cddp_fill(cddp_tensor *t, float value) {
    fill_host(t, "cddp_fill", gen_value, &(fill_arg){value, 0, NULL});
}

void cddp_fill_uniform(cddp_tensor *t, float lo, float hi, cddp_rng *rng) {
    fill_host(t, "cddp_fill_uniform", gen_uniform, &(fill_arg){lo, hi, rng});
}

void cddp_fill_normal(cddp_tensor *t, float mean, float std, cddp_rng *rng) {
    fill_host(t, "cddp_fill_normal", gen_normal, &(fill_arg){mean, std, rng});
}

cddp_tensor *cddp_uniform(cddp_ctx *ctx, int ndim, const int64_t *shape, float lo, float hi,
                          cddp_rng *rng) {
    cddp_tensor *t = cddp_empty(ctx, CDDP_F32, ndim, shape);
    if (t) cddp_fill_uniform(t, lo, hi, rng ? rng : &ctx->rng);
    return t;
}

cddp_tensor *cddp_normal(cddp_ctx *ctx, int ndim, const int64_t *shape, float mean, float std,
                         cddp_rng *rng) {
    cddp_tensor *t = cddp_empty(ctx, CDDP_F32, ndim, shape);
    if (t) cddp_fill_normal(t, mean, std, rng ? rng : &ctx->rng);
    return t;
}

cddp_tensor *cddp_requires_grad(cddp_ctx *ctx, cddp_tensor *t) {
    (void)ctx;
    if (!t) return NULL;
    CDDP_CHECK(t->dtype == CDDP_F32, "only float32 tensors can require a gradient, not %s",
               cddp_dtype_name(t->dtype));
    CDDP_CHECK(!t->node, "cddp_requires_grad is for leaf tensors, not the output of an op");
    t->requires_grad = true;
    return t;
}

cddp_tensor *cddp_retain_grad(cddp_tensor *t) {
    if (t) t->retain_grad = true;
    return t;
}

double cddp_get(const cddp_tensor *t, int64_t i) {
    CDDP_CHECK(i >= 0 && i < t->numel, "index %lld out of range for %lld elements", (long long)i,
               (long long)t->numel);
    int64_t at = t->dtype == CDDP_F32 ? cddp__blocked_offset(t, i) : i;
    size_t size = cddp_dtype_size(t->dtype);
    const char *from = (const char *)t->data + (size_t)at * size;
    unsigned char v[8] = {0};
    if (t->device->host_access) {
        memcpy(v, from, size);
    } else {
        cddp_error e = {0};
        CDDP_CHECK(cddp_device_download(t->device, v, from, size, &e) == CDDP_OK, "cddp_get: %s",
                   e.msg);
    }
    switch (t->dtype) {
    case CDDP_F32: {
        float f;
        memcpy(&f, v, sizeof f);
        return f;
    }
    case CDDP_BF16: {
        uint32_t u = (uint32_t)(v[0] | v[1] << 8) << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case CDDP_I32: {
        int32_t x;
        memcpy(&x, v, sizeof x);
        return x;
    }
    case CDDP_I64: {
        int64_t x;
        memcpy(&x, v, sizeof x);
        return (double)x;
    }
    case CDDP_F16: /* no tensor holds it (cddp__tensor_header) */
        break;
    }
    return 0;
}

double cddp_item(const cddp_tensor *t) {
    CDDP_CHECK(t->numel == 1, "cddp_item needs a tensor of one element, not %s", CDDP__SHAPE(t));
    return cddp_get(t, 0);
}

void cddp__need_f32_any(const char *op, const cddp_tensor *t) {
    CDDP_CHECK(t->dtype == CDDP_F32, "%s needs float32 input, got %s", op,
               cddp_dtype_name(t->dtype));
}

void cddp__need_f32(const char *op, const cddp_tensor *t) {
    cddp__need_f32_any(op, t);
    cddp__need_nchw(op, t);
}

void cddp__need_nchw(const char *op, const cddp_tensor *t) {
    CDDP_CHECK(!t->block,
               "%s takes row-major tensors, and its input %s is in the channel-blocked layout "
               "(blocks of %d channels): convert it with cddp_to_nchw first",
               op, CDDP__SHAPE(t), t->block);
}

int64_t cddp__blocked_offset(const cddp_tensor *t, int64_t i) {
    if (!t->block) return i;
    int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3], B = t->block;
    int64_t w = i % W, h = i / W % H, c = i / (W * H) % C, n = i / (W * H * C);
    return (((n * (C / B) + c / B) * H + h) * W + w) * B + c % B;
}
