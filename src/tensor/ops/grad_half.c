/* grad_half.c: gradients handed over in bf16 (cddp_tensor.grad_half): an op whose backward makes
 * the whole gradient of its input x, where the op that made x multiplies in bf16 and reads that
 * gradient rounded anyway (a convolution's or a linear layer's backward in mixed precision), writes
 * it rounded instead of in float32: a pass over it less, and half its bytes. Batch normalisation's
 * and GELU's backward do (ops/norm.c, ops/transformer.c). */
#include "tensor/internal.h"

bool cddp__takes_grad_half(cddp_ctx *ctx, const cddp__node *made) {
    return made->op == CDDP_OP_CONV2D   ? cddp__conv2d_takes_grad_half(ctx, made)
           : made->op == CDDP_OP_LINEAR ? cddp__linear_takes_grad_half(ctx, made)
                                        : false;
}

uint16_t *cddp__input_grad_half(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0];
    cddp__node *made = x->node;
    if (!x->requires_grad || x->is_param || x->retain_grad || x->ready_hook || x->grad ||
        x->grad_half || !made || made != n->prev || !cddp__takes_grad_half(ctx, made))
        return NULL;
    for (int i = 1; i < n->nin; i++)
        if (n->in[i] == x) return NULL; /* x's gradient has a second part from n */
    cddp__cdev *d = cddp__node_dev(ctx, made);
    return d ? x->grad_half = cddp__dalloc(d, (size_t)x->numel * sizeof(uint16_t)) : NULL;
}
