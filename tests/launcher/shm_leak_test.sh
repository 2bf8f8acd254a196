#!/bin/sh
# shm_leak_test.sh BUILD_DIR SHIM COMM_CHECK: no shared memory outlives a job that dies during
# start-up while a slow peer has not yet mapped what another rank made.
#
# cddp's shared memory is unnamed files in /dev/shm that a rank holds open until every peer has
# mapped them (through /proc/<pid>/fd). tests/launcher/slow_shm.c (LD_PRELOAD) makes rank 1's
# open() sleep. Two cases:
#   segment  rank 0 made the group's segment; rank 1 is slow to map it; Ctrl-C to cddprun.
#   blocks   rank 0 made its block for cddp_comm_alloc (DDP's gradients); rank 1 is slow to make
#            its own; rank 0 is SIGKILLed.
# In each, while the job runs, rank 0 holds the memory and /dev/shm has no name of this job;
# after cddprun exits, no process holds or maps that memory (so the kernel has freed it).
set -u
build=$1 shim=$2 check=$3
R="$build/bin/cddprun"
work=$(mktemp -d)
cp=""
cleanup() {
    [ -n "$cp" ] && kill -9 "$cp" 2>/dev/null
    for f in "$work"/pid.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; cat "$work/out" 2>/dev/null; exit 1; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE CDDP_TRANSPORT
export CDDP_LOG_LEVEL=warn ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0"
ls /dev/shm > "$work/names.before"

# The inodes of the unnamed /dev/shm files process $1 maps, one per line.
shm_of() { sed -n 's|.* \(/dev/shm/#[0-9]*\) (deleted)$|\1|p' "/proc/$1/maps" 2>/dev/null | sort -u; }

# Waits up to 60 s for rank 0 to map $1 unnamed /dev/shm files; prints their inodes.
wait_for_memory() {
    i=0
    while :; do
        if [ -f "$work/pid.0" ]; then
            got=$(shm_of "$(cat "$work/pid.0")")
            [ "$(printf '%s' "$got" | grep -c .)" -ge "$1" ] && { echo "$got"; return 0; }
        fi
        kill -0 "$cp" 2>/dev/null || fail "the job ended before rank 0 made its shared memory"
        i=$((i + 1))
        [ $i -gt 600 ] && fail "rank 0 mapped no $1 unnamed /dev/shm files in 60 s"
        sleep 0.1
    done
}

start() { # start MATCH: the job in the background, rank 1's open() slowed on paths with MATCH
    rm -f "$work"/pid.*
    LD_PRELOAD="$shim" SLOW_SHM_RANK=1 SLOW_SHM_MATCH="$1" SLOW_SHM_S=60 \
        "$R" --standalone --nproc_per_node 2 --grace_period 2 \
        sh -c "echo \$\$ > $work/pid.\$RANK; exec $check matrix" > "$work/out" 2>&1 &
    cp=$!
}

# Fails if anything is in /dev/shm that was not before the test, or if a process still holds or
# maps one of the files named in $1 (after: "$2").
check_gone() {
    ls /dev/shm | sort > "$work/names.after"
    new=$(sort "$work/names.before" | comm -13 - "$work/names.after" | grep '^cddp')
    [ -z "$new" ] || fail "names appeared in /dev/shm $2: $new"
    for f in $1; do
        holders=$(grep -l " $f (deleted)$" /proc/[0-9]*/maps 2>/dev/null)
        holders="$holders$(ls -l /proc/[0-9]*/fd 2>/dev/null | grep " $f (deleted)$")"
        [ -z "$holders" ] || fail "$f is still held $2: $holders"
    done
}

# The group's segment: rank 0 made it, rank 1 sleeps before mapping it; Ctrl-C.
start "/proc/"
held=$(wait_for_memory 1)
check_gone "" "while the job starts"
kill -INT "$cp"
wait "$cp"
rc=$?
cp=""
[ "$rc" = 130 ] || fail "cddprun exited $rc after SIGINT (expected 130)"
check_gone "$held" "after Ctrl-C during start-up"
echo "ok: Ctrl-C while rank 1 had not mapped rank 0's segment ($held): nothing left"

# cddp_comm_alloc's blocks: rank 0 made its block (its second file, after the segment), rank 1
# sleeps before making its own; rank 0 is SIGKILLed.
start "/dev/shm"
held=$(wait_for_memory 2)
check_gone "" "while the job starts"
kill -9 "$(cat "$work/pid.0")"
wait "$cp"
rc=$?
cp=""
[ "$rc" = 1 ] || fail "cddprun exited $rc after a worker was killed (expected 1)"
check_gone "$held" "after rank 0 was killed"
echo "ok: rank 0 killed while rank 1 had not made its block ($(echo $held)): nothing left"
