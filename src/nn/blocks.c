/* blocks.c: a model's declarations and its flat parameter, gradient and buffer blocks. */
#include "nn/internal.h"

#include "cddp/internal/device.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static bool name_taken(const cddp_model *m, const char *name) {
    const decl_list *lists[2] = {&m->params, &m->bufs};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < lists[k]->n; i++)
            if (strcmp(lists[k]->decls[i].name, name) == 0) return true;
    for (int i = 0; i < m->nties; i++)
        if (strcmp(m->ties[i].name, name) == 0) return true;
    return false;
}

int cddp__model_declare(cddp_model *m, bool buffer, const char *name, int ndim,
                        const int64_t *shape, cddp_init init, int *index) {
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
    decl_list *l = buffer ? &m->bufs : &m->params;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        param_decl *d = cddp_realloc(l->decls, (size_t)cap * sizeof *d);
        if (!d) return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory declaring '%s'", name);
        l->decls = d;
        l->cap = cap;
    }
    param_decl *d = &l->decls[l->n];
    memset(d, 0, sizeof *d);
    d->name = cddp_strdup(name);
    if (!d->name) return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory declaring '%s'", name);
    d->ndim = ndim;
    memcpy(d->shape, shape, sizeof(int64_t) * (size_t)ndim);
    d->numel = numel;
    d->init = init;
    if (index) *index = l->n;
    l->n++;
    return CDDP_OK;
}

int cddp__model_tie(cddp_model *m, const char *name, const char *target) {
    if (m->built)
        return cddp_error_set(&m->err, CDDP_ESTATE, "cannot tie '%s': the model is already built",
                              name);
    if (!name[0] || name_taken(m, name))
        return cddp_error_set(&m->err, CDDP_EINVAL, "parameter name '%s' is %s", name,
                              name[0] ? "already used" : "empty");
    if (m->nties == m->cap_ties) {
        int cap = m->cap_ties ? 2 * m->cap_ties : 4;
        tie *t = cddp_realloc(m->ties, (size_t)cap * sizeof *t);
        if (!t) return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory tying '%s'", name);
        m->ties = t;
        m->cap_ties = cap;
    }
    tie *t = &m->ties[m->nties];
    t->name = cddp_strdup(name);
    t->target = cddp_strdup(target);
    t->index = -1;
    if (!t->name || !t->target) {
        cddp_free(t->name);
        cddp_free(t->target);
        return cddp_error_set(&m->err, CDDP_ENOMEM, "out of memory tying '%s'", name);
    }
    m->nties++;
    return CDDP_OK;
}

void cddp__model_undeclare(cddp_model *m, int nparams, int nbuffers, int nties) {
    while (m->params.n > nparams) cddp_free(m->params.decls[--m->params.n].name);
    while (m->bufs.n > nbuffers) cddp_free(m->bufs.decls[--m->bufs.n].name);
    while (m->nties > nties) {
        m->nties--;
        cddp_free(m->ties[m->nties].name);
        cddp_free(m->ties[m->nties].target);
    }
}

int cddp_model_add_buffer(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                          float init, int *index) {
    if (!name) return cddp_error_set(&m->err, CDDP_EINVAL, "a buffer needs a name");
    return cddp__model_declare(m, true, name, ndim, shape, (cddp_init){CDDP_INIT_CONSTANT, init, 0},
                               index);
}

int cddp_model_add_param(cddp_model *m, const char *name, int ndim, const int64_t *shape,
                         cddp_init init, int *index) {
    if (!name) return cddp_error_set(&m->err, CDDP_EINVAL, "a parameter needs a name");
    return cddp__model_declare(m, false, name, ndim, shape, init, index);
}

/* Lays a list's declarations out back to back; returns the elements they take. */
static size_t lay_out(decl_list *l) {
    size_t total = 0;
    for (int i = 0; i < l->n; i++) {
        l->decls[i].offset = total;
        total += (size_t)l->decls[i].numel;
    }
    return l->numel = total;
}

/* The tensor viewing declaration d's range of block. */
static cddp_tensor view_of(const param_decl *d, float *block) {
    cddp_tensor t = {.dtype = CDDP_F32,
                     .ndim = d->ndim,
                     .numel = d->numel,
                     .name = d->name,
                     .device = cddp_device_cpu()}; /* cddp_model_to moves it */
    memcpy(t.shape, d->shape, sizeof t.shape);
    t.data = block + d->offset;
    t.param_index = -1;
    return t;
}

