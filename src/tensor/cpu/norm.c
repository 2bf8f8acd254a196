/* norm.c: the CPU's batch normalisation kernels, forward and backward, on row-major tensors and
 * on channel-blocked ones, fused with a ReLU and a residual sum where asked.
 *
 * Both layouts are walked as blocks: image n's group g of B channels is a block of P = H W
 * positions, B values side by side at each (row-major: B = 1, a group is a channel and a block
 * its plane). A group's blocks over the batch are summed, normalised and differentiated together,
 * each block while it is in cache; the groups split across the math threads, a group in one part
 * (its sums in the same order on any number of threads). Each block's sums are taken in float lanes
 * and added across blocks in double. The forward reads x twice from memory: the statistics (each
 * block's sum, then its deviations from its own mean while it is in cache, the blocks combined in
 * double), then the normalisation; with relu each block is rectified as it is normalised (a
 * residual's block added first; a blocked layout's in the same pass, a plane's in passes right
 * after).
 *
 * The backward also reads its inputs twice. The first pass masks the output's gradient (relu),
 * gives the residual the masked block and takes both sums, a blocked layout's in one loop; the
 * masked block is written over the gradient itself when the op may overwrite it (dy_free), else
 * into a block of scratch when the residual needs it, else nowhere. The second pass makes the
 * input's gradient, from the masked gradient, or masking again.
 *
 * Activations in bf16 (x16, r16, y16): the channel-blocked loops read them as bf16 and widen each
 * value as they go (exact: the same float32 arithmetic, half the bytes from memory) and write the
 * output rounded; a plane's loops (B 1), the ReLU's mask of the second backward pass and a bf16
 * residual beside a float32 x take each block widened into a block of scratch first. */
#include "tensor/cpu/cpu.h"

#include <math.h>
#include <string.h>

/* The blocks: N images of G groups of B channels, P positions each. */
typedef struct blocks {
    int64_t N, C, P, B, G;
} blocks;

/* The offset of block (n, g). */
static int64_t at(const blocks *v, int64_t n, int64_t g) {
    return (n * v->G + g) * v->B * v->P;
}

/* A tensor's values: float32 (f), bf16 (h), or none (both NULL); scratch for a block of them
 * widened. */
typedef struct values {
    const float *f;
    const uint16_t *h;
    float *scratch; /* a block's B P floats, where h */
} values;

/* The block at offset o, of B P values, as float32 (widened into scratch where bf16); NULL when
 * there are none. */
static const float *block_in(const blocks *v, const values *s, int64_t o) {
    if (!s->h) return s->f ? s->f + o : NULL;
    cddp__bf16_widen_n(s->scratch, s->h + o, v->B * v->P);
    return s->scratch;
}

/* The block at offset o as the loops take it: as it is for the channel-blocked loops, unless
 * widen; else (a plane's loops) as float32. */
static cddp__vals block_at(const blocks *v, const values *s, int64_t o, bool widen) {
    if (v->B > 1 && !widen) return (cddp__vals){s->f ? s->f + o : NULL, s->h ? s->h + o : NULL};
    return (cddp__vals){block_in(v, s, o), NULL};
}

/* A block's loops (cddp__lanes_*, with a plane's own loops when B is 1); per-channel values are
 * the group's B. */
static void block_sum(const blocks *v, cddp__vals x, double *out) {
    if (v->B == 1)
        *out += cddp__sum(x.f, v->P);
    else
        cddp__lanes_sum(x, v->P, v->B, out);
}

static void block_sq_dev(const blocks *v, cddp__vals x, const float *m, double *out) {
    if (v->B == 1)
        *out += cddp__sq_dev(x.f, *m, v->P);
    else
        cddp__lanes_sq_dev(x, m, v->P, v->B, out);
}

/* Group g's mean and sum of squared deviations from it (m2), per channel, in one pass over the
 * memory: each block's sum, then its squared deviations from its own mean while the block is still
 * in cache, the blocks combined as Chan, Golub and LeVeque's parallel variance (in double). bs, bq
 * and bm: scratch for B channels. */
