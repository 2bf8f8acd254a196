/* cddp/nn.h: models: named parameters in one flat block, and modules that nest.
 *
 * A model owns two contiguous float32 blocks of the same layout, one for parameter values and one
 * for their gradients; each named parameter is a tensor viewing its range of both (llm.c style).
 * State that is not trained but belongs to the model (BatchNorm's running statistics) lives in
 * buffers: named tensors in a third flat block, saved in checkpoints with the parameters,
 * broadcast by DistributedDataParallel, never touched by optimizers.
 * So an optimizer updates one array, a checkpoint writes ranges of it, and DistributedDataParallel
 * reduces ranges of the gradient block with no packing copies.
 *
 * Building a model has two phases. First declare: add modules (Linear, Conv2d, Sequential, your
 * own) and/or raw parameters with their initialisers. Then cddp_model_build allocates the blocks
 * and initialises every parameter, in declaration order, from one seed: the same seed gives
 * bit-identical weights in every process. Names follow PyTorch's state_dict: a module added as
 * "fc1" owns "fc1.weight" and "fc1.bias"; modules nest, so a block's convolution is
 * "layer1.0.conv1.weight"; a module added with a NULL name is named after its position in its
 * parent ("0.weight", "2.bias"), as in nn.Sequential.
 */
#ifndef CDDP_NN_H
#define CDDP_NN_H

#include "cddp/autograd.h"
#include "cddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a parameter starts. */
typedef enum cddp_init_kind {
    CDDP_INIT_CONSTANT, /* every element = a (zero-initialised struct: zeros) */
    CDDP_INIT_UNIFORM,  /* U(a, b) */
    CDDP_INIT_NORMAL,   /* N(mean a, std b) */
} cddp_init_kind;

typedef struct cddp_init {
    cddp_init_kind kind;
    float a, b;
} cddp_init;

/* ---- modules -------------------------------------------------------------------------------
 * A module is a forward function over its own parameters and buffers and its children, which are
 * modules too: Sequential, a residual block or a transformer block are modules of modules.
 * A module joins a model by being added to it (cddp_model_add), or to a module that is in one;
 * it then declares its parameters and buffers, named after its place: a Linear added as "fc" to
 * a Sequential added as "layer1" owns "layer1.fc.weight" and "layer1.fc.bias" (PyTorch's
 * state_dict names). A module's own parameters come first, then its children's, in the order
 * they were added; that is their order in the flat blocks. Whatever a module is added to owns it
 * (and frees it, also when the add fails). */

typedef struct cddp_module cddp_module;

/* The built-in modules, PyTorch's defaults: bias on; Linear and Conv2d weights and biases drawn
 * from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5)). A description
 * that is not valid (a size <= 0, a dropout p outside [0, 1]) fails when added, saying why. NULL
 * when out of memory (the add then fails). */
CDDP_API cddp_module *cddp_nn_linear(int64_t in, int64_t out);
CDDP_API cddp_module *cddp_nn_conv2d(int64_t in, int64_t out, int kernel, int stride, int padding);
/* Conv2d with `groups` (dividing in and out; the weight is (out, in / groups, kernel, kernel))
 * and the bias optional (a convolution followed by BatchNorm needs none). */
CDDP_API cddp_module *cddp_nn_conv2d_groups(int64_t in, int64_t out, int kernel, int stride,
                                            int padding, int groups, bool bias);
/* stride 0 means stride = kernel, as in PyTorch. */
CDDP_API cddp_module *cddp_nn_max_pool2d(int kernel, int stride);
CDDP_API cddp_module *cddp_nn_avg_pool2d(int kernel, int stride);
/* Average pooling to an out_h x out_w output whatever the input's size (1, 1: global average
 * pooling); see cddp_adaptive_avg_pool2d. */
