/* model.c: the flat parameter/gradient blocks, named parameters, and the Sequential forward.
 *
 * Before build the model is a list of parameter declarations (name, shape, initialiser) and of
 * modules that refer to their parameters by index. Build lays the parameters out back to back in
 * declaration order, so parameter i occupies [offset_i, offset_i + numel_i) of both blocks, and
 * creates the parameter tensors as views. The tensor array is never reallocated after build, so
 * pointers to parameters stay valid for the model's life.
 */
#include "cddp/nn.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct param_decl {
    char *name;
    int ndim;
    int64_t shape[CDDP_MAX_DIMS];
    int64_t numel;
    size_t offset;
    cddp_init init;
} param_decl;

typedef struct module_entry {
    cddp_module mod;
    int weight, bias;              /* parameter indices, -1 when absent */
    int running_mean, running_var; /* buffer indices (BatchNorm), -1 when absent */
} module_entry;

/* The declarations of one kind: parameters or buffers. */
typedef struct decl_list {
    param_decl *decls;
    int n, cap;
    cddp_tensor *tensors; /* n views, after build */
    float *data;          /* the flat block */
    size_t numel;
} decl_list;

struct cddp_model {
    cddp_error err;
    param_decl *decls;
    int nparams, cap_params;
    decl_list bufs;
    module_entry *mods;
    int nmods, cap_mods;
    cddp_tensor *params; /* nparams views, after build */
    float *data, *grad;
    size_t numel;
    bool built, training;
    bool grad_lent; /* grad is the caller's (cddp_model_set_grad_block), not ours to free */
    cddp_model_event_hook event_hook;
    void *event_user;
};

void cddp_model_set_event_hook(cddp_model *m, cddp_model_event_hook hook, void *user) {
    m->event_hook = hook;
    m->event_user = user;
}

void cddp_model_notify(cddp_model *m, cddp_model_event event) {
    if (m->event_hook) m->event_hook(m->event_user, m, event);
}

cddp_model *cddp_model_create(void) {
    cddp_model *m = cddp_calloc(1, sizeof *m);
    if (m) m->training = true;
    return m;
}

void cddp_model_destroy(cddp_model *m) {
    if (!m) return;
    for (int i = 0; i < m->nparams; i++) cddp_free(m->decls[i].name);
    cddp_free(m->decls);
    for (int i = 0; i < m->bufs.n; i++) cddp_free(m->bufs.decls[i].name);
    cddp_free(m->bufs.decls);
    cddp_free(m->bufs.tensors);
    cddp_aligned_free(m->bufs.data);
    cddp_free(m->mods);
    cddp_free(m->params);
    cddp_aligned_free(m->data);
    if (!m->grad_lent) cddp_aligned_free(m->grad);
    cddp_free(m);
}

const char *cddp_model_error(const cddp_model *m) {
    return cddp_error_msg(&m->err);
}

static bool name_taken(const cddp_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->decls[i].name, name) == 0) return true;
    for (int i = 0; i < m->bufs.n; i++)
        if (strcmp(m->bufs.decls[i].name, name) == 0) return true;
    return false;
}

/* Declares a parameter, or a buffer when buffer is true. */
static int declare_any(cddp_model *m, bool buffer, const char *name, int ndim, const int64_t *shape,
                       cddp_init init, int *index) {
    if (m->built)
        return cddp_error_set(&m->err, CDDP_ESTATE,
                              "cannot add parameter '%s': the model is already built", name);
    if (ndim < 0 || ndim > CDDP_MAX_DIMS)
        return cddp_error_set(&m->err, CDDP_EINVAL, "parameter '%s' has %d dimensions (0..%d)",
                              name, ndim, CDDP_MAX_DIMS);
    if (!name[0] || name_taken(m, name))
        return cddp_error_set(&m->err, CDDP_EINVAL, "parameter name '%s' is %s", name,
                              name[0] ? "already used" : "empty");
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return cddp_error_set(&m->err, CDDP_EINVAL, "parameter '%s': dimension %d is %lld",
                                  name, i, (long long)shape[i]);
        numel *= shape[i];
    }
    param_decl **decls = buffer ? &m->bufs.decls : &m->decls;
    int *count = buffer ? &m->bufs.n : &m->nparams,
        *capacity = buffer ? &m->bufs.cap : &m->cap_params;
    if (*count == *capacity) {
        int cap = *capacity ? 2 * *capacity : 8;
        param_decl *d = cddp_realloc(*decls, (size_t)cap * sizeof *d);
        if (!d) return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory declaring '%s'", name);
        *decls = d;
        *capacity = cap;
    }
    param_decl *d = &(*decls)[*count];
    memset(d, 0, sizeof *d);
    d->name = cddp_strdup(name);
    if (!d->name) return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory declaring '%s'", name);
    d->ndim = ndim;
    memcpy(d->shape, shape, sizeof(int64_t) * (size_t)ndim);
    d->numel = numel;
    d->init = init;
    if (index) *index = *count;
    (*count)++;
    return CDDP_OK;
}

