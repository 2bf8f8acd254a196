/* broadcast.cu: the CUDA device's kernels of one family: broadcast arithmetic (a op b over 4-D
 * shapes) and its gradients. The kernels first, then their launchers (common.cuh says how both are
 * written). */
#include "tensor/cuda/common.cuh"

/* ---- broadcast arithmetic ---------------------------------------------------------------- */

static __device__ float binop_of(cddp__binop op, float x, float y) {
    switch (op) {
    case CDDP__ADD:
        return x + y;
    case CDDP__SUB:
        return x - y;
    case CDDP__MUL:
        return x * y;
    default:
        return x / y;
    }
}

/* Output element i's offsets into a and b: its coordinates in bc's 4-D shape times the strides. */
static __device__ void offsets(const cddp__bcast &bc, int64_t i, int64_t *ia, int64_t *ib) {
    *ia = 0;
    *ib = 0;
    for (int d = 3; d >= 0; d--) {
        int64_t c = i % bc.shape[d];
        i /= bc.shape[d];
        *ia += c * bc.sa[d];
        *ib += c * bc.sb[d];
    }
}

static __global__ void binary_k(cddp__binop op, cddp__bcast bc, const float *a, const float *b,
                                float *z, int64_t n) {
    FOR_EACH(i, n) {
        int64_t ia = i, ib = i;
        if (!bc.same) offsets(bc, i, &ia, &ib);
        z[i] = binop_of(op, a[ia], b[ib]);
    }
}

void cddp__cuda_binary(cddp__kq *q, const cddp__k_binary *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    if (a->n == 0) return;
    binary_k<<<blocks(a->n), THREADS, 0, s>>>(a->op, a->bc, a->a, a->b, a->z, a->n);
    LAUNCHED(q, "binary");
}

/* The term output i adds to a's (of_b: b's) gradient. */
static __device__ float binary_term(cddp__binop op, bool of_b, float dz, float x, float y) {
    switch (op) {
    case CDDP__ADD:
        return dz;
    case CDDP__SUB:
        return of_b ? -dz : dz;
    case CDDP__MUL:
        return of_b ? dz * x : dz * y;
    default:
        return of_b ? -(dz * x / (y * y)) : dz / y;
    }
}

/* One input's gradient (of_b: b's, else a's), a thread per element of that input: it adds the
 * terms of every output element that read it, in the outputs' order (the CPU's), with no atomics.
 * The input's own dimensions are those with a stride (or of length 1); the others stretched. */
static __global__ void binary_grad_k(cddp__binop op, cddp__bcast bc, bool of_b, const float *dz,
                                     const float *a, const float *b, float *dst, int64_t elems) {
    const int64_t *st = of_b ? bc.sb : bc.sa;
    FOR_EACH(k, elems) {
        if (bc.same) {
            dst[k] += binary_term(op, of_b, dz[k], a[k], b[k]);
            continue;
        }
        int64_t c[4], span[4], r = k, at = 0;
        for (int d = 3; d >= 0; d--) {
            bool stretched = st[d] == 0 && bc.shape[d] > 1;
            span[d] = stretched ? bc.shape[d] : 1;
            c[d] = stretched ? 0 : r % bc.shape[d];
            if (!stretched) r /= bc.shape[d];
            at += c[d] * st[d];
        }
        float acc = dst[at];
        for (int64_t e0 = 0; e0 < span[0]; e0++)
            for (int64_t e1 = 0; e1 < span[1]; e1++)
                for (int64_t e2 = 0; e2 < span[2]; e2++)
                    for (int64_t e3 = 0; e3 < span[3]; e3++) {
                        int64_t d0 = c[0] + e0, d1 = c[1] + e1, d2 = c[2] + e2, d3 = c[3] + e3;
                        int64_t i = ((d0 * bc.shape[1] + d1) * bc.shape[2] + d2) * bc.shape[3] + d3;
                        int64_t ia = d0 * bc.sa[0] + d1 * bc.sa[1] + d2 * bc.sa[2] + d3 * bc.sa[3];
                        int64_t ib = d0 * bc.sb[0] + d1 * bc.sb[1] + d2 * bc.sb[2] + d3 * bc.sb[3];
                        acc += binary_term(op, of_b, dz[i], a[ia], b[ib]);
                    }
        dst[at] = acc;
    }
}

/* The elements of an input of the broadcast whose strides are st: its dimensions that stretch
 * count once. */
static int64_t input_elems(const cddp__bcast *bc, const int64_t *st) {
    int64_t n = 1;
    for (int d = 0; d < 4; d++)
        if (st[d] != 0 || bc->shape[d] == 1) n *= bc->shape[d];
    return n;
}

void cddp__cuda_binary_grad(cddp__kq *q, const cddp__k_binary_grad *a) {
    cudaStream_t s = cddp__cuda_enter(q);
    int64_t n = a->bc.shape[0] * a->bc.shape[1] * a->bc.shape[2] * a->bc.shape[3];
    if (n == 0) return;
    for (int of_b = 0; of_b < 2; of_b++) {
        float *dst = of_b ? a->db : a->da;
        if (!dst) continue;
        int64_t e = a->bc.same ? n : input_elems(&a->bc, of_b ? a->bc.sb : a->bc.sa);
        binary_grad_k<<<blocks(e), THREADS, 0, s>>>(a->op, a->bc, of_b, a->dz, a->a, a->b, dst, e);
        if (LAUNCHED(q, "binary_grad")) return;
    }
}
