#!/bin/sh
# examples_test.sh BUILD_DIR SCENARIO: the examples, data-parallel under the real cddprun.
#
#   ddp_train       2 ranks fit w = [[2], [3]] within 1e-3, both of them
#   linear_sampler  4 ranks; rank 0's model.safetensors loads back (NumPy) with Linear's names
#   fashion_mnist   2 ranks, 1 epoch: test accuracy >= 0.84; the checkpoint, metrics and curves
#                   (every step's loss, the epoch's accuracy, an SVG that renders) are written;
#                   the DDP timeline is one JSON array with both ranks' buckets
#   resume          a 2-rank, 2-epoch run killed after its first checkpoint, then resumed, ends
#                   within 0.5 points of the uninterrupted run, its curves holding both epochs
#   bf16            1 epoch with bf16 gradient compression, and 1 in mixed precision (--dtype bf16:
#                   bf16 products, emulated where the processor has no bf16 units), each within
#                   0.5 points of float32; a processor without bf16 units (or oneDNN kept from
#                   them) refuses --dtype bf16 in one line, exit 2
#   bf16_cnn        the CNN on 2 ranks for 2 epochs in float32 and in mixed precision (bf16
#                   convolutions and linear layers, emulated without bf16 units): the test
#                   accuracies within 0.5 points
#   resnet          the ResNet on 2 ranks, 4096 samples: test accuracy >= 0.45 and its
#                   checkpoint's BatchNorm statistics; in mixed precision (activations in bf16)
#                   >= 0.45 too; with --sync-bn, 2 ranks of 32 end with the weights and running
#                   statistics of 1 process of 64 (within 1e-4), where plain DDP does not
#   gpt             2 ranks train a small GPT on fortunes for 40 iterations: nanoGPT's lines, the
#                   losses fall, one sample from rank 0, the JSON fields, the checkpoint (which
#                   holds the tied head under both names) and curves that render; --hook powersgd
#                   from step 6 gives the plain run's first 6 losses and other ones after
#                   and --bench: only timed iterations, its median, tokens/s, FLOPs and MFU
#   gpt_resume      20 iterations, then --resume for 20 more, equal 40 uninterrupted ones: the
#                   same loss at every iteration and the same validation loss
#   bad_args        bad numbers on the command lines and in a checkpoint's metadata, a folder
#                   given as a checkpoint and a diverging run: a clear error and a non-zero exit
#   gpt_tokens      cddp-tokenize writes llm.c's token files (read back with NumPy as llm.c's
#                   loader does), gpt_train trains on them, and a truncated file is refused; on
#                   llm.c's shards (a pattern): the windows of every shard, the validation
#                   shard's loss as val.bin's, missing validation shards and a pattern without
#                   train refused; cddp-tokenize --shard_tokens writes shards of the same tokens;
#                   the vocabulary from the largest token, or given and each window checked
#   device          --device emu (the emulated device): ddp_train on 2 ranks converges, and with
#                   AdamW ends as on the CPU on both ranks; the CNN on
#                   2 ranks and the GPT give the CPU's losses and accuracy exactly, and a
#                   checkpoint saved from the device resumes on the CPU; a device that is not one,
#                   or not on this machine (cuda without a GPU), exits 2 saying so in one line
#   restart         a rank killed in the first round of cddprun --max_restarts 1: the restart goes
#                   on from the job's checkpoint (fashion_mnist's file, gpt_train's sets); a
#                   new job with the same --out starts over, saying so; a requeued Slurm job
#                   goes on from the checkpoint of its first run
#   stop            SIGTERM to cddprun under 2 GPT ranks, Ctrl-C to fashion_mnist: a checkpoint after
#                   the step, exit 128 + signal, and the resume goes on as if never stopped
#   disk_full       saves on full file systems (tmpfs) fail on every rank saying so, and what was
#                   saved before verifies and resumes
#   ckpt_kill       30 runs on 2 or 3 ranks saving a checkpoint set every iteration, each
#                   SIGKILLed (a rank or cddprun) at a random moment and resumed by the next: every
#                   set with a manifest verifies, the newest complete one always resumes
set -u
build=$1 scenario=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CDDP_LOG_LEVEL=error
run() { "$build/bin/cddprun" --standalone "$@"; }
fail() { echo "FAIL: $*"; exit 1; }
# kill_after_checkpoint ARGS...: cddprun ARGS (which write killed/checkpoint.safetensors, or sets
# in killed/checkpoints) in the background, stopped with SIGTERM as soon as a checkpoint is
# complete (output in killed.out).
saved() { [ -e killed/checkpoint.safetensors ] || ls killed/checkpoints/step-*/manifest.safetensors > /dev/null 2>&1; }
kill_after_checkpoint() {
    "$build/bin/cddprun" --standalone "$@" > killed.out 2>&1 &
    job=$!
    for _ in $(seq 1200); do
        saved && break
        sleep 0.05
    done
    kill -TERM "$job" 2>/dev/null
    wait "$job" 2>/dev/null || true
    saved || { cat killed.out; fail "the run to kill wrote no checkpoint"; }
}
# json_of FILE KEY: the number KEY holds in FILE's last JSON line (a program's --json line; the other
# ranks' lines may come after it).
json_of() { grep '^{' "$1" | tail -n 1 | sed -n "s/.*\"$2\": *\([0-9.]*\).*/\1/p"; }
acc_of() { json_of "$1" test_acc; }
# losses FILE...: "ITERATION LOSS" from every nanoGPT line of gpt_train's output.
losses() { sed -n 's/^iter \([0-9]*\): loss \([0-9.]*\),.*/\1 \2/p' "$@"; }
# gpt_train with a GPT small enough for a test.
TINY_GPT="$build/bin/gpt_train --n_layer 2 --n_head 2 --n_embd 32 --block_size 16"
FM="$build/bin/fashion_mnist"
PY=/usr/bin/python3

case "$scenario" in
ddp_train)
    run --nproc_per_node 2 --tee "$build/bin/ddp_train" > out 2>&1 || { cat out; fail "ddp_train failed"; }
    cat out
    for r in 0 1; do
        w0=$(grep "^\[rank $r\]: w:" out | sed 's/.*\[\[\(.*\)\],/\1/')
        w1=$(grep "^\[rank $r\]: *\[[0-9.-]*\]\]" out | sed 's/.*\[\(.*\)\]\]/\1/')
        awk -v a="$w0" -v b="$w1" 'BEGIN { d1 = a - 2; d2 = b - 3; exit !(a != "" && b != "" && d1 * d1 < 1e-6 && d2 * d2 < 1e-6) }' \
            || fail "rank $r: w = [$w0, $w1], not within 1e-3 of [2, 3]"
    done
    grep -q "^\[rank 1\]: 500/500 loss:" out || fail "no loss line at iteration 500"
    # ZeRO-1 and 2: the same weights and losses, each rank stepping its one parameter of w
    for z in 1 2; do
        run --nproc_per_node 2 --tee "$build/bin/ddp_train" --zero $z > z$z.out 2>&1 || { cat z$z.out; fail "ddp_train --zero $z failed"; }
        grep "^\[rank" out | sort > ranks
        grep "^\[rank" z$z.out | sort > ranks$z
        diff ranks ranks$z > /dev/null || { diff ranks ranks$z | head; fail "ddp_train --zero $z differs from DDP"; }
    done
    "$build/bin/ddp_train" --zero 3 > z3.out 2>&1 && fail "ddp_train --zero 3 was taken"
    grep -q "usage: ddp_train" z3.out || fail "ddp_train --zero 3 did not print the usage"
    echo "ok: both ranks converged to w = [[2], [3]], under --zero 1 and 2 to the same digits"
    ;;
linear_sampler)
    run --nproc_per_node 4 "$build/bin/linear_sampler" > out 2>&1 || { cat out; fail "linear_sampler failed"; }
    cat out
    [ "$(grep -c '^rank: ' out)" = 4 ] || fail "not every rank started"
    [ "$(grep -c '^saved ' out)" = 1 ] || fail "'saved' printed $(grep -c '^saved ' out) times, expected once (rank 0)"
    $PY - "$CDDP_SOURCE_DIR/tests/reference" <<'PYEOF' || fail "model.safetensors does not load back"
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import safetensors_np
t, meta = safetensors_np.load("model.safetensors")
assert sorted(t) == ["0.bias", "0.weight"], sorted(t)
assert t["0.weight"].shape == (1, 10) and t["0.bias"].shape == (1,)
assert all(np.isfinite(v).all() for v in t.values())
print("ok: model.safetensors loads back: 0.weight (1, 10), 0.bias (1,)")
PYEOF
    ;;
fashion_mnist)
    CDDP_TIMELINE=$work/timeline.json CDDP_DDP_STATS=1 CDDP_DDP_STATS_EVERY=200 \
        run --nproc_per_node 2 "$FM" --epochs 1 --batch-size 32 --out run --json > out 2>&1 \
        || { cat out; fail "training failed"; }
    tail -n 3 out
    acc=$(acc_of out)
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.84) }' || fail "test accuracy $acc < 0.84"
    grep -q '"world": 2' out || fail "the JSON line does not say world 2"
    grep -q '^\[cddp ddp\] step 200: forward' out || fail "no CDDP_DDP_STATS line"
    for f in run/checkpoint.safetensors run/metrics.csv run/curves.svg; do
        [ -s "$f" ] || fail "$f is missing"
    done
    [ "$(wc -l < run/metrics.csv)" = 2 ] || fail "metrics.csv should hold a header and 1 epoch"
    # The curves: rank 0's loss at each of its 938 steps (30000 samples, batch 32), the test
    # accuracy after the epoch, and a picture that renders.
    [ "$(tail -n +2 run/loss.csv | wc -l)" = 938 ] || fail "loss.csv should hold 938 steps"
    [ "$(awk -F, 'NR > 1 && $1 != NR - 2' run/loss.csv | wc -l)" = 0 ] || fail "loss.csv's steps are not 0..937"
    awk -F, -v a="$acc" 'NR == 2 { d = $3 - a; ok = $1 == 937 && $2 == 0 && d * d < 1e-8 } END { exit !(ok && NR == 2) }' \
        run/eval.csv || fail "eval.csv: '$(sed -n 2p run/eval.csv)', expected 937,0,$acc"
    rsvg-convert run/curves.svg -o curves.png || fail "curves.svg does not render"
    [ "$(od -An -tx1 -N4 curves.png | tr -d ' ')" = 89504e47 ] || fail "curves.svg rendered no PNG"
    for t in "training loss" "test accuracy" ">step<" "mean of 23 steps"; do
        grep -q "$t" run/curves.svg || fail "curves.svg has no '$t'"
    done
    $PY - <<'PYEOF' || fail "the timeline is not what Perfetto opens"
import json
ev = json.load(open("timeline.json"))
for r in (0, 1):
    names = {e["name"] for e in ev if e.get("pid") == r and e.get("ph") == "X"}
    for want in ("forward", "backward", "allreduce bucket", "optimizer step"):
        assert want in names, (r, want, names)
print("ok: timeline.json holds %d events from both ranks" % len(ev))
PYEOF
    echo "ok: 2 ranks, 1 epoch, test accuracy $acc"
    ;;
resnet)
    # The ResNet (BatchNorm, residual adds, strided and 1x1 convolutions) data-parallel: 4096
    # samples, then the test split; its checkpoint holds the BatchNorms' running statistics
    # under torchvision's names, moved away from their initial zeros and ones.
    run --nproc_per_node 2 "$FM" --model resnet --epochs 1 --limit 4096 --lr 0.05 --out run --json \
        > out 2>&1 || { cat out; fail "training failed"; }
    tail -n 2 out
    acc=$(acc_of out)
    # Learning, far above chance (0.10); after 32 steps a ResNet's accuracy swings with its
    # BatchNorm statistics (0.54 and 0.61 in a release and a sanitizer build of this run), so the
    # bound is loose; tests/test_reference.c checks its numbers against PyTorch's.
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.45) }' || fail "test accuracy $acc < 0.45"
    grep -q '"model": "resnet"' out || fail "the JSON line does not say resnet"
    $PY - <<'PYEOF' || fail "the checkpoint's BatchNorm statistics"
