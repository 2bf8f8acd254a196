# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 10-gpt2.sh: GPT-2 124M's training speed (asked for: CDDP_CHECK_STEPS=10)
# nanoGPT's GPT-2 124M (12 layers, 12 heads, width 768, context 1024, the vocabulary padded to
# 50304) on batch 16 in bf16 with AdamW, on random tokens (data/gpt2_train.bin): cddp's --bench 10
# against PyTorch eager and torch.compile (tests/reference/nanogpt.py's model: the attention written
# out), 15 and 25 iterations (the median: compiling takes the first ones), and the card's bf16
# 8192^3 matrix product in the same call. CDDP_CHECK_GPT2="LAYERS HEADS WIDTH CONTEXT BATCH" makes
# it another shape (a rehearsal on the CPU: "1 2 64 32 4").

gpt2_124m() {
    local L H W T B c t k mm cv tv kv mfu ok=FAIL
    read -r L H W T B <<<"${CDDP_CHECK_GPT2:-12 12 768 1024 16}"
    skipped "gpt2_124m_train" 300 && return
    local shape=(--n_layer "$L" --n_head "$H" --n_embd "$W" --block_size "$T" --batch_size "$B"
        --vocab_size 50304 --dtype bf16 --data "$data/gpt2_train.bin")
    c=$(cddp timeout 150 "$bin/gpt_train" "${shape[@]}" --device "$device" --bench 10 --json 2>&1)
    echo "$c" | tail -n 3
    t=$(timeout 120 "$py" "$root/bench/gpt_torch.py" "${shape[@]}" --max_iters 15 --eval_batches 1 \
        --device "$torch_device" 2>&1)
    echo "$t" | grep '"impl"'
    k=$(timeout 240 "$py" "$root/bench/gpt_torch.py" "${shape[@]}" --max_iters 25 --eval_batches 1 \
        --device "$torch_device" --compile 2>&1)
    echo "$k" | grep '"impl"'
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
    cv=$(field bench.tokens_per_s "$c") mfu=$(field bench.mfu "$c")
    tv=$(tokens_per_s $((B * T)) "$t")
    kv=$(tokens_per_s $((B * T)) "$k")
    local config="GPT-2 124M (vocabulary padded to 50304), batch 16 x 1024, bf16, AdamW, random tokens"
    [ -n "${CDDP_CHECK_GPT2:-}" ] && config="GPT $L layers, $H heads, width $W, batch $B x $T, vocabulary 50304, bf16, AdamW, random tokens"
    result gpt2_124m_train cddp "$cv" tokens/s "$config; --bench 10, $device" "mfu=${mfu:-null}"
    result gpt2_124m_train torch-eager "$tv" tokens/s "$config; median of 15, $torch_device"
    result gpt2_124m_train torch-compile "$kv" tokens/s "$config; median of 25, $torch_device"
    result bf16_matmul_8192 torch "$mm" TFLOP/s "8192^3 bf16 product, 10 timed after 3, $torch_device"
    [ -n "$cv" ] && [ -n "$tv" ] && [ -n "$kv" ] && ok=ok
    outcome "gpt2_124m_train bf16, tokens/s" $ok "cddp ${cv:-none} (MFU ${mfu:-none}), PyTorch eager ${tv:-none} (ratio $(ratio "$cv" "$tv")), torch.compile ${kv:-none} (ratio $(ratio "$cv" "$kv")); bf16 matmul ${mm:-none} TFLOP/s; cddp's $(host_queue "$c")"
}

gpt2_124m
