#!/bin/sh
# mlp_vs_torch.sh BENCH_MLP [ROUNDS]: cddp and PyTorch train the MLP one epoch each, at batch 32,
# SGD lr 0.01, one thread, on the same data, alternating for ROUNDS rounds (default 3) so that both
# see the same machine load. Prints each run, the best of each, and the ratio cddp / PyTorch.
set -eu
bench=${1:?usage: mlp_vs_torch.sh path/to/bench_mlp [rounds]}
rounds=${2:-3}
here=$(dirname "$0")
py=/usr/bin/python3
[ -x "$py" ] || py=python3
best() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | sort -g | tail -n 1; }
cddp_runs="" ; torch_runs=""
i=0
while [ "$i" -lt "$rounds" ]; do
    c=$(OPENBLAS_NUM_THREADS=1 "$bench" --batch-size 32 --lr 0.01 --threads 1)
    t=$(OMP_NUM_THREADS=1 "$py" "$here/mlp_torch.py" --batch-size 32 --lr 0.01 --threads 1)
    echo "$c"
    echo "$t"
    cddp_runs="$cddp_runs$c
"
    torch_runs="$torch_runs$t
"
    i=$((i + 1))
done
cb=$(printf '%s' "$cddp_runs" | best)
tb=$(printf '%s' "$torch_runs" | best)
ratio=$(awk -v a="$cb" -v b="$tb" 'BEGIN { printf "%.2f", a / b }')
echo
echo "| implementation | samples/s (best of $rounds) |"
echo "|---|---|"
echo "| cddp | $cb |"
echo "| PyTorch $($py -c 'import torch; print(torch.__version__)') | $tb |"
echo "| ratio cddp / PyTorch | ${ratio}x |"
