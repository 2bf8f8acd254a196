/* conv.c: 2-D convolution (strided, zero-padded, grouped) on oneDNN: forward, backward-data and
 * backward-weights primitives made once per shape, in the layouts oneDNN prefers (see
 * tensor/dnnl.h); the weights' gradient of a stride-1 convolution with few input channels per
 * group by a loop of cddp's own (weights_grad), which is faster there. And a convolution followed
 * by a ReLU and 2x2 max pooling as one op (a CNN's usual layer), whose convolution output stays in
 * oneDNN's layout: pooled from it, its gradient made in it. */
#include "tensor/dnnl.h"

#include <string.h>

enum { FWD_TRAIN, FWD_INFER, BWD_DATA, BWD_WEIGHTS };

/* A convolution's primitive: int64 only, so that no padding byte enters the cache key. src_block
 * and dst_block: the channel block of a blocked input or output (its layout then fixed), else 0
 * (the primitive's choice). */
typedef struct conv_key {
    int64_t kind, N, C, H, W, O, KH, KW, OH, OW, stride, pad, groups, bias, src_block, dst_block;
} conv_key;

static dnnl_format_tag_t block_tag(int64_t block) {
    return block ? cddp__dnnl_tag((int)block) : dnnl_format_tag_any;
}

static void md_tag(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims, dnnl_format_tag_t tag) {
    cddp__dnnl_ok(dnnl_memory_desc_init_by_tag(md, n, dims, dnnl_f32, tag),
                  "describing a convolution");
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
    md_tag(&src, 4, (dnnl_dims_t){k->N, k->C, k->H, k->W},
           plain ? dnnl_nchw : block_tag(k->src_block));
    md_tag(&w, wn, wd, !plain ? dnnl_format_tag_any : wn == 4 ? dnnl_oihw : dnnl_goihw);
    md_tag(&dst, 4, (dnnl_dims_t){k->N, k->O, k->OH, k->OW},
           plain ? dnnl_nchw : block_tag(k->dst_block));
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

/* A convolution's tensors and arguments; b may be NULL. out_block: the output's layout (0 plain,
 * or blocked by that many channels). */
typedef struct conv_args {
    cddp_tensor *x, *w, *b;
    int stride, pad, groups;
    int64_t OH, OW;
    int out_block;
} conv_args;

static const cddp__dnnl_prim *conv_prim(const conv_args *a, int kind) {
    conv_key k = {.kind = kind,
                  .N = a->x->shape[0],
                  .C = a->x->shape[1],
                  .H = a->x->shape[2],
                  .W = a->x->shape[3],
                  .O = a->w->shape[0],
                  .KH = a->w->shape[2],
                  .KW = a->w->shape[3],
                  .OH = a->OH,
                  .OW = a->OW,
                  .stride = a->stride,
                  .pad = a->pad,
                  .groups = a->groups,
                  .bias = a->b != NULL,
                  .src_block = a->x->block,
                  .dst_block = a->out_block};
    return cddp__dnnl_get(&k, sizeof k, make_conv);
}

/* The run argument for (N,C,H,W) data in the layout tag names, or (md not NULL) in the one md
 * describes. */
static cddp__dnnl_arg nchw_dims(int arg, void *data, cddp__dnnl_io io, const int64_t *d,
                                dnnl_format_tag_t tag, const dnnl_memory_desc_t *md) {
    return (cddp__dnnl_arg){.arg = arg,
                            .data = data,
                            .io = io,
                            .ndims = 4,
                            .dims = {d[0], d[1], d[2], d[3]},
                            .tag = tag,
                            .md = md};
}

/* The run argument for data laid out as t's (t's own data or its gradient). */
static cddp__dnnl_arg nchw(int arg, void *data, cddp__dnnl_io io, const cddp_tensor *t) {
    return nchw_dims(arg, data, io, t->shape, cddp__dnnl_tag(t->block), NULL);
}

static cddp__dnnl_arg weights(int arg, void *data, cddp__dnnl_io io, const cddp_tensor *w,
                              int groups) {
    if (groups == 1) return nchw(arg, data, io, w);
    return (cddp__dnnl_arg){
        .arg = arg,
        .data = data,
        .io = io,
        .ndims = 5,
        .dims = {groups, w->shape[0] / groups, w->shape[1], w->shape[2], w->shape[3]},
        .tag = dnnl_goihw};
}

static cddp__dnnl_arg vec_arg(int arg, void *data, cddp__dnnl_io io, const cddp_tensor *b) {
    return (cddp__dnnl_arg){
        .arg = arg, .data = data, .io = io, .ndims = 1, .dims = {b->shape[0]}, .tag = dnnl_x};
}

/* Checks a convolution's arguments (as op) and completes a with its output's height and width. */
static void conv_check(const char *op, conv_args *a) {
    const cddp_tensor *x = a->x, *w = a->w, *b = a->b;
    cddp__need_f32_any(op, x);
    cddp__need_f32(op, w);
    CDDP_CHECK(a->groups >= 1 && x->ndim == 4 && w->ndim == 4 && x->shape[1] % a->groups == 0 &&
                   w->shape[0] % a->groups == 0 && x->shape[1] == w->shape[1] * a->groups,
               "%s: input %s does not fit weight %s in %d groups (want (N,C,H,W) and "
               "(O,C/groups,KH,KW), groups dividing C and O)",
               op, CDDP__SHAPE(x), CDDP__SHAPE(w), a->groups);
    CDDP_CHECK(a->stride >= 1 && a->pad >= 0, "%s: stride %d, padding %d", op, a->stride, a->pad);
    int64_t H = x->shape[2], W = x->shape[3], KH = w->shape[2], KW = w->shape[3];
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == w->shape[0], "%s: bias %s for weight %s", op,
                   CDDP__SHAPE(b), CDDP__SHAPE(w));
    CDDP_CHECK(H + 2 * a->pad >= KH && W + 2 * a->pad >= KW,
               "%s: kernel %s is larger than the padded input %s", op, CDDP__SHAPE(w),
               CDDP__SHAPE(x));
    a->OH = (H + 2 * a->pad - KH) / a->stride + 1;
    a->OW = (W + 2 * a->pad - KW) / a->stride + 1;
}

