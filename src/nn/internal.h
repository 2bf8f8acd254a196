/* nn/internal.h: the model and the module tree, and what nn's files share.
 *
 * nn's files, lowest first (no circle):
 *
 *   blocks.c  the declarations and the flat blocks: parameters and buffers laid out back to
 *             back, built, initialised, found by name; the gradient block
 *   module.c  the module tree: adding children, joining a model (declaring), the forward
 *   layers.c  the built-in modules: Linear, Conv2d, MaxPool2d, the activations, Dropout,
 *             Flatten, BatchNorm, Sequential
 *   model.c   the model object: its root module, build, mode, hooks and step events
 *   resnet.c, transformer.c   the ResNet and the GPT, as modules of modules
 *   generate.c   text from a GPT, a token at a time with a key/value cache
 *
 * Before build a model is a list of parameter and buffer declarations (name, shape,
 * initialiser), which modules make as they join it and keep by index. Build lays them out back to
 * back in declaration order, so parameter i occupies [offset_i, offset_i + numel_i) of both
 * blocks, and creates the tensors as views. The tensor arrays are never reallocated after build,
 * so pointers to parameters stay valid for the model's life.
 */
#ifndef CDDP_NN_INTERNAL_H
#define CDDP_NN_INTERNAL_H

#include "cddp/nn.h"

typedef struct param_decl {
    char *name;
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    int64_t numel;
    size_t offset;
    cddp_init init;
} param_decl;

/* The declarations of one kind: parameters or buffers. */
typedef struct decl_list {
    param_decl *decls;
    int n, cap;
    cddp_tensor *tensors; /* n views, after build */
    float *data;          /* the flat block */
    size_t numel;
} decl_list;

/* A second name of a parameter (a tied weight: GPT's lm_head.weight is transformer.wte.weight). */
typedef struct tie {
    char *name, *target;
    int index; /* the target's parameter index, after build */
} tie;

struct cddp_model {
    cddp_error err;
    decl_list params, bufs;
    tie *ties;
    int nties, cap_ties;
    float *grad;
    cddp_device *device; /* where the blocks are (the CPU until cddp_model_to) */
    bool built, training;
    bool grad_lent; /* grad is the caller's (cddp_model_set_grad_block), not ours to free */
    cddp_module *root;
    cddp_model_event_hook event_hook;
    void *event_user;
    /* the shard (cddp_model_set_shard): [begin, end) pairs; none: the whole block */
    int64_t *shard;
    int nshard;
    uint64_t shard_version;
    cddp_model_sum_fn shard_sum;
    void *shard_user;
    bool grad_shard_only; /* cddp_model_shard_gradients: zero_grad releases the rest */
};

struct cddp_module {
    const cddp_module_type *type;
    void *state;
    char *name; /* in its parent; NULL for a root */
    char *path; /* from the model's root, once in a model: "layer1.0" */
    cddp_module *parent;
    cddp_model *model; /* NULL until it joins one */
    cddp_module **children;
    int nchildren, cap_children;
    int *params, nparams, cap_params;    /* the model's indices of its own parameters */
    int *buffers, nbuffers, cap_buffers; /* ... and buffers */
    bool recompute; /* cddp_module_set_recompute: its forward run again in backward */
};

/* ---- blocks.c ---------------------------------------------------------------------------- */

/* Declares a parameter (or, with buffer, a buffer); *index receives the model's index. Fails
 * (the model's error set) on a bad shape, a duplicate name or a built model. */
int cddp__model_declare(cddp_model *m, bool buffer, const char *name, int ndim,
                        const int64_t *shape, cddp_init init, int *index);
/* Declares name as a second name of the parameter named target (resolved at build). */
int cddp__model_tie(cddp_model *m, const char *name, const char *target);
/* Drops the declarations past the first nparams parameters, nbuffers buffers and nties ties. */
void cddp__model_undeclare(cddp_model *m, int nparams, int nbuffers, int nties);
/* Lays out and allocates both kinds, initialising parameters from seed, and resolves the ties. */
int cddp__model_build_blocks(cddp_model *m, uint64_t seed);
void cddp__model_free_blocks(cddp_model *m);

/* ---- module.c ---------------------------------------------------------------------------- */

/* m joins model as a child of parent (NULL: the root), declaring its parameters and buffers and
 * its children's; on failure everything it declared is undone (the model's error says why). */
int cddp__module_join(cddp_module *m, cddp_model *model);
/* Frees m, its children and their states. Accepts NULL. */
void cddp__module_free(cddp_module *m);
/* Adds the children to m in order (m NULL: none), freeing every one it could not add; false when
 * one was missing (out of memory) or failed (m then holds the ones before it). */
bool cddp__module_add_all(cddp_module *m, const char *const *names, cddp_module *const *children,
                          int n);
/* A Conv2d (groups 1) whose output is in the channel-blocked layout (cddp_conv2d_blocked): the
 * first convolution of a network that keeps its activations blocked (the ResNet's stem). */
cddp_module *cddp__nn_conv2d_blocked(int64_t in, int64_t out, int kernel, int stride, int padding,
                                     bool bias);
/* Every BatchNorm under m (m too) takes its statistics over group's ranks (NULL: its own); how
 * many there are. */
int cddp__nn_sync_batch_norm(cddp_module *m, cddp_comm *group);
/* Runs the BatchNorm module bn and a ReLU after it as one op (cddp_batch_norm_relu), or with a
 * residual (not NULL) added before the ReLU (cddp_batch_norm_add_relu); aborts when bn is not a
 * BatchNorm. */
cddp_tensor *cddp__nn_batch_norm_relu(cddp_module *bn, cddp_ctx *ctx, cddp_tensor *x,
                                      cddp_tensor *residual);

/* ---- llama.c ------------------------------------------------------------------------------ */

/* The first Llama (cddp_nn_llama) in m's tree, depth first, its shape in *config; NULL if none. */
const cddp_module *cddp__llama_find(const cddp_module *m, const cddp_llama_config **config);
/* The Llama's logits (1, T, vocab) for idx (1, T) at positions past..past+T-1, given caches[l]
 * (1, L, 2 n_embd) holding positions 0..past-1 of layer l; adds the new positions to them. */
cddp_tensor *cddp__llama_forward_cached(const cddp_module *lm, cddp_ctx *ctx, cddp_tensor *idx,
                                        int64_t past, cddp_tensor *const *caches);

/* ---- transformer.c ------------------------------------------------------------------------ */

/* The first GPT (cddp_nn_gpt) in m's tree, depth first, and its shape in *config; NULL if none. */
const cddp_module *cddp__gpt_find(const cddp_module *m, const cddp_gpt_config **config);
/* The GPT's logits (1, T, vocab) for idx (1, T) at positions past..past+T-1, given caches[l]
 * (1, L, 2 n_embd) holding positions 0..past-1 of block l; adds the new positions to them. */
cddp_tensor *cddp__gpt_forward_cached(const cddp_module *gpt, cddp_ctx *ctx, cddp_tensor *idx,
                                      int64_t past, cddp_tensor *const *caches);

#endif