import json, struct
raw = open("run/checkpoint.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
def values(name):
    t = head[name]
    a, b = t["data_offsets"]
    return struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
for name in ("bn1.running_mean", "layer2.0.downsample.1.running_var", "layer3.0.bn2.running_var",
             "fc.weight", "layer1.0.conv1.weight"):
    assert name in head, (name, sorted(head)[:8])
mean, var = values("bn1.running_mean"), values("layer3.0.bn2.running_var")
assert len(mean) == 16 and len(var) == 64, (len(mean), len(var))
assert max(abs(v) for v in mean) > 1e-3 and max(abs(v - 1) for v in var) > 1e-3, (mean[:4], var[:4])
print("ok: the checkpoint holds torchvision's names and trained running statistics")
PYEOF
    # And in mixed precision, its activations in bf16 between the layers (emulated where the
    # processor has no bf16 units): learning as well, by the same bound.
    CDDP_BF16_EMULATE=1 CDDP_BF16_ACTIVATIONS=1 run --nproc_per_node 2 "$FM" --model resnet --epochs 1 --limit 4096 --lr 0.05 \
        --out none --json --dtype bf16 > mixed.out 2>&1 || { cat mixed.out; fail "--dtype bf16 failed"; }
    mixed=$(acc_of mixed.out)
    awk -v a="$mixed" 'BEGIN { exit !(a >= 0.45) }' || fail "test accuracy in bf16 $mixed < 0.45"
    grep -q '"dtype": "bfloat16"' mixed.out || fail "the --dtype bf16 run did not say bfloat16"
    # --sync-bn: 2 ranks of 32 samples a step train as 1 process of 64 (the sampler's two
    # halves of each global batch), where plain DDP's BatchNorms, each on its rank's 32, do not.
    # One step: the running statistics within 1e-6 of one process's (measured 4e-8) and the
    # weights within 1e-5 (2e-6); plain DDP's are 0.1 and 0.4 away. (Over more steps the runs
    # part as any two float32 runs of a ResNet do: a product summed in another order flips a
    # ReLU here and there, 2.5e-3 after 4 steps, 0.16 after 16; tests/ddp/ddp_check.c's syncbn
    # holds 5 steps to 1e-5 on a smaller one.)
    sync="--model resnet --epochs 1 --limit 64 --lr 0.05 --out none"
    run --nproc_per_node 2 "$FM" $sync --batch-size 32 --sync-bn --save sync.safetensors > sync.out 2>&1 ||
        { cat sync.out; fail "--sync-bn failed"; }
    grep -q "sync BatchNorm: 9 BatchNorms take their statistics over the 2 ranks' batches" sync.out ||
        fail "--sync-bn did not say what it synchronised"
    run --nproc_per_node 1 "$FM" $sync --batch-size 64 --save one.safetensors > one.out 2>&1 ||
        { cat one.out; fail "1 process at 64 failed"; }
    run --nproc_per_node 2 "$FM" $sync --batch-size 32 --save plain.safetensors > plain.out 2>&1 ||
        { cat plain.out; fail "plain DDP at 2 x 32 failed"; }
    $PY - <<'PYEOF' || fail "--sync-bn's weights and statistics against one process's"
import json, struct
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        out[name] = struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
    return out
def worst(x, y, stats):  # the largest difference, relative to the tensor's largest value
    return max(max(abs(p - q) for p, q in zip(x[k], y[k])) / max(max(abs(q) for q in y[k]), 1e-30)
               for k in y if ("running" in k) == stats and not k.startswith("optim."))
sync, one, plain = (tensors(p) for p in ("sync.safetensors", "one.safetensors", "plain.safetensors"))
assert sorted(sync) == sorted(one) and len(one) > 20, (len(sync), len(one))
ss, sw, ps, pw = worst(sync, one, True), worst(sync, one, False), worst(plain, one, True), worst(plain, one, False)
assert ss < 1e-6 and sw < 1e-5, "sync BatchNorm: statistics %g, weights %g from one process" % (ss, sw)
assert ps > 1e-2 and pw > 1e-2, "plain DDP only %g, %g from one process: the check proves nothing" % (ps, pw)
print("ok: --sync-bn on 2 x 32 as 1 x 64: statistics within %.1e, weights %.1e (plain DDP: %.1e, %.1e)"
      % (ss, sw, ps, pw))
PYEOF
    echo "ok: ResNet on 2 ranks, test accuracy $acc; in bf16 $mixed; --sync-bn as one process"
    ;;
resume)
    args="--epochs 2 --batch-size 32 --limit 24000 --json"
    run --nproc_per_node 2 "$FM" $args --out straight > straight.out 2>&1 || { cat straight.out; fail "the uninterrupted run failed"; }
    run --nproc_per_node 2 "$FM" $args --out killed > killed.out 2>&1 &
    pid=$!
    for _ in $(seq 600); do [ -s killed/checkpoint.safetensors ] && break; sleep 0.1; done
    kill -9 $pid 2>/dev/null
    pkill -9 -f "$FM $args --out killed" 2>/dev/null
    wait $pid 2>/dev/null
    [ -s killed/checkpoint.safetensors ] || fail "no checkpoint after the first epoch"
    grep -q "epoch: 1, test accuracy" killed.out && fail "the run finished before it was killed"
    run --nproc_per_node 2 "$FM" $args --out killed --resume killed/checkpoint.safetensors > resumed.out 2>&1 \
        || { cat resumed.out; fail "the resumed run failed"; }
    grep -q "resumed from killed/checkpoint.safetensors after epoch 1" resumed.out || fail "did not resume after epoch 1"
    a=$(acc_of straight.out) b=$(acc_of resumed.out)
    echo "uninterrupted: $a, killed after epoch 1 and resumed: $b"
    # The curves carry on: both epochs' steps once each, in order, and both evaluations.
    [ "$(tail -n +2 killed/loss.csv | cut -d, -f1 | uniq | wc -l)" = 750 ] || fail "loss.csv after resume: not 750 steps"
    [ "$(awk -F, 'NR > 1 && $1 != NR - 2' killed/loss.csv | wc -l)" = 0 ] || fail "loss.csv after resume: steps not 0..749"
    [ "$(cut -d, -f1,2 killed/eval.csv | tr '\n' ' ')" = "step,epoch 374,0 749,1 " ] || fail "eval.csv after resume"
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d * d <= 0.005 * 0.005) }' \
        || fail "resumed accuracy $b is not within 0.5 points of $a"
    # Killed just past the save at an epoch's last step (--save-every, or a stop there), before
    # the epoch's own: that checkpoint has the whole epoch consumed. It is made here from the
    # epoch-end checkpoint with the last step's metadata (epoch 0, data_epoch 0, data_position
    # every sample; the same weights and state). Resumed, epoch 0 is evaluated and saved, not
    # trained again; --epochs 1 then ends well, --epochs 2 goes on to epoch 1. A checkpoint from
    # after the last epoch ends at once, saying training was complete.
    FMW="--limit 2000 --batch-size 50 --log-every 0 --json"
    run --nproc_per_node 2 "$FM" $FMW --epochs 1 --out whole > w0.out 2>&1 || { cat w0.out; fail "the 1-epoch run failed"; }
    $PY - <<'PYEOF' || fail "cannot rewrite the checkpoint's metadata"
import json, struct
raw = open("whole/checkpoint.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
head["__metadata__"].update(epoch="0", data_epoch="0", data_position="2000")
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open("last_step.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PYEOF
    for e in 1 2; do
        rm -rf w$e && mkdir w$e && cp last_step.safetensors w$e/checkpoint.safetensors
        run --nproc_per_node 2 "$FM" $FMW --epochs $e --out w$e --resume w$e/checkpoint.safetensors > w$e.out 2>&1 ||
            { cat w$e.out; fail "--epochs $e from the last step's checkpoint failed"; }
        grep -q "epoch 0 was trained whole before the checkpoint: its evaluation and end-of-epoch checkpoint follow" w$e.out ||
            { cat w$e.out; fail "--epochs $e: no word of the whole epoch"; }
        want=$(grep -o 'epoch: 0, test accuracy: [0-9.]*' w0.out)
        [ -n "$want" ] && grep -qF "$want" w$e.out ||
            { cat w0.out w$e.out; fail "--epochs $e: epoch 0's accuracy is not the uninterrupted run's"; }
        [ "$(grep -c '^0,' w$e/metrics.csv)" = 1 ] || fail "--epochs $e: metrics.csv has no line of epoch 0"
    done
    grep -q "epoch: 1, test accuracy" w2.out || { cat w2.out; fail "--epochs 2 did not go on to epoch 1"; }
    run --nproc_per_node 2 "$FM" $FMW --epochs 1 --out whole --resume whole/checkpoint.safetensors > w3.out 2>&1 ||
        { cat w3.out; fail "resuming a complete run failed"; }
    grep -q "nothing to train: whole/checkpoint.safetensors is from the end of epoch 0, and --epochs is 1" w3.out ||
        { cat w3.out; fail "a complete run's resume did not say so"; }
    echo "ok: resumed to $b (uninterrupted $a); a checkpoint of an epoch's last step evaluates and saves that epoch, and goes on"
    ;;
bf16)
    run --nproc_per_node 2 "$FM" --epochs 1 --out none --json > f32.out 2>&1 || { cat f32.out; fail "float32 run failed"; }
    run --nproc_per_node 2 "$FM" --epochs 1 --out none --json --hook bf16 > bf16.out 2>&1 || { cat bf16.out; fail "bf16 run failed"; }
    a=$(acc_of f32.out) b=$(acc_of bf16.out)
    echo "float32: $a, bf16 compression: $b"
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d * d <= 0.005 * 0.005) }' \
        || fail "bf16 accuracy $b is not within 0.5 points of float32's $a"
    grep -q '"hook": "bf16"' bf16.out || fail "the bf16 run did not use the hook"
    CDDP_BF16_EMULATE=1 run --nproc_per_node 2 "$FM" --epochs 1 --out none --json --dtype bf16 > mixed.out 2>&1 \
        || { cat mixed.out; fail "--dtype bf16 run failed"; }
    c=$(acc_of mixed.out)
    awk -v a="$a" -v c="$c" 'BEGIN { d = a - c; exit !(a != "" && c != "" && d * d <= 0.005 * 0.005) }' \
        || fail "--dtype bf16 accuracy $c is not within 0.5 points of float32's $a"
    grep -q '"dtype": "bfloat16"' mixed.out || fail "the --dtype bf16 run did not say bfloat16"
    # Without bf16 units (oneDNN kept from them), bf16 is emulated with one warning for the job,
    # and refused in one line with CDDP_BF16_EMULATE=0.
    CDDP_LOG_LEVEL=warn DNNL_MAX_CPU_ISA=AVX512_CORE run --nproc_per_node 2 "$FM" --dtype bf16 --epochs 1 --limit 1000 --out none > emulated.out 2>&1 ||
        { cat emulated.out; fail "--dtype bf16 without bf16 units failed"; }
    [ "$(grep -c "W cpu: this processor has no bf16 units (AVX512-BF16, AMX): bf16 products are emulated" emulated.out)" = 1 ] ||
        { cat emulated.out; fail "--dtype bf16 without bf16 units: not one warning"; }
    CDDP_BF16_EMULATE=0 DNNL_MAX_CPU_ISA=AVX512_CORE "$FM" --dtype bf16 --out none > refused.out 2>&1; rc=$?
    [ $rc = 2 ] && [ "$(wc -l < refused.out)" = 1 ] && grep -q "^fashion_mnist: --dtype bf16: cpu: bf16 on the CPU needs AVX512-BF16 or AMX" refused.out \
        || { cat refused.out; fail "--dtype bf16 without bf16 units, CDDP_BF16_EMULATE=0: exit $rc"; }
    echo "ok: bf16 compression $b, mixed precision $c vs float32 $a; emulated with a warning without bf16 units, or refused"
    ;;