/* Runs a's forward primitive p into dst: (N,O,OH,OW) in a's output layout, or in the layout dst_md;
 * x's copy in p's layout into xc (when not NULL) for the weights' gradient. */
static bool conv_forward(cddp_ctx *ctx, const cddp__dnnl_prim *p, const conv_args *a, void *dst,
                         const dnnl_memory_desc_t *dst_md, cddp__dnnl_copy *xc) {
    const int64_t od[4] = {a->x->shape[0], a->w->shape[0], a->OH, a->OW};
    cddp__dnnl_arg args[4] = {
        nchw(DNNL_ARG_SRC, a->x->data, CDDP__DNNL_IN, a->x),
        weights(DNNL_ARG_WEIGHTS, a->w->data, CDDP__DNNL_IN, a->w, a->groups),
        nchw_dims(DNNL_ARG_DST, dst, CDDP__DNNL_OUT, od, cddp__dnnl_tag(a->out_block), dst_md)};
    args[0].copy = xc;
    if (a->b) args[3] = vec_arg(DNNL_ARG_BIAS, a->b->data, CDDP__DNNL_IN, a->b);
    return cddp__dnnl_run(ctx, p, a->b ? 4 : 3, args);
}

static void record_conv(cddp__node *node, const conv_args *a, void *saved) {
    if (!node) return;
    node->arg.conv.stride = a->stride;
    node->arg.conv.padding = a->pad;
    node->arg.conv.groups = a->groups;
    node->saved = saved;
}

