/* cddp/autograd.h: reverse-mode differentiation over the context's tape, and the per-parameter
 * "gradient ready" hooks that DistributedDataParallel uses to overlap communication with backward.
 *
 * Forward ops record nodes on the tape in the order they run, which is a topological order.
 * cddp_backward walks the tape in reverse from the loss, visiting only the nodes the loss depends
 * on. Gradients are added (+=) into tensors' grad buffers: a parameter's grad is a view into its
 * model's flat gradient block and is never zeroed here (cddp_model_zero_grad does that, as
 * optimizer.zero_grad() does in PyTorch); other tensors get zeroed arena buffers. An op's
 * output's gradient is released once that op's backward has run (no later node reads it) and its
 * memory serves the step's next gradients, so a backward holds a few layers' gradients, not all
 * of them; cddp_retain_grad keeps one readable, as PyTorch's retain_grad().
 *
 * Ready hooks. Before walking, backward counts, for every parameter, the recorded uses that the
 * loss depends on. After the backward of a node that uses a parameter, its count drops; when the
 * count reaches zero the parameter's gradient is final and its hook fires. So a hook fires
 * exactly once per backward, after the last contribution (a parameter used twice fires after its
 * second), in the reverse order of last use; a parameter the loss does not depend on never fires.
 */
#ifndef CDDP_AUTOGRAD_H
#define CDDP_AUTOGRAD_H

#include "cddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Back-propagates from loss, a float32 tensor with one element, seeding d(loss) = 1. Blocking,
 * runs hooks on the calling thread. Fails (CDDP_ESTATE) if loss does not require a gradient or
 * backward already ran on this step's tape; propagates the context's latched error. */
CDDP_API int cddp_backward(cddp_ctx *ctx, cddp_tensor *loss);

/* A callback that runs once when the current backward has walked the whole tape (after every
 * ready hook). Returning non-zero fails the backward: cddp_backward returns that status and the
 * context holds err's message. */
typedef int (*cddp_backward_callback)(void *user, cddp_ctx *ctx, cddp_error *err);

/* Queues fn to run at the end of the backward now running on this thread, as PyTorch's
 * Engine.queue_callback: meant for ready hooks (DistributedDataParallel queues the wait for its
 * gradient buckets from the first hook of each backward). At most 8 per backward. CDDP_ESTATE
 * outside a backward, CDDP_ENOMEM when full. */
CDDP_API int cddp_backward_queue_callback(cddp_backward_callback fn, void *user);

/* When the last cddp_backward on ctx began (cddp_now_s seconds; 0 before the first), for step
 * timings such as DistributedDataParallel's. */
CDDP_API double cddp_backward_start_time(const cddp_ctx *ctx);

/* Activation checkpointing (PyTorch's torch.utils.checkpoint): out = fn(user, ctx', x), where fn
 * is a segment of the forward (a transformer block) whose intermediate results ctx does not keep:
 * it runs on ctx's scratch context (cddp_ctx_scratch), ctx keeps x and out, and backward runs fn
 * again there before going through it. A step's activations then cost the segments' inputs and
 * one segment's work at a time, for a second forward of each segment in backward. fn must compute
 * on the context it is given, from x and parameters (whose gradients come as without it, bit for
 * bit on a device whose kernels are deterministic), and draw random numbers from that context's
 * generator (cddp_ctx_rng: the recompute draws the same); what it changes besides its result
 * changes twice (a BatchNorm's running statistics: do not checkpoint one). With gradients
 * disabled fn runs on the scratch alone, its output copied into ctx: an evaluation keeps no more
 * than training does. NULL (latched in ctx) on failure. */
typedef cddp_tensor *(*cddp_segment_fn)(void *user, cddp_ctx *ctx, cddp_tensor *x);
CDDP_API cddp_tensor *cddp_recompute(cddp_ctx *ctx, cddp_segment_fn fn, void *user, cddp_tensor *x);

/* Sets t's ready hook (NULL clears it). t is normally a parameter. */
CDDP_API void cddp_tensor_set_ready_hook(cddp_tensor *t, cddp_ready_hook hook, void *user);

#ifdef __cplusplus
}
#endif
#endif
