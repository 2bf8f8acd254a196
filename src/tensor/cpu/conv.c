/* conv.c: the CPU's 2-D convolution kernels (strided, zero-padded, grouped) on oneDNN: forward,
 * backward-data and backward-weights primitives made once per shape, in the layouts oneDNN prefers
 * (see cpu/dnnl.h); the weights' gradient of a stride-1 convolution with few input channels per
 * group by a loop of cddp's own (weights_grad), which is faster there. And a convolution followed
 * by a ReLU and 2x2 max pooling as one kernel (a CNN's usual layer), whose convolution output
 * stays in oneDNN's layout: pooled from it, its gradient made in it.
 *
 * In bf16 (a geometry's compute), the primitives read the input, the weights and the output's
 * gradient as bf16 (the reorders into their layouts round them, to nearest even) and write
 * float32 results: the bf16 units' products with float32 sums, as the gemm kernel's. Emulated
 * (CDDP_BF16_EMULATE=1 on a processor without bf16 units), those operands are rounded in float32
 * and the float32 primitives run; the own loop of weights_grad rounds them as it copies them, in
 * both. Activations in bf16 (x16, y16): the primitives read the input and write the output as
 * bf16 (no reorder where the layout is the primitive's), kept for the weights' gradient as they
 * are; emulated, the input is widened (exactly) for the float32 primitives and their output
 * rounded to nearest even. */
#include "tensor/cpu/dnnl.h"

#include <string.h>

enum { FWD_TRAIN, FWD_INFER, BWD_DATA, BWD_WEIGHTS };

/* A convolution's primitive: int64 only, so that no padding byte enters the cache key. src_block
 * and dst_block: the channel block of a blocked input or output (its layout then fixed), else 0
 * (the primitive's choice). */
typedef struct conv_key {
    int64_t kind, N, C, H, W, O, KH, KW, OH, OW, stride, pad, groups, bias, src_block, dst_block,
        bf16, dst_bf16;
} conv_key;

static dnnl_format_tag_t block_tag(int64_t block) {
    return block ? cddp__dnnl_tag((int)block) : dnnl_format_tag_any;
}

static void md_tag(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims, dnnl_format_tag_t tag,
                   dnnl_data_type_t type) {
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(md, n, dims, type, tag), "describing a convolution");
}

/* The weights' dims: (O,C,KH,KW), or (G,O/G,C/G,KH,KW) when grouped; their count. */
static int weight_dims(const conv_key *k, dnnl_dims_t d) {
    if (k->groups == 1) {
        memcpy(d, (dnnl_dims_t){k->O, k->C, k->KH, k->KW}, sizeof(dnnl_dims_t));
        return 4;
    }
    memcpy(d, (dnnl_dims_t){k->groups, k->O / k->groups, k->C / k->groups, k->KH, k->KW},
           sizeof(dnnl_dims_t));
    return 5;
}

