#!/bin/sh
# launch_bench.sh BUILD_DIR [RUNS]: how long cddprun takes to start and finish a 2-process job:
# (a) cddprun --nproc_per_node 2 /bin/true; (b) the same with a 2-rank rendezvous + barrier
# through the launcher's store (bench/rdzv_barrier.c). Prints the median, min and max of RUNS
# (default 50) wall times in milliseconds. With Debian's python3-torch installed, also (c) the
# same 2-rank rendezvous + barrier done by PyTorch (bench/torch_barrier.py: env://, gloo), started
# by cddprun, 10 runs: what a torchrun-style job pays before its first step.
set -eu
build=${1:?usage: launch_bench.sh BUILD_DIR [RUNS]}
runs=${2:-50}
stats() { # reads milliseconds, one a line
    sort -g | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                     printf "median %.1f ms (min %.1f, max %.1f, %d runs)", m, v[1], v[NR], NR }'
}
measure() {
    i=0
    while [ "$i" -lt "$runs" ]; do
        t0=$(date +%s%N)
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$build/bin/cddprun" --standalone --nproc_per_node 2 "$@"
        t1=$(date +%s%N)
        echo $(( (t1 - t0) / 1000 )) | awk '{ print $1 / 1000 }'
        i=$((i + 1))
    done
}
echo "cddprun --nproc_per_node 2 /bin/true:            $(measure /bin/true | stats)"
echo "cddprun --nproc_per_node 2 rendezvous + barrier: $(measure "$build/bin/rdzv_barrier" | stats)"
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
    runs=10
    echo "PyTorch gloo rendezvous + barrier (2 ranks):    $(measure --no_python /usr/bin/python3 \
        "$(dirname "$0")/torch_barrier.py" | stats)"
fi
