/* dispatch.c: the backward of a recorded node, and the ops' names, from the op list. */
#include "tensor/internal.h"

typedef void (*backward_fn)(cddp_ctx *ctx, cddp__node *n);

static const backward_fn backward_of[CDDP_OP_COUNT] = {
#define CDDP__OP_TABLE(NAME, name) [CDDP_OP_##NAME] = cddp__##name##_backward,
    CDDP_OP_LIST(CDDP__OP_TABLE)
#undef CDDP__OP_TABLE
};

static const char *const name_of[CDDP_OP_COUNT] = {
#define CDDP__OP_NAME(NAME, name) [CDDP_OP_##NAME] = #name,
    CDDP_OP_LIST(CDDP__OP_NAME)
#undef CDDP__OP_NAME
};

void cddp_node_backward(cddp_ctx *ctx, cddp_node *n) {
    if (CDDP__FAILED(ctx)) return;
    CDDP_CHECK(n->out->grad || n->out->own.grad_half,
               "the backward of %s needs its output's gradient", name_of[n->op]);
    backward_of[n->op](ctx, n);
    cddp__release_grad(ctx, n->out);
}

const char *cddp_node_op(const cddp_node *n) {
    return name_of[n->op];
}
