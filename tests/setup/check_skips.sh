#!/bin/sh
# check_skips.sh BUILD_DIR: fails when the last ctest run skipped a test that did not say it cannot
# run on this machine at all. A test may skip only for that (no root, no network namespaces...),
# and must print "cannot run on this machine: <why>"; a skip for anything that `make test` could
# install or set up is a failure.
set -eu
build=${1:?usage: check_skips.sh BUILD_DIR}
log="$build/ctest.log"
last="$build/Testing/Temporary/LastTest.log"
[ -s "$log" ] && [ -s "$last" ] || { echo "FAIL: no ctest run in $build"; exit 1; }
bad=0
for t in $(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (Skipped)$/\1/p' "$log"); do
    # The test's output, between its "Output:" and "<end of output>" in LastTest.log.
    why=$(awk -v t="$t" '$0 ~ "Test: " t "$" {on = 1} on && /cannot run on this machine:/ {print; exit}
                         on && /<end of output>/ {exit}' "$last")
    if [ -n "$why" ]; then
        echo "skipped, cannot run here: $t: $why"
    else
        echo "FAIL: $t was skipped without saying why it cannot run on this machine"
        bad=1
    fi
done
exit $bad
