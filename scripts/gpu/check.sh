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
#      (momentum 0.9; loss within 1e-4 relative) and with AdamW (1e-2: see mlp_adamw below),
#      ddp_train with SGD and with AdamW on 1 rank and on 2 ranks sharing the GPU (host-staged
#      reduction): losses within 1e-4 relative
#   5. the GPT: a tiny one (2 layers, width 64) 20 iterations on the GPU against the CPU, every
#      loss within 1e-4 relative in float32 and 1e-2 in bf16 (with heads of 16, and of 32 over a
#      context of 96: the flash kernels), and its greedy samples; after 200
#      iterations on the GPU its checkpoint loads strictly into PyTorch and into cddp on the
#      CPU, each with the GPU's validation loss (1e-4)
#   6. the MLP's training speed, cddp and PyTorch eager on the same card, rounds interleaved
#      (median and spread), at batch 32 and 256
#   7. the GPT's training speed (6 layers, width 384, context 256), cddp and PyTorch eager, in
#      float32 and bf16, and how much of cddp's iteration the host spends queuing its kernels
#   9. the GPT on 2 ranks sharing the GPU (host-staged reduction): the tiny one against 2 ranks on
#      the CPU (1e-4), with --zero (ZeRO-1), --zero 2, --activation_checkpointing (and both)
#      and with --ipc (CUDA IPC, with and without --zero)
#      against itself staged (1e-5), the 6-layer one's speed staged and with --ipc against
#      PyTorch DDP over gloo on the same GPU; and
#      NCCL (the wheels' library) on one rank: the nccl transport's allreduce of device memory (and its
#      order with the device's stream), ddp_train --nccl against ddp_train, the 6-layer GPT's
#      tokens/s with --nccl against without (bar: 2 %), and 2 ranks on the one GPU refused with
#      --nccl (and left to the auto choice: host copies, rank 0 says why); whether CUDA IPC works between two processes on the GPU (ipc_probe) and the ipc transport's
#      collectives on 2 ranks sharing it (ipc_check, bit for bit); last, rank 1 of 2 on the GPU
#      SIGKILLed mid-training, staged and with --ipc: the job stops naming it
#  11. gpt_train's recipe (its defaults: 4 layers, width 128, 2000 iterations on fortunes) in bf16
#      and in fp32 on the GPU: the final validation losses within 0.05 of each other
#  10. (only when asked for) GPT-2 124M in bf16, batch 16 x 1024: cddp's --bench against PyTorch
#      eager and torch.compile, and the card's bf16 matrix product rate
#   8. (last) compute-sanitizer racecheck, synccheck and initcheck on device_check; memcheck and
#      racecheck on two iterations of the tiny GPT (with its sampling)
# CDDP_CHECK_STEPS (default "2 3 4 5 6 7 9 11 8"; 10 when asked for) picks the steps to run; the
# versions always run.
# Writes to $OUT (or build-gpu/out): check.log, results.jsonl (the lines for
# bench/gpu/results.jsonl), device_check.jsonl, sanitizer-device_check.txt and
# sanitizer-gpt_train.txt; prints a table of the checks that ran last and exits 1 when any failed
# or did not run.
#
# Rehearsal without a GPU (every step but the sanitizers' and NCCL's, on the emulated device and
# PyTorch on the CPU):
#   CDDP_CHECK_DEVICE=emu CDDP_CHECK_TORCH_DEVICE=cpu CDDP_CHECK_PYTHON=/usr/bin/python3 \
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
steps=" ${CDDP_CHECK_STEPS:-2 3 4 5 6 7 9 11 8} "
bin=$carry/bin
data=$carry/data
commit=$(cat "$carry/commit" 2>/dev/null || echo unknown)
today=$(date -u +%F)
start=$(date +%s)
exec > >(tee "$out/check.log") 2>&1
: >"$out/results.jsonl"
rm -f "$out"/sanitizer-*.txt
summary=""
failed=0

# A check's outcome: name, ok|FAIL|not run, detail.
outcome() {
    summary="$summary$(printf '| %s | %s | %s |' "$1" "$2" "$3")
"
    [ "$2" = ok ] || failed=1
}

# Whether step $1 was asked for (CDDP_CHECK_STEPS).
want() { [ "${steps#* $1 }" != "$steps" ]; }

# Whether a step of up to $1 seconds still fits in the budget.
fits() { [ $(($(date +%s) - start + $1)) -le "$budget" ]; }

# One JSON line of results.jsonl: what impl value unit config [extra JSON fields].
result() {
    printf '{"date": "%s", "commit": "%s", "card": "%s", "what": "%s", "impl": "%s", "value": %s, "unit": "%s", "config": "%s"%s}\n' \
        "$today" "$commit" "$card" "$1" "$2" "$3" "$4" "$5" "${6:-}" >>"$out/results.jsonl"
}

echo "== 1. versions"
. "$root/scripts/gpu/env.sh"
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
if ! want 2; then
    :
elif fits 60; then
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

