# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 07-gpt-speed.sh: the 6-layer GPT's training speed, cddp and PyTorch eager, fp32 and bf16
# The larger GPT of the CPU's benchmarks (6 layers, 6 heads, width 384, context 256), batch 16,
# 30 iterations: the median iteration of each (PyTorch's model is tests/reference/nanogpt.py:
# nanoGPT's with the attention written out, no fused kernel), and how much of cddp's iteration
# the host spends queuing its kernels.

# gpt_speed DTYPE: one precision's rounds.
gpt_speed() {
    local dtype=$1 rounds=2 cs="" ts="" c t q
    skipped "gpt_train $dtype speed" 90 && return
    for _ in $(seq $rounds); do
        c=$(cddp timeout 90 "$bin/gpt_train" "${gpt6[@]}" --dtype "$dtype" --device "$device" 2>&1)
        t=$(timeout 120 "$py" "$root/bench/gpt_torch.py" "${gpt6_shape[@]}" --dtype "$dtype" \
            --device "$torch_device" --eval_batches 2 --data "$data/fortunes" 2>&1)
        echo "$c" | grep '"median_iter_ms"'
        echo "$t" | grep '"impl"'
        cs="$cs $(tokens_per_s $((16 * 256)) "$c")"
        ts="$ts $(tokens_per_s $((16 * 256)) "$t")"
    done
    versus gpt_train tokens/s "gpt_train $dtype" "$rounds" "$cs" "$ts" \
        "GPT 6 layers, 6 heads, width 384, context 256, batch 16, AdamW, $dtype; tokens/s of the median of 30 iterations, $rounds runs interleaved"
    q=$(host_queue "$c")
    outcome "gpt_train $dtype, the host's share" "$([ -n "$q" ] && echo ok || echo FAIL)" "$q"
}

gpt_speed fp32
gpt_speed bf16