static int declare(cddp_model *m, const char *name, int ndim, const int64_t *shape, cddp_init init,
                   int *index) {
    return declare_any(m, false, name, ndim, shape, init, index);
}

int cddp_model_add_buffer(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                          float init, int *index) {
    if (!name) return cddp_error_set(&m->err, CDDP_EINVAL, "a buffer needs a name");
    return declare_any(m, true, name, ndim, shape, (cddp_init){CDDP_INIT_CONSTANT, init, 0}, index);
}

int cddp_model_add_param(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                         cddp_init init, int *index) {
    if (!name) return cddp_error_set(&m->err, CDDP_EINVAL, "a parameter needs a name");
    return declare(m, name, ndim, shape, init, index);
}

int cddp_model_add(cddp_model *m, const char *name, cddp_module mod) {
    char auto_name[32], pname[256];
    if (!name) {
        snprintf(auto_name, sizeof auto_name, "%d", m->nmods);
        name = auto_name;
    }
    if (m->built)
        return cddp_error_set(&m->err, CDDP_ESTATE,
                              "cannot add module '%s': the model is already built", name);
    bool has_weight = mod.kind == CDDP_MODULE_LINEAR || mod.kind == CDDP_MODULE_CONV2D;
    bool norm = mod.kind == CDDP_MODULE_BATCH_NORM;
    if ((has_weight || norm) && (mod.in <= 0 || mod.out <= 0))
        return cddp_error_set(&m->err, CDDP_EINVAL,
                              "module '%s': in=%lld and out=%lld must be "
                              "positive",
                              name, (long long)mod.in, (long long)mod.out);
    if ((mod.kind == CDDP_MODULE_CONV2D || mod.kind == CDDP_MODULE_MAX_POOL2D) &&
        (mod.kernel <= 0 || mod.stride < 0 || mod.padding < 0 ||
         (mod.kind == CDDP_MODULE_CONV2D && mod.stride == 0)))
        return cddp_error_set(&m->err, CDDP_EINVAL,
                              "module '%s': kernel %d, stride %d, padding %d are not valid", name,
                              mod.kernel, mod.stride, mod.padding);
    if (norm &&
        (mod.in != mod.out || !(mod.momentum >= 0.0f && mod.momentum <= 1.0f) || !(mod.eps > 0.0f)))
        return cddp_error_set(&m->err, CDDP_EINVAL,
                              "module '%s': batch norm of %lld features, momentum %g, eps %g "
                              "(want in == out, momentum in [0, 1], eps > 0)",
                              name, (long long)mod.in, (double)mod.momentum, (double)mod.eps);
    if (mod.kind == CDDP_MODULE_DROPOUT && !(mod.p >= 0.0f && mod.p <= 1.0f))
        return cddp_error_set(&m->err, CDDP_EINVAL, "module '%s': dropout p=%g is not in [0, 1]",
                              name, (double)mod.p);
    if (m->nmods == m->cap_mods) {
        int cap = m->cap_mods ? 2 * m->cap_mods : 8;
        module_entry *e = cddp_realloc(m->mods, (size_t)cap * sizeof *e);
        if (!e) return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory adding '%s'", name);
        m->mods = e;
        m->cap_mods = cap;
    }
    module_entry e = {.mod = mod, .weight = -1, .bias = -1, .running_mean = -1, .running_var = -1};
    if (norm) {
        if (mod.bias) {
            snprintf(pname, sizeof pname, "%s.weight", name);
            CDDP_TRY(
                declare(m, pname, 1, &mod.out, (cddp_init){CDDP_INIT_CONSTANT, 1, 0}, &e.weight));
            snprintf(pname, sizeof pname, "%s.bias", name);
            CDDP_TRY(
                declare(m, pname, 1, &mod.out, (cddp_init){CDDP_INIT_CONSTANT, 0, 0}, &e.bias));
        }
        snprintf(pname, sizeof pname, "%s.running_mean", name);
        CDDP_TRY(cddp_model_add_buffer(m, pname, 1, &mod.out, 0.0f, &e.running_mean));
        snprintf(pname, sizeof pname, "%s.running_var", name);
        CDDP_TRY(cddp_model_add_buffer(m, pname, 1, &mod.out, 1.0f, &e.running_var));
    }
    if (has_weight) {
        /* PyTorch: kaiming_uniform(a = sqrt(5)) for the weight, which is U(-1/sqrt(fan_in),
         * 1/sqrt(fan_in)), and the same bound for the bias. */
        int64_t k = mod.kind == CDDP_MODULE_CONV2D ? mod.kernel : 1;
        float bound = 1.0f / sqrtf((float)(mod.in * k * k));
        cddp_init u = {CDDP_INIT_UNIFORM, -bound, bound};
        int64_t wshape[4] = {mod.out, mod.in, k, k};
        snprintf(pname, sizeof pname, "%s.weight", name);
        CDDP_TRY(declare(m, pname, mod.kind == CDDP_MODULE_CONV2D ? 4 : 2, wshape, u, &e.weight));
        if (mod.bias) {
            snprintf(pname, sizeof pname, "%s.bias", name);
            CDDP_TRY(declare(m, pname, 1, &mod.out, u, &e.bias));
        }
    }
    m->mods[m->nmods++] = e;
    return CDDP_OK;
}