bf16_cnn)
    run --nproc_per_node 2 "$FM" --model cnn --epochs 2 --out none --json > f32.out 2>&1 || { cat f32.out; fail "float32 run failed"; }
    CDDP_BF16_EMULATE=1 run --nproc_per_node 2 "$FM" --model cnn --epochs 2 --out none --json --dtype bf16 > mixed.out 2>&1 \
        || { cat mixed.out; fail "--dtype bf16 run failed"; }
    a=$(acc_of f32.out) c=$(acc_of mixed.out)
    grep -q '"dtype": "bfloat16"' mixed.out || fail "the --dtype bf16 run did not say bfloat16"
    awk -v a="$a" -v c="$c" 'BEGIN { d = a - c; exit !(a != "" && c != "" && a > 0.85 && d * d <= 0.005 * 0.005) }' \
        || fail "the CNN's accuracy in bf16, $c, is not within 0.5 points of float32's $a (or that is below 0.85)"
    echo "ok: the CNN after 2 epochs on 2 ranks: $c in bf16, $a in float32"
    ;;
gpt)
    GPT="$build/bin/gpt_train --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 8"
    run --nproc_per_node 2 $GPT --max_iters 40 --warmup_iters 10 --eval_interval 20 --eval_iters 10 --final_eval 20 \
        --log_interval 10 --sample 100 --out run --json > out 2>&1 || { cat out; fail "training failed"; }
    cat out
    for l in "iter 0: loss" "iter 30: loss" "step 0: train loss" "step 20: train loss" \
             "step 40: train loss" "checkpoint: run/checkpoint.safetensors" "sample (100 bytes"; do
        [ "$(grep -c "^$l" out)" = 1 ] || fail "'$l' printed $(grep -c "^$l" out) times, expected once (rank 0)"
    done
    grep -q '^iter [0-9]*: loss [0-9.]*, time [0-9.]*ms' out || fail "no nanoGPT-style iteration line"
    json=$(grep "^{" out | tail -n 1)
    for k in tokens_per_s train_s val_loss iters world params; do
        echo "$json" | grep -q "\"$k\": " || fail "the JSON line has no $k"
    done
    echo "$json" | grep -q '"iters": 40, "world": 2' || fail "the JSON line does not say 40 iterations on 2 ranks"
    first=$(sed -n 's/^step 0: train loss [0-9.]*, val loss \([0-9.]*\).*/\1/p' out)
    last=$(echo "$json" | sed -n 's/.*"val_loss": \([0-9.]*\).*/\1/p')
    # Uniform guessing over 256 bytes is ln 256 = 5.55; 40 iterations learn the bytes' frequencies.
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 5.3 && b < 4.0) }' \
        || fail "validation loss $first -> $last: expected about 5.5 falling below 4.0"
    for f in run/checkpoint.safetensors run/loss.csv run/eval.csv run/curves.svg; do
        [ -s "$f" ] || fail "$f is missing"
    done
    [ "$(tail -n +2 run/loss.csv | wc -l)" = 40 ] || fail "loss.csv should hold 40 iterations"
    [ "$(cut -d, -f1 run/eval.csv | tr '\n' ' ')" = "step 20 40 " ] || fail "eval.csv: $(cat run/eval.csv)"
    rsvg-convert run/curves.svg -o curves.png || fail "curves.svg does not render"
    grep -q "validation loss" run/curves.svg || fail "curves.svg has no 'validation loss'"
    $PY - "$CDDP_SOURCE_DIR/tests/reference" <<'PYEOF' || fail "the checkpoint is not a nanoGPT state_dict"
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import safetensors_np
t, meta = safetensors_np.load("run/checkpoint.safetensors")
assert np.array_equal(t["lm_head.weight"], t["transformer.wte.weight"])
assert t["transformer.h.1.attn.c_attn.weight"].shape == (192, 64)
assert meta["iter"] == "40" and meta["n_layer"] == "2" and meta["world"] == "2", meta
assert "optim.exp_avg.transformer.wte.weight" in t
print("ok: the checkpoint holds nanoGPT's names, the tied head twice, the run's shape")
PYEOF
    echo "ok: validation loss $first -> $last on 2 ranks"
    # --hook powersgd from step 6: iterations 0-5 see the parameters of plain steps (the same
    # losses as a plain run), iteration 6 on those of a compressed one; the JSON says which hook.
    short="--max_iters 10 --warmup_iters 2 --eval_interval 10 --eval_iters 2 --final_eval 2 --log_interval 1 --out none --sample 0 --json"
    run --nproc_per_node 2 $GPT $short > plain.out 2>&1 || { cat plain.out; fail "the plain run failed"; }
    run --nproc_per_node 2 $GPT $short --hook powersgd --powersgd_rank 2 --powersgd_start 6 > psgd.out 2>&1 ||
        { cat psgd.out; fail "--hook powersgd failed"; }
    losses() { sed -n "s/^iter \([0-9]*\): loss \([0-9.]*\),.*/\1 \2/p" "$1"; }
    [ "$(losses plain.out | head -n 6)" = "$(losses psgd.out | head -n 6)" ] ||
        fail "powersgd's first 6 losses differ from the plain run's: $(losses psgd.out | head -n 6 | tr '\n' ' ')"
    [ "$(losses plain.out | tail -n 4)" != "$(losses psgd.out | tail -n 4)" ] ||
        fail "powersgd's losses from iteration 6 on are the plain run's: nothing was compressed"
    [ "$(losses psgd.out | wc -l)" = 10 ] || fail "powersgd printed $(losses psgd.out | wc -l) losses"
    grep -q '"hook": "powersgd"' psgd.out || fail "the JSON line does not name the powersgd hook"
    echo "ok: --hook powersgd: plain until step 6, compressed after"
    # --bench: 5 + 3 iterations on 2 ranks, nothing else; its numbers agree with each other
    rm -rf runs
    run --nproc_per_node 2 $GPT --bench 3 --peak_tflops 0.5 --json > bench.out 2>&1 || { cat bench.out; fail "--bench failed"; }
    cat bench.out
    ! grep -q "^step \|^sample\|^checkpoint" bench.out && [ ! -e runs ] || fail "--bench evaluated, sampled or wrote files"
    grep -q "^bench: 3 iterations after 5: median [0-9.]* ms" bench.out || fail "no bench line"
    tail -n 1 bench.out | $PY -c '
import json, sys
d = json.loads(sys.stdin.read())
b, T, C, L = d["bench"], 32, 64, 2
assert d["iters"] == 8 and d["val_loss"] is None and b["iters"] == 3, d
assert b["min_ms"] <= b["median_ms"] <= b["max_ms"], b
assert b["flops_per_token"] == 6 * d["params"] + 6 * L * C * T, b
assert abs(b["tokens_per_s"] - 2 * 8 * T / (b["median_ms"] / 1e3)) <= 1e-3 * b["tokens_per_s"], b
mfu = b["flops_per_token"] * b["tokens_per_s"] / (0.5e12 * 2)
assert b["peak_tflops"] == 0.5 and abs(b["mfu"] - mfu) <= max(1e-4, 1e-3 * mfu), (b, mfu)
' || fail "the --bench JSON does not add up"
    echo "ok: --bench"
    ;;
gpt_resume)
    GPT="$TINY_GPT --batch_size 4 \
         --warmup_iters 5 --lr_decay_iters 40 --eval_interval 20 --eval_iters 4 --final_eval 10 \
         --log_interval 1 --sample 0 --json"
    run --nproc_per_node 2 $GPT --max_iters 40 --out straight > straight.out 2>&1 || { cat straight.out; fail "the uninterrupted run failed"; }
    run --nproc_per_node 2 $GPT --max_iters 20 --out split > first.out 2>&1 || { cat first.out; fail "the first half failed"; }
    run --nproc_per_node 2 $GPT --max_iters 40 --out split --resume > second.out 2>&1 || { cat second.out; fail "the resumed half failed"; }
    grep -q "resumed from split/checkpoint.safetensors at iteration 20" second.out || fail "did not resume at iteration 20"
    losses straight.out > a
    losses first.out second.out > b
    [ "$(wc -l < a)" = 40 ] || fail "the uninterrupted run logged $(wc -l < a) iterations"
    diff a b > /dev/null || { diff a b; fail "the resumed run's losses differ from the uninterrupted run's"; }
    va=$(json_of straight.out val_loss)
    vb=$(json_of second.out val_loss)
    [ -n "$va" ] && [ "$va" = "$vb" ] || fail "validation loss $vb after resuming, $va uninterrupted"
    [ "$(tail -n +2 split/loss.csv | wc -l)" = 40 ] || fail "loss.csv after resume: not 40 iterations"
    # Sets at iterations 10 and 20; a byte of the newest's optimizer state changes (same size). The
    # resume from the folder finds it on the ranks that read that range, and every rank goes back
    # to the set before it, saying so; the losses from there are the uninterrupted run's.
    run --nproc_per_node 2 $GPT --max_iters 20 --save_every 10 --keep 2 --out sets > s1.out 2>&1 ||
        { cat s1.out; fail "the run with sets failed"; }
    S=sets/checkpoints/step-00000020/shard-00001-of-00002.safetensors
    [ -s "$S" ] || fail "no set at iteration 20: $(ls sets/checkpoints)"
    $PY - "$S" <<'PYEOF' || fail "cannot change the shard"
import sys
raw = bytearray(open(sys.argv[1], "rb").read())
raw[-3] ^= 0x10  # in the last tensor: an optimizer state of the shard's last range
open(sys.argv[1], "wb").write(raw)
PYEOF
    CDDP_LOG_LEVEL=warn run --nproc_per_node 2 $GPT --max_iters 40 --out sets --keep 2 \
        --resume sets/checkpoints > s2.out 2>&1 || { cat s2.out; fail "the resume past the damaged set failed"; }
    grep -q "step-00000020 failed its checks on rank [01]: resuming from sets/checkpoints/step-00000010, the newest set before it" s2.out ||
        { cat s2.out; fail "the fallback was not said"; }
    grep -q "shard-00001-of-00002.safetensors: bytes .* the shard changed after the save" s2.out ||
        { cat s2.out; fail "the damage was not named"; }
    grep -q "resumed from sets/checkpoints/step-00000010 at iteration 10" s2.out || { cat s2.out; fail "not resumed at 10"; }
    losses s2.out | head -n 30 > c
    sed -n '11,40p' a | diff - c > /dev/null || { diff a c | head; fail "the losses after the fallback differ"; }
    echo "ok: 20 + 20 resumed iterations equal 40 (every loss, validation loss $va); a damaged newest set gave way to the one before"
    ;;
