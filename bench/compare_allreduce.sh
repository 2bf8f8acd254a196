#!/bin/sh
# compare_allreduce.sh BUILD_DIR [RANKS] [ROUNDS]: cddp's allreduce next to Open MPI's
# MPI_Allreduce and (with Debian's python3-torch) torch.distributed's gloo, in one run, same
# sizes, float32 sum in place, each call timed after refilling its input. The three run in turn
# for ROUNDS rounds (default 3) and each keeps its best time per size, which filters out the
# noise of a shared machine the same way for all. Prints time, bus bandwidth, and the ratios
# cddp/Open MPI and cddp/gloo (> 1: cddp is faster).
set -eu
build=${1:?usage: compare_allreduce.sh BUILD_DIR [RANKS]}
n=${2:-2}
rounds=${3:-3}
lo=4096 ; hi=67108864
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
r=0
while [ $r -lt "$rounds" ]; do
    "$build/bin/cddprun" --standalone --nproc_per_node "$n" "$build/bin/cddp-bench-allreduce" \
        --min-bytes $lo --max-bytes $hi --json >> "$work/cddp" 2>/dev/null
    if [ -x "$build/bin/mpi-bench-allreduce" ] && command -v mpirun > /dev/null; then
        mpirun --allow-run-as-root --oversubscribe -np "$n" "$build/bin/mpi-bench-allreduce" \
            --min-bytes $lo --max-bytes $hi >> "$work/mpi" 2>/dev/null
    fi
    if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
        "$build/bin/cddprun" --standalone --nproc_per_node "$n" --no_python /usr/bin/python3 \
            "$(dirname "$0")/torch_allreduce.py" $lo $hi >> "$work/gloo" 2>/dev/null
    fi
    r=$((r + 1))
done
# The best (smallest time, largest bandwidth) of the rounds for one size and field.
field() {
    v=$(sed -n "s/.*\"bytes\": $2,.*\"$3\": \([0-9.e+-]*\).*/\1/p" "$work/$1" 2>/dev/null | sort -g)
    case $3 in time*) echo "$v" | head -n 1 ;; *) echo "$v" | tail -n 1 ;; esac
}
echo "allreduce, $n ranks, float32 sum, in place, best of $rounds rounds (time in us, busbw in GB/s)"
printf '%10s | %9s %7s | %9s %7s | %9s %7s | %8s %8s\n' bytes cddp busbw openmpi busbw gloo busbw \
    "vs ompi" "vs gloo"
b=$lo
while [ $b -le $hi ]; do
    ct=$(field cddp $b time_us_inplace); cb=$(field cddp $b busbw_inplace)
    mt=$(field mpi $b time_us_inplace); mb=$(field mpi $b busbw_inplace)
    gt=$(field gloo $b time_us_inplace); gb=$(field gloo $b busbw_inplace)
    rm=$( [ -n "$mt" ] && awk -v a="$ct" -v b="$mt" 'BEGIN { printf "%.2fx", b / a }' || echo -)
    rg=$( [ -n "$gt" ] && awk -v a="$ct" -v b="$gt" 'BEGIN { printf "%.2fx", b / a }' || echo -)
    printf '%10s | %9s %7s | %9s %7s | %9s %7s | %8s %8s\n' $b "$ct" "$cb" "${mt:--}" "${mb:--}" \
        "${gt:--}" "${gb:--}" "$rm" "$rg"
    b=$((b * 2))
done
grep -h '"wrong_inplace": [1-9]' "$work"/* && { echo "WRONG RESULTS above"; exit 1; }
exit 0
