/* summary.h: training curves where people look at them: TensorBoard's event files.
 *
 * A summary writer appends scalars (a tag, a step, a value: "loss" at step 100 is 2.13) to an
 * event file in a folder, as TensorFlow's and PyTorch's SummaryWriter do, so that `tensorboard
 * --logdir DIR` draws them while the run goes on. The file is
 * DIR/events.out.tfevents.<seconds>.<host>.<pid>.cddp: TFRecord records (a little-endian length,
 * its masked CRC-32C, the data, their masked CRC-32C), each holding an Event protocol buffer: the
 * first the file's version ("brain.Event:2"), then one per scalar with its wall time, step and a
 * Summary value (tag, simple_value as a float). Every scalar is flushed to the file as it is
 * written; a run that resumes opens a new file in the same folder, and TensorBoard reads the
 * folder's files in turn.
 */
#ifndef CDDP_SUMMARY_H
#define CDDP_SUMMARY_H

#include "cddp/core.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cddp_summary cddp_summary;

/* Creates dir (and its parents) when missing and a new event file in it. NULL with err saying
 * why (a folder that cannot be made, a file that cannot be written). */
CDDP_API cddp_summary *cddp_summary_open(const char *dir, cddp_error *err);
/* Appends one scalar: tag (at most 1000 bytes) at step, value stored as a float. */
CDDP_API int cddp_summary_scalar(cddp_summary *s, const char *tag, int64_t step, double value,
                                 cddp_error *err);
/* The event file's path (valid until close). */
CDDP_API const char *cddp_summary_path(const cddp_summary *s);
/* Closes the file; accepts NULL. CDDP_OK, or the error of the last write. */
CDDP_API int cddp_summary_close(cddp_summary *s, cddp_error *err);

#ifdef __cplusplus
}
#endif
#endif
