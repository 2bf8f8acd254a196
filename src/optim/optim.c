/* optim.c: SGD and AdamW on flat blocks (the rules are written out in cddp/optim.h).
 *
 * An update runs over the whole parameter block at once, which is what makes the flat layout
 * pay: one pass, no per-parameter dispatch. The arithmetic is the model's device's (cddp/device.h:
 * cddp_device_sgd, cddp_device_adamw), float32 in the same order as PyTorch's kernels so that
 * results agree to rounding; the state lives on that device too. Each rule is one entry of
 * `rules` below: its state's names and its step; a new optimizer (Lion) is an entry there and a
 * kernel of the devices.
 */
#include "cddp/optim.h"
#include "cddp/core.h"

#include <math.h>
#include <string.h>

typedef enum { OPT_SGD, OPT_ADAMW } opt_kind;

typedef struct cddp_optim cddp_optim;

/* An update rule: its name, its state blocks' names, and its step on elements [0, n) of a range
 * (p, g, the states from the range's start; wd its weight decay). */
typedef struct rule {
    const char *name;
    const char *states[2];
    void (*step)(cddp_optim *opt, float *p, const float *g, float **state, size_t n, float wd);
} rule;

struct cddp_optim {
    opt_kind kind;
    cddp_device *dev; /* the model's */
    cddp_model *model;
    cddp_sgd_options sgd;
    cddp_adamw_options adamw;
    float lr;
    int64_t steps;
    int nstates;
    float *state[2]; /* for the ranges below only, one after another */
    float *decay;    /* per parameter weight decay (parameter groups), NULL: the options' for all */
    /* The ranges of the flat blocks this optimizer updates: the model's shard (ZeRO-1) or the
     * whole block, [begin, end) pairs; taken from the model at version. */
    int64_t *ranges;
    int nranges;
    bool sharded;
    uint64_t version;
    size_t state_numel;
};

