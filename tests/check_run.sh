#!/bin/sh
# check_run.sh: runs a program and checks what it did, for ctest.
#
#   check_run.sh [--exit N] [--stdout TEXT] [--stderr TEXT] [--stdout-not RE] [--json-min KEY=MIN]
#                [--stdout-count RE N] -- PROGRAM ARGS
#
# --exit: the exit status must be N. --stdout/--stderr: that stream must contain TEXT.
# --stdout-not: no line of stdout may match the extended regular expression RE.
# --json-min: the last JSON line of stdout (a line starting with {) holds a number KEY >= MIN.
# --stdout-count: exactly N lines of stdout match the extended regular expression RE.
set -u
want_exit="" ; want_out="" ; want_err="" ; json_min="" ; not_out="" ; count_re="" ; count_n=""
while [ $# -gt 0 ]; do
    case "$1" in
    --exit) want_exit=$2; shift 2 ;;
    --stdout) want_out=$2; shift 2 ;;
    --stderr) want_err=$2; shift 2 ;;
    --stdout-not) not_out=$2; shift 2 ;;
    --json-min) json_min=$2; shift 2 ;;
    --stdout-count) count_re=$2; count_n=$3; shift 3 ;;
    --) shift; break ;;
    *) echo "check_run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
out=$(mktemp) ; err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
cat "$out"; cat "$err" >&2
fail=0
if [ -n "$want_exit" ] && [ "$rc" -ne "$want_exit" ]; then
    echo "FAIL: exit status $rc, expected $want_exit" >&2; fail=1
fi
if [ -n "$want_out" ] && ! grep -qF -- "$want_out" "$out"; then
    echo "FAIL: stdout lacks '$want_out'" >&2; fail=1
fi
if [ -n "$want_err" ] && ! grep -qF -- "$want_err" "$err"; then
    echo "FAIL: stderr lacks '$want_err'" >&2; fail=1
fi
if [ -n "$not_out" ] && grep -qE -- "$not_out" "$out"; then
    echo "FAIL: stdout has a line matching '$not_out'" >&2; fail=1
fi
if [ -n "$count_re" ]; then
    got=$(grep -cE -- "$count_re" "$out")
    if [ "$got" -ne "$count_n" ]; then
        echo "FAIL: $got lines of stdout match '$count_re', expected $count_n" >&2; fail=1
    fi
fi
if [ -n "$json_min" ]; then
    key=${json_min%%=*} ; min=${json_min#*=}
    val=$(grep "^{" "$out" | tail -n 1 | sed -n "s/.*\"$key\": *\([-0-9.eE+]*\).*/\1/p")
    if [ -z "$val" ]; then
        echo "FAIL: no \"$key\" in the last JSON line of stdout" >&2; fail=1
    elif ! awk -v v="$val" -v m="$min" 'BEGIN { exit !(v + 0 >= m + 0) }'; then
        echo "FAIL: $key = $val, below $min" >&2; fail=1
    else
        echo "ok: $key = $val >= $min"
    fi
fi
exit $fail