# sanitize TOOL SECONDS [PROGRAM ARGS...]: compute-sanitizer's TOOL on PROGRAM (default
# device_check) on the device; its report appended to sanitizer-PROGRAM.txt (a file per program:
# $OUT brings back 8 files at most).
sanitize() {
    local tool=$1 secs=$2 prog=${3:-device_check} label report
    if [ $# -gt 2 ]; then shift 3; else shift 2; fi
    local args=("$@")
    report=$out/sanitizer-$prog.txt
    if [ "$prog" = device_check ]; then
        args=(cuda) label=$tool
    else
        label="$tool on $prog"
    fi
    if ! command -v compute-sanitizer >/dev/null || [ "$device" != cuda ]; then
        outcome "compute-sanitizer $label" "not run" "no compute-sanitizer or no GPU"
        return
    fi
    fits "$secs" || {
        outcome "compute-sanitizer $label" "not run" "out of time"
        return
    }
    local t0 rc s
    t0=$(date +%s)
    echo "== compute-sanitizer --tool $tool $prog ${args[*]}" >>"$report"
    timeout "$secs" env LD_LIBRARY_PATH="$ld" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        --print-limit 20 "$bin/$prog" "${args[@]}" >>"$report" 2>&1
    rc=$?
    s=$(grep "ERROR SUMMARY\|RACECHECK SUMMARY" "$report" | tail -n 1)
    tail -n 3 "$report"
    outcome "compute-sanitizer $label" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "${s:-exit $rc} ($(($(date +%s) - t0)) s)"
}
echo "== 3. compute-sanitizer memcheck"
want 3 && sanitize memcheck 90

echo "== 4. the seeds' programs, $device against cpu"
# close A B [BOUND [abs]]: A and B within BOUND (default 1e-4) relative (with abs: absolute).
close() { awk -v a="$1" -v b="$2" -v e="${3:-1e-4}" -v abs="${4:-}" 'BEGIN { d = a - b; if (d < 0) d = -d;
                                    m = abs != "" ? 1 : b < 0 ? -b : b; exit !(a != "" && b != "" && d <= e * m) }'; }
# mlp NAME BOUND ARGS...: fashion_mnist's MLP, 100 steps of 64 on the CPU and on the device, the
# losses after 100 steps within BOUND relative.
mlp() {
    local name=$1 bound=$2 c g
    shift 2
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
    close "$lg" "$lc" "$bound" && ok=ok
    outcome "$name" "$ok" "loss after 100 steps: cpu $lc, $device ${lg:-none} (bound $bound)"
    result "${name%% *}_loss_100_steps" cddp "${lg:-null}" loss "$device, $*, batch 64; cpu: $lc" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
}
if want 4; then
    mlp "mlp_sgd (fashion_mnist --optimizer sgd)" 1e-4 --optimizer sgd --lr 0.01
    # AdamW's first steps move every weight by about lr whatever its gradient's size, so a gradient
    # that is rounding noise (cuBLAS and oneDNN add in other orders) moves its weight as far as a real
    # one, and the two runs part: on the same binary, two CPUs (a Zen 4 and the GPU machine's) end
    # this run 4e-3 apart. AdamW is held to 1e-4 on ddp_train below; here, to learning the same.
    mlp "mlp_adamw (fashion_mnist --optimizer adamw)" 1e-2 --optimizer adamw --lr 0.001
    # ranks N [OPTIMIZER]: ddp_train on N ranks, the CPU against the device (every rank on the same
    # one), with SGD (default) or AdamW.
    ranks() {
        local opt=${2:-sgd}
        fits 60 || {
            outcome "ddp_train $1 rank(s), $opt" "not run" "out of time"
            return
        }
        local d=$device
        [ "$d" = cuda ] && d=cuda:0
        local c g
        local run="$bin/cddprun --nproc_per_node $1 --local_ranks_filter 0 $bin/ddp_train --optimizer $opt --device"
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
        outcome "ddp_train, $1 rank(s) on $d, $opt" "$ok" \
            "loss at 100 of 500: cpu $lc, $d ${lg:-none}; final $wc, ${wg:-none}"
        result ddp_train_loss_100_steps cddp "${lg:-null}" loss "$d, $1 rank(s), $opt; cpu: $lc" \
            ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
    }
    ranks 1
    ranks 2
    ranks 1 adamw
    ranks 2 adamw
fi

echo "== 5. the GPT, $device against cpu"
# gpt NAME BOUND ARGS...: a tiny GPT (2 layers, width 64) for 20 iterations on the CPU and on the
# device: every iteration's loss and the final validation loss within BOUND relative.
tiny="--n_layer 2 --n_head 4 --n_embd 64 --block_size 32 --batch_size 8 --max_iters 20
      --warmup_iters 5 --log_interval 1 --eval_interval 10 --eval_iters 2 --out none --sample 60
      --temperature 0 --prompt A --json --data $data/fortunes"
# the 6-layer GPT of the speed checks (steps 7 and 9): its shape and 30 iterations, for cddp and
# bench/gpt_torch.py alike; gpt6 adds gpt_train's one short evaluation and its JSON
gpt6_shape="--n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --batch_size 16 --max_iters 30"
gpt6="$gpt6_shape --eval_interval 1000 --eval_iters 1 --final_eval 2 --sample 0 --out none --json
      --data $data/fortunes"
# val_loss OUTPUT: gpt_train's validation loss in its JSON line
val_loss() { echo "$1" | sed -n 's/.*"val_loss": \([0-9.e+-]*\).*/\1/p'; }
# apart CPU_OUTPUT DEVICE_OUTPUT: the largest relative difference between two gpt_train runs' 20
# iteration losses and validation losses ("none" when either has not all 21)
apart() {
    awk -v a="$(losses "$1")" -v b="$(losses "$2")" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
        if (n != 21 || m != n) { print "none"; exit }
        for (i = 1; i <= n; i++) { d = (x[i] - y[i]) / x[i]; if (d < 0) d = -d; if (d > w) w = d }
        printf "%.2g", w }'
}
losses() {
    echo "$(echo "$1" | sed -n 's/^iter [0-9]*: loss \([0-9.]*\).*/\1/p' | tr '\n' ' ') $(val_loss "$1")"
}
gpt() {
    local name=$1 bound=$2 c g
    shift 2
    fits 60 || {
        outcome "$name" "not run" "out of time"
        return
    }
    c=$(cddp timeout 60 "$bin/gpt_train" $tiny "$@" --device cpu 2>&1)
    g=$(cddp timeout 60 "$bin/gpt_train" $tiny "$@" --device "$device" 2>&1)
    paste <(echo "$c" | grep "^iter") <(echo "$g" | grep "^iter" | sed 's/,.*//')
    echo "$g" | grep -A1 "^sample" | tail -n 1 | sed "s/^/$device sample: /"
    echo "$c" | grep -A1 "^sample" | tail -n 1 | sed 's/^/cpu sample: /'
    local vc vg worst
    vc=$(val_loss "$c") vg=$(val_loss "$g") worst=$(apart "$c" "$g")
    [ -n "$vg" ] || echo "$g" | tail -n 5
    local ok=FAIL
    [ "$worst" != none ] && awk -v w="$worst" -v e="$bound" 'BEGIN { exit !(w <= e) }' && ok=ok
    outcome "$name" "$ok" "20 iterations' losses and the validation loss: largest difference $worst relative (bound $bound); val cpu $vc, $device ${vg:-none}"
    result "${name%% *}_20_steps" cddp "${vg:-null}" "val loss" "$device, $*; cpu: $vc; largest difference $worst" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
}
# ckpt: the tiny GPT trained 200 iterations on the device writes its checkpoint; PyTorch's nanoGPT
# loads it strictly (scripts/gpu/ckpt_val_loss.py) and cddp on the CPU starts from it: each
# validation loss over the whole validation text within 1e-4 relative of the device's. (After 20
# iterations attention hardly counts yet: PyTorch's loss with 2 heads instead of 4 differed by
# 2e-7; after 200 by 7e-4.)
ckpt() {
    fits 60 || {
        outcome "gpt_checkpoint" "not run" "out of time"
        return
    }
    local dir=$out/gpt_ckpt tok=$data/fortunes_tokens g c vg vc vt ok=FAIL
    rm -rf "$dir"
    g=$(cddp timeout 60 "$bin/gpt_train" $tiny --data "$tok/train.bin" --out "$dir" \
        --max_iters 200 --eval_interval 100 --log_interval 0 --device "$device" 2>&1)
    c=$(cddp timeout 60 "$bin/gpt_train" $tiny --data "$tok/train.bin" --max_iters 0 \
        --init_from "$dir/checkpoint.safetensors" --device cpu 2>&1)
    vt=$(timeout 120 "$py" "$root/scripts/gpu/ckpt_val_loss.py" "$dir/checkpoint.safetensors" \
        "$tok/val.bin" 4 2>&1 | tail -n 1)
    vg=$(val_loss "$g") vc=$(val_loss "$c")
    [ -n "$vc" ] || echo "$c" | tail -n 3
    close "$vc" "$vg" && close "$vt" "$vg" && ok=ok
    outcome "gpt_checkpoint (saved on $device; PyTorch strict, cddp on cpu)" "$ok" \
        "validation loss: $device ${vg:-none}, cddp cpu from its checkpoint ${vc:-none}, PyTorch ${vt:-none}"
    result gpt_checkpoint_val_loss cddp "${vc:-null}" "val loss" \
        "saved on $device, evaluated by cddp on cpu; $device: ${vg:-none}, PyTorch: ${vt:-none}" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
}
if want 5; then
    gpt "gpt_fp32 (gpt_train, 2 layers, width 64)" 1e-4 --dtype fp32
    gpt "gpt_bf16 (gpt_train --dtype bf16)" 1e-2 --dtype bf16
    gpt "gpt_bf16_by_rows (2 heads of 32, context 96: attention by rows)" 1e-2 --dtype bf16 \
        --n_head 2 --block_size 96
    ckpt
