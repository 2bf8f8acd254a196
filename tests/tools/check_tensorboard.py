"""check_tensorboard.py EVENT_DIR OUT_DIR EVAL_TAG RATE_TAG [FILES]: TensorBoard's own reader
(PyPI's tensorboard) reads the event files cddp wrote in EVENT_DIR: every record's CRC-32C holds
(TensorBoard's record reader checks them and stops at a bad one), and the scalars are what the run
wrote to its CSVs: "loss" is OUT_DIR/loss.csv and EVAL_TAG is OUT_DIR/eval.csv, step for step,
within their six printed digits; "lr" and RATE_TAG are positive at every loss step. FILES: how
many event files the folder must hold (a resumed run adds one)."""
import csv
import glob
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader


def rows(path):
    with open(path) as f:
        return [(int(r[0]), float(r[2])) for r in list(csv.reader(f))[1:]]


def same(tag, got, want):
    assert [s.step for s in got] == [s for s, _ in want], \
        f"{tag}: steps {[s.step for s in got][:8]}... against the CSV's {[s for s, _ in want][:8]}..."
    for s, (step, v) in zip(got, want):
        assert abs(s.value - v) <= 1e-5 * max(1.0, abs(v)), f"{tag} at step {step}: {s.value} against {v}"


def main():
    events, out, eval_tag, rate_tag = sys.argv[1:5]
    files = sorted(glob.glob(os.path.join(events, "events.out.tfevents.*")))
    want_files = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    assert len(files) == want_files, f"{len(files)} event files in {events}, expected {want_files}"
    records = 0
    for f in files:  # every record, its CRCs checked by TensorBoard's reader
        n = sum(1 for _ in event_file_loader.EventFileLoader(f).Load())
        assert n >= 2, f"{f}: {n} events"
        records += n
    acc = event_accumulator.EventAccumulator(events, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "lr", eval_tag, rate_tag} <= tags, f"scalars {sorted(tags)}"
    scalars = sum(len(acc.Scalars(t)) for t in tags)
    assert records == scalars + len(files), f"{records} records for {scalars} scalars in {len(files)} files"
    same("loss", acc.Scalars("loss"), rows(os.path.join(out, "loss.csv")))
    same(eval_tag, acc.Scalars(eval_tag), rows(os.path.join(out, "eval.csv")))
    loss_steps = [s.step for s in acc.Scalars("loss")]
    for t in ("lr", rate_tag):
        got = acc.Scalars(t)
        assert all(s.value > 0 for s in got), f"{t} is not positive everywhere"
    assert [s.step for s in acc.Scalars("lr")] == loss_steps, "lr is not at every loss step"
    print(f"ok: TensorBoard read {records} records from {len(files)} file(s) in {events}: "
          f"{len(loss_steps)} losses and {len(acc.Scalars(eval_tag))} values of {eval_tag} as the CSVs hold them, "
          f"and {', '.join(sorted(tags - {'loss', eval_tag}))}")


if __name__ == "__main__":
    main()
