/* tensor.c: the step context, tensor creation and the random generator.
 *
 * Every tensor made here is a header and its data in the context's arena; nothing is freed one
 * by one. A failed allocation latches an error in the context and returns NULL, and every
 * function given a NULL tensor returns NULL, so a step's errors surface once, at its end.
 */
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *cddp_dtype_name(cddp_dtype dtype) {
    switch (dtype) {
    case CDDP_F32:
        return "float32";
    case CDDP_I32:
        return "int32";
    case CDDP_I64:
        return "int64";
    }
    return "unknown";
}

size_t cddp_dtype_size(cddp_dtype dtype) {
    return dtype == CDDP_I64 ? 8 : 4;
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

cddp_ctx *cddp_ctx_create(const cddp_ctx_options *opts) {
    cddp_ctx_options o = opts ? *opts : (cddp_ctx_options){0};
    cddp_ctx *ctx = cddp_calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->arena = cddp_arena_create(o.arena_initial_bytes ? o.arena_initial_bytes : 16u << 20,
                                   o.arena_max_bytes);
    if (!ctx->arena) {
        cddp_free(ctx);
        return NULL;
    }
    cddp_rng_seed(&ctx->rng, o.seed);
    ctx->grad_enabled = true;
    return ctx;
}

void cddp_ctx_destroy(cddp_ctx *ctx) {
    if (!ctx) return;
    cddp_arena_destroy(ctx->arena);
    cddp_free(ctx);
}

void cddp_ctx_reset(cddp_ctx *ctx) {
    cddp_arena_reset(ctx->arena);
    ctx->tape = NULL;
    ctx->nnodes = 0;
    ctx->step_state = NULL;
    cddp_error_clear(&ctx->err);
}

int cddp_ctx_status(const cddp_ctx *ctx) {
    return ctx->err.code;
}

const char *cddp_ctx_error(const cddp_ctx *ctx) {
    return cddp_error_msg(&ctx->err);
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

static void check_shape(int ndim, const int64_t *shape) {
    CDDP_CHECK(ndim >= 0 && ndim <= CDDP_MAX_DIMS, "tensors have 0 to %d dimensions, not %d",
               CDDP_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        CDDP_CHECK(shape[i] >= 0, "dimension %d has negative size %lld", i, (long long)shape[i]);
}

cddp_tensor *cddp__tensor_header(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    check_shape(ndim, shape);
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
    return t;
}

cddp_tensor *cddp_empty(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    cddp_tensor *t = cddp__tensor_header(ctx, dtype, ndim, shape);
    if (!t) return NULL;
    t->data = cddp__ctx_alloc(ctx, (size_t)t->numel * cddp_dtype_size(dtype));
    return t->data ? t : NULL;
}

cddp_tensor *cddp_zeros(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    cddp_tensor *t = cddp_empty(ctx, dtype, ndim, shape);
    if (t) memset(t->data, 0, (size_t)t->numel * cddp_dtype_size(dtype));
    return t;
}

cddp_tensor *cddp_ones(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape) {
    cddp_tensor *t = cddp_empty(ctx, dtype, ndim, shape);
    if (!t) return NULL;
    for (int64_t i = 0; i < t->numel; i++) {
        switch (dtype) {
        case CDDP_F32:
            ((float *)t->data)[i] = 1.0f;
            break;
        case CDDP_I32:
            ((int32_t *)t->data)[i] = 1;
            break;
        case CDDP_I64:
            ((int64_t *)t->data)[i] = 1;
            break;
        }
    }
    return t;
}

cddp_tensor *cddp_from_data(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape,
                            const void *data) {
    cddp_tensor *t = cddp_empty(ctx, dtype, ndim, shape);
    if (t) memcpy(t->data, data, (size_t)t->numel * cddp_dtype_size(dtype));
    return t;
}

cddp_tensor *cddp_wrap(cddp_ctx *ctx, cddp_dtype dtype, int ndim, const int64_t *shape,
                       void *data) {
    cddp_tensor *t = cddp__tensor_header(ctx, dtype, ndim, shape);
    if (t) t->data = data;
    return t;
}

void cddp_fill(cddp_tensor *t, float value) {
    CDDP_CHECK(t->dtype == CDDP_F32, "cddp_fill needs a float32 tensor");
    for (int64_t i = 0; i < t->numel; i++) cddp_f32(t)[i] = value;
}

void cddp_fill_uniform(cddp_tensor *t, float lo, float hi, cddp_rng *rng) {
    CDDP_CHECK(t->dtype == CDDP_F32, "cddp_fill_uniform needs a float32 tensor");
    for (int64_t i = 0; i < t->numel; i++) cddp_f32(t)[i] = lo + (hi - lo) * cddp_rng_uniform(rng);
}

void cddp_fill_normal(cddp_tensor *t, float mean, float std, cddp_rng *rng) {
    CDDP_CHECK(t->dtype == CDDP_F32, "cddp_fill_normal needs a float32 tensor");
    for (int64_t i = 0; i < t->numel; i++)
        cddp_f32(t)[i] = mean + std * (float)cddp_rng_normal(rng);
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

double cddp_get(const cddp_tensor *t, int64_t i) {
    CDDP_CHECK(i >= 0 && i < t->numel, "index %lld out of range for %lld elements", (long long)i,
               (long long)t->numel);
    switch (t->dtype) {
    case CDDP_F32:
        return ((const float *)t->data)[cddp__blocked_offset(t, i)];
    case CDDP_I32:
        return ((const int32_t *)t->data)[i];
    case CDDP_I64:
        return (double)((const int64_t *)t->data)[i];
    }
    return 0;
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

cddp_tensor *cddp__scalar(cddp_ctx *ctx, float v) {
    cddp_tensor *t = cddp_empty(ctx, CDDP_F32, 0, NULL);
    if (t) cddp_f32(t)[0] = v;
    return t;
}