static dnnl_status_t make_conv(dnnl_primitive_desc_t *pd, const void *key,
                               const_dnnl_primitive_attr_t attr) {
    const conv_key *k = key;
    dnnl_dims_t wd;
    int wn = weight_dims(k, wd);
    dnnl_memory_desc_t src, w, b, dst;
    /* The layouts oneDNN prefers (blocked by 8 channels on AVX2), except for the weights'
     * gradient of a strided convolution with fewer than 8 input channels per group (stride 1
     * has its own loop, weights_grad): there oneDNN's blocked kernel is 1.6x slower than its
     * GEMM one on plain layouts (1 -> 16 channels, 28x28, batch 64: 3.1 ms against 1.9 ms). */
    bool plain = k->kind == BWD_WEIGHTS && k->C / k->groups < 8;
    /* in bf16 the operands (x, w, the output's gradient) are bf16, the results float32 */
    dnnl_data_type_t in = k->bf16 ? dnnl_bf16 : dnnl_f32;
    md_tag(&src, 4, (dnnl_dims_t){k->N, k->C, k->H, k->W},
           plain ? dnnl_nchw : block_tag(k->src_block), k->kind == BWD_DATA ? dnnl_f32 : in);
    md_tag(&w, wn, wd,
           !plain    ? dnnl_format_tag_any
           : wn == 4 ? dnnl_oihw
                     : dnnl_goihw,
           k->kind == BWD_WEIGHTS ? dnnl_f32 : in);
    md_tag(&dst, 4, (dnnl_dims_t){k->N, k->O, k->OH, k->OW},
           plain ? dnnl_nchw : block_tag(k->dst_block),
           k->kind != FWD_TRAIN && k->kind != FWD_INFER ? in
           : k->dst_bf16                                ? dnnl_bf16
                                                        : dnnl_f32);
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(&b, 1, (dnnl_dims_t){k->O}, dnnl_f32, dnnl_x),
                  "describing a bias");
    const dnnl_dims_t strides = {k->stride, k->stride}, pad = {k->pad, k->pad};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t hint = NULL;
    if (k->kind == BWD_DATA || k->kind == BWD_WEIGHTS) {
        conv_key f = *k;
        f.kind = FWD_TRAIN;
        hint = cddp__dnnl_pd(cddp__dnnl_get(&f, sizeof f, make_conv));
    }
    if (k->kind == BWD_DATA)
        cddp__dnnl_ok(dnnl_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &src,
                                                               &w, &dst, strides, pad, pad),
                      "describing a convolution's backward-data");
    else if (k->kind == BWD_WEIGHTS)
        cddp__dnnl_ok(dnnl_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &src,
                                                                  &w, k->bias ? &b : NULL, &dst,
                                                                  strides, pad, pad),
                      "describing a convolution's backward-weights");
    else
        cddp__dnnl_ok(dnnl_convolution_forward_desc_init(
                          &d, k->kind == FWD_TRAIN ? dnnl_forward_training : dnnl_forward_inference,
                          dnnl_convolution_direct, &src, &w, k->bias ? &b : NULL, &dst, strides,
                          pad, pad),
                      "describing a convolution");
    return dnnl_primitive_desc_create(pd, &d, attr, cddp__dnnl_engine(), hint);
}

/* g's primitive of kind; a forward writing bf16 when dst_bf16 (bf16 units only). */
static const cddp__dnnl_prim *conv_prim_to(const cddp__conv_geom *g, int kind, bool dst_bf16) {
    conv_key k = {.kind = kind,
                  .N = g->N,
                  .C = g->C,
                  .H = g->H,
                  .W = g->W,
                  .O = g->O,
                  .KH = g->KH,
                  .KW = g->KW,
                  .OH = g->OH,
                  .OW = g->OW,
                  .stride = g->stride,
                  .pad = g->pad,
                  .groups = g->groups,
                  .bias = g->bias,
                  .src_block = g->x_block,
                  .dst_block = g->out_block,
                  .bf16 = g->compute == CDDP_BF16 && cddp__cpu_bf16_native(),
                  .dst_bf16 = dst_bf16};
    return cddp__dnnl_get(&k, sizeof k, make_conv);
}

static const cddp__dnnl_prim *conv_prim(const cddp__conv_geom *g, int kind) {
    return conv_prim_to(g, kind, false);
}

/* An operand of n floats as g's products read it: itself, or in bf16 when the float32 primitives
 * multiply it (emulated) its copy rounded to bf16 in scratch (NULL when out of memory, reported
 * through q). */
static const float *operand(cddp__kq *q, const cddp__conv_geom *g, const float *data, int64_t n) {
    if (g->compute != CDDP_BF16 || cddp__cpu_bf16_native()) return data;
    float *r = cddp__kq_scratch(q, (size_t)n * sizeof(float));
    if (r) cddp__bf16_round(r, data, n);
    return r;
}

static int64_t input_n(const cddp__conv_geom *g) {
    return g->N * g->C * g->H * g->W;
}

/* The input in bf16 (x16) as float32 loops and primitives read it: widened (exact) into scratch;
 * NULL when out of memory (reported through q). */
static const float *widened(cddp__kq *q, const cddp__conv_geom *g, const uint16_t *x16) {
    float *x = cddp__kq_scratch(q, (size_t)input_n(g) * sizeof(float));
    if (x) cddp__bf16_widen_n(x, x16, input_n(g));
    return x;
}

static int64_t weights_n(const cddp__conv_geom *g) {
    return g->O * (g->C / g->groups) * g->KH * g->KW;
}