fi

echo "== 6. MLP training speed, cddp and PyTorch on $torch_device"
# median LIST: the median, and the spread as min..max.
median() {
    tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              if (NR) printf "%.1f %s..%s", m, v[1], v[NR] }'
}
# versus WHAT UNIT LABEL ROUNDS "CDDP'S VALUES" "PYTORCH'S VALUES" CONFIG: the median and spread
# of each side's rounds as results.jsonl lines and one outcome (ok when every round gave a value).
versus() {
    local cm tm cspread tspread ok=FAIL
    read -r cm cspread <<<"$(echo $5 | median)"
    read -r tm tspread <<<"$(echo $6 | median)"
    cm=${cm:-null} tm=${tm:-null}
    result "$1" cddp "$cm" "$2" "$7, $device" ", \"spread\": \"$cspread\""
    result "$1" torch-eager "$tm" "$2" "$7, $torch_device" ", \"spread\": \"$tspread\""
    [ "$(echo $5 | wc -w)" = "$4" ] && [ "$(echo $6 | wc -w)" = "$4" ] && ok=ok
    outcome "$3, $2" $ok "cddp $cm ($cspread), PyTorch eager $tm ($tspread), ratio $(ratio "$cm" "$tm")"
}
# host_queue OUTPUT: "forward + backward queued in F ms of an M ms iteration" from gpt_train's
# JSON (its forward and backward time the host's queuing: no host wait inside them on one rank),
# to tell a step bound by the host's queuing (F near M) from one bound by the GPU
host_queue() {
    echo "$1" | sed -n 's/.*"median_iter_ms": \([0-9.]*\).*"iter_ms": {"forward": \([0-9.]*\), "backward": \([0-9.]*\).*/\1 \2 \3/p' |
        tail -n 1 | awk '{ printf "forward + backward queued in %.1f ms of a %.1f ms iteration", $2 + $3, $1 }'
}
# tokens_per_s N OUTPUT: N tokens an iteration over the median iteration in OUTPUT's JSON
# ("median_iter_ms", cddp's and bench/gpt_torch.py's), to 1 decimal (nothing without one)
tokens_per_s() {
    echo "$2" | sed -n 's/.*"median_iter_ms": \([0-9.]*\).*/\1/p' |
        awk -v n="$1" '{ if ($1 > 0) printf "%.1f", n * 1000 / $1 }'
}
# ratio A B: A / B to 2 decimals (nothing when B is not a number above 0)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b }'; }
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
    versus mlp_train samples/s "mlp_train batch $batch" "$rounds" "$cs" "$ts" \
        "784-512-512-10 fp32, SGD lr 0.01, batch $batch, 3 epochs of 20000 samples, each batch copied from the host; $rounds rounds interleaved"
}
if want 6; then
    speed 32
    speed 256
