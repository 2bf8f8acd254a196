#!/bin/bash
# check.sh CARRY: the GPU check, as one call on the GPU machine (at most about 6 minutes).
#
#   scripts/gpu/prepare.sh                      here, without a GPU: builds CARRY (build-gpu/carry)
#   scripts/gpu/check.sh build-gpu/carry        there, with carry: ["build-gpu/carry"]
#
# In order, each step with its own time limit, skipping what would not end inside the budget
# (CDDP_CHECK_BUDGET_S, default 330 s):
#   1. the card, driver, toolkit, PyTorch and library versions; the programs' libraries resolved
#   2. device_check: every CUDA kernel against the CPU's on fresh random inputs (fp32 within 1e-5
#      of the largest value; the GEMMs are fp32 products, no TF32)
#   3. compute-sanitizer memcheck on device_check
#   4. the seeds' programs on the GPU against the CPU: fashion_mnist's MLP 100 steps with SGD
#      (momentum 0.9) and with AdamW, ddp_train on 1 rank and on 2 ranks sharing the GPU (host-staged
#      reduction): losses within 1e-4 relative
#   5. the MLP's training speed, cddp and PyTorch eager on the same card, rounds interleaved
#      (median and spread), at batch 32 and 256
#   6. compute-sanitizer racecheck, synccheck and initcheck on device_check
# Writes to $OUT (or build-gpu/out): check.log, results.jsonl (the lines for bench/gpu/results.jsonl),
# device_check.jsonl, sanitizer-*.txt; prints a table of every check last and exits 1 when any
# failed or did not run.
#
# Rehearsal without a GPU (every step but the sanitizer's, on the emulated device and PyTorch on
# the CPU): CDDP_CHECK_DEVICE=emu CDDP_CHECK_TORCH_DEVICE=cpu CDDP_CHECK_PYTHON=/usr/bin/python3 \
#   scripts/gpu/check.sh build-gpu/carry
set -u
carry=$(cd "${1:?usage: check.sh CARRY (the folder scripts/gpu/prepare.sh made)}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/build-gpu/out}
mkdir -p "$out"
device=${CDDP_CHECK_DEVICE:-cuda}
torch_device=${CDDP_CHECK_TORCH_DEVICE:-cuda}
py=${CDDP_CHECK_PYTHON:-python3}
budget=${CDDP_CHECK_BUDGET_S:-330}
bin=$carry/bin
data=$carry/data
commit=$(cat "$carry/commit" 2>/dev/null || echo unknown)
today=$(date -u +%F)
start=$(date +%s)
exec > >(tee "$out/check.log") 2>&1
: >"$out/results.jsonl"
summary=""
failed=0

# A check's outcome: name, ok|FAIL|not run, detail.
outcome() {
    summary="$summary$(printf '| %s | %s | %s |' "$1" "$2" "$3")
"
    [ "$2" = ok ] || failed=1
}

# Whether a step of up to $1 seconds still fits in the budget.
fits() { [ $(($(date +%s) - start + $1)) -le "$budget" ]; }

# One JSON line of results.jsonl: what impl value unit config [extra JSON fields].
result() {
    printf '{"date": "%s", "commit": "%s", "card": "%s", "what": "%s", "impl": "%s", "value": %s, "unit": "%s", "config": "%s"%s}\n' \
        "$today" "$commit" "$card" "$1" "$2" "$3" "$4" "$5" "${6:-}" >>"$out/results.jsonl"
}

echo "== 1. versions"
libs=/tmp/cddp-libs
rm -rf "$libs" && mkdir -p "$libs"
for d in "$carry"/debs/*.deb; do
    if command -v dpkg >/dev/null; then
        dpkg -x "$d" "$libs"
    else # no dpkg: a .deb is an ar archive holding data.tar.*
        "$py" - "$d" "$libs" <<'EOF'
import io, sys, tarfile
raw = open(sys.argv[1], "rb").read()
at = 8
while at < len(raw):
    name, size = raw[at:at + 16].decode().strip().rstrip("/"), int(raw[at + 48:at + 58])
    if name.startswith("data.tar"):
        safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        tarfile.open(fileobj=io.BytesIO(raw[at + 60:at + 60 + size])).extractall(sys.argv[2], **safe)
    at += 60 + size + (size & 1)
EOF
    fi
done
ld=$libs/usr/lib/x86_64-linux-gnu:$libs/usr/lib/x86_64-linux-gnu/openblas-pthread:$libs/lib/x86_64-linux-gnu
# cuBLASLt: the Python wheels' (GPU.md), else the toolkit's.
NV=$("$py" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) && ld=$NV/cu13/lib:$ld
[ -d /usr/local/cuda/lib64 ] && ld=$ld:/usr/local/cuda/lib64
# cddp's programs get the carried libraries; python3 (PyTorch) keeps its own.
cddp() { LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$card" ] || card="no GPU ($device rehearsal)"
echo "card: $card"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
nvcc --version 2>/dev/null | tail -n 2
compute-sanitizer --version 2>/dev/null | head -n 2
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'
echo "cddp commit: $commit; library path: $ld"
unresolved=$(cddp ldd "$bin/fashion_mnist" | grep "not found")
if [ -n "$unresolved" ]; then
    outcome "libraries" FAIL "$(echo $unresolved)"
else
    outcome "libraries" ok "every library of the programs resolved"
fi

echo "== 2. device_check $device"
if fits 60; then
    timeout 60 env LD_LIBRARY_PATH="$ld" "$bin/device_check" "$device" --json >"$out/device_check.jsonl"
    rc=$?
    cat "$out/device_check.jsonl"
    line=$(sed -n 's/.*"summary": "\(.*\)".*/\1/p' "$out/device_check.jsonl")
    outcome "kernels against the CPU (device_check $device)" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "${line:-exit $rc}"
    fails=$(grep -c '"FAIL"' "$out/device_check.jsonl")
    result device_check cddp "$fails" "failed cases" "$device against the CPU, seed 1: $line"
else
    outcome "kernels against the CPU" "not run" "out of time"
fi

# sanitize TOOL SECONDS: compute-sanitizer's TOOL on device_check.
sanitize() {
    if ! command -v compute-sanitizer >/dev/null || [ "$device" != cuda ]; then
        outcome "compute-sanitizer $1" "not run" "no compute-sanitizer or no GPU"
        return
    fi
    fits "$2" || {
        outcome "compute-sanitizer $1" "not run" "out of time"
        return
    }
    local t0
    t0=$(date +%s)
    timeout "$2" env LD_LIBRARY_PATH="$ld" compute-sanitizer --tool "$1" --error-exitcode 9 \
        --print-limit 20 "$bin/device_check" cuda >"$out/sanitizer-$1.txt" 2>&1
    local rc=$? s
    s=$(grep "ERROR SUMMARY" "$out/sanitizer-$1.txt" | tail -n 1)
    tail -n 3 "$out/sanitizer-$1.txt"
    outcome "compute-sanitizer $1" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "${s:-exit $rc} ($(($(date +%s) - t0)) s)"
}
echo "== 3. compute-sanitizer memcheck"
sanitize memcheck 90

echo "== 4. the seeds' programs, $device against cpu"
# close NAME A B: A and B within 1e-4 relative.
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
                                          exit !(a != "" && b != "" && d <= 1e-4 * m) }'; }
