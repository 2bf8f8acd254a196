#!/bin/sh
# bench/generate.sh [BUILD_DIR] [ROUNDS]: generation with the key/value cache against recomputing
# the whole context for every token (what nanoGPT's generate does), at context 256.
#
# A GPT of 6 layers, width 384, 6 heads and block_size 256 (the bf16 benchmark's model; 2
# iterations of gpt_train give it weights: speed does not depend on what it learned) draws 255
# tokens after a one-byte prompt, so the context grows from 1 to 256 positions, with the cache and
# without it, in turn for ROUNDS rounds (default 5), on one thread. Prints each round's ms per
# token, then the medians, their spread (min-max) and the ratio of the medians; also checks that
# both draw the same text. Target: the cache at least 5x faster per token.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$(dirname "$here")/build}" && pwd)
rounds=${2:-5}
case $rounds in '' | *[!0-9]* | 0) echo "usage: bench/generate.sh [BUILD_DIR] [ROUNDS >= 1]" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CDDP_LOG_LEVEL=error
"$build/bin/gpt_train" --n_layer 6 --n_embd 384 --n_head 6 --block_size 256 --batch_size 2 \
    --max_iters 2 --eval_interval 2 --eval_iters 1 --final_eval 1 --log_interval 0 --sample 0 \
    --out "$work/model" > "$work/train.out" 2>&1 || { cat "$work/train.out"; exit 1; }
gen() {
    "$build/bin/gpt_generate" "$work/model/checkpoint.safetensors" --tokens 255 --seed 5 --json "$@"
}
: > "$work/ms"
for r in $(seq "$rounds"); do
    gen > "$work/with.out"
    gen --no_cache > "$work/without.out"
    head -n -1 "$work/with.out" > "$work/with.txt"
    head -n -1 "$work/without.out" > "$work/without.txt"
    cmp -s "$work/with.txt" "$work/without.txt" ||
        { echo "bench/generate.sh: the cache drew other text than the recomputation" >&2; exit 1; }
    w=$(tail -n 1 "$work/with.out" | sed 's/.*"ms_per_token": \([0-9.]*\).*/\1/')
    n=$(tail -n 1 "$work/without.out" | sed 's/.*"ms_per_token": \([0-9.]*\).*/\1/')
    echo "round $r: with the cache $w ms/token, recomputing $n ms/token"
    echo "$w $n" >> "$work/ms"
done
sort -n -k1 "$work/ms" | awk -v n="$rounds" '
    { w[NR] = $1 } END { printf "%s %s %s\n", w[int((n + 1) / 2)], w[1], w[n] }' > "$work/w"
sort -n -k2 "$work/ms" | awk -v n="$rounds" '
    { x[NR] = $2 } END { printf "%s %s %s\n", x[int((n + 1) / 2)], x[1], x[n] }' > "$work/n"
read -r wm wlo whi < "$work/w"
read -r nm nlo nhi < "$work/n"
echo "GPT 6 layers, width 384, 255 tokens from a 1-byte prompt (context 1..256), 1 thread, $rounds rounds:"
echo "| | ms per token, median | min-max |"
echo "|---|---|---|"
echo "| key/value cache | $wm | $wlo-$whi |"
echo "| recomputing the context | $nm | $nlo-$nhi |"
awk -v a="$nm" -v b="$wm" 'BEGIN { r = a / b; printf "cache speed-up (ratio of medians): %.1fx (target >= 5x: %s)\n", r, (r >= 5 ? "met" : "NOT met") }'