static conv_args node_args(const cddp__node *n, int64_t OH, int64_t OW) {
    return (conv_args){.out_block = n->out->block,
                       .x = n->in[0],
                       .w = n->in[1],
                       .b = n->nin > 2 ? n->in[2] : NULL,
                       .stride = n->arg.conv.stride,
                       .pad = n->arg.conv.padding,
                       .groups = n->arg.conv.groups,
                       .OH = OH,
                       .OW = OW};
}

/* The convolution, its output blocked by out_block channels (0: plain). */
static cddp_tensor *conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                           int stride, int padding, int groups, int out_block) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    conv_args a = {.x = x, .w = w, .b = b, .stride = stride, .pad = padding, .groups = groups};
    conv_check("conv2d", &a);
    if (w->shape[0] % CDDP_MAX(out_block, 1)) out_block = 0;
    a.out_block = out_block;
    cddp_tensor *out =
        cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){x->shape[0], w->shape[0], a.OH, a.OW});
    if (!out) return NULL;
    out->block = out_block;
    cddp_tensor *in[3] = {x, w, b};
    /* x as the forward reorders it, for the weights' gradient to read again */
    cddp__dnnl_copy *xc = NULL;
    if (out->numel > 0) {
        bool train = cddp__will_record(ctx, b ? 3 : 2, in);
        if (train && !(xc = cddp__ctx_alloc(ctx, sizeof *xc))) return NULL;
        if (xc) xc->data = NULL;
        const cddp__dnnl_prim *p = conv_prim(&a, train ? FWD_TRAIN : FWD_INFER);
        if (!conv_forward(ctx, p, &a, out->data, NULL, xc)) return NULL;
    }
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_CONV2D, out, b ? 3 : 2, in, &node)) return NULL;
    record_conv(node, &a, xc);
    return out;
}

cddp_tensor *cddp_conv2d_groups(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                int stride, int padding, int groups) {
    return conv2d(ctx, x, w, b, stride, padding, groups, x ? x->block : 0);
}

cddp_tensor *cddp_conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b, int stride,
                         int padding) {
    return cddp_conv2d_groups(ctx, x, w, b, stride, padding, 1);
}

cddp_tensor *cddp_conv2d_blocked(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                 int stride, int padding, int groups) {
    return conv2d(ctx, x, w, b, stride, padding, groups, cddp_blocked_size());
}

/* A gradient buffer as a run's output: stored when the buffer is fresh, else added. */
static float *grad_out(cddp_ctx *ctx, cddp_tensor *t, cddp__dnnl_io *io) {
    bool assign = false;
    float *g = cddp_grad_buffer_assign(ctx, t, &assign);
    *io = assign ? CDDP__DNNL_OUT : CDDP__DNNL_ADD;
    return g;
}

/* The output's gradient as a backward reads it: its data, and its layout (for oneDNN md, or tag
 * when md is NULL; l for cddp's loop). */
typedef struct conv_grad {
    const float *data;
    const dnnl_memory_desc_t *md;
    dnnl_format_tag_t tag;
    cddp__lanes l;
} conv_grad;

/* The weights' (and bias's) gradient of a stride-1 convolution with few input channels per group
 * (below 8), by cddp's own loop, which beats both of oneDNN's kernels there (1 -> 16 channels,
 * 28x28, batch 64, the backward of a sum and the convolution: 0.85-1.17 ms here, 1.2-1.9 ms
 * with oneDNN's GEMM kernel; its blocked kernel was slower still). With each image's planes
 * zero-padded to pitch PW (the input's by the padding, the output gradient's by zeros on the
 * right), every weight's gradient over one plane is a single dot product: dW[o,c,kh,kw] =
 * sum_j dy'[j] x'[j + kh PW + kw], j over the OH x PW padded output plane, the zeros cancelling
 * the terms that would wrap into the next row; vec.c takes 8 weights' dot products in one pass.
 * Sums over the batch are kept in double. */
