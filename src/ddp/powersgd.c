/* powersgd.c: the PowerSGD reducer (cddp/ddp.h's CDDP_DDP_HOOK_POWERSGD; PyTorch's powerSGD_hook).
 *
 * A bucket's compressed step is two sums over the ranks, with this rank's work around them:
 *
 *   compress   (before the first sum) each compressed parameter's gradient gets the error the
 *              last approximation left (M = G + E, in the gradient block itself), and
 *              P = M Q (n x r) is written into the bucket's stage beside the uncompressed
 *              gradients, which travel whole
 *   sum 1      the stage: the uncompressed gradients and every P, summed
 *   middle     each P orthonormalised (Gram-Schmidt: every rank the same, from the same sum),
 *              Q = M^T P (m x r) into the bucket's lowrank buffer
 *   sum 2      the Qs, summed
 *   finish     (on the training thread, after both) the gradient is P Q^T over the ranks' count
 *              (the mean; the sum with `sum`), the error E = M - P Q^T / W, and Q is kept as the
 *              next step's start
 *
 * On the communication thread these run in order as queued work (cddp__ddp_before's calls and
 * the sums), overlapping the rest of backward; inline, one after the other. Because P Q^T sums
 * the ranks' M (P is the sum's P, Q sums M^T P), every rank ends with the same gradients. The
 * state of each parameter (E and Q) lives across steps and bucket rebuilds (d->psgd). Before
 * powersgd_start_step the plain reducer (cddp__allreduce_reducer) reduces the bucket.
 */
#include "ddp/internal.h"

#include <math.h>
#include <string.h>

/* A matrix is compressed when its n m elements are at least twice the r (n + m) that travel
 * instead (PyTorch's min_compression_rate). */
enum { MIN_GAIN = 2 };

static int psgd_rank(const cddp_ddp *d) {
    return d->o.powersgd_rank > 0 ? d->o.powersgd_rank : 1;
}

static int64_t start_step(const cddp_ddp *d) {
    return d->o.powersgd_start_step > 0 ? d->o.powersgd_start_step : 1001;
}

/* Column k of Q (kept transposed: row k of the r x m matrix Q^T) drawn anew: normal values, the
 * same on every rank (seeded by the parameter i, the column and the step). */
static void draw_column(float *qt, int64_t m, int k, int i, int64_t step) {
    cddp_rng rng;
    cddp_rng_seed(&rng, 0x50535344ull ^ ((uint64_t)i << 20) ^ ((uint64_t)step << 40) ^ (uint64_t)k);
    for (int64_t j = 0; j < m; j++) qt[k * m + j] = (float)cddp_rng_normal(&rng);
}

/* Parameter i's state: its shape as a matrix, its rank (0: whole), E and Q once (false: out of
 * memory). Q starts random, the same on every rank. */
static bool state_of(cddp_ddp *d, int i) {
    cddp__psgd *s = &d->psgd[i];
    if (s->n) return !s->r || (s->q && s->error);
    const cddp_tensor *p = cddp_model_param(d->model, i);
    s->n = p->ndim >= 2 ? p->shape[0] : p->numel;
    s->m = p->ndim >= 2 ? p->numel / p->shape[0] : 1;
    int64_t r = CDDP_MIN((int64_t)psgd_rank(d), CDDP_MIN(s->n, s->m));
    s->r = p->ndim >= 2 && s->n * s->m >= MIN_GAIN * r * (s->n + s->m) ? (int)r : 0;
    if (!s->r) return true;
    s->q = cddp_malloc((size_t)(s->m * s->r) * sizeof(float));
    s->error = cddp_calloc((size_t)(s->n * s->m), sizeof(float));
    if (!s->q || !s->error) return false;
    for (int k = 0; k < s->r; k++) draw_column(s->q, s->m, k, i, 0);
    return true;
}

void cddp__ddp_psgd_free(cddp_ddp *d) {
    if (!d->psgd) return;
    for (int i = 0; i < d->nparams; i++) {
        cddp_free(d->psgd[i].q);
        cddp_free(d->psgd[i].error);
    }
    cddp_free(d->psgd);
    d->psgd = NULL;
}

/* The stage (the whole bucket when packed plainly, which is at least what a compressed step
 * sends first), and the Qs' buffer with a row of scratch after them (the widest matrix's). */
