/* conv.c: 2-D convolution (strided, zero-padded, grouped) on oneDNN: forward, backward-data and
 * backward-weights primitives made once per shape, in the layouts oneDNN prefers (see
 * tensor/dnnl.h); the weights' gradient of a stride-1 convolution with few input channels per
 * group by a loop of cddp's own (weights_grad), which is faster there. */
#include "tensor/dnnl.h"

#include <string.h>

enum { FWD_TRAIN, FWD_INFER, BWD_DATA, BWD_WEIGHTS };

/* A convolution's primitive: int64 only, so that no padding byte enters the cache key. */
typedef struct conv_key {
    int64_t kind, N, C, H, W, O, KH, KW, OH, OW, stride, pad, groups, bias;
} conv_key;

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
    md_tag(&src, 4, (dnnl_dims_t){k->N, k->C, k->H, k->W}, plain ? dnnl_nchw : dnnl_format_tag_any);
    md_tag(&w, wn, wd, !plain ? dnnl_format_tag_any : wn == 4 ? dnnl_oihw : dnnl_goihw);
    md_tag(&dst, 4, (dnnl_dims_t){k->N, k->O, k->OH, k->OW},
           plain ? dnnl_nchw : dnnl_format_tag_any);
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

static const cddp__dnnl_prim *conv_prim(const cddp_tensor *x, const cddp_tensor *w,
                                        const cddp_tensor *out, bool bias, int stride, int pad,
                                        int groups, int kind) {
    conv_key k = {.kind = kind,
                  .N = x->shape[0],
                  .C = x->shape[1],
                  .H = x->shape[2],
                  .W = x->shape[3],
                  .O = w->shape[0],
                  .KH = w->shape[2],
                  .KW = w->shape[3],
                  .OH = out->shape[2],
                  .OW = out->shape[3],
                  .stride = stride,
                  .pad = pad,
                  .groups = groups,
                  .bias = bias};
    return cddp__dnnl_get(&k, sizeof k, make_conv);
}

/* The run arguments for an (N,C,H,W) tensor, the weights and the bias. */
static cddp__dnnl_arg nchw(int arg, void *data, cddp__dnnl_io io, const cddp_tensor *t) {
    return (cddp__dnnl_arg){.arg = arg,
                            .data = data,
                            .io = io,
                            .ndims = 4,
                            .dims = {t->shape[0], t->shape[1], t->shape[2], t->shape[3]},
                            .tag = dnnl_nchw};
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

cddp_tensor *cddp_conv2d_groups(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b,
                                int stride, int padding, int groups) {
    if (CDDP__FAILED(ctx) || !x || !w) return NULL;
    cddp__need_f32("conv2d", x);
    cddp__need_f32("conv2d", w);
    CDDP_CHECK(groups >= 1 && x->ndim == 4 && w->ndim == 4 && x->shape[1] % groups == 0 &&
                   w->shape[0] % groups == 0 && x->shape[1] == w->shape[1] * groups,
               "conv2d: input %s does not fit weight %s in %d groups (want (N,C,H,W) and "
               "(O,C/groups,KH,KW), groups dividing C and O)",
               CDDP__SHAPE(x), CDDP__SHAPE(w), groups);
    CDDP_CHECK(stride >= 1 && padding >= 0, "conv2d: stride %d, padding %d", stride, padding);
    int64_t N = x->shape[0], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], KH = w->shape[2], KW = w->shape[3];
    if (b)
        CDDP_CHECK(b->ndim == 1 && b->shape[0] == O, "conv2d: bias %s for weight %s",
                   CDDP__SHAPE(b), CDDP__SHAPE(w));
    CDDP_CHECK(H + 2 * padding >= KH && W + 2 * padding >= KW,
               "conv2d: kernel %s is larger than the padded input %s", CDDP__SHAPE(w),
               CDDP__SHAPE(x));
    int64_t OH = (H + 2 * padding - KH) / stride + 1, OW = (W + 2 * padding - KW) / stride + 1;
    cddp_tensor *out = cddp_empty(ctx, CDDP_F32, 4, (int64_t[]){N, O, OH, OW});
    if (!out) return NULL;
    cddp_tensor *in[3] = {x, w, b};
    /* x as the forward reorders it, for the weights' gradient to read again */
    cddp__dnnl_copy *xc = NULL;
    if (out->numel > 0) {
        bool train = cddp__will_record(ctx, b ? 3 : 2, in);
        if (train && !(xc = cddp__ctx_alloc(ctx, sizeof *xc))) return NULL;
        if (xc) xc->data = NULL;
        const cddp__dnnl_prim *p =
            conv_prim(x, w, out, b, stride, padding, groups, train ? FWD_TRAIN : FWD_INFER);
        cddp__dnnl_arg args[4] = {nchw(DNNL_ARG_SRC, x->data, CDDP__DNNL_IN, x),
                                  weights(DNNL_ARG_WEIGHTS, w->data, CDDP__DNNL_IN, w, groups),
                                  nchw(DNNL_ARG_DST, out->data, CDDP__DNNL_OUT, out)};
        args[0].copy = xc;
        if (b) args[3] = vec_arg(DNNL_ARG_BIAS, b->data, CDDP__DNNL_IN, b);
        if (!cddp__dnnl_run(ctx, p, b ? 4 : 3, args)) return NULL;
    }
    cddp__node *node;
    if (!cddp__record_op(ctx, CDDP_OP_CONV2D, out, b ? 3 : 2, in, &node)) return NULL;
    if (node) {
        node->arg.conv.stride = stride;
        node->arg.conv.padding = padding;
        node->arg.conv.groups = groups;
        node->saved = xc;
    }
    return out;
}