static bool own_weights_grad(const cddp_tensor *x, int stride, int groups) {
    return stride == 1 && x->shape[1] / groups < 8 && !x->block;
}

static void weights_grad(cddp_ctx *ctx, const conv_args *a, const conv_grad *dy, float *gw,
                         bool wadd, float *gb, bool badd) {
    const cddp_tensor *x = a->x;
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = a->w->shape[0], KH = a->w->shape[2], KW = a->w->shape[3], OH = a->OH, OW = a->OW;
    int64_t pad = a->pad, groups = a->groups;
    int64_t cpg = C / groups, opg = O / groups, PH = H + 2 * pad, PW = W + 2 * pad;
    int64_t K = cpg * KH * KW, xn = PH * PW + KW, yn = OH * PW;
    double *acc = cddp__ctx_alloc(ctx, (size_t)(O * K + O) * sizeof(double));
    float *xp = cddp__ctx_alloc(ctx, (size_t)(cpg * xn) * sizeof(float));
    float *yp = cddp__ctx_alloc(ctx, (size_t)(O * yn) * sizeof(float)); /* an image's planes */
    int64_t *off = cddp__ctx_alloc(ctx, (size_t)K * sizeof(int64_t));
    if (!acc || !xp || !yp || !off) return;
    for (int64_t c = 0; c < cpg; c++) /* where each weight's window starts in the padded planes */
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++)
                off[(c * KH + kh) * KW + kw] = c * xn + kh * PW + kw;
    memset(acc, 0, (size_t)(O * K + O) * sizeof(double));
    memset(xp, 0, (size_t)(cpg * xn) * sizeof(float)); /* the borders stay 0 */
    memset(yp, 0, (size_t)(O * yn) * sizeof(float));
    const float *xd = cddp_f32(x);
    const cddp__lanes *l = &dy->l;
    for (int64_t n = 0; n < N; n++) {
        const float *d = dy->data + n * l->sN;
        /* row by row; with channels innermost a row of B channels (in L1) read once per channel */
        for (int64_t o0 = 0; o0 < O; o0 += l->B)
            for (int64_t h = 0; h < OH; h++) {
                const float *row = d + o0 / l->B * l->sG + h * l->sH;
                for (int64_t k = 0; k < CDDP_MIN(l->B, O - o0); k++) {
                    float *to = yp + (o0 + k) * yn + h * PW;
                    if (l->sW == 1)
                        memcpy(to, row + k, (size_t)OW * sizeof(float));
                    else
                        for (int64_t w = 0; w < OW; w++) to[w] = row[w * l->sW + k];
                }
            }
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t c = 0; c < cpg; c++)
                for (int64_t h = 0; h < H; h++)
                    memcpy(xp + c * xn + (h + pad) * PW + pad,
                           xd + ((n * C + g * cpg + c) * H + h) * W, (size_t)W * sizeof(float));
            for (int64_t o = g * opg; o < (g + 1) * opg; o++) {
                if (gb) acc[O * K + o] += cddp__sum(yp + o * yn, yn);
                cddp__dot_offsets(yp + o * yn, xp, off, K, yn, acc + o * K);
            }
        }
    }
    if (gw)
        for (int64_t i = 0; i < O * K; i++) gw[i] = (wadd ? gw[i] : 0.0f) + (float)acc[i];
    if (gb)
        for (int64_t o = 0; o < O; o++) gb[o] = (badd ? gb[o] : 0.0f) + (float)acc[O * K + o];
}

/* The gradients of a's inputs that want one, from the output's gradient dy; xc: x's copy made by
 * the forward. */