static void group_stats(const blocks *v, const values *x, int64_t g, double *mean, double *m2,
                        double *bs, double *bq, float *bm) {
    double P = (double)v->P;
    for (int64_t k = 0; k < v->B; k++) mean[k] = m2[k] = 0.0;
    for (int64_t n = 0; n < v->N; n++) {
        cddp__vals xb = block_at(v, x, at(v, n, g), false);
        for (int64_t k = 0; k < v->B; k++) bs[k] = bq[k] = 0.0;
        block_sum(v, xb, bs);
        for (int64_t k = 0; k < v->B; k++) bm[k] = (float)(bs[k] / P);
        block_sq_dev(v, xb, bm, bq);
        double seen = (double)n * P, total = seen + P;
        for (int64_t k = 0; k < v->B; k++) {
            double mu = bs[k] / P, off = mu - (double)bm[k], delta = mu - mean[k];
            mean[k] += delta * P / total;
            m2[k] += bq[k] - P * off * off + delta * delta * seen * P / total;
        }
    }
}

/* y = relu((x - m) s + b + r), r (may be none) and the ReLU as asked, into y, or (y16) rounded:
 * a plane's loops one after the other (y16: through scratch ys), a channel-blocked block's in one
 * pass. */
static void block_normalize(const blocks *v, cddp__vals x, const float *m, const float *s,
                            const float *b, cddp__vals r, bool relu, float *y, uint16_t *y16,
                            float *ys) {
    if (v->B > 1) {
        cddp__lanes_normalize(x, m, s, b, r, relu, y, y16, v->P, v->B);
        return;
    }
    float *out = y16 ? ys : y;
    cddp__normalize(x.f, *m, *s, *b, out, v->P);
    if (r.f) cddp__add_into(out, r.f, v->P);
    if (relu) cddp__relu(out, out, v->P);
    if (y16) cddp__bf16_narrow_n(y16, out, v->P);
}

static void block_norm_grad(const blocks *v, float *dx, const float *d, cddp__vals x,
                            const float *k, const float *a, const float *m, const float *b,
                            bool assign) {
    if (v->B == 1)
        cddp__norm_grad_into(dx, d, x.f, *k, *a, *m, *b, v->P, assign);
    else
        cddp__lanes_norm_grad_into(dx, d, x, k, a, m, b, v->P, v->B, assign);
}

/* The gradient a block's batch normalisation receives: d, or (relu) d where the block's output y
 * is positive, 0 elsewhere, written into scratch (which may be d itself). */
static const float *block_grad(const blocks *v, const float *d, const float *y, bool relu,
                               float *scratch) {
    if (!relu) return d;
    cddp__relu_grad(y, d, scratch, v->B * v->P, true);
    return scratch;
}

/* The groups split across the math threads: each part takes a run of them, with blocks of
 * scratch of its own (bf16 blocks widened, a plane's output, a block's masked gradient or dx). */
typedef struct {
    blocks v;
    const void *a; /* the kernel's arguments */
    double *acc;   /* per channel: the forward's mean and m2, the backward's two sums */
    float *coef;   /* per channel: the forward's scale and shift, the backward's k, a and b */
    float *block;  /* each part's: 4 blocks of B P floats, then B floats */
    double *bd;    /* each part's: 2 B doubles */
    size_t nblock; /* a block's floats, rounded up to 16 */
} bn_job;

/* Part part's values of f and h, with its block k (0..3; 4: its B floats) for h widened. */
static values part_values(const bn_job *j, int part, int k, const float *f, const uint16_t *h) {
    float *mine = j->block + (size_t)part * (4 * j->nblock + cddp__up16((size_t)j->v.B));
    return (values){f, h, mine + (size_t)k * j->nblock};
}

/* Scratch for parts parts (false: out of memory, reported). */
static bool bn_scratch(cddp__kq *q, bn_job *j, int parts) {
    j->nblock = cddp__up16((size_t)(j->v.B * j->v.P));
    size_t per = 4 * j->nblock + cddp__up16((size_t)j->v.B);
    j->block = cddp__kq_scratch(q, (size_t)parts * per * sizeof(float));
    j->bd = cddp__kq_scratch(q, (size_t)parts * 2 * (size_t)j->v.B * sizeof(double));
    return j->block && j->bd;
}

/* Groups lo..hi of the forward: statistics (training), scale and shift, the normalisation; phase 1
 * the statistics alone, phase 2 the rest with the statistics given. */
