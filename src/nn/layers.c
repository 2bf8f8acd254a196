/* layers.c: the built-in modules: Linear, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, ReLU,
 * GELU, Tanh, Sigmoid, Dropout, Flatten, BatchNorm and Sequential, each a cddp_module_type with its
 * description as state. A description is checked when the module joins a model (its declare), so
 * that the error lands in the model's message with the module's name. */
#include "nn/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* What describes a built-in module. */
typedef struct layer {
    int64_t in, out;             /* Linear: features; Conv2d: channels; BatchNorm: features */
    int kernel, stride, padding; /* Conv2d and the poolings (AdaptiveAvgPool2d: kernel x stride
                                    is its output) */
    int groups;                  /* Conv2d */
    bool blocked;                /* Conv2d: its output in the channel-blocked layout */
    float p;                     /* Dropout probability */
    bool bias;                   /* Linear and Conv2d: has a bias; BatchNorm: affine */
    float momentum, eps;         /* BatchNorm, LayerNorm (eps) */
    bool custom_init;            /* Linear, Embedding: weights from init (biases zeros) */
    cddp_init init;
    cddp_comm *group; /* BatchNorm: the ranks whose batches it takes together (NULL: its own) */
} layer;

static layer *state(const cddp_module *m) {
    return cddp_module_state(m);
}

static cddp_module *make(const cddp_module_type *type, layer l) {
    layer *s = cddp_malloc(sizeof *s);
    if (!s) return NULL;
    *s = l;
    return cddp_module_create(type, s);
}

static int invalid(cddp_module *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int invalid(cddp_module *self, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return cddp_error_set(&self->model->err, CDDP_EINVAL, "module '%s': %s", cddp_module_path(self),
                          what);
}

/* The parameter tensor of k (NULL when the module has fewer). */
static cddp_tensor *param_or_null(const cddp_module *m, int k) {
    return k < m->nparams ? cddp_module_get_param(m, k) : NULL;
}

/* ---- Linear and Conv2d ------------------------------------------------------------------- */

/* PyTorch: kaiming_uniform(a = sqrt(5)) for the weight, which is U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)), and the same bound for the bias. */
static int declare_weighted(cddp_module *self, int ndim, const int64_t *wshape, int64_t fan_in) {
    const layer *l = state(self);
    float bound = 1.0f / sqrtf((float)fan_in);
    cddp_init u = {CDDP_INIT_UNIFORM, -bound, bound}, zeros = {CDDP_INIT_CONSTANT, 0, 0};
    int rc = cddp_module_param(self, "weight", ndim, wshape, l->custom_init ? l->init : u);
    if (rc >= 0 && l->bias)
        rc = cddp_module_param(self, "bias", 1, &wshape[0], l->custom_init ? zeros : u);
    return rc < 0 ? rc : CDDP_OK;
}

static int linear_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->in <= 0 || l->out <= 0)
        return invalid(self, "in=%lld and out=%lld must be positive", (long long)l->in,
                       (long long)l->out);
    return declare_weighted(self, 2, (int64_t[]){l->out, l->in}, l->in);
}

static cddp_tensor *linear_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    return cddp_linear(ctx, x, cddp_module_get_param(self, 0), param_or_null(self, 1));
}

static const cddp_module_type linear_type = {"Linear", linear_declare, linear_forward, cddp_free};

cddp_module *cddp_nn_linear(int64_t in, int64_t out) {
    return make(&linear_type, (layer){.in = in, .out = out, .bias = true});
}

cddp_module *cddp_nn_linear_init(int64_t in, int64_t out, bool bias, cddp_init weight) {
    return make(&linear_type,
                (layer){.in = in, .out = out, .bias = bias, .custom_init = true, .init = weight});
}

static int conv_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->in <= 0 || l->out <= 0)
        return invalid(self, "in=%lld and out=%lld must be positive", (long long)l->in,
                       (long long)l->out);
    if (l->kernel <= 0 || l->stride <= 0 || l->padding < 0)
        return invalid(self, "kernel %d, stride %d, padding %d are not valid", l->kernel, l->stride,
                       l->padding);
    if (l->groups <= 0 || l->in % l->groups || l->out % l->groups)
        return invalid(self, "%d groups do not divide in=%lld and out=%lld", l->groups,
                       (long long)l->in, (long long)l->out);
    int64_t k = l->kernel, per = l->in / l->groups;
    return declare_weighted(self, 4, (int64_t[]){l->out, per, k, k}, per * k * k);
}

