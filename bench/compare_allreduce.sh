#!/bin/sh
# compare_allreduce.sh BUILD_DIR [RANKS] [ROUNDS]: cddp's allreduce next to Open MPI's
# MPI_Allreduce and (with Debian's python3-torch) torch.distributed's gloo, in one run, same
# sizes, float32 sum in place, each call timed after refilling its input. cddp runs twice: on
# plain buffers (what a user's array is) and on registered ones (cddp_comm_alloc, what DDP's
# gradients are). A second table puts cddp's TCP transport (forced on this host) next to Open
# MPI's TCP BTL. All run in turn for ROUNDS rounds (default 3) and each keeps its best time per
# size, which filters out the noise of a shared machine the same way for all. Prints time, bus
# bandwidth, and the ratios to Open MPI and gloo (> 1: cddp is faster).
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
    "$build/bin/cddprun" --standalone --nproc_per_node "$n" "$build/bin/cddp-bench-allreduce" \
        --min-bytes $lo --max-bytes $hi --json --registered >> "$work/reg" 2>/dev/null
    if [ -x "$build/bin/mpi-bench-allreduce" ] && command -v mpirun > /dev/null; then
        mpirun --allow-run-as-root --oversubscribe -np "$n" "$build/bin/mpi-bench-allreduce" \
            --min-bytes $lo --max-bytes $hi >> "$work/mpi" 2>/dev/null
    fi
    # Over TCP (loopback): cddp's TCP transport forced, Open MPI's TCP BTL.
    CDDP_TRANSPORT=tcp "$build/bin/cddprun" --standalone --nproc_per_node "$n" \
        "$build/bin/cddp-bench-allreduce" --min-bytes $lo --max-bytes $hi --json >> "$work/tcp" 2>/dev/null
    if [ -x "$build/bin/mpi-bench-allreduce" ] && command -v mpirun > /dev/null; then
        mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl tcp,self \
            "$build/bin/mpi-bench-allreduce" --min-bytes $lo --max-bytes $hi >> "$work/mpitcp" 2>/dev/null
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
ratio() { [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", b / a }' || echo -; }
echo "allreduce, $n ranks, float32 sum, in place, best of $rounds rounds (time in us, busbw in GB/s)"
echo "cddp: plain buffers; cddp reg: registered (cddp_comm_alloc); ratios: the other's time / cddp's"
printf '%10s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %7s %7s %7s\n' bytes cddp busbw \
    "cddp reg" busbw openmpi busbw gloo busbw "ompi/c" "ompi/cr" "gloo/c"
b=$lo
while [ $b -le $hi ]; do
    ct=$(field cddp $b time_us_inplace); cb=$(field cddp $b busbw_inplace)
    rt=$(field reg $b time_us_inplace); rb=$(field reg $b busbw_inplace)
    mt=$(field mpi $b time_us_inplace); mb=$(field mpi $b busbw_inplace)
    gt=$(field gloo $b time_us_inplace); gb=$(field gloo $b busbw_inplace)
    printf '%10s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %7s %7s %7s\n' $b "$ct" "$cb" "$rt" "$rb" \
        "${mt:--}" "${mb:--}" "${gt:--}" "${gb:--}" "$(ratio "$ct" "$mt")" "$(ratio "$rt" "$mt")" \
        "$(ratio "$ct" "$gt")"
    b=$((b * 2))
done
echo
echo "allreduce over TCP (loopback), $n ranks: cddp with CDDP_TRANSPORT=tcp, Open MPI with --mca btl tcp,self"
printf '%14s | %8s %6s | %8s %6s | %7s\n' bytes "cddp tcp" busbw "ompi tcp" busbw "ompi/c"
b=$lo
while [ $b -le $hi ]; do
    ct=$(field tcp $b time_us_inplace); cb=$(field tcp $b busbw_inplace)
    mt=$(field mpitcp $b time_us_inplace); mb=$(field mpitcp $b busbw_inplace)
    printf 'tcp %10s | %8s %6s | %8s %6s | %7s\n' $b "$ct" "$cb" "${mt:--}" "${mb:--}" "$(ratio "$ct" "$mt")"
    b=$((b * 2))
done
grep -h '"wrong_inplace": [1-9]' "$work"/* && { echo "WRONG RESULTS above"; exit 1; }
exit 0
