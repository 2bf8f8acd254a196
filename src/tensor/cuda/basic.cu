/* basic.cu: the CUDA device's kernels of one family: elementwise arithmetic, fills and 16-bit
 * casts. Each kernel is followed by its launcher (common.cuh says how both are written). */
#include "tensor/cuda/common.cuh"

static __global__ void fill_k(void *dst, int64_t n, int size, uint64_t bits) {
    FOR_EACH(i, n) {
        switch (size) {
        case 1:
            ((uint8_t *)dst)[i] = (uint8_t)bits;
            break;
        case 2:
            ((uint16_t *)dst)[i] = (uint16_t)bits;
            break;
        case 4:
            ((uint32_t *)dst)[i] = (uint32_t)bits;
            break;
        default:
            ((uint64_t *)dst)[i] = bits;
        }
    }
}

void cddp__cuda_fill(cddp__kq *q, const cddp__k_fill *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    fill_k<<<blocks(a->n), THREADS, 0, s>>>(a->dst, a->n, a->size, a->bits);
    LAUNCHED(q, "fill");
}

static __global__ void accumulate_k(float *dst, const float *src, int64_t n, bool assign) {
    FOR_EACH(i, n) dst[i] = assign ? src[i] : dst[i] + src[i];
}

void cddp__cuda_accumulate(cddp__kq *q, const cddp__k_accumulate *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    accumulate_k<<<blocks(a->n), THREADS, 0, s>>>(a->dst, a->src, a->n, a->assign);
    LAUNCHED(q, "accumulate");
}

/* dst rows of their own: element by element */
static __global__ void add_rows_k(float *dst, const float *src, int64_t rows, int64_t cols,
                                  int64_t ds, int64_t ss) {
    FOR_EACH(i, rows * cols) {
        int64_t r = i / cols, c = i % cols;
        dst[r * ds + c] += src[r * ss + c];
    }
}

void cddp__cuda_add_rows(cddp__kq *q, const cddp__k_add_rows *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->cols == 0) return;
    if (a->dst_stride == 0) {
        colsum(q, s, src_rows{a->src, a->src_stride}, a->rows, a->cols, a->dst, "add_rows");
        return;
    }
    add_rows_k<<<blocks(a->rows * a->cols), THREADS, 0, s>>>(a->dst, a->src, a->rows, a->cols,
                                                             a->dst_stride, a->src_stride);
    LAUNCHED(q, "add_rows");
}

static __global__ void scale_k(float *y, const float *x, float s, int64_t n, bool add) {
    FOR_EACH(i, n) y[i] = add ? y[i] + s * x[i] : s * x[i];
}

void cddp__cuda_scale(cddp__kq *q, const cddp__k_scale *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    scale_k<<<blocks(a->n), THREADS, 0, s>>>(a->y, a->x, a->s, a->n, a->add);
    LAUNCHED(q, "scale");
}

/* rounded to nearest even by the intrinsics, as the host's conversions round */
static __global__ void cast16_k(uint16_t *h, float *f, int64_t n, bool f16, bool widen,
                                float scale) {
    FOR_EACH(i, n) {
        if (widen)
            f[i] = (f16 ? __half2float(__ushort_as_half(h[i]))
                        : __bfloat162float(__ushort_as_bfloat16(h[i]))) *
                   scale;
        else
            h[i] = f16 ? __half_as_ushort(__float2half_rn(f[i])) : bf16_of(f[i]);
    }
}

void cddp__cuda_cast16(cddp__kq *q, const cddp__k_cast16 *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    cast16_k<<<blocks(a->n), THREADS, 0, s>>>(a->h, a->f, a->n, a->f16, a->widen, a->scale);
    LAUNCHED(q, "cast16");
}

/* dst (rows, cols, dense) = src (rows ld apart) rounded to bf16 */
static __global__ void to_bf16_k(uint16_t *dst, const float *src, int64_t rows, int64_t cols,
                                 int64_t ld) {
    FOR_EACH(i, rows * cols) dst[i] = bf16_of(src[i / cols * ld + i % cols]);
}

