#!/bin/sh
# mpi_flight.sh BUILD_DIR MPIRUN...: the flight recorder without cddprun, under Open MPI's mpirun.
# 3 ranks of comm_check on the MPI backend; rank 1 calls an allreduce of int32 where the others
# call one of float32. Each rank writes its own record when its group fails, into
# $TMPDIR/cddp-flight-<mpirun's job id> (PMIx's namespace): exactly one such folder, with all 3
# records, and cddp-trace names rank 1 and the collective.
set -u
build=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; for f in "$work"/out "$work"/report; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
unset CDDP_FLIGHT_DIR CDDP_RUN_ID SLURM_JOB_ID
TMPDIR=$work "$@" -x TMPDIR -np 3 "$build/bin/comm_check" mismatch dtype > "$work/out" 2>&1
n=$(ls -d "$work"/cddp-flight-* 2>/dev/null | wc -l)
[ "$n" = 1 ] || fail "$n flight folders in \$TMPDIR (expected 1)"
dir=$(ls -d "$work"/cddp-flight-*)
case "$dir" in */cddp-flight-uid*) fail "the folder $dir is the user's, not mpirun's job's" ;; esac
"$build/bin/cddp-trace" "$dir" > "$work/report" 2>&1 || fail "cddp-trace exited $?"
grep -qF "flight records in $dir: 3 of 3 ranks" "$work/report" || fail "not 3 records"
grep -qF "MISMATCH at collective #" "$work/report" || fail "no mismatch in the report"
grep -qF ": rank 1 called allreduce(sum, int32, count 1000) where ranks 0, 2 called allreduce(sum, float32, count 1000)" \
    "$work/report" || fail "the report does not name rank 1's call"
echo "ok: under mpirun, each rank wrote its record into $(basename "$dir"); cddp-trace names rank 1's allreduce of int32"
