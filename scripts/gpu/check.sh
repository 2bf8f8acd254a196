#!/bin/bash
# check.sh CARRY: the GPU check, as one call on the GPU machine (at most about 6 minutes).
#
#   scripts/gpu/prepare.sh                      here, without a GPU: builds CARRY (build-gpu/carry)
#   scripts/gpu/check.sh build-gpu/carry        there, with carry: ["build-gpu/carry"]
#
# Each step is a file of scripts/gpu/steps/, named by its number (08*.sh: step 8's parts, in
# the order of their names); the steps share scripts/gpu/lib.sh, and their JSON (the programs'
# output, results.jsonl) goes through scripts/gpu/check_json.py. Each part has its own time limit and
# is skipped when it would not end inside the budget (CDDP_CHECK_BUDGET_S, default 330 s):
#    1  01-versions.sh       the card, driver, toolkit, PyTorch and library versions; the
#                            programs' libraries resolved (always run, first)
#    2  02-device-check.sh   device_check: every CUDA kernel against the CPU's on fresh random
#                            inputs (fp32 within 1e-5 of the largest value; no TF32)
#    3  03-memcheck.sh       compute-sanitizer memcheck on device_check
#    4  04-seeds.sh          fashion_mnist's MLP (SGD, AdamW) and ddp_train on 1 and 2 ranks,
#                            the device against the CPU
#    5  05-gpt.sh            the tiny GPT (2 layers, width 64) 20 iterations against the CPU in
#                            fp32, bf16 and bf16 by rows; its checkpoint into PyTorch and the CPU
#    6  06-mlp-speed.sh      the MLP's training speed, cddp and PyTorch eager, batch 32 and 256
#    7  07-gpt-speed.sh      the 6-layer GPT's speed in fp32 and bf16, and the host's share
#    8  08a-two-ranks.sh     the tiny GPT on 2 ranks sharing the GPU against 2 on the CPU; ZeRO-1,
#                            ZeRO-2, activation checkpointing and --ipc against it; the 6-layer
#                            GPT's speed, staged and --ipc, against PyTorch DDP over gloo
#       08b-nccl.sh          NCCL on one rank: its allreduce, ddp_train --nccl, the overhead on
#                            the 6-layer GPT (bar 2 %), 2 ranks on one GPU refused or host-staged
#       08c-ipc.sh           CUDA IPC between two processes (ipc_probe); the ipc transport's
#                            collectives on 2 ranks (ipc_check, bit for bit)
#       08d-kill.sh          rank 1 of 2 SIGKILLed mid-training, staged and --ipc
#    9  09-recipe.sh         gpt_train's recipe (2000 iterations) in bf16 against fp32 (0.05)
#   10  10-gpt2.sh           (only when asked for) GPT-2 124M in bf16, batch 16 x 1024: cddp's
#                            --bench against PyTorch eager and torch.compile; the card's bf16 rate
#   11  11-sanitizers.sh     racecheck, synccheck, initcheck on device_check; memcheck and
#                            racecheck on two iterations of the tiny GPT
# The steps run in their order; CDDP_CHECK_STEPS (default "2 3 4 5 6 7 8 9 11"; 10 when asked
# for: "2 3 4 5 6 7 8 9 10 11") picks them.
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
bin=$carry/bin
start=$(date +%s)
CHECK_COMMIT=$(cat "$carry/commit" 2>/dev/null || echo unknown)
export CHECK_COMMIT CHECK_CARD
exec > >(tee "$out/check.log") 2>&1
: >"$out/results.jsonl"
rm -f "$out"/sanitizer-*.txt
# shellcheck source=scripts/gpu/env.sh
. "$root/scripts/gpu/env.sh"
# shellcheck source=scripts/gpu/lib.sh
. "$root/scripts/gpu/lib.sh"
# shellcheck source=scripts/gpu/steps/01-versions.sh
. "$root/scripts/gpu/steps/01-versions.sh"
for step in ${CDDP_CHECK_STEPS:-2 3 4 5 6 7 8 9 11}; do
    parts=("$root"/scripts/gpu/steps/"$(printf %02d "$step")"*.sh)
    [ -f "${parts[0]}" ] || {
        outcome "step $step" FAIL "no such step in scripts/gpu/steps"
        continue
    }
    for part in "${parts[@]}"; do
        echo "== $step. $(sed -n 's/^# [0-9a-z-]*\.sh: //p' "$part" | head -n 1)"
        # shellcheck source=/dev/null # one of the steps
        . "$part"
    done
done

echo
echo "== the GPU check: $CHECK_CARD, cddp $CHECK_COMMIT, $(($(date +%s) - start)) s"
echo "| check | outcome | detail |"
echo "|---|---|---|"
printf '%s' "$summary"
echo
echo "results.jsonl ($out/results.jsonl; append to bench/gpu/results.jsonl):"
cat "$out/results.jsonl"
exit "$failed"
