/* optim/internal.h: what an optimizer's file (sgd.c, adamw.c, lion.c) gives optim.c, and the
 * optimizer itself.
 *
 * An optimizer is a rule: its name, its state blocks' names, and its step over one range of the
 * flat blocks; its file has the public constructor, which checks the options and calls
 * cddp__optim_new with its rule and a copy of them. Its arithmetic is its devices' kernel
 * (cddp/device.h: cddp_device_sgd, cddp_device_adamw, cddp_device_lion). optim.c does the rest
 * for every rule alike: the state on the model's device, the model's shard (ZeRO-1), parameter
 * groups' weight decay, the step over the ranges, the accessors and checkpoints' view. */
#ifndef CDDP_OPTIM_INTERNAL_H
#define CDDP_OPTIM_INTERNAL_H

#include "cddp/optim.h"
#include "cddp/internal/device.h"

#define CDDP__OPTIM_MAX_STATES 2

typedef struct cddp__optim_rule {
    const char *name;
    const char *states[CDDP__OPTIM_MAX_STATES]; /* the names of the blocks it may keep */
    /* One update of elements [0, n) of a range: p, g and each state from the range's start; wd
     * the weight decay of its parameters. */
    void (*step)(cddp_optim *opt, float *p, const float *g, float **state, size_t n, float wd);
} cddp__optim_rule;

struct cddp_optim {
    const cddp__optim_rule *rule;
    cddp_device *dev; /* the model's */
    cddp_model *model;
    void *opts;             /* a copy of the options it was made with: the rule's own struct */
    float lr, weight_decay; /* weight_decay: the options', for parameters without their own */
    int64_t steps;
    int nstates;
    float *state[CDDP__OPTIM_MAX_STATES]; /* for the ranges below only, one after another */
    float *decay; /* per parameter weight decay (parameter groups), NULL: weight_decay for all */
    /* The ranges of the flat blocks this optimizer updates: the model's shard (ZeRO-1) or the
     * whole block, [begin, end) pairs; taken from the model at version. */
    int64_t *ranges;
    int nranges;
    bool sharded;
    uint64_t version;
    size_t state_numel;
};

/* A new optimizer of rule for m, keeping a copy of its options (opts, size bytes), with nstates
 * state blocks (at most the rule's), learning rate lr and weight decay wd; decay_matrices_only: no
 * weight decay on parameters of fewer than two dimensions (biases, norms). NULL with err on a bad
 * learning rate or out of memory. */
cddp_optim *cddp__optim_new(cddp_model *m, const cddp__optim_rule *rule, const void *opts,
                            size_t size, int nstates, float lr, float wd, bool decay_matrices_only,
                            cddp_error *err);

#endif
