#!/bin/sh
# allreduce_tails.sh BUILD_DIR [ROUNDS] [ITERS]: the allreduce's tails and its round-to-round
# swings, idle and with one core loaded, next to Open MPI's, on 2 ranks.
#
# For each load (idle; then `stress-ng --cpu 1` beside the benchmark, or a shell busy loop where
# stress-ng is not installed) it runs ROUNDS rounds (default 5). A round: 4-64 KiB with cddp over
# shared memory, Open MPI (its shared-memory BTL) and cddp over TCP in turn, ITERS calls a size
# (default 200) after 20 unmeasured ones; then 1, 4, 16 and 64 MiB one at a time, cddp then Open
# MPI, each over at least 512 MiB (500, 128, 50 and 50 calls): a window of 50 calls of 1 MiB lasts
# 15 ms, under 4 of the scheduler's time slices, so with a core busy one slice lost to the load
# decided a round. Float32 sum in place; each call is timed on rank 0. Prints one JSON line per
# size, implementation and round, tagged with "load", "round" and "transport"; bench/tails.py
# sums them up (p50 and p99 medians over the rounds, bandwidth per round, rounds where cddp's is
# below Open MPI's).
set -eu
build=$(cd "${1:?usage: allreduce_tails.sh BUILD_DIR [ROUNDS] [ITERS]}" && pwd)
rounds=${2:-5}
iters=${3:-200}
lo=4096
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
have_mpi=0
[ -x "$build/bin/mpi-bench-allreduce" ] && command -v mpirun > /dev/null && have_mpi=1
tag() { sed -n "s/^{/{\"load\": \"$1\", \"round\": $2, \"transport\": \"$3\", /p"; }
cddp() { # LOAD ROUND TRANSPORT MIN MAX ITERS
    "$build/bin/cddprun" --standalone --nproc_per_node 2 "$build/bin/cddp-bench-allreduce" \
        --min-bytes "$4" --max-bytes "$5" --iters "$6" --warmup 20 --json 2>/dev/null | tag "$1" "$2" "$3"
}
mpi() { # LOAD ROUND MIN MAX ITERS
    [ $have_mpi = 1 ] || return 0
    mpirun --allow-run-as-root --oversubscribe -np 2 "$build/bin/mpi-bench-allreduce" \
        --min-bytes "$3" --max-bytes "$4" --iters "$5" --warmup 20 2>/dev/null | tag "$1" "$2" vader
}
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
        # Latency: the small sizes in one sweep each.
        cddp $cond $r shm $lo 65536 "$iters"
        mpi $cond $r $lo 65536 "$iters"
        CDDP_TRANSPORT=tcp cddp $cond $r tcp $lo 65536 "$iters"
        # Bandwidth: each large size on its own, cddp then Open MPI, so that the two of a pair
        # run seconds apart, not minutes (this machine's speed swings between minutes).
        for b in 1048576 4194304 16777216 67108864; do
            calls=$((536870912 / b))
            [ $calls -ge 50 ] || calls=50
            cddp $cond $r shm $b $b $calls
            mpi $cond $r $b $b $calls
        done
        r=$((r + 1))
    done
    stop_load
done
