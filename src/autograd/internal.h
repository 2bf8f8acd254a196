/* autograd/internal.h: what autograd's files share. */
#ifndef CDDP_AUTOGRAD_INTERNAL_H
#define CDDP_AUTOGRAD_INTERNAL_H

#include "cddp/autograd.h"
#include "cddp/device.h"

/* cddp_backward from out, whose gradient is seed (out's numel floats on its device, copied): a
 * checkpointed segment's backward on its scratch context. Inside another backward, it fires no
 * ready hook (backward.c). */
int cddp__backward_from(cddp_ctx *ctx, cddp_tensor *out, const float *seed);

#endif
