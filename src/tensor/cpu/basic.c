/* basic.c: the CPU's kernels for filling, copying and adding, the broadcast elementwise ops, the
 * reductions, argmax, the layout reorder, ids and the embedding (tensor/kernels.h says what each
 * computes). */
#include "tensor/cpu/cpu.h"

#include <string.h>

void cddp__cpu_fill(cddp__kq *q, const cddp__k_fill *a) {
    (void)q;
    if (a->bits == 0) {
        memset(a->dst, 0, (size_t)a->n * (size_t)a->size);
        return;
    }
    switch (a->size) {
    case 1:
        memset(a->dst, (int)(a->bits & 0xff), (size_t)a->n);
        break;
    case 2:
        for (int64_t i = 0; i < a->n; i++) ((uint16_t *)a->dst)[i] = (uint16_t)a->bits;
        break;
    case 4:
        for (int64_t i = 0; i < a->n; i++) ((uint32_t *)a->dst)[i] = (uint32_t)a->bits;
        break;
    case 8:
        for (int64_t i = 0; i < a->n; i++) ((uint64_t *)a->dst)[i] = a->bits;
        break;
    default:
        CDDP_PANIC("fill: elements of %d bytes", a->size);
    }
}

/* The elementwise kernels split their values across the math threads (a part's start on a
 * multiple of 16: the vector loops' blocks as on one thread), the row kernels their rows. */

static void accumulate_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_accumulate *a = arg;
    if (a->assign)
        memcpy(a->dst + lo, a->src + lo, (size_t)(hi - lo) * sizeof(float));
    else
        cddp__add_into(a->dst + lo, a->src + lo, hi - lo);
}

void cddp__cpu_accumulate(cddp__kq *q, const cddp__k_accumulate *a) {
    (void)q;
    cddp__cpu_split_values(a->n, accumulate_part, a);
}

static void add_rows_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_add_rows *a = arg;
    for (int64_t i = lo; i < hi; i++)
        cddp__add_into(a->dst + i * a->dst_stride, a->src + i * a->src_stride, a->cols);
}

/* Columns lo..hi of every row, rows in order (the rows add into one: a bias's gradient). */
static void add_rows_cols_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_add_rows *a = arg;
    for (int64_t i = 0; i < a->rows; i++)
        cddp__add_into(a->dst + lo, a->src + i * a->src_stride + lo, hi - lo);
}

/* Rows into rows of their own split by rows; rows summed into one row (dst_stride 0) by columns,
 * each column's rows added in order. */
void cddp__cpu_add_rows(cddp__kq *q, const cddp__k_add_rows *a) {
    (void)q;
    if (a->dst_stride == 0)
        cddp__cpu_split_cols(a->rows, a->cols, add_rows_cols_part, a);
    else if (a->dst_stride >= a->cols)
        cddp__cpu_split_rows(a->rows, a->cols, add_rows_part, a);
    else /* rows that overlap: in order, on this thread */
        add_rows_part(0, a->rows, 0, (void *)a);
}

static void scale_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_scale *a = arg;
    const float *x = a->x;
    float *y = a->y, s = a->s;
    if (a->add)
        for (int64_t i = lo; i < hi; i++) y[i] += s * x[i];
    else
        for (int64_t i = lo; i < hi; i++) y[i] = s * x[i];
}

void cddp__cpu_scale(cddp__kq *q, const cddp__k_scale *a) {
    (void)q;
    cddp__cpu_split_values(a->n, scale_part, a);
}

/* core's conversions (cddp_half_from_f32, cddp_half_to_f32), the host path's: DDP's 16-bit
 * buckets round the same on every device. */
void cddp__cpu_cast16(cddp__kq *q, const cddp__k_cast16 *a) {
    (void)q;
    if (!a->widen) {
        cddp_half_from_f32(a->f, a->h, a->n, a->f16);
        return;
    }
    cddp_half_to_f32(a->h, a->f, a->n, a->f16);
    if (a->scale != 1.0f)
        for (int64_t i = 0; i < a->n; i++) a->f[i] *= a->scale;
}

