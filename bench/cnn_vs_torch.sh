#!/bin/sh
# cnn_vs_torch.sh BUILD_DIR [ROUNDS] [MODEL]: training throughput of fashion_mnist's CNN (or
# MODEL: cnn, the default, or resnet) on Fashion-MNIST, one epoch, batch 64 per rank, SGD lr
# 0.01, one thread per rank: cddp (bench/bench_mlp.c, DistributedDataParallel on 2 ranks) and
# PyTorch (bench/mlp_torch.py, DDP over gloo on 2 ranks), each on 1 and 2 ranks started by
# cddprun, and each as one process with 2 threads (what a user might run instead of 2 ranks), the
# six settings interleaved for ROUNDS rounds (default 5) so that all see the same machine load.
# Prints every run, then the median samples/s of each setting with the spread (lowest..highest)
# and the ratios of the medians.
set -eu
build=${1:?usage: cnn_vs_torch.sh BUILD_DIR [rounds] [cnn|resnet]}
rounds=${2:-5}
model=${3:-cnn}
here=$(dirname "$0")
py=/usr/bin/python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CDDP_LOG_LEVEL=error
run() { "$build/bin/cddprun" --standalone --nproc_per_node "$@"; }
all=$(mktemp)
trap 'rm -f "$all"' EXIT
i=0
while [ "$i" -lt "$rounds" ]; do
    for w in 1 2; do
        run "$w" "$build/bin/bench_mlp" --model "$model" --batch-size 64 --lr 0.01 |
            sed 's/^/cddp /' | tee -a "$all"
        run "$w" --no_python "$py" "$here/mlp_torch.py" --model "$model" --batch-size 64 --lr 0.01 |
            sed 's/^/torch /' | tee -a "$all"
    done
    # One process, two threads: oneDNN's (OpenMP) and OpenBLAS's; the JSON says world 1, kept
    # apart as "world": 12.
    OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 "$build/bin/bench_mlp" --model "$model" --batch-size 64 \
        --lr 0.01 --threads 2 | sed 's/^/cddp /; s/"world": 1,/"world": 12,/' | tee -a "$all"
    OMP_NUM_THREADS=2 "$py" "$here/mlp_torch.py" --model "$model" --batch-size 64 --lr 0.01 --threads 2 |
        sed 's/^/torch /; s/"world": 1,/"world": 12,/' | tee -a "$all"
    i=$((i + 1))
done
# stat IMPL WORLD: "median lowest highest" of samples/s.
stat() {
    grep "^$1 " "$all" | grep "\"world\": $2," | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' |
        sort -g | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                         printf "%.0f %.0f %.0f", m, v[1], v[NR] }'
}
set -- $(stat cddp 1) $(stat cddp 2) $(stat torch 1) $(stat torch 2) $(stat cddp 12) $(stat torch 12)
r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "| $model, batch 64 per rank, samples/s: median (lowest..highest) of $rounds | 1 rank, 1 thread | 2 ranks, 1 thread each | 2 ranks / 1 rank | 1 process, 2 threads |"
echo "|---|---|---|---|---|"
echo "| cddp | $1 ($2..$3) | $4 ($5..$6) | $(r "$4" "$1")x | ${13} (${14}..${15}) |"
echo "| PyTorch $($py -c 'import torch; print(torch.__version__)'), DDP over gloo | $7 ($8..$9) | ${10} (${11}..${12}) | $(r "${10}" "$7")x | ${16} (${17}..${18}) |"
echo "| cddp / PyTorch | $(r "$1" "$7")x | $(r "$4" "${10}")x | | $(r "${13}" "${16}")x |"
