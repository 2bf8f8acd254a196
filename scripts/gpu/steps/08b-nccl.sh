# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 08b-nccl.sh: NCCL (the wheels' library) on one rank
# The nccl transport's allreduce of device memory (and its order with the device's stream);
# ddp_train --nccl against ddp_train; the 6-layer GPT's tokens/s with --nccl against without (bar:
# 2 %); 2 ranks on the one GPU refused with --nccl, and left to the auto choice (host copies,
# rank 0 says why).

nccl1() {
    if [ "$device" != cuda ] || ! fits 30; then
        outcome "nccl transport, 1 rank" "not run" "NCCL needs a GPU, or out of time"
        return
    fi
    local d=cuda:0 o a b ok=FAIL
    o=$(cddp timeout 30 "$bin/nccl_test" 20 "$d" 2>&1)
    echo "$o" | tail -n 2
    echo "$o" | grep -q "allreduce ok (1 ranks, NCCL, $d; ordered with the device's queue)" && ok=ok
    outcome "nccl transport, 1 rank on $d" "$ok" "$(echo "$o" | tail -n 1)"
    # DDP over NCCL on one rank: every loss and the weights as without it (the log's lines, which
    # name the backend, apart)
    a=$(cddp timeout 60 "$bin/ddp_train" --device "$d" --optimizer adamw 2>&1 | grep "loss:\|\]" |
        grep -v '^\[cddp')
    b=$(cddp timeout 60 "$bin/ddp_train" --device "$d" --optimizer adamw --nccl 2>&1)
    echo "$b" | tail -n 3
    b=$(echo "$b" | grep "loss:\|\]" | grep -v '^\[cddp')
    ok=FAIL
    [ -n "$a" ] && [ "$a" = "$b" ] && ok=ok
    [ $ok = ok ] || diff <(echo "$a") <(echo "$b")
    outcome "ddp_train --nccl, 1 rank on $d" "$ok" "10 losses and the weights as without NCCL: $(echo "$b" | tail -n 2 | tr -d ' \n')"
    nccl_overhead
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

# nccl_overhead: DDP over NCCL on one rank against DDP alone (one rank: nothing reduced), the
# 6-layer GPT in bf16, median iterations, 2 rounds interleaved (the bar: 2 %).
nccl_overhead() {
    fits 60 || return
    local a b plain="" over="" pm om ok=FAIL
    for _ in 1 2; do
        a=$(cddp timeout 60 "$bin/gpt_train" "${gpt6[@]}" --dtype bf16 --device cuda:0 2>&1)
        b=$(cddp timeout 60 "$bin/gpt_train" "${gpt6[@]}" --dtype bf16 --device cuda:0 --nccl 2>&1)
        plain="$plain $(tokens_per_s $((16 * 256)) "$a")" over="$over $(tokens_per_s $((16 * 256)) "$b")"
    done
    # shellcheck disable=SC2086 # the values are words
    read -r pm _ <<<"$(median $plain)"
    # shellcheck disable=SC2086
    read -r om _ <<<"$(median $over)"
    [ -n "$pm" ] && [ -n "$om" ] && awk -v p="$pm" -v o="$om" 'BEGIN { exit !(o >= 0.98 * p) }' && ok=ok
    result gpt_ddp_nccl_1rank cddp "$om" tokens/s "GPT 6 layers, width 384, batch 16, bf16, 1 rank, DDP over NCCL; alone: ${pm:-none}"
    outcome "DDP over NCCL, 1 rank: overhead (bar 2 %)" "$ok" "tokens/s with NCCL ${om:-none}, alone ${pm:-none}, ratio $(ratio "$om" "$pm")"
}

nccl1
