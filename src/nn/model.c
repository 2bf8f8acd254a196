/* model.c: the model: its root module, raw parameters, build, mode, and its observers (DDP's
 * ready hooks and step events). The blocks are in blocks.c, the module tree in module.c. */
#include "nn/internal.h"

#include "cddp/internal/device.h"

#include <inttypes.h>
#include <string.h>

static cddp_model *make(void) {
    cddp_model *m = cddp_calloc(1, sizeof *m);
    if (m) m->training = true;
    return m;
}

cddp_model *cddp_model_create(void) {
    cddp_model *m = make();
    if (m && !(m->root = cddp_nn_sequential())) {
        cddp_free(m);
        return NULL;
    }
    if (m) m->root->model = m;
    if (m && !(m->root->path = cddp_strdup(""))) {
        cddp_model_destroy(m);
        return NULL;
    }
    return m;
}

cddp_model *cddp_model_create_with(cddp_module *root, cddp_error *err) {
    cddp_model *m = root ? make() : NULL;
    if (!m) {
        cddp__module_free(root);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory making the model");
        return NULL;
    }
    if (cddp__module_join(root, m) != CDDP_OK) {
        if (err) *err = m->err;
        cddp__module_free(root);
        cddp__model_free_blocks(m);
        cddp_free(m);
        return NULL;
    }
    m->root = root;
    return m;
}

void cddp_model_destroy(cddp_model *m) {
    if (!m) return;
    cddp__module_free(m->root);
    cddp__model_free_blocks(m);
    cddp_free(m->shard);
    cddp_free(m);
}

cddp_module *cddp_model_root(const cddp_model *m) {
    return m->root;
}

/* The transformers' blocks: what activation checkpointing recomputes. */
static bool is_block(const cddp_module *m) {
    return m->type &&
           (!strcmp(m->type->name, "Block") || !strcmp(m->type->name, "LlamaDecoderLayer"));
}

static int mark_blocks(cddp_module *m, bool on) {
    int n = 0;
    if (is_block(m)) {
        m->recompute = on;
        return 1;
    }
    for (int i = 0; i < m->nchildren; i++) n += mark_blocks(m->children[i], on);
    return n;
}

int cddp_model_recompute_blocks(cddp_model *m, bool on) {
    cddp_module *root = m->root;
    return root ? mark_blocks(root, on) : 0;
}

int cddp_model_add(cddp_model *m, const char *name, cddp_module *module) {
    return cddp_module_add(m->root, name, module);
}

int cddp_model_build(cddp_model *m, uint64_t seed) {
    if (m->built) return cddp_error_set(&m->err, CDDP_ESTATE, "the model is already built");
    CDDP_TRY(cddp__model_build_blocks(m, seed));
    m->built = true;
    return CDDP_OK;
}

void cddp_model_set_training(cddp_model *m, bool training) {
    m->training = training;
}

bool cddp_model_training(const cddp_model *m) {
    return m->training;
}

int cddp_model_sync_batch_norm(cddp_model *m, cddp_comm *group) {
    return cddp__nn_sync_batch_norm(m->root, group);
}

void cddp_model_set_event_hook(cddp_model *m, cddp_model_event_hook hook, void *user) {
    m->event_hook = hook;
    m->event_user = user;
}

void cddp_model_notify(cddp_model *m, cddp_model_event event) {
    if (m->event_hook) m->event_hook(m->event_user, m, event);
}

cddp_tensor *cddp_model_forward(cddp_model *m, cddp_ctx *ctx, cddp_tensor *x) {
    CDDP_CHECK(m->built, "the model must be built with cddp_model_build first");
    CDDP_CHECK(cddp_module_num_children(m->root) > 0 || strcmp(m->root->type->name, "Sequential"),
               "cddp_model_forward: the model has no modules; write the forward with ops on its "
               "parameters instead");
    cddp_model_notify(m, CDDP_EVENT_FORWARD);
    return cddp_module_forward(m->root, ctx, x);
}

/* ---- the shard of a sharded optimizer ---------------------------------------------------- */

void cddp_model_zero_grad(cddp_model *m) {
    CDDP_CHECK(m->built, "the model must be built with cddp_model_build first");
    cddp_model_notify(m, CDDP_EVENT_ZERO_GRAD);
    cddp_device *dev = cddp_model_device(m);
    if (!m->grad_shard_only || m->nshard == 0) {
        cddp_device_memset(dev, m->grad, 0, m->params.numel * sizeof(float), NULL);
        return;
    }
    /* the shard set to zero; the rest released (what is released already costs nothing) */
    int64_t at = 0;
    for (int k = 0; k <= m->nshard; k++) {
        int64_t b = k < m->nshard ? m->shard[2 * k] : (int64_t)m->params.numel;
        cddp_device_release(dev, m->grad + at, (size_t)(b - at) * sizeof(float), NULL);
        if (k == m->nshard) break;
        at = m->shard[2 * k + 1];
        cddp_device_memset(dev, m->grad + b, 0, (size_t)(at - b) * sizeof(float), NULL);
    }
}

int cddp_model_set_shard(cddp_model *m, int nranges, const int64_t *ranges, cddp_model_sum_fn sum,
                         void *user, cddp_error *err) {
    int64_t n = (int64_t)cddp_model_numel(m), last = 0;
    if (nranges < 0 || (nranges > 0 && !ranges))
        return cddp_error_set(err, CDDP_EINVAL, "a shard needs %d ranges", nranges);
    for (int k = 0; k < nranges; k++) {
        int64_t b = ranges[2 * k], e = ranges[2 * k + 1];
        if (b < last || e < b || e > n)
            return cddp_error_set(err, CDDP_EINVAL,
                                  "shard range %d [%" PRId64 ", %" PRId64 ") is not ascending, "
                                  "disjoint and within the %" PRId64 " parameters",
                                  k, b, e, n);
        last = e;
    }
    int64_t *copy = NULL;
    if (nranges > 0 && !(copy = cddp_malloc(sizeof *copy * 2 * (size_t)nranges)))
        return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
    if (nranges > 0) memcpy(copy, ranges, sizeof *copy * 2 * (size_t)nranges);
    cddp_free(m->shard);
    m->shard = copy;
    m->nshard = nranges;
    m->shard_sum = sum;
    m->shard_user = user;
    m->shard_version++;
    return CDDP_OK;
}

int cddp_model_shard(const cddp_model *m, const int64_t **ranges, uint64_t *version) {
    if (ranges) *ranges = m->shard;
    if (version) *version = m->shard_version;
    return m->nshard;
}

void cddp_model_shard_gradients(cddp_model *m, bool on) {
    m->grad_shard_only = on;
}

int cddp_model_shard_sum(cddp_model *m, double *value, cddp_error *err) {
    return m->shard_sum ? m->shard_sum(m->shard_user, value, err) : CDDP_OK;
}
