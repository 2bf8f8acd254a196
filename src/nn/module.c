/* module.c: the module tree: children, joining a model, declaring, the forward.
 *
 * A module joins a model when it is added to the model's root (or to any module already in the
 * model): it takes its path from its parent's ("layer1" + "0" = "layer1.0"), declares its own
 * parameters and buffers (its type's declare), then its children join in the order they were
 * added. So a module's parameters come before its children's, as PyTorch's named_parameters
 * lists them. If any of that fails, everything the module declared is undone and it leaves its
 * parent: a failed add changes nothing.
 */
#include "nn/internal.h"

#include "cddp/autograd.h"

#include <stdio.h>
#include <string.h>

cddp_module *cddp_module_create(const cddp_module_type *type, void *state) {
    cddp_module *m = cddp_calloc(1, sizeof *m);
    if (!m) {
        if (type && type->free) type->free(state);
        return NULL;
    }
    m->type = type;
    m->state = state;
    return m;
}

void cddp__module_free(cddp_module *m) {
    if (!m) return;
    for (int i = 0; i < m->nchildren; i++) cddp__module_free(m->children[i]);
    if (m->type && m->type->free) m->type->free(m->state);
    cddp_free(m->children);
    cddp_free(m->params);
    cddp_free(m->buffers);
    cddp_free(m->name);
    cddp_free(m->path);
    cddp_free(m);
}

void *cddp_module_state(const cddp_module *m) {
    return m->state;
}

int cddp_module_num_children(const cddp_module *m) {
    return m->nchildren;
}

cddp_module *cddp_module_child(const cddp_module *m, int i) {
    CDDP_CHECK(i >= 0 && i < m->nchildren, "child %d of a module with %d", i, m->nchildren);
    return m->children[i];
}

const char *cddp_module_path(const cddp_module *m) {
    return m->path ? m->path : "";
}

const char *cddp_module_name(const cddp_module *m) {
    return m->name ? m->name : "";
}

bool cddp_module_training(const cddp_module *m) {
    return !m->model || m->model->training;
}

/* Appends v to a growing int array. */
static bool push(int **a, int *n, int *cap, int v) {
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 4;
        int *p = cddp_realloc(*a, sizeof(int) * (size_t)c);
        if (!p) return false;
        *a = p;
        *cap = c;
    }
    (*a)[(*n)++] = v;
    return true;
}

static int declare(cddp_module *self, bool buffer, const char *name, int ndim, const int64_t *shape,
                   cddp_init init) {
    CDDP_CHECK(self->model, "cddp_module_param/_buffer are for a module's declare (it is not in a "
                            "model yet)");
    char full[512];
    snprintf(full, sizeof full, "%s%s%s", cddp_module_path(self),
             *cddp_module_path(self) ? "." : "", name);
    int index;
    CDDP_TRY(cddp__model_declare(self->model, buffer, full, ndim, shape, init, &index));
    bool ok = buffer ? push(&self->buffers, &self->nbuffers, &self->cap_buffers, index)
                     : push(&self->params, &self->nparams, &self->cap_params, index);
    if (!ok)
        return cddp_error_set(&self->model->err, CDDP_ENOMEM, "out of memory declaring '%s'", full);
    return buffer ? self->nbuffers - 1 : self->nparams - 1;
}

int cddp_module_param(cddp_module *self, const char *name, int ndim, const int64_t *shape,
                      cddp_init init) {
    return declare(self, false, name, ndim, shape, init);
}

int cddp_module_buffer(cddp_module *self, const char *name, int ndim, const int64_t *shape,
                       float init) {
    return declare(self, true, name, ndim, shape, (cddp_init){CDDP_INIT_CONSTANT, init, 0});
}

int cddp_module_tie(cddp_module *self, const char *name, const char *target) {
    CDDP_CHECK(self->model, "cddp_module_tie is for a module's declare (it is not in a model yet)");
    const char *path = cddp_module_path(self), *dot = *path ? "." : "";
    char full[512], full_target[512];
    snprintf(full, sizeof full, "%s%s%s", path, dot, name);
    snprintf(full_target, sizeof full_target, "%s%s%s", path, dot, target);
    return cddp__model_tie(self->model, full, full_target);
}

cddp_tensor *cddp_module_get_param(const cddp_module *m, int k) {
    CDDP_CHECK(k >= 0 && k < m->nparams, "parameter %d of module '%s', which has %d", k,
               cddp_module_path(m), m->nparams);
    return cddp_model_param(m->model, m->params[k]);
}