/* The run argument for (N,C,H,W) data in the layout tag names, or (md not NULL) in the one md
 * describes. */
static cddp__dnnl_arg nchw_dims(int arg, const void *data, cddp__dnnl_io io, const int64_t *d,
                                dnnl_format_tag_t tag, const dnnl_memory_desc_t *md) {
    return (cddp__dnnl_arg){.arg = arg,
                            .data = (void *)data,
                            .io = io,
                            .ndims = 4,
                            .dims = {d[0], d[1], d[2], d[3]},
                            .tag = tag,
                            .md = md};
}

/* The same of bf16 data (dy16): described in the layout tag names, its values bf16. */
static cddp__dnnl_arg nchw_bf16(int arg, const uint16_t *data, const int64_t *d,
                                dnnl_format_tag_t tag, dnnl_memory_desc_t *md) {
    cddp__dnnl_ok(
        dnnl_memory_desc_init_by_tag(md, 4, (dnnl_dims_t){d[0], d[1], d[2], d[3]}, dnnl_bf16, tag),
        "describing a bf16 gradient");
    return nchw_dims(arg, data, CDDP__DNNL_IN, d, tag, md);
}

/* The run arguments for the input x (or its gradient) and the weights (or theirs). */
static cddp__dnnl_arg input_arg(int arg, const void *data, cddp__dnnl_io io,
                                const cddp__conv_geom *g) {
    return nchw_dims(arg, data, io, (int64_t[]){g->N, g->C, g->H, g->W}, cddp__dnnl_tag(g->x_block),
                     NULL);
}

static cddp__dnnl_arg weights(int arg, const void *data, cddp__dnnl_io io,
                              const cddp__conv_geom *g) {
    int64_t cpg = g->C / g->groups;
    if (g->groups == 1)
        return nchw_dims(arg, data, io, (int64_t[]){g->O, cpg, g->KH, g->KW}, dnnl_nchw, NULL);
    return (cddp__dnnl_arg){.arg = arg,
                            .data = (void *)data,
                            .io = io,
                            .ndims = 5,
                            .dims = {g->groups, g->O / g->groups, cpg, g->KH, g->KW},
                            .tag = dnnl_goihw};
}

static cddp__dnnl_arg vec_arg(int arg, const void *data, cddp__dnnl_io io, int64_t n) {
    return (cddp__dnnl_arg){
        .arg = arg, .data = (void *)data, .io = io, .ndims = 1, .dims = {n}, .tag = dnnl_x};
}

/* Runs the forward primitive p into dst: (N,O,OH,OW) in g's output layout, or in the layout dst_md;
 * x's copy in p's layout into xc (when not NULL) for the weights' gradient. x16 (then x is NULL):
 * the input in bf16, which p reads as it is; dst16: p writes bf16 into dst. */
static bool conv_forward(cddp__kq *q, const cddp__dnnl_prim *p, const cddp__conv_geom *g,
                         const float *x, const uint16_t *x16, const float *w, const float *b,
                         void *dst, bool dst16, const dnnl_memory_desc_t *dst_md,
                         cddp__dnnl_copy *xc) {
    const int64_t od[4] = {g->N, g->O, g->OH, g->OW};
    if ((!x16 && !(x = operand(q, g, x, input_n(g)))) || !(w = operand(q, g, w, weights_n(g))))
        return false;
    cddp__dnnl_arg args[4] = {
        input_arg(DNNL_ARG_SRC, x16 ? (const void *)x16 : x, CDDP__DNNL_IN, g),
        weights(DNNL_ARG_WEIGHTS, w, CDDP__DNNL_IN, g),
        nchw_dims(DNNL_ARG_DST, dst, CDDP__DNNL_OUT, od, cddp__dnnl_tag(g->out_block), dst_md)};
    args[0].copy = xc;
    args[0].bf16 = x16 != NULL;
    args[2].bf16 = dst16;
    if (b) args[3] = vec_arg(DNNL_ARG_BIAS, b, CDDP__DNNL_IN, g->O);
    return cddp__dnnl_run(q, p, b ? 4 : 3, args);
}