# mlp NAME ARGS...: fashion_mnist's MLP, 100 steps of 64 on the CPU and on the device.
mlp() {
    local name=$1 c g
    shift
    fits 60 || {
        outcome "$name" "not run" "out of time"
        return
    }
    local args="--model mlp --epochs 1 --limit 6400 --batch-size 64 --log-every 10 --out none --json --data $data"
    c=$(cddp timeout 30 "$bin/fashion_mnist" $args "$@" --device cpu 2>&1)
    g=$(cddp timeout 30 "$bin/fashion_mnist" $args "$@" --device "$device" 2>&1)
    paste <(echo "$c" | grep "loss is") <(echo "$g" | grep "loss is" | sed 's/.*loss is //')
    local lc lg
    lc=$(echo "$c" | sed -n 's/.*"final_loss": \([0-9.e+-]*\).*/\1/p')
    lg=$(echo "$g" | sed -n 's/.*"final_loss": \([0-9.e+-]*\).*/\1/p')
    [ -n "$lg" ] || echo "$g" | tail -n 5
    local ok=FAIL
    close "$lg" "$lc" && ok=ok
    outcome "$name" "$ok" "loss after 100 steps: cpu $lc, $device ${lg:-none}"
    result "${name%% *}_loss_100_steps" cddp "${lg:-null}" loss "$device, $*, batch 64; cpu: $lc" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
}
mlp "mlp_sgd (fashion_mnist --optimizer sgd)" --optimizer sgd --lr 0.01
mlp "mlp_adamw (fashion_mnist --optimizer adamw)" --optimizer adamw --lr 0.001
# ranks N: ddp_train on N ranks, the CPU against the device (every rank on the same one).
ranks() {
    fits 60 || {
        outcome "ddp_train $1 rank(s)" "not run" "out of time"
        return
    }
    local d=$device
    [ "$d" = cuda ] && d=cuda:0
    local c g
    local run="$bin/cddprun --nproc_per_node $1 --local_ranks_filter 0 $bin/ddp_train --device"
    c=$(cddp timeout 60 $run cpu 2>&1)
    g=$(cddp timeout 60 $run "$d" 2>&1)
    local lc lg wc wg
    lc=$(echo "$c" | sed -n 's|^100/500 loss:||p')
    lg=$(echo "$g" | sed -n 's|^100/500 loss:||p')
    wc=$(echo "$c" | grep -A1 '^w:' | tr -d ' \n')
    wg=$(echo "$g" | grep -A1 '^w:' | tr -d ' \n')
    echo "$g" | tail -n 4
    local ok=FAIL
    close "$lg" "$lc" && [ -n "$wg" ] && [ "$wg" = "$wc" ] && ok=ok
    outcome "ddp_train, $1 rank(s) on $d" "$ok" \
        "loss at 100 of 500: cpu $lc, $d ${lg:-none}; final $wc, ${wg:-none}"
    result ddp_train_loss_100_steps cddp "${lg:-null}" loss "$d, $1 rank(s); cpu: $lc" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
}
ranks 1
ranks 2