static void mul_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_mul *a = arg;
    const float *x = a->a, *m = a->b;
    float *y = a->y;
    if (a->add)
        for (int64_t i = lo; i < hi; i++) y[i] += x[i] * m[i];
    else
        for (int64_t i = lo; i < hi; i++) y[i] = x[i] * m[i];
}

void cddp__cpu_mul(cddp__kq *q, const cddp__k_mul *a) {
    (void)q;
    cddp__cpu_split_values(a->n, mul_part, a);
}

/* Broadcast iteration: maps each output element i to the flat index of a and of b. */
#define BCAST_FOR(bc, i, ia, ib, body)                                                             \
    do {                                                                                           \
        int64_t i = 0;                                                                             \
        for (int64_t d0 = 0; d0 < (bc)->shape[0]; d0++)                                            \
            for (int64_t d1 = 0; d1 < (bc)->shape[1]; d1++)                                        \
                for (int64_t d2 = 0; d2 < (bc)->shape[2]; d2++)                                    \
                    for (int64_t d3 = 0; d3 < (bc)->shape[3]; d3++, i++) {                         \
                        int64_t ia = d0 * (bc)->sa[0] + d1 * (bc)->sa[1] + d2 * (bc)->sa[2] +      \
                                     d3 * (bc)->sa[3];                                             \
                        int64_t ib = d0 * (bc)->sb[0] + d1 * (bc)->sb[1] + d2 * (bc)->sb[2] +      \
                                     d3 * (bc)->sb[3];                                             \
                        body;                                                                      \
                    }                                                                              \
    } while (0)

/* Operands of the same shape: values lo..hi. */
static void binary_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_binary *k = arg;
    const float *x = k->a, *y = k->b;
    float *z = k->z;
    switch (k->op) {
    case CDDP__ADD:
        for (int64_t i = lo; i < hi; i++) z[i] = x[i] + y[i];
        break;
    case CDDP__SUB:
        for (int64_t i = lo; i < hi; i++) z[i] = x[i] - y[i];
        break;
    case CDDP__MUL:
        for (int64_t i = lo; i < hi; i++) z[i] = x[i] * y[i];
        break;
    case CDDP__DIV:
        for (int64_t i = lo; i < hi; i++) z[i] = x[i] / y[i];
        break;
    }
}

void cddp__cpu_binary(cddp__kq *q, const cddp__k_binary *k) {
    (void)q;
    const float *x = k->a, *y = k->b;
    float *z = k->z;
    const cddp__bcast *bc = &k->bc;
    int64_t n = k->n;
    if (bc->same) {
        cddp__cpu_split_values(n, binary_part, k);
        return;
    }
    switch (k->op) {
    case CDDP__ADD:
        BCAST_FOR(bc, i, ia, ib, z[i] = x[ia] + y[ib]);
        break;
    case CDDP__SUB:
        BCAST_FOR(bc, i, ia, ib, z[i] = x[ia] - y[ib]);
        break;
    case CDDP__MUL:
        BCAST_FOR(bc, i, ia, ib, z[i] = x[ia] * y[ib]);
        break;
    case CDDP__DIV:
        BCAST_FOR(bc, i, ia, ib, z[i] = x[ia] / y[ib]);
        break;
    }
}

/* Each output's term goes to the input element it came from, so a dimension that was stretched
 * sums its contributions. */
void cddp__cpu_binary_grad(cddp__kq *q, const cddp__k_binary_grad *k) {
    (void)q;
    const float *dy = k->dz, *x = k->a, *y = k->b;
    float *da = k->da, *db = k->db;
    const cddp__bcast *bc = &k->bc;
    switch (k->op) {
    case CDDP__ADD: /* z = x + y: dx = dz, dy = dz */
        BCAST_FOR(bc, i, ia, ib, {
            if (da) da[ia] += dy[i];
            if (db) db[ib] += dy[i];
        });
        break;
    case CDDP__SUB: /* z = x - y: dx = dz, dy = -dz */
        BCAST_FOR(bc, i, ia, ib, {
            if (da) da[ia] += dy[i];
            if (db) db[ib] -= dy[i];
        });
        break;
    case CDDP__MUL: /* z = x * y: dx = dz * y, dy = dz * x */
        BCAST_FOR(bc, i, ia, ib, {
            if (da) da[ia] += dy[i] * y[ib];
            if (db) db[ib] += dy[i] * x[ia];
        });
        break;
    case CDDP__DIV: /* z = x / y: dx = dz / y, dy = -dz * x / y^2 */
        BCAST_FOR(bc, i, ia, ib, {
            if (da) da[ia] += dy[i] / y[ib];
            if (db) db[ib] -= dy[i] * x[ia] / (y[ib] * y[ib]);
        });
        break;
    }
}