gpt_zero)
    GPT="$TINY_GPT --batch_size 4 \
         --warmup_iters 5 --lr_decay_iters 40 --eval_interval 20 --eval_iters 4 --final_eval 10 \
         --log_interval 1 --sample 0 --json"
    run --nproc_per_node 2 $GPT --max_iters 40 --out none > ddp.out 2>&1 || { cat ddp.out; fail "the DDP run failed"; }
    run --nproc_per_node 2 $GPT --max_iters 40 --out none --zero > zero.out 2>&1 || { cat zero.out; fail "the --zero run failed"; }
    run --nproc_per_node 2 $GPT --max_iters 20 --out split --zero > first.out 2>&1 || { cat first.out; fail "the first half failed"; }
    run --nproc_per_node 1 $GPT --max_iters 21 --out none --resume split/checkpoint.safetensors > one.out 2>&1 \
        || { cat one.out; fail "the sharded run's checkpoint does not resume on 1 rank without --zero"; }
    run --nproc_per_node 2 $GPT --max_iters 40 --out split --zero --resume > second.out 2>&1 || { cat second.out; fail "the resumed half failed"; }
    grep -q "at iteration 20" one.out || fail "1 rank did not resume at iteration 20"
    losses ddp.out > a
    losses zero.out > b
    losses first.out second.out > c
    [ "$(wc -l < a)" = 40 ] || fail "the DDP run logged $(wc -l < a) iterations"
    paste a b | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-4) bad = 1 } END { exit bad }' \
        || { paste a b; fail "--zero's losses differ from DDP's by more than 2e-4"; }
    diff b c > /dev/null || { diff b c; fail "--zero resumed differs from --zero uninterrupted"; }
    sd=$(json_of ddp.out optim_state_bytes)
    sz=$(json_of zero.out optim_state_bytes)
    [ -n "$sd" ] && [ -n "$sz" ] && [ -n "$(json_of zero.out peak_rss_bytes)" ] || fail "the JSON lacks the memory fields"
    awk -v d="$sd" -v z="$sz" 'BEGIN { exit !(z > 0 && z <= d / 2 + 4096 && z >= d / 2 - 4096) }' \
        || fail "--zero keeps $sz bytes of optimizer state on rank 0, DDP $sd: not half"
    run --nproc_per_node 2 "$FM" --epochs 1 --limit 2000 --optimizer adamw --lr 1e-3 --zero --out none --json > fm.out 2>&1 \
        || { cat fm.out; fail "fashion_mnist --zero failed"; }
    grep -q '"zero": true' fm.out || fail "fashion_mnist --zero's JSON does not say so"
    echo "ok: --zero equals DDP at every iteration (within 2e-4), resumes exactly, loads on 1 rank; optimizer state $sz of $sd bytes"
    # --zero 2 (ZeRO-2): ZeRO-1's losses exactly, half the gradients kept on each rank, said per
    # rank and in the JSON; its checkpoint says the stage and resumes under --zero 1
    run --nproc_per_node 2 $GPT --max_iters 40 --out none --zero 2 > zero2.out 2>&1 || { cat zero2.out; fail "the --zero 2 run failed"; }
    losses zero2.out > d
    diff b d > /dev/null || { diff b d | head; fail "--zero 2's losses differ from --zero's"; }
    gd=$(json_of ddp.out grad_bytes)
    g2=$(json_of zero2.out grad_bytes)
    [ "$(json_of zero2.out zero_stage)" = 2 ] && [ "$(json_of ddp.out zero_stage)" = 0 ] || fail "the JSON does not say the stage"
    awk -v d="$gd" -v z="$g2" 'BEGIN { exit !(z > 0 && z <= d / 2 + 4096 && z >= d / 2 - 4096) }' \
        || fail "--zero 2 keeps $g2 bytes of gradients on rank 0, DDP $gd: not half"
    for r in 0 1; do
        grep -q "gpt_train: rank $r holds parameters .* MiB, gradients .* MiB (ZeRO-2: its shard), optimizer state .* MiB (its shard); peak resident .* MiB" zero2.out \
            || { cat zero2.out; fail "rank $r did not say what it holds"; }
    done
    run --nproc_per_node 2 $GPT --max_iters 20 --out split2 --zero 2 > first2.out 2>&1 || { cat first2.out; fail "the first half under --zero 2 failed"; }
    "$build/bin/cddp-ckpt" show split2/checkpoint.safetensors | grep -q "zero_stage *2" || fail "cddp-ckpt show does not say ZeRO-2"
    run --nproc_per_node 2 $GPT --max_iters 40 --out split2 --zero 1 --resume > second2.out 2>&1 || { cat second2.out; fail "the --zero 2 checkpoint did not resume under --zero 1"; }
    losses first2.out second2.out > e
    diff b e > /dev/null || { diff b e | head; fail "--zero 2 resumed under --zero 1 differs from --zero uninterrupted"; }
    run --nproc_per_node 2 $GPT --zero 3 > z3.out 2>&1 && fail "--zero 3 was taken"
    grep -q "zero 3 (the parameters sharded too, FSDP) is not available yet" z3.out || { cat z3.out; fail "--zero 3's refusal does not say why"; }
    echo "ok: --zero 2 equals --zero at every iteration, keeps $g2 of $gd bytes of gradients, says so per rank, and its checkpoint resumes under --zero 1"
    # --activation_checkpointing: every block run again in backward, the same losses to the digit
    # under DDP and under ZeRO-2
    run --nproc_per_node 2 $GPT --max_iters 40 --out none --activation_checkpointing > ac.out 2>&1 || { cat ac.out; fail "the --activation_checkpointing run failed"; }
    run --nproc_per_node 2 $GPT --max_iters 40 --out none --zero 2 --activation_checkpointing > ac2.out 2>&1 || { cat ac2.out; fail "--zero 2 --activation_checkpointing failed"; }
    losses ac.out > f
    losses ac2.out > g
    diff a f > /dev/null || { diff a f | head; fail "--activation_checkpointing's losses differ from DDP's"; }
    diff b g > /dev/null || { diff b g | head; fail "--zero 2 --activation_checkpointing's losses differ from --zero's"; }
    [ "$(json_of ac.out val_loss)" = "$(json_of ddp.out val_loss)" ] || fail "--activation_checkpointing's validation loss differs"
    echo "ok: --activation_checkpointing gives DDP's and ZeRO-2's losses at every iteration"
    ;;
gpt_lion)
    # Lion (--optimizer lion): it trains (the loss falls), --zero shards its one state block and
    # equals DDP at every iteration, a run resumed halfway equals the uninterrupted one, an AdamW
    # checkpoint is refused by name, and fashion_mnist takes it too.
    GPT="$TINY_GPT --batch_size 4 --optimizer lion --lr 3e-4 --weight_decay 1.0 \
         --warmup_iters 5 --lr_decay_iters 60 --eval_interval 30 --eval_iters 4 --final_eval 10 \
         --log_interval 1 --sample 0 --json"
    run --nproc_per_node 2 $GPT --max_iters 60 --out none > ddp.out 2>&1 || { cat ddp.out; fail "the Lion run failed"; }
    run --nproc_per_node 2 $GPT --max_iters 60 --out none --zero > zero.out 2>&1 || { cat zero.out; fail "Lion with --zero failed"; }
    run --nproc_per_node 2 $GPT --max_iters 30 --out split > first.out 2>&1 || { cat first.out; fail "the first half failed"; }
    run --nproc_per_node 2 $GPT --max_iters 60 --out split --resume > second.out 2>&1 || { cat second.out; fail "the resumed half failed"; }
    losses ddp.out > a
    losses zero.out > b
    losses first.out second.out > c
    [ "$(wc -l < a)" = 60 ] || fail "the Lion run logged $(wc -l < a) iterations"
    awk 'NR <= 5 { f += $2 } NR > 55 { l += $2 } END { exit !(l / 5 < f / 5 - 0.3) }' a ||
        { cat a; fail "Lion's loss did not fall by 0.3 over 60 iterations"; }
    paste a b | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 2e-4) bad = 1 } END { exit bad }' \
        || { paste a b; fail "Lion with --zero differs from DDP by more than 2e-4"; }
    diff a c > /dev/null || { diff a c; fail "Lion resumed differs from Lion uninterrupted"; }
    run --nproc_per_node 1 $TINY_GPT --max_iters 2 --eval_interval 2 --eval_iters 1 --final_eval 1 \
        --sample 0 --out adamw > adamw.out 2>&1 || { cat adamw.out; fail "the AdamW run failed"; }
    run --nproc_per_node 1 $GPT --max_iters 4 --out adamw --resume > mixed.out 2>&1 &&
        fail "an AdamW checkpoint resumed under --optimizer lion"
    grep -q "the file holds adamw state but the optimizer is lion" mixed.out ||
        { cat mixed.out; fail "the refusal does not name both optimizers"; }
    run --nproc_per_node 2 "$FM" --epochs 1 --limit 2000 --optimizer lion --lr 1e-4 --out none --json > fm.out 2>&1 \
        || { cat fm.out; fail "fashion_mnist --optimizer lion failed"; }
    grep -q '"optimizer": "lion"' fm.out || fail "fashion_mnist's JSON does not name Lion"
    echo "ok: Lion trains (loss $(head -n 1 a | cut -d' ' -f2) to $(tail -n 1 a | cut -d' ' -f2)), --zero equals DDP, resumes exactly, refuses AdamW's state, runs fashion_mnist"
    ;;
gpt_reshard)
    # 4 ranks x 3 sequences with the optimizer sharded, killed once it wrote a checkpoint set (every 10 iterations: each rank
    # its shard), resumed from the folder of sets on 2 ranks x 6 and 3 ranks x 4 (the same global batch), each rank reading
    # only its new shard's state: every later loss equals the uninterrupted 4-rank run's.
    GPT="$TINY_GPT \
         --warmup_iters 5 --lr_decay_iters 40 --eval_interval 1000 --eval_iters 2 --final_eval 2 \
         --log_interval 1 --sample 0 --save_every 10 --zero --keep 2"
    run --nproc_per_node 4 $GPT --batch_size 3 --max_iters 200 --out straight > straight.out 2>&1 \
        || { cat straight.out; fail "the uninterrupted run failed"; }
    kill_after_checkpoint --nproc_per_node 4 $GPT --batch_size 3 --max_iters 100000 --out killed
    for m in 2:6 3:4; do
        w=${m%:*} b=${m#*:}
        run --nproc_per_node "$w" $GPT --batch_size "$b" --max_iters 200 --out "r$w" \
            --resume killed/checkpoints > "r$w.out" 2>&1 || { cat "r$w.out"; fail "resuming on $w ranks failed"; }
        grep -q "^resumed from killed/checkpoints/step-[0-9]* at iteration" "r$w.out" \
            || { cat "r$w.out"; fail "$w ranks did not resume from the newest set"; }
        grep -q "resuming on $w ranks from a checkpoint of 4: epoch 0 goes on" "r$w.out" \
            || { cat "r$w.out"; fail "$w ranks did not continue the epoch"; }
        at=$(sed -n 's/^resumed from .* at iteration \([0-9]*\)$/\1/p' "r$w.out")
        [ "$at" -ge 10 ] && [ "$at" -le 150 ] || fail "resumed at iteration '$at', not between 10 and 150"
        awk -F, 'NR == FNR { if (FNR > 1) want[$1] = $3; next }
                 FNR > 1 { n++; d = $3 - want[$1]; if (d < 0) d = -d
                           if (!($1 in want) || d > 1e-5 * want[$1]) { print "step " $1 ": " $3 " vs " want[$1]; bad = 1 } }
                 END { if (n != 200 - at) { print n " steps"; bad = 1 }; exit bad }' at="$at" \
            straight/loss.csv "r$w/loss.csv" || { cat "r$w.out"; fail "the losses on $w ranks differ from the uninterrupted 4 ranks'"; }
    done
    [ "$(ls -d r3/checkpoints/step-* | wc -l)" = 2 ] || fail "--keep 2 kept $(ls -d r3/checkpoints/step-* | wc -l) sets"
    echo "ok: killed after a set (ZeRO shards), resumed from it (iteration $at) on 2 and 3 ranks: every later loss (to 200) within 1e-5 of 4 ranks'"
    ;;
fm_reshard)
    # fashion_mnist on 4 ranks x 16, killed once it wrote a mid-epoch checkpoint set (--save-every 10 --keep 1: each
    # rank writes a quarter of the flat block),
    # resumed on 2 ranks x 32 (the same global batch): the same epoch goes on, and after 2 epochs
    # the test accuracy is the uninterrupted 4-rank run's.
    FMA="--epochs 2 --limit 6000 --log-every 0 --json"
    run --nproc_per_node 4 "$FM" $FMA --batch-size 16 --out straight > straight.out 2>&1 \
        || { cat straight.out; fail "the uninterrupted run failed"; }
    kill_after_checkpoint --nproc_per_node 4 "$FM" $FMA --batch-size 16 --save-every 10 --keep 1 --out killed
    run --nproc_per_node 2 "$FM" $FMA --batch-size 32 --out r2 --resume killed/checkpoints \
        --sample-log r2.log > r2.out 2>&1 || { cat r2.out; fail "resuming on 2 ranks failed"; }
    grep -q "^resumed from killed/checkpoints/step-[0-9]* in epoch 0, after [0-9]* of its samples" r2.out \
        || { cat r2.out; fail "2 ranks did not go on in the middle of epoch 0"; }
    # The steps go on where the set was taken (the global batch is 64 samples): the sample log's
    # first step and the learning rate's, not 0.
    done_steps=$(( $(grep -o 'after [0-9]* of its samples' r2.out | tr -dc 0-9) / 64 ))
    first=$(head -n 1 r2.log.0 | cut -d' ' -f2)
    [ "$done_steps" -gt 0 ] && [ "$first" = "$done_steps" ] ||
        fail "the sample log's steps start at $first after $done_steps steps of the epoch"
    a=$(acc_of straight.out) b=$(acc_of r2.out)
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.5 && d <= 0.002) }' \
        || fail "test accuracy $b after resuming on 2 ranks, $a uninterrupted on 4"
    echo "ok: $(grep -o 'after [0-9]* of its samples' r2.out) of epoch 0 on 4 ranks, resumed on 2: test accuracy $b, uninterrupted $a"
    ;;
