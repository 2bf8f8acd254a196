/* common.h: what the benchmarks share. */
#ifndef CDDP_BENCH_COMMON_H
#define CDDP_BENCH_COMMON_H

#include <cddp/cddp.h>

#include <stdio.h>
#include <stdlib.h>

/* The seeds' MLP, 784-512-512-10, seeded 0; with flatten, it takes (B,1,28,28) images. Exits on
 * failure (benchmarks are programs). */
static inline cddp_model *bench_mlp_model(bool flatten) {
    cddp_model *m = cddp_model_create();
    if (flatten) cddp_model_add(m, NULL, cddp_nn_flatten());
    cddp_model_add(m, NULL, cddp_nn_linear(784, 512));
    cddp_model_add(m, NULL, cddp_nn_relu());
    cddp_model_add(m, NULL, cddp_nn_linear(512, 512));
    cddp_model_add(m, NULL, cddp_nn_relu());
    cddp_model_add(m, NULL, cddp_nn_linear(512, 10));
    if (cddp_model_build(m, 0) != CDDP_OK) {
        fprintf(stderr, "bench: %s\n", cddp_model_error(m));
        exit(1);
    }
    return m;
}

#endif
