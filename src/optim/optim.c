/* optim.c: what every optimizer does alike (optim/internal.h): its state on the model's device,
 * the model's shard (ZeRO-1), parameter groups' weight decay, the update over the ranges, the
 * accessors; and clipping and the learning rate schedule. The rules are files of their own
 * (sgd.c, adamw.c, lion.c; the update rules are written out in cddp/optim.h).
 *
 * An update runs over the whole parameter block at once, which is what makes the flat layout
 * pay: one pass, no per-parameter dispatch. The arithmetic is the model's device's (cddp/device.h),
 * float32 in the same order as PyTorch's kernels so that results agree to rounding; the state
 * lives on that device too. A new optimizer is a file here with its rule and constructor, its
 * declaration in cddp/optim.h, and its kernel on the devices.
 */
#include "optim/internal.h"
#include "cddp/core.h"

#include <math.h>
#include <string.h>

/* The ranges this process updates: the model's shard, or (not sharded) the whole block, which
 * *whole holds. Returns their count; *version (if not NULL) the shard's. */
static int ranges_of(const cddp_model *m, const int64_t **r, int64_t whole[2], uint64_t *version) {
    int k = cddp_model_shard(m, r, version);
    if (k > 0) return k;
    whole[0] = 0;
    whole[1] = (int64_t)cddp_model_numel(m);
    *r = whole;
    return 1;
}

/* Takes the model's shard: the state keeps the values of the elements it held before (the
 * others start at zero) and is reallocated for the new ranges only. */
static int take_shard(cddp_optim *o, cddp_error *err) {
    const int64_t *r;
    uint64_t version;
    int64_t whole[2];
    int k = ranges_of(o->model, &r, whole, &version);
    bool sharded = r != whole;
    size_t total = 0;
    for (int i = 0; i < k; i++) total += (size_t)(r[2 * i + 1] - r[2 * i]);
    int64_t *nr = cddp_malloc(sizeof *nr * 2 * (size_t)k);
    float *ns[CDDP__OPTIM_MAX_STATES] = {NULL};
    bool ok = nr != NULL;
    for (int s = 0; s < o->nstates && ok; s++)
        ok = (ns[s] = cddp_device_alloc(o->dev, total * sizeof(float) + 64, NULL)) &&
             cddp_device_memset(o->dev, ns[s], 0, total * sizeof(float), NULL) == CDDP_OK;
    if (!ok) {
        cddp_free(nr);
        for (int s = 0; s < CDDP__OPTIM_MAX_STATES; s++) cddp_device_free(o->dev, ns[s]);
        return cddp_error_set(err, CDDP_ENOMEM,
                              "out of memory for the optimizer state (%zu parameters) on %s", total,
                              cddp_device_name(o->dev));
    }
    memcpy(nr, r, sizeof *nr * 2 * (size_t)k);
    size_t base_new = 0;
    for (int a = 0; a < k; a++) {
        size_t base_old = 0;
        for (int b = 0; b < o->nranges; b++) {
            int64_t x = CDDP_MAX(nr[2 * a], o->ranges[2 * b]);
            int64_t y = CDDP_MIN(nr[2 * a + 1], o->ranges[2 * b + 1]);
            for (int s = 0; s < o->nstates && x < y; s++)
                cddp_device_copy(o->dev, ns[s] + base_new + (size_t)(x - nr[2 * a]),
                                 o->state[s] + base_old + (size_t)(x - o->ranges[2 * b]),
                                 (size_t)(y - x) * sizeof(float), NULL);
            base_old += (size_t)(o->ranges[2 * b + 1] - o->ranges[2 * b]);
        }
        base_new += (size_t)(nr[2 * a + 1] - nr[2 * a]);
    }
    for (int s = 0; s < CDDP__OPTIM_MAX_STATES; s++) {
        cddp_device_free(o->dev, o->state[s]);
        o->state[s] = ns[s];
    }
    cddp_free(o->ranges);
    o->ranges = nr;
    o->nranges = k;
    o->sharded = sharded;
    o->version = version;
    o->state_numel = total;
    return CDDP_OK;
}

