/* resnet.c: residual networks as torchvision writes them, for small images.
 *
 *   BasicBlock (in -> out, stride)      y = relu(bn1(conv1(x)))      conv1 3x3, stride, no bias
 *                                       y = bn2(conv2(y))            conv2 3x3, no bias
 *                                       relu(y + shortcut(x))        shortcut: x, or downsample
 *                                                                    (conv 1x1, stride, no bias;
 *                                                                    BatchNorm) when the shape
 *                                                                    changes
 *   ResNet                              conv1 3x3 (in -> widths[0]), bn1, relu (a stem for small
 *                                       images: no 7x7 convolution, no max pooling)
 *                                       layer1 .. layerK: Sequentials of `blocks` BasicBlocks,
 *                                       each stage after the first starting with stride 2
 *                                       adaptive average pooling to 1x1, flatten, fc
 *
 * Names are torchvision's (layer2.0.downsample.0.weight, ...). Every convolution and the fc start
 * as PyTorch's defaults, BatchNorms at ones and zeros.
 *
 * The stem's convolution writes its output in oneDNN's channel-blocked layout (tensor.h's
 * "Layouts"), and every convolution, batch normalisation, ReLU and sum after it keeps that layout
 * until the average pooling, whose output is row-major: no reorder between the layers, forward or
 * backward. A BasicBlock given a row-major tensor works row-major. Each BatchNorm followed by a
 * ReLU runs as one op, cddp_batch_norm_relu, and a block's second BatchNorm, the residual sum and
 * the ReLU after it as another, cddp_batch_norm_add_relu. In mixed precision with
 * CDDP_BF16_ACTIVATIONS=1 those activations are bf16 too, from the stem's input to the pooling
 * (cddp_to_dtype; PyTorch's autocast keeps a ResNet's so): half their memory, each convolution
 * writing bf16 and reading it without a reorder. Off by default until it is measured faster on a
 * processor with bf16 units (docs/GUIDE.md's bf16 section).
 */
#include "nn/internal.h"

#include <stdio.h>

static cddp_tensor *run(const cddp_module *m, int i, cddp_ctx *ctx, cddp_tensor *x) {
    return cddp_module_forward(cddp_module_child(m, i), ctx, x);
}

/* relu(bn(x) + r) (r not NULL) or relu(bn(x)), bn the child i, as one op */
static cddp_tensor *bn_relu(const cddp_module *m, int i, cddp_ctx *ctx, cddp_tensor *x,
                            cddp_tensor *r) {
    return cddp__nn_batch_norm_relu(cddp_module_child(m, i), ctx, x, r);
}

static cddp_tensor *block_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    cddp_tensor *y = bn_relu(self, 1, ctx, run(self, 0, ctx, x), NULL);
    cddp_tensor *shortcut = cddp_module_num_children(self) > 4 ? run(self, 4, ctx, x) : x;
    return bn_relu(self, 3, ctx, run(self, 2, ctx, y), shortcut);
}

static const cddp_module_type block_type = {"BasicBlock", NULL, block_forward, NULL};

static cddp_module *conv(int64_t in, int64_t out, int kernel, int stride) {
    return cddp_nn_conv2d_groups(in, out, kernel, stride, kernel / 2, 1, false);
}

cddp_module *cddp_nn_basic_block(int64_t in, int64_t out, int stride) {
    cddp_module *b = cddp_module_create(&block_type, NULL);
    bool ok =
        cddp__module_add_all(b, (const char *[]){"conv1", "bn1", "conv2", "bn2"},
                             (cddp_module *[]){conv(in, out, 3, stride), cddp_nn_batch_norm(out),
                                               conv(out, out, 3, 1), cddp_nn_batch_norm(out)},
                             4);
    if (ok && (stride != 1 || in != out)) {
        cddp_module *down = cddp_nn_sequential();
        if (cddp__module_add_all(
                down, (const char *[]){NULL, NULL},
                (cddp_module *[]){conv(in, out, 1, stride), cddp_nn_batch_norm(out)}, 2)) {
            ok = cddp_module_add(b, "downsample", down) == CDDP_OK; /* frees it on failure */
        } else {
            cddp__module_free(down);
            ok = false;
        }
    }
    if (!ok) {
        cddp__module_free(b);
        return NULL;
    }
    return b;
}

static cddp_tensor *resnet_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    int n = cddp_module_num_children(self);
    if (cddp_ctx_compute(ctx) == CDDP_BF16 && cddp_knob_int(CDDP_KNOB_BF16_ACTIVATIONS))
        x = cddp_to_dtype(ctx, x, CDDP_BF16); /* the stem's convolution rounds it anyway */
    x = bn_relu(self, 1, ctx, run(self, 0, ctx, x), NULL);
    for (int i = 2; i < n - 1; i++) x = run(self, i, ctx, x);
    x = cddp_flatten(ctx, cddp_adaptive_avg_pool2d(ctx, cddp_to_dtype(ctx, x, CDDP_F32), 1, 1));
    return run(self, n - 1, ctx, x);
}

static const cddp_module_type resnet_type = {"ResNet", NULL, resnet_forward, NULL};

cddp_module *cddp_nn_resnet(const cddp_resnet_config *c) {
    int stages = 0;
    while (stages < 4 && c->widths[stages] > 0) stages++;
    if (c->in_channels <= 0 || c->classes <= 0 || c->blocks <= 0 || stages == 0) return NULL;
    cddp_module *r = cddp_module_create(&resnet_type, NULL);
    bool ok = cddp__module_add_all(
        r, (const char *[]){"conv1", "bn1"},
        (cddp_module *[]){cddp__nn_conv2d_blocked(c->in_channels, c->widths[0], 3, 1, 1, false),
                          cddp_nn_batch_norm(c->widths[0])},
        2);
    for (int s = 0; ok && s < stages; s++) {
        cddp_module *layer = cddp_nn_sequential();
        int64_t in = s ? c->widths[s - 1] : c->widths[0];
        for (int k = 0; layer && ok && k < c->blocks; k++)
            ok = cddp_module_add(layer, NULL,
                                 cddp_nn_basic_block(k ? c->widths[s] : in, c->widths[s],
                                                     k == 0 && s > 0 ? 2 : 1)) == CDDP_OK;
        char name[16];
        snprintf(name, sizeof name, "layer%d", s + 1);
        if (!layer || !ok) {
            cddp__module_free(layer);
            ok = false;
        } else {
            ok = cddp_module_add(r, name, layer) == CDDP_OK;
        }
    }
    if (ok)
        ok = cddp_module_add(r, "fc", cddp_nn_linear(c->widths[stages - 1], c->classes)) == CDDP_OK;
    if (!ok) {
        cddp__module_free(r);
        return NULL;
    }
    return r;
}
