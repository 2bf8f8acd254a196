/* matmul.c: the CPU's gemm kernel: float32 products on gemm.c's GEMM, and bf16 products (compute
 * CDDP_BF16: a context's mixed precision, cddp_ctx_options.compute).
 *
 * Each operand is rounded to bf16 (to nearest, ties to even: AVX512-BF16's vcvtne2ps2bf16) into
 * scratch memory in its stored orientation, unless the caller rounded it already (A16, B16: the
 * to_bf16 kernel, below), and oneDNN's matmul multiplies the two with float32 accumulation into
 * the float32 result, alpha as its output scale, a bias as its bias and beta as a sum post-op; the
 * primitive is made once per shape (dnnl.h). oneDNN's brgemm takes the transposed operands as they
 * are stored. On one Zen 4 core (4096 x 384 x 384 and the GPT's shapes): 196-213 GFLOP/s, against
 * 102-111 in float32.
 *
 * oneDNN multiplies only on a processor with bf16 units (AVX512-BF16, AMX): its own emulation on
 * AVX-512 alone ran at 38 GFLOP/s against float32's 105, and it has none on AVX2. Elsewhere cddp
 * emulates (cddp__cpu_computes says so once; CDDP_BF16_EMULATE=0 refuses instead): the rounded
 * operands are multiplied by the float32 GEMM. A product of two bf16 values is exact in float32,
 * so that gives the same numbers as bf16 hardware up to the order of the sums. */
#include "tensor/cpu/dnnl.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* ---- the operands' buffers ------------------------------------------------------------------ */

/* Each thread's two buffers for the rounded operands, grown as needed and kept: a kernel has
 * finished with them when it returns, so one pair per thread serves every product (the step's
 * arena would keep every product's copies until the reset: half a GiB more for a 6-layer GPT). */
typedef struct buffers {
    void *p[2];
    size_t n[2];
} buffers;

static pthread_key_t buffers_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void drop(void *b) {
    buffers *own = b;
    cddp_aligned_free(own->p[0]);
    cddp_aligned_free(own->p[1]);
    cddp_free(own);
}

static void make_key(void) {
    CDDP_CHECK(pthread_key_create(&buffers_key, drop) == 0, "bf16: cannot make a thread key");
}

/* Buffer i (0, 1) of this thread, at least bytes long; NULL (reported through q) when out of
 * memory. */
static void *buffer(cddp__kq *q, int i, size_t bytes) {
    pthread_once(&key_once, make_key);
    buffers *b = pthread_getspecific(buffers_key);
    if (!b && (b = cddp_calloc(1, sizeof *b))) pthread_setspecific(buffers_key, b);
    if (b && b->n[i] < bytes) {
        cddp_aligned_free(b->p[i]);
        b->n[i] = 0;
        if ((b->p[i] = cddp_aligned_alloc(bytes))) b->n[i] = bytes;
    }
    if (b && b->p[i] && b->n[i] >= bytes) return b->p[i];
    cddp__kq_fail(q, CDDP_ENOMEM, "bf16: out of memory for a product's %zu MiB operand",
                  bytes >> 20);
    return NULL;
}

/* ---- rounding to bf16 ----------------------------------------------------------------------- */

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
to_bf16_avx512(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512(dst + i, (__m512i)v);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)v);
    }
}

static bool has_avx512bf16(void) {
    return __builtin_cpu_supports("avx512bf16");
}

/* cddp__round_bf16 on 16 floats at a time: both results made (rounded to nearest even, and a NaN
 * kept quiet), one kept per lane, the 32-bit lanes packed to 16 bits in order */
__attribute__((target("avx2"))) static void to_bf16_avx2(uint16_t *dst, const float *src,
                                                         int64_t n) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                  abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                  quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    __m256i h[2];
    for (; i + 16 <= n; i += 16) {
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(src + i + 8 * k));
            __m256i top = _mm256_srli_epi32(u, 16);
            __m256i even = _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(top, one)), 16);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            h[k] = _mm256_blendv_epi8(even, _mm256_or_si256(top, quiet), nan);
        }
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), packed);
    }
    for (; i < n; i++) dst[i] = cddp__round_bf16(src[i]);
}

static int narrow_path; /* 1 AVX512-BF16, 2 AVX2, 3 neither */
static pthread_once_t narrow_once = PTHREAD_ONCE_INIT;

static void find_narrow(void) {
    narrow_path = has_avx512bf16() ? 1 : __builtin_cpu_supports("avx2") ? 2 : 3;
}

