#!/bin/bash
# quick.sh CARRY: a short GPU call (about 4 minutes) for a session with little GPU time left, run
# there from the repository's root as `scripts/gpu/quick.sh build-gpu/carry`: check.sh's steps 2
# (device_check, with its bf16 cases) and 5 (the tiny GPT against the CPU, its checkpoint),
# memcheck and racecheck on a bf16 GPT step whose attention runs by rows (heads of 32, context
# 96), then the 6-layer GPT and GPT-2 124M in bf16: cddp with attention by rows, cddp keeping
# the weights (CDDP_FLASH_ATTENTION=0), PyTorch eager, once each (no rounds, no torch.compile:
# check.sh's steps 7 and 10 are the benchmark); and the ipc transport's collectives on 2 ranks sharing the
# GPU (ipc_check).
set -u
carry=$(cd "${1:?usage: quick.sh CARRY}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$carry/bin data=$carry/data py=${CDDP_CHECK_PYTHON:-python3}
export OUT=${OUT:-$root/build-gpu/out}
CDDP_CHECK_STEPS="2 5" CDDP_CHECK_BUDGET_S=150 "$root/scripts/gpu/check.sh" "$carry" >/dev/null 2>&1
sed -n '/== the GPU check/,$p' "$OUT/check.log" | grep -v '^{"date"' | grep -v "^results.jsonl"
grep '"bf16_\|FAIL' "$OUT/device_check.jsonl"
. "$root/scripts/gpu/env.sh"
tiny=(--device cuda --dtype bf16 --n_layer 2 --n_head 2 --n_embd 64 --block_size 96 --batch_size 4
    --max_iters 2 --eval_interval 1000 --eval_iters 1 --final_eval 1 --sample 8 --out none
    --data "$data/fortunes")
for tool in memcheck racecheck; do
    cddp timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 10 \
        "$bin/gpt_train" "${tiny[@]}" 2>&1 | grep -av "^iter\|^step" | tail -n 4
    echo "$tool rc ${PIPESTATUS[0]}"
done
# CUDA IPC: the ipc transport's collectives on 2 ranks sharing the GPU, bit for bit (tests/ipc/ipc_check.c)
cddp timeout 60 "$bin/cddprun" --nproc_per_node 2 "$bin/ipc_check" --device cuda --rounds 3 2>&1 |
    grep "ipc ok\|rank [01]:" | head -n 4
g6=(--n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --batch_size 16 --max_iters 30)
g2=(--n_layer 12 --n_head 12 --n_embd 768 --block_size 1024 --batch_size 16 --vocab_size 50304
    --dtype bf16 --data "$data/gpt2_train.bin")
for rows in 1 0; do
    echo "CDDP_FLASH_ATTENTION=$rows"
    CDDP_FLASH_ATTENTION=$rows cddp timeout 40 "$bin/gpt_train" "${g6[@]}" --eval_interval 1000 \
        --eval_iters 1 --final_eval 2 --sample 0 --out none --json --data "$data/fortunes" \
        --dtype bf16 --device cuda 2>&1 | tail -n 1
    CDDP_FLASH_ATTENTION=$rows cddp timeout 60 "$bin/gpt_train" "${g2[@]}" --device cuda --bench 10 \
        --json 2>&1 | grep "^bench\|error\|failed" | tail -n 3
done
timeout 60 "$py" "$root/bench/gpt_torch.py" "${g6[@]}" --dtype bf16 --device cuda --eval_batches 2 \
    --data "$data/fortunes" 2>&1 | grep '"impl"'
timeout 60 "$py" "$root/bench/gpt_torch.py" "${g2[@]}" --max_iters 15 --eval_batches 1 --device cuda 2>&1 |
    grep '"impl"'
