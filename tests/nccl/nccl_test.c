/* nccl_test.c: one rank of tests/nccl/nccl_test.sh: cddp/dcomm.h's nccl transport over the
 * launcher's group on the CPU device (with tests/nccl/fake_nccl.c as NCCL): forms the communicator,
 * allreduces 1000 floats (rank r holds (r + 1)(i + 1)), waits, checks the sums, and says what
 * happened in one line (an error as cddp words it, with its rank).
 *
 *   nccl_test [TIMEOUT_S [DEVICE]]
 *
 * DEVICE (default cpu): where the buffer lives (cuda: the local rank's GPU, with NCCL itself).
 * On a device the host cannot read, a second allreduce checks the order of the queues: its input
 * is written by the device's queue behind some milliseconds of other work, and its output (out of
 * place) is read back there after cddp_dcomm_join, so a collective that does not wait for the
 * device's work reads zeros and a join that does not hold the device's queue reads NaNs; the
 * watchdog is handed it before the read (cddp_dcomm_watch: the host does not wait).
 * Exit 0 when the sums are right; 3 when the communicator did not form; 4 when the collective
 * failed; 5 when a sum is wrong; 1 when the group did not form. */
#include <cddp/cddp.h>
#include <cddp/internal/device.h>

#include <stdio.h>
#include <stdlib.h>

enum { N = 1000 };

/* The sums of rank r's (r + 1)(i + 1): 0 when they are right, else 5 and what is wrong. */
static int sums_wrong(const float *v, int rank, int world, const char *what) {
    for (int i = 0; i < N; i++)
        if (v[i] != (float)(world * (world + 1) / 2 * (i + 1))) {
            printf("rank %d: %s: element %d is %g, not %d\n", rank, what, i, v[i],
                   world * (world + 1) / 2 * (i + 1));
            return 5;
        }
    return 0;
}

/* The allreduce of send into recv (out of place), send written by the device's queue after
 * 200 passes over 64 MiB, recv read back by the device's queue after cddp_dcomm_join. */
static int ordered(cddp_dcomm *n, cddp_device *dev, const float *v, int rank, int world,
                   cddp_error *err) {
    size_t big = (size_t)16 << 20;
    float *slow = cddp_device_alloc(dev, big * sizeof(float), err);
    float *src = cddp_device_alloc(dev, N * sizeof(float), err);
    float *send = cddp_device_alloc(dev, N * sizeof(float), err);
    float *recv = cddp_device_alloc(dev, N * sizeof(float), err);
    float got[N];
    int rc = slow && src && send && recv ? CDDP_OK : 4;
    if (rc == CDDP_OK && (cddp_device_memset(dev, slow, 0, big * sizeof(float), err) != CDDP_OK ||
                          cddp_device_memset(dev, send, 0, N * sizeof(float), err) != CDDP_OK ||
                          cddp_device_memset(dev, recv, 0xff, N * sizeof(float), err) != CDDP_OK ||
                          cddp_device_upload(dev, src, v, N * sizeof(float), err) != CDDP_OK ||
                          cddp_device_synchronize(dev, err) != CDDP_OK))
        rc = 4;
    for (int i = 0; rc == CDDP_OK && i < 200; i++) cddp_device_scale(dev, slow, big, 1.0f);
    if (rc == CDDP_OK &&
        (cddp_device_copy(dev, send, src, N * sizeof(float), err) != CDDP_OK ||
         cddp_dcomm_allreduce(n, send, recv, N, CDDP_COMM_F32, CDDP_COMM_SUM, err) != CDDP_OK ||
         cddp_dcomm_join(n, err) != CDDP_OK || cddp_dcomm_watch(n, err) != CDDP_OK ||
         cddp_device_download(dev, got, recv, sizeof got, err) != CDDP_OK ||
         cddp_dcomm_wait(n, err) != CDDP_OK))
        rc = 4;
    if (rc == 4) printf("the ordered allreduce: %s\n", err->msg);
    if (rc == CDDP_OK) rc = sums_wrong(got, rank, world, "the ordered allreduce");
    cddp_device_free(dev, slow);
    cddp_device_free(dev, src);
    cddp_device_free(dev, send);
    cddp_device_free(dev, recv);
    return rc;
}

int main(int argc, char **argv) {
    cddp_error err = {0};
    cddp_comm *g = cddp_comm_create(NULL, &err);
    if (!g) {
        fprintf(stderr, "nccl_test: %s\n", err.msg);
        return 1;
    }
    int rank = cddp_comm_rank(g), world = cddp_comm_size(g), rc = 0;
    cddp_dcomm_options o = {.transport = "nccl", .timeout_s = argc > 1 ? atof(argv[1]) : 0};
    cddp_device *dev = cddp_device_for_rank(argc > 2 ? argv[2] : "cpu", &err);
    if (!dev) {
        fprintf(stderr, "nccl_test: %s\n", err.msg);
        return 1;
    }
    double t0 = cddp_now_s();
    cddp_dcomm *n = cddp_dcomm_create(g, dev, &o, &err);
    if (!n) {
        printf("no communicator after %.1f s: %s\n", cddp_now_s() - t0, err.msg);
        rc = 3;
    } else {
        static float v[N];
        for (int i = 0; i < N; i++) v[i] = (float)((rank + 1) * (i + 1));
        /* the buffer on the device: v itself on the CPU, else a copy there and back */
        bool host = cddp_device_host_accessible(dev);
        float *d = host ? v : cddp_device_alloc(dev, sizeof v, &err);
        if (!d || (!host && cddp_device_upload(dev, d, v, sizeof v, &err) != CDDP_OK) ||
            cddp_dcomm_allreduce(n, d, d, N, CDDP_COMM_F32, CDDP_COMM_SUM, &err) != CDDP_OK ||
            cddp_dcomm_wait(n, &err) != CDDP_OK || cddp_dcomm_watch(n, &err) != CDDP_OK ||
            (!host && cddp_device_download(dev, v, d, sizeof v, &err) != CDDP_OK)) {
            printf("allreduce: %s\n", err.msg);
            rc = 4;
        } else {
            rc = sums_wrong(v, rank, world, "allreduce");
            if (!rc && !host) {
                for (int i = 0; i < N; i++) v[i] = (float)((rank + 1) * (i + 1));
                rc = ordered(n, dev, v, rank, world, &err);
            }
            if (!rc)
                printf("rank %d: allreduce ok (%d ranks, %s, %s%s)\n", rank, world,
                       cddp_dcomm_transport_name(n), cddp_device_name(dev),
                       host ? "" : "; ordered with the device's queue");
            /* after a failure every call reports it; after success a second one works too */
            if (!rc && cddp_dcomm_allreduce(n, d, d, 0, CDDP_COMM_F32, CDDP_COMM_SUM, &err)) {
                printf("an empty allreduce: %s\n", err.msg);
                rc = 4;
            }
        }
        if (!host) cddp_device_free(dev, d);
        cddp_dcomm_destroy(n);
    }
    fflush(stdout);
    cddp_comm_destroy(g);
    return rc;
}