fi

echo "== 7. the GPT's training speed, cddp and PyTorch eager on $torch_device"
# The larger GPT of the CPU's benchmarks (6 layers, 6 heads, width 384, context 256), batch 16,
# 30 iterations: the median iteration of each (PyTorch's model is tests/reference/nanogpt.py:
# nanoGPT's with the attention written out, no fused kernel).
gpt_speed() {
    local dtype=$1 rounds=2 cs="" ts="" i c t
    fits 90 || {
        outcome "gpt_train $dtype speed" "not run" "out of time"
        return
    }
    for i in $(seq $rounds); do
        c=$(cddp timeout 90 "$bin/gpt_train" $gpt6 --dtype "$dtype" --device "$device" 2>&1 |
            grep '"median_iter_ms"')
        t=$(timeout 120 "$py" "$root/bench/gpt_torch.py" $gpt6_shape --dtype "$dtype" \
            --device "$torch_device" --eval_batches 2 --data "$data/fortunes" 2>&1 | grep '"impl"')
        echo "$c"
        echo "$t"
        cs="$cs $(tokens_per_s $((16 * 256)) "$c")"
        ts="$ts $(tokens_per_s $((16 * 256)) "$t")"
    done
    versus gpt_train tokens/s "gpt_train $dtype" "$rounds" "$cs" "$ts" \
        "GPT 6 layers, 6 heads, width 384, context 256, batch 16, AdamW, $dtype; tokens/s of the median of 30 iterations, $rounds runs interleaved"
    outcome "gpt_train $dtype, the host's share" "$([ -n "$(host_queue "$c")" ] && echo ok || echo FAIL)" "$(host_queue "$c")"
}
if want 7; then
    gpt_speed fp32
    gpt_speed bf16
fi