static void conv_backward(cddp_ctx *ctx, const conv_args *a, const conv_grad *dy,
                          cddp__dnnl_copy *xc) {
    cddp_tensor *x = a->x, *W = a->w, *b = a->b;
    const int64_t od[4] = {x->shape[0], W->shape[0], a->OH, a->OW};
    cddp__dnnl_io io;
    cddp__dnnl_copy dyc = {0}; /* the output's gradient reordered once for both runs */
    if (x->requires_grad) {
        float *gx = grad_out(ctx, x, &io);
        if (!gx) return;
        const cddp__dnnl_prim *p = conv_prim(a, BWD_DATA);
        cddp__dnnl_arg args[3] = {
            nchw_dims(DNNL_ARG_DIFF_DST, (void *)dy->data, CDDP__DNNL_IN, od, dy->tag, dy->md),
            weights(DNNL_ARG_WEIGHTS, W->data, CDDP__DNNL_IN, W, a->groups),
            nchw(DNNL_ARG_DIFF_SRC, gx, io, x)};
        args[0].copy = &dyc;
        if (!cddp__dnnl_run(ctx, p, 3, args)) return;
    }
    bool want_b = b && b->requires_grad;
    if (!W->requires_grad && !want_b) return;
    if (own_weights_grad(x, a->stride, a->groups)) {
        bool wnew = false, bnew = false;
        float *gw = W->requires_grad ? cddp_grad_buffer_assign(ctx, W, &wnew) : NULL;
        float *gb = want_b ? cddp_grad_buffer_assign(ctx, b, &bnew) : NULL;
        if ((W->requires_grad && !gw) || (want_b && !gb)) return;
        weights_grad(ctx, a, dy, gw, !wnew, gb, !bnew);
        return;
    }
    /* Weights and bias come from one primitive; one that is not wanted goes to scratch. */
    cddp__dnnl_io wio = CDDP__DNNL_OUT, bio = CDDP__DNNL_OUT;
    float *gw = W->requires_grad ? grad_out(ctx, W, &wio)
                                 : cddp__ctx_alloc(ctx, (size_t)W->numel * sizeof(float));
    float *gb = !b       ? NULL
                : want_b ? grad_out(ctx, b, &bio)
                         : cddp__ctx_alloc(ctx, (size_t)b->numel * sizeof(float));
    if (!gw || (b && !gb)) return;
    const cddp__dnnl_prim *p = conv_prim(a, BWD_WEIGHTS);
    cddp__dnnl_arg args[4] = {
        nchw(DNNL_ARG_SRC, x->data, CDDP__DNNL_IN, x),
        nchw_dims(DNNL_ARG_DIFF_DST, (void *)dy->data, CDDP__DNNL_IN, od, dy->tag, dy->md),
        weights(DNNL_ARG_DIFF_WEIGHTS, gw, wio, W, a->groups)};
    args[0].copy = xc;
    args[1].copy = &dyc;
    if (b) args[3] = vec_arg(DNNL_ARG_DIFF_BIAS, gb, bio, b);
    cddp__dnnl_run(ctx, p, b ? 4 : 3, args);
}

void cddp__conv2d_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *out = n->out;
    if (out->numel == 0) return;
    conv_args a = node_args(n, out->shape[2], out->shape[3]);
    int64_t O = out->shape[1], OH = a.OH, OW = a.OW, B = CDDP_MAX(out->block, 1);
    conv_grad dy = {.data = out->grad,
                    .tag = cddp__dnnl_tag(out->block),
                    .l = {.B = B, .sN = O * OH * OW, .sG = B * OH * OW, .sH = B * OW, .sW = B}};
    conv_backward(ctx, &a, &dy, n->saved);
}

/* ---- convolution, ReLU and 2x2 max pooling in one op ---------------------------------------
 * The convolution writes its output in the layout its primitive prefers (oneDNN's nChw16c here,
 * NHWC for inference) into the step arena, and vec.c's loop pools it from there into the plain
 * output, keeping each maximum's place in its window; the backward makes the convolution's output
 * gradient in that layout, which the convolution's backward primitives read as they are. This
 * saves the reorder of the convolution's output (forward) and of its gradient (backward), and the
 * convolution's output is not kept for the backward. A layout other than channels innermost, or
 * other pooling, runs as cddp_conv2d_groups and cddp_relu_max_pool2d. */

