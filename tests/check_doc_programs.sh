#!/bin/sh
# check_doc_programs.sh SOURCE_DIR BUILD_DIR: every C block in README.md and then docs/GUIDE.md
# is a complete program that compiles against the built library (-Wall -Wextra -Werror) and runs
# as the text says: a program that makes a group runs under cddprun on 2 ranks, the others alone.
# Then each one's results are checked: the first trains (its loss falls below 0.7) and saves a
# checkpoint, the data-parallel one trains an epoch on 2 ranks and rank 0 saves, the
# checkpoint-set one resumes its newest set exactly, the stop one, sent SIGTERM through cddprun
# as the guide says, stops both ranks after the same step, saves and exits 143, the sharding one sees
# its half of the data, the NumPy one reads the arrays that the guide's Python saved, the GPT
# trains, the layout one computes the same values in both layouts. CDDP_EXAMPLE_CFLAGS carries the
# sanitizer flags of a sanitizer build.
set -eu
src=$(cd "$1" && pwd); build=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Numbered in reading order: the README's 2, then the guide's 6.
awk -v dir="$work" '/^```c$/ { n++; on = 1; next } /^```$/ { on = 0 } on { print > (dir "/prog" n ".c") }' \
    "$src/README.md" "$src/docs/GUIDE.md"
count=$(ls "$work"/prog*.c 2>/dev/null | wc -l)
[ "$count" = 8 ] || fail "README.md and docs/GUIDE.md have $count C blocks; this test knows 8 (update it with them)"
[ "$(awk '/^```c$/' "$src/README.md" | wc -l)" = 2 ] || fail "README.md should hold 2 of the C blocks (update this test)"
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE
for i in $(seq "$count"); do
    p="$work/prog$i"
    grep -q 'int main' "$p.c" || fail "C block $i of README.md + docs/GUIDE.md is not a complete program"
    # shellcheck disable=SC2086
    cc -std=c11 -Wall -Wextra -Werror ${CDDP_EXAMPLE_CFLAGS:-} -I"$src/include" "$p.c" -o "$p" \
        -L"$build/lib" -lcddp -Wl,-rpath,"$build/lib" || fail "C block $i of README.md + docs/GUIDE.md does not compile"
    mkdir "$p.run"
    if grep -q cddp_dataset_from_files "$p.c"; then # the guide's Python before it saves the arrays
        awk '/^```python$/ { on = 1; next } /^```$/ { on = 0 } on' "$src/docs/GUIDE.md" > "$p.run/save.py"
        grep -q 'np.save("images.npy"' "$p.run/save.py" || fail "docs/GUIDE.md has no Python block saving images.npy"
        (cd "$p.run" && "${CDDP_PYTHON3:-python3}" save.py) || fail "the guide's Python that saves the .npy files failed"
    fi
    if grep -q cddp_stop_catch "$p.c"; then # SIGTERM to cddprun once rank 0 has trained 200 steps
        (cd "$p.run" && exec "$build/bin/cddprun" --standalone --nproc_per_node 2 "$p") > "$p.out" 2>&1 &
        job=$!
        for _ in $(seq 3000); do grep -q '^step 200$' "$p.out" && break; sleep 0.01; done
        kill -TERM "$job"
        rc=0
        wait "$job" || rc=$?
        [ "$rc" = 143 ] || { cat "$p.out"; fail "C block $i of README.md + docs/GUIDE.md exited $rc after SIGTERM, not 143"; }
    elif grep -q cddp_comm_create "$p.c"; then
        (cd "$p.run" && "$build/bin/cddprun" --standalone --nproc_per_node 2 "$p") > "$p.out" 2>&1
    else
        (cd "$p.run" && "$p") > "$p.out" 2>&1
    fi || { cat "$p.out"; fail "C block $i of README.md + docs/GUIDE.md failed"; }
    echo "--- C block $i:"; cat "$p.out"
done
# 4: stopped by SIGTERM: rank 0 alone says it stops, and that the ranks saved after the same step.
[ "$(grep -c '^stopping after this step$' "$work/prog4.out")" = 1 ] || fail "program 4: not rank 0 alone said it stops"
grep -Eq '^stopped by signal 15 after step [0-9]+: saved stopped.safetensors$' "$work/prog4.out" ||
    fail "program 4 did not say it stopped and saved"
[ -s "$work/prog4.run/stopped.safetensors" ] && [ ! -e "$work/prog4.run/model.safetensors" ] ||
    fail "program 4 did not save stopped.safetensors (alone)"
"$build/bin/cddp-ckpt" verify "$work/prog4.run/stopped.safetensors" > "$work/v4.out" 2>&1 ||
    { cat "$work/v4.out"; fail "program 4's stopped.safetensors does not verify"; }
