/* function.c: a node whose backward is its recorder's (cddp_record_function): one input, the
 * parameters the function read (each one use, so that their ready hooks wait for this node), and a
 * callback that adds into the input's gradient from the output's. Activation checkpointing
 * (autograd/recompute.c) records its segments so. */
#include "tensor/internal.h"

#include <string.h>

cddp_tensor *cddp_record_function(cddp_ctx *ctx, cddp_tensor *out, cddp_tensor *x,
                                  cddp_tensor *const *params, int nparams,
                                  cddp_function_backward backward, void *user) {
    if (!out || CDDP__FAILED(ctx)) return out;
    CDDP_CHECK(nparams >= 0 && (nparams == 0 || params) && backward,
               "cddp_record_function: %d parameters, backward %s", nparams,
               backward ? "given" : "missing");
    bool any = x && x->requires_grad;
    for (int i = 0; i < nparams && !any; i++) any = params[i]->requires_grad;
    if (!ctx->grad_enabled || !any) return out;
    cddp_tensor **copy = NULL;
    if (nparams > 0) {
        if (!(copy = cddp__ctx_alloc(ctx, sizeof *copy * (size_t)nparams))) return NULL;
        memcpy(copy, params, sizeof *copy * (size_t)nparams);
    }
    cddp__node *n = cddp__record_node(ctx, CDDP_OP_FUNCTION, out, 1, &x);
    if (!n) return NULL;
    n->arg.fn.backward = backward;
    n->arg.fn.user = user;
    n->arg.fn.params = copy;
    n->arg.fn.nparams = nparams;
    return out;
}

void cddp__function_backward(cddp_ctx *ctx, cddp__node *n) {
    n->arg.fn.backward(n->arg.fn.user, ctx, n->in[0], n->out);
}
