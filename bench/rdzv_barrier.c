/* rdzv_barrier.c: a worker that joins the launcher's store and waits at a barrier with every
 * other rank, then exits: the smallest real rendezvous, for bench/launch_bench.sh.
 *
 *   cddprun --nproc_per_node 2 build/bin/rdzv_barrier
 */
#include <cddp/cddp.h>

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const char *addr = getenv("CDDP_STORE_ADDR"), *port = getenv("CDDP_STORE_PORT");
    const char *world = getenv("WORLD_SIZE");
    if (!addr || !port || !world) {
        fprintf(stderr, "rdzv_barrier: run me under cddprun\n");
        return 2;
    }
    cddp_error err = {0};
    cddp_store_options o = {addr, atoi(port), getenv("CDDP_STORE_TOKEN"), 30, NULL};
    cddp_store *s = cddp_store_connect(&o, &err);
    int64_t arrived = 0;
    if (!s || cddp_store_add(s, "barrier/count", 1, &arrived, &err)) goto fail;
    /* The last to arrive opens the barrier for everyone. */
    if (arrived == atoll(world) && cddp_store_set_str(s, "barrier/open", "1", &err)) goto fail;
    const char *key = "barrier/open";
    if (cddp_store_wait(s, &key, 1, 30, &err)) goto fail;
    cddp_store_close(s);
    return 0;
fail:
    fprintf(stderr, "rdzv_barrier: %s\n", cddp_error_msg(&err));
    cddp_store_close(s);
    return 1;
}
