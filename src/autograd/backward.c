/* backward.c: reverse-mode differentiation over the context's tape, and gradient-ready hooks.
 *
 * The walk has three passes over the tape, newest node first:
 *  1. mark the nodes the loss depends on (a node is needed when its output feeds a needed node);
 *  2. count, for every parameter, its uses by needed nodes (pending);
 *  3. run each needed node's backward (cddp_node_backward: the op's own, in its family's file),
 *     which adds into its inputs' grads; after a node, every parameter it used loses one pending
 *     use, and a parameter reaching zero fires its hook.
 * A backward that runs inside a node's (activation checkpointing's, recompute.c, on its scratch
 * context) is nested: it fires no hook, the outer one does when it passes that node.
 * Because the tape is in execution order, the reverse walk sees a node only after every node that
 * consumed its output, so a gradient is complete when its node runs.
 *
 * What a backward keeps (the needed nodes, the pending uses, the queued callbacks, when it began)
 * is autograd's own: a record in the step's arena, kept in the context's step state, so that it
 * goes with the step's tape at cddp_ctx_reset. Pending uses are counted in a small hash table
 * keyed by the parameter tensor, since parameters from several models may meet in one graph.
 */
#include "autograd/internal.h"

#include <string.h>

typedef struct callback {
    cddp_backward_callback fn;
    void *user;
} callback;

typedef struct use {
    const cddp_tensor *param;
    int pending;
} use;

/* A step's backward. */
typedef struct backward {
    double t0;
    bool nested; /* inside another's node (a checkpointed segment's): its hooks are the outer's */
    int ncallbacks;
    callback callbacks[8];
    bool *needed; /* by node index */
    use *uses;    /* open addressing, nuses slots (a power of two), param NULL when free */
    size_t nuses;
} backward;

/* The backward running on this thread, for cddp_backward_queue_callback. */
static _Thread_local backward *current;

static backward *state_of(const cddp_ctx *ctx) {
    return *cddp_ctx_step_state((cddp_ctx *)ctx);
}

double cddp_backward_start_time(const cddp_ctx *ctx) {
    const backward *b = state_of(ctx);
    return b ? b->t0 : 0;
}

int cddp_backward_queue_callback(cddp_backward_callback fn, void *user) {
    if (!current) return CDDP_ESTATE;
    if (current->ncallbacks == (int)CDDP_ARRAY_LEN(current->callbacks)) return CDDP_ENOMEM;
    current->callbacks[current->ncallbacks++] = (callback){fn, user};
    return CDDP_OK;
}

/* Runs the queued callbacks, all of them even after a failure (each may own waits that must
 * end); the first failure is the backward's. */
static int run_callbacks(cddp_ctx *ctx, backward *b) {
    int rc = CDDP_OK;
    for (int i = 0; i < b->ncallbacks; i++) {
        cddp_error e = {0};
        int st = b->callbacks[i].fn(b->callbacks[i].user, ctx, &e);
        if (st != CDDP_OK && rc == CDDP_OK) rc = cddp_ctx_fail(ctx, st, "%s", cddp_error_msg(&e));
    }
    b->ncallbacks = 0;
    return rc;
}

void cddp_tensor_set_ready_hook(cddp_tensor *t, cddp_ready_hook hook, void *user) {
    t->own.ready_hook = hook;
    t->own.ready_user = user;
}

/* ---- pending uses ------------------------------------------------------------------------ */

static bool is_param(const cddp_tensor *t) {
    return t && t->is_param && t->requires_grad;
}

static use *use_of(backward *b, const cddp_tensor *p) {
    size_t h = ((uintptr_t)p >> 6) * 0x9e3779b97f4a7c15ull, mask = b->nuses - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask)
        if (b->uses[i].param == p || !b->uses[i].param) return &b->uses[i];
}

static void *arena_zeroed(cddp_ctx *ctx, size_t bytes) {
    cddp_error e = {0};
    void *p = cddp_arena_alloc(cddp_ctx_arena(ctx), bytes ? bytes : 1, &e);
    if (!p) {
        cddp_ctx_fail(ctx, e.code, "%s", e.msg);
        return NULL;
    }
    return memset(p, 0, bytes);
}

/* The step's record, with room for the tape's nodes and parameter uses. */
static backward *begin(cddp_ctx *ctx) {
    backward *b = arena_zeroed(ctx, sizeof *b);
    if (!b) return NULL;
    size_t uses = 0;
    for (cddp_node *n = cddp_ctx_tape(ctx); n; n = cddp_node_prev(n))
        for (int i = 0; i < cddp_node_num_inputs(n); i++) uses += is_param(cddp_node_input(n, i));
    for (b->nuses = 16; b->nuses < 2 * uses; b->nuses *= 2) {}
    b->needed = arena_zeroed(ctx, sizeof(bool) * (size_t)cddp_ctx_tape_length(ctx));
    b->uses = arena_zeroed(ctx, sizeof(use) * b->nuses);
    if (!b->needed || !b->uses) return NULL;
    b->t0 = cddp_now_s();
    *cddp_ctx_step_state(ctx) = b;
    return b;
}

