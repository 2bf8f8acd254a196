# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 08a-two-ranks.sh: the GPT on 2 ranks sharing the GPU (host-staged reduction)
# The tiny GPT on 2 ranks, every rank on the first GPU, against the same 2 ranks on the CPU (1e-4);
# with ZeRO-1, ZeRO-2 and activation checkpointing against DDP on the device, and with --ipc (CUDA
# IPC, with and without ZeRO-1) against the staged reduction (1e-5); then the 6-layer GPT's speed
# on 2 ranks sharing the GPU, staged and --ipc, against PyTorch DDP over gloo (both ranks on
# cuda:0, its CUDA tensors staged through the host), 30 iterations each.
two_d=$device
[ "$two_d" = cuda ] && two_d=cuda:0
two_run=("$bin/cddprun" --nproc_per_node 2 --local_ranks_filter 0 "$bin/gpt_train")

# near NAME AGAINST REFERENCE ARGS...: the tiny GPT on 2 ranks with ARGS on the device against
# REFERENCE (a run's output: the largest relative difference within 1e-5); the outcome NAME, its
# line saying what it was held against.
near() {
    local name=$1 against=$2 ref=$3 o v w ok=FAIL
    shift 3
    o=$(cddp timeout 60 "${two_run[@]}" "${tiny[@]}" --device "$two_d" "$@" 2>&1)
    v=$(val_loss "$o") w=$(apart "$ref" "$o")
    [ -n "$v" ] || echo "$o" | tail -n 8
    at_most "$w" 1e-5 && ok=ok
    outcome "$name" "$ok" "against $against: largest difference $w relative (bound 1e-5); val ${v:-none}"
}

# two_ranks: the tiny GPT's runs.
two_ranks() {
    local c g vc vg worst ok=FAIL a
    skipped "gpt_2ranks" 60 && return
    c=$(cddp timeout 60 "${two_run[@]}" "${tiny[@]}" --device cpu 2>&1)
    g=$(cddp timeout 60 "${two_run[@]}" "${tiny[@]}" --device "$two_d" 2>&1)
    vc=$(val_loss "$c") vg=$(val_loss "$g") worst=$(apart "$c" "$g")
    [ -n "$vg" ] || echo "$g" | tail -n 8
    at_most "$worst" 1e-4 && ok=ok
    outcome "gpt_2ranks (the tiny GPT, 2 ranks on $two_d)" "$ok" "against 2 ranks on the CPU: largest difference $worst relative (bound 1e-4); val cpu $vc, $two_d ${vg:-none}"
    result gpt_2ranks_20_steps cddp "$vg" "val loss" \
        "$two_d, 2 ranks; cpu: $vc; largest difference $worst" "$(passed $ok)"
    # ZeRO-1 (the optimizer's state and step sharded over the 2 ranks), ZeRO-2 (the gradients
    # outside each rank's shard zeroed on the device) and activation checkpointing (every block
    # run again in backward, on the context's scratch): DDP's losses
    for a in --zero "--zero 2" --activation_checkpointing "--zero 2 --activation_checkpointing"; do
        read -ra opts <<<"$a"
        near "gpt_2ranks $a (2 ranks on $two_d)" "DDP on $two_d" "$g" "${opts[@]}"
    done
    # CUDA IPC (--ipc: each rank sums its part from the other's memory on the GPU): the staged
    # path's losses, with and without ZeRO-1 (each sum has the same two terms either way)
    near "gpt_2ranks --ipc (CUDA IPC, 2 ranks on $two_d)" "the staged reduction" "$g" --ipc
    near "gpt_2ranks --ipc --zero (CUDA IPC, 2 ranks on $two_d)" "the staged reduction" "$g" \
        --ipc --zero
}

# two_ranks_speed: the 6-layer GPT on 2 ranks sharing the GPU, cddp staged and --ipc against
# PyTorch DDP over gloo.
two_ranks_speed() {
    skipped "gpt_2ranks_1gpu speed" 90 && return
    local c i t td=$torch_device cv iv tv best ok=FAIL
    [ "$td" = cuda ] && td=cuda:0
    c=$(cddp timeout 90 "${two_run[@]}" "${gpt6[@]}" --device "$two_d" 2>&1)
    i=$(cddp timeout 90 "${two_run[@]}" "${gpt6[@]}" --device "$two_d" --ipc 2>&1)
    # cddprun with the carried libraries, PyTorch's ranks with the environment's own
    t=$(cddp timeout 150 "$bin/cddprun" --nproc_per_node 2 env LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" \
        "$py" "$root/bench/gpt_torch.py" "${gpt6_shape[@]}" --device "$td" --eval_batches 2 \
        --data "$data/fortunes" 2>&1)
    echo "$c" | grep '"median_iter_ms"'
    echo "$t" | grep -q '"impl"' || echo "$t" | grep -v '^ *$' | tail -n 12
    echo "$t" | grep '"impl"'
    echo "$i" | grep '"median_iter_ms"'
    cv=$(tokens_per_s $((2 * 16 * 256)) "$c")
    iv=$(tokens_per_s $((2 * 16 * 256)) "$i")
    tv=$(tokens_per_s $((2 * 16 * 256)) "$t")
    best=$(awk -v a="${cv:-0}" -v b="${iv:-0}" 'BEGIN { m = a > b ? a : b; if (m > 0) print m }')
    local config="GPT 6 layers, 6 heads, width 384, context 256, 2 ranks x batch 16 on one GPU, AdamW, fp32; tokens/s (both ranks) of the median of 30 iterations"
    result gpt_2ranks_1gpu cddp "$best" tokens/s "$config, the better of cddp-staged and cddp-ipc, $two_d"
    result gpt_2ranks_1gpu cddp-staged "$cv" tokens/s "$config, host-staged reduction, $two_d"
    result gpt_2ranks_1gpu cddp-ipc "$iv" tokens/s "$config, CUDA IPC (--ipc), $two_d"
    result gpt_2ranks_1gpu torch-gloo "$tv" tokens/s "$config, DistributedDataParallel over gloo, $td"
    [ -n "$cv" ] && [ -n "$iv" ] && [ -n "$tv" ] && ok=ok
    outcome "gpt_2ranks_1gpu fp32, tokens/s" $ok "cddp staged ${cv:-none}, CUDA IPC ${iv:-none}, PyTorch DDP over gloo ${tv:-none}; best / gloo $(ratio "$best" "$tv")"
}

two_ranks
two_ranks_speed