/* Lays n declarations out back to back; returns the elements they take. */
static size_t lay_out(param_decl *decls, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        decls[i].offset = total;
        total += (size_t)decls[i].numel;
    }
    return total;
}

/* The tensor viewing declaration d's range of block. */
static cddp_tensor view_of(const param_decl *d, float *block) {
    cddp_tensor t = {.dtype = CDDP_F32, .ndim = d->ndim, .numel = d->numel, .name = d->name};
    memcpy(t.shape, d->shape, sizeof t.shape);
    t.data = block + d->offset;
    return t;
}

int cddp_model_build(cddp_model *m, uint64_t seed) {
    if (m->built) return cddp_error_set(&m->err, CDDP_ESTATE, "the model is already built");
    size_t total = lay_out(m->decls, m->nparams);
    m->params = cddp_calloc((size_t)m->nparams, sizeof *m->params);
    m->data = cddp_aligned_alloc(total * sizeof(float));
    m->grad = cddp_aligned_alloc(total * sizeof(float));
    if (!m->params || !m->data || !m->grad) {
        cddp_free(m->params);
        cddp_aligned_free(m->data);
        cddp_aligned_free(m->grad);
        m->params = NULL;
        m->data = m->grad = NULL;
        return cddp_error_set(&m->err, CDDP_ENOMEM, "cannot allocate %zu MiB for %zu parameters",
                              (2 * total * sizeof(float)) >> 20, total);
    }
    m->numel = total;
    memset(m->grad, 0, total * sizeof(float));
    decl_list *b = &m->bufs;
    b->numel = lay_out(b->decls, b->n);
    b->tensors = cddp_calloc((size_t)b->n + 1, sizeof *b->tensors);
    b->data = cddp_aligned_alloc((b->numel + 1) * sizeof(float));
    if (!b->tensors || !b->data)
        return cddp_error_set(&m->err, CDDP_ENOMEM, "cannot allocate %zu buffer elements",
                              b->numel);
    for (int i = 0; i < b->n; i++) {
        b->tensors[i] = view_of(&b->decls[i], b->data);
        cddp_fill(&b->tensors[i], b->decls[i].init.a);
    }
    cddp_rng rng;
    cddp_rng_seed(&rng, seed);
    for (int i = 0; i < m->nparams; i++) {
        param_decl *d = &m->decls[i];
        cddp_tensor *t = &m->params[i];
        *t = view_of(d, m->data);
        t->grad = m->grad + d->offset;
        t->requires_grad = true;
        t->is_param = true;
        t->param_index = i;
        t->name = d->name;
        switch (d->init.kind) {
        case CDDP_INIT_CONSTANT:
            cddp_fill(t, d->init.a);
            break;
        case CDDP_INIT_UNIFORM:
            cddp_fill_uniform(t, d->init.a, d->init.b, &rng);
            break;
        case CDDP_INIT_NORMAL:
            cddp_fill_normal(t, d->init.a, d->init.b, &rng);
            break;
        }
    }
    m->built = true;
    return CDDP_OK;
}

static void check_built(const cddp_model *m) {
    CDDP_CHECK(m->built, "the model must be built with cddp_model_build first");
}

int cddp_model_num_params(const cddp_model *m) {
    return m->nparams;
}

int cddp_model_num_buffers(const cddp_model *m) {
    return m->bufs.n;
}

cddp_tensor *cddp_model_buffer(const cddp_model *m, int i) {
    check_built(m);
    CDDP_CHECK(i >= 0 && i < m->bufs.n, "buffer index %d out of range (%d buffers)", i, m->bufs.n);
    return &m->bufs.tensors[i];
}

