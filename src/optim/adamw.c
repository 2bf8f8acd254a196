/* adamw.c: AdamW, Adam with decoupled weight decay (PyTorch's rule, cddp/optim.h), on the
 * devices' adamw kernel. */
#include "optim/internal.h"

#include <math.h>

cddp_adamw_options cddp_adamw_defaults(float lr) {
    return (cddp_adamw_options){
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f};
}

static void step(cddp_optim *opt, float *p, const float *g, float **state, size_t n, float wd) {
    const cddp_adamw_options *o = opt->opts;
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

static const cddp__optim_rule rule = {"adamw", {"exp_avg", "exp_avg_sq"}, step};

cddp_optim *cddp_optim_adamw(cddp_model *m, const cddp_adamw_options *opts, cddp_error *err) {
    const cddp_adamw_options *o = opts;
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f && o->beta2 >= 0.0f && o->beta2 < 1.0f) ||
        !(o->eps >= 0.0f) || !(o->weight_decay >= 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL,
                       "AdamW: betas (%g, %g) must be in [0, 1), eps %g and weight_decay %g >= 0",
                       (double)o->beta1, (double)o->beta2, (double)o->eps, (double)o->weight_decay);
        return NULL;
    }
    return cddp__optim_new(m, &rule, o, sizeof *o, 2, o->lr, o->weight_decay,
                           o->decay_matrices_only, err);
}
