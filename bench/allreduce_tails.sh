#!/bin/sh
# allreduce_tails.sh BUILD_DIR [ROUNDS] [ITERS]: the allreduce's tails and its round-to-round
# swings, idle and with one core loaded, next to Open MPI's, on 2 ranks.
#
# For each load (idle; then `stress-ng --cpu 1` beside the benchmark, or a shell busy loop where
# stress-ng is not installed) it runs ROUNDS rounds (default 5), each round cddp over shared
# memory, Open MPI (its shared-memory BTL) and cddp over TCP (4-64 KiB) in turn, ITERS calls a
# size (default 200) after 20 unmeasured ones, float32 sum in place. Each call is timed on rank 0. Prints one JSON line per
# size, implementation and round, tagged with "load", "round" and "transport"; bench/tails.py
# sums them up (p50 and p99 medians over the rounds, bandwidth per round, rounds where cddp's is
# below Open MPI's).
set -eu
build=$(cd "${1:?usage: allreduce_tails.sh BUILD_DIR [ROUNDS] [ITERS]}" && pwd)
rounds=${2:-5}
iters=${3:-200}
lo=4096
hi=67108864
load=""
stop_load() {
    if [ -n "$load" ]; then
        kill "$load" 2>/dev/null || true
        wait "$load" 2>/dev/null || true
        load=""
    fi
}
trap stop_load EXIT
trap 'stop_load; exit 130' INT TERM
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tag() { sed -n "s/^{/{\"load\": \"$1\", \"round\": $2, \"transport\": \"$3\", /p"; }
have_mpi=0
[ -x "$build/bin/mpi-bench-allreduce" ] && command -v mpirun > /dev/null && have_mpi=1
for cond in idle loaded; do
    if [ $cond = loaded ]; then
        if command -v stress-ng > /dev/null; then
            stress-ng --cpu 1 --quiet &
        else
            sh -c 'while :; do :; done' &
        fi
        load=$!
        sleep 1
    fi
    r=1
    while [ $r -le "$rounds" ]; do
        "$build/bin/cddprun" --standalone --nproc_per_node 2 "$build/bin/cddp-bench-allreduce" \
            --min-bytes $lo --max-bytes $hi --iters "$iters" --warmup 20 --json 2>/dev/null | tag $cond $r shm
        if [ $have_mpi = 1 ]; then
            mpirun --allow-run-as-root --oversubscribe -np 2 "$build/bin/mpi-bench-allreduce" \
                --min-bytes $lo --max-bytes $hi --iters "$iters" --warmup 20 2>/dev/null | tag $cond $r vader
        fi
        CDDP_TRANSPORT=tcp "$build/bin/cddprun" --standalone --nproc_per_node 2 \
            "$build/bin/cddp-bench-allreduce" --min-bytes $lo --max-bytes 65536 --iters "$iters" --warmup 20 \
            --json 2>/dev/null | tag $cond $r tcp
        r=$((r + 1))
    done
    stop_load
done
