/* common.h: what the benchmarks share. */
#ifndef CDDP_BENCH_COMMON_H
#define CDDP_BENCH_COMMON_H

#include <cddp/cddp.h>

#include <stdio.h>
#include <stdlib.h>

/* m built, seeded 0; exits on failure (benchmarks are programs). */
static inline cddp_model *bench_built(cddp_model *m) {
    if (cddp_model_build(m, 0) != CDDP_OK) {
        fprintf(stderr, "bench: %s\n", cddp_model_error(m));
        exit(1);
    }
    return m;
}

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
    return bench_built(m);
}

/* fashion_mnist's CNN (examples/fashion_mnist.c): conv 1->16 3x3, ReLU, pool 2, conv 16->32 3x3,
 * ReLU, pool 2, fc 1568->128, ReLU, fc 128->10; it takes (B,1,28,28). */
static inline cddp_model *bench_cnn_model(void) {
    cddp_model *m = cddp_model_create();
    cddp_model_add(m, NULL, cddp_nn_conv2d(1, 16, 3, 1, 1));
    cddp_model_add(m, NULL, cddp_nn_relu());
    cddp_model_add(m, NULL, cddp_nn_max_pool2d(2, 2));
    cddp_model_add(m, NULL, cddp_nn_conv2d(16, 32, 3, 1, 1));
    cddp_model_add(m, NULL, cddp_nn_relu());
    cddp_model_add(m, NULL, cddp_nn_max_pool2d(2, 2));
    cddp_model_add(m, NULL, cddp_nn_flatten());
    cddp_model_add(m, NULL, cddp_nn_linear(32 * 7 * 7, 128));
    cddp_model_add(m, NULL, cddp_nn_relu());
    cddp_model_add(m, NULL, cddp_nn_linear(128, 10));
    return bench_built(m);
}

/* fashion_mnist's ResNet (examples/fashion_mnist.c): a 3x3 stem and one basic block per stage
 * at 16, 32 and 64 channels; it takes (B,1,28,28). */
static inline cddp_model *bench_resnet_model(void) {
    cddp_resnet_config c = {.in_channels = 1, .classes = 10, .widths = {16, 32, 64}, .blocks = 1};
    cddp_error err = {0};
    cddp_model *m = cddp_model_create_with(cddp_nn_resnet(&c), &err);
    if (!m) {
        fprintf(stderr, "bench: %s\n", err.msg);
        exit(1);
    }
    return bench_built(m);
}

#endif
