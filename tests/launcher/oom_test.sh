#!/bin/sh
# oom_test.sh BUILD_DIR: a worker that the kernel's OOM killer ends is reported as such. The test
# makes a memory cgroup of 64 MiB (v1 or v2, whichever this machine has) under its own, starts
# cddprun in it, and rank 1 eats memory (`tail /dev/zero`): the report's root cause must say the
# OOM killer did it (the cgroup counts a new oom_kill). Then again with /sys/fs/cgroup hidden from
# cddprun, where the kernel log (/dev/kmsg) must say it. The cgroup is removed on every exit.
set -u
build=$1
work=$(mktemp -d)
cg=""
cleanup() {
    if [ -n "$cg" ]; then
        for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
        i=0
        while ! rmdir "$cg" 2>/dev/null && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
skip() { echo "cannot run on this machine: $*"; exit 77; }
fail() { echo "FAIL: $*"; cat "$work/out" 2>/dev/null; exit 1; }
[ "$(id -u)" = 0 ] || skip "making a memory cgroup needs root"
v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
v2=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup)
if [ -n "$v1" ] && [ -d "/sys/fs/cgroup/memory$v1" ]; then
    cg="/sys/fs/cgroup/memory${v1%/}/cddp-oom-$$"
    mkdir "$cg" || { cg=""; skip "cannot make a memory cgroup under /sys/fs/cgroup/memory$v1"; }
    echo $((64 << 20)) > "$cg/memory.limit_in_bytes"
    [ -e "$cg/memory.memsw.limit_in_bytes" ] && echo $((64 << 20)) > "$cg/memory.memsw.limit_in_bytes"
elif [ -n "$v2" ] && [ -e "/sys/fs/cgroup${v2%/}/cgroup.subtree_control" ]; then
    cg="/sys/fs/cgroup${v2%/}/cddp-oom-$$"
    mkdir "$cg" || { cg=""; skip "cannot make a cgroup under /sys/fs/cgroup$v2"; }
    [ -e "$cg/memory.max" ] || skip "the memory controller is not enabled for /sys/fs/cgroup$v2"
    echo $((64 << 20)) > "$cg/memory.max"
    [ -e "$cg/memory.swap.max" ] && echo 0 > "$cg/memory.swap.max"
else
    skip "no memory cgroup (neither v1 nor v2) in /proc/self/cgroup"
fi
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE
job="$build/bin/cddprun --standalone --nproc_per_node 2 --grace_period 2 \
    sh -c 'if [ \$RANK = 1 ]; then exec tail /dev/zero; else exec sleep 60; fi'"

# run HOW: cddprun in the cgroup, started as HOW says ("" or a command prefix); rank 1 must be
# the root cause, killed by the OOM killer, and the report must say how it knows.
run() {
    sh -c "echo \$\$ > $cg/cgroup.procs && exec $1 $job" > "$work/out" 2>&1
    rc=$?
    [ "$rc" = 1 ] || fail "cddprun exited $rc (expected 1)"
    grep -q "root cause: rank 1 (local rank 1, host .*) was killed by SIGKILL (signal 9) at .* (the kernel's OOM killer: $2" \
        "$work/out" || fail "the report does not blame the OOM killer for rank 1 ($2)"
}

run "" "the memory cgroup counts a new oom_kill"
echo "ok: rank 1 killed by the OOM killer in a 64 MiB cgroup ($(basename "$(dirname "$cg")")/...): the report says so"

# Where cddprun cannot read its cgroup (a container without /sys/fs/cgroup: here a mount
# namespace with an empty tmpfs over it), the kernel log is the last resort.
run "unshare -m --propagation private sh -c 'mount -t tmpfs none /sys/fs/cgroup && exec \"\$0\" \"\$@\"'" \
    "the kernel log says it killed this process"
echo "ok: the same with /sys/fs/cgroup hidden: the kernel log names rank 1's process"
