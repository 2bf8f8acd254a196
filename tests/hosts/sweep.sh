#!/bin/sh
# sweep.sh: stops the emulated hosts (tests/hosts/hosts.sh) that a hosts test left behind when it
# was killed (ctest's timeout ends a test with SIGKILL, which no trap sees): those named after a
# process that is gone, with every process in them. Each hosts test runs it before it starts, and
# the suite runs it after the last one (the cleanup fixture emulated_hosts), so that nothing of a
# killed test outlives the suite. Hosts of a test that still runs are left alone.
here=$(cd "$(dirname "$0")" && pwd)
swept=0
for d in /run/cddp-hosts-h*; do
    [ -d "$d" ] || continue
    old=${d#/run/cddp-hosts-}
    kill -0 "${old#h}" 2>/dev/null && continue
    "$here/hosts.sh" stop "$old"
    swept=$((swept + 1))
    # what stop removes: the hosts' namespaces and their bridge
    ! ip netns list 2>/dev/null | grep -q "^${old}[0-9]" || { echo "FAIL: $old's namespaces remain"; exit 1; }
    ! ip link show "${old}br" > /dev/null 2>&1 || { echo "FAIL: $old's bridge remains"; exit 1; }
done
echo "ok: $swept set(s) of emulated hosts left by killed tests removed"