typedef struct fused_saved {
    cddp__dnnl_copy xc;
    int64_t OH, OW;               /* the convolution's output */
    const dnnl_memory_desc_t *md; /* and its layout (the forward primitive's) */
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

cddp_tensor *cddp_conv2d_relu_max_pool2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w,
                                         cddp_tensor *b, int stride, int padding, int groups,
                                         int pool_kernel, int pool_stride, int pool_padding) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    conv_args a = {.x = x, .w = w, .b = b, .stride = stride, .pad = padding, .groups = groups};
    conv_check("conv2d_relu_max_pool2d", &a);
    int64_t N = x->shape[0], O = w->shape[0];
    cddp_tensor *in[3] = {x, w, b};
    bool train = cddp__will_record(ctx, b ? 3 : 2, in);
    const cddp__dnnl_prim *p = NULL;
    const dnnl_memory_desc_t *md = NULL;
    cddp__lanes l;
    bool fuse = pool_kernel == 2 && (pool_stride == 2 || pool_stride <= 0) && pool_padding == 0 &&
                a.OH >= 2 && a.OW >= 2 && N * O > 0;
    if (fuse) {
        p = conv_prim(&a, train ? FWD_TRAIN : FWD_INFER);
        md = cddp__dnnl_md(p, DNNL_ARG_DST);
    }
    if (!fuse || !lanes_of(md, &l))
        return cddp_relu_max_pool2d(
            ctx, cddp_to_nchw(ctx, cddp_conv2d_groups(ctx, x, w, b, stride, padding, groups)),
            pool_kernel, pool_stride, pool_padding);
    int64_t PH = a.OH / 2, PW = a.OW / 2, G = (O + l.B - 1) / l.B;
    fused_saved *sv = train ? cddp__ctx_alloc(ctx, sizeof *sv) : NULL;
    float *conv = cddp__ctx_alloc(ctx, dnnl_memory_desc_get_size(md));
    float *tile = cddp__ctx_alloc(ctx, (size_t)(PW * l.B) * sizeof(float));
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){N, O, PH, PW});
    if ((train && !sv) || !conv || !tile || !out) return NULL;
    if (sv) {
        *sv = (fused_saved){.OH = a.OH, .OW = a.OW, .md = md, .l = l};
        sv->code = cddp__ctx_alloc(ctx, (size_t)(N * G * PH * PW * l.B));
        if (!sv->code) return NULL;
    }
    if (!conv_forward(ctx, p, &a, conv, md, sv ? &sv->xc : NULL)) return NULL;
    cddp__relu_pool2x2_lanes(conv, &l, N, O, a.OH, a.OW, cddp_f32(out), sv ? sv->code : NULL, tile);
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_CONV2D_RELU_MAX_POOL2D, out, b ? 3 : 2, in, &node))
        return NULL;
    record_conv(node, &a, sv);
    return out;
}

void cddp__conv2d_relu_max_pool2d_backward(cddp_ctx *ctx, cddp__node *n) {
    fused_saved *sv = n->saved;
    conv_args a = node_args(n, sv->OH, sv->OW);
    float *dy = cddp__ctx_alloc(ctx, dnnl_memory_desc_get_size(sv->md));
    float *tile = cddp__ctx_alloc(ctx, (size_t)(a.OW / 2 * sv->l.B) * sizeof(float));
    if (!dy || !tile) return;
    cddp__relu_pool2x2_lanes_grad(sv->code, n->out->grad, &sv->l, a.x->shape[0], a.w->shape[0],
                                  a.OH, a.OW, dy, tile);
    conv_backward(ctx, &a, &(conv_grad){.data = dy, .md = sv->md, .l = sv->l}, &sv->xc);
}