cddp_adamw_options cddp_adamw_defaults(float lr) {
    return (cddp_adamw_options){
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f};
}

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
    float *ns[2] = {NULL, NULL};
    bool ok = nr != NULL;
    for (int s = 0; s < o->nstates && ok; s++)
        ok = (ns[s] = cddp_device_alloc(o->dev, total * sizeof(float) + 64, NULL)) &&
             cddp_device_memset(o->dev, ns[s], 0, total * sizeof(float), NULL) == CDDP_OK;
    if (!ok) {
        cddp_free(nr);
        for (int s = 0; s < 2; s++) cddp_device_free(o->dev, ns[s]);
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
    for (int s = 0; s < 2; s++) {
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

static cddp_optim *optim_new(cddp_model *m, opt_kind kind, int nstates, float lr, cddp_error *err) {
    if (!(lr >= 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL, "learning rate %g must be >= 0", (double)lr);
        return NULL;
    }
    cddp_optim *o = cddp_calloc(1, sizeof *o);
    if (!o) {
        cddp_error_set(err, CDDP_ENOMEM, "out of memory");
        return NULL;
    }
    o->kind = kind;
    o->model = m;
    o->dev = cddp_model_device(m);
    o->lr = lr;
    o->nstates = nstates;
    if (take_shard(o, err) != CDDP_OK) {
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

cddp_optim *cddp_optim_sgd(cddp_model *m, const cddp_sgd_options *opts, cddp_error *err) {
    cddp_sgd_options o = *opts;
    if (o.momentum < 0.0f || o.weight_decay < 0.0f) {
        cddp_error_set(err, CDDP_EINVAL, "SGD: momentum %g and weight_decay %g must be >= 0",
                       (double)o.momentum, (double)o.weight_decay);
        return NULL;
    }
    if (o.nesterov && (o.momentum <= 0.0f || o.dampening != 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL, "SGD: nesterov needs momentum > 0 and dampening 0");
        return NULL;
    }
    cddp_optim *opt = optim_new(m, OPT_SGD, o.momentum != 0.0f ? 1 : 0, o.lr, err);
    if (opt) opt->sgd = o;
    return opt;
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
        float all = opt->kind == OPT_SGD ? opt->sgd.weight_decay : opt->adamw.weight_decay;
        for (int i = 0; i < n; i++) opt->decay[i] = all;
    }
    opt->decay[param_index] = weight_decay;
    return CDDP_OK;
}

cddp_optim *cddp_optim_adamw(cddp_model *m, const cddp_adamw_options *opts, cddp_error *err) {
    cddp_adamw_options o = *opts;
    if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f) ||
        !(o.eps >= 0.0f) || !(o.weight_decay >= 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL,
                       "AdamW: betas (%g, %g) must be in [0, 1), eps %g and weight_decay %g >= 0",
                       (double)o.beta1, (double)o.beta2, (double)o.eps, (double)o.weight_decay);
        return NULL;
    }
    cddp_optim *opt = optim_new(m, OPT_ADAMW, 2, o.lr, err);
    if (opt) opt->adamw = o;
    for (int i = 0; opt && o.decay_matrices_only && i < cddp_model_num_params(m); i++)
        if (cddp_model_param(m, i)->ndim < 2 &&
            cddp_optim_set_param_weight_decay(opt, i, 0.0f, err) != CDDP_OK) {
            cddp_optim_destroy(opt);
            return NULL;
        }
    return opt;
}

void cddp_optim_destroy(cddp_optim *opt) {
    if (!opt) return;
    for (int i = 0; i < 2; i++) cddp_device_free(opt->dev, opt->state[i]);
    cddp_free(opt->decay);
    cddp_free(opt->ranges);
    cddp_free(opt);
}

static void sgd_step(cddp_optim *opt, float *p, const float *g, float **state, size_t n, float wd) {
    const cddp_sgd_options *o = &opt->sgd;
    cddp_sgd_hparams h = {.lr = opt->lr,
                          .momentum = o->momentum,
                          .dampening = o->dampening,
                          .weight_decay = wd,
                          .nesterov = o->nesterov,
                          .first = opt->steps == 0};
    cddp_device_sgd(opt->dev, p, g, o->momentum != 0.0f ? state[0] : NULL, n, &h);
}

static void adamw_step(cddp_optim *opt, float *p, const float *g, float **state, size_t n,
                       float wd) {
    const cddp_adamw_options *o = &opt->adamw;
    float lr = opt->lr;
    /* Scalars in double, as Python computes them, then rounded once to float. */
    double t = (double)(opt->steps + 1);
    cddp_adamw_hparams h = {.beta1 = o->beta1,
                            .beta2 = o->beta2,
                            .eps = o->eps,
                            .step_size = (float)((double)lr / (1.0 - pow(o->beta1, t))),
                            .bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, t)),
                            .decay = (float)(1.0 - (double)lr * (double)wd)};
    cddp_device_adamw(opt->dev, p, g, state[0], state[1], n, &h);
}

static const rule rules[] = {
    [OPT_SGD] = {"sgd", {"momentum_buffer"}, sgd_step},
    [OPT_ADAMW] = {"adamw", {"exp_avg", "exp_avg_sq"}, adamw_step},
};

/* Updates elements [lo, hi) of the flat blocks, where they meet this optimizer's ranges. */
static void update(cddp_optim *opt, float *p, const float *g, size_t lo, size_t hi, float wd) {
    size_t base = 0;
    for (int k = 0; k < opt->nranges; k++) {
        size_t a = (size_t)opt->ranges[2 * k], b = (size_t)opt->ranges[2 * k + 1];
        size_t x = CDDP_MAX(a, lo), y = CDDP_MIN(b, hi), at = base + (x - a);
        base += b - a;
        if (x >= y) continue;
        float *state[2] = {opt->state[0] ? opt->state[0] + at : NULL,
                           opt->state[1] ? opt->state[1] + at : NULL};
        rules[opt->kind].step(opt, p + x, g + x, state, y - x, wd);
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
    float all = opt->kind == OPT_SGD ? opt->sgd.weight_decay : opt->adamw.weight_decay;
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
    return rules[opt->kind].name;
}

int cddp_optim_num_states(const cddp_optim *opt) {
    return opt->nstates;
}

float *cddp_optim_state(const cddp_optim *opt, int i, const char **name) {
    CDDP_CHECK(i >= 0 && i < opt->nstates, "optimizer state %d out of range (%d states)", i,
               opt->nstates);
    if (name) *name = rules[opt->kind].states[i];
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
