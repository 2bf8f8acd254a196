/* data/internal.h: what the loader needs from the sampler beyond the public API. */
#ifndef CDDP_DATA_INTERNAL_H
#define CDDP_DATA_INTERNAL_H

#include "cddp/data.h"

/* Marks n more samples of the current epoch consumed, without counting as an explicit epoch
 * choice (so automatic epoch advance still applies at the next begin). */
void cddp__sampler_advance(cddp_sampler *s, int64_t n);
/* This rank's indices of the current epoch from where this run started it (the state's position):
 * all of them when it started at the beginning; as many as cddp_sampler_len at most. */
void cddp__sampler_run_indices(const cddp_sampler *s, int64_t *out);

#endif
