#!/bin/sh
# flood_test.sh BUILD_DIR FLOOD COMM_CHECK: a job of 2 nodes x 1 rank completes while a stranger
# holds 1000 connections to its rendezvous store (tests/launcher/flood.c), and the store stays
# small and quiet meanwhile.
#
# Node 0 (whose cddprun serves the store) starts with a limit of 200 file descriptors, so the
# flood also runs it out of descriptors; once the 1000 connections are open, node 1 starts and
# must join through them. Checks: both nodes exit 0 and their ranks' collectives are right; the
# server closed the strangers' connections (over 1000 closes before node 1 started, while node 0
# waited for it); node 0's cddprun peaked under
# 64 MiB resident and used under half a core; the log summed the turned-away connections up
# instead of a line for each.
set -u
build=$1 flood=$2 check=$3
R="$build/bin/cddprun"
work=$(mktemp -d)
fpid="" p0=""
cleanup() {
    [ -n "$fpid" ] && kill "$fpid" 2>/dev/null
    [ -n "$p0" ] && kill "$p0" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in n0 n1 flood.err flood.out; do echo "--- $f:"; cat "$work/$f"; done; exit 1; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE
export CDDP_LOG_LEVEL=warn CDDP_TRANSPORT=tcp
# Under AddressSanitizer (ctest sets ASAN_OPTIONS there), freed memory waits in a quarantine of
# up to 256 MiB, which the flood's thousands of connections fill: bound it, so that the 64 MiB
# limit below measures cddprun, not the sanitizer (recently freed memory is still checked).
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=8"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"
chmod 600 "$work/token"
common="--nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port"
common="$common --token_file $work/token --grace_period 10"

(ulimit -n 200 && CDDP_HOST_ID=host-a exec "$R" $common --node_rank 0 --local_addr 127.0.0.1 \
    "$check" matrix) > "$work/n0" 2>&1 &
p0=$!
# The store is up once the port takes connections.
i=0
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; do
    i=$((i + 1))
    [ $i -gt 100 ] && fail "node 0's store did not come up"
    sleep 0.1
done
"$flood" 127.0.0.1 "$port" 1000 --watch "$p0" > "$work/flood.out" 2> "$work/flood.err" &
fpid=$!
i=0
until grep -q ready "$work/flood.err"; do
    kill -0 "$fpid" 2>/dev/null || fail "the flood ended early"
    i=$((i + 1))
    [ $i -gt 300 ] && fail "the flood did not open its 1000 connections in 30 s"
    sleep 0.1
done
sleep 2 # the flood at full strength: every slot reopened at least once
kill -USR1 "$fpid" # how many the server has closed by now, while node 0 waits for node 1
start=$(date +%s)
CDDP_HOST_ID=host-b timeout 120 "$R" $common --node_rank 1 --local_addr 127.0.0.2 \
    "$check" matrix > "$work/n1" 2>&1
rc1=$?
[ "$rc1" = 124 ] && fail "node 1 did not finish in 120 s under the flood"
wait "$p0"
rc0=$?
p0=""
took=$(( $(date +%s) - start ))
kill "$fpid"
wait "$fpid"
fpid=""
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "node 0 exited $rc0, node 1 exited $rc1 under the flood"
[ "$(cat "$work/n0" "$work/n1" | grep -c '^ok: ')" = 2 ] || fail "not 2 ranks reported ok"
read -r early _ _ _ early_closed < "$work/flood.out" || fail "no flood snapshot"
[ "$early" = now ] || fail "no flood snapshot"
read -r _ opened _ closed _ rss _ cpu _ wall <<EOF
$(tail -n 1 "$work/flood.out")
EOF
[ -n "$wall" ] || fail "no flood summary"
echo "flood: opened $opened connections; before node 1 started, the server had closed" \
     "$early_closed; node 0's cddprun peaked at" \
     "$rss KiB and used $cpu s of CPU in $wall s; node 1 joined and the job finished in $took s"
[ "$opened" -ge 1000 ] || fail "the flood opened only $opened connections"
[ "$early_closed" -ge 1000 ] ||
    fail "the server had closed only $early_closed of the strangers' connections"
[ "$rss" -gt 0 ] && [ "$rss" -lt 65536 ] || fail "node 0's cddprun peaked at $rss KiB (limit 64 MiB)"
awk -v c="$cpu" -v w="$wall" 'BEGIN { exit !(w > 1 && c < 0.5 * w) }' ||
    fail "node 0's cddprun used $cpu s of CPU in $wall s (spinning?)"
grep -q "turned away" "$work/n0" || fail "node 0 did not log the turned-away connections"
lines=$(grep -c "turned away" "$work/n0")
[ "$lines" -le $(( took / 10 + 6 )) ] || fail "$lines log lines about strangers in $took s"
echo "ok: the job completed under a flood of 1000 connections without the token"