echo "== 9. the GPT on 2 ranks sharing the GPU (host-staged reduction)"
# The tiny GPT on 2 ranks, every rank on the first GPU, against the same 2 ranks on the CPU; then
# the 6-layer GPT's speed on 2 ranks sharing the GPU, cddp against PyTorch DDP over gloo (both
# ranks on cuda:0, its CUDA tensors staged through the host), 30 iterations each.
gpt2() {
    local d=$device
    [ "$d" = cuda ] && d=cuda:0
    fits 60 || {
        outcome "gpt_2ranks" "not run" "out of time"
        return
    }
    local run="$bin/cddprun --nproc_per_node 2 --local_ranks_filter 0" c g
    c=$(cddp timeout 60 $run "$bin/gpt_train" $tiny --device cpu 2>&1)
    g=$(cddp timeout 60 $run "$bin/gpt_train" $tiny --device "$d" 2>&1)
    local vc vg worst
    vc=$(val_loss "$c") vg=$(val_loss "$g") worst=$(apart "$c" "$g")
    [ -n "$vg" ] || echo "$g" | tail -n 8
    local ok=FAIL
    [ "$worst" != none ] && awk -v w="$worst" 'BEGIN { exit !(w <= 1e-4) }' && ok=ok
    outcome "gpt_2ranks (the tiny GPT, 2 ranks on $d)" "$ok" "against 2 ranks on the CPU: largest difference $worst relative (bound 1e-4); val cpu $vc, $d ${vg:-none}"
    result gpt_2ranks_20_steps cddp "${vg:-null}" "val loss" "$d, 2 ranks; cpu: $vc; largest difference $worst" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
    # near_g NAME AGAINST ARGS...: the tiny GPT with ARGS on the device against g's run (the largest
    # relative difference within 1e-5): the outcome NAME, its line saying what it was held against
    near_g() {
        local name=$1 against=$2 out v w k=FAIL
        shift 2
        out=$(cddp timeout 60 $run "$bin/gpt_train" $tiny --device "$d" "$@" 2>&1)
        v=$(val_loss "$out") w=$(apart "$g" "$out")
        [ -n "$v" ] || echo "$out" | tail -n 8
        [ "$w" != none ] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }' && k=ok
        outcome "$name" "$k" "against $against: largest difference $w relative (bound 1e-5); val ${v:-none}"
    }
    # ZeRO-1 on the device (the optimizer's state and step sharded over the 2 ranks): DDP's losses
    near_g "gpt_2ranks --zero (ZeRO-1, 2 ranks on $d)" "DDP on $d" --zero
    # ZeRO-2 (the gradients outside each rank's shard zeroed on the device) and activation
    # checkpointing (every block run again in backward, on the context's scratch): DDP's losses
    local a i
    for a in "--zero 2" "--activation_checkpointing" "--zero 2 --activation_checkpointing"; do
        # shellcheck disable=SC2086 # the options are their words
        near_g "gpt_2ranks $a (2 ranks on $d)" "DDP on $d" $a
    done
    # CUDA IPC (--ipc: each rank sums its part from the other's memory on the GPU): the staged
    # path's losses, with and without ZeRO-1 (each sum has the same two terms either way)
    for i in "" --zero; do
        # shellcheck disable=SC2086 # none, or the option
        near_g "gpt_2ranks --ipc $i (CUDA IPC, 2 ranks on $d)" "the staged reduction" --ipc $i
    done
    fits 90 || {
        outcome "gpt_2ranks_1gpu speed" "not run" "out of time"
        return
    }
    c=$(cddp timeout 90 $run "$bin/gpt_train" $gpt6 --device "$d" 2>&1 | grep '"median_iter_ms"')
    i=$(cddp timeout 90 $run "$bin/gpt_train" $gpt6 --device "$d" --ipc 2>&1 | grep '"median_iter_ms"')
    local td=$torch_device
    [ "$td" = cuda ] && td=cuda:0
    # cddprun with the carried libraries, PyTorch's ranks with the environment's own
    t=$(cddp timeout 150 "$bin/cddprun" --nproc_per_node 2 env LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \
        "$py" "$root/bench/gpt_torch.py" $gpt6_shape --device "$td" --eval_batches 2 \
        --data "$data/fortunes" 2>&1)
    echo "$c"
    echo "$t" | grep -q '"impl"' || echo "$t" | grep -v '^ *$' | tail -n 12
    t=$(echo "$t" | grep '"impl"')
    echo "$t"
    echo "$i"
    local cv iv tv best
    cv=$(tokens_per_s $((2 * 16 * 256)) "$c")
    iv=$(tokens_per_s $((2 * 16 * 256)) "$i")
    tv=$(tokens_per_s $((2 * 16 * 256)) "$t")
    best=$(awk -v a="${cv:-0}" -v b="${iv:-0}" 'BEGIN { m = a > b ? a : b; if (m > 0) print m }')
    local config="GPT 6 layers, 6 heads, width 384, context 256, 2 ranks x batch 16 on one GPU, AdamW, fp32; tokens/s (both ranks) of the median of 30 iterations"
    result gpt_2ranks_1gpu cddp "${best:-null}" tokens/s "$config, the better of cddp-staged and cddp-ipc, $d"
    result gpt_2ranks_1gpu cddp-staged "${cv:-null}" tokens/s "$config, host-staged reduction, $d"
    result gpt_2ranks_1gpu cddp-ipc "${iv:-null}" tokens/s "$config, CUDA IPC (--ipc), $d"
    result gpt_2ranks_1gpu torch-gloo "${tv:-null}" tokens/s "$config, DistributedDataParallel over gloo, $td"
    ok=FAIL
    [ -n "$cv" ] && [ -n "$iv" ] && [ -n "$tv" ] && ok=ok
    outcome "gpt_2ranks_1gpu fp32, tokens/s" $ok "cddp staged ${cv:-none}, CUDA IPC ${iv:-none}, PyTorch DDP over gloo ${tv:-none}; best / gloo $(ratio "$best" "$tv")"
}
# NCCL itself (the nccl transport, the wheels' library) on one rank: an allreduce of device memory.
nccl1() {
    if [ "$device" != cuda ] || ! fits 30; then
        outcome "nccl transport, 1 rank" "not run" "NCCL needs a GPU, or out of time"
        return
    fi
    local d=$device o
    [ "$d" = cuda ] && d=cuda:0
    o=$(cddp timeout 30 "$bin/nccl_test" 20 "$d" 2>&1)
    echo "$o" | tail -n 2
    local ok=FAIL
    echo "$o" | grep -q "allreduce ok (1 ranks, NCCL, $d; ordered with the device's queue)" && ok=ok
    outcome "nccl transport, 1 rank on $d" "$ok" "$(echo "$o" | tail -n 1)"
    # DDP over NCCL on one rank: every loss and the weights as without it
    local a b
    # the losses and weights (the log's lines, which name the backend, apart)
    a=$(cddp timeout 60 "$bin/ddp_train" --device "$d" --optimizer adamw 2>&1 | grep "loss:\|\]" |
        grep -v '^\[cddp')
    b=$(cddp timeout 60 "$bin/ddp_train" --device "$d" --optimizer adamw --nccl 2>&1)
    echo "$b" | tail -n 3
    b=$(echo "$b" | grep "loss:\|\]" | grep -v '^\[cddp')
    ok=FAIL
    [ -n "$a" ] && [ "$a" = "$b" ] && ok=ok
    [ $ok = ok ] || diff <(echo "$a") <(echo "$b")
    outcome "ddp_train --nccl, 1 rank on $d" "$ok" "10 losses and the weights as without NCCL: $(echo "$b" | tail -n 2 | tr -d ' \n')"
    # DDP over NCCL on one rank against DDP alone (one rank: nothing reduced): NCCL's overhead on
    # the 6-layer GPT in bf16, median iterations, 2 rounds interleaved (the bar: 2 %)
    if fits 60; then
        local i plain="" over="" pm om
        for i in 1 2; do
            a=$(cddp timeout 60 "$bin/gpt_train" $gpt6 --dtype bf16 --device "$d" 2>&1)
            b=$(cddp timeout 60 "$bin/gpt_train" $gpt6 --dtype bf16 --device "$d" --nccl 2>&1)
            plain="$plain $(tokens_per_s $((16 * 256)) "$a")" over="$over $(tokens_per_s $((16 * 256)) "$b")"
        done
        read -r pm _ <<<"$(echo $plain | median)"
        read -r om _ <<<"$(echo $over | median)"
        ok=FAIL
        [ -n "$pm" ] && [ -n "$om" ] && awk -v p="$pm" -v o="$om" 'BEGIN { exit !(o >= 0.98 * p) }' && ok=ok
        result gpt_ddp_nccl_1rank cddp "${om:-null}" tokens/s "GPT 6 layers, width 384, batch 16, bf16, 1 rank, DDP over NCCL; alone: ${pm:-none}"
        outcome "DDP over NCCL, 1 rank: overhead (bar 2 %)" "$ok" "tokens/s with NCCL ${om:-none}, alone ${pm:-none}, ratio $(ratio "$om" "$pm")"
    fi
    # two ranks on the one GPU ask for NCCL: refused before NCCL's init, naming both
    b=$(cddp timeout 60 "$bin/cddprun" --nproc_per_node 2 "$bin/ddp_train" --device cuda --nccl 2>&1)
    ok=FAIL
    echo "$b" | grep -q "NCCL: ranks 0 and 1 are on one GPU" && ok=ok
    outcome "ddp_train --nccl, 2 ranks on one GPU refused" "$ok" "$(echo "$b" | grep -m1 "on one GPU" | cut -c1-160)"
    # the same left to the transport's auto choice: host copies, rank 0 saying why
    b=$(cddp env CDDP_LOG_LEVEL=info timeout 60 "$bin/cddprun" --nproc_per_node 2 "$bin/ddp_train" --device cuda 2>&1)
    ok=FAIL
    echo "$b" | grep -q "reduced from host copies by the group's transports (auto: ranks 0 and 1 share a GPU, which NCCL refuses" &&
        echo "$b" | grep -q "^500/500 loss" && ok=ok
    outcome "ddp_train, 2 ranks on one GPU, transport auto" "$ok" "$(echo "$b" | grep -m1 "its gradients are" | cut -c1-200)"
}
# ipc: CUDA IPC between two processes on the GPU (tests/gpu/ipc_probe.c): memory and an event
# opened by another process, its reads and writes checked; CUDA's words when a step fails. Then
# cddp_dcomm's collectives on 2 ranks sharing the device (tests/ipc/ipc_check.c: allreduce,
# reduce-scatter and allgather, back to back, every element bit for bit) through CUDA IPC (a small
# scratch, and 64 MiB) and through host copies.
ipc() {
    local line ok=FAIL
    if [ "$device" = cuda ] && [ -x "$bin/ipc_probe" ]; then
        line=$(cddp timeout 90 "$bin/ipc_probe" 2>&1 | tail -n 1)
        echo "$line"
        case "$line" in "CUDA IPC: ok"*) ok=ok ;; esac
        outcome "CUDA IPC between two processes (ipc_probe)" "$ok" "$line"
        result cuda_ipc cddp "$([ $ok = ok ] && echo 1 || echo 0)" "works" "ipc_probe: $line" \
            ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
    fi
    fits 40 || {
        outcome "the ipc transport's collectives, 2 ranks" "not run" "out of time"
        return
    }
    local run o n
    for run in "ipc 65536" "ipc 67108864" "host 65536"; do
        set -- $run
        o=$(cddp timeout 60 "$bin/cddprun" --nproc_per_node 2 "$bin/ipc_check" --device "$device" \
            --transport $1 --scratch $2 --rounds 4 2>&1)
        n=$(echo "$o" | grep -c "$1 ok (2 ranks")
        echo "$o" | grep -v "$1 ok" | tail -n 4
        ok=FAIL
        [ "$n" = 2 ] && ok=ok
        outcome "cddp_dcomm through $1, 2 ranks on one $device (scratch $2)" "$ok" "$(echo "$o" | grep -m1 "$1 ok\|rank [01]:" | cut -c1-160)"
    done
}
# A rank killed in the middle of training on the device (2 ranks sharing it, host-staged): the job
# stops in seconds, naming it as the root cause (tests/ddp/device_kill.sh).
kill1() {
    if ! fits 40; then
        outcome "2 ranks, rank 1 SIGKILLed mid-training" "not run" "out of time"
        return
    fi
    local d=$device b ok=FAIL
    [ "$d" = cuda ] && d=cuda:0
    local flag
    for flag in "" --ipc; do
        fits 30 || break
        b=$(cddp timeout 90 "$root/tests/ddp/device_kill.sh" "$carry" "$d" $flag 2>&1)
        ok=FAIL
        echo "$b" | grep -q "^ok: rank 1 killed" && ok=ok
        outcome "2 ranks on $d $flag, rank 1 SIGKILLed mid-training" "$ok" "$(echo "$b" | tail -n 1 | cut -c1-160)"
    done
}
if want 9; then
    gpt2
    nccl1
    ipc
    kill1
