#!/bin/sh
# comm_failure.sh BUILD_DIR MODE WORLD [ARG]: runs `comm_check MODE ARG` on WORLD ranks under
# cddprun and checks that every rank expected to see the failure reported it correctly and in
# time (each writes "ok: ..." to its log; see tests/comm/comm_check.c), on the transport
# CDDP_TRANSPORT names when it is set.
set -u
build=$1 mode=$2 world=$3 arg=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "$mode" in
kill | stop | leave) want=$((world - 1)) ;; # every survivor
mismatch | abort) want=$world ;;    # every rank, the odd one included
deadline) want=1 ;;                 # rank 0, alone in the barrier
*) echo "unknown mode $mode"; exit 2 ;;
esac
ls /dev/shm | grep '^cddp-' | sort > "$work/before"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$build/bin/cddprun" --standalone --nproc_per_node "$world" \
    --grace_period 10 --logdir "$work/logs" "$build/bin/comm_check" "$mode" $arg > "$work/launcher" 2>&1
got=$(cat "$work"/logs/rank.*/stdout | grep -c '^ok: ')
if [ "$got" != "$want" ]; then
    echo "FAIL: $got of $want ranks reported the failure correctly"
    for f in "$work"/logs/rank.*/std*; do echo "--- $f"; cat "$f"; done
    echo "--- launcher"; cat "$work/launcher"
    exit 1
fi
cat "$work"/logs/rank.*/stdout
# A rank that returned from main while its peers still called collectives: the launcher's report
# names it as having finished before the failure.
if [ "$mode $arg" = "leave exit" ] && ! grep -q "finished before it: rank $((world - 1)) " "$work/launcher"; then
    echo "FAIL: the launcher's report does not say that rank $((world - 1)) finished before the failure"
    cat "$work/launcher"
    exit 1
fi
if [ -n "${CDDP_TRANSPORT:-}" ] && grep -h '^ok: ' "$work"/logs/rank.*/stdout | grep -qv "($CDDP_TRANSPORT backend)"; then
    echo "FAIL: CDDP_TRANSPORT=$CDDP_TRANSPORT, but a rank used another backend"
    exit 1
fi
# cddp's shared memory has no name (tests/launcher/shm_leak_test.sh checks that it is freed):
# any name in /dev/shm that was not there before the job is a leak.
ls /dev/shm | grep '^cddp-' | sort | comm -23 - "$work/before" > "$work/left"
[ ! -s "$work/left" ] || { echo "FAIL: cddp names left in /dev/shm: $(cat "$work/left")"; exit 1; }
echo "ok: $mode on $world ranks: $got ranks failed as expected; nothing left in /dev/shm"
