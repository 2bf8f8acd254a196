/* check.h: what the multi-process checks in tests/ddp/ share: this process's rank and the world
 * size, and FAIL, which names the program (CHECK_NAME) and the rank, says why and exits 1. */
#ifndef CDDP_TESTS_DDP_CHECK_H
#define CDDP_TESTS_DDP_CHECK_H

#include <cddp/cddp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "%s rank %d: ", CHECK_NAME, rank);                                         \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#endif
