/* lion.c: Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023: the sign of
 * an interpolated momentum, decoupled weight decay; the rule in cddp/optim.h), on the devices'
 * lion kernel. One state block: the momentum, "exp_avg". */
#include "optim/internal.h"

cddp_lion_options cddp_lion_defaults(float lr) {
    return (cddp_lion_options){.lr = lr, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.0f};
}

static void step(cddp_optim *opt, float *p, const float *g, float **state, size_t n, float wd) {
    const cddp_lion_options *o = opt->opts;
    cddp_lion_hparams h = {.lr = opt->lr,
                           .beta1 = o->beta1,
                           .beta2 = o->beta2,
                           .decay = (float)(1.0 - (double)opt->lr * (double)wd)};
    cddp_device_lion(opt->dev, p, g, state[0], n, &h);
}

static const cddp__optim_rule rule = {"lion", {"exp_avg"}, step};

cddp_optim *cddp_optim_lion(cddp_model *m, const cddp_lion_options *opts, cddp_error *err) {
    const cddp_lion_options *o = opts;
    if (!(o->beta1 >= 0.0f && o->beta1 <= 1.0f && o->beta2 >= 0.0f && o->beta2 <= 1.0f) ||
        !(o->weight_decay >= 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL,
                       "Lion: betas (%g, %g) must be in [0, 1] and weight_decay %g >= 0",
                       (double)o->beta1, (double)o->beta2, (double)o->weight_decay);
        return NULL;
    }
    return cddp__optim_new(m, &rule, o, sizeof *o, 1, o->lr, o->weight_decay,
                           o->decay_matrices_only, err);
}