void cddp__bf16_narrow_n(uint16_t *dst, const float *src, int64_t n) {
    pthread_once(&narrow_once, find_narrow);
    int path = narrow_path;
    if (path == 1)
        to_bf16_avx512(dst, src, n);
    else if (path == 2)
        to_bf16_avx2(dst, src, n);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = cddp__round_bf16(src[i]);
}

void cddp__to_bf16_rows(uint16_t *dst, int64_t ldd, const float *src, int64_t ld, int64_t rows,
                        int64_t cols) {
    for (int64_t r = 0; r < rows; r++) cddp__bf16_narrow_n(dst + r * ldd, src + r * ld, cols);
}

void cddp__bf16_round_rows(float *dst, const float *src, int64_t ld, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) cddp__bf16_round_n(dst + r * cols, src + r * ld, cols);
}

void cddp__bf16_round(float *dst, const float *src, int64_t n) {
    cddp__bf16_round_rows(dst, src, n, 1, n);
}

/* ---- whether, and on what ------------------------------------------------------------------- */

/* CDDP_BF16_EMULATE: auto (emulate, and say so once), 1 (emulate) or 0 (refuse). */
static bool emulate(void) {
    return strcmp(cddp_knob_str(CDDP_KNOB_BF16_EMULATE), "0") != 0;
}

static void warn_emulated(void) {
    int rank = 0, world = 1;
    cddp_error err = {0};
    if (cddp_env_rank_world(&rank, &world, &err) != CDDP_OK) rank = 0;
    if (rank == 0 && !strcmp(cddp_knob_str(CDDP_KNOB_BF16_EMULATE), "auto")) /* one line a job */
        cddp_log(CDDP_LOG_WARN, "cpu",
                 "this processor has no bf16 units (AVX512-BF16, AMX): bf16 products are emulated, "
                 "bf16-rounded operands multiplied in float32, slower than --dtype fp32 "
                 "(CDDP_BF16_EMULATE=1 says nothing, 0 refuses)");
}
static pthread_once_t warn_once = PTHREAD_ONCE_INIT;

/* AMX or AVX512-BF16, as oneDNN will use it (DNNL_MAX_CPU_ISA applies), and the conversions' own;
 * NULL when neither. Asked once: every bf16 product asks. */
static const char *native_path;
static pthread_once_t native_once = PTHREAD_ONCE_INIT;

static void find_native(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if (!has_avx512bf16()) return;
    if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx)
        native_path = "bf16 products on AMX (oneDNN's avx512_core_amx)";
    else if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16)
        native_path = "bf16 products on AVX512-BF16 (oneDNN's avx512_core_bf16)";
}

static const char *native(void) {
    pthread_once(&native_once, find_native);
    return native_path;
}

bool cddp__cpu_bf16_native(void) {
    return native() != NULL;
}

int cddp__cpu_computes(cddp_dtype dtype, const char **how, cddp_error *err) {
    const char *on = NULL;
    if (dtype == CDDP_F32)
        on = "float32 products";
    else if (dtype == CDDP_BF16)
        on = native()    ? native()
             : emulate() ? "bf16 products emulated (no AVX512-BF16 or AMX): bf16-rounded operands "
                           "multiplied in float32, slower than float32"
                         : NULL;
    else
        return cddp_error_set(err, CDDP_EINVAL, "the CPU multiplies in float32 or bf16, not %s",
                              cddp_dtype_name(dtype));
    if (!on)
        return cddp_error_set(
            err, CDDP_EUNSUPPORTED,
            "bf16 on the CPU needs AVX512-BF16 or AMX, and this processor has neither (or "
            "DNNL_MAX_CPU_ISA keeps oneDNN from them), and CDDP_BF16_EMULATE=0 refuses the "
            "emulation: train in fp32, or unset CDDP_BF16_EMULATE to emulate bf16, slowly");
    if (dtype == CDDP_BF16 && !native()) pthread_once(&warn_once, warn_emulated);
    if (how) *how = on;
    return CDDP_OK;
}

/* ---- the product ---------------------------------------------------------------------------- */

#define MATMUL_BF16 0x6d6d5f6266313600 /* "mm_bf16": no convolution's key starts so */

typedef struct mm_key {
    int64_t kind, M, N, K, ta, tb, ldc, alpha, beta; /* alpha, beta: their bits */
    int64_t bias;                                    /* a bias, added by the primitive */
} mm_key;