ckpt_kill)
    # Each trial resumes from the newest complete set of the trials before (on 2 or 3 ranks, so the
    # sets' world sizes alternate), saves a set every iteration (--keep 3: older sets are removed
    # too), and is SIGKILLed 0-250 ms into its training: a random rank in odd trials, cddprun in
    # even ones. After each kill, every set that has a manifest must verify (sizes, checksums,
    # ranges), and the next trial must resume from the newest one.
    cat /usr/share/games/fortunes/* 2> /dev/null | head -c 20000 > text.txt # a quick start
    [ -s text.txt ] || fail "no fortunes in /usr/share/games/fortunes"
    GPT="$build/bin/gpt_train --n_layer 1 --n_head 2 --n_embd 16 --block_size 8 --batch_size 2 --data text.txt \
         --max_iters 1000000 --eval_interval 1000000 --log_interval 1 --sample 0 --save_every 1 --keep 3 --out run"
    mid=0 last=-1
    for t in $(seq 1 30); do
        w=$((2 + t % 2)) resume=""
        [ "$t" -gt 1 ] && resume=--resume
        "$build/bin/cddprun" --standalone --nproc_per_node "$w" $GPT $resume > "t$t.out" 2>&1 &
        job=$!
        for _ in $(seq 400); do grep -q "^iter " "t$t.out" && break; sleep 0.025; done
        grep -q "^iter " "t$t.out" || { kill -KILL "$job"; cat "t$t.out"; fail "trial $t did not start training"; }
        if [ "$t" -gt 1 ]; then
            at=$(sed -n 's/^resumed from run\/checkpoints\/step-0*\([0-9][0-9]*\) at iteration .*/\1/p' "t$t.out")
            [ -n "$at" ] && [ "$at" -ge "$last" ] || { cat "t$t.out"; fail "trial $t resumed from '$at', not the newest complete set ($last or later)"; }
        fi
        sleep "0.$(od -An -N1 -tu1 /dev/urandom | awk '{ printf "%03d", $1 }')"
        victim=$job
        [ $((t % 2)) = 1 ] && victim=$(pgrep -P "$job" -x gpt_train | shuf -n 1)
        kill -KILL "$victim" 2>/dev/null
        wait "$job" 2>/dev/null
        sleep 0.05 # the other ranks, stopped by cddprun
        # Killed in the middle of a save: a set folder without a manifest, or a temporary.
        for d in run/checkpoints/step-*; do
            [ -e "$d/manifest.safetensors" ] || { mid=$((mid + 1)); break; }
            ls "$d" | grep -q '\.tmp\.' && { mid=$((mid + 1)); break; }
        done
        last=-1
        for d in run/checkpoints/step-*; do
            [ -e "$d/manifest.safetensors" ] || continue
            "$build/bin/cddp-ckpt" verify "$d" > v.out 2>&1 || { cat v.out; fail "trial $t: $d has a manifest but does not verify"; }
        done
        newest=$("$build/bin/cddp-ckpt" show run/checkpoints | sed -n 's/^  set  *run\/checkpoints\/step-0*\([0-9][0-9]*\):.*/\1/p')
        [ -n "$newest" ] || fail "trial $t: no complete set left"
        last=$newest
    done
    [ "$mid" -ge 5 ] || fail "only $mid of 30 kills landed during a save: the test does not exercise it"
    echo "ok: 30 random SIGKILLs on 2 and 3 ranks ($mid during a save): every set with a manifest verified, each next run resumed from the newest"
    ;;
restart)
    # cddprun --max_restarts 1, rank 1 SIGKILLed once the job's first checkpoint is there (in the
    # first round only): the restart goes on from the job's checkpoint by itself and the job ends
    # well, as torchrun's test_rank_restart_after_failure wants; for fashion_mnist's checkpoint
    # file and gpt_train's checkpoint sets. A new job with the same --out starts over, saying it
    # replaces the checkpoint there.
    cat > worker.sh <<'EOF'
#!/bin/sh
# worker.sh CHECKPOINT PROGRAM ARGS...: rank 1 of the first round is killed once CHECKPOINT is there
ckpt=$1
shift
[ "$CDDP_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] || exec "$@"
"$@" &
p=$!
for _ in $(seq 1000); do [ -e "$ckpt" ] && break; sleep 0.01; done
kill -KILL "$p"
wait "$p"
EOF
    chmod +x worker.sh
    for prog in fm gpt; do
        if [ $prog = fm ]; then
            ckpt=o_fm/checkpoint.safetensors
            set -- "$FM" --epochs 2 --limit 6000 --log-every 0 --save-every 5 --json --out o_fm
        else
            ckpt=o_gpt/checkpoints/step-00000050/manifest.safetensors
            # 6000 iterations (0.4 ms each): the job must outlast the worker's 10 ms polls for the
            # first set, or rank 1 ends before it can be killed (200 did not, on a quiet machine;
            # 2000, about 1 s, did not once with the whole suite running on 2 cores)
            set -- $TINY_GPT --batch_size 4 --max_iters 6000 --eval_interval 3000 --eval_iters 1 --save_every 50 \
                --keep 2 --sample 0 --json --out o_gpt
        fi
        "$build/bin/cddprun" --standalone --nproc_per_node 2 --max_restarts 1 ./worker.sh "$ckpt" "$@" > $prog.out 2>&1 ||
            { cat $prog.out; fail "$prog: the job did not end well after its restart"; }
        grep -q "restarting the group (restart 1 of 1)" $prog.out || { cat $prog.out; fail "$prog: no restart"; }
        grep -q "^restart 1 of job [0-9a-f]*: on from its checkpoint o_$prog/" $prog.out ||
            { cat $prog.out; fail "$prog: the restart did not go on from the job's checkpoint"; }
        grep -q "^resumed from o_$prog/" $prog.out || { cat $prog.out; fail "$prog: the restart did not resume"; }
        # a new job (gpt_train: 100 iterations are enough to see it start over, and the
        # sanitizers' builds take 2 ms an iteration)
        again=""
        [ $prog = gpt ] && again="--max_iters 100"
        # shellcheck disable=SC2086
        "$build/bin/cddprun" --standalone --nproc_per_node 2 "$@" $again > again.out 2>&1 || { cat again.out; fail "$prog: a new job failed"; }
        grep -q "resumed from" again.out && { cat again.out; fail "$prog: a new job resumed another job's checkpoint"; }
        grep -q "^[a-z_]*: o_$prog/[^ ]* holds the checkpoint of run [0-9a-f]*: this run replaces it at its first save (--resume o_$prog continues it instead)" again.out ||
            { cat again.out; fail "$prog: a new job did not say it replaces the checkpoint there"; }
    done
    # A Slurm job requeued (its environment as Slurm sets it): cddprun names the job after
    # SLURM_JOB_ID, so the requeued job's cddprun (SLURM_RESTART_COUNT 1) goes on from the
    # checkpoint the first one saved before it was killed
    set -- "$FM" --epochs 2 --limit 6000 --log-every 0 --save-every 5 --json --out o_slurm
    SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=0 "$build/bin/cddprun" --standalone --nproc_per_node 2 "$@" > s0.out 2>&1 &
    job=$!
    for _ in $(seq 1000); do [ -e o_slurm/checkpoint.safetensors ] && break; sleep 0.01; done
    kill -KILL "$job"
    wait "$job" 2>/dev/null
    sleep 0.2 # its ranks, stopped by its guardian
    "$build/bin/cddp-ckpt" show o_slurm/checkpoint.safetensors | grep -q "run_id.*slurm-4242" ||
        fail "the checkpoint does not name the Slurm job (run_id slurm-4242)"
    SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=1 "$build/bin/cddprun" --standalone --nproc_per_node 2 "$@" > s1.out 2>&1 ||
        { cat s1.out; fail "the requeued job failed"; }
    grep -q "^restart 1 of job slurm-4242: on from its checkpoint o_slurm/checkpoint.safetensors" s1.out ||
        { cat s1.out; fail "the requeued job did not go on from its checkpoint"; }
    echo "ok: after rank 1 was killed, each job's restart went on from its own checkpoint (a file, a set); a new job started over; a requeued Slurm job went on too"
    ;;
stop)
    # SIGTERM to cddprun while 2 ranks train the GPT (a scheduler's stop, a preemption): the ranks
    # agree on the iteration, save a checkpoint after it and exit 143; resumed, the run's every
    # loss is the uninterrupted run's. Ctrl-C (SIGINT) to fashion_mnist on its own: the same
    # after the step, exit 130, and the resume starts after that step's samples.
    G="$TINY_GPT --batch_size 4 --max_iters 60 --eval_interval 1000 --log_interval 1 --sample 0"
    run --nproc_per_node 2 $G --out straight > straight.out 2>&1 || { cat straight.out; fail "the uninterrupted run failed"; }
    # stop_at PID FILE PATTERN SIGNAL RC: SIGNAL to PID once FILE has PATTERN; PID must exit RC
    stop_at() {
        for _ in $(seq 1000); do grep -q "$3" "$2" && break; sleep 0.01; done
        kill -"$4" "$1"
        wait "$1"
        rc=$?
        [ $rc = "$5" ] || { cat "$2"; fail "exit $rc after SIG$4, not $5"; }
    }
    "$build/bin/cddprun" --standalone --nproc_per_node 2 $G --out cut > cut.out 2>&1 &
    stop_at $! cut.out "^iter 10:" TERM 143
    grep -q "^stopped by SIGTERM after iteration [0-9]*: --resume continues from cut/checkpoint.safetensors" cut.out ||
        { cat cut.out; fail "the ranks did not stop with a checkpoint"; }
    [ "$(grep -c "stopping after this step" cut.out)" = 1 ] || { cat cut.out; fail "not rank 0 alone said it stops"; }
    run --nproc_per_node 2 $G --out cut --resume > resumed.out 2>&1 || { cat resumed.out; fail "the resume failed"; }
    at=$(sed -n 's/^stopped by SIGTERM after iteration \([0-9]*\):.*/\1/p' cut.out)
    grep -q "^resumed from cut/checkpoint.safetensors at iteration $((at + 1))$" resumed.out ||
        { cat resumed.out; fail "the resume did not start after iteration $at"; }
    losses straight.out > a.l
    { losses cut.out | awk -v at="$at" '$1 <= at'; losses resumed.out; } > b.l
    [ "$(wc -l < a.l)" = 60 ] && cmp -s a.l b.l || { diff a.l b.l | head; fail "the stopped and resumed run's losses are not the uninterrupted run's"; }
    [ "$(sed 1d cut/loss.csv | cut -d, -f1 | sort -un | wc -l)" = 60 ] && [ "$(wc -l < cut/loss.csv)" = 61 ] ||
        fail "cut/loss.csv does not hold each of the 60 iterations once (the curves saved at the stop)"
    # (as a terminal's foreground job has it: a background job of a script starts with SIGINT
    # ignored, and keeps it so)
    "$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
        "$FM" --epochs 1 --limit 30000 --log-every 1 --out fm > fm.out 2>&1 &
    stop_at $! fm.out "step: 2," INT 130
    step=$(sed -n 's/^stopped by SIGINT after step \([0-9]*\) of epoch 0: --resume continues from fm\/checkpoint.safetensors$/\1/p' fm.out)
    [ -n "$step" ] || { cat fm.out; fail "fashion_mnist did not stop with a checkpoint"; }
    "$FM" --epochs 1 --limit 30000 --log-every 0 --resume fm --out fm > fm2.out 2>&1 || { cat fm2.out; fail "fashion_mnist's resume failed"; }
    grep -q "^resumed from fm/checkpoint.safetensors in epoch 0, after $(((step + 1) * 64)) of its samples" fm2.out ||
        { cat fm2.out; fail "fashion_mnist did not resume after step $step"; }
    # the loss curve of a resume in the middle of an epoch: each of its 469 steps once
    [ "$(sed 1d fm/loss.csv | cut -d, -f1 | sort -un | wc -l)" = 469 ] && [ "$(wc -l < fm/loss.csv)" = 470 ] ||
        fail "fm/loss.csv does not hold each of the epoch's 469 steps once"
    # No signal lands on a computing thread: 10 SIGTERMs at random moments of a run (with glibc's
    # heap checks), each a stop with a checkpoint or, before training, the end; never a crash (a
    # handler on the training thread's stack corrupted the heap in 5 of 20 such runs)
    for t in $(seq 10); do
        MALLOC_CHECK_=3 "$FM" --epochs 1 --limit 30000 --log-every 1 --out t > t.out 2>&1 &
        job=$!
        sleep "0.$(od -An -N1 -tu1 /dev/urandom | awk '{ printf "%d", $1 % 6 + 1 }')"
        kill -TERM "$job"
        wait "$job"
        rc=$?
        [ $rc = 143 ] || [ $rc = 0 ] || { cat t.out; fail "run $t exited $rc after SIGTERM"; }
    done
    echo "ok: SIGTERM stopped 2 ranks after iteration $at with a checkpoint, the resumed run's losses the uninterrupted run's; Ctrl-C stopped fashion_mnist after step $step, resumed after it; 10 SIGTERMs at random moments, no crash"
    ;;
