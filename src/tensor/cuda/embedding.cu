/* embedding.cu: the CUDA device's kernels of one family: the embedding and its backward (by
 * column, or by rows grouped by id). The kernels first, then their launchers (common.cuh says how
 * both are written). */
#include "tensor/cuda/common.cuh"

/* An id outside [0, V) was reported by check_ids (at the device's next synchronize): its rows are
 * skipped here, never read or written out of the table. */
static __global__ void embedding_k(const float *table, const void *ids, cddp_dtype dtype,
                                   float *out, int64_t n, int64_t V, int64_t C) {
    FOR_EACH(k, n * C) {
        int64_t id = index_at(ids, dtype, k / C);
        out[k] = id >= 0 && id < V ? table[id * C + k % C] : 0.0f;
    }
}

void cddp__cuda_embedding(cddp__kq *q, const cddp__k_embedding *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n * a->C == 0) return;
    embedding_k<<<blocks(a->n * a->C), THREADS, 0, s>>>(a->table, a->ids, a->dtype, a->out, a->n,
                                                        a->V, a->C);
    LAUNCHED(q, "embedding");
}

/* a thread per column, positions in order: the CPU's order, without atomics */
static __global__ void embedding_grad_k(float *dtable, const void *ids, cddp_dtype dtype,
                                        const float *dy, int64_t n, int64_t V, int64_t C) {
    FOR_EACH(c, C) {
        for (int64_t i = 0; i < n; i++) {
            int64_t id = index_at(ids, dtype, i);
            if (id >= 0 && id < V) dtable[id * C + c] += dy[i * C + c];
        }
    }
}

/* The embedding's backward by rows: the positions grouped by id, in order, then a thread per
 * (id, column) adds its positions' gradients in that order (the CPU's order, without atomics).
 * count[v]: how many positions hold id v (ids outside [0, V) were reported, and are skipped). */
static __global__ void id_count_k(const void *ids, cddp_dtype dtype, int64_t n, int64_t V,
                                  int *count) {
    FOR_EACH(i, n) {
        int64_t id = index_at(ids, dtype, i);
        if (id >= 0 && id < V) atomicAdd(&count[id], 1);
    }
}

/* start[v] = the positions with ids before v (an exclusive scan of count, one block: each thread
 * a run of ids, then the runs' totals), start[V] = all of them */
static __global__ void id_scan_k(const int *count, int *start, int64_t V) {
    __shared__ int run[REDUCE];
    int64_t per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per;
    int64_t hi = lo + per < V ? lo + per : V;
    int t = 0;
    for (int64_t v = lo; v < hi; v++) t += count[v];
    run[threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (unsigned k = 0; k < blockDim.x; k++) {
            int c = run[k];
            run[k] = acc;
            acc += c;
        }
        start[V] = acc;
    }
    __syncthreads();
    int acc = run[threadIdx.x];
    for (int64_t v = lo; v < hi; v++) {
        start[v] = acc;
        acc += count[v];
    }
}

/* pos[start[id] + (the positions before i with the same id)] = i: positions grouped by id, each
 * group in order */
static __global__ void id_place_k(const void *ids, cddp_dtype dtype, int64_t n, int64_t V,
                                  const int *start, int *pos) {
    FOR_EACH(i, n) {
        int64_t id = index_at(ids, dtype, i);
        if (id < 0 || id >= V) continue;
        int before = 0;
        for (int64_t j = 0; j < i; j++) before += index_at(ids, dtype, j) == id;
        pos[start[id] + before] = (int)i;
    }
}

static __global__ void embedding_rows_k(float *dtable, const int *start, const int *pos,
                                        const float *dy, int64_t V, int64_t C) {
    FOR_EACH(k, V * C) {
        int64_t v = k / C, c = k % C;
        int a = start[v], b = start[v + 1];
        if (a == b) continue;
        float s = dtable[k];
        for (int j = a; j < b; j++) s += dy[(int64_t)pos[j] * C + c];
        dtable[k] = s;
    }
}

/* With scratch (the caller's context) and ids that fit an int: the positions grouped by id first
 * (embedding_rows_k); else a thread per column walks every position. */
void cddp__cuda_embedding_grad(cddp__kq *q, const cddp__k_embedding_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n * a->C == 0) return;
    if (q->scratch && a->n < INT32_MAX && a->V < INT32_MAX) {
        int *count = (int *)cddp__kq_scratch(q, (size_t)(2 * (a->V + 1) + a->n) * sizeof(int));
        if (!count) return;
        int *start = count + a->V + 1, *pos = start + a->V + 1;
        if (cddp__cuda_failed(q, cudaMemsetAsync(count, 0, (size_t)a->V * sizeof(int), s),
                              "embedding_grad's counts"))
            return;
        id_count_k<<<blocks(a->n), THREADS, 0, s>>>(a->ids, a->dtype, a->n, a->V, count);
        id_scan_k<<<1, REDUCE, 0, s>>>(count, start, a->V);
        id_place_k<<<blocks(a->n), THREADS, 0, s>>>(a->ids, a->dtype, a->n, a->V, start, pos);
        embedding_rows_k<<<blocks(a->V * a->C), THREADS, 0, s>>>(a->dtable, start, pos, a->dy, a->V,
                                                                 a->C);
        LAUNCHED(q, "embedding_grad");
        return;
    }
    embedding_grad_k<<<blocks(a->C), THREADS, 0, s>>>(a->dtable, a->ids, a->dtype, a->dy, a->n,
                                                      a->V, a->C);
    LAUNCHED(q, "embedding_grad");
}
