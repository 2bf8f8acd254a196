/* optim.c: SGD and AdamW on flat blocks (the rules are written out in cddp/optim.h).
 *
 * The loops run over the whole parameter block at once, which is what makes the flat layout pay:
 * one pass, no per-parameter dispatch. Arithmetic is float32 in the same order as PyTorch's
 * kernels so that results agree to rounding.
 */
#include "cddp/optim.h"
#include "cddp/core.h"

#include <math.h>
#include <string.h>

typedef enum { OPT_SGD, OPT_ADAMW } opt_kind;

struct cddp_optim {
    opt_kind kind;
    cddp_model *model;
    cddp_sgd_options sgd;
    cddp_adamw_options adamw;
    float lr;
    int64_t steps;
    int nstates;
    float *state[2];
    float *decay; /* per parameter weight decay (parameter groups), NULL: the options' for all */
};

cddp_adamw_options cddp_adamw_defaults(float lr) {
    return (cddp_adamw_options){
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f};
}

static cddp_optim *optim_new(cddp_model *m, opt_kind kind, int nstates, float lr, cddp_error *err) {
    if (!(lr >= 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL, "learning rate %g must be >= 0", (double)lr);
        return NULL;
    }
    size_t n = cddp_model_numel(m);
    cddp_optim *o = cddp_calloc(1, sizeof *o);
    if (!o) goto oom;
    o->kind = kind;
    o->model = m;
    o->lr = lr;
    o->nstates = nstates;
    for (int i = 0; i < nstates; i++) {
        o->state[i] = cddp_aligned_alloc(n * sizeof(float));
        if (!o->state[i]) goto oom;
        memset(o->state[i], 0, n * sizeof(float));
    }
    return o;
oom:
    cddp_optim_destroy(o);
    cddp_error_set(err, CDDP_ENOMEM, "out of memory for the optimizer state (%zu parameters)", n);
    return NULL;
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
    for (int i = 0; i < 2; i++) cddp_aligned_free(opt->state[i]);
    cddp_free(opt->decay);
    cddp_free(opt);
}

/* One straight loop per configuration: the per-element branches of a general loop would keep
 * the compiler from vectorising, and this pass over the whole model runs every step. */
static void sgd_step(cddp_optim *opt, float *restrict p, const float *restrict grad, size_t n,
                     float *restrict buf, float wd) {
    const cddp_sgd_options *o = &opt->sgd;
    const float lr = opt->lr, mom = o->momentum, damp = 1.0f - o->dampening;
    if (mom == 0.0f) {
        if (wd == 0.0f)
            for (size_t i = 0; i < n; i++) p[i] -= lr * grad[i];
        else
            for (size_t i = 0; i < n; i++) p[i] -= lr * (grad[i] + wd * p[i]);
        return;
    }
    if (opt->steps == 0) /* PyTorch starts the buffer as a copy of the first gradient */
        for (size_t i = 0; i < n; i++) buf[i] = grad[i] + wd * p[i];
    else
        for (size_t i = 0; i < n; i++) buf[i] = mom * buf[i] + damp * (grad[i] + wd * p[i]);
    if (o->nesterov)
        for (size_t i = 0; i < n; i++) p[i] -= lr * (grad[i] + wd * p[i] + mom * buf[i]);
    else
        for (size_t i = 0; i < n; i++) p[i] -= lr * buf[i];
}

/* The update loop, vectorised (see CDDP_SIMD_CLONES). */
CDDP_SIMD_CLONES static void adamw_loop(float *restrict p, const float *restrict grad, size_t n,
                                        float *restrict m, float *restrict v, float b1, float b2,
                                        float eps, float step_size, float bc2_sqrt, float decay) {
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        p[i] *= decay;
        m[i] = m[i] * b1 + (1.0f - b1) * g;
        v[i] = v[i] * b2 + (1.0f - b2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * (m[i] / denom);
    }
}

static void adamw_step(cddp_optim *opt, float *restrict p, const float *restrict grad, size_t n,
                       float *restrict m, float *restrict v, float wd) {
    const cddp_adamw_options *o = &opt->adamw;
    float lr = opt->lr;
    /* Scalars in double, as Python computes them, then rounded once to float. */
    double t = (double)(opt->steps + 1);
    float step_size = (float)((double)lr / (1.0 - pow(o->beta1, t)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(o->beta2, t));
    float decay = (float)(1.0 - (double)lr * (double)wd);
    adamw_loop(p, grad, n, m, v, o->beta1, o->beta2, o->eps, step_size, bc2_sqrt, decay);
}

void cddp_optim_step(cddp_optim *opt) {
    float *p = cddp_model_data(opt->model);
    const float *g = cddp_model_grad(opt->model);
    size_t n = cddp_model_numel(opt->model);
    cddp_model_notify(opt->model, CDDP_EVENT_OPTIM_BEGIN);
    float all = opt->kind == OPT_SGD ? opt->sgd.weight_decay : opt->adamw.weight_decay;
    /* Runs of parameters with one weight decay (all of them without parameter groups), each a
     * range of the flat blocks, one straight pass each. */
    int np = cddp_model_num_params(opt->model);
    for (int i = 0, j; i < np || (i == 0 && np == 0); i = j) {
        float wd = opt->decay ? opt->decay[i] : all;
        for (j = i + 1; opt->decay && j < np && opt->decay[j] == wd;) j++;
        if (!opt->decay) j = np ? np : 1;
        size_t lo = np ? cddp_model_param_offset(opt->model, i) : 0;
        size_t hi = j < np ? cddp_model_param_offset(opt->model, j) : n;
        if (opt->kind == OPT_SGD)
            sgd_step(opt, p + lo, g + lo, hi - lo, opt->state[0] ? opt->state[0] + lo : NULL, wd);
        else
            adamw_step(opt, p + lo, g + lo, hi - lo, opt->state[0] + lo, opt->state[1] + lo, wd);
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
    return opt->kind == OPT_SGD ? "sgd" : "adamw";
}

int cddp_optim_num_states(const cddp_optim *opt) {
    return opt->nstates;
}

float *cddp_optim_state(const cddp_optim *opt, int i, const char **name) {
    CDDP_CHECK(i >= 0 && i < opt->nstates, "optimizer state %d out of range (%d states)", i,
               opt->nstates);
    if (name)
        *name = opt->kind == OPT_SGD ? "momentum_buffer" : (i == 0 ? "exp_avg" : "exp_avg_sq");
    return opt->state[i];
}

/* The sum of squares in double, in 8 lanes that vectorise (the order is fixed: the same result
 * on every machine and rank). */
CDDP_SIMD_CLONES static double sum_squares(const float *g, size_t n) {
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)g[i + j] * (double)g[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)g[i] * (double)g[i];
    double s = 0.0;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

double cddp_clip_grad_norm(cddp_model *m, double max_norm) {
    float *g = cddp_model_grad(m);
    size_t n = cddp_model_numel(m);
    double norm = sqrt(sum_squares(g, n)), coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef;
        for (size_t i = 0; i < n; i++) g[i] *= c;
    }
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