void cddp__cpu_conv2d(cddp__kq *q, const cddp__k_conv2d *a) {
    const cddp__conv_geom *g = &a->g;
    /* x as the forward reorders it, for the weights' gradient to read again */
    cddp__dnnl_copy *xc = NULL;
    if (a->state) {
        if (!(xc = cddp__kq_scratch(q, sizeof *xc))) return;
        xc->data = NULL;
        *a->state = xc;
    }
    int kind = g->train ? FWD_TRAIN : FWD_INFER;
    if (cddp__cpu_bf16_native() || (!a->x16 && !a->y16)) { /* the primitive reads and writes bf16 */
        conv_forward(q, conv_prim_to(g, kind, a->y16 != NULL), g, a->x, a->x16, a->w, a->b,
                     a->y16 ? (void *)a->y16 : a->y, a->y16 != NULL, NULL, xc);
        return;
    }
    /* emulated: float32 primitives on the input widened, the output rounded */
    int64_t yn = g->N * g->O * g->OH * g->OW;
    const float *x = a->x16 ? widened(q, g, a->x16) : a->x;
    float *y = a->y16 ? cddp__kq_scratch(q, (size_t)yn * sizeof(float)) : a->y;
    if (!x || !y ||
        !conv_forward(q, conv_prim(g, kind), g, x, NULL, a->w, a->b, y, false, NULL, xc))
        return;
    if (a->y16) cddp__bf16_narrow_n(a->y16, y, yn);
}

/* The output's gradient as a backward reads it: its data, and its layout (for oneDNN md, or tag
 * when md is NULL; l for cddp's loop). */
typedef struct conv_grad {
    const float *data;
    const uint16_t *data16; /* or the same rounded to bf16 (then data is NULL; md NULL, tag set) */
    const dnnl_memory_desc_t *md;
    dnnl_format_tag_t tag;
    cddp__lanes l;
    int64_t n; /* its floats */
} conv_grad;

/* The gradients to make: each NULL when not wanted, else stored (assign) or added. */
typedef struct conv_out {
    float *dx, *dw, *db;
    bool dx_assign, dw_assign, db_assign;
} conv_out;

/* The weights' (and bias's) gradient of a stride-1 convolution with few input channels per group
 * (below 8), by cddp's own loop, which beats both of oneDNN's kernels there (1 -> 16 channels,
 * 28x28, batch 64, the backward of a sum and the convolution: 0.85-1.17 ms here, 1.2-1.9 ms
 * with oneDNN's GEMM kernel; its blocked kernel was slower still). With each image's planes
 * zero-padded to pitch PW (the input's by the padding, the output gradient's by zeros on the
 * right), every weight's gradient over one plane is a single dot product: dW[o,c,kh,kw] =
 * sum_j dy'[j] x'[j + kh PW + kw], j over the OH x PW padded output plane, the zeros cancelling
 * the terms that would wrap into the next row; vec.c takes 8 weights' dot products in one pass.
 * Sums over the batch are kept in double, each output channel's over the images in order; the
 * output channels split across the math threads. */
static bool own_weights_grad(const cddp__conv_geom *g) {
    return g->stride == 1 && g->C / g->groups < 8 && !g->x_block;
}

/* n floats from src (every stride-th) into dst, rounded to bf16 (as cddp__bf16_round rounds them)
 * when round: the products' operands in mixed precision, rounded as they are copied. */
static void copy_row(float *restrict dst, const float *restrict src, int64_t n, int64_t stride,
                     bool round) {
    if (!round && stride == 1) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = src[i * stride];
        dst[i] = round ? cddp__bf16_rounded(v) : v;
    }
}

/* n bf16 values from src (every stride-th) into dst as float32 (exact). */
static void widen_row(float *restrict dst, const uint16_t *restrict src, int64_t n,
                      int64_t stride) {
    for (int64_t i = 0; i < n; i++) dst[i] = cddp__bf16_widen(src[i * stride]);
}

/* weights_grad's work: output channels split across the math threads, each part with padded
 * planes of its own and its channels' sums over the batch, in order. */