static int psgd_prepare(cddp_ddp *d, bucket *b, cddp_error *err) {
    if (!d->psgd && !(d->psgd = cddp_calloc((size_t)d->nparams, sizeof *d->psgd)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    size_t q = 0, row = 0;
    for (int j = 0; j < b->nparams; j++) {
        if (!state_of(d, b->params[j])) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        const cddp__psgd *s = &d->psgd[b->params[j]];
        q += (size_t)(s->m * s->r);
        if (s->r) row = CDDP_MAX(row, (size_t)s->m);
    }
    b->stage = cddp_aligned_alloc(b->numel * sizeof(float) + 64);
    b->lowrank = cddp_aligned_alloc((q + row) * sizeof(float) + 64);
    if (!b->stage || !b->lowrank) return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    return CDDP_OK;
}

/* Floats bucket b sends in its first sum (whole gradients and Ps) and its second (Qs). */
static void sizes(const cddp_ddp *d, const bucket *b, size_t *first, size_t *second) {
    *first = *second = 0;
    for (int j = 0; j < b->nparams; j++) {
        const cddp__psgd *s = &d->psgd[b->params[j]];
        *first += (size_t)(s->r ? s->n * s->r : s->n * s->m);
        *second += (size_t)(s->m * s->r);
    }
}

/* The products, with Q kept transposed (Q^T: r x m, row-major) so that every inner loop runs
 * along a row of M: P = M Q (n x r), Q^T = P^T M, and M's approximation P Q^T. */

/* p (n x r) = M (n x m) Q, from qt = Q^T: each element a dot product of a row of M and one of
 * Q^T, in LANES running sums (a fixed order, which the compiler puts in vector lanes) added at
 * the end */
enum { LANES = 16 };
CDDP_SIMD_CLONES
static void times_q(float *restrict p, const float *restrict M, const float *restrict qt, int64_t n,
                    int64_t m, int r) {
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < r; k++) {
            const float *a = M + i * m, *b = qt + k * m;
            float lane[LANES] = {0};
            int64_t j = 0;
            for (; j + LANES <= m; j += LANES)
                for (int l = 0; l < LANES; l++) lane[l] += a[j + l] * b[j + l];
            float acc = 0.0f;
            for (; j < m; j++) acc += a[j] * b[j];
            for (int l = 0; l < LANES; l++) acc += lane[l];
            p[i * r + k] = acc;
        }
}

/* qt (r x m) = P^T M, that is (M^T P)^T */
CDDP_SIMD_CLONES
static void p_times_m(float *restrict qt, const float *restrict M, const float *restrict p,
                      int64_t n, int64_t m, int r) {
    memset(qt, 0, (size_t)(m * r) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < r; k++) {
            float v = p[i * r + k];
            for (int64_t j = 0; j < m; j++) qt[k * m + j] += v * M[i * m + j];
        }
}

/* Each row of g (holding M) becomes its approximation's, scale P Q^T, and error what it left out.
 * row: m floats of scratch. */
CDDP_SIMD_CLONES
static void approximate(float *restrict g, float *restrict error, float *restrict row,
                        const float *restrict p, const float *restrict qt, int64_t n, int64_t m,
                        int r, float scale) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < m; j++) row[j] = 0.0f;
        for (int k = 0; k < r; k++) {
            float v = p[i * r + k] * scale;
            for (int64_t j = 0; j < m; j++) row[j] += v * qt[k * m + j];
        }
        for (int64_t j = 0; j < m; j++) {
            error[i * m + j] = g[i * m + j] - row[j];
            g[i * m + j] = row[j];
        }
    }
}

/* The sum of squares of P's column k (n x r, row-major), in double. */
static double column_sq(const float *P, int64_t n, int r, int k) {
    double sq = 0;
    for (int64_t i = 0; i < n; i++) sq += (double)P[i * r + k] * P[i * r + k];
    return sq;
}

/* P's r columns made orthonormal, in order (modified Gram-Schmidt, sums in double). A column
 * that the ones before it already span (what is left of it is rounding: under 1e-4 of its length,
 * as when r exceeds the gradient's rank: a small batch) becomes zeros rather than a direction
 * made of rounding errors, which would not be orthogonal to the others: its Q is then zeros and
 * the approximation keeps to the gradient's own span. */
static void orthonormalise(float *P, int64_t n, int r) {
    for (int k = 0; k < r; k++) {
        double before = column_sq(P, n, r, k);
        for (int j = 0; j < k; j++) {
            double dot = 0;
            for (int64_t i = 0; i < n; i++) dot += (double)P[i * r + j] * P[i * r + k];
            for (int64_t i = 0; i < n; i++) P[i * r + k] -= (float)dot * P[i * r + j];
        }
        double sq = column_sq(P, n, r, k);
        float scale = sq > 1e-8 * before && sq > 0 ? (float)(1.0 / sqrt(sq)) : 0.0f;
        for (int64_t i = 0; i < n; i++) P[i * r + k] *= scale;
    }
}

