#!/bin/sh
# shm_leak_test.sh BUILD_DIR SHIM COMM_CHECK: nothing stays in /dev/shm when a job dies during
# start-up while a slow peer has not yet opened what another rank created.
#
# tests/launcher/slow_shm.c (LD_PRELOAD) makes rank 1's shm_open sleep. Two cases:
#   segment  rank 0 created the group's segment; rank 1 is slow to open it; Ctrl-C to cddprun.
#   blocks   rank 0 made its block for cddp_comm_alloc (DDP's gradients); rank 1 is slow to make
#            its own; rank 0 is SIGKILLed.
# After cddprun exits, no /dev/shm name of either worker may remain (names carry their maker's
# pid: /cddp-<pid>-...).
set -u
build=$1 shim=$2 check=$3
R="$build/bin/cddprun"
work=$(mktemp -d)
cp=""
cleanup() {
    [ -n "$cp" ] && kill -9 "$cp" 2>/dev/null
    for f in "$work"/pid.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
    for f in "$work"/pid.*; do [ -f "$f" ] && rm -f /dev/shm/cddp-"$(cat "$f")"-*; done
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$work/out" 2>/dev/null; exit 1; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE CDDP_TRANSPORT
export CDDP_LOG_LEVEL=warn ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0"
names() { ls /dev/shm 2>/dev/null | grep "^cddp-$1-"; }

# Waits up to 60 s for rank 0 to have made a /dev/shm name matching $1.
wait_for_name() {
    i=0
    while :; do
        [ -f "$work/pid.0" ] && names "$(cat "$work/pid.0")" | grep -q -- "$1" && return 0
        kill -0 "$cp" 2>/dev/null || fail "the job ended before rank 0 made its shared memory"
        i=$((i + 1))
        [ $i -gt 600 ] && fail "rank 0 made no /dev/shm name matching '$1' in 60 s"
        sleep 0.1
    done
}

start() { # start MATCH: the job in the background, rank 1 slowed on names containing MATCH
    rm -f "$work"/pid.*
    LD_PRELOAD="$shim" SLOW_SHM_RANK=1 SLOW_SHM_MATCH="$1" SLOW_SHM_S=60 \
        "$R" --standalone --nproc_per_node 2 --grace_period 2 \
        sh -c "echo \$\$ > $work/pid.\$RANK; exec $check matrix" > "$work/out" 2>&1 &
    cp=$!
}

left() { for r in 0 1; do names "$(cat "$work/pid.$r")"; done; }

# The group's segment: rank 0 made it, rank 1 sleeps before opening it; Ctrl-C.
start ""
wait_for_name "^cddp-[0-9]*-[0-9a-f]*$"
kill -INT "$cp"
wait "$cp"
rc=$?
cp=""
[ "$rc" = 130 ] || fail "cddprun exited $rc after SIGINT (expected 130)"
[ -z "$(left)" ] || fail "left in /dev/shm after Ctrl-C during start-up: $(left)"
grep -q "removed /dev/shm/cddp-$(cat "$work/pid.0")-" "$work/out" || fail "no word of the removal"
echo "ok: Ctrl-C while rank 1 had not opened rank 0's segment: nothing left in /dev/shm"

# cddp_comm_alloc's blocks: rank 0 made its block, rank 1 sleeps before making its own; rank 0
# is SIGKILLed.
start "-m"
wait_for_name "-m[0-9]*$"
kill -9 "$(cat "$work/pid.0")"
wait "$cp"
rc=$?
cp=""
[ "$rc" = 1 ] || fail "cddprun exited $rc after a worker was killed (expected 1)"
[ -z "$(left)" ] || fail "left in /dev/shm after rank 0 was killed: $(left)"
echo "ok: rank 0 killed while rank 1 had not made its block: nothing left in /dev/shm"
