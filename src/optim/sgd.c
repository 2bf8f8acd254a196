/* sgd.c: SGD with momentum, dampening, Nesterov and weight decay (PyTorch's rule, cddp/optim.h),
 * on the devices' sgd kernel. */
#include "optim/internal.h"

static void step(cddp_optim *opt, float *p, const float *g, float **state, size_t n, float wd) {
    const cddp_sgd_options *o = opt->opts;
    cddp_sgd_hparams h = {.lr = opt->lr,
                          .momentum = o->momentum,
                          .dampening = o->dampening,
                          .weight_decay = wd,
                          .nesterov = o->nesterov,
                          .first = opt->steps == 0};
    cddp_device_sgd(opt->dev, p, g, o->momentum != 0.0f ? state[0] : NULL, n, &h);
}

static const cddp__optim_rule rule = {"sgd", {"momentum_buffer"}, step};

cddp_optim *cddp_optim_sgd(cddp_model *m, const cddp_sgd_options *opts, cddp_error *err) {
    const cddp_sgd_options *o = opts;
    if (o->momentum < 0.0f || o->weight_decay < 0.0f) {
        cddp_error_set(err, CDDP_EINVAL, "SGD: momentum %g and weight_decay %g must be >= 0",
                       (double)o->momentum, (double)o->weight_decay);
        return NULL;
    }
    if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f)) {
        cddp_error_set(err, CDDP_EINVAL, "SGD: nesterov needs momentum > 0 and dampening 0");
        return NULL;
    }
    return cddp__optim_new(m, &rule, o, sizeof *o, o->momentum != 0.0f ? 1 : 0, o->lr,
                           o->weight_decay, false, err);
}