static cddp_tensor *conv_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const layer *l = state(self);
    return (l->blocked ? cddp_conv2d_blocked : cddp_conv2d_groups)(
        ctx, x, cddp_module_get_param(self, 0), param_or_null(self, 1), l->stride, l->padding,
        l->groups);
}

static const cddp_module_type conv_type = {"Conv2d", conv_declare, conv_forward, cddp_free};

cddp_module *cddp_nn_conv2d(int64_t in, int64_t out, int kernel, int stride, int padding) {
    return cddp_nn_conv2d_groups(in, out, kernel, stride, padding, 1, true);
}

cddp_module *cddp_nn_conv2d_groups(int64_t in, int64_t out, int kernel, int stride, int padding,
                                   int groups, bool bias) {
    return make(&conv_type, (layer){.in = in,
                                    .out = out,
                                    .kernel = kernel,
                                    .stride = stride,
                                    .padding = padding,
                                    .groups = groups,
                                    .bias = bias});
}

cddp_module *cddp__nn_conv2d_blocked(int64_t in, int64_t out, int kernel, int stride, int padding,
                                     bool bias) {
    cddp_module *m = cddp_nn_conv2d_groups(in, out, kernel, stride, padding, 1, bias);
    if (m) state(m)->blocked = true;
    return m;
}

/* ---- MaxPool2d, AvgPool2d, AdaptiveAvgPool2d ---------------------------------------------- */

static int pool_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->kernel <= 0 || l->stride < 0 || l->padding < 0 || l->padding > l->kernel / 2)
        return invalid(self,
                       "kernel %d, stride %d, padding %d are not valid (padding at most half "
                       "the kernel)",
                       l->kernel, l->stride, l->padding);
    return CDDP_OK;
}

static cddp_tensor *max_pool_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const layer *l = state(self);
    return cddp_max_pool2d(ctx, x, l->kernel, l->stride, l->padding);
}

static const cddp_module_type max_pool_type = {"MaxPool2d", pool_declare, max_pool_forward,
                                               cddp_free};

cddp_module *cddp_nn_max_pool2d(int kernel, int stride) {
    return make(&max_pool_type, (layer){.kernel = kernel, .stride = stride});
}

static cddp_tensor *avg_pool_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const layer *l = state(self);
    return cddp_avg_pool2d(ctx, x, l->kernel, l->stride, l->padding);
}

static const cddp_module_type avg_pool_type = {"AvgPool2d", pool_declare, avg_pool_forward,
                                               cddp_free};

cddp_module *cddp_nn_avg_pool2d(int kernel, int stride) {
    return make(&avg_pool_type, (layer){.kernel = kernel, .stride = stride});
}

static int adaptive_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->kernel <= 0 || l->stride <= 0)
        return invalid(self, "output %dx%d is not valid", l->kernel, l->stride);
    return CDDP_OK;
}

static cddp_tensor *adaptive_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    const layer *l = state(self);
    return cddp_adaptive_avg_pool2d(ctx, x, l->kernel, l->stride);
}

static const cddp_module_type adaptive_type = {"AdaptiveAvgPool2d", adaptive_declare,
                                               adaptive_forward, cddp_free};

cddp_module *cddp_nn_adaptive_avg_pool2d(int out_h, int out_w) {
    return make(&adaptive_type, (layer){.kernel = out_h, .stride = out_w});
}

/* ---- activations, Dropout, Flatten -------------------------------------------------------- */

#define ACTIVATION(fn, Name)                                                                       \
    static cddp_tensor *fn##_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {           \
        (void)self;                                                                                \
        return cddp_##fn(ctx, x);                                                                  \
    }                                                                                              \
    static const cddp_module_type fn##_type = {Name, NULL, fn##_forward, cddp_free};               \
    cddp_module *cddp_nn_##fn(void) {                                                              \
        return make(&fn##_type, (layer){0});                                                       \
    }

ACTIVATION(relu, "ReLU")
ACTIVATION(gelu, "GELU")
ACTIVATION(tanh, "Tanh")
ACTIVATION(sigmoid, "Sigmoid")
ACTIVATION(flatten, "Flatten")