disk_full)
    # Saves that do not fit, on file systems of this test's own (tmpfs, in a mount namespace that
    # ends with the test): one of 8 MiB holds the MLP's first checkpoint (5.4 MB) but not a second
    # beside it, one of 640 KiB a small GPT's first checkpoint set (416 KB) but not the next. Each save
    # fails on both ranks, the one that could not write saying the disk is full and what it left;
    # no temporary stays; the checkpoint and the set saved before verify and resume.
    if [ -z "${CDDP_TEST_MOUNTS:-}" ]; then # again in a mount namespace, with a work folder of its own
        cd / && rm -rf "$work" && exec unshare -m --propagation private env CDDP_TEST_MOUNTS=1 "$0" "$@"
        fail "cannot run in a mount namespace of its own (unshare -m)"
    fi
    trap 'umount "$work/fm" "$work/gpt" 2>/dev/null; rm -rf "$work"' EXIT
    mkdir fm gpt
    mount -t tmpfs -o size=8m none fm && mount -t tmpfs -o size=640k none gpt || fail "cannot mount a tmpfs"
    run --nproc_per_node 2 "$FM" --epochs 2 --limit 2000 --log-every 0 --out fm/run --save-every 10 \
        > fm.out 2>&1 && { cat fm.out; fail "a checkpoint was saved on a full disk"; }
    has() { grep -q -- "$2" "$1" || { cat "$1"; fail "$1 does not say: $2"; }; }
    has fm.out "^fashion_mnist: rank 0: writing fm/run/checkpoint.safetensors.tmp.[^:]*: No space left on device (fm/run/checkpoint.safetensors keeps what it held; free space there or save elsewhere)"
    has fm.out "^fashion_mnist: rank 1: rank 0 could not write the checkpoint fm/run/checkpoint.safetensors (its log says why)"
    ls fm/run | grep -q '\.tmp\.' && fail "a temporary was left in fm/run: $(ls fm/run)"
    "$build/bin/cddp-ckpt" verify fm/run/checkpoint.safetensors > v.out 2>&1 || { cat v.out; fail "the kept checkpoint does not verify"; }
    run --nproc_per_node 2 "$FM" --epochs 1 --limit 2000 --log-every 0 --resume fm/run/checkpoint.safetensors \
        --out none > r.out 2>&1 || { cat r.out; fail "the kept checkpoint does not resume"; }
    has r.out "^resumed from fm/run/checkpoint.safetensors in epoch 0, after 1280 of its samples"
    run --nproc_per_node 2 $TINY_GPT --batch_size 4 --max_iters 30 --eval_interval 10 --eval_iters 1 --keep 5 \
        --sample 0 --out gpt/run > g.out 2>&1 && { cat g.out; fail "a checkpoint set was saved on a full disk"; }
    has g.out "^gpt_train: rank [01]: writing gpt/run/checkpoints/step-00000020/shard-0000[01]-of-00002.safetensors.tmp.[^:]*: No space left on device (gpt/run/checkpoints/step-00000020/shard-0000[01]-of-00002.safetensors was not written; free space there or save elsewhere)"
    [ "$(grep -c '^gpt_train: rank [01]: ' g.out)" = 2 ] || { cat g.out; fail "not both ranks failed the save"; }
    ls gpt/run/checkpoints/step-00000020 | grep -q '\.tmp\.' && fail "a temporary was left in step-00000020"
    "$build/bin/cddp-ckpt" verify gpt/run/checkpoints > v.out 2>&1 || { cat v.out; fail "the newest complete set does not verify"; }
    "$build/bin/cddp-ckpt" show gpt/run/checkpoints > v.out 2>&1 || { cat v.out; fail "cddp-ckpt show failed"; }
    has v.out "^  set  *gpt/run/checkpoints/step-00000010:"
    $TINY_GPT --batch_size 4 --max_iters 12 --eval_interval 100 --sample 0 --resume gpt/run/checkpoints --out none \
        > r.out 2>&1 || { cat r.out; fail "the set saved before does not resume"; }
    has r.out "^resumed from gpt/run/checkpoints/step-00000010 at iteration 10"
    echo "ok: full disks: the saves failed on every rank saying so, nothing half-written stayed, and the checkpoint and set saved before resumed"
    ;;
init_from)
    # A model's weights alone (the checkpoint without its optimizer state and metadata, as a
    # PyTorch state_dict would be written) start a new run: the same evaluation at iteration 0.
    GPT="$TINY_GPT --batch_size 4 \
         --eval_interval 1000 --eval_iters 2 --final_eval 10 --log_interval 0 --sample 0 --json"
    run --nproc_per_node 2 $GPT --max_iters 20 --out a > a.out 2>&1 || { cat a.out; fail "training failed"; }
    $PY - <<'PYEOF' || fail "cannot write the weights-only file"