CDDP_API cddp_module *cddp_nn_adaptive_avg_pool2d(int out_h, int out_w);
CDDP_API cddp_module *cddp_nn_relu(void);
CDDP_API cddp_module *cddp_nn_gelu(void);
CDDP_API cddp_module *cddp_nn_tanh(void);
CDDP_API cddp_module *cddp_nn_sigmoid(void);
CDDP_API cddp_module *cddp_nn_dropout(float p);
CDDP_API cddp_module *cddp_nn_flatten(void);
/* BatchNorm1d/2d over `features` channels of (N,C) or (N,C,H,W) input, PyTorch's defaults
 * (momentum 0.1, eps 1e-5, affine): parameters "weight" (ones) and "bias" (zeros), buffers
 * "running_mean" (zeros) and "running_var" (ones), updated in training mode and used in
 * evaluation mode (see cddp_batch_norm). */
CDDP_API cddp_module *cddp_nn_batch_norm(int64_t features);
/* Linear whose weight starts from `weight` and bias (with bias) at zero: GPT-2's initialisation
 * (normal, std 0.02). */
CDDP_API cddp_module *cddp_nn_linear_init(int64_t in, int64_t out, bool bias, cddp_init weight);
/* LayerNorm over the last dimension's `features` (PyTorch's defaults: eps 1e-5, "weight" ones and
 * "bias" zeros). */
CDDP_API cddp_module *cddp_nn_layer_norm(int64_t features);
/* Embedding of `rows` vectors of `dim`: its forward takes integer ids (any shape) and returns
 * their rows (see cddp_embedding). "weight" (rows, dim) starts N(0, 1) as PyTorch's, or from
 * `weight`. */
CDDP_API cddp_module *cddp_nn_embedding(int64_t rows, int64_t dim);
CDDP_API cddp_module *cddp_nn_embedding_init(int64_t rows, int64_t dim, cddp_init weight);

/* Its children one after another, each taking the previous one's output. A child added with a
 * NULL name is named after its position ("0", "1", ...), as in nn.Sequential. A Conv2d, a ReLU
 * and a MaxPool2d in a row run as one op (cddp_conv2d_relu_max_pool2d), and a ReLU followed by a
 * MaxPool2d as one (cddp_relu_max_pool2d): the same values and gradients, fewer passes. */
CDDP_API cddp_module *cddp_nn_sequential(void);

/* A GPT as nanoGPT writes it (see src/nn/transformer.c): token and position embeddings, n_layer
 * pre-LN blocks (causal self-attention, a 4x MLP with GELU-tanh), a final LayerNorm and a
 * language-model head tied to the token embedding. Its forward takes idx (B, T) int64 (T at most
 * block_size) and returns logits (B, T, vocab_size). Parameters are named as nanoGPT's
 * ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...) and start as GPT-2's.
 * NULL when a size is not positive, n_embd is not a multiple of n_head, or out of memory. */
typedef struct cddp_gpt_config {
    int64_t vocab_size, block_size, n_layer, n_head, n_embd;
} cddp_gpt_config;
CDDP_API cddp_module *cddp_nn_gpt(const cddp_gpt_config *config);

/* A Llama-family transformer as Hugging Face's LlamaForCausalLM computes it (see src/nn/llama.c):
 * token embeddings, n_layer pre-norm decoder layers (RMSNorm; attention with rotary positions and
 * n_kv_head key/value heads shared by the n_head query heads, no biases; RMSNorm; a SwiGLU MLP of
 * intermediate_size), a final RMSNorm and a head, tied to the embedding or not. Its forward takes
 * idx (B, T) int64 (T at most max_positions) and returns logits (B, T, vocab_size). Parameters are
 * named as Hugging Face's ("model.layers.0.self_attn.q_proj.weight", ..., "lm_head.weight").
 * NULL when a size is not positive, n_embd / n_head is not even, n_head is not a multiple of
 * n_kv_head, or out of memory. Proven on the CPU and the emulated device (CUDA: its kernels
 * await a GPU check). */
typedef struct cddp_llama_config {
    int64_t vocab_size, max_positions, n_layer, n_head, n_embd, intermediate_size;
    int64_t n_kv_head;   /* key/value heads; 0: n_head (no grouping) */
    double rope_theta;   /* the rotary base: 10000 (Llama 2), 500000 (Llama 3) */
    float rms_norm_eps;  /* 1e-5 (Llama 2), 1e-6 (Llama 3) */
    bool tie_embeddings; /* the head is the token embedding ("lm_head.weight" its second name) */
    /* Llama 3's rope_scaling (rope_type "llama3"): rope_factor 0 for none */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max;
} cddp_llama_config;
CDDP_API cddp_module *cddp_nn_llama(const cddp_llama_config *config);
/* The rotary frequencies of config, n_embd / n_head / 2 floats, as transformers makes them. */
CDDP_API int cddp_llama_inv_freq(const cddp_llama_config *config, float *inv_freq);

