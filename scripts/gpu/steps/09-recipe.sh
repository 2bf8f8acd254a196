# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 09-recipe.sh: gpt_train's recipe in bf16 against fp32
# Mixed precision learns what float32 does: gpt_train's defaults (nanoGPT's CPU recipe: 4 layers,
# 4 heads of 32, attention by rows in bf16) to the end, each validation loss over the whole
# validation text; bf16's within 0.05 of fp32's (issue 32; on the CPU they end 3e-4 apart).

recipe() {
    skipped "gpt_recipe bf16 against fp32" 120 && return
    local r=(--device "$device" --sample 0 --out none --json --data "$data/fortunes") f b vf vb ok=FAIL
    local what="gpt_train's defaults (4 layers, width 128, 2000 iterations, fortunes)"
    f=$(cddp timeout 150 "$bin/gpt_train" "${r[@]}" --dtype fp32 2>&1)
    b=$(cddp timeout 150 "$bin/gpt_train" "${r[@]}" --dtype bf16 2>&1)
    vf=$(val_loss "$f") vb=$(val_loss "$b")
    [ -n "$vf" ] || echo "$f" | tail -n 3
    [ -n "$vb" ] || echo "$b" | tail -n 3
    close "$vb" "$vf" 0.05 "abs" && ok=ok
    outcome "gpt_recipe bf16 against fp32 (gpt_train's defaults, 2000 iterations)" "$ok" \
        "validation loss: bf16 ${vb:-none}, fp32 ${vf:-none} (bound 0.05 apart)"
    result gpt_recipe_val_loss cddp "$vb" "val loss" "$what in bf16, $device; fp32: ${vf:-none}" \
        "$(passed $ok)"
    result gpt_recipe_val_loss cddp-fp32 "$vf" "val loss" "$what in fp32, $device"
}

recipe
