/* curves.h: a training run's curves, kept as CSV and drawn as an SVG a person can read.
 *
 * The examples record the training loss of every step and an evaluation value (test accuracy,
 * validation loss) at chosen steps. curves_save writes OUT/loss.csv (step,epoch,loss) and
 * OUT/eval.csv (step,epoch,value) and draws OUT/curves.svg: the loss per step with its running
 * mean in one panel, the evaluation in the other, both against the step, with labelled axes,
 * ticks, and each epoch's start marked. A resumed run loads the CSVs first (curves_load), so the
 * picture shows the whole run.
 *
 * This is the examples' code, not the library's: a training program may plot any way it likes.
 */
#ifndef CDDP_EXAMPLES_CURVES_H
#define CDDP_EXAMPLES_CURVES_H

#include <cddp/ddp.h>
#include <cddp/summary.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct curve_point {
    int64_t step;
    int epoch;
    double value;
} curve_point;

typedef struct curves {
    const char *title;      /* the SVG's heading, e.g. "fashion_mnist: mlp, 2 ranks" */
    const char *eval_label; /* the evaluation's axis label, e.g. "test accuracy" */
    bool eval_is_fraction;  /* the evaluation lies in [0, 1]: shown as such */
    curve_point *loss, *eval;
    int64_t nloss, neval, cap_loss, cap_eval;
    cddp_summary *tb;    /* TensorBoard's event file, when open */
    int64_t compared_at; /* DDP's last straggler comparison written (curves_ddp) */
} curves;

/* Opens TensorBoard's event file in dir (created when missing); false with err saying why. */
bool curves_tensorboard(curves *c, const char *dir, cddp_error *err);
/* One scalar to TensorBoard (nothing without curves_tensorboard). A write that fails is said once
 * on stderr, and the run goes on without TensorBoard. */
void curves_scalar(curves *c, const char *tag, int64_t step, double value);
/* After a comparison of DDP's straggler attribution: ddp/slowest_rank_pct (how much longer the
 * slowest rank was busy a step than the median of the others) and ddp/straggler_rank (-1: none). */
void curves_ddp(curves *c, const cddp_ddp *ddp, int64_t step);

/* Appends a point; false when out of memory (the point is lost, nothing else). */
bool curves_add_loss(curves *c, int64_t step, int epoch, double loss);
bool curves_add_eval(curves *c, int64_t step, int epoch, double value);
/* Reads dir/loss.csv and dir/eval.csv into c (missing files: nothing to read). */
void curves_load(curves *c, const char *dir);
/* Writes dir/loss.csv, dir/eval.csv and dir/curves.svg; false with errno set when a file cannot be
 * written. */
bool curves_save(const curves *c, const char *dir);
/* Frees the points and closes the event file. */
void curves_free(curves *c);

#endif