fi

echo "== 10. GPT-2 124M's training speed (asked for: CDDP_CHECK_STEPS=10)"
# nanoGPT's GPT-2 124M (12 layers, 12 heads, width 768, context 1024, the vocabulary padded to
# 50304) on batch 16 in bf16 with AdamW, on random tokens (data/gpt2_train.bin): cddp's --bench 10
# against PyTorch eager and torch.compile (tests/reference/nanogpt.py's model: the attention written
# out), 15 and 25 iterations (the median: compiling takes the first ones), and the card's bf16
# 8192^3 matrix product in the same call. CDDP_CHECK_GPT2="LAYERS HEADS WIDTH CONTEXT BATCH" makes
# it another shape (a rehearsal on the CPU: "1 2 64 32 4").
gpt2_124m() {
    local L H W T B
    read -r L H W T B <<<"${CDDP_CHECK_GPT2:-12 12 768 1024 16}"
    fits 300 || {
        outcome "gpt2_124m_train" "not run" "out of time"
        return
    }
    local shape="--n_layer $L --n_head $H --n_embd $W --block_size $T --batch_size $B
                 --vocab_size 50304 --dtype bf16 --data $data/gpt2_train.bin" c t k mm
    c=$(cddp timeout 150 "$bin/gpt_train" $shape --device "$device" --bench 10 --json 2>&1)
    echo "$c" | tail -n 3
    t=$(timeout 120 "$py" "$root/bench/gpt_torch.py" $shape --max_iters 15 --eval_batches 1 \
        --device "$torch_device" 2>&1 | grep '"impl"')
    echo "$t"
    k=$(timeout 240 "$py" "$root/bench/gpt_torch.py" $shape --max_iters 25 --eval_batches 1 \
        --device "$torch_device" --compile 2>&1 | grep '"impl"')
    echo "$k"
    mm=$(timeout 60 "$py" - "$torch_device" <<'PYEOF'
import sys, time, torch
d = torch.device(sys.argv[1])
a, b = (torch.randn(8192, 8192, device=d, dtype=torch.bfloat16) for _ in range(2))
for _ in range(3): a @ b
if d.type == "cuda": torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10): a @ b
if d.type == "cuda": torch.cuda.synchronize()
print(round(10 * 2 * 8192 ** 3 / (time.perf_counter() - t) / 1e12, 1))
PYEOF
)
    local cv tv kv mfu
    cv=$(echo "$c" | tail -n 1 | sed -n 's/.*"bench": {.*"tokens_per_s": \([0-9.]*\).*/\1/p')
    mfu=$(echo "$c" | tail -n 1 | sed -n 's/.*"mfu": \([0-9.a-z]*\).*/\1/p')
    tv=$(tokens_per_s $((B * T)) "$t")
    kv=$(tokens_per_s $((B * T)) "$k")
    local config="GPT-2 124M (vocabulary padded to 50304), batch 16 x 1024, bf16, AdamW, random tokens"
    [ -n "${CDDP_CHECK_GPT2:-}" ] && config="GPT $L layers, $H heads, width $W, batch $B x $T, vocabulary 50304, bf16, AdamW, random tokens"
    result gpt2_124m_train cddp "${cv:-null}" tokens/s "$config; --bench 10, $device" ", \"mfu\": ${mfu:-null}"
    result gpt2_124m_train torch-eager "${tv:-null}" tokens/s "$config; median of 15, $torch_device"
    result gpt2_124m_train torch-compile "${kv:-null}" tokens/s "$config; median of 25, $torch_device"
    result bf16_matmul_8192 torch "${mm:-null}" TFLOP/s "8192^3 bf16 product, 10 timed after 3, $torch_device"
    local ok=FAIL
    [ -n "$cv" ] && [ -n "$tv" ] && [ -n "$kv" ] && ok=ok
    outcome "gpt2_124m_train bf16, tokens/s" $ok "cddp ${cv:-none} (MFU ${mfu:-none}), PyTorch eager ${tv:-none} (ratio $(ratio "$cv" "$tv")), torch.compile ${kv:-none} (ratio $(ratio "$cv" "$kv")); bf16 matmul ${mm:-none} TFLOP/s; cddp's $(host_queue "$c")"
}
want 10 && gpt2_124m