static void batch_norm_part(int64_t lo, int64_t hi, int part, void *arg) {
    const bn_job *j = arg;
    const cddp__k_batch_norm *a = j->a;
    const blocks v = j->v;
    int64_t C = v.C, M = a->phase == 2 ? a->count : v.N * v.P;
    values xv = part_values(j, part, 0, a->x, a->x16), rv = part_values(j, part, 1, a->r, a->r16);
    float *yb = part_values(j, part, 2, NULL, NULL).scratch; /* a plane's bf16 output, first */
    float *bm = part_values(j, part, 4, NULL, NULL).scratch; /* a block's means, B floats */
    double *bs = j->bd + (size_t)part * 2 * (size_t)v.B, *bq = bs + v.B;
    const float *w = a->w, *b = a->b;
    float *y = a->y, *mean = a->stats, *inv = a->stats + C, *scale = j->coef, *shift = j->coef + C;
    float *rmean = a->rmean, *rvar = a->rvar, momentum = a->momentum;
    for (int64_t g = lo; g < hi; g++) {
        int64_t c0 = g * v.B;
        double *mu = j->acc + c0, *m2 = j->acc + C + c0;
        if (a->training && a->phase != 2) group_stats(&v, &xv, g, mu, m2, bs, bq, bm);
        if (a->phase == 1) continue;
        for (int64_t c = c0; c < c0 + v.B; c++) {
            double var;
            if (a->training) {
                mean[c] = (float)mu[c - c0];
                var = m2[c - c0] / (double)M;
                if (rmean) rmean[c] = (1.0f - momentum) * rmean[c] + momentum * mean[c];
                if (rvar)
                    rvar[c] = (1.0f - momentum) * rvar[c] +
                              momentum * (float)(m2[c - c0] / (double)(M - 1));
            } else {
                mean[c] = rmean[c];
                var = rvar[c];
            }
            inv[c] = (float)(1.0 / sqrt(var + (double)a->eps));
            scale[c] = inv[c] * (w ? w[c] : 1.0f);
            shift[c] = b ? b[c] : 0.0f;
        }
        for (int64_t n = 0; n < v.N; n++) {
            int64_t o = at(&v, n, g);
            /* a bf16 residual beside a float32 x, widened first */
            block_normalize(&v, block_at(&v, &xv, o, false), mean + c0, scale + c0, shift + c0,
                            block_at(&v, &rv, o, rv.h && !xv.h), a->relu, y ? y + o : NULL,
                            a->y16 ? a->y16 + o : NULL, yb);
        }
    }
}

void cddp__cpu_batch_norm(cddp__kq *q, const cddp__k_batch_norm *a) {
    bn_job j = {.v = {.N = a->N, .C = a->C, .P = a->P, .B = a->B, .G = a->C / a->B}, .a = a};
    int parts = cddp__cpu_row_parts(j.v.G, j.v.N * j.v.B * j.v.P);
    j.coef = cddp__kq_scratch(q, 2 * (size_t)j.v.C * sizeof(float)); /* scale, shift */
    j.acc = a->phase ? a->sums : cddp__kq_scratch(q, 2 * (size_t)j.v.C * sizeof(double));
    if (!j.coef || !j.acc || !bn_scratch(q, &j, parts)) return;
    cddp__cpu_split(j.v.G, 1, parts, batch_norm_part, &j);
}

/* Groups lo..hi of the backward: the sums, the parameters' gradients, dx; phase 1 all but dx,
 * phase 2 dx alone, from the sums given. */
