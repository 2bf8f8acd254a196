/* planted_no_fence.c: the CUDA-IPC transport (src/dcomm/ipc.c) with a bug planted, for the test
 * that must catch it: its fences no longer meet on the host (the meeting, an allgather of 4 words
 * a rank, answers at once as if every rank had come), so a rank's queue waits for the records
 * another rank had made when it got there (maybe the last round's) and reads that rank's scratch
 * before the copy into it has run. Linked before the library, this ipc.c takes the place of the
 * library's own. */
#include "cddp/dcomm.h"

#include <string.h>

static int planted_allgather(cddp_comm *g, const void *send, void *recv, int64_t count,
                             cddp_comm_dtype dtype, double timeout_s, cddp_error *err) {
    if (count != 4) return cddp_comm_allgather(g, send, recv, count, dtype, timeout_s, err);
    for (int r = 0; r < cddp_comm_size(g); r++) memcpy((int64_t *)recv + 4 * r, send, 32);
    return CDDP_OK;
}

#define cddp_comm_allgather planted_allgather
#include "../../src/dcomm/ipc.c"