/* ResNet's basic block (torchvision's BasicBlock, see src/nn/resnet.c): relu(bn2(conv2(relu(
 * bn1(conv1(x))))) + shortcut(x)), 3x3 convolutions without bias, the first with `stride`; the
 * shortcut is x, or "downsample" (a 1x1 convolution with stride and a BatchNorm) when stride is
 * not 1 or in != out. NULL when out of memory. */
CDDP_API cddp_module *cddp_nn_basic_block(int64_t in, int64_t out, int stride);

/* A ResNet for small images (torchvision's names): a 3x3 stem (conv1, bn1, ReLU), one stage
 * ("layer1", ...) of `blocks` basic blocks per width, every stage after the first halving the
 * resolution, global average pooling and a Linear "fc" to `classes`. Its forward takes
 * (N, in_channels, H, W). NULL when a size is not positive, no width is given, or out of
 * memory. */
typedef struct cddp_resnet_config {
    int64_t in_channels, classes;
    int64_t widths[4]; /* each stage's channels; the stages end at the first 0 */
    int blocks;        /* basic blocks per stage */
} cddp_resnet_config;
CDDP_API cddp_module *cddp_nn_resnet(const cddp_resnet_config *config);

/* Writing a module: its type (functions) and its state (the caller's, freed with type->free). */
typedef struct cddp_module_type {
    const char *name; /* "ResidualBlock", for messages */
    /* Declares the module's own parameters and buffers (cddp_module_param, cddp_module_buffer)
     * when it joins a model; NULL when it has none. A failure (with the model's error set)
     * undoes the add. */
    int (*declare)(cddp_module *self);
    /* The forward; NULL on a data error latched in ctx (ops pass NULL through). */
    cddp_tensor *(*forward)(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x);
    /* Frees the state; NULL: nothing to free. */
    void (*free)(void *state);
} cddp_module_type;

/* A new module of this type with this state; NULL when out of memory (state is then freed). */
CDDP_API cddp_module *cddp_module_create(const cddp_module_type *type, void *state);
/* Adds child under name (NULL: its position) to parent, which owns it from then on. If parent is
 * in a model, child joins it now and declares its parameters (and its children theirs). Fails,
 * freeing child, on a duplicate name, a description that is not valid, or a model already
 * built (the model's error says which). */
CDDP_API int cddp_module_add(cddp_module *parent, const char *name, cddp_module *child);
CDDP_API void *cddp_module_state(const cddp_module *m);
CDDP_API int cddp_module_num_children(const cddp_module *m);
CDDP_API cddp_module *cddp_module_child(const cddp_module *m, int i);
/* The module's place: "layer1.0" ("" for a model's root). */
CDDP_API const char *cddp_module_path(const cddp_module *m);
CDDP_API const char *cddp_module_name(const cddp_module *m); /* its name in its parent */

/* In declare: a parameter (or buffer) named <path>.<name>, initialised at build; returns its
 * index among the module's own parameters (buffers), or a negative status (the model's error
 * says why). */
CDDP_API int cddp_module_param(cddp_module *self, const char *name, int ndim, const int64_t *shape,
                               cddp_init init);
CDDP_API int cddp_module_buffer(cddp_module *self, const char *name, int ndim, const int64_t *shape,
                                float init);
/* In declare: name (under the module's path) is a second name of the parameter target (a path
 * under the module too), as PyTorch's tied weights: GPT's "lm_head.weight" is
 * "transformer.wte.weight". It is one parameter (its gradient sums every use, DDP reduces it
 * once); checkpoints hold it under both names, so that PyTorch loads them strictly, and
 * cddp_model_find knows both. A target that is not a parameter fails cddp_model_build. */
