/* nccl_test.c: one rank of tests/nccl/nccl_test.sh: cddp_nccl over the launcher's group on the
 * CPU device (with tests/nccl/fake_nccl.c as NCCL): forms the communicator, allreduces 1000 floats
 * (rank r holds (r + 1)(i + 1)), waits, checks the sums, and says what happened in one line (an
 * error as cddp words it, with its rank).
 *
 *   nccl_test [TIMEOUT_S [DEVICE]]
 *
 * DEVICE (default cpu): where the buffer lives (cuda: the local rank's GPU, with NCCL itself).
 * Exit 0 when the sums are right; 3 when the communicator did not form; 4 when the collective
 * failed; 5 when a sum is wrong; 1 when the group did not form. */
#include <cddp/cddp.h>
#include <cddp/nccl.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) {
        fprintf(stderr, "nccl_test: %s\n", err.msg);
        return 1;
    }
    int rank = cddp_comm_rank(g), world = cddp_comm_size(g), rc = 0;
    cddp_nccl_options o = {.timeout_s = argc > 1 ? atof(argv[1]) : 0};
    cddp_device *dev = cddp_device_for_rank(argc > 2 ? argv[2] : "cpu", &err);
    if (!dev) {
        fprintf(stderr, "nccl_test: %s\n", err.msg);
        return 1;
    }
    double t0 = cddp_now_s();
    cddp_nccl *n = cddp_nccl_create(g, dev, &o, &err);
    if (!n) {
        printf("no communicator after %.1f s: %s\n", cddp_now_s() - t0, err.msg);
        rc = 3;
    } else {
        enum { N = 1000 };
        static float v[N];
        for (int i = 0; i < N; i++) v[i] = (float)((rank + 1) * (i + 1));
        /* the buffer on the device: v itself on the CPU, else a copy there and back */
        bool host = cddp_device_host_accessible(dev);
        float *d = host ? v : cddp_device_alloc(dev, sizeof v, &err);
        if (!d || (!host && cddp_device_upload(dev, d, v, sizeof v, &err) != CDDP_OK) ||
            cddp_nccl_allreduce(n, d, d, N, CDDP_COMM_F32, CDDP_COMM_SUM, &err) != CDDP_OK ||
            cddp_nccl_wait(n, &err) != CDDP_OK ||
            (!host && cddp_device_download(dev, v, d, sizeof v, &err) != CDDP_OK)) {
            printf("allreduce: %s\n", err.msg);
            rc = 4;
        } else {
            for (int i = 0; i < N && !rc; i++)
                if (v[i] != (float)(world * (world + 1) / 2 * (i + 1))) {
                    printf("rank %d: element %d is %g, not %d\n", rank, i, v[i],
                           world * (world + 1) / 2 * (i + 1));
                    rc = 5;
                }
            if (!rc)
                printf("rank %d: allreduce ok (%d ranks, NCCL %d, %s)\n", rank, world,
                       cddp_nccl_version(NULL), cddp_device_name(dev));
            /* after a failure every call reports it; after success a second one works too */
            if (!rc && cddp_nccl_allreduce(n, d, d, 0, CDDP_COMM_F32, CDDP_COMM_SUM, &err)) {
                printf("an empty allreduce: %s\n", err.msg);
                rc = 4;
            }
        }
        if (!host) cddp_device_free(dev, d);
        cddp_nccl_destroy(n);
    }
    fflush(stdout);
    cddp_comm_destroy(g);
    return rc;
}