void cddp__cpu_sum(cddp__kq *q, const cddp__k_sum *a) {
    (void)q;
    double s = 0.0;
    for (int64_t i = 0; i < a->n; i++) s += a->x[i];
    if (a->mean) s /= (double)a->n;
    a->out[0] = (float)s;
}

static void sum_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_sum_grad *a = arg;
    float g = a->dy[0] / (a->mean ? (float)a->n : 1.0f);
    for (int64_t i = lo; i < hi; i++) a->dx[i] += g;
}

void cddp__cpu_sum_grad(cddp__kq *q, const cddp__k_sum_grad *a) {
    (void)q;
    cddp__cpu_split_values(a->n, sum_grad_part, a);
}

static int64_t row_argmax(const float *a, int64_t C) {
    int64_t best = 0;
    for (int64_t j = 1; j < C; j++)
        if (a[j] > a[best]) best = j;
    return best;
}

void cddp__cpu_argmax(cddp__kq *q, const cddp__k_argmax *a) {
    (void)q;
    int64_t correct = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t best = row_argmax(a->x + r * a->C, a->C);
        if (a->out) a->out[r] = best;
        if (a->labels) correct += best == cddp__index_at(a->labels, a->dtype, r);
    }
    if (a->count) a->count[0] = correct;
}

/* Going into the blocked layout is a transposition of each block, (B, P) -> (P, B); coming out
 * the reverse. */
void cddp__cpu_reorder(cddp__kq *q, const cddp__k_reorder *a) {
    (void)q;
    int64_t B = a->B, P = a->P, G = a->C / B;
    for (int64_t ng = 0; ng < a->N * G; ng++) {
        const float *s = a->src + ng * B * P;
        float *d = a->dst + ng * B * P;
        for (int64_t k = 0; k < B; k++) /* plain plane k of the block, blocked lane k */
            for (int64_t p = 0; p < P; p++) {
                int64_t plain = k * P + p, blocked = p * B + k;
                float v = s[a->into ? plain : blocked];
                float *to = &d[a->into ? blocked : plain];
                *to = a->add ? *to + v : v;
            }
    }
}

void cddp__cpu_check_ids(cddp__kq *q, const cddp__k_check_ids *a) {
    for (int64_t i = 0; i < a->n; i++) {
        int64_t id = cddp__index_at(a->ids, a->dtype, i);
        if (id < 0 || id >= a->limit) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            cddp__kq_fail(q, CDDP_ERANGE, a->fmt, (long long)id, (long long)i, (long long)a->limit,
                          (long long)(a->limit - 1));
#pragma GCC diagnostic pop
            return;
        }
    }
}

static void embedding_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_embedding *a = arg;
    for (int64_t i = lo; i < hi; i++)
        memcpy(a->out + i * a->C, a->table + cddp__index_at(a->ids, a->dtype, i) * a->C,
               (size_t)a->C * sizeof(float));
}

void cddp__cpu_embedding(cddp__kq *q, const cddp__k_embedding *a) {
    (void)q;
    cddp__cpu_split_rows(a->n, a->C, embedding_part, a);
}

/* Columns lo..hi of each position's gradient row into its id's row, positions in order. */
static void embedding_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    (void)part;
    const cddp__k_embedding_grad *a = arg;
    for (int64_t i = 0; i < a->n; i++)
        cddp__add_into(a->dtable + cddp__index_at(a->ids, a->dtype, i) * a->C + lo,
                       a->dy + i * a->C + lo, hi - lo);
}

/* Deterministic: each row of the table adds its positions in order; the columns split across
 * the math threads. */
void cddp__cpu_embedding_grad(cddp__kq *q, const cddp__k_embedding_grad *a) {
    (void)q;
    cddp__cpu_split_cols(a->n, a->C, embedding_grad_part, a);
}