cddp_tensor *cddp_model_find_buffer(const cddp_model *m, const char *name) {
    check_built(m);
    for (int i = 0; i < m->bufs.n; i++)
        if (strcmp(m->bufs.decls[i].name, name) == 0) return &m->bufs.tensors[i];
    return NULL;
}

size_t cddp_model_buffer_numel(const cddp_model *m) {
    return m->bufs.numel;
}

float *cddp_model_buffer_data(const cddp_model *m) {
    check_built(m);
    return m->bufs.data;
}

cddp_tensor *cddp_model_param(const cddp_model *m, int i) {
    check_built(m);
    CDDP_CHECK(i >= 0 && i < m->nparams, "parameter index %d out of range (%d parameters)", i,
               m->nparams);
    return &m->params[i];
}

cddp_tensor *cddp_model_find(const cddp_model *m, const char *name) {
    check_built(m);
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->decls[i].name, name) == 0) return &m->params[i];
    return NULL;
}

size_t cddp_model_numel(const cddp_model *m) {
    return m->numel;
}

float *cddp_model_data(const cddp_model *m) {
    check_built(m);
    return m->data;
}

float *cddp_model_grad(const cddp_model *m) {
    check_built(m);
    return m->grad;
}

size_t cddp_model_param_offset(const cddp_model *m, int i) {
    CDDP_CHECK(i >= 0 && i < m->nparams, "parameter index %d out of range", i);
    return m->decls[i].offset;
}

int cddp_model_set_grad_block(cddp_model *m, float *block) {
    check_built(m);
    float *to = block ? block : cddp_aligned_alloc(m->numel * sizeof(float));
    if (!to)
        return cddp_error_set(&m->err, CDDP_ENOMEM, "cannot allocate %zu MiB for the gradients",
                              (m->numel * sizeof(float)) >> 20);
    if (to != m->grad) memcpy(to, m->grad, m->numel * sizeof(float));
    if (!m->grad_lent) cddp_aligned_free(m->grad);
    m->grad = to;
    m->grad_lent = block != NULL;
    for (int i = 0; i < m->nparams; i++) m->params[i].grad = m->grad + m->decls[i].offset;
    return CDDP_OK;
}

void cddp_model_zero_grad(cddp_model *m) {
    check_built(m);
    memset(m->grad, 0, m->numel * sizeof(float));
}

void cddp_model_set_training(cddp_model *m, bool training) {
    m->training = training;
}

bool cddp_model_training(const cddp_model *m) {
    return m->training;
}

void cddp_model_set_ready_hook(cddp_model *m, cddp_ready_hook hook, void *user) {
    check_built(m);
    for (int i = 0; i < m->nparams; i++) cddp_tensor_set_ready_hook(&m->params[i], hook, user);
}

cddp_tensor *cddp_model_forward(cddp_model *m, cddp_ctx *ctx, cddp_tensor *x) {
    check_built(m);
    CDDP_CHECK(m->nmods > 0, "cddp_model_forward: the model has no modules; write the forward "
                             "with ops on its parameters instead");
    cddp_model_notify(m, CDDP_EVENT_FORWARD);
    for (int i = 0; i < m->nmods && x; i++) {
        const module_entry *e = &m->mods[i];
        cddp_tensor *w = e->weight >= 0 ? &m->params[e->weight] : NULL;
        cddp_tensor *b = e->bias >= 0 ? &m->params[e->bias] : NULL;
        switch (e->mod.kind) {
        case CDDP_MODULE_LINEAR:
            x = cddp_linear(ctx, x, w, b);
            break;
        case CDDP_MODULE_CONV2D:
            x = cddp_conv2d(ctx, x, w, b, e->mod.stride, e->mod.padding);
            break;
        case CDDP_MODULE_MAX_POOL2D:
            x = cddp_max_pool2d(ctx, x, e->mod.kernel, e->mod.stride, e->mod.padding);
            break;
        case CDDP_MODULE_RELU:
            x = cddp_relu(ctx, x);
            break;
        case CDDP_MODULE_GELU:
            x = cddp_gelu(ctx, x);
            break;
        case CDDP_MODULE_TANH:
            x = cddp_tanh(ctx, x);
            break;
        case CDDP_MODULE_SIGMOID:
            x = cddp_sigmoid(ctx, x);
            break;
        case CDDP_MODULE_DROPOUT:
            x = cddp_dropout(ctx, x, e->mod.p, m->training);
            break;
        case CDDP_MODULE_FLATTEN:
            x = cddp_flatten(ctx, x);
            break;
        case CDDP_MODULE_BATCH_NORM:
            x = cddp_batch_norm(ctx, x, w, b, &m->bufs.tensors[e->running_mean],
                                &m->bufs.tensors[e->running_var], m->training, e->mod.momentum,
                                e->mod.eps);
            break;
        }
    }
    return x;
}
