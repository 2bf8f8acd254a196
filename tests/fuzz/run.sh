#!/bin/sh
# run.sh BUILD_DIR SECONDS: runs every libFuzzer harness (built with -DCDDP_FUZZ=ON in BUILD_DIR)
# for SECONDS from its committed corpus, two at a time, and fails on any finding. A harness's
# work (its growing corpus, the log, and the input that failed: crash-*, leak-*, timeout-*) stays
# in BUILD_DIR/fuzz/<harness>/; a finding becomes a regression by copying that input into
# tests/fuzz/corpus/<harness>/regress-<what>.
set -u
build=$(cd "$1" && pwd) secs=$2
src=$(cd "$(dirname "$0")" && pwd)
run() {
    work="$build/fuzz/$1"
    rm -rf "$work"
    mkdir -p "$work/corpus"
    (cd "$work" && "$build/bin/fuzz_$1" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
        -max_len=8192 -print_final_stats=1 corpus "$src/corpus/$1" > log 2>&1)
    echo $? > "$work/rc"
}
run idx & run tokens & wait
run safetensors & run store & wait
run secret & run ckpt_set & wait
run npy & run gpt_weights & wait
run tokenizer & wait
fail=0
for h in idx tokens safetensors store secret ckpt_set npy gpt_weights tokenizer; do
    rc=$(cat "$build/fuzz/$h/rc")
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz/$h/log")
    if [ "$rc" != 0 ]; then
        fail=1
        echo "FAIL: fuzz_$h found a problem (exit $rc); its input is in $build/fuzz/$h/:"
        tail -n 60 "$build/fuzz/$h/log"
    else
        echo "ok: fuzz_$h: ${runs:-?} inputs in $secs s, nothing found"
    fi
done
exit $fail