import json, struct
raw = open("a/checkpoint.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
keep = {k: v for k, v in head.items() if k != "__metadata__" and not k.startswith("optim.")}
out, at = {}, 0
for k, v in keep.items():
    b, e = v["data_offsets"]
    out[k] = dict(v, data_offsets=[at, at + e - b])
    at += e - b
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open("weights.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for k, v in keep.items():
        f.write(data[v["data_offsets"][0]:v["data_offsets"][1]])
PYEOF
    run --nproc_per_node 2 $GPT --max_iters 0 --out none --init_from weights.safetensors > b.out 2>&1 \
        || { cat b.out; fail "--init_from a file of weights failed"; }
    grep -q "initialised from weights.safetensors (weights only" b.out || fail "no word of the initialisation"
    va=$(json_of a.out val_loss)
    vb=$(json_of b.out val_loss)
    # no iteration: still JSON, its last loss null (JSON has no nan)
    grep '^{' b.out | tail -n 1 | $PY -c 'import json, sys; assert json.load(sys.stdin)["last_loss"] is None' ||
        fail "--max_iters 0 --json: not JSON with a null last loss: $(grep '^{' b.out | tail -n 1)"
    [ -n "$va" ] && [ "$va" = "$vb" ] || fail "validation loss $vb from the weights, $va where they were trained"
    run --nproc_per_node 2 $GPT --max_iters 10 --out none --init_from weights.safetensors > c.out 2>&1 \
        || { cat c.out; fail "training from the weights failed"; }
    # Those weights do not say their head count: without --n_head they are refused, not read with
    # gpt_train's default of 4 heads.
    if "$build/bin/gpt_train" --n_layer 2 --n_embd 32 --max_iters 0 --out none --sample 0 \
        --init_from weights.safetensors > n.out 2>&1; then fail "weights without a head count loaded with the default"; fi
    grep -q "none was given.*--n_head" n.out || { cat n.out; fail "weights without a head count: no reason given"; }
    # The same model in Hugging Face's layout (Conv1D's transposed weights, config.json) and in
    # llm.c's model file (tests/reference/make_gpt_weights.py follows the published layouts).
    $PY "$CDDP_SOURCE_DIR/tests/reference/make_gpt_weights.py" --convert a/checkpoint.safetensors 2 foreign ||
        fail "cannot convert the checkpoint"
    for f in foreign/hf/model.safetensors foreign/gpt2.bin; do
        run --nproc_per_node 2 $GPT --max_iters 0 --out none --init_from "$f" > f.out 2>&1 \
            || { cat f.out; fail "--init_from $f failed"; }
        vf=$(json_of f.out val_loss)
        [ "$vf" = "$va" ] || fail "validation loss $vf from $f, $va where the weights were trained"
    done
    # gpt_generate prints the same greedy text from each of the three files, with the cache and
    # without.
    gen() { "$build/bin/gpt_generate" "$@" --tokens 40 --temperature 0 --prompt "Q: " 2>/dev/null; }
    gen a/checkpoint.safetensors > g1.out || fail "gpt_generate from the checkpoint failed"
    gen foreign/hf/model.safetensors > g2.out || fail "gpt_generate from Hugging Face's layout failed"
    gen foreign/gpt2.bin --no_cache > g3.out || fail "gpt_generate from llm.c's file failed"
    [ "$(wc -c < g1.out)" -gt 40 ] && cmp -s g1.out g2.out && cmp -s g1.out g3.out ||
        fail "gpt_generate's text differs between the layouts: $(cat g1.out g2.out g3.out)"
    # Through llm.c's tokenizer file (version 2; here token i is the byte i twice): the same
    # tokens, each printed as the file says; a truncated tokenizer is refused, named.
    $PY - <<'PYEOF' || fail "cannot write the tokenizer files"
import struct
head = struct.pack("<4I", 20240328, 2, 256, 10) + bytes(1024 - 16)
body = b"".join(bytes([2, i, i]) for i in range(256))
open("tok.bin", "wb").write(head + body)
open("cut.bin", "wb").write(head + body[:100])
PYEOF
    gen a/checkpoint.safetensors --tokenizer tok.bin > g4.out || fail "gpt_generate --tokenizer failed"
    $PY - <<'PYEOF' || fail "the tokenizer's text is not the tokens through it: $(cat g4.out)"
plain, through = open("g1.out", "rb").read(), open("g4.out", "rb").read()
assert through == b"Q: " + bytes(b for c in plain[3:-1] for b in (c, c)) + b"\n"
PYEOF
    if gen a/checkpoint.safetensors --tokenizer cut.bin > g5.out 2>&1; then fail "a truncated tokenizer was accepted"; fi
    "$build/bin/gpt_generate" a/checkpoint.safetensors --tokenizer cut.bin 2>&1 | grep -q "cut.bin ends inside token" ||
        fail "the truncated tokenizer is not named"
    if run --nproc_per_node 1 $GPT --out none --resume weights.safetensors > d.out 2>&1; then fail "--resume took a file without optimizer state"; fi
    grep -q "no optimizer state" d.out || { cat d.out; fail "--resume of weights alone did not say why"; }
    if "$build/bin/gpt_train" --resume a/checkpoint.safetensors --init_from weights.safetensors > e.out 2>&1; then fail "--resume with --init_from accepted"; fi
    grep -q "choose one" e.out || fail "--resume with --init_from: no reason given"
    run --nproc_per_node 2 "$FM" --epochs 1 --limit 2000 --out none --init-from /nonexistent.safetensors > f.out 2>&1 \
        && fail "fashion_mnist --init-from a missing file succeeded"
    grep -q "nonexistent.safetensors" f.out || { cat f.out; fail "fashion_mnist: the missing file is not named"; }
    run --nproc_per_node 2 "$FM" --epochs 1 --limit 2000 --out none --save fm.safetensors > g.out 2>&1 || { cat g.out; fail "fashion_mnist --save failed"; }
    run --nproc_per_node 2 "$FM" --epochs 1 --limit 2000 --out none --init-from fm.safetensors > h.out 2>&1 \
        || { cat h.out; fail "fashion_mnist --init-from failed"; }
    grep -q "initialised from fm.safetensors" h.out || fail "fashion_mnist: no word of the initialisation"
    echo "ok: the weights alone, in cddp's, Hugging Face's and llm.c's layouts, start a run with the trained model's validation loss ($vb) and generate the same text; --resume refuses them, with --init_from too"
    ;;
bad_args)
    # Every number a user or a file gives is checked the same way (cddp_parse_int/_double): each
    # bad one gets a clear error and a non-zero exit, and nothing trains on it.
    expect() { # expect EXIT TEXT PROGRAM ARGS...
        want=$1 text=$2
        shift 2
        "$@" > out 2>&1
        rc=$?
        [ "$rc" = "$want" ] || { cat out; fail "$* exited $rc, expected $want"; }
        grep -qF -- "$text" out || { cat out; fail "$*: no '$text'"; }
    }
    refused() { # refused EXIT TEXT PROGRAM ARGS...: expect, and nothing trained
        expect "$@"
        grep -q "^epoch: \|^iter [0-9]" out && { cat out; fail "$* trained"; }
        return 0
    }
    for bad in "--epochs 4294967297:--epochs 4294967297: expected a whole number from 1 to" \
        "--batch-size 4294967360:--batch-size 4294967360: expected a whole number from 1 to" \
        "--lr inf:--lr inf: expected a finite number in (0, 10]" \
        "--lr 1e30:--lr 1e30: expected a finite number in (0, 10]" \
        "--momentum nan:--momentum nan: expected a finite number in [0, 1]" \
        "--bucket-cap-mb -1:--bucket-cap-mb -1: expected a finite number in (0, 4096]" \
        "--bucket-cap-mb nan:--bucket-cap-mb nan: expected a finite number" \
        "--limit -5:--limit -5: expected a whole number from 1 to" \
        "--target-acc nan:--target-acc nan: expected a finite number in [0, 1]" \
        "--log-every -1:--log-every -1: expected a whole number from 0 to" \
        "--seed 1x:--seed 1x: expected a whole number" \
        "--powersgd-rank 0 --hook powersgd:--powersgd-rank 0: expected a whole number from 1 to" \
        "--powersgd-rank 2:--powersgd-rank and --powersgd-start need --hook powersgd" \
        "--hook lowrank:--hook must be none, bf16, fp16 or powersgd" \
        "--sync-bn --model cnn:--sync-bn: the cnn has no BatchNorm (--model resnet has)"; do
        # shellcheck disable=SC2086
        refused 2 "${bad#*:}" "$FM" ${bad%%:*} --out none
    done
    refused 2 "--max_iters -1: expected a whole number from 0 to" $TINY_GPT --max_iters -1
    refused 2 "--powersgd_rank and --powersgd_start need --hook powersgd" $TINY_GPT --powersgd_start 3
    refused 1 "shard_optimizer does not go with the powersgd hook; PowerSGD compresses whole matrices" \
        "$build/bin/cddprun" --standalone --nproc_per_node 2 $TINY_GPT --hook powersgd --zero --out none
    refused 2 "--n_layer 99999999999: expected a whole number from 1 to 1024" \
        $TINY_GPT --n_layer 99999999999
    refused 2 "--temperature -0.5: expected a finite number in [0, 100]" $TINY_GPT --temperature -0.5
    refused 2 "--temperature nan: expected a finite number" "$build/bin/gpt_generate" x --temperature nan
    refused 2 "which model?" "$build/bin/gpt_generate" --tokens 5
    refused 2 "--val_fraction 1.5: expected a finite number in (0, 0.99]" \
        "$build/bin/cddp-tokenize" --val_fraction 1.5 in out
    refused 1 "$work holds no complete checkpoint set" "$FM" --resume "$work" --out none
    refused 1 "cannot open --sample-log $work/no/log.0: No such file or directory" \
        "$FM" --sample-log "$work/no/log" --out none
    # A checkpoint whose metadata was tampered with: every bad value is refused before training.
    "$FM" --epochs 1 --limit 256 --log-every 0 --out ck > ck.out 2>&1 || { cat ck.out; fail "no checkpoint"; }
    tamper() { # SRC KEY VALUE: bad.safetensors, the checkpoint SRC with that metadata
        $PY - "$1" bad.safetensors "$2" "$3" <<'EOF'
import json, struct, sys
src, dst, key, value = sys.argv[1:]
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header["__metadata__"][key] = value
h = json.dumps(header).encode()
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + data[8 + n:])
EOF
    }
    for kv in epoch=-5 epoch=99999999999 epoch=abc data_position=-1 lr=nan lr=-1 \
        optimizer_steps=1e3; do
        tamper ck/checkpoint.safetensors "${kv%%=*}" "${kv#*=}"
        refused 1 "bad.safetensors: metadata ${kv%%=*} ${kv#*=}: expected a" \
            "$FM" --resume bad.safetensors --epochs 2 --out none
    done
    # a position beyond the data (and nothing leaked on the way out: LeakSanitizer's exit is 23)
    tamper ck/checkpoint.safetensors data_position 99999999
    refused 1 "sampler state: 99999999 samples of the epoch handed out, but the dataset has" \
        "$FM" --resume bad.safetensors --epochs 2 --out none
    # the generator's state, damaged or zero (a generator that would never leave zero)
    for v in xyz "$(printf '0%.0s' $(seq 64))"; do
        tamper ck/checkpoint.safetensors rng.0 "$v"
        refused 1 "bad.safetensors: metadata rng.0 is '$v', not a generator's state" \
            "$FM" --resume bad.safetensors --epochs 2 --out none
    done
    # --resume OUT: the run's output folder resumes from the checkpoint in it
    "$FM" --resume ck --epochs 2 --limit 256 --log-every 0 --out none > r.out 2>&1 ||
        { cat r.out; fail "--resume of the output folder failed"; }
    grep -q "resumed from ck/checkpoint.safetensors after epoch 1" r.out || { cat r.out; fail "--resume ck: not from its checkpoint"; }
    # --save where nothing can be written: refused before training
    refused 1 "--save $work/none/m.safetensors: cannot write there: No such file or directory (found before training)" \
        "$FM" --save "$work/none/m.safetensors" --out none
    # A GPT checkpoint whose shape is beyond what gpt_train builds, or whose heads do not divide
    "$build/bin/gpt_train" --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --max_iters 1 \
        --eval_interval 1 --eval_iters 1 --final_eval 1 --sample 0 --out g > g.out 2>&1 || { cat g.out; fail "no GPT checkpoint"; }
    tamper g/checkpoint.safetensors n_layer 1048576
    refused 1 "bad.safetensors: a GPT of n_layer 1048576, beyond what gpt_train builds (at most 1024)" \
        "$build/bin/gpt_train" --resume bad.safetensors --out none
    tamper g/checkpoint.safetensors n_head 5
    refused 1 "bad.safetensors: n_embd 32 is not a multiple of n_head 5" \
        "$build/bin/gpt_train" --resume bad.safetensors --out none
    # Training that diverges stops with the reason.
    expect 1 "training diverged (a smaller --lr, now 10?)" "$FM" --lr 10 --limit 4096 --out none
    echo "ok: 15 bad numbers on the command lines, 12 in a checkpoint, a folder, a log that cannot be" \
         "opened, a --save that cannot be written and a diverging run:" \
         "each a clear error and a non-zero exit; --resume of an output folder" ;;
gpt_tokens)
    printf 'the quick brown fox jumps over the lazy dog.\n%.0s' $(seq 400) > text.txt
    "$build/bin/cddp-tokenize" text.txt data > tok.out 2>&1 || { cat tok.out; fail "cddp-tokenize failed"; }
    cat tok.out
    $PY - <<'PYEOF' || fail "the token files are not llm.c's"
import numpy as np
def load(path):  # as llm.c's dataloader reads a token file
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
        assert header[0] == 20240520 and header[1] == 1, header[:3]
        tokens = np.frombuffer(f.read(), dtype=np.uint16)
    assert len(tokens) == header[2], (len(tokens), header[2])
    return tokens
text = open("text.txt", "rb").read()
train, val = load("data/train.bin"), load("data/val.bin")
assert len(train) == int(len(text) * 0.9) and len(train) + len(val) == len(text)
assert bytes(np.concatenate([train, val]).astype(np.uint8)) == text
print("ok: train.bin and val.bin hold the text's %d bytes, 90/10" % len(text))
PYEOF
    run --nproc_per_node 2 "$build/bin/gpt_train" --data data/train.bin --n_layer 1 --n_head 2 --n_embd 32 \
        --block_size 16 --batch_size 4 --max_iters 30 --eval_interval 30 --sample 40 --out none --json > out 2>&1 \
        || { cat out; fail "training on the token files failed"; }
    tail -n 4 out
    grep -q '"iters": 30' out || fail "no JSON line after 30 iterations"
    head -c 2000 data/train.bin > cut.bin
    "$build/bin/gpt_train" --data cut.bin --max_iters 1 --out none > bad.out 2>&1 && fail "a truncated token file was accepted"
    grep -q "cut.bin: truncated: the header promises" bad.out || { cat bad.out; fail "the truncated file's error does not say so"; }
    # The vocabulary: without --vocab_size the largest token sets it; with it, each window is
    # checked as it is read, a token beyond refused naming its file and its place there (val.bin's
    # 40th: the step-0 evaluation's third window; a text split 90/10: counted in the whole file)
    mkdir -p v
    $PY - <<'PYEOF' || fail "cannot write the token files"