typedef struct {
    const cddp__conv_geom *g;
    const float *xd;
    const conv_grad *dy;
    bool round;
    const int64_t *off;
    double *acc;     /* O K weights' sums, then O biases' */
    float *xp, *yp;  /* each part's: cpg xn floats, O yn floats (its channels' planes) */
    size_t nxp, nyp; /* each part's floats, rounded up to 16 */
    bool bias;
} wgrad_job;

static void weights_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    const wgrad_job *j = arg;
    const cddp__conv_geom *g = j->g;
    int64_t C = g->C, H = g->H, W = g->W, O = g->O, OH = g->OH, OW = g->OW, pad = g->pad;
    int64_t cpg = C / g->groups, opg = O / g->groups, PH = H + 2 * pad, PW = W + 2 * pad;
    int64_t K = cpg * g->KH * g->KW, xn = PH * PW + g->KW, yn = OH * PW;
    float *xp = j->xp + (size_t)part * j->nxp, *yp = j->yp + (size_t)part * j->nyp;
    memset(xp, 0, (size_t)(cpg * xn) * sizeof(float)); /* the borders stay 0 */
    memset(yp, 0, (size_t)(O * yn) * sizeof(float));
    const cddp__lanes *l = &j->dy->l;
    for (int64_t n = 0; n < g->N; n++) {
        /* row by row; with channels innermost a row of B channels (in L1) read once per channel */
        for (int64_t o0 = lo / l->B * l->B; o0 < hi; o0 += l->B)
            for (int64_t h = 0; h < OH; h++) {
                int64_t at = n * l->sN + o0 / l->B * l->sG + h * l->sH;
                for (int64_t oc = CDDP_MAX(o0, lo); oc < CDDP_MIN(o0 + l->B, hi); oc++)
                    if (j->dy->data16) /* rounded already */
                        widen_row(yp + oc * yn + h * PW, j->dy->data16 + at + oc - o0, OW, l->sW);
                    else
                        copy_row(yp + oc * yn + h * PW, j->dy->data + at + oc - o0, OW, l->sW,
                                 j->round);
            }
        for (int64_t gr = lo / opg; gr * opg < hi; gr++) {
            for (int64_t c = 0; c < cpg; c++)
                for (int64_t h = 0; h < H; h++)
                    copy_row(xp + c * xn + (h + pad) * PW + pad,
                             j->xd + ((n * C + gr * cpg + c) * H + h) * W, W, 1, j->round);
            for (int64_t oc = CDDP_MAX(gr * opg, lo); oc < CDDP_MIN((gr + 1) * opg, hi); oc++) {
                if (j->bias) j->acc[O * K + oc] += cddp__sum(yp + oc * yn, yn);
                cddp__dot_offsets(yp + oc * yn, xp, j->off, K, yn, j->acc + oc * K);
            }
        }
    }
}

static void weights_grad(cddp__kq *q, const cddp__conv_geom *g, const float *xd,
                         const conv_grad *dy, const conv_out *o, bool round) {
    int64_t C = g->C, H = g->H, W = g->W, O = g->O, KH = g->KH, KW = g->KW, pad = g->pad;
    int64_t cpg = C / g->groups, PH = H + 2 * pad, PW = W + 2 * pad;
    int64_t K = cpg * KH * KW, xn = PH * PW + KW, yn = g->OH * PW;
    int parts = cddp__cpu_parts(O, 4);
    wgrad_job j = {g,
                   xd,
                   dy,
                   round,
                   NULL,
                   NULL,
                   NULL,
                   NULL,
                   cddp__up16((size_t)(cpg * xn)),
                   cddp__up16((size_t)(O * yn)),
                   o->db != NULL};
    j.acc = cddp__kq_scratch(q, (size_t)(O * K + O) * sizeof(double));
    j.xp = cddp__kq_scratch(q, (size_t)parts * j.nxp * sizeof(float));
    j.yp = cddp__kq_scratch(q, (size_t)parts * j.nyp * sizeof(float)); /* an image's planes */
    int64_t *off = cddp__kq_scratch(q, (size_t)K * sizeof(int64_t));
    if (!j.acc || !j.xp || !j.yp || !off) return;
    for (int64_t c = 0; c < cpg; c++) /* where each weight's window starts in the padded planes */
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++)
                off[(c * KH + kh) * KW + kw] = c * xn + kh * PW + kw;
    j.off = off;
    memset(j.acc, 0, (size_t)(O * K + O) * sizeof(double));
    cddp__cpu_split(O, 1, parts, weights_grad_part, &j);
    float *gw = o->dw, *gb = o->db;
    if (gw)
        for (int64_t i = 0; i < O * K; i++) gw[i] = (o->dw_assign ? 0.0f : gw[i]) + (float)j.acc[i];
    if (gb)
        for (int64_t oc = 0; oc < O; oc++)
            gb[oc] = (o->db_assign ? 0.0f : gb[oc]) + (float)j.acc[O * K + oc];
}

