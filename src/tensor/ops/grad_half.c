/* grad_half.c: gradients handed over in bf16 (cddp_tensor.own.grad_half): an op whose backward
 * makes the whole gradient of its input x, where the op that made x multiplies in bf16 and reads
 * that gradient rounded anyway (a convolution's or a linear layer's backward in mixed precision),
 * writes it rounded instead of in float32: a pass over it less, and half its bytes. Batch
 * normalisation's, GELU's, cross-entropy's and a same-shape add's backward do (ops/norm.c,
 * ops/transformer.c, ops/loss.c, ops/elementwise.c). */
#include "tensor/internal.h"

bool cddp__takes_grad_half(cddp_ctx *ctx, const cddp__node *made) {
    return made->op == CDDP_OP_CONV2D     ? cddp__conv2d_takes_grad_half(ctx, made)
           : cddp__op_is_linear(made->op) ? cddp__linear_takes_grad_half(ctx, made)
                                          : false;
}

bool cddp__gradient_free(const cddp_tensor *x) {
    return x->requires_grad && !x->is_param && !x->retain_grad && !x->own.ready_hook && !x->grad &&
           !x->own.grad_half;
}

/* Whether t is one of n's inputs other than its k-th. */
static bool other_input(const cddp__node *n, int k, const cddp_tensor *t) {
    for (int i = 0; i < n->nin; i++)
        if (i != k && n->in[i] == t) return true;
    return false;
}

uint16_t *cddp__input_grad_half(cddp_ctx *ctx, cddp__node *n, int k, cddp__node **made) {
    cddp_tensor *x = n->in[k];
    /* Through views made just before: a reshape's backward would only pass the gradient on (it
     * is then not run: its output gets no gradient). */
    cddp__node *at = n;
    while (cddp__gradient_free(x) && !other_input(n, k, x) && x->node && x->node == at->prev &&
           x->node->op == CDDP_OP_RESHAPE)
        x = (at = x->node)->in[0];
    if (!cddp__gradient_free(x) ||
        other_input(n, k, x) /* a second part of x's gradient from n */ || !x->node ||
        x->node != at->prev || !cddp__takes_grad_half(ctx, x->node))
        return NULL;
    cddp__cdev *d = cddp__node_dev(ctx, x->node);
    if (made) *made = x->node;
    return d ? x->own.grad_half = cddp__dalloc(d, (size_t)x->numel * sizeof(uint16_t)) : NULL;
}
