# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 05-gpt.sh: the tiny GPT on the device against the CPU, and its checkpoint
# The tiny GPT (2 layers, width 64) 20 iterations, every loss within 1e-4 relative in float32 and
# 1e-2 in bf16 (with heads of 16, and of 32 over a context of 96: the flash kernels), and its
# greedy samples; after 200 iterations on the device its checkpoint loads strictly into PyTorch
# and into cddp on the CPU, each with the device's validation loss (1e-4).

# gpt NAME BOUND ARGS...: the tiny GPT for 20 iterations on the CPU and on the device: every
# iteration's loss and the final validation loss within BOUND relative.
gpt() {
    local name=$1 bound=$2 c g vc vg worst ok=FAIL
    shift 2
    skipped "$name" 60 && return
    c=$(cddp timeout 60 "$bin/gpt_train" "${tiny[@]}" "$@" --device cpu 2>&1)
    g=$(cddp timeout 60 "$bin/gpt_train" "${tiny[@]}" "$@" --device "$device" 2>&1)
    paste <(echo "$c" | grep "^iter") <(echo "$g" | grep "^iter" | sed 's/,.*//')
    echo "$g" | grep -A1 "^sample" | tail -n 1 | sed "s/^/$device sample: /"
    echo "$c" | grep -A1 "^sample" | tail -n 1 | sed 's/^/cpu sample: /'
    vc=$(val_loss "$c") vg=$(val_loss "$g") worst=$(apart "$c" "$g")
    [ -n "$vg" ] || echo "$g" | tail -n 5
    at_most "$worst" "$bound" && ok=ok
    outcome "$name" "$ok" "20 iterations' losses and the validation loss: largest difference $worst relative (bound $bound); val cpu $vc, $device ${vg:-none}"
    result "${name%% *}_20_steps" cddp "$vg" "val loss" \
        "$device, $*; cpu: $vc; largest difference $worst" "$(passed $ok)"
}

# ckpt: the tiny GPT trained 200 iterations on the device writes its checkpoint; PyTorch's nanoGPT
# loads it strictly (scripts/gpu/ckpt_val_loss.py) and cddp on the CPU starts from it: each
# validation loss over the whole validation text within 1e-4 relative of the device's. (After 20
# iterations attention hardly counts yet: PyTorch's loss with 2 heads instead of 4 differed by
# 2e-7; after 200 by 7e-4.)
ckpt() {
    skipped "gpt_checkpoint" 60 && return
    local dir=$out/gpt_ckpt tok=$data/fortunes_tokens g c vg vc vt ok=FAIL
    rm -rf "$dir"
    g=$(cddp timeout 60 "$bin/gpt_train" "${tiny[@]}" --data "$tok/train.bin" --out "$dir" \
        --max_iters 200 --eval_interval 100 --log_interval 0 --device "$device" 2>&1)
    c=$(cddp timeout 60 "$bin/gpt_train" "${tiny[@]}" --data "$tok/train.bin" --max_iters 0 \
        --init_from "$dir/checkpoint.safetensors" --device cpu 2>&1)
    vt=$(timeout 120 "$py" "$root/scripts/gpu/ckpt_val_loss.py" "$dir/checkpoint.safetensors" \
        "$tok/val.bin" 4 2>&1 | tail -n 1)
    vg=$(val_loss "$g") vc=$(val_loss "$c")
    [ -n "$vc" ] || echo "$c" | tail -n 3
    close "$vc" "$vg" && close "$vt" "$vg" && ok=ok
    outcome "gpt_checkpoint (saved on $device; PyTorch strict, cddp on cpu)" "$ok" \
        "validation loss: $device ${vg:-none}, cddp cpu from its checkpoint ${vc:-none}, PyTorch ${vt:-none}"
    result gpt_checkpoint_val_loss cddp "$vc" "val loss" \
        "saved on $device, evaluated by cddp on cpu; $device: ${vg:-none}, PyTorch: ${vt:-none}" \
        "$(passed $ok)"
}

gpt "gpt_fp32 (gpt_train, 2 layers, width 64)" 1e-4 --dtype fp32
gpt "gpt_bf16 (gpt_train --dtype bf16)" 1e-2 --dtype bf16
gpt "gpt_bf16_by_rows (2 heads of 32, context 96: attention by rows)" 1e-2 --dtype bf16 \
    --n_head 2 --block_size 96
ckpt