static cddp__dnnl_io io_of(bool assign) {
    return assign ? CDDP__DNNL_OUT : CDDP__DNNL_ADD;
}

/* The gradients o wants, from the output's gradient dy; xc: x's copy made by the forward; x16
 * (then x is NULL): the input in bf16. */
static void conv_backward(cddp__kq *q, const cddp__conv_geom *g, const float *x,
                          const uint16_t *x16, const float *W, const conv_grad *dy,
                          const conv_out *o, cddp__dnnl_copy *xc) {
    const int64_t od[4] = {g->N, g->O, g->OH, g->OW};
    cddp__dnnl_copy dyc = {0}; /* the output's gradient reordered once for both runs */
    const float *d = dy->data; /* as the products read it */
    bool own = own_weights_grad(g);
    if (!dy->data16 && (o->dx || ((o->dw || o->db) && !own)) && !(d = operand(q, g, d, dy->n)))
        return;
    dnnl_memory_desc_t md16;
    cddp__dnnl_arg dy_arg =
        dy->data16 ? nchw_bf16(DNNL_ARG_DIFF_DST, dy->data16, od, dy->tag, &md16)
                   : nchw_dims(DNNL_ARG_DIFF_DST, d, CDDP__DNNL_IN, od, dy->tag, dy->md);
    dy_arg.copy = &dyc;
    if (o->dx) {
        const cddp__dnnl_prim *p = conv_prim(g, BWD_DATA);
        if (!(W = operand(q, g, W, weights_n(g)))) return;
        cddp__dnnl_arg args[3] = {dy_arg, weights(DNNL_ARG_WEIGHTS, W, CDDP__DNNL_IN, g),
                                  input_arg(DNNL_ARG_DIFF_SRC, o->dx, io_of(o->dx_assign), g)};
        if (!cddp__dnnl_run(q, p, 3, args)) return;
    }
    if (!o->dw && !o->db) return;
    /* bf16 units read x16 as it is; float32 loops and primitives, widened */
    bool x_bf16 = x16 && cddp__cpu_bf16_native() && !own;
    if (x16 && !x_bf16 && !(x = widened(q, g, x16))) return;
    if (own) { /* x and the output gradient rounded as the loop copies them, in mixed precision */
        weights_grad(q, g, x, dy, o, g->compute == CDDP_BF16);
        return;
    }
    /* x as the forward's reorder left it, else rounded again when emulating */
    if (!x_bf16 && !(xc && xc->data) && !(x = operand(q, g, x, input_n(g)))) return;
    /* Weights and bias come from one primitive; one that is not wanted goes to scratch. */
    int64_t wn = g->O * (g->C / g->groups) * g->KH * g->KW;
    float *gw = o->dw ? o->dw : cddp__kq_scratch(q, (size_t)wn * sizeof(float));
    float *gb = !g->bias ? NULL : o->db ? o->db : cddp__kq_scratch(q, (size_t)g->O * sizeof(float));
    if (!gw || (g->bias && !gb)) return;
    const cddp__dnnl_prim *p = conv_prim(g, BWD_WEIGHTS);
    cddp__dnnl_arg args[4] = {
        input_arg(DNNL_ARG_SRC, x_bf16 ? (const void *)x16 : x, CDDP__DNNL_IN, g), dy_arg,
        weights(DNNL_ARG_DIFF_WEIGHTS, gw, o->dw ? io_of(o->dw_assign) : CDDP__DNNL_OUT, g)};
    args[0].copy = xc;
    args[0].bf16 = x_bf16;
    if (g->bias)
        args[3] =
            vec_arg(DNNL_ARG_DIFF_BIAS, gb, o->db ? io_of(o->db_assign) : CDDP__DNNL_OUT, g->O);
    cddp__dnnl_run(q, p, g->bias ? 4 : 3, args);
}