cddp_tensor *cddp_module_get_buffer(const cddp_module *m, int k) {
    CDDP_CHECK(k >= 0 && k < m->nbuffers, "buffer %d of module '%s', which has %d", k,
               cddp_module_path(m), m->nbuffers);
    return cddp_model_buffer(m->model, m->buffers[k]);
}

/* Forgets that m (and its subtree) ever joined: the model's declarations are undone by the
 * caller. */
static void leave(cddp_module *m) {
    m->model = NULL;
    m->nparams = m->nbuffers = 0;
    cddp_free(m->path);
    m->path = NULL;
    for (int i = 0; i < m->nchildren; i++) leave(m->children[i]);
}

static int join(cddp_module *m, cddp_model *model) {
    const char *base = m->parent ? cddp_module_path(m->parent) : "";
    char path[512];
    snprintf(path, sizeof path, "%s%s%s", base, *base && m->name ? "." : "",
             m->name ? m->name : "");
    if (!(m->path = cddp_strdup(path)))
        return cddp_error_set(&model->err, CDDP_ENOMEM, "out of memory");
    m->model = model;
    if (m->type && m->type->declare) CDDP_TRY(m->type->declare(m));
    for (int i = 0; i < m->nchildren; i++) CDDP_TRY(join(m->children[i], model));
    return CDDP_OK;
}

int cddp__module_join(cddp_module *m, cddp_model *model) {
    int nparams = model->params.n, nbuffers = model->bufs.n, nties = model->nties;
    int rc = join(m, model);
    if (rc != CDDP_OK) {
        cddp__model_undeclare(model, nparams, nbuffers, nties);
        leave(m);
    }
    return rc;
}

int cddp_module_add(cddp_module *parent, const char *name, cddp_module *child) {
    char auto_name[32];
    cddp_model *model = parent->model;
    cddp_error *err = model ? &model->err : NULL;
    if (!name) {
        snprintf(auto_name, sizeof auto_name, "%d", parent->nchildren);
        name = auto_name;
    }
    int rc = CDDP_OK;
    if (!child)
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory making module '%s'", name);
    else if (model && model->built)
        rc = cddp_error_set(err, CDDP_ESTATE, "cannot add module '%s': the model is already built",
                            name);
    else if (child->parent || child->model)
        rc = cddp_error_set(err, CDDP_EINVAL, "module '%s' is already in a model or module", name);
    if (rc == CDDP_OK && parent->nchildren == parent->cap_children) {
        int cap = parent->cap_children ? 2 * parent->cap_children : 4;
        cddp_module **c = cddp_realloc(parent->children, sizeof *c * (size_t)cap);
        if (!c) rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory adding '%s'", name);
        if (c) parent->children = c, parent->cap_children = cap;
    }
    if (rc == CDDP_OK && !(child->name = cddp_strdup(name)))
        rc = cddp_error_set(err, CDDP_ENOMEM, "out of memory adding '%s'", name);
    if (rc == CDDP_OK) {
        child->parent = parent;
        parent->children[parent->nchildren++] = child;
        if (model && (rc = cddp__module_join(child, model)) != CDDP_OK) {
            parent->nchildren--;
            child->parent = NULL;
        }
    }
    if (rc != CDDP_OK) cddp__module_free(child);
    return rc;
}

static cddp_tensor *segment(void *user, cddp_ctx *ctx, cddp_tensor *x) {
    cddp_module *m = user;
    return m->type->forward(m, ctx, x);
}

cddp_tensor *cddp_module_forward(cddp_module *m, cddp_ctx *ctx, cddp_tensor *x) {
    CDDP_CHECK(m->type && m->type->forward, "module '%s' has no forward", cddp_module_path(m));
    if (!x) return NULL;
    return m->recompute ? cddp_recompute(ctx, segment, m, x) : m->type->forward(m, ctx, x);
}

void cddp_module_set_recompute(cddp_module *m, bool on) {
    m->recompute = on;
}

bool cddp__module_add_all(cddp_module *m, const char *const *names, cddp_module *const *children,
                          int n) {
    bool ok = m != NULL;
    for (int i = 0; i < n; i++) {
        if (!ok)
            cddp__module_free(children[i]);
        else if (cddp_module_add(m, names[i], children[i]) != CDDP_OK)
            ok = false; /* the add freed it */
    }
    return ok;
}
