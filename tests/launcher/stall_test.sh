#!/bin/sh
# stall_test.sh BUILD_DIR COMM_CHECK: a rank that stops answering is named in seconds, by the ranks
# and by the launcher, and a dead one is known as dead even before anyone reaps it.
#
#   stop shm|tcp  3 ranks allreduce in a loop (comm_check loop); rank 1 gets SIGSTOP. Within
#                 CDDP_STALL_WARN_S (1 s) the others log the collective and that they wait for
#                 rank 1; cddprun says rank 1 is stopped; after CDDP_TIMEOUT_S (5 s) the others
#                 fail, and cddprun's report names rank 1 as the root cause, not them.
#   --stopped_timeout 2  the same on shared memory with CDDP_TIMEOUT_S at 60 s: cddprun stops the
#                 job 2 s after rank 1 stopped, naming it as the root cause, and said so before
#   halt at exit  3 ranks; rank 2 exits with code 3 (or is SIGKILLed), and ranks 0 and 1, whose
#                 calls fail, stop themselves on their way out (as LeakSanitizer stops a process's
#                 threads at its exit to read their stacks): the report names rank 2, which
#                 failed first, not a rank stopped after it.
#   zombie        rank 1 runs under a parent that never reaps it, and is SIGKILLed: a zombie
#                 still answers kill(pid, 0), but rank 0 reports it dead at once, long before
#                 CDDP_TIMEOUT_S (60 s).
set -u
build=$1 check=$2
R="$build/bin/cddprun"
work=$(mktemp -d)
cp=""
cleanup() {
    [ -n "$cp" ] && kill -9 "$cp" 2>/dev/null
    for f in "$work"/pid.* "$work"/child.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$work"/launcher "$work"/logs/rank.*/std*; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
    exit 1
}
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE CDDP_TRANSPORT
export CDDP_LOG_LEVEL=warn
wait_file() { # wait_file PATH: up to 30 s
    i=0
    until [ -s "$1" ]; do
        i=$((i + 1))
        [ $i -gt 300 ] && fail "no $1 after 30 s"
        sleep 0.1
    done
}

# stop_rank_1 CDDPRUN_OPTIONS...: 3 ranks allreduce in a loop under cddprun; rank 1 gets SIGSTOP
# a second in. Sets stopped (its pid), rc (cddprun's exit) and took (seconds from the stop).
stop_rank_1() {
    rm -rf "$work/logs" "$work"/pid.*
    "$R" --standalone --nproc_per_node 3 --grace_period 2 --logdir "$work/logs" "$@" \
        sh -c "echo \$\$ > $work/pid.\$RANK; exec $check loop 120" > "$work/launcher" 2>&1 &
    cp=$!
    wait_file "$work/pid.1"
    sleep 1
    stopped=$(cat "$work/pid.1")
    kill -STOP "$stopped"
    t0=$(date +%s)
    wait "$cp"
    rc=$?
    cp=""
    took=$(($(date +%s) - t0))
}

for transport in shm tcp; do
    CDDP_TRANSPORT=$transport CDDP_STALL_WARN_S=1 CDDP_TIMEOUT_S=5 stop_rank_1
    [ "$rc" = 1 ] || fail "$transport: cddprun exited $rc (expected 1)"
    for r in 0 2; do
        grep -q "has waited [0-9]* s for rank[s]* [0-9, ]*\b1\b" "$work/logs/rank.$r/stderr" ||
            fail "$transport: rank $r did not log that it waits for rank 1"
    done
    grep -q "cddprun: rank 1 (local rank 1, pid $stopped) is stopped" "$work/launcher" ||
        fail "$transport: cddprun did not say rank 1 is stopped"
    grep -q "root cause: rank 1 (local rank 1, host .*, pid $stopped) stopped answering" \
        "$work/launcher" || fail "$transport: the root cause is not rank 1"
    grep -q "also failed: rank [02] " "$work/launcher" || fail "$transport: the survivors are not listed"
    [ "$took" -lt 20 ] || fail "$transport: the job took $took s to end after the stop"
    echo "ok: $transport: rank 1 stopped: the others named it after 1 s, cddprun's report names it," \
         "the job ended in $took s"