bool cddp__cpu_conv_grad_takes_bf16(const cddp__conv_geom *g) {
    return g->compute == CDDP_BF16 && cddp__cpu_bf16_native();
}

void cddp__cpu_conv2d_grad(cddp__kq *q, const cddp__k_conv2d_grad *a) {
    const cddp__conv_geom *g = &a->g;
    int64_t B = CDDP_MAX(g->out_block, 1);
    conv_grad dy = {.data = a->dy,
                    .data16 = a->dy16,
                    .tag = cddp__dnnl_tag(g->out_block),
                    .l = {.B = B,
                          .sN = g->O * g->OH * g->OW,
                          .sG = B * g->OH * g->OW,
                          .sH = B * g->OW,
                          .sW = B},
                    .n = g->N * g->O * g->OH * g->OW};
    conv_out o = {a->dx, a->dw, a->db, a->dx_assign, a->dw_assign, a->db_assign};
    conv_backward(q, g, a->x, a->x16, a->w, &dy, &o, *a->state);
}

/* ---- convolution, ReLU and 2x2 max pooling in one kernel -----------------------------------
 * The convolution writes its output in the layout its primitive prefers (oneDNN's nChw16c here,
 * NHWC for inference) into scratch, and vec.c's loop pools it from there into the plain output,
 * keeping each maximum's place in its window; the backward makes the convolution's output gradient
 * in that layout, which the convolution's backward primitives read as they are. This saves the
 * reorder of the convolution's output (forward) and of its gradient (backward), and the
 * convolution's output is not kept for the backward. A layout other than channels innermost runs
 * as the two ops (conv_pool_fuses says so). */

typedef struct fused_saved {
    cddp__dnnl_copy xc;
    const dnnl_memory_desc_t *md; /* the convolution's output layout (the forward primitive's) */
    cddp__lanes l;
    int8_t *code;
} fused_saved;

/* md as a cddp__lanes layout of (N,C,H,W) with channels innermost (B > 1), dense; false if not. */
static bool lanes_of(const dnnl_memory_desc_t *md, cddp__lanes *l) {
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    const dnnl_dim_t *d = md->dims, *s = bd->strides;
    if (md->ndims != 4 || md->format_kind != dnnl_blocked || md->offset0 != 0) return false;
    if (bd->inner_nblks == 1 && bd->inner_idxs[0] == 1) { /* nChwBc */
        int64_t B = bd->inner_blks[0], G = (d[1] + B - 1) / B;
        *l = (cddp__lanes){
            .B = B, .sN = G * d[2] * d[3] * B, .sG = d[2] * d[3] * B, .sH = d[3] * B, .sW = B};
        return B > 1 && md->padded_dims[1] == G * B && s[0] == l->sN && s[1] == l->sG &&
               s[2] == l->sH && s[3] == l->sW;
    }
    if (bd->inner_nblks == 0) { /* NHWC: the channels one group */
        *l = (cddp__lanes){
            .B = d[1], .sN = d[1] * d[2] * d[3], .sG = 0, .sH = d[1] * d[3], .sW = d[1]};
        return d[1] > 1 && s[0] == l->sN && s[1] == 1 && s[2] == l->sH && s[3] == l->sW;
    }
    return false;
}

bool cddp__cpu_conv_pool_fuses(const cddp__conv_geom *g) {
    cddp__lanes l;
    return lanes_of(cddp__dnnl_md(conv_prim(g, g->train ? FWD_TRAIN : FWD_INFER), DNNL_ARG_DST),
                    &l);
}

/* The ReLU and pooling of the fused op, and its gradient, split across the math threads by batch
 * element, each part with a tile of its own. */
typedef struct {
    const cddp__conv_geom *g;
    const cddp__lanes *l;
    float *conv, *y; /* the forward's; the gradient's: dy, and dx into conv */
    int8_t *code;
    float *tile;
} pool_job;

static size_t tile_floats(const cddp__conv_geom *g, const cddp__lanes *l) {
    return cddp__up16((size_t)(g->OW * l->B));
}