/* Before the first sum: M = G + E in the gradient block, P = M Q into the stage, the whole
 * gradients beside them. */
static int compress(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    cddp_ddp *d = b->ddp;
    (void)err;
    size_t at = 0;
    for (int j = 0; j < b->nparams; j++) {
        cddp__psgd *s = &d->psgd[b->params[j]];
        float *g = cddp__ddp_grad(d, b->params[j]);
        if (!s->r) {
            memcpy(b->stage + at, g, (size_t)(s->n * s->m) * sizeof(float));
            at += (size_t)(s->n * s->m);
            continue;
        }
        for (int64_t e = 0; e < s->n * s->m; e++) g[e] += s->error[e];
        times_q(b->stage + at, g, s->q, s->n, s->m, s->r);
        at += (size_t)(s->n * s->r);
    }
    return CDDP_OK;
}

/* Between the sums: each summed P orthonormalised, Q = M^T P into the lowrank buffer. */
static int middle(void *bucket_, cddp_error *err) {
    bucket *b = bucket_;
    cddp_ddp *d = b->ddp;
    (void)err;
    size_t at = 0, atq = 0;
    for (int j = 0; j < b->nparams; j++) {
        cddp__psgd *s = &d->psgd[b->params[j]];
        if (!s->r) {
            at += (size_t)(s->n * s->m);
            continue;
        }
        orthonormalise(b->stage + at, s->n, s->r);
        p_times_m(b->lowrank + atq, cddp__ddp_grad(d, b->params[j]), b->stage + at, s->n, s->m,
                  s->r);
        at += (size_t)(s->n * s->r);
        atq += (size_t)(s->m * s->r);
    }
    return CDDP_OK;
}

static void psgd_launch(cddp_ddp *d, bucket *b) {
    b->compressed = d->steps + 1 >= start_step(d); /* d->steps: the steps done before this one */
    if (!b->compressed) {
        cddp__allreduce_reducer.launch(d, b);
        d->step_bytes += b->numel * sizeof(float);
        return;
    }
    size_t first, second;
    sizes(d, b, &first, &second);
    cddp__ddp_before(d, b, compress);
    if (second == 0) { /* nothing compressed here: one sum, the mean applied at the finish */
        cddp__ddp_collective(d, b, CDDP__DDP_ALLREDUCE, b->stage, b->stage, (int64_t)first,
                             CDDP_COMM_F32, CDDP_COMM_SUM);
    } else {
        cddp__ddp_collective_first(d, b, b->stage, b->stage, (int64_t)first, CDDP_COMM_SUM);
        cddp__ddp_before(d, b, middle);
        cddp__ddp_collective(d, b, CDDP__DDP_ALLREDUCE, b->lowrank, b->lowrank, (int64_t)second,
                             CDDP_COMM_F32, CDDP_COMM_SUM);
    }
    d->step_bytes += (first + second) * sizeof(float);
}

/* After both sums: the whole gradients' mean; each matrix's P Q^T / W, what it leaves out of M
 * kept as the next step's error, and Q kept as its start. */
static void psgd_finish(cddp_ddp *d, bucket *b) {
    if (!b->compressed) {
        cddp__allreduce_reducer.finish(d, b);
        return;
    }
    float scale = d->o.sum ? 1.0f : 1.0f / (float)d->world;
    size_t at = 0, atq = 0, first, second;
    sizes(d, b, &first, &second);
    float *row = b->lowrank + second;
    for (int j = 0; j < b->nparams; j++) {
        cddp__psgd *s = &d->psgd[b->params[j]];
        float *g = cddp__ddp_grad(d, b->params[j]);
        if (!s->r) {
            for (int64_t e = 0; e < s->n * s->m; e++) g[e] = b->stage[at + (size_t)e] * scale;
            at += (size_t)(s->n * s->m);
            continue;
        }
        const float *qt = b->lowrank + atq;
        approximate(g, s->error, row, b->stage + at, qt, s->n, s->m, s->r, scale);
        /* the next step starts from Q; a column of zeros (its P's was: nothing new) anew */
        memcpy(s->q, qt, (size_t)(s->m * s->r) * sizeof(float));
        for (int k = 0; k < s->r; k++)
            if (column_sq(s->q + k * s->m, s->m, 1, 0) == 0.0)
                draw_column(s->q, s->m, k, b->params[j], d->steps + 1);
        at += (size_t)(s->n * s->r);
        atq += (size_t)(s->m * s->r);
    }
}

const cddp__reducer cddp__powersgd_reducer = {"powersgd", psgd_prepare, psgd_launch, psgd_finish};