/* The same for dense rows, 4 values a thread (n4 float4's, src 16-byte and dst 8-byte aligned):
 * no division per element, one 16-byte load and one 8-byte store. */
static __global__ void to_bf16_dense_k(uint2 *dst, const float4 *src, int64_t n4) {
    FOR_EACH(i, n4) {
        float4 v = src[i];
        dst[i] = make_uint2(bf16_of(v.x) | (uint32_t)bf16_of(v.y) << 16,
                            bf16_of(v.z) | (uint32_t)bf16_of(v.w) << 16);
    }
}

void cddp__cuda_to_bf16(cddp__kq *q, const cddp__k_to_bf16 *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->cols == 0) return;
    if (a->colsum) { /* rounded in the pass that sums the columns: src read once */
        colsum(q, s, src_rows{a->src, a->ld}, a->rows, a->cols, a->colsum, "to_bf16",
               bf16_store{a->dst, a->cols});
        return;
    }
    int64_t n = a->rows * a->cols;
    if ((a->ld == a->cols || a->rows == 1) && n % 4 == 0 && (uintptr_t)a->src % 16 == 0 &&
        (uintptr_t)a->dst % 8 == 0)
        to_bf16_dense_k<<<blocks(n / 4), THREADS, 0, s>>>((uint2 *)a->dst, (const float4 *)a->src,
                                                          n / 4);
    else
        to_bf16_k<<<blocks(n), THREADS, 0, s>>>(a->dst, a->src, a->rows, a->cols, a->ld);
    LAUNCHED(q, "to_bf16");
}

static __global__ void mul_k(float *y, const float *a, const float *b, int64_t n, bool add) {
    FOR_EACH(i, n) y[i] = add ? y[i] + a[i] * b[i] : a[i] * b[i];
}

void cddp__cuda_mul(cddp__kq *q, const cddp__k_mul *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    mul_k<<<blocks(a->n), THREADS, 0, s>>>(a->y, a->a, a->b, a->n, a->add);
    LAUNCHED(q, "mul");
}

static __device__ float unary_of(cddp__unop op, float x) {
    switch (op) {
    case CDDP__RELU:
        return x > 0.0f ? x : 0.0f; /* a NaN counts as 0, as on the CPU */
    case CDDP__GELU:
        return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    case CDDP__TANH:
        return tanhf(x);
    default:
        return 1.0f / (1.0f + expf(-x));
    }
}

static __global__ void unary_k(cddp__unop op, const float *x, float *y, int64_t n) {
    FOR_EACH(i, n) y[i] = unary_of(op, x[i]);
}

void cddp__cuda_unary(cddp__kq *q, const cddp__k_unary *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    unary_k<<<blocks(a->n), THREADS, 0, s>>>(a->op, a->x, a->y, a->n);
    LAUNCHED(q, "unary");
}

static __global__ void unary_grad_k(cddp__unop op, const float *x, const float *y, const float *dy,
                                    float *dx, int64_t n, bool assign) {
    FOR_EACH(i, n) {
        float g;
        switch (op) {
        case CDDP__RELU:
            g = y[i] > 0.0f ? dy[i] : 0.0f;
            break;
        case CDDP__GELU: {
            float a = x[i], cdf = 0.5f * (1.0f + erff(a * (float)M_SQRT1_2));
            float pdf = expf(-0.5f * a * a) * (float)(0.5 * M_2_SQRTPI * M_SQRT1_2);
            g = dy[i] * (cdf + a * pdf);
            break;
        }
        case CDDP__TANH:
            g = dy[i] * (1.0f - y[i] * y[i]);
            break;
        default:
            g = dy[i] * y[i] * (1.0f - y[i]);
        }
        dx[i] = assign ? g : dx[i] + g;
    }
}

void cddp__cuda_unary_grad(cddp__kq *q, const cddp__k_unary_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    unary_grad_k<<<blocks(a->n), THREADS, 0, s>>>(a->op, a->x, a->y, a->dy, a->dx, a->n, a->assign);
    LAUNCHED(q, "unary_grad");
}
