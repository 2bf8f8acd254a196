/* planted_no_fence.c: the CUDA-IPC communicator (src/ddp/ipc.c) with a bug planted, for the test
 * that must catch it: its fences no longer meet in the group's barrier, so a rank's queue waits
 * for the records another rank had made when it got there (maybe the last round's) and reads that
 * rank's scratch before the copy into it has run. Linked before the library, this ipc.c takes the
 * place of the library's own. */
#include "cddp/ipc.h"

#pragma GCC diagnostic ignored "-Wunused-value"
#define cddp_comm_barrier(group, timeout, err)                                                     \
    ((void)(group), (void)(timeout), (void)(err), CDDP_OK)
#include "../../src/ddp/ipc.c"
