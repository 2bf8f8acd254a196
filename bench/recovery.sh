#!/bin/sh
# bench/recovery.sh [BUILD_DIR] [TRIALS] [kill|vanish]: how long an elastic job takes to train
# again after a host dies, on emulated hosts (tests/hosts/hosts_test.sh elastic: 3 hosts of 1
# rank, --nnodes 2:3, host 2 SIGKILLed in the second epoch; vanish: host 2's link cut instead,
# nothing closing, found by its silence; the time from the fault to node 0's "resumed from"
# line). Runs TRIALS trials (default 5) one after another and prints each, then the median and
# the spread. As root (network namespaces). The test itself only bounds this at 60 s, what a
# loaded machine keeps; this is the figure.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$(dirname "$here")/build}" && pwd)
trials=${2:-5}
fault=${3:-kill}
case $fault in kill) scenario=elastic ;; vanish) scenario=vanish ;; *) echo "usage: bench/recovery.sh [BUILD_DIR] [TRIALS] [kill|vanish]" >&2; exit 2 ;; esac
case $trials in '' | *[!0-9]* | 0) echo "usage: bench/recovery.sh [BUILD_DIR] [TRIALS >= 1]" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench/recovery.sh: needs root (network namespaces)" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
: > "$out.ms"
for t in $(seq "$trials"); do
    "$here/../tests/hosts/hosts_test.sh" "$build" "$scenario" > "$out" 2>&1 ||
        { cat "$out" >&2; echo "bench/recovery.sh: trial $t failed" >&2; exit 1; }
    ms=$(sed -n 's/.*training again (.*) after \([0-9]*\) ms.*/\1/p' "$out")
    echo "trial $t: training again $ms ms after the $fault"
    echo "$ms" >> "$out.ms"
done
sort -n "$out.ms" | awk -v n="$trials" -v f="$fault" '{ v[NR] = $1 } END {
    printf "%s to training again, %d trials: median %d ms, min %d, max %d\n", f, n, v[int((n + 1) / 2)], v[1], v[n] }'
rm -f "$out.ms"
