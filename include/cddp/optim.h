/* cddp/optim.h: SGD, AdamW and Lion over a model's flat parameter block, with PyTorch's update
 * rules.
 *
 * An optimizer reads the model's gradient block and updates its parameter block in place. Its
 * state (momentum buffer, AdamW's two moment estimates, Lion's momentum) lives in flat blocks of
 * the same layout, so a checkpoint saves it per parameter by name. The update rules are PyTorch
 * 1.13's (torch.optim.SGD and torch.optim.AdamW, single-tensor path), element for element, and
 * Lion's from its paper (Chen et al. 2023, as the lion-pytorch package computes it):
 *
 *   SGD:   g = grad + weight_decay * p
 *          buf = g on the first step, else momentum * buf + (1 - dampening) * g
 *          g = g + momentum * buf (nesterov) or buf (momentum != 0)
 *          p = p - lr * g
 *   AdamW: p = p * (1 - lr * weight_decay)
 *          m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *          p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   Lion:  c = beta1 m + (1 - beta1) g
 *          p = p * (1 - lr * weight_decay) - lr * sign(c)      (sign(0) = 0)
 *          m = beta2 m + (1 - beta2) g
 * Lion's step has the same size on every element, so its learning rate is usually 3-10x smaller
 * than AdamW's and its weight decay 3-10x larger, for the same decay lr * weight_decay.
 */
#ifndef CDDP_OPTIM_H
#define CDDP_OPTIM_H

#include "cddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cddp_sgd_options {
    float lr;
    float momentum;     /* 0: plain SGD */
    float dampening;    /* 0 */
    float weight_decay; /* 0 */
    bool nesterov;      /* needs momentum > 0 and dampening == 0 */
} cddp_sgd_options;

typedef struct cddp_adamw_options {
    float lr;           /* PyTorch default 1e-3 */
    float beta1, beta2; /* 0.9, 0.999 */
    float eps;          /* 1e-8 */
    float weight_decay; /* 1e-2 */
    /* GPT-2's parameter groups: weight decay only on parameters of two or more dimensions
     * (weights, embeddings), none on biases and norms' parameters. */
    bool decay_matrices_only;
} cddp_adamw_options;

/* PyTorch's AdamW defaults with the given learning rate. */
CDDP_API cddp_adamw_options cddp_adamw_defaults(float lr);

typedef struct cddp_lion_options {
    float lr;
    float beta1, beta2;       /* 0.9, 0.99 (the paper's) */
    float weight_decay;       /* 0 */
    bool decay_matrices_only; /* as AdamW's */
} cddp_lion_options;

/* The paper's Lion defaults with the given learning rate. */
CDDP_API cddp_lion_options cddp_lion_defaults(float lr);

typedef struct cddp_optim cddp_optim;

/* The model must be built and outlive the optimizer. NULL on invalid options (err says which)
 * or out of memory. */
CDDP_API cddp_optim *cddp_optim_sgd(cddp_model *m, const cddp_sgd_options *opts, cddp_error *err);
CDDP_API cddp_optim *cddp_optim_adamw(cddp_model *m, const cddp_adamw_options *opts,
                                      cddp_error *err);
CDDP_API cddp_optim *cddp_optim_lion(cddp_model *m, const cddp_lion_options *opts, cddp_error *err);
CDDP_API void cddp_optim_destroy(cddp_optim *opt);

/* Parameter groups: parameter param_index's own weight decay from now on.
 * CDDP_EINVAL for an index out of range or a negative decay. */
CDDP_API int cddp_optim_set_param_weight_decay(cddp_optim *opt, int param_index, float weight_decay,
                                               cddp_error *err);

/* One update from the current gradients. Does not zero them. */
CDDP_API void cddp_optim_step(cddp_optim *opt);
CDDP_API void cddp_optim_set_lr(cddp_optim *opt, float lr);
CDDP_API float cddp_optim_lr(const cddp_optim *opt);
/* Steps taken so far (AdamW's bias correction uses it; SGD uses it for the first momentum). */
CDDP_API int64_t cddp_optim_steps(const cddp_optim *opt);
CDDP_API void cddp_optim_set_steps(cddp_optim *opt, int64_t steps);
CDDP_API const char *cddp_optim_name(const cddp_optim *opt); /* "sgd", "adamw", "lion" */

/* State blocks, for checkpoints: 0 for plain SGD, 1 for SGD with momentum ("momentum_buffer"),
 * 2 for AdamW ("exp_avg", "exp_avg_sq"), 1 for Lion ("exp_avg"). Each holds cddp_optim_state_numel
 * floats: the whole flat block (cddp_model_numel), or, for a sharded optimizer, the ranges of the
 * model's shard one after another. */
CDDP_API int cddp_optim_num_states(const cddp_optim *opt);
CDDP_API float *cddp_optim_state(const cddp_optim *opt, int i, const char **name);
CDDP_API size_t cddp_optim_state_numel(const cddp_optim *opt);

/* ZeRO-1 (cddp_model_set_shard, which DistributedDataParallel's shard_optimizer sets): the
 * optimizer updates only the model's shard and keeps state for it alone. It takes a new shard at
 * its next step, or now with sync_shard, keeping the state of the elements it held before (the
 * others start at zero). CDDP_ENOMEM leaves it as it was. */
CDDP_API int cddp_optim_sync_shard(cddp_optim *opt, cddp_error *err);
/* True while its state covers the model's shard only (ranks hold the rest). */
CDDP_API bool cddp_optim_sharded(const cddp_optim *opt);

/* ---- clipping and schedules ----------------------------------------------------------- */

/* PyTorch's clip_grad_norm_ over every parameter of m: the global L2 norm of the gradients
 * (accumulated in double), and when it exceeds max_norm every gradient is multiplied by
 * max_norm / (norm + 1e-6). Returns the norm before clipping. Under DistributedDataParallel call
 * it after backward, when the gradients are the same on every rank: every rank clips alike. With
 * a sharded optimizer each rank holds the reduced gradients of its shard only: the squares are
 * summed over the shard and added across the ranks (cddp_model_shard_sum), and each rank clips its
 * shard. NaN (and an error in the log) when the ranks could not add them. */
CDDP_API double cddp_clip_grad_norm(cddp_model *m, double max_norm);

/* nanoGPT's learning rate at step it: linear warmup over warmup steps to max_lr
 * (max_lr (it + 1) / (warmup + 1)), then cosine decay to min_lr at decay_steps, min_lr after. */
CDDP_API float cddp_lr_warmup_cosine(int64_t it, float max_lr, float min_lr, int64_t warmup,
                                     int64_t decay_steps);

#ifdef __cplusplus
}
#endif
#endif