CDDP_API int cddp_module_tie(cddp_module *self, const char *name, const char *target);
/* After build: the module's k-th own parameter (buffer). */
CDDP_API cddp_tensor *cddp_module_get_param(const cddp_module *m, int k);
CDDP_API cddp_tensor *cddp_module_get_buffer(const cddp_module *m, int k);
/* Runs m's forward (a module's forward calls its children's this way); through cddp_recompute
 * when the module is set to (below). */
CDDP_API cddp_tensor *cddp_module_forward(cddp_module *m, cddp_ctx *ctx, cddp_tensor *x);
/* Activation checkpointing of m (autograd.h's cddp_recompute): in training, its forward keeps
 * only its input and output, and backward runs it again. For a module whose forward reads its
 * input and parameters only (not a BatchNorm: its running statistics would move twice). */
CDDP_API void cddp_module_set_recompute(cddp_module *m, bool on);
/* The mode of the model the module is in (training by default; cddp_model_set_training). */
CDDP_API bool cddp_module_training(const cddp_module *m);

typedef struct cddp_model cddp_model;

/* A model whose root is an empty Sequential (cddp_model_add appends to it). NULL when out of
 * memory. */
CDDP_API cddp_model *cddp_model_create(void);
/* A model whose root is root (its parameters and its children's are the model's, named from
 * the root: a GPT's "transformer.wte.weight"); NULL when out of memory or when root does not
 * declare (the model is not made; root is freed either way on failure). */
CDDP_API cddp_model *cddp_model_create_with(cddp_module *root, cddp_error *err);
/* The root module. */
CDDP_API cddp_module *cddp_model_root(const cddp_model *m);
/* Activation checkpointing of every transformer block of m (the GPT's Blocks, the Llama's decoder
 * layers; cddp_module_set_recompute): a step then keeps each block's input rather than
 * everything inside it, and computes every block's forward twice. Returns how many blocks (0:
 * the model has none). */
CDDP_API int cddp_model_recompute_blocks(cddp_model *m, bool on);
CDDP_API void cddp_model_destroy(cddp_model *m);
/* The message of the model's last failure. */
CDDP_API const char *cddp_model_error(const cddp_model *m);

/* Declaration phase (before build): adds module to the root (cddp_module_add). name may be NULL
 * (position in the sequence); names must be unique. Fails with CDDP_EINVAL on a bad description
 * or a duplicate name, CDDP_ESTATE after build; module is freed on failure. */
CDDP_API int cddp_model_add(cddp_model *m, const char *name, cddp_module *module);
/* A parameter for a custom forward; *index (if not NULL) receives its index. */
CDDP_API int cddp_model_add_param(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                                  cddp_init init, int *index);

/* A buffer (state that is not trained) for a custom forward, every element = init;
 * *index (if not NULL) receives its index. Names are unique across parameters and buffers. */
CDDP_API int cddp_model_add_buffer(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                                   float init, int *index);

/* Allocates the flat blocks, initialises the parameters from seed and zeroes the gradients. */
CDDP_API int cddp_model_build(cddp_model *m, uint64_t seed);

CDDP_API int cddp_model_num_params(const cddp_model *m);
/* The i-th parameter, in declaration order (0 <= i < num_params). */
CDDP_API cddp_tensor *cddp_model_param(const cddp_model *m, int i);
/* The parameter with this name (or a tied second name, see cddp_module_tie), or NULL. */
CDDP_API cddp_tensor *cddp_model_find(const cddp_model *m, const char *name);
/* The tied second names (cddp_module_tie): tie i's name in *name, and its parameter. */
CDDP_API int cddp_model_num_ties(const cddp_model *m);
CDDP_API cddp_tensor *cddp_model_tie(const cddp_model *m, int i, const char **name);
/* Total parameter elements, and the flat value and gradient blocks (numel floats each), in the
 * memory of the model's device (cddp_model_device). */
