/* tape.c: what an op records for backward, and the nodes' accessors (cddp/tensor.h's tape).
 *
 * An op records a node when gradients are enabled and one of its inputs requires a gradient;
 * its output then requires one too. Nodes go on the context's tape, newest first, numbered in
 * recording order, in the arena: a reset drops them all at once.
 */
#include "tensor/internal.h"

#include <string.h>

static bool any_requires_grad(int n, cddp_tensor *const *in) {
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad) return true;
    return false;
}

bool cddp__will_record(const cddp_ctx *ctx, int n, cddp_tensor *const *in) {
    return ctx->grad_enabled && any_requires_grad(n, in);
}

cddp__node *cddp__record(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
                         cddp_tensor *const *in) {
    CDDP_CHECK(nin >= 0 && nin <= 4, "an op with %d inputs", nin);
    return cddp__will_record(ctx, nin, in) ? cddp__record_node(ctx, op, out, nin, in) : NULL;
}

cddp__node *cddp__record_node(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin,
                              cddp_tensor *const *in) {
    cddp__node *n = cddp__ctx_alloc(ctx, sizeof *n);
    if (!n) return NULL;
    memset(n, 0, sizeof *n);
    n->op = op;
    n->index = ctx->nnodes++;
    n->nin = nin;
    n->out = out;
    for (int i = 0; i < nin; i++) n->in[i] = in[i];
    n->prev = ctx->tape;
    ctx->tape = n;
    out->node = n;
    out->requires_grad = true;
    return n;
}

bool cddp__record_op(cddp_ctx *ctx, cddp__op op, cddp_tensor *out, int nin, cddp_tensor *const *in,
                     cddp__node **node) {
    cddp__node *n = cddp__record(ctx, op, out, nin, in);
    if (node) *node = n;
    return n || ctx->err.code == CDDP_OK;
}

/* ---- gradient memory ----------------------------------------------------------------------- */

/* An op's output's gradient is dead once the op's backward has run (every node that adds to it
 * ran before), so cddp_node_backward releases it here and the next gradient of its size or less
 * takes the smallest released buffer that fits: a transformer's layers have one set of shapes, so
 * a backward holds about one layer's gradients instead of every layer's (the 6-layer GPT's step:
 * 1.65 -> 1.22 GB at its peak). A device runs its kernels in order, so a buffer's new kernels run
 * after those that read it as the old gradient. */
void cddp__release_grad(cddp_ctx *ctx, cddp_tensor *t) {
    if (!t->grad || t->is_param || t->retain_grad || !t->node) return;
    cddp__cdev *d = cddp__ctx_dev(ctx, t->device);
    if (d && d->nspare < CDDP__SPARE_GRADS)
        d->spare[d->nspare++] = (cddp__spare){t->grad, (size_t)t->numel * sizeof(float)};
    t->grad = NULL;
}

/* Gradient memory for t on d: a released buffer that fits, else the arena's; zeroed when zero. */
static float *grad_memory(cddp__cdev *d, int64_t numel, bool zero) {
    size_t bytes = (size_t)numel * sizeof(float);
    int best = -1;
    for (int i = 0; i < d->nspare; i++)
        if (d->spare[i].bytes >= bytes && (best < 0 || d->spare[i].bytes < d->spare[best].bytes))
            best = i;
    if (best < 0) return zero ? cddp__dalloc_zero(d, bytes) : cddp__dalloc(d, bytes);
    float *p = d->spare[best].p;
    d->spare[best] = d->spare[--d->nspare];
    return zero && !cddp__dzero(d, p, bytes) ? NULL : p;
}

float *cddp__grad_scratch(cddp__cdev *d, int64_t numel) {
    return grad_memory(d, numel, false);
}

void cddp__grad_scratch_release(cddp__cdev *d, float *p, int64_t numel) {
    if (p && d->nspare < CDDP__SPARE_GRADS)
        d->spare[d->nspare++] = (cddp__spare){p, (size_t)numel * sizeof(float)};
}

float *cddp_grad_buffer(cddp_ctx *ctx, cddp_tensor *t) {
    if (t->grad) return t->grad;
    cddp__cdev *d = cddp__ctx_dev(ctx, t->device);
    if (d) t->grad = grad_memory(d, t->numel, true);
    return t->grad;
}

float *cddp_grad_buffer_assign(cddp_ctx *ctx, cddp_tensor *t, bool *assign) {
    *assign = t->grad == NULL;
    if (!*assign) return t->grad;
    cddp__cdev *d = cddp__ctx_dev(ctx, t->device);
    if (d) t->grad = grad_memory(d, t->numel, false);
    return t->grad;
}

int cddp_grad_add(cddp_ctx *ctx, cddp_tensor *t, float v) {
    float *g = cddp_grad_buffer(ctx, t);
    cddp__cdev *d = g ? cddp__ctx_dev(ctx, t->device) : NULL;
    float *dv = d ? cddp__dalloc(d, sizeof v) : NULL;
    float *hv = dv ? cddp__staging(d, dv, sizeof v) : NULL;
    if (!hv) return ctx->err.code;
    *hv = v;
    cddp__upload(d, dv, hv, sizeof v);
    CDDP__K(&d->q, add_rows, .dst = g, .src = dv, .rows = t->numel, .cols = 1, .dst_stride = 1,
            .src_stride = 0);
    return ctx->err.code;
}

float *cddp__input_grad_assign(cddp_ctx *ctx, cddp__node *n, bool *assign) {
    cddp_tensor *x = n->in[0];
    *assign = false;
    return x->requires_grad ? cddp_grad_buffer_assign(ctx, x, assign) : NULL;
}

float *cddp__input_grad(cddp_ctx *ctx, cddp__node *n) {
    cddp_tensor *x = n->in[0];
    return x->requires_grad ? cddp_grad_buffer(ctx, x) : NULL;
}

cddp_node *cddp_ctx_tape(const cddp_ctx *ctx) {
    return ctx->tape;
}

int cddp_ctx_tape_length(const cddp_ctx *ctx) {
    return ctx->nnodes;
}

cddp_node *cddp_node_prev(const cddp_node *n) {
    return n->prev;
}

int cddp_node_index(const cddp_node *n) {
    return n->index;
}

cddp_tensor *cddp_node_output(const cddp_node *n) {
    return n->out;
}

/* A function's node (cddp_record_function) has the parameters it read as inputs after x. */
int cddp_node_num_inputs(const cddp_node *n) {
    return n->nin + (n->op == CDDP_OP_FUNCTION ? n->arg.fn.nparams : 0);
}

cddp_tensor *cddp_node_input(const cddp_node *n, int i) {
    CDDP_CHECK(i >= 0 && i < cddp_node_num_inputs(n), "node input %d of %d", i,
               cddp_node_num_inputs(n));
    return i < n->nin ? n->in[i] : n->arg.fn.params[i - n->nin];
}
