#!/bin/sh
# tensorboard_test.sh BUILD_DIR PYTHON: --tensorboard DIR in the examples writes event files that
# TensorBoard's own reader (PyPI's tensorboard, in the test set-up's virtual environment, .pyenv:
# PYTHON)
# reads back with the values of the run's loss.csv and eval.csv (check_tensorboard.py):
# fashion_mnist on 2 ranks (with DDP's straggler comparison every 5 steps: its scalars), gpt_train
# on 2 ranks and then resumed (a second file in the folder);
# a folder that cannot be made is refused before training, naming it.
set -u
build=$(cd "$1" && pwd)
py=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$py" ] && "$py" -c "import tensorboard" 2>/dev/null ||
    fail "no TensorBoard at $py: make test installs it (scripts/pydeps.sh)"
export CDDP_LOG_LEVEL=error OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
run() { "$build/bin/cddprun" --standalone --nproc_per_node 2 "$@"; }
CDDP_STRAGGLER_EVERY=5 run "$build/bin/fashion_mnist" --epochs 2 --limit 3000 --log-every 0 --out fm \
    --tensorboard fm/tb > fm.out 2>&1 || { cat fm.out; fail "fashion_mnist --tensorboard failed"; }
"$py" "$here/check_tensorboard.py" fm/tb fm test_accuracy samples_per_s || fail "fashion_mnist's events"
# DDP's comparison of the ranks every 5 steps: the slowest rank's lead over the others (%) and the
# straggler named (-1: none), at the same steps, 5 apart.
"$py" - fm/tb <<'PYEOF' || fail "fashion_mnist's straggler scalars"
import math, sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
pct, who = acc.Scalars("ddp/slowest_rank_pct"), acc.Scalars("ddp/straggler_rank")
steps = [s.step for s in pct]
assert len(pct) >= 5 and steps == [s.step for s in who], (steps, [s.step for s in who])
assert all(b - a == 5 for a, b in zip(steps, steps[1:])), steps
assert all(math.isfinite(s.value) and s.value >= 0 for s in pct), [s.value for s in pct]
assert all(s.value in (-1, 0, 1) for s in who), [s.value for s in who]
PYEOF
GPT="$build/bin/gpt_train --n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4 \
     --eval_interval 10 --eval_iters 2 --final_eval 2 --log_interval 0 --sample 0 --out g --tensorboard g/tb"
run $GPT --max_iters 20 > g1.out 2>&1 || { cat g1.out; fail "gpt_train --tensorboard failed"; }
"$py" "$here/check_tensorboard.py" g/tb g val_loss tokens_per_s 1 || fail "gpt_train's events"
run $GPT --max_iters 30 --resume > g2.out 2>&1 || { cat g2.out; fail "gpt_train --resume --tensorboard failed"; }
"$py" "$here/check_tensorboard.py" g/tb g val_loss tokens_per_s 2 || fail "gpt_train's events after a resume"
: > blocker
if "$build/bin/gpt_train" --max_iters 5 --out none --tensorboard blocker/tb > bad.out 2>&1; then
    fail "--tensorboard under a file was accepted"
fi
grep -q "blocker" bad.out && ! grep -q "^iter" bad.out || { cat bad.out; fail "the bad folder is not named before training"; }
echo "ok: TensorBoard reads what fashion_mnist and gpt_train (also resumed) wrote, as their CSVs hold it"