CDDP_API size_t cddp_model_numel(const cddp_model *m);
CDDP_API float *cddp_model_data(const cddp_model *m);
CDDP_API float *cddp_model_grad(const cddp_model *m);
/* Buffers, in declaration order, and their flat block (buffer_numel floats). */
CDDP_API int cddp_model_num_buffers(const cddp_model *m);
CDDP_API cddp_tensor *cddp_model_buffer(const cddp_model *m, int i);
CDDP_API cddp_tensor *cddp_model_find_buffer(const cddp_model *m, const char *name);
CDDP_API size_t cddp_model_buffer_numel(const cddp_model *m);
CDDP_API float *cddp_model_buffer_data(const cddp_model *m);
/* Offset, in elements, of parameter i in the flat blocks. */
CDDP_API size_t cddp_model_param_offset(const cddp_model *m, int i);
/* The device the model's blocks are on: the CPU until cddp_model_to moves them. */
CDDP_API cddp_device *cddp_model_device(const cddp_model *m);
/* Moves the model's parameters, gradients and buffers to dev (a built model; its tensors then
 * live there, and ops on them run there): PyTorch's model.to(device). Call it before making the
 * optimizer or wrapping the model with DistributedDataParallel, which take the model's device as
 * they find it. CDDP_OK; on failure (out of the device's memory, a gradient block lent to DDP)
 * err says why and the model is where it was. */
CDDP_API int cddp_model_to(cddp_model *m, cddp_device *dev, cddp_error *err);
/* Moves the gradient block into block (numel floats, 64-byte aligned, owned by the caller, who
 * keeps it alive until the model is destroyed or the block is moved again; memory of the model's
 * device), copying the current gradients; block NULL moves them back into memory of the model's
 * own. Every parameter's grad
 * follows. DistributedDataParallel uses it to place the gradients where the transport reads
 * them in place. CDDP_ENOMEM (nothing changed) when the model cannot allocate. */
CDDP_API int cddp_model_set_grad_block(cddp_model *m, float *block);
/* Sets every gradient to zero (gradients accumulate across backward calls until then). */
CDDP_API void cddp_model_zero_grad(cddp_model *m);
/* Training mode (the default) enables dropout and BatchNorm's batch statistics; evaluation mode
 * disables dropout and normalises with the running statistics. */
CDDP_API void cddp_model_set_training(cddp_model *m, bool training);
/* Every BatchNorm of m takes its batch statistics over the batches of all of group's ranks in
 * training (cddp_sync_batch_norm; PyTorch's SyncBatchNorm.convert_sync_batchnorm), group NULL:
 * each rank's own again. Returns how many BatchNorms there are. The group is the caller's, used
 * in every training forward and backward from then on: keep it until the model is done, and call
 * the model's forward and backward on every rank alike (DistributedDataParallel's group does). */
CDDP_API int cddp_model_sync_batch_norm(cddp_model *m, cddp_comm *group);
CDDP_API bool cddp_model_training(const cddp_model *m);
/* Sets the gradient-ready hook of every parameter (see autograd.h). */
CDDP_API void cddp_model_set_ready_hook(cddp_model *m, cddp_ready_hook hook, void *user);

/* Step events, for observers such as DistributedDataParallel (its timeline, and the buffer
 * broadcast before each forward): the start of cddp_model_forward, the start and end of an
 * optimizer step on this model, and the start of cddp_model_zero_grad. A custom forward notifies
 * CDDP_EVENT_FORWARD itself first. */
typedef enum cddp_model_event {
    CDDP_EVENT_FORWARD,
    CDDP_EVENT_OPTIM_BEGIN,
    CDDP_EVENT_OPTIM_END,
    CDDP_EVENT_ZERO_GRAD,
} cddp_model_event;
typedef void (*cddp_model_event_hook)(void *user, cddp_model *m, cddp_model_event event);
/* One observer per model; NULL clears it. */
CDDP_API void cddp_model_set_event_hook(cddp_model *m, cddp_model_event_hook hook, void *user);
/* Calls the observer, if any (optimizers call it around their step). */
CDDP_API void cddp_model_notify(cddp_model *m, cddp_model_event event);