static int dropout_declare(cddp_module *self) {
    float p = state(self)->p;
    if (!(p >= 0.0f && p <= 1.0f)) return invalid(self, "dropout p=%g is not in [0, 1]", (double)p);
    return CDDP_OK;
}

static cddp_tensor *dropout_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    return cddp_dropout(ctx, x, state(self)->p, cddp_module_training(self));
}

static const cddp_module_type dropout_type = {"Dropout", dropout_declare, dropout_forward,
                                              cddp_free};

cddp_module *cddp_nn_dropout(float p) {
    return make(&dropout_type, (layer){.p = p});
}

/* ---- BatchNorm --------------------------------------------------------------------------- */

static int norm_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->in <= 0 || l->out <= 0)
        return invalid(self, "in=%lld and out=%lld must be positive", (long long)l->in,
                       (long long)l->out);
    if (l->in != l->out || !(l->momentum >= 0.0f && l->momentum <= 1.0f) || !(l->eps > 0.0f))
        return invalid(self,
                       "batch norm of %lld features, momentum %g, eps %g (want in == out, "
                       "momentum in [0, 1], eps > 0)",
                       (long long)l->in, (double)l->momentum, (double)l->eps);
    int rc = CDDP_OK;
    if (l->bias) {
        rc = cddp_module_param(self, "weight", 1, &l->out, (cddp_init){CDDP_INIT_CONSTANT, 1, 0});
        if (rc >= 0)
            rc = cddp_module_param(self, "bias", 1, &l->out, (cddp_init){CDDP_INIT_CONSTANT, 0, 0});
    }
    if (rc >= 0) rc = cddp_module_buffer(self, "running_mean", 1, &l->out, 0.0f);
    if (rc >= 0) rc = cddp_module_buffer(self, "running_var", 1, &l->out, 1.0f);
    return rc < 0 ? rc : CDDP_OK;
}

/* The BatchNorm, and with relu a ReLU after it, as one op (cddp_batch_norm_relu); with a residual
 * r, r added before the ReLU (cddp_batch_norm_add_relu). */
static cddp_tensor *norm_run(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x, bool relu,
                             cddp_tensor *r) {
    const layer *l = state(self);
    cddp_tensor *w = param_or_null(self, 0), *b = param_or_null(self, 1);
    cddp_tensor *rm = cddp_module_get_buffer(self, 0), *rv = cddp_module_get_buffer(self, 1);
    bool training = cddp_module_training(self);
    if (l->group)
        return cddp_sync_batch_norm(ctx, x, r, relu || r, w, b, rm, rv, training, l->momentum,
                                    l->eps, l->group);
    if (r) return cddp_batch_norm_add_relu(ctx, x, r, w, b, rm, rv, training, l->momentum, l->eps);
    return (relu ? cddp_batch_norm_relu : cddp_batch_norm)(ctx, x, w, b, rm, rv, training,
                                                           l->momentum, l->eps);
}

static cddp_tensor *norm_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    return norm_run(self, ctx, x, false, NULL);
}

static const cddp_module_type norm_type = {"BatchNorm", norm_declare, norm_forward, cddp_free};

cddp_tensor *cddp__nn_batch_norm_relu(cddp_module *bn, cddp_ctx *ctx, cddp_tensor *x,
                                      cddp_tensor *residual) {
    CDDP_CHECK(bn->type == &norm_type, "module '%s' is a %s, not a BatchNorm", cddp_module_path(bn),
               bn->type->name);
    return norm_run(bn, ctx, x, true, residual);
}

cddp_module *cddp_nn_batch_norm(int64_t features) {
    return make(
        &norm_type,
        (layer){.in = features, .out = features, .bias = true, .momentum = 0.1f, .eps = 1e-5f});
}

int cddp__nn_sync_batch_norm(cddp_module *m, cddp_comm *group) {
    int n = 0;
    if (m->type == &norm_type) state(m)->group = group, n++;
    for (int i = 0; i < cddp_module_num_children(m); i++)
        n += cddp__nn_sync_batch_norm(cddp_module_child(m, i), group);
    return n;
}

/* ---- LayerNorm and Embedding ------------------------------------------------------------- */