/* The operands' layouts: as stored, densely (rows of K or M for A, of N or K for B). */
static void describe(const mm_key *k, dnnl_memory_desc_t *a, dnnl_memory_desc_t *b,
                     dnnl_memory_desc_t *c, dnnl_memory_desc_t *bias) {
    cddp__dnnl_ok(
        dnnl_memory_desc_init_by_strides(a, 2, (dnnl_dims_t){k->M, k->K}, dnnl_bf16,
                                         k->ta ? (dnnl_dims_t){1, k->M} : (dnnl_dims_t){k->K, 1}),
        "describing a bf16 operand");
    cddp__dnnl_ok(
        dnnl_memory_desc_init_by_strides(b, 2, (dnnl_dims_t){k->K, k->N}, dnnl_bf16,
                                         k->tb ? (dnnl_dims_t){1, k->K} : (dnnl_dims_t){k->N, 1}),
        "describing a bf16 operand");
    cddp__dnnl_ok(dnnl_memory_desc_init_by_strides(c, 2, (dnnl_dims_t){k->M, k->N}, dnnl_f32,
                                                   (dnnl_dims_t){k->ldc, 1}),
                  "describing a product");
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(bias, 2, (dnnl_dims_t){1, k->N}, dnnl_f32, dnnl_ab),
                  "describing a bias");
}

static dnnl_status_t make_mm(dnnl_primitive_desc_t *pd, const void *key,
                             const_dnnl_primitive_attr_t attr) {
    const mm_key *k = key;
    float alpha, beta;
    int32_t bits = (int32_t)k->alpha;
    memcpy(&alpha, &bits, sizeof alpha);
    bits = (int32_t)k->beta;
    memcpy(&beta, &bits, sizeof beta);
    dnnl_memory_desc_t a, b, c, bias;
    describe(k, &a, &b, &c, &bias);
    dnnl_matmul_desc_t d;
    cddp__dnnl_ok(dnnl_matmul_desc_init(&d, &a, &b, k->bias ? &bias : NULL, &c),
                  "describing a bf16 product");
    dnnl_primitive_attr_t own;
    dnnl_post_ops_t po;
    cddp__dnnl_ok(dnnl_primitive_attr_clone(&own, attr), "copying attributes");
    if (alpha != 1.0f)
        cddp__dnnl_ok(dnnl_primitive_attr_set_output_scales(own, 1, 0, &alpha),
                      "a product's scale");
    if (beta != 0.0f) {
        cddp__dnnl_ok(dnnl_post_ops_create(&po), "making post-ops");
        cddp__dnnl_ok(dnnl_post_ops_append_sum(po, beta), "a product's sum");
        cddp__dnnl_ok(dnnl_primitive_attr_set_post_ops(own, po), "setting post-ops");
        dnnl_post_ops_destroy(po);
    }
    dnnl_status_t s = dnnl_primitive_desc_create(pd, &d, own, cddp__dnnl_engine(), NULL);
    dnnl_primitive_attr_destroy(own);
    return s;
}

/* The operands as the product takes them, each stored rows x cols densely: bf16 (native), or
 * float32 rounded to bf16 (the emulation); A16 and B16 as given where native, else copies in this
 * thread's buffers. False (reported through q) when out of memory. */
typedef struct operands {
    int64_t ar, ac, br, bc;
    const void *A, *B;
} operands;

static bool operands_of(cddp__kq *q, const cddp__k_gemm *a, bool native, operands *o) {
    *o = (operands){.ar = a->ta ? a->K : a->M,
                    .ac = a->ta ? a->M : a->K,
                    .br = a->tb ? a->N : a->K,
                    .bc = a->tb ? a->K : a->N};
    for (int i = 0; i < 2; i++) {
        const uint16_t *h = i ? a->B16 : a->A16;
        const float *f = i ? a->B : a->A;
        int64_t rows = i ? o->br : o->ar, cols = i ? o->bc : o->ac, ld = i ? a->ldb : a->lda;
        const void **to = i ? &o->B : &o->A;
        if (native && h) {
            *to = h;
            continue;
        }
        void *buf =
            buffer(q, i, (native ? sizeof(uint16_t) : sizeof(float)) * (size_t)(rows * cols));
        if (!buf) return false;
        *to = buf;
        if (native)
            cddp__to_bf16_rows(buf, cols, f, ld, rows, cols);
        else if (h) /* bf16 to float32: exact */
            cddp__bf16_widen_n(buf, h, rows * cols);
        else
            cddp__bf16_round_rows(buf, f, ld, rows, cols);
    }
    return true;
}

static void add_bias_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_gemm *a = arg;
    for (int64_t i = lo; i < hi; i++) cddp__add_into(a->C + i * a->ldc, a->bias, a->N);
}

/* The rows split across the math threads. */
static void add_bias(const cddp__k_gemm *a) {
    cddp__cpu_split_rows(a->M, a->N, add_bias_part, a);
}