static void batch_norm_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    const bn_job *j = arg;
    const cddp__k_batch_norm_grad *a = j->a;
    const blocks v = j->v;
    int64_t C = v.C, M = a->phase == 2 ? a->count : v.N * v.P;
    bool relu = a->relu, training = a->training;
    bool in_place = relu && a->dy_free; /* masked into dy itself, once */
    values xv = part_values(j, part, 0, a->x, a->x16);
    values yv = part_values(j, part, 1, relu ? a->y : NULL, relu ? a->y16 : NULL);
    float *scratch = part_values(j, part, 2, NULL, NULL).scratch;
    /* dx16: each block's dx made here (in cache), then rounded into dx16 */
    float *block_dx = part_values(j, part, 3, NULL, NULL).scratch;
    const float *mean = a->stats, *inv = a->stats + C;
    float *dy = a->dy;
    float *dx = a->dx, *dr = a->dr, *gg = a->dw, *gb = a->db;
    float *ck = j->coef, *ca = j->coef + C, *cb = j->coef + 2 * C;
    for (int64_t grp = lo; grp < hi; grp++) {
        int64_t c0 = grp * v.B;
        double *sdy = j->acc + c0, *sdyxh = j->acc + C + c0;
        for (int64_t k = 0; k < v.B && a->phase != 2; k++) sdy[k] = sdyxh[k] = 0.0;
        for (int64_t s = 0; s < v.N && a->phase != 2; s++) {
            int64_t o = at(&v, s, grp);
            float *dyb = dy + o;
            const float *d; /* the block's gradient, masked (NULL: not kept, nobody reads it) */
            cddp__vals xb = block_at(&v, &xv, o, false), yb = block_at(&v, &yv, o, false);
            if (v.B > 1) { /* masked and summed both ways in one pass */
                float *g = !relu ? NULL : in_place ? dyb : dr ? scratch : NULL;
                cddp__lanes_grad_sums(dyb, yb, xb, mean + c0, g, v.P, v.B, sdy, sdyxh);
                d = relu ? g : dyb;
            } else {
                d = block_grad(&v, dyb, yb.f, relu, in_place ? dyb : scratch);
                *sdy += cddp__sum(d, v.P);
                *sdyxh += cddp__dot_dev(d, xb.f, mean[c0], v.P);
            }
            if (dr && a->rassign)
                memcpy(dr + o, d, (size_t)(v.B * v.P) * sizeof(float));
            else if (dr)
                cddp__add_into(dr + o, d, v.B * v.P);
        }
        for (int64_t c = c0; c < c0 + v.B; c++) {
            double sx = sdyxh[c - c0] * inv[c];
            if (gb && a->phase != 2) gb[c] += (float)sdy[c - c0];
            if (gg && a->phase != 2) gg[c] += (float)sx;
            float mdyxh = training ? (float)(sx / (double)M) : 0.0f;
            ck[c] = (a->w ? a->w[c] : 1.0f) * inv[c];
            ca[c] = training ? (float)(sdy[c - c0] / (double)M) : 0.0f;
            cb[c] = inv[c] * mdyxh;
        }
        if (a->phase == 1 || (!dx && !a->dx16)) continue;
        for (int64_t s = 0; s < v.N; s++) {
            int64_t o = at(&v, s, grp);
            const float *d = relu && !in_place
                                 ? block_grad(&v, dy + o, block_in(&v, &yv, o), true, scratch)
                                 : dy + o; /* in place: masked already */
            block_norm_grad(&v, dx ? dx + o : block_dx, d, block_at(&v, &xv, o, false), ck + c0,
                            ca + c0, mean + c0, cb + c0, dx ? a->assign : true);
            if (!dx) cddp__bf16_narrow_n(a->dx16 + o, block_dx, v.B * v.P);
        }
    }
}

/* With xh = (x - mean) inv and y = g xh + b, per channel over its M values:
 * db = sum dy, dg = sum dy xh; in training (mean and inv depend on x)
 * dx = g inv (dy - sum(dy) / M - xh sum(dy xh) / M), in evaluation dx = g inv dy. */
void cddp__cpu_batch_norm_grad(cddp__kq *q, const cddp__k_batch_norm_grad *a) {
    bn_job j = {.v = {.N = a->N, .C = a->C, .P = a->P, .B = a->B, .G = a->C / a->B}, .a = a};
    int parts = cddp__cpu_row_parts(j.v.G, j.v.N * j.v.B * j.v.P);
    j.acc = a->phase ? a->sums : cddp__kq_scratch(q, 2 * (size_t)j.v.C * sizeof(double));
    j.coef = cddp__kq_scratch(q, 3 * (size_t)j.v.C * sizeof(float)); /* dx's k, a and b */
    if (!j.acc || !j.coef || !bn_scratch(q, &j, parts)) return;
    cddp__cpu_split(j.v.G, 1, parts, batch_norm_grad_part, &j);
}
