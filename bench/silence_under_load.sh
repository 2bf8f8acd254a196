#!/bin/sh
# bench/silence_under_load.sh [BUILD_DIR] [ROUNDS]: false alarms of the silence bound
# (CDDP_STORE_REPLY_S, 5 s by default: a node whose launcher's heartbeat has not moved that long is
# taken for gone) on a loaded machine. Each round runs the emulated-host jobs that must end well
# (tests/hosts/hosts_test.sh 2x2, 4x1, c10d: 4 ranks training across hosts) with stress-ng --cpu 4
# beside them (4 busy processes more than this machine's cores, on a 2-core machine), and counts
# the jobs that failed and the reports that called a live node silent. As root.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$(dirname "$here")/build}" && pwd)
rounds=${2:-3}
[ "$(id -u)" = 0 ] || { echo "bench/silence_under_load.sh: needs root (network namespaces)" >&2; exit 2; }
command -v stress-ng > /dev/null || { echo "bench/silence_under_load.sh: needs stress-ng (apt-get install stress-ng)" >&2; exit 2; }
out=$(mktemp)
load=""
trap 'rm -f "$out"; [ -z "$load" ] || kill "$load" 2>/dev/null' EXIT
jobs=0 failed=0 alarms=0
for r in $(seq "$rounds"); do
    stress-ng --cpu 4 --timeout 600 > /dev/null 2>&1 &
    load=$!
    for s in 2x2 4x1 c10d; do
        jobs=$((jobs + 1))
        if ! "$here/../tests/hosts/hosts_test.sh" "$build" "$s" > "$out" 2>&1; then
            failed=$((failed + 1))
            echo "round $r: $s failed: $(grep -m1 FAIL "$out")"
        fi
        n=$(grep -c "stopped answering" "$out")
        alarms=$((alarms + n))
    done
    kill "$load" 2>/dev/null
    wait "$load" 2>/dev/null
    load=""
    echo "round $r: $jobs jobs so far, $failed failed, $alarms live nodes called silent (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "with stress-ng --cpu 4 beside: $jobs jobs across emulated hosts, $failed failed, $alarms false alarms (CDDP_STORE_REPLY_S=${CDDP_STORE_REPLY_S:-5})"
