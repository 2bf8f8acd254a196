/* cddp/flight.h: the flight recorder, and the report that reads it.
 *
 * Every process keeps its last CDDP_FLIGHT_EVENTS (4096; 0: off) collectives and step marks in
 * memory, always: each collective of a group made by cddp_comm_create (its sequence number, op,
 * dtype, count, bytes, the label DDP gives it: "bucket 3: h.11.mlp.c_fc.weight ..
 * h.11.ln_2.bias", when it was queued, started and ended, and its state), and each phase a
 * training step enters (DDP marks its forward, backward, wait for buckets and optimizer step with
 * the step's number; a program may add its own). Recording costs a lock and a copy of ~160 bytes
 * per collective or mark.
 *
 * The record is written, as CDDP_FLIGHT_DIR/rank-R.json (default $TMPDIR/cddp-flight-RUN, /tmp
 * without TMPDIR, RUN being CDDP_RUN_ID, SLURM_JOB_ID or PMIX_NAMESPACE (mpirun's job), else
 * "uid" and the user's id; cddprun points it into its --logdir), when a
 * group fails (a dead or aborted peer, a timeout, ranks that called different collectives), when
 * a collective stalls (CDDP_STALL_WARN_S), when the process gets SIGUSR1 (the handler is
 * installed with the first group, unless the program has one of its own), and when the program
 * calls cddp_flight_dump. cddprun asks every worker for its record when a job fails or stalls,
 * and with `cddprun --dump` / `--status` from another shell; under mpirun or srun, each rank
 * writes its own on the same triggers.
 *
 * cddp_flight_report reads a folder of records and says, in words, where each rank stands and
 * who is behind (the `cddp-trace` tool and cddprun print it): the ranks waiting in a collective
 * and the one it waits for, a rank in another step's phase, a rank that called another
 * collective at the same sequence number, a rank that left no record; it can also write the
 * records as one Chrome trace (Perfetto: a row per rank, training and communication threads).
 */
#ifndef CDDP_FLIGHT_H
#define CDDP_FLIGHT_H

#include "cddp/comm.h"
#include "cddp/core.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks that this process enters a phase of step `step` ("forward", "data"; at most 63
 * characters kept): it lasts until the next mark. DDP marks its own phases. */
CDDP_API void cddp_flight_mark(const char *phase, int64_t step);
/* Names the next collective this thread issues (at most 87 characters kept). */
CDDP_API void cddp_flight_label(const char *label);
/* Collectives that do not go through a group's own calls (cddp/dcomm.h's, on a device's memory:
 * NCCL, CUDA IPC, host copies; cddp_dcomm records its own) are recorded as a group of their own:
 * cddp_flight_group_open says which device and transport carry them (at most 23 and 15
 * characters kept) and gives the group's number (0: the recorder is off; every rank opens its
 * groups in the same order, so the numbers agree). cddp_flight_issued records a collective
 * ("allreduce", "reduce_scatter", "allgather", ...) when it is handed to the device (state
 * "started", its sequence number the group's next, the label of cddp_flight_label), and
 * cddp_flight_ended says when it was known done (status CDDP_OK) or failed: until then a dump
 * shows it started, in flight on the device or done and not yet asked. */
CDDP_API int cddp_flight_group_open(const char *device, const char *transport);
CDDP_API uint64_t cddp_flight_issued(int group, const char *kind, cddp_comm_op op,
                                     cddp_comm_dtype dtype, int64_t count);
CDDP_API void cddp_flight_ended(uint64_t entry, int status);
/* Writes the record now, saying why; the path written into path (may be NULL) of n bytes. */
CDDP_API int cddp_flight_dump(const char *why, char *path, size_t n, cddp_error *err);
/* The folder records are written to (CDDP_FLIGHT_DIR or its default) into out. */
CDDP_API void cddp_flight_dir(char *out, size_t n);

/* Reads the records rank-*.json in dir and writes the report to out; with timeline (not NULL),
 * also every record's events as one Chrome trace there. world: the job's size when known (ranks
 * without a record are then named), 0: the largest in the records. Returns CDDP_ENOENT when dir
 * holds no record. */
CDDP_API int cddp_flight_report(const char *dir, int world, FILE *out, const char *timeline,
                                cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