echo "== 11. gpt_train's recipe in bf16 against fp32"
# Mixed precision learns what float32 does: gpt_train's defaults (nanoGPT's CPU recipe: 4 layers,
# 4 heads of 32, attention by rows in bf16) to the end, each validation loss over the whole
# validation text; bf16's within 0.05 of fp32's (issue 32; on the CPU they end 3e-4 apart).
recipe() {
    fits 120 || {
        outcome "gpt_recipe bf16 against fp32" "not run" "out of time"
        return
    }
    local r="--device $device --sample 0 --out none --json --data $data/fortunes" f b vf vb ok=FAIL
    f=$(cddp timeout 150 "$bin/gpt_train" $r --dtype fp32 2>&1)
    b=$(cddp timeout 150 "$bin/gpt_train" $r --dtype bf16 2>&1)
    vf=$(val_loss "$f") vb=$(val_loss "$b")
    [ -n "$vf" ] || echo "$f" | tail -n 3
    [ -n "$vb" ] || echo "$b" | tail -n 3
    close "$vb" "$vf" 0.05 "abs" && ok=ok
    outcome "gpt_recipe bf16 against fp32 (gpt_train's defaults, 2000 iterations)" "$ok" \
        "validation loss: bf16 ${vb:-none}, fp32 ${vf:-none} (bound 0.05 apart)"
    result gpt_recipe_val_loss cddp "${vb:-null}" "val loss" \
        "gpt_train's defaults (4 layers, width 128, 2000 iterations, fortunes) in bf16, $device; fp32: ${vf:-none}" \
        ", \"pass\": $([ $ok = ok ] && echo true || echo false)"
    result gpt_recipe_val_loss cddp-fp32 "${vf:-null}" "val loss" \
        "gpt_train's defaults (4 layers, width 128, 2000 iterations, fortunes) in fp32, $device"
}
want 11 && recipe

echo "== 8. compute-sanitizer racecheck, synccheck, initcheck; memcheck and racecheck on the GPT"
gpt_step="--device cuda --n_layer 2 --n_head 4 --n_embd 64 --block_size 32 --batch_size 4
          --max_iters 2 --eval_interval 1000 --eval_iters 1 --final_eval 1 --sample 8 --out none
          --data $data/fortunes"
if want 8; then
    sanitize racecheck 60
    sanitize synccheck 45
    sanitize initcheck 45
    sanitize memcheck 60 gpt_train $gpt_step
    sanitize racecheck 90 gpt_train $gpt_step
fi

echo
echo "== the GPU check: $card, cddp $commit, $(($(date +%s) - start)) s"
echo "| check | outcome | detail |"
echo "|---|---|---|"
printf '%s' "$summary"
echo
echo "results.jsonl ($out/results.jsonl; append to bench/gpu/results.jsonl):"
cat "$out/results.jsonl"
exit $failed