static int layer_norm_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->in <= 0 || !(l->eps > 0.0f))
        return invalid(self, "layer norm of %lld features with eps %g (want both > 0)",
                       (long long)l->in, (double)l->eps);
    int rc = cddp_module_param(self, "weight", 1, &l->in, (cddp_init){CDDP_INIT_CONSTANT, 1, 0});
    if (rc >= 0 && l->bias)
        rc = cddp_module_param(self, "bias", 1, &l->in, (cddp_init){CDDP_INIT_CONSTANT, 0, 0});
    return rc < 0 ? rc : CDDP_OK;
}

static cddp_tensor *layer_norm_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    return cddp_layer_norm(ctx, x, cddp_module_get_param(self, 0), param_or_null(self, 1),
                           state(self)->eps);
}

static const cddp_module_type layer_norm_type = {"LayerNorm", layer_norm_declare,
                                                 layer_norm_forward, cddp_free};

cddp_module *cddp_nn_layer_norm(int64_t features) {
    return make(&layer_norm_type, (layer){.in = features, .bias = true, .eps = 1e-5f});
}

static int embedding_declare(cddp_module *self) {
    const layer *l = state(self);
    if (l->in <= 0 || l->out <= 0)
        return invalid(self, "an embedding of %lld rows of %lld (want both > 0)", (long long)l->in,
                       (long long)l->out);
    cddp_init normal = {CDDP_INIT_NORMAL, 0, 1}; /* PyTorch's nn.Embedding */
    int rc = cddp_module_param(self, "weight", 2, (int64_t[]){l->in, l->out},
                               l->custom_init ? l->init : normal);
    return rc < 0 ? rc : CDDP_OK;
}

static cddp_tensor *embedding_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *ids) {
    return cddp_embedding(ctx, ids, cddp_module_get_param(self, 0));
}

static const cddp_module_type embedding_type = {"Embedding", embedding_declare, embedding_forward,
                                                cddp_free};

cddp_module *cddp_nn_embedding(int64_t rows, int64_t dim) {
    return make(&embedding_type, (layer){.in = rows, .out = dim});
}

cddp_module *cddp_nn_embedding_init(int64_t rows, int64_t dim, cddp_init weight) {
    return make(&embedding_type,
                (layer){.in = rows, .out = dim, .custom_init = true, .init = weight});
}

/* ---- Sequential -------------------------------------------------------------------------- */

/* The children in turn; a ReLU followed by a MaxPool2d runs as one op, cddp_relu_max_pool2d (the
 * same values and gradients, without the ReLU's output: one pass over the data instead of three
 * forward and backward), and a Conv2d before them joins it, cddp_conv2d_relu_max_pool2d (whose
 * convolution output stays in oneDNN's layout); a BatchNorm followed by a ReLU runs as
 * cddp_batch_norm_relu. */
static cddp_tensor *sequential_forward(cddp_module *self, cddp_ctx *ctx, cddp_tensor *x) {
    int n = cddp_module_num_children(self);
    for (int i = 0; i < n && x; i++) {
        cddp_module *c = cddp_module_child(self, i);
        cddp_module *next = i + 1 < n ? cddp_module_child(self, i + 1) : NULL;
        cddp_module *third = i + 2 < n ? cddp_module_child(self, i + 2) : NULL;
        if (c->type == &conv_type && next && next->type == &relu_type && third &&
            third->type == &max_pool_type) {
            const layer *cl = state(c), *pl = state(third);
            x = cddp_conv2d_relu_max_pool2d(ctx, x, cddp_module_get_param(c, 0),
                                            param_or_null(c, 1), cl->stride, cl->padding,
                                            cl->groups, pl->kernel, pl->stride, pl->padding);
            i += 2;
        } else if (c->type == &norm_type && next && next->type == &relu_type) {
            x = norm_run(c, ctx, x, true, NULL);
            i++;
        } else if (c->type == &relu_type && next && next->type == &max_pool_type) {
            const layer *l = state(next);
            x = cddp_relu_max_pool2d(ctx, x, l->kernel, l->stride, l->padding);
            i++;
        } else {
            x = cddp_module_forward(c, ctx, x);
        }
    }
    return x;
}

static const cddp_module_type sequential_type = {"Sequential", NULL, sequential_forward, NULL};

cddp_module *cddp_nn_sequential(void) {
    return cddp_module_create(&sequential_type, NULL);
}