/* Drops one pending use of each parameter input of n, firing hooks that reach zero. */
static void release_inputs(backward *b, cddp_node *n) {
    for (int i = 0; i < cddp_node_num_inputs(n); i++) {
        cddp_tensor *p = cddp_node_input(n, i);
        if (!is_param(p)) continue;
        if (--use_of(b, p)->pending == 0 && !b->nested && p->own.ready_hook)
            p->own.ready_hook(p->own.ready_user, p);
    }
}

/* The context's first error so far, without waiting for queued work: a kernel's own failure (a
 * label out of range) shows in the step's cddp_ctx_status, as on a GPU. */
static int failed(const cddp_ctx *ctx) {
    return cddp_ctx_failed(ctx) ? cddp_ctx_status(ctx) : CDDP_OK;
}

static int walk(cddp_ctx *ctx, cddp_tensor *out, const float *seed);

int cddp_backward(cddp_ctx *ctx, cddp_tensor *loss) {
    if (failed(ctx) != CDDP_OK) return failed(ctx);
    if (!loss) return cddp_ctx_fail(ctx, CDDP_EINVAL, "backward: the loss is NULL");
    if (loss->numel != 1 || loss->dtype != CDDP_F32)
        return cddp_ctx_fail(ctx, CDDP_EINVAL,
                             "backward: the loss must be one float32 element, it has %lld of %s",
                             (long long)loss->numel, cddp_dtype_name(loss->dtype));
    if (!loss->requires_grad || !loss->node)
        return cddp_ctx_fail(ctx, CDDP_ESTATE,
                             "backward: the loss does not depend on any parameter; was it "
                             "computed with gradients disabled?");
    return walk(ctx, loss, NULL);
}

int cddp__backward_from(cddp_ctx *ctx, cddp_tensor *out, const float *seed) {
    if (failed(ctx) != CDDP_OK) return failed(ctx);
    if (!out->requires_grad || !out->node)
        return cddp_ctx_fail(ctx, CDDP_ESTATE,
                             "backward: a checkpointed segment's output does not depend on its "
                             "input or any parameter");
    return walk(ctx, out, seed);
}

/* The backward from out, its gradient seeded with 1 (seed NULL: out is the loss) or with seed
 * (out's numel floats on its device). */
static int walk(cddp_ctx *ctx, cddp_tensor *out, const float *seed) {
    if (state_of(ctx))
        return cddp_ctx_fail(ctx, CDDP_ESTATE,
                             "backward already ran on this step's tape; call cddp_ctx_reset "
                             "before the next forward");
    backward *b = begin(ctx);
    if (!b) return failed(ctx);

    /* Pass 1 and 2: mark needed nodes and count parameter uses. */
    b->needed[cddp_node_index(out->node)] = true;
    for (cddp_node *n = cddp_ctx_tape(ctx); n; n = cddp_node_prev(n)) {
        if (!b->needed[cddp_node_index(n)]) continue;
        for (int i = 0; i < cddp_node_num_inputs(n); i++) {
            cddp_tensor *t = cddp_node_input(n, i);
            if (!t) continue;
            if (t->node) b->needed[cddp_node_index(t->node)] = true;
            if (is_param(t)) {
                use *u = use_of(b, t);
                u->param = t;
                u->pending++;
            }
        }
    }

    /* Pass 3: seed d(loss) = 1 and run the needed nodes in reverse. A backward inside another's
     * node (a checkpointed segment run again) fires no hook and queues no callback: the outer
     * backward counts the segment's parameters as its node's and fires them after it. */
    if (!seed && cddp_grad_add(ctx, out, 1.0f) != CDDP_OK) return failed(ctx);
    float *g = seed ? cddp_grad_buffer(ctx, out) : NULL;
    if (seed && (!g || cddp_device_copy(out->device, g, seed, (size_t)out->numel * sizeof(float),
                                        NULL) != CDDP_OK))
        return failed(ctx) != CDDP_OK ? failed(ctx)
                                      : cddp_ctx_fail(ctx, CDDP_EIO, "backward: cannot seed it");
    backward *outer = current;
    b->nested = outer != NULL;
    if (!b->nested) current = b;
    for (cddp_node *n = cddp_ctx_tape(ctx); n; n = cddp_node_prev(n)) {
        if (!b->needed[cddp_node_index(n)]) continue;
        if (cddp_node_output(n)->grad || cddp_node_output(n)->own.grad_half)
            cddp_node_backward(ctx, n);
        if (failed(ctx) != CDDP_OK) break;
        release_inputs(b, n);
    }
    if (b->nested) return failed(ctx);
    current = NULL;
    int rc = run_callbacks(ctx, b);
    return failed(ctx) != CDDP_OK ? failed(ctx) : rc;
}