import numpy as np
def save(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())
tokens = np.frombuffer(open("data/train.bin", "rb").read()[1024:], dtype=np.uint16).copy()
save("v/big_train.bin", tokens)
val = tokens[:100].copy()
val[40] = 300
save("v/big_val.bin", val)
one = tokens[:1000].copy()
one[950] = 300
save("v/one.bin", one)
PYEOF
    # A token file cut short while training reads it (mapped): the rank dies of SIGBUS, and
    # cddprun says what that means (AddressSanitizer's builds too: it leaves SIGBUS alone here)
    cp data/train.bin v/cut_train.bin && cp data/val.bin v/cut_val.bin
    env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}handle_sigbus=0" \
        "$build/bin/cddprun" --standalone --nproc_per_node 2 $TINY_GPT --batch_size 4 --max_iters 1000000 --eval_interval 1000000 --log_interval 1 \
        --sample 0 --out none --data v/cut_train.bin > cut.out 2>&1 &
    job=$!
    for _ in $(seq 400); do grep -q "^iter " cut.out && break; sleep 0.025; done
    truncate -s 1024 v/cut_train.bin # the header alone
    for _ in $(seq 400); do kill -0 "$job" 2>/dev/null || break; sleep 0.025; done
    kill -0 "$job" 2>/dev/null && { kill "$job"; cat cut.out; fail "training went on from a token file cut short"; }
    wait "$job" && { cat cut.out; fail "training from a token file cut short exited 0"; }
    grep -q "root cause: rank [01] (local rank [01], host .*) was killed by SIGBUS (signal 7) at .* (a file mapped into its memory was cut short or could not be read: a token file rewritten or truncated while training reads it" cut.out ||
        { cat cut.out; fail "cddprun does not say what the SIGBUS of a token file cut short means"; }
    VGPT="$TINY_GPT --batch_size 4 --max_iters 1 --eval_iters 8 --sample 0 --out none"
    $VGPT --data v/big_train.bin > v.out 2>&1 || { cat v.out; fail "training with the vocabulary inferred failed"; }
    grep -q "^gpt_train: 2 layers, 2 heads, width 32, vocabulary 301," v.out || { cat v.out; fail "the vocabulary is not 301"; }
    for c in "v/big_train.bin v/big_val.bin 40" "v/one.bin v/one.bin 950"; do
        set -- $c
        $VGPT --data "$1" --vocab_size 256 > v.out 2>&1 && fail "$1: a token beyond --vocab_size 256 was accepted"
        grep -q "^gpt_train: rank 0: $2: token 300 at $3 (counted from 0) is beyond the model's vocabulary of 256 (--vocab_size)" v.out ||
            { cat v.out; fail "$1: the token beyond the vocabulary is not named as $2's token $3"; }
    done
    # llm.c's shards (FineWeb's fineweb_train_000001.bin, ...): the training tokens in 3 files, one
    # of them shorter than a window, and val.bin as the one validation shard
    $PY - <<'PYEOF' > shards.want || fail "cannot write the shards"
import numpy as np
def save(path, tokens):  # as llm.c's write_datafile
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())
def load(path):
    return np.frombuffer(open(path, "rb").read()[1024:], dtype=np.uint16)
train, val = load("data/train.bin"), load("data/val.bin")
parts = [train[:7000], train[7000:7010], train[7010:]]
for i, part in enumerate(parts):
    save("data/corpus_train_%06d.bin" % (i + 1), part)
save("data/corpus_val_000000.bin", val)
# windows of 16 tokens every 16: none across two shards, none in the 10-token one
print(sum((len(p) - 17) // 16 + 1 for p in parts if len(p) >= 17), len(train))
PYEOF
    read -r windows tokens < shards.want
    GPT="$build/bin/gpt_train --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4 --stride 16"
    GPT="$GPT --max_iters 4 --eval_interval 4 --eval_iters 4 --sample 0 --out none"
    run --nproc_per_node 2 $GPT --data 'data/corpus_train_*.bin' > shards.out 2>&1 \
        || { cat shards.out; fail "training on shards failed"; }
    grep -q "^training windows: $windows ($tokens tokens)" shards.out ||
        { cat shards.out; fail "the shards' windows are not $windows of $tokens tokens"; }
    run --nproc_per_node 2 $GPT --data data/train.bin > one.out 2>&1 || { cat one.out; fail "training on train.bin failed"; }
    v1=$(sed -n 's/^step 0: .*val loss \([0-9.]*\).*/\1/p' shards.out) v2=$(sed -n 's/^step 0: .*val loss \([0-9.]*\).*/\1/p' one.out)
    [ -n "$v1" ] && [ "$v1" = "$v2" ] || fail "the validation shard's loss at step 0, '$v1', is not val.bin's '$v2'"
    rm data/corpus_val_000000.bin
    "$build/bin/gpt_train" --data 'data/corpus_train_*.bin' --max_iters 1 --out none > bad.out 2>&1 && fail "shards without validation shards were accepted"
    grep -q "data/corpus_val_\*.bin: no validation shard (the training shards' pattern with val) matches it" bad.out ||
        { cat bad.out; fail "the missing validation shards' error does not say so"; }
    "$build/bin/gpt_train" --data 'data/corpus_*.bin' --max_iters 1 --out none > bad.out 2>&1 && fail "a pattern without train was accepted"
    grep -q "with train in their file name" bad.out || { cat bad.out; fail "the pattern without train's error does not say so"; }
    # cddp-tokenize --shard_tokens writes such shards: their tokens are train.bin's and val.bin's
    "$build/bin/cddp-tokenize" --shard_tokens 5000 text.txt sdata > stok.out 2>&1 || { cat stok.out; fail "cddp-tokenize --shard_tokens failed"; }
    grep -q "sdata/train_\*.bin (16200 in 4 shards), sdata/val_\*.bin (1800 in 1); train with gpt_train --data 'sdata/train_\*.bin'" stok.out ||
        { cat stok.out; fail "cddp-tokenize --shard_tokens did not say its shards"; }
    $PY - <<'PYEOF' || fail "the shards do not hold train.bin's and val.bin's tokens"
import glob, numpy as np
def load(path):
    return np.frombuffer(open(path, "rb").read()[1024:], dtype=np.uint16)
train = [load(p) for p in sorted(glob.glob("sdata/train_*.bin"))]
assert [len(t) for t in train] == [5000, 5000, 5000, 1200], [len(t) for t in train]
assert (np.concatenate(train) == load("data/train.bin")).all()
assert sorted(glob.glob("sdata/val_*.bin")) == ["sdata/val_000000.bin"]
assert (load("sdata/val_000000.bin") == load("data/val.bin")).all()
PYEOF
    "$build/bin/gpt_train" --data 'sdata/train_*.bin' --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 \
        --batch_size 4 --max_iters 2 --eval_interval 2 --eval_iters 2 --sample 0 --out none > sh.out 2>&1 ||
        { cat sh.out; fail "training on cddp-tokenize's shards failed"; }
    "$build/bin/cddp-tokenize" --shard_tokens 9000 text.txt sdata > bad.out 2>&1 && fail "shards were written beside old ones"
    grep -q "sdata already holds 4 shards (sdata/train_000001.bin): a pattern would read them with the new ones" bad.out ||
        { cat bad.out; fail "no clear error for a folder with shards in it"; }
    "$build/bin/cddp-tokenize" --shard_tokens 0 text.txt x > bad.out 2>&1 && fail "--shard_tokens 0 was accepted"
    grep -q -- "--shard_tokens 0: expected a whole number from 1 to" bad.out || { cat bad.out; fail "no clear error for --shard_tokens 0"; }
    echo "ok: cddp-tokenize, llm.c's format, training on it, a truncated file refused; llm.c's shards:" \
         "$windows windows of $tokens tokens, the validation shard's loss as val.bin's ($v1)"
    ;;
device)
    run --nproc_per_node 2 --tee "$build/bin/ddp_train" --device emu > out 2>&1 || { cat out; fail "ddp_train --device emu failed"; }
    grep -q "^\[rank 1\]: *\[3.0000\]\]" out || { cat out; fail "ddp_train on emu did not reach w = [[2], [3]]"; }
    # AdamW (the GPU check compares it with the CPU): both ranks end with the same w, as on the CPU
    for d in cpu emu; do
        run --nproc_per_node 2 --tee "$build/bin/ddp_train" --optimizer adamw --device $d > aw_$d.out 2>&1 \
            || { cat aw_$d.out; fail "ddp_train --optimizer adamw --device $d failed"; }
        grep --no-group-separator -A1 ": *w:" aw_$d.out | sed 's/^\[rank \([01]\)\]: *//' > aw_$d.w
    done
    [ "$(sort -u aw_cpu.w | wc -l)" = 2 ] && [ "$(wc -l < aw_cpu.w)" = 4 ] && cmp -s aw_cpu.w aw_emu.w \
        || { cat aw_cpu.out aw_emu.out; fail "ddp_train with AdamW: the ranks or the devices disagree"; }
    "$build/bin/ddp_train" --optimizer lion > bad.out 2>&1 && fail "ddp_train took --optimizer lion"
    grep -q "usage: ddp_train .*--optimizer sgd|adamw" bad.out || { cat bad.out; fail "no usage line"; }
    # the same CNN run on the CPU and on emu: the losses and the accuracy, to the last digit
    for d in cpu emu; do
        run --nproc_per_node 2 "$build/bin/fashion_mnist" --device $d --model cnn --epochs 1 --limit 2000 \
            --log-every 0 --out fm_$d --json > fm_$d.out 2>&1 || { cat fm_$d.out; fail "fashion_mnist --device $d failed"; }
        sed -n 's/.*"final_loss": \([0-9.]*\), "test_acc": \([0-9.]*\).*/\1 \2/p' fm_$d.out > fm_$d.res
    done
    [ -s fm_cpu.res ] && cmp -s fm_cpu.res fm_emu.res || fail "fashion_mnist: the CPU gives '$(cat fm_cpu.res)', emu '$(cat fm_emu.res)'"
    # a checkpoint written from the device's memory resumes on the CPU, and goes on as there
    "$build/bin/fashion_mnist" --device cpu --model cnn --resume fm_emu/checkpoint.safetensors --epochs 2 \
        --limit 2000 --log-every 0 --out none > resumed.out 2>&1 || { cat resumed.out; fail "the checkpoint from emu does not resume on the CPU"; }
    grep -q "resumed from fm_emu/checkpoint.safetensors after epoch 1" resumed.out || { cat resumed.out; fail "no resume line"; }
    for d in cpu emu; do
        "$build/bin/gpt_train" --device $d --max_iters 20 --log_interval 10 --eval_interval 10 --eval_iters 2 \
            --final_eval 2 --sample 40 --out none > gpt_$d.out 2>&1 || { cat gpt_$d.out; fail "gpt_train --device $d failed"; }
    done
    for d in cpu emu; do sed 's/, time [0-9.]*ms//; s/; peak resident [0-9.]* MiB$//' gpt_$d.out > gpt_$d.lines; done
    grep -q "^step 20: train loss" gpt_cpu.lines && cmp -s gpt_cpu.lines gpt_emu.lines \
        || { diff gpt_cpu.lines gpt_emu.lines; fail "gpt_train: the CPU's and emu's losses or samples differ"; }
    "$build/bin/fashion_mnist" --device gpu > bad.out 2>&1; rc=$?
    [ $rc = 2 ] && grep -q "'gpu' is not a device (the devices: cpu, emu" bad.out || { cat bad.out; fail "--device gpu: exit $rc"; }
    "$build/bin/gpt_train" --device emu:9 > bad.out 2>&1; rc=$?
    [ $rc = 2 ] && grep -q "emu:9: this machine has 2 emu devices" bad.out || { cat bad.out; fail "--device emu:9: exit $rc"; }
    # --device cuda: on a machine without a GPU (CI), one line that says so and exit 2, whether
    # this build has the CUDA device or not; with a GPU, the seeds' programs train on it
    if [ -e /dev/nvidiactl ]; then
        "$build/bin/ddp_train" --device cuda > cuda.out 2>&1 || { cat cuda.out; fail "ddp_train --device cuda failed on this GPU machine"; }
    else
        for p in fashion_mnist ddp_train; do
            "$build/bin/$p" --device cuda > cuda.out 2>&1; rc=$?
            [ $rc = 2 ] && [ "$(wc -l < cuda.out)" = 1 ] && grep -q "^$p: --device cuda: no CUDA device: " cuda.out \
                || { cat cuda.out; fail "$p --device cuda without a GPU: exit $rc"; }
            # without NVIDIA's driver at all, the words say so (the runtime's own are "driver
            # version is insufficient")
            if ! ldconfig -p | grep -q "libcuda\.so\.1 " && ! grep -q "built without" cuda.out; then
                grep -q "no NVIDIA driver on this machine" cuda.out || { cat cuda.out; fail "$p --device cuda: no word of the missing driver"; }
            fi
        done
    fi
    echo "ok: ddp_train, the CNN on 2 ranks and the GPT train on emu as on the CPU, to the last digit; its checkpoint resumes on the CPU; bad devices refused; no GPU said in one line"
    ;;
*) echo "unknown scenario $scenario"; exit 2 ;;
esac