cddp_tensor *cddp_conv2d(cddp_ctx *ctx, cddp_tensor *x, cddp_tensor *w, cddp_tensor *b, int stride,
                         int padding) {
    return cddp_conv2d_groups(ctx, x, w, b, stride, padding, 1);
}

/* A gradient buffer as a run's output: stored when the buffer is fresh, else added. */
static float *grad_out(cddp_ctx *ctx, cddp_tensor *t, cddp__dnnl_io *io) {
    bool assign = false;
    float *g = cddp_grad_buffer_assign(ctx, t, &assign);
    *io = assign ? CDDP__DNNL_OUT : CDDP__DNNL_ADD;
    return g;
}

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
    return stride == 1 && x->shape[1] / groups < 8;
}

static void weights_grad(cddp_ctx *ctx, const cddp_tensor *x, const cddp_tensor *w,
                         const cddp_tensor *out, int pad, int groups, float *gw, bool wadd,
                         float *gb, bool badd) {
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], KH = w->shape[2], KW = w->shape[3], OH = out->shape[2],
            OW = out->shape[3];
    int64_t cpg = C / groups, opg = O / groups, PH = H + 2 * pad, PW = W + 2 * pad;
    int64_t K = cpg * KH * KW, xn = PH * PW + KW, yn = OH * PW;
    double *acc = cddp__ctx_alloc(ctx, (size_t)(O * K + O) * sizeof(double));
    float *xp = cddp__ctx_alloc(ctx, (size_t)(cpg * xn) * sizeof(float));
    float *yp = cddp__ctx_alloc(ctx, (size_t)yn * sizeof(float));
    int64_t *off = cddp__ctx_alloc(ctx, (size_t)K * sizeof(int64_t));
    if (!acc || !xp || !yp || !off) return;
    for (int64_t c = 0; c < cpg; c++) /* where each weight's window starts in the padded planes */
        for (int64_t kh = 0; kh < KH; kh++)
            for (int64_t kw = 0; kw < KW; kw++)
                off[(c * KH + kh) * KW + kw] = c * xn + kh * PW + kw;
    memset(acc, 0, (size_t)(O * K + O) * sizeof(double));
    memset(xp, 0, (size_t)(cpg * xn) * sizeof(float)); /* the borders stay 0 */
    memset(yp, 0, (size_t)yn * sizeof(float));
    const float *xd = cddp_f32(x), *dy = out->grad;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t c = 0; c < cpg; c++)
                for (int64_t h = 0; h < H; h++)
                    memcpy(xp + c * xn + (h + pad) * PW + pad,
                           xd + ((n * C + g * cpg + c) * H + h) * W, (size_t)W * sizeof(float));
            for (int64_t o = g * opg; o < (g + 1) * opg; o++) {
                const float *d = dy + (n * O + o) * OH * OW;
                for (int64_t h = 0; h < OH; h++)
                    memcpy(yp + h * PW, d + h * OW, (size_t)OW * sizeof(float));
                if (gb) acc[O * K + o] += cddp__sum(d, OH * OW);
                cddp__dot_offsets(yp, xp, off, K, yn, acc + o * K);
            }
        }
    if (gw)
        for (int64_t i = 0; i < O * K; i++) gw[i] = (wadd ? gw[i] : 0.0f) + (float)acc[i];
    if (gb)
        for (int64_t o = 0; o < O; o++) gb[o] = (badd ? gb[o] : 0.0f) + (float)acc[O * K + o];
}

void cddp__conv2d_backward(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *out = n->out, *x = n->in[0], *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    int stride = n->arg.conv.stride, pad = n->arg.conv.padding, groups = n->arg.conv.groups;
    if (out->numel == 0) return;
    cddp__dnnl_io io;
    cddp__dnnl_copy dyc = {0}; /* the output's gradient reordered once for both runs */
    if (x->requires_grad) {
        float *gx = grad_out(ctx, x, &io);
        if (!gx) return;
        const cddp__dnnl_prim *p = conv_prim(x, W, out, b, stride, pad, groups, BWD_DATA);
        cddp__dnnl_arg args[3] = {nchw(DNNL_ARG_DIFF_DST, out->grad, CDDP__DNNL_IN, out),
                                  weights(DNNL_ARG_WEIGHTS, W->data, CDDP__DNNL_IN, W, groups),
                                  nchw(DNNL_ARG_DIFF_SRC, gx, io, x)};
        args[0].copy = &dyc;
        if (!cddp__dnnl_run(ctx, p, 3, args)) return;
    }
    bool want_b = b && b->requires_grad;
    if (!W->requires_grad && !want_b) return;
    if (own_weights_grad(x, stride, groups)) {
        bool wnew = false, bnew = false;
        float *gw = W->requires_grad ? cddp_grad_buffer_assign(ctx, W, &wnew) : NULL;
        float *gb = want_b ? cddp_grad_buffer_assign(ctx, b, &bnew) : NULL;
        if ((W->requires_grad && !gw) || (want_b && !gb)) return;
        weights_grad(ctx, x, W, out, pad, groups, gw, !wnew, gb, !bnew);
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
    const cddp__dnnl_prim *p = conv_prim(x, W, out, b, stride, pad, groups, BWD_WEIGHTS);
    cddp__dnnl_arg args[4] = {nchw(DNNL_ARG_SRC, x->data, CDDP__DNNL_IN, x),
                              nchw(DNNL_ARG_DIFF_DST, out->grad, CDDP__DNNL_IN, out),
                              weights(DNNL_ARG_DIFF_WEIGHTS, gw, wio, W, groups)};
    args[0].copy = n->saved;
    args[1].copy = &dyc;
    if (b) args[3] = vec_arg(DNNL_ARG_DIFF_BIAS, gb, bio, b);
    cddp__dnnl_run(ctx, p, b ? 4 : 3, args);
}
