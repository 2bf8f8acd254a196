/* attention.cu: the CUDA device's kernels of one family: attention by rows (flash.cu has the fused
 * kernels): the causal softmax and generation's key/value cache. The kernels first, then their
 * launchers (common.cuh says how both are written). */
#include "tensor/cuda/common.cuh"

/* Causal attention's softmax, a block per row of T scores (row r: query r % T): the softmax of its
 * first r % T + 1 values, zeros after (sums in double). */
static __global__ void causal_softmax_k(float *s, int64_t T) {
    float *row = s + blockIdx.x * T;
    int64_t t = blockIdx.x % T;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    double sum = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) {
        row[j] = expf(row[j] - m);
        sum += row[j];
    }
    float inv = 1.0f / (float)block_sum(sum);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) row[j] = j <= t ? row[j] * inv : 0.0f;
}

void cddp__cuda_causal_softmax(cddp__kq *q, const cddp__k_causal_softmax *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->T == 0) return;
    causal_softmax_k<<<(unsigned)a->rows, THREADS, 0, s>>>(a->s, a->T);
    LAUNCHED(q, "causal_softmax");
}

/* Its backward, a block per row, in place: d (dP on entry) becomes p (dP - sum(dP p)) on the
 * row's first r % T + 1 values, zeros after (the sum in double). */
static __global__ void causal_softmax_grad_k(const float *p, float *d, int64_t T) {
    const float *pr = p + blockIdx.x * T;
    float *dr = d + blockIdx.x * T;
    int64_t t = blockIdx.x % T;
    double s = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) s += dr[j] * pr[j];
    float dot = (float)block_sum(s);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
        dr[j] = j <= t ? pr[j] * (dr[j] - dot) : 0.0f;
}

void cddp__cuda_causal_softmax_grad(cddp__kq *q, const cddp__k_causal_softmax_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->rows == 0 || a->T == 0) return;
    causal_softmax_grad_k<<<(unsigned)a->rows, THREADS, 0, s>>>(a->p, a->d, a->T);
    LAUNCHED(q, "causal_softmax_grad");
}

/* Generation: the new positions' keys and values into the cache (B, L, 2C) at past.. */
static __global__ void kv_store_k(const float *qkv, float *cache, int64_t B, int64_t T, int64_t C,
                                  int64_t past, int64_t L) {
    FOR_EACH(i, B * T * 2 * C) {
        int64_t c = i % (2 * C), bt = i / (2 * C), t = bt % T, b = bt / T;
        cache[(b * L + past + t) * 2 * C + c] = qkv[(b * T + t) * 3 * C + C + c];
    }
}

/* A block per (batch element, new position t, head): the query against the cached keys 0..past+t
 * (scores in shared memory), their softmax, the values mixed by it. */
static __global__ void attn_cached_k(const float *qkv, const float *cache, float *out, int64_t T,
                                     int64_t C, int64_t NH, int64_t past, int64_t L) {
    extern __shared__ float sc[];
    int64_t h = blockIdx.x % NH, bt = blockIdx.x / NH, t = bt % T, b = bt / T, HS = C / NH;
    int64_t i = past + t;
    const float *q = qkv + (b * T + t) * 3 * C + h * HS, *kv = cache + b * L * 2 * C;
    float scale = rsqrtf((float)HS), m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
        const float *k = kv + j * 2 * C + h * HS;
        float dot = 0.0f;
        for (int64_t d = 0; d < HS; d++) dot += q[d] * k[d];
        sc[j] = scale * dot;
        m = fmaxf(m, sc[j]);
    }
    m = block_max(m);
    double sum = 0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
        sc[j] = expf(sc[j] - m);
        sum += sc[j];
    }
    float total = (float)block_sum(sum); /* its __syncthreads also orders sc's writes */
    for (int64_t d = threadIdx.x; d < HS; d += blockDim.x) {
        float o = 0.0f;
        for (int64_t j = 0; j <= i; j++) o += sc[j] / total * kv[j * 2 * C + C + h * HS + d];
        out[(b * T + t) * C + h * HS + d] = o;
    }
}

void cddp__cuda_attention_cached(cddp__kq *q, const cddp__k_attention_cached *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->B * a->T;
    if (n == 0) return;
    size_t shared = (size_t)(a->past + a->T) * sizeof(float);
    if (shared > 48 * 1024) {
        cddp__kq_fail(q, CDDP_EUNSUPPORTED,
                      "%s: attention with a cache of %lld positions: the CUDA device's kernel "
                      "holds at most 12288",
                      q->dev->name, (long long)(a->past + a->T));
        return;
    }
    kv_store_k<<<blocks(n * 2 * a->C), THREADS, 0, s>>>(a->qkv, a->cache, a->B, a->T, a->C, a->past,
                                                        a->L);
    attn_cached_k<<<(unsigned)(n * a->NH), THREADS, shared, s>>>(a->qkv, a->cache, a->out, a->T,
                                                                 a->C, a->NH, a->past, a->L);
    LAUNCHED(q, "attention_cached");
}