echo "== 5. MLP training speed, cddp and PyTorch on $torch_device"
# median LIST: the median, and the spread as min..max.
median() {
    tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              if (NR) printf "%.1f %s..%s", m, v[1], v[NR] }'
}
speed() {
    local batch=$1 rounds=3 cs="" ts="" i c t
    fits 120 || {
        outcome "mlp_train batch $batch" "not run" "out of time"
        return
    }
    for i in $(seq $rounds); do
        c=$(cddp timeout 60 "$bin/bench_mlp" --device "$device" --batch-size "$batch" --epochs 3 \
            --data "$data" 2>&1 | grep '"impl"')
        t=$(timeout 90 "$py" "$root/bench/mlp_torch.py" --device "$torch_device" \
            --batch-size "$batch" --epochs 3 --data "$data" 2>&1 | grep '"impl"')
        echo "$c"
        echo "$t"
        cs="$cs $(echo "$c" | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p')"
        ts="$ts $(echo "$t" | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p')"
    done
    local cm tm cspread tspread
    read -r cm cspread <<<"$(echo $cs | median)"
    read -r tm tspread <<<"$(echo $ts | median)"
    cm=${cm:-null} tm=${tm:-null}
    local config="784-512-512-10 fp32, SGD lr 0.01, batch $batch, 3 epochs of 20000 samples, each batch copied from the host; $rounds rounds interleaved"
    result mlp_train cddp "$cm" samples/s "$config, $device" ", \"spread\": \"$cspread\""
    result mlp_train torch-eager "$tm" samples/s "$config, $torch_device" ", \"spread\": \"$tspread\""
    local ok=FAIL
    [ "$(echo $cs | wc -w)" = $rounds ] && [ "$(echo $ts | wc -w)" = $rounds ] && ok=ok
    outcome "mlp_train batch $batch, samples/s" $ok \
        "cddp $cm ($cspread), PyTorch eager $tm ($tspread), ratio $(awk -v a="$cm" -v b="$tm" 'BEGIN { if (b > 0) printf "%.2f", a / b }')"
}
speed 32
speed 256

echo "== 6. compute-sanitizer racecheck, synccheck, initcheck"
sanitize racecheck 60
sanitize synccheck 45
sanitize initcheck 45

echo
echo "== the GPU check: $card, cddp $commit, $(($(date +%s) - start)) s"
echo "| check | outcome | detail |"
echo "|---|---|---|"
printf '%s' "$summary"
echo
echo "results.jsonl ($out/results.jsonl; append to bench/gpu/results.jsonl):"
cat "$out/results.jsonl"
exit $failed
