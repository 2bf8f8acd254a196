#!/bin/sh
# sweep_test.sh: what a hosts test killed by ctest's timeout leaves (emulated hosts named after
# its pid, now gone, and a job still running in them) is removed by sweep.sh, the suite's cleanup
# fixture: the job ends, the namespaces and the bridge go. Hosts of a live test are kept.
set -u
here=$(cd "$(dirname "$0")" && pwd)
H="$here/hosts.sh"
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "cannot run on this machine: network namespaces need root"; exit 77; }
# a pid that is gone: a child that ended (another, should its pid be taken again at once)
for _ in 1 2 3 4 5; do
    sh -c 'exit 0' &
    dead=$!
    wait $dead
    kill -0 "$dead" 2>/dev/null || break
done
kill -0 "$dead" 2>/dev/null && fail "no pid that stays gone"
name=$(echo "h$dead" | cut -c1-8)
live=$(echo "h$$" | cut -c1-8)
trap '"$H" stop "$name"; "$H" stop "$live"' EXIT
"$H" start "$name" 2 none > /dev/null || fail "cannot start the hosts"
"$H" start "$live" 1 none > /dev/null || fail "cannot start the live test's host"
"$H" exec "$name" 1 sleep 600 &
job=$!
sleep 0.2
kill -0 $job 2>/dev/null || fail "the left job did not start"
"$here/sweep.sh" || fail "sweep.sh failed"
sleep 0.1
kill -0 $job 2>/dev/null && fail "the killed test's job still runs after the sweep"
ip netns list | grep -q "^${name}[0-9]" && fail "the killed test's namespaces remain"
ip link show "${name}br" > /dev/null 2>&1 && fail "the killed test's bridge remains"
ip netns list | grep -q "^${live}0" || fail "the sweep removed the hosts of a test that still runs"
echo "ok: a killed test's hosts and job removed by the sweep; a live test's kept"