static void relu_pool_part(int64_t lo, int64_t hi, int part, void *arg) {
    const pool_job *j = arg;
    const cddp__conv_geom *g = j->g;
    int64_t PH = g->OH / 2, PW = g->OW / 2, G = (g->O + j->l->B - 1) / j->l->B;
    cddp__relu_pool2x2_lanes(j->conv + lo * j->l->sN, j->l, hi - lo, g->O, g->OH, g->OW,
                             j->y + lo * g->O * PH * PW,
                             j->code ? j->code + lo * G * PH * PW * j->l->B : NULL,
                             j->tile + (size_t)part * tile_floats(g, j->l));
}

static void relu_pool_grad_part(int64_t lo, int64_t hi, int part, void *arg) {
    const pool_job *j = arg;
    const cddp__conv_geom *g = j->g;
    int64_t PH = g->OH / 2, PW = g->OW / 2, G = (g->O + j->l->B - 1) / j->l->B;
    cddp__relu_pool2x2_lanes_grad(j->code + lo * G * PH * PW * j->l->B, j->y + lo * g->O * PH * PW,
                                  j->l, hi - lo, g->O, g->OH, g->OW, j->conv + lo * j->l->sN,
                                  j->tile + (size_t)part * tile_floats(g, j->l));
}

void cddp__cpu_conv2d_relu_pool(cddp__kq *q, const cddp__k_conv2d_relu_pool *a) {
    const cddp__conv_geom *g = &a->g;
    const cddp__dnnl_prim *p = conv_prim(g, g->train ? FWD_TRAIN : FWD_INFER);
    const dnnl_memory_desc_t *md = cddp__dnnl_md(p, DNNL_ARG_DST);
    cddp__lanes l;
    CDDP_CHECK(lanes_of(md, &l), "conv2d_relu_pool on a layout that does not fuse");
    int64_t PH = g->OH / 2, PW = g->OW / 2, G = (g->O + l.B - 1) / l.B;
    fused_saved *sv = a->state ? cddp__kq_scratch(q, sizeof *sv) : NULL;
    float *conv = cddp__kq_scratch(q, dnnl_memory_desc_get_size(md));
    int parts = cddp__cpu_row_parts(g->N, g->O * g->OH * g->OW);
    float *tile = cddp__kq_scratch(q, (size_t)parts * tile_floats(g, &l) * sizeof(float));
    if ((a->state && !sv) || !conv || !tile) return;
    if (sv) {
        *sv = (fused_saved){.md = md, .l = l};
        sv->code = cddp__kq_scratch(q, (size_t)(g->N * G * PH * PW * l.B));
        if (!sv->code) return;
        *a->state = sv;
    }
    if (!conv_forward(q, p, g, a->x, NULL, a->w, a->b, conv, false, md, sv ? &sv->xc : NULL))
        return;
    pool_job j = {g, &l, conv, a->y, sv ? sv->code : NULL, tile};
    cddp__cpu_split(g->N, 1, parts, relu_pool_part, &j);
}

void cddp__cpu_conv2d_relu_pool_grad(cddp__kq *q, const cddp__k_conv2d_relu_pool_grad *a) {
    const cddp__conv_geom *g = &a->g;
    fused_saved *sv = *a->state;
    float *dy = cddp__kq_scratch(q, dnnl_memory_desc_get_size(sv->md));
    int parts = cddp__cpu_row_parts(g->N, g->O * g->OH * g->OW);
    float *tile = cddp__kq_scratch(q, (size_t)parts * tile_floats(g, &sv->l) * sizeof(float));
    if (!dy || !tile) return;
    pool_job j = {g, &sv->l, dy, (float *)a->dy, sv->code, tile};
    cddp__cpu_split(g->N, 1, parts, relu_pool_grad_part, &j);
    conv_out o = {a->dx, a->dw, a->db, a->dx_assign, a->dw_assign, a->db_assign};
    conv_grad d = {.data = dy,
                   .md = sv->md,
                   .l = sv->l,
                   .n = (int64_t)(dnnl_memory_desc_get_size(sv->md) / sizeof(float))};
    conv_backward(q, g, a->x, NULL, a->w, &d, &o, &sv->xc);
}