/* A sharded optimizer (ZeRO-1; DistributedDataParallel's shard_optimizer sets it): this process
 * holds the reduced gradients of, and its optimizer updates, only these ranges of the flat blocks
 * (nranges [begin, end) pairs of element offsets, ascending and disjoint; an empty range is
 * allowed); the other ranks that share the model hold the rest. sum (with user) adds a double
 * over those ranks, for norms of the whole gradient (cddp_clip_grad_norm). nranges 0: the whole
 * block, on its own (the default). Optimizers take the new shard at their next step.
 * CDDP_EINVAL for ranges out of order or out of the block, CDDP_ENOMEM (nothing changed). */
typedef int (*cddp_model_sum_fn)(void *user, double *value, cddp_error *err);
CDDP_API int cddp_model_set_shard(cddp_model *m, int nranges, const int64_t *ranges,
                                  cddp_model_sum_fn sum, void *user, cddp_error *err);
/* The shard's ranges (0 and NULL: the whole block; valid until the next set_shard) and a version
 * that every set_shard changes. */
CDDP_API int cddp_model_shard(const cddp_model *m, const int64_t **ranges, uint64_t *version);
/* Sharded gradients (ZeRO-2; DistributedDataParallel's shard_gradients sets it): with a shard set,
 * this process keeps the gradients of its shard only; the rest of the gradient block holds
 * nothing between backwards, and cddp_model_zero_grad releases its memory (on the CPU, the pages
 * go back to the system) instead of writing zeros there; it reads as zero. */
CDDP_API void cddp_model_shard_gradients(cddp_model *m, bool on);
/* Adds *value over the ranks that share the model (nothing to add without a shard's sum). */
CDDP_API int cddp_model_shard_sum(cddp_model *m, double *value, cddp_error *err);

/* Runs the root module on x (notifying CDDP_EVENT_FORWARD first). Shape mismatches abort
 * (programmer error); data errors latch in ctx. The model must be built and have modules. */
CDDP_API cddp_tensor *cddp_model_forward(cddp_model *m, cddp_ctx *ctx, cddp_tensor *x);

/* The shape of the first GPT (cddp_nn_gpt) in m into *config: CDDP_OK, or CDDP_EINVAL when m
 * holds none. */
CDDP_API int cddp_model_gpt_config(const cddp_model *m, cddp_gpt_config *config);
/* Generating text with a GPT (the first cddp_nn_gpt module in m; else the first cddp_nn_llama,
 * whose cache holds the positions the generation reaches, its key/value heads repeated for the
 * query heads that share them): n new tokens after the
 * prompt's n_prompt (at least one), each drawn from the softmax of the last position's logits
 * divided by the temperature, among the top_k likeliest, into out[0..n). Each block keeps the keys
 * and values of the positions it has seen (a key/value cache), so a new token costs one position,
 * not the whole prefix. The context is the last block_size tokens, as nanoGPT's generate crops it:
 * once the text is longer, every position moves and each token costs the whole window again. Runs
 * on the model's device in ctx (NULL: a context of its own), which it resets at every token and
 * leaves with gradients as they were; the model is in evaluation mode while it runs. Draws from
 * rng (NULL: a generator seeded with 0). CDDP_EINVAL for a prompt token outside the vocabulary, a
 * model without a GPT or a bad option; a failure of an op is returned with its message. */
typedef struct cddp_gpt_sampling {
    float temperature; /* > 0; 0 takes the likeliest token every time (greedy) */
    int64_t top_k;     /* draw among the top_k likeliest tokens; 0: among all */
    bool no_cache;     /* recompute the whole context for every token (for checking the cache) */
    /* With stop, generation ends once stop_token is drawn (an end-of-text token): it is the last
     * token written to out and given to on_token, and the entries of out after it are -1. */
    bool stop;
    int64_t stop_token;
    /* Called with each new token as it is drawn (to print as it comes); may be NULL. */
    void (*on_token)(int64_t token, void *user);
    void *user;
} cddp_gpt_sampling;
/* temperature 1, every token: the model's own distribution, with the cache. */
CDDP_API cddp_gpt_sampling cddp_gpt_sampling_defaults(void);
CDDP_API int cddp_gpt_generate(cddp_model *m, cddp_ctx *ctx, const int64_t *prompt,
                               int64_t n_prompt, int64_t n, const cddp_gpt_sampling *sampling,
                               cddp_rng *rng, int64_t *out, cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
