#!/bin/sh
# blame_test.sh BUILD_DIR COMM_CHECK: a job of 2 nodes x 2 ranks (cddprun on 127.0.0.1 and on
# 127.0.0.2) allreduces in a loop; rank 3, on node 1, is SIGKILLed. Node 0's ranks then fail
# too (their peer died), but node 0's report, merged from both nodes', must name rank 3 on node 1
# as the root cause and its own ranks as what followed. Then node 1's ranks stopped (SIGSTOP,
# rank 3 first) with the collectives' deadline CDDP_TIMEOUT_S at 5 s: node 0's ranks time out,
# their failure ends node 1's round (no rank of node 1 fails by itself), and still the rank
# stopped first on node 1 is the root cause, not node 0's rank that gave up waiting. Last, a job of
# 3 nodes whose node 2 launcher is SIGKILLed in the rendezvous (registered, its workers not yet
# started): node 0 names node 2 as gone within seconds, not a rank that lost it.
set -u
build=$1 check=$2
R="$build/bin/cddprun"
work=$(mktemp -d)
p0="" p1=""
cleanup() {
    for p in $p0 $p1; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in n0 n1; do echo "--- node ${f#n}:"; cat "$work/$f"; done; exit 1; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE CDDP_TRANSPORT
export CDDP_LOG_LEVEL=error
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token")
common="--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port $port"
common="$common --token_file $work/token --grace_period 2"
worker="echo \$\$ > $work/pid.\$RANK; exec $check loop 120"
timeout0=300
for how in KILL STOP; do
rm -f "$work"/pid.*
CDDP_TIMEOUT_S=$timeout0 CDDP_HOST_ID=host-a "$R" $common --node_rank 0 --local_addr 127.0.0.1 sh -c "$worker" \
    > "$work/n0" 2>&1 &
p0=$!
CDDP_TIMEOUT_S=$timeout0 CDDP_HOST_ID=host-b "$R" $common --node_rank 1 --local_addr 127.0.0.2 sh -c "$worker" \
    > "$work/n1" 2>&1 &
p1=$!
i=0
until [ -s "$work/pid.3" ] && [ -s "$work/pid.0" ]; do
    i=$((i + 1))
    [ $i -gt 300 ] && fail "the ranks did not start in 30 s"
    sleep 0.1
done
sleep 1
victim=$(cat "$work/pid.3")
kill -$how "$victim"
if [ $how = STOP ]; then sleep 0.5; kill -STOP "$(cat "$work/pid.2")"; fi
wait "$p0"
rc0=$?
wait "$p1"
rc1=$?
p0="" p1=""
[ "$rc0" = 1 ] && [ "$rc1" = 1 ] || fail "SIG$how: node 0 exited $rc0, node 1 $rc1 (expected 1 and 1)"
if [ $how = KILL ]; then
    cause="rank 3 (local rank 1, host 127.0.0.2) was killed by SIGKILL"
else
    cause="rank 3 (local rank 1, host 127.0.0.2, pid $victim) stopped answering: it was stopped"
fi
grep -q "root cause, on node 1: $cause" "$work/n0" ||
    fail "SIG$how: node 0's report does not name rank 3 on node 1 as the root cause"
# Node 0's own ranks follow: failed by themselves, or stopped if node 1's word came first.
for r in 0 1; do
    grep -q "also failed, here: rank $r \|also failed: rank $r \|stopped: rank $r " "$work/n0" ||
        fail "SIG$how: node 0's report does not list its rank $r"
done
grep -q "root cause: $cause" "$work/n1" || fail "SIG$how: node 1's report does not name rank 3"
echo "ok: rank 3 SIG$how on node 1: node 0's merged report names it as the root cause, its own" \
     "ranks as what followed"
timeout0=5
done

# Node 2's launcher killed in the rendezvous of a 3-node job.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
c3="--nnodes 3 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port $port --token_file $work/token --grace_period 1"
CDDP_HOST_ID=host-a "$R" $c3 --node_rank 0 --local_addr 127.0.0.1 "$check" loop 30 > "$work/n0" 2>&1 &
p0=$!
CDDP_HOST_ID=host-c "$R" $c3 --node_rank 2 --local_addr 127.0.0.3 "$check" loop 30 > "$work/n2" 2>&1 &
p2=$!
sleep 1
kill -9 $p2
wait $p2 2>/dev/null
CDDP_HOST_ID=host-b "$R" $c3 --node_rank 1 --local_addr 127.0.0.2 "$check" loop 30 > "$work/n1" 2>&1 &
p1=$!
t0=$(date +%s)
wait "$p0"
rc0=$?
took=$(($(date +%s) - t0))
wait "$p1"
p0="" p1=""
[ "$rc0" = 1 ] || fail "node 2 killed in the rendezvous: node 0 exited $rc0"
grep -q "  root cause: node 2 (host 127.0.0.3, ranks 2-2) is gone: its launcher's connection to the job's store ended" "$work/n0" ||
    fail "node 2 killed in the rendezvous: node 0's report does not name it"
[ "$took" -le 30 ] || fail "node 2 killed in the rendezvous: node 0 took $took s"
echo "ok: node 2 of 3 killed in the rendezvous: node 0 named it as gone after $took s"