# 1: a single-process epoch.
last=$(sed -n 's/^step [0-9]*: loss \([0-9.]*\)$/\1/p' "$work/prog1.out" | tail -n 1)
awk -v l="$last" 'BEGIN { exit !(l != "" && l < 0.7) }' || fail "program 1: last loss '$last' is not below 0.7"
[ -s "$work/prog1.run/model.safetensors" ] || fail "program 1 saved no model.safetensors"
# 2: one data-parallel epoch; rank 0 prints and saves.
[ "$(grep -c '^epoch 0: loss' "$work/prog2.out")" = 1 ] || fail "program 2: not one 'epoch 0' line (rank 0's)"
loss=$(sed -n 's/^epoch 0: loss \([0-9.]*\)$/\1/p' "$work/prog2.out")
awk -v l="$loss" 'BEGIN { exit !(l < 0.7) }' || fail "program 2: loss $loss is not below 0.7"
[ -s "$work/prog2.run/model.safetensors" ] || fail "program 2 saved no model.safetensors"
# 3: checkpoint sets on 2 ranks with ZeRO: the newest of the 2 kept sets resumes exactly.
grep -qx "resumed from ckpt/step-00000003: 3 optimizer steps, the same parameters" "$work/prog3.out" \
    || fail "program 3 did not resume the newest set exactly"
[ "$(ls "$work/prog3.run/ckpt")" = "$(printf 'step-00000002\nstep-00000003')" ] || fail "program 3 did not keep the newest 2 sets"
# 5: each of 2 ranks sees half of Fashion-MNIST's 60000 samples per epoch.
for r in 0 1; do
    grep -qx "rank $r of 2: 60000 samples in 2 epochs; its MindSpore shard holds 30000" "$work/prog5.out" ||
        fail "program 5: rank $r did not see half of the data"
done
# 6: the NumPy arrays the guide's Python saved: every sample, Fashion-MNIST's mean and classes.
grep -qx "60000 samples: images float32 (1, 28, 28), labels int64" "$work/prog6.out" ||
    fail "program 6 did not read the two arrays as the guide says"
grep -qx "mean pixel 0.2860; class 0: 6000 samples, class 9: 6000" "$work/prog6.out" ||
    fail "program 6 did not read Fashion-MNIST's pixels and labels from the arrays"
# 7: a small GPT on fortunes, 2 ranks; rank 0 prints three losses and saves.
[ "$(grep -c '^iter [0-9]*: loss' "$work/prog7.out")" = 3 ] || fail "program 7: not three loss lines (rank 0's)"
last=$(sed -n 's/^iter 149: loss \([0-9.]*\)$/\1/p' "$work/prog7.out")
awk -v l="$last" 'BEGIN { exit !(l != "" && l < 3.1) }' || fail "program 7: loss '$last' at iteration 149 is not below 3.1"
[ -s "$work/prog7.run/gpt.safetensors" ] || fail "program 7 saved no gpt.safetensors"
# 8: a residual unit in oneDNN's blocked layout and row-major: the same outputs and gradients (the
# batch normalisation's sums in another order: within 1e-5), on a machine whose oneDNN blocks.
line=$(grep '^blocks of ' "$work/prog8.out") || fail "program 8 printed no result"
echo "$line" | grep -Eq '^blocks of (8|16) channels: ' || fail "program 8 ran without the blocked layout: $line"
set -- $(echo "$line" | sed -n 's/.*outputs within \([^,]*\), weight gradients within \(.*\)$/\1 \2/p')
awk -v a="${1:-x}" -v b="${2:-x}" 'BEGIN { exit !(a + 0 == a && b + 0 == b && a < 1e-5 && b < 1e-5) }' ||
    fail "program 8: the layouts disagree: $line"
# docs/DISTRIBUTED.md's C is a communication hook, not a program: it must be, character for
# character, the one tests/ddp/ddp_check.c compiles and runs (ddp_check hook).
awk '/^```c$/ { on = 1; next } /^```$/ { on = 0 } on' "$src/docs/DISTRIBUTED.md" > "$work/hook.c"
[ -s "$work/hook.c" ] || fail "docs/DISTRIBUTED.md has no C block (its communication hook)"
"${CDDP_PYTHON3:-python3}" -c 'import sys; sys.exit(open(sys.argv[1]).read() not in open(sys.argv[2]).read())' \
    "$work/hook.c" "$src/tests/ddp/ddp_check.c" ||
    fail "docs/DISTRIBUTED.md's communication hook is not the one tests/ddp/ddp_check.c runs"
echo "ok: the $count C programs of README.md and docs/GUIDE.md compile and run as they say"
