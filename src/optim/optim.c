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
};

cddp_adamw_options cddp_adamw_defaults(float lr) {
    return (cddp_adamw_options){lr, 0.9f, 0.999f, 1e-8f, 1e-2f};
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
    return opt;
}

void cddp_optim_destroy(cddp_optim *opt) {
    if (!opt) return;
    for (int i = 0; i < 2; i++) cddp_aligned_free(opt->state[i]);
    cddp_free(opt);
}

/* One straight loop per configuration: the per-element branches of a general loop would keep
 * the compiler from vectorising, and this pass over the whole model runs every step. */
static void sgd_step(cddp_optim *opt, float *restrict p, const float *restrict grad, size_t n) {
    const cddp_sgd_options *o = &opt->sgd;
    const float lr = opt->lr, wd = o->weight_decay, mom = o->momentum, damp = 1.0f - o->dampening;
    if (mom == 0.0f) {
        if (wd == 0.0f)
            for (size_t i = 0; i < n; i++) p[i] -= lr * grad[i];
        else
            for (size_t i = 0; i < n; i++) p[i] -= lr * (grad[i] + wd * p[i]);
        return;
    }
    float *restrict buf = opt->state[0];
    if (opt->steps == 0) /* PyTorch starts the buffer as a copy of the first gradient */
        for (size_t i = 0; i < n; i++) buf[i] = grad[i] + wd * p[i];
    else
        for (size_t i = 0; i < n; i++) buf[i] = mom * buf[i] + damp * (grad[i] + wd * p[i]);
    if (o->nesterov)
        for (size_t i = 0; i < n; i++) p[i] -= lr * (grad[i] + wd * p[i] + mom * buf[i]);
    else
        for (size_t i = 0; i < n; i++) p[i] -= lr * buf[i];
}

static void adamw_step(cddp_optim *opt, float *restrict p, const float *restrict grad, size_t n) {
    const cddp_adamw_options *o = &opt->adamw;
    float lr = opt->lr, b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    float *restrict m = opt->state[0], *restrict v = opt->state[1];
    /* Scalars in double, as Python computes them, then rounded once to float. */
    double t = (double)(opt->steps + 1);
    float step_size = (float)((double)lr / (1.0 - pow(b1, t)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    float decay = (float)(1.0 - (double)lr * (double)o->weight_decay);
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        p[i] *= decay;
        m[i] = m[i] * b1 + (1.0f - b1) * g;
        v[i] = v[i] * b2 + (1.0f - b2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * (m[i] / denom);
    }
}

void cddp_optim_step(cddp_optim *opt) {
    float *p = cddp_model_data(opt->model);
    const float *g = cddp_model_grad(opt->model);
    size_t n = cddp_model_numel(opt->model);
    cddp_model_notify(opt->model, CDDP_EVENT_OPTIM_BEGIN);
    if (opt->kind == OPT_SGD)
        sgd_step(opt, p, g, n);
    else
        adamw_step(opt, p, g, n);
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