static void gemm_bf16(cddp__kq *q, const cddp__k_gemm *a) {
    if (a->M == 0 || a->N == 0 || a->K == 0) { /* no product: beta C (+ the bias) */
        cddp__gemm_ld(a->ta, a->tb, a->M, a->N, 0, a->alpha, NULL, a->lda, NULL, a->ldb, a->beta,
                      a->C, a->ldc);
        if (a->bias) add_bias(a);
        return;
    }
    operands o;
    if (!operands_of(q, a, native() != NULL, &o)) return;
    if (!native()) { /* the emulation: the rounded operands multiplied in float32 */
        cddp__gemm_ld(a->ta, a->tb, a->M, a->N, a->K, a->alpha, o.A, o.ac, o.B, o.bc, a->beta, a->C,
                      a->ldc);
        if (a->bias) add_bias(a);
        return;
    }
    mm_key k = {.kind = MATMUL_BF16,
                .M = a->M,
                .N = a->N,
                .K = a->K,
                .ta = a->ta,
                .tb = a->tb,
                .ldc = a->ldc,
                .bias = a->bias && a->alpha == 1.0f};
    int32_t bits;
    memcpy(&bits, &a->alpha, sizeof bits);
    k.alpha = bits;
    memcpy(&bits, &a->beta, sizeof bits);
    k.beta = bits;
    /* the primitive was made for exactly these layouts: its own are theirs */
    const cddp__dnnl_prim *p = cddp__dnnl_get(&k, sizeof k, make_mm);
    cddp__dnnl_arg args[4] = {
        {.arg = DNNL_ARG_SRC, .data = (void *)o.A, .md = cddp__dnnl_md(p, DNNL_ARG_SRC)},
        {.arg = DNNL_ARG_WEIGHTS, .data = (void *)o.B, .md = cddp__dnnl_md(p, DNNL_ARG_WEIGHTS)},
        {.arg = DNNL_ARG_DST,
         .data = a->C,
         .io = CDDP__DNNL_OUT,
         .md = cddp__dnnl_md(p, DNNL_ARG_DST)},
        {.arg = DNNL_ARG_BIAS}};
    if (k.bias)
        args[3] = (cddp__dnnl_arg){
            .arg = DNNL_ARG_BIAS, .data = (void *)a->bias, .md = cddp__dnnl_md(p, DNNL_ARG_BIAS)};
    if (cddp__dnnl_run(q, p, k.bias ? 4 : 3, args) && a->bias && !k.bias) add_bias(a);
}

bool cddp__cpu_gemm_takes_bf16(void) {
    return true;
}

void cddp__cpu_gemm(cddp__kq *q, const cddp__k_gemm *a) {
    if (a->batch > 1) { /* a batch: its products one by one */
        CDDP_CHECK(!a->A16 && !a->B16 && !a->bias,
                   "gemm: a batch of products takes float32 operands and no bias");
        cddp__k_gemm one = *a;
        one.batch = 1;
        for (int64_t i = 0; i < a->batch; i++) {
            one.A = a->A + i * a->stride_a;
            one.B = a->B + i * a->stride_b;
            one.C = a->C + i * a->stride_c;
            cddp__cpu_gemm(q, &one);
        }
        return;
    }
    if (a->compute == CDDP_BF16) {
        gemm_bf16(q, a);
        return;
    }
    cddp__gemm_ld(a->ta, a->tb, a->M, a->N, a->K, a->alpha, a->A, a->lda, a->B, a->ldb, a->beta,
                  a->C, a->ldc);
    if (a->bias) add_bias(a);
}

/* Rows lo..hi; with column sums, columns lo..hi of every row, each row's sums taken while it is in
 * cache from its rounding. */
static void to_bf16_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_to_bf16 *a = arg;
    if (!a->colsum) {
        cddp__to_bf16_rows(a->dst + lo * a->cols, a->cols, a->src + lo * a->ld, a->ld, hi - lo,
                           a->cols);
        return;
    }
    for (int64_t r = 0; r < a->rows; r++) {
        cddp__bf16_narrow_n(a->dst + r * a->cols + lo, a->src + r * a->ld + lo, hi - lo);
        cddp__add_into(a->colsum + lo, a->src + r * a->ld + lo, hi - lo);
    }
}

/* Split across the math threads: the rows, or with column sums the columns. */
void cddp__cpu_to_bf16(cddp__kq *q, const cddp__k_to_bf16 *a) {
    (void)q;
    if (!a->colsum) {
        cddp__cpu_split_rows(a->rows, a->cols, to_bf16_part, a);
        return;
    }
    cddp__cpu_split_cols(a->rows, a->cols, to_bf16_part, a);
}