int cddp__model_build_blocks(cddp_model *m, uint64_t seed) {
    decl_list *p = &m->params, *b = &m->bufs;
    for (int t = 0; t < m->nties; t++) {
        for (int i = 0; i < p->n && m->ties[t].index < 0; i++)
            if (strcmp(p->decls[i].name, m->ties[t].target) == 0) m->ties[t].index = i;
        if (m->ties[t].index < 0)
            return cddp_error_set(&m->err, CDDP_EINVAL,
                                  "'%s' is tied to '%s', which is not a parameter of the model",
                                  m->ties[t].name, m->ties[t].target);
    }
    size_t total = lay_out(p);
    p->tensors = cddp_calloc((size_t)p->n + 1, sizeof *p->tensors);
    p->data = cddp_aligned_alloc((total + 1) * sizeof(float));
    m->grad = cddp_aligned_alloc((total + 1) * sizeof(float));
    if (!p->tensors || !p->data || !m->grad) {
        cddp_free(p->tensors);
        cddp_aligned_free(p->data);
        cddp_aligned_free(m->grad);
        p->tensors = NULL;
        p->data = m->grad = NULL;
        return cddp_error_set(&m->err, CDDP_ENOMEM, "cannot allocate %zu MiB for %zu parameters",
                              (2 * total * sizeof(float)) >> 20, total);
    }
    memset(m->grad, 0, total * sizeof(float));
    lay_out(b);
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
    for (int i = 0; i < p->n; i++) {
        param_decl *d = &p->decls[i];
        cddp_tensor *t = &p->tensors[i];
        *t = view_of(d, p->data);
        t->grad = m->grad + d->offset;
        t->requires_grad = true;
        t->is_param = true;
        t->param_index = i;
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
    return CDDP_OK;
}

void cddp__model_free_blocks(cddp_model *m) {
    cddp_device *dev = cddp_model_device(m);
    decl_list *lists[2] = {&m->params, &m->bufs};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < lists[k]->n; i++) cddp_free(lists[k]->decls[i].name);
        cddp_free(lists[k]->decls);
        cddp_free(lists[k]->tensors);
        cddp_device_free(dev, lists[k]->data);
    }
    cddp__model_undeclare(m, m->params.n, m->bufs.n, 0);
    cddp_free(m->ties);
    if (!m->grad_lent) cddp_device_free(dev, m->grad);
}

/* ---- finding parameters and buffers ------------------------------------------------------ */

static void check_built(const cddp_model *m) {
    CDDP_CHECK(m->built, "the model must be built with cddp_model_build first");
}

const char *cddp_model_error(const cddp_model *m) {
    return cddp_error_msg(&m->err);
}

int cddp_model_num_params(const cddp_model *m) {
    return m->params.n;
}

int cddp_model_num_buffers(const cddp_model *m) {
    return m->bufs.n;
}

cddp_tensor *cddp_model_param(const cddp_model *m, int i) {
    check_built(m);
    CDDP_CHECK(i >= 0 && i < m->params.n, "parameter index %d out of range (%d parameters)", i,
               m->params.n);
    return &m->params.tensors[i];
}

cddp_tensor *cddp_model_buffer(const cddp_model *m, int i) {
    check_built(m);
    CDDP_CHECK(i >= 0 && i < m->bufs.n, "buffer index %d out of range (%d buffers)", i, m->bufs.n);
    return &m->bufs.tensors[i];
}

static cddp_tensor *find(const decl_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->decls[i].name, name) == 0) return &l->tensors[i];
    return NULL;
}

cddp_tensor *cddp_model_find(const cddp_model *m, const char *name) {
    check_built(m);
    for (int t = 0; t < m->nties; t++)
        if (strcmp(m->ties[t].name, name) == 0) return &m->params.tensors[m->ties[t].index];
    return find(&m->params, name);
}

int cddp_model_num_ties(const cddp_model *m) {
    return m->nties;
}

