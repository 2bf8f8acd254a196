#!/bin/sh
# ddp_vs_torch.sh BUILD_DIR [ROUNDS]: data-parallel training of the MLP (784-512-512-10) on
# Fashion-MNIST, one epoch, batch 32 per rank, SGD lr 0.01, one thread per rank: cddp (bench_mlp
# wrapped with DistributedDataParallel) and PyTorch DDP over gloo (bench/mlp_torch.py), each on
# 1 and 2 ranks started by cddprun, alternating for ROUNDS rounds (default 3) so that all four see
# the same machine load. Prints every run, the best of each, the ratios, and cddp's time split of
# the last step on 2 ranks.
set -eu
build=${1:?usage: ddp_vs_torch.sh BUILD_DIR [rounds]}
rounds=${2:-3}
here=$(dirname "$0")
py=/usr/bin/python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CDDP_LOG_LEVEL=error
run() { "$build/bin/cddprun" --standalone --nproc_per_node "$@"; }
best() { grep "\"world\": $1," | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | sort -g | tail -n 1; }
all=$(mktemp)
trap 'rm -f "$all"' EXIT
i=0
while [ "$i" -lt "$rounds" ]; do
    for w in 1 2; do
        run "$w" "$build/bin/bench_mlp" --batch-size 32 --lr 0.01 | tee -a "$all"
        run "$w" --no_python "$py" "$here/mlp_torch.py" --batch-size 32 --lr 0.01 | sed 's/^/torch /' | tee -a "$all"
    done
    i=$((i + 1))
done
c1=$(grep -v '^torch' "$all" | best 1) c2=$(grep -v '^torch' "$all" | best 2)
t1=$(grep '^torch' "$all" | best 1) t2=$(grep '^torch' "$all" | best 2)
split=$(grep -v '^torch' "$all" | grep '"world": 2,' | tail -n 1 |
    sed -e 's/.*"forward_ms": \([0-9.]*\), "backward_ms": \([0-9.]*\), "allreduce_ms": \([0-9.]*\), "wait_ms": \([0-9.]*\), "overlap": \([0-9.]*\), "buckets": \([0-9]*\)\(.*\)/forward \1 ms, backward \2 ms, allreduce \3 ms in \6 buckets, wait after backward \4 ms, overlap \5\7/' \
        -e 's/, "comm_inline": true}$/ (buckets reduced inline in backward)/' -e 's/, "comm_inline": false}$//' -e 's/}$//')
r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "| MLP, batch 32 per rank, 1 thread per rank | 1 rank | 2 ranks | 2 ranks / 1 rank |"
echo "|---|---|---|---|"
echo "| cddp DDP (samples/s, best of $rounds) | $c1 | $c2 | $(r "$c2" "$c1")x |"
echo "| PyTorch $($py -c 'import torch; print(torch.__version__)') DDP, gloo | $t1 | $t2 | $(r "$t2" "$t1")x |"
echo "| cddp / PyTorch | $(r "$c1" "$t1")x | $(r "$c2" "$t2")x | |"
echo
echo "cddp, last step on 2 ranks: $split"