cddp_optim *cddp__optim_new(cddp_model *m, const cddp__optim_rule *rule, const void *opts,
                            size_t size, int nstates, float lr, float wd, bool decay_matrices_only,
                            cddp_error *err) {
    if (!(lr >= 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL, "learning rate %g must be >= 0", (double)lr);
        return NULL;
    }
    cddp_optim *o = cddp_calloc(1, sizeof *o);
    if (!o || !(o->opts = cddp_malloc(size))) {
        cddp_free(o);
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(o->opts, opts, size);
    o->rule = rule;
    o->model = m;
    o->dev = cddp_model_device(m);
    o->lr = lr;
    o->weight_decay = wd;
    o->nstates = nstates;
    if (take_shard(o, err) != CDDP_OK) {
        cddp_optim_destroy(o);
        return NULL;
    }
    for (int i = 0; decay_matrices_only && i < cddp_model_num_params(m); i++)
        if (cddp_model_param(m, i)->ndim < 2 &&
            cddp_optim_set_param_weight_decay(o, i, 0.0f, err) != CDDP_OK) {
            cddp_optim_destroy(o);
            return NULL;
        }
    return o;
}

int cddp_optim_sync_shard(cddp_optim *opt, cddp_error *err) {
    uint64_t version;
    cddp_model_shard(opt->model, NULL, &version);
    return version == opt->version ? CDDP_OK : take_shard(opt, err);
}

bool cddp_optim_sharded(const cddp_optim *opt) {
    return opt->sharded;
}

size_t cddp_optim_state_numel(const cddp_optim *opt) {
    return opt->state_numel;
}

int cddp_optim_set_param_weight_decay(cddp_optim *opt, int param_index, float weight_decay,
                                      cddp_error *err) {
    int n = cddp_model_num_params(opt->model);
    if (param_index < 0 || param_index >= n || !(weight_decay >= 0.0f))
        return cddp_error_set(err, CDDP_EINVAL,
                              "weight decay %g for parameter %d (want >= 0, and 0..%d)",
                              (double)weight_decay, param_index, n - 1);
    if (!opt->decay) {
        if (!(opt->decay = cddp_malloc(sizeof(float) * (size_t)(n ? n : 1))))
            return cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        for (int i = 0; i < n; i++) opt->decay[i] = opt->weight_decay;
    }
    opt->decay[param_index] = weight_decay;
    return CDDP_OK;
}

void cddp_optim_destroy(cddp_optim *opt) {
    if (!opt) return;
    for (int i = 0; i < CDDP__OPTIM_MAX_STATES; i++) cddp_device_free(opt->dev, opt->state[i]);
    cddp_free(opt->opts);
    cddp_free(opt->decay);
    cddp_free(opt->ranges);
    cddp_free(opt);
}

/* Updates elements [lo, hi) of the flat blocks, where they meet this optimizer's ranges. */
static void update(cddp_optim *opt, float *p, const float *g, size_t lo, size_t hi, float wd) {
    size_t base = 0;
    for (int k = 0; k < opt->nranges; k++) {
        size_t a = (size_t)opt->ranges[2 * k], b = (size_t)opt->ranges[2 * k + 1];
        size_t x = CDDP_MAX(a, lo), y = CDDP_MIN(b, hi), at = base + (x - a);
        base += b - a;
        if (x >= y) continue;
        float *state[CDDP__OPTIM_MAX_STATES];
        for (int s = 0; s < CDDP__OPTIM_MAX_STATES; s++)
            state[s] = opt->state[s] ? opt->state[s] + at : NULL;
        opt->rule->step(opt, p + x, g + x, state, y - x, wd);
    }
}

void cddp_optim_step(cddp_optim *opt) {
    cddp_error err = {0};
    if (cddp_optim_sync_shard(opt, &err) != CDDP_OK) /* only when the model's shard changed */
        CDDP_CHECK(false, "optimizer step: %s", err.msg);
    float *p = cddp_model_data(opt->model);
    const float *g = cddp_model_grad(opt->model);
    size_t n = cddp_model_numel(opt->model);
    cddp_model_notify(opt->model, CDDP_EVENT_OPTIM_BEGIN);
    float all = opt->weight_decay;
    /* Runs of parameters with one weight decay (all of them without parameter groups), each a
     * range of the flat blocks, one straight pass each. */
    int np = cddp_model_num_params(opt->model);
    for (int i = 0, j; i < np; i = j) {
        float wd = opt->decay ? opt->decay[i] : all;
        for (j = i + 1; opt->decay && j < np && opt->decay[j] == wd;) j++;
        if (!opt->decay) j = np;
        size_t lo = cddp_model_param_offset(opt->model, i);
        size_t hi = j < np ? cddp_model_param_offset(opt->model, j) : n;
        update(opt, p, g, lo, hi, wd);
    }
    opt->steps++;
    cddp_model_notify(opt->model, CDDP_EVENT_OPTIM_END);
}

void cddp_optim_set_lr(cddp_optim *opt, float lr) {
    opt->lr = lr;
}

float cddp_optim_lr(const cddp_optim *opt) {
    return opt->lr;
}

int64_t cddp_optim_steps(const cddp_optim *opt) {
    return opt->steps;
}

void cddp_optim_set_steps(cddp_optim *opt, int64_t steps) {
    opt->steps = steps;
}

const char *cddp_optim_name(const cddp_optim *opt) {
    return opt->rule->name;
}

int cddp_optim_num_states(const cddp_optim *opt) {
    return opt->nstates;
}

float *cddp_optim_state(const cddp_optim *opt, int i, const char **name) {
    CDDP_CHECK(i >= 0 && i < opt->nstates, "optimizer state %d out of range (%d states)", i,
               opt->nstates);
    if (name) *name = opt->rule->states[i];
    return opt->state[i];
}

double cddp_clip_grad_norm(cddp_model *m, double max_norm) {
    float *g = cddp_model_grad(m);
    cddp_device *dev = cddp_model_device(m);
    const int64_t *r;
    int64_t whole[2];
    int k = ranges_of(m, &r, whole, NULL);
    double sq = 0.0;
    cddp_error err = {0};
    for (int i = 0; i < k; i++) {
        double part;
        if (cddp_device_sum_squares(dev, g + r[2 * i], (size_t)(r[2 * i + 1] - r[2 * i]), &part,
                                    &err) != CDDP_OK) {
            cddp_log(CDDP_LOG_ERROR, "optim", "gradient norm: %s", err.msg);
            return NAN;
        }
        sq += part;
    }
    if (cddp_model_shard_sum(m, &sq, &err) != CDDP_OK) {
        cddp_log(CDDP_LOG_ERROR, "optim", "gradient norm: %s", err.msg);
        return NAN;
    }
    double norm = sqrt(sq), coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
        for (int i = 0; i < k; i++)
            cddp_device_scale(dev, g + r[2 * i], (size_t)(r[2 * i + 1] - r[2 * i]), (float)coef);
    return norm;
}

float cddp_lr_warmup_cosine(int64_t it, float max_lr, float min_lr, int64_t warmup,
                            int64_t decay_steps) {
    if (it < warmup) return (float)((double)max_lr * (double)(it + 1) / (double)(warmup + 1));
    if (it > decay_steps || decay_steps <= warmup) return min_lr;
    double ratio = (double)(it - warmup) / (double)(decay_steps - warmup);
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)((double)min_lr + coeff * ((double)max_lr - (double)min_lr));
}
