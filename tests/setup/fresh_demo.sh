#!/bin/sh
# fresh_demo.sh SOURCE_DIR: `make demo` works as the first command on a machine that has none of
# what only the tests need. CI runs it (as root, on Debian) after `make test`.
#
# It removes the packages that `make test` installs beyond `make demo`'s (scripts/deps.sh --list),
# runs `make demo` in a fresh copy of the tree (the files git tracks, or would: what a clone of
# this change holds), checks what the demo promises, and reinstalls every package it removed, on
# every exit path. Not root, or no apt: it says so and stops (exit 77), touching nothing.
set -eu
src=$(cd "${1:?usage: fresh_demo.sh SOURCE_DIR}" && pwd)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
    echo "fresh_demo: cannot run on this machine: it removes and reinstalls Debian packages (needs root and apt)"
    exit 77
fi
work=$(mktemp -d)
removed=""
restore() {
    status=$?
    if [ -n "$removed" ]; then
        echo "fresh_demo: reinstalling:$removed"
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $removed \
            > "$work/reinstall.log" 2>&1 || { cat "$work/reinstall.log"; status=1; }
    fi
    rm -rf "$work"
    exit $status
}
trap restore EXIT
trap 'exit 130' INT TERM HUP

demo=$("$src/scripts/deps.sh" --list demo)
test_only=""
for p in $("$src/scripts/deps.sh" --list test); do
    case " $demo " in *" $p "*) ;; *) test_only="$test_only $p" ;; esac
done
installed=""
for p in $test_only; do
    case "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" in
    *"install ok installed"*) installed="$installed $p" ;;
    esac
done
# What apt removes with them (packages that depend on them), to put back exactly.
# shellcheck disable=SC2086
[ -z "$installed" ] || removed=$(apt-get -s remove $installed 2>/dev/null | sed -n 's/^Remv \([^ ]*\) .*/ \1/p' | tr -d '\n')
echo "fresh_demo: removing the test-only packages:$removed"
# shellcheck disable=SC2086
[ -z "$removed" ] || DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq $removed > "$work/remove.log" 2>&1 ||
    { cat "$work/remove.log"; exit 1; }
for p in $test_only; do
    case "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" in
    *"install ok installed"*) echo "FAIL: $p is still installed"; exit 1 ;;
    esac
done

# A fresh copy of the tree: tracked files and new ones not ignored, nothing built.
mkdir "$work/cddp"
(cd "$src" && git ls-files --cached --others --exclude-standard |
    while IFS= read -r f; do [ -e "$f" ] && printf '%s\n' "$f"; done | tar -T - -cf -) |
    tar -xf - -C "$work/cddp"
echo "fresh_demo: make demo in $work/cddp"
(cd "$work/cddp" && make demo) > "$work/demo.log" 2>&1 || { cat "$work/demo.log"; echo "FAIL: make demo"; exit 1; }
tail -n 12 "$work/demo.log"
grep -q "^\[rank 0\]: epoch: 1, test accuracy: 0\.[89]" "$work/demo.log" ||
    { echo "FAIL: the demo's second epoch did not reach 0.8 test accuracy"; exit 1; }
for f in checkpoint.safetensors metrics.csv loss.csv eval.csv curves.svg logs/rank.0/stdout; do
    [ -s "$work/cddp/build/demo/$f" ] || { echo "FAIL: the demo left no build/demo/$f"; exit 1; }
done
[ -f "$work/cddp/build/demo/logs/rank.1/stderr" ] || { echo "FAIL: no log of rank 1"; exit 1; }
grep -q "cddp: the tests need cmocka\|cmocka" "$work/demo.log" && { echo "FAIL: make demo looked for cmocka"; exit 1; }
echo "ok: make demo trained data-parallel in a fresh tree without:$removed"