cddp_tensor *cddp_model_tie(const cddp_model *m, int i, const char **name) {
    check_built(m);
    CDDP_CHECK(i >= 0 && i < m->nties, "tie %d out of range (%d ties)", i, m->nties);
    if (name) *name = m->ties[i].name;
    return &m->params.tensors[m->ties[i].index];
}

cddp_tensor *cddp_model_find_buffer(const cddp_model *m, const char *name) {
    check_built(m);
    return find(&m->bufs, name);
}

size_t cddp_model_numel(const cddp_model *m) {
    return m->params.numel;
}

size_t cddp_model_buffer_numel(const cddp_model *m) {
    return m->bufs.numel;
}

float *cddp_model_data(const cddp_model *m) {
    check_built(m);
    return m->params.data;
}

float *cddp_model_buffer_data(const cddp_model *m) {
    check_built(m);
    return m->bufs.data;
}

float *cddp_model_grad(const cddp_model *m) {
    check_built(m);
    return m->grad;
}

size_t cddp_model_param_offset(const cddp_model *m, int i) {
    CDDP_CHECK(i >= 0 && i < m->params.n, "parameter index %d out of range", i);
    return m->params.decls[i].offset;
}

/* ---- the device and the gradient block --------------------------------------------------- */

cddp_device *cddp_model_device(const cddp_model *m) {
    return m->device ? m->device : cddp_device_cpu();
}

/* Every tensor of list l views block, on dev. */
static void point(decl_list *l, float *block, cddp_device *dev) {
    l->data = block;
    for (int i = 0; i < l->n; i++) {
        l->tensors[i].data = block + l->decls[i].offset;
        l->tensors[i].device = dev;
    }
}

int cddp_model_to(cddp_model *m, cddp_device *dev, cddp_error *err) {
    check_built(m);
    cddp_device *from = cddp_model_device(m);
    if (dev == from) return CDDP_OK;
    if (m->grad_lent)
        return cddp_error_set(err, CDDP_ESTATE,
                              "cddp_model_to: the gradients are in a block lent to the model "
                              "(DistributedDataParallel's): move the model before wrapping it");
    size_t n[3] = {m->params.numel, m->params.numel, m->bufs.numel};
    float *old[3] = {m->params.data, m->grad, m->bufs.data}, *moved[3] = {NULL, NULL, NULL};
    int rc = CDDP_OK;
    for (int k = 0; k < 3 && rc == CDDP_OK; k++) {
        if (!(moved[k] = cddp_device_alloc(dev, (n[k] + 1) * sizeof(float), err)))
            rc = err ? err->code : CDDP_ENOMEM;
        else
            rc = cddp_device_transfer(dev, moved[k], from, old[k], n[k] * sizeof(float), err);
    }
    if (rc != CDDP_OK) {
        for (int k = 0; k < 3; k++) cddp_device_free(dev, moved[k]);
        return rc;
    }
    for (int k = 0; k < 3; k++) cddp_device_free(from, old[k]);
    m->device = dev;
    point(&m->params, moved[0], dev);
    point(&m->bufs, moved[2], dev);
    m->grad = moved[1];
    for (int i = 0; i < m->params.n; i++)
        m->params.tensors[i].grad = m->grad + m->params.decls[i].offset;
    return CDDP_OK;
}

int cddp_model_set_grad_block(cddp_model *m, float *block) {
    check_built(m);
    size_t numel = m->params.numel;
    cddp_device *dev = cddp_model_device(m);
    float *to = block ? block : cddp_device_alloc(dev, (numel + 1) * sizeof(float), NULL);
    if (!to)
        return cddp_error_set(&m->err, CDDP_ENOMEM, "cannot allocate %zu MiB for the gradients",
                              (numel * sizeof(float)) >> 20);
    if (to != m->grad) cddp_device_copy(dev, to, m->grad, numel * sizeof(float), NULL);
    if (!m->grad_lent) cddp_device_free(dev, m->grad);
    m->grad = to;
    m->grad_lent = block != NULL;
    for (int i = 0; i < m->params.n; i++)
        m->params.tensors[i].grad = m->grad + m->params.decls[i].offset;
    return CDDP_OK;
}

void cddp_model_set_ready_hook(cddp_model *m, cddp_ready_hook hook, void *user) {
    check_built(m);
    for (int i = 0; i < m->params.n; i++)
        cddp_tensor_set_ready_hook(&m->params.tensors[i], hook, user);
}
