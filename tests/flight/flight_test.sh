#!/bin/sh
# flight_test.sh BUILD_DIR PLANTED: faults planted on one rank of a 4-rank DDP job (planted.c),
# started by the real cddprun, on one host and again on 2 emulated hosts x 2 (two_hosts.sh: two
# cddprun, TCP between them). The straggler attribution names the rank and the phase within 50
# steps (and nothing in a clean run of 500 steps); the flight records' report names the rank and
# the collective of a hang, a stopped rank and a skipped collective, while the job waits (within
# the stall time) and after it failed; `cddprun --dump` asks a running job for its records (on
# one host, and on node 1 of 2 whose records are in another folder than node 0's: the report has
# every rank's, through the job's store); and cddp-trace reads them again, with a timeline.
set -u
build=$1 planted=$2
R="$build/bin/cddprun" T="$build/bin/cddp-trace"
two_hosts=$(dirname "$0")/../comm/two_hosts.sh
work=$(mktemp -d)
bg=""
cleanup() {
    [ -n "$bg" ] && kill "$bg" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() {
    echo "FAIL: $*"
    [ -f "$work/out" ] && { echo "--- output"; cat "$work/out"; }
    [ -f "$work/job" ] && { echo "--- the job's console (its end)"; tail -n 40 "$work/job"; }
    exit 1
}
has() { grep -qF -- "$1" "$work/out" || fail "expected: $1"; }
has_re() { grep -qE -- "$1" "$work/out" || fail "expected (a pattern): $1"; }
hasnt() { ! grep -qF -- "$1" "$work/out" || fail "did not expect: $1"; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE CDDP_TRANSPORT CDDP_FLIGHT_DIR
export CDDP_LOG_LEVEL=warn

# run LAYOUT ARGS...: the job on one host (one) or two emulated ones (two); output in $work/out
run() {
    layout=$1
    shift
    rm -rf "$work/logs"
    if [ "$layout" = one ]; then
        "$R" --standalone --nproc_per_node 4 --logdir "$work/logs" "$planted" "$@" > "$work/out" 2>&1
    else
        "$two_hosts" --any-exit "$build" 2 "$planted" "$@" > "$work/out" 2>&1
    fi
}

for layout in one two; do
    echo "== $layout host(s)"
    # A clean run names no one over 500 steps (10 comparisons).
    run $layout none 0 500
    has "compared at 500: straggler -1"
    hasnt "straggler: rank"
    # Stragglers: the rank and the phase, at the first comparison (step 50).
    run $layout backward 3 60 20
    has "compared at 50: straggler 3"
    has "straggler: rank 3 is"
    has "its backward ("
    run $layout data 1 60 20
    has "compared at 50: straggler 1"
    has "its data loading ("
    run $layout optimizer 2 60 20
    has "compared at 50: straggler 2"
    has "its optimizer step ("
    # Hangs: the report while the others wait (stall at 2 s), and after the timeout (8 s).
    export CDDP_STALL_WARN_S=2 CDDP_TIMEOUT_S=8
    run $layout hang 3 30
    has "where every rank stands, from their flight records"
    # while they wait: after the stall warning (2 s), before the timeout (8 s)
    has_re "ranks 0-2 wait in allreduce #15 \(bucket 0: fc3\.weight \.\. fc1\.bias\), up to [2-7]\.[0-9] s"
    has "rank 3 is in step 5's forward"
    has "<- BEHIND"
    has "ranks 0-2 wait in allreduce #15 (bucket 0: fc3.weight .. fc1.bias), up to 8."
    has "  the others waited for: rank 3 is in step 5's forward"
    run $layout stop 1 30
    has "ranks 0, 2-3 wait in allreduce #15 (bucket 0: fc3.weight .. fc1.bias)"
    has "rank 1 left no record: it is stopped"
    run $layout skip 2 30
    has "MISMATCH at collective #16: rank 2 called allreduce(mean, float32, count 26122) where ranks 0-1, 3 called allreduce(mean, float64, count 1)"
    unset CDDP_STALL_WARN_S CDDP_TIMEOUT_S
done

# cddp-trace reads the last job's records again, with a timeline of every rank.
run one skip 2 30
"$T" --timeline "$work/tl.json" "$work/logs" > "$work/out" 2>&1 || fail "cddp-trace failed"
has "flight records in $work/logs/flight: 4 of 4 ranks"
has "MISMATCH at collective #16: rank 2"
python3 - "$work/tl.json" <<'PYEOF' || fail "the timeline"
import json, sys
ev = json.load(open(sys.argv[1]))
ranks = {e["pid"] for e in ev}
names = {e["name"] for e in ev if e.get("ph") == "X"}
assert ranks == {0, 1, 2, 3}, ranks
assert "forward" in names and "backward" in names and "allreduce #16" in names, names
PYEOF
"$T" "$work/nothing" > "$work/out" 2>&1 && fail "cddp-trace of no records succeeded"
has "no flight records"

# cddprun --dump from another shell: every rank writes its record, the job goes on. The round's
# start sweeps the temporary a rank killed while writing its record left.
rm -rf "$work/logs"
mkdir -p "$work/logs/flight"
: > "$work/logs/flight/rank-3.json.4242.7.tmp"
"$R" --standalone --nproc_per_node 4 --logdir "$work/logs" "$planted" none 0 200000 > "$work/job" 2>&1 &
bg=$!
i=0
until [ -f "$work/logs/flight/cddprun-node0.pid" ]; do
    i=$((i + 1))
    [ $i -gt 300 ] && fail "no cddprun pid file after 30 s"
    sleep 0.1
done
sleep 2
[ ! -e "$work/logs/flight/rank-3.json.4242.7.tmp" ] || fail "a killed rank's temporary was kept"
"$R" --dump --logdir "$work/logs" > "$work/out" 2>&1 || fail "cddprun --dump failed"
has "flight records in $work/logs/flight: 4 of 4 ranks"
has "wrote it: SIGUSR1: asked for the record"
kill -0 "$bg" || fail "the job ended after --dump"
# SIGUSR1 at the launcher every 20 ms for 2 s: a report under way (it waits 1 s for the records)
# answers the requests that come meanwhile, so each rank writes a record a second, not 100.
sleep 1
before=$(grep -c "flight record written" "$work/job")
launcher=$(cat "$work/logs/flight/cddprun-node0.pid")
for _ in $(seq 100); do
    kill -USR1 "$launcher"
    sleep 0.02
done
sleep 2
made=$(($(grep -c "flight record written" "$work/job") - before))
[ "$made" -ge 4 ] && [ "$made" -le 16 ] || fail "100 SIGUSR1 in 2 s made $made records of 4 ranks"
kill "$bg"
wait "$bg"
bg=""
grep -qF "where every rank stands, from their flight records" "$work/job" ||
    { cat "$work/job"; fail "the job's console had no report"; }
# cddprun --dump on node 1 of 2 emulated hosts, each with its own TMPDIR (its own folder): the
# report printed there has node 0's ranks too (posted through the job's store), and so has node
# 0's console.
export TWO_HOSTS_TMPDIR="$work/hosts"
"$two_hosts" --any-exit "$build" 2 "$planted" none 0 200000 > "$work/job" 2>&1 &
bg=$!
i=0
until ls "$work"/hosts/node1/cddp-flight-*/cddprun-node1.pid > /dev/null 2>&1; do
    i=$((i + 1))
    [ $i -gt 300 ] && fail "no node 1 cddprun pid file after 30 s"
    sleep 0.1
done
sleep 2
node1=$(ls -d "$work"/hosts/node1/cddp-flight-*)
"$R" --dump "$node1" > "$work/out" 2>&1 || fail "cddprun --dump on node 1 failed"
has "flight records in $node1: 4 of 4 ranks"
has "rank 0 (pid "
has "rank 3 (pid "
# node 0 prints its own report once node 1's records reached it through the store: wait for it
# (node 0 waits up to 2 s for the other node's records) before stopping the job.
i=0
until grep -qF "flight records in $(ls -d "$work"/hosts/node0)/cddp-flight-" "$work/job"; do
    i=$((i + 1))
    [ $i -gt 150 ] && break
    sleep 0.1
done
for node in 0 1; do
    kill "$(cat "$work"/hosts/node$node/cddp-flight-*/cddprun-node$node.pid)" ||
        fail "node $node's cddprun ended after --dump"
done
wait "$bg"
bg=""
grep -qF "flight records in $(ls -d "$work"/hosts/node0)/cddp-flight-" "$work/job" &&
    grep -qF ": 4 of 4 ranks" "$work/job" ||
    { cat "$work/job"; fail "node 0's console had no report of the 4 ranks"; }
echo "ok: stragglers named by rank and phase, hangs by rank and collective, none in a clean run"
echo "ok: cddprun --dump on node 1 of 2 reports all 4 ranks, with node 0's records"
