/* cddp/stop.h: a stop request that loses no work.
 *
 * cddprun sends its workers SIGTERM when it is stopped (Ctrl-C, a scheduler's cancel), as do
 * Slurm before it preempts or requeues a job and at the end of a job's time limit; Ctrl-C in a
 * terminal sends SIGINT. Left alone, either ends every rank at once and the steps since the last
 * checkpoint are lost. A program that calls cddp_stop_watch first in main takes them as a request
 * instead: every rank finishes the step it is in, the ranks agree on it (one 4-byte allreduce a
 * step), save, and end:
 *
 *     int main(void) {
 *         cddp_stop_watch(NULL);                 first, before anything makes a thread
 *         ... the group, the model, the data ...
 *         cddp_stop_catch(rank == 0 ? "stopping after this step\n" : NULL);
 *         for (each step) {
 *             ... forward, backward, optimizer step ...
 *             int sig;
 *             if (cddp_stop_agreed(group, &sig, &err) != CDDP_OK) fail;
 *             if (sig) { save a checkpoint; return 128 + sig; }
 *         }
 *         cddp_stop_release();                   what follows cannot stop midway
 *         ... the last evaluation, the final save ...
 *     }
 *
 * A second signal, or one outside cddp_stop_catch .. cddp_stop_release, ends the process at once
 * as if never caught (its default action: the exit status says which signal). A signal the
 * process was started to ignore (a shell script's background job ignores SIGINT) stays ignored.
 * Give cddprun a --grace_period that a step and a save fit in: after it, cddprun SIGKILLs.
 *
 * How: cddp_stop_watch blocks SIGTERM and SIGINT in the calling thread, so that every thread made
 * after it (cddp's, oneDNN's, OpenMP's, the program's) inherits the mask, and starts a thread of
 * its own that takes them with sigwait. No handler then runs on a thread in the middle of a
 * kernel: with one on the training thread, 3 of 10 runs stopped at random moments aborted on a
 * corrupted heap (code that keeps data below its stack pointer, beyond the red zone a handler's
 * frame respects, oneDNN's JIT GEMM most likely). Threads made before main (a BLAS library's
 * pool, started by its constructor) do not block them; the signal may land on one of them, where
 * a handler takes it the same way.
 */
#ifndef CDDP_STOP_H
#define CDDP_STOP_H

#include "cddp/comm.h"

/* Takes SIGTERM and SIGINT on a thread of its own from now on (see above). Call it first in main,
 * once. When the thread cannot be started, the signals keep their default action and the call
 * fails saying so (err may be NULL): the program runs on, as without it. */
CDDP_API int cddp_stop_watch(cddp_error *err);

/* From now on, the first signal is a request to stop: noted for cddp_stop_agreed, and say (when
 * not NULL; it must outlive the request) written on stderr when it comes, with a newline before
 * it (a terminal's ^C). */
CDDP_API void cddp_stop_catch(const char *say);

/* From now on, a signal ends the process at once; a request noted since the last
 * cddp_stop_agreed ends it now, as if never caught. */
CDDP_API void cddp_stop_release(void);

/* Collective on group (every rank, after each step; NULL: this process alone): *sig is the signal
 * any rank was asked to stop by (the largest number of them), or 0. On a failure of the group,
 * its error (*sig 0). */
CDDP_API int cddp_stop_agreed(cddp_comm *group, int *sig, cddp_error *err);

#endif