done

# The stall policy: --stopped_timeout ends the job long before the collectives' deadline.
CDDP_TIMEOUT_S=60 stop_rank_1 --stopped_timeout 2
[ "$rc" = 1 ] || fail "--stopped_timeout: cddprun exited $rc (expected 1)"
grep -q "cddprun: rank 1 (local rank 1, pid $stopped) is stopped .* failing after CDDP_TIMEOUT_S (60 s); cddprun stops the job if it is still stopped after 2 s (--stopped_timeout)" \
    "$work/launcher" || fail "--stopped_timeout: cddprun did not say what it would do"
grep -q "root cause: rank 1 (local rank 1, host .*, pid $stopped) stopped answering" \
    "$work/launcher" || fail "--stopped_timeout: the root cause is not rank 1"
[ "$took" -lt 15 ] || fail "--stopped_timeout: the job took $took s to end (CDDP_TIMEOUT_S is 60)"
echo "ok: --stopped_timeout 2: the job ended $took s after rank 1 stopped, naming it"

# A rank stopped on its way out, after the failure it followed (a leak checker at exit): never the
# root cause. Rank 2 leaves (exit code 3 on SIGUSR2, or SIGKILL); ranks 0 and 1 stop themselves
# once their calls fail.
for how in USR2 KILL; do
    rm -rf "$work/logs" "$work"/pid.*
    CDDP_TIMEOUT_S=60 "$R" --standalone --nproc_per_node 3 --grace_period 2 --logdir "$work/logs" \
        sh -c "echo \$\$ > $work/pid.\$RANK; exec $check loop 120 halt" > "$work/launcher" 2>&1 &
    cp=$!
    wait_file "$work/pid.2"
    sleep 1
    gone=$(cat "$work/pid.2")
    kill -$how "$gone"
    wait "$cp"
    rc=$?
    cp=""
    [ "$rc" = 1 ] || fail "halt at exit ($how): cddprun exited $rc (expected 1)"
    for r in 0 1; do
        grep -q "failed: rank $r after" "$work/logs/rank.$r/stdout" ||
            fail "halt at exit ($how): rank $r did not see its call fail"
    done
    [ $how = USR2 ] && said="exited with code 3" || said="was killed by SIGKILL"
    grep -q "root cause: rank 2 (local rank 2, host .*) $said" "$work/launcher" ||
        fail "halt at exit ($how): the root cause is not rank 2, which $said"
    echo "ok: rank 2 $said, ranks 0 and 1 stopped on their way out: the report names rank 2"
done

# A dead rank that its parent does not reap: a zombie.
rm -rf "$work/logs" "$work"/pid.*
keep='import subprocess, sys, time
p = subprocess.Popen(sys.argv[2:])
open(sys.argv[1], "w").write(str(p.pid))
time.sleep(600)'
CDDP_TIMEOUT_S=60 "$R" --standalone --nproc_per_node 2 --grace_period 2 --logdir "$work/logs" \
    sh -c "if [ \$RANK = 1 ]; then exec python3 -c '$keep' $work/child.1 $check loop 120; else exec $check loop 120; fi" \
    > "$work/launcher" 2>&1 &
cp=$!
wait_file "$work/child.1"
sleep 1
child=$(cat "$work/child.1")
kill -9 "$child"
t0=$(date +%s)
wait "$cp"
rc=$?
cp=""
took=$(($(date +%s) - t0))
[ "$rc" = 1 ] || fail "zombie: cddprun exited $rc (expected 1)"
grep -q "rank 1 (pid $child) died" "$work/logs/rank.0/stdout" ||
    fail "zombie: rank 0 did not report rank 1 dead"
[ "$took" -lt 15 ] || fail "zombie: the job took $took s to end (CDDP_TIMEOUT_S is 60)"
echo "ok: a dead, unreaped rank 1 was known dead at once; the job ended in $took s"
