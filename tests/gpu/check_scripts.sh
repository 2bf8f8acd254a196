#!/bin/bash
# check_scripts.sh: the GPU check's scripts (scripts/gpu: check.sh, its steps and lib.sh, and the
# scripts beside them) are shellcheck clean, every step check.sh can be asked for is a file of
# steps/, its default steps run in their order, and check_json.py reads the programs' JSON and
# writes results.jsonl's lines as the check needs (the GPU check itself runs only on a GPU, or
# rehearsed on the emulated device).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
gpu=$root/scripts/gpu
fail() {
    echo "FAIL: $*"
    exit 1
}
cd "$root" || fail "no $root"
shellcheck -x scripts/gpu/*.sh scripts/gpu/steps/*.sh || fail "shellcheck"
for s in 1 2 3 4 5 6 7 8 9 10 11; do
    ls "$gpu/steps/$(printf %02d $s)"*.sh >/dev/null 2>&1 || fail "no file for step $s"
done
# the default steps run in their numbers' order
default=$(sed -n 's/^for step in ${CDDP_CHECK_STEPS:-\([0-9 ]*\)}; do$/\1/p' "$gpu/check.sh")
[ -n "$default" ] || fail "check.sh: no default CDDP_CHECK_STEPS found"
[ "$(echo "$default" | tr ' ' '\n' | sort -n | tr '\n' ' ')" = "$default " ] ||
    fail "check.sh's default steps are not in order: $default"
# each step file names itself on its second line (check.sh prints it as the step's heading)
for f in "$gpu"/steps/*.sh; do
    sed -n 2p "$f" | grep -q "^# $(basename "$f"): ." || fail "$f: no '# $(basename "$f"): WHAT' line"
done
j=$gpu/check_json.py
out=$(printf 'iter 1: loss 2.0\n{"val_loss": 1.5, "iter_ms": {"forward": 3}}\nnoise {\n{"val_loss": 1.25}\n' |
    python3 "$j" get val_loss)
[ "$out" = 1.25 ] || fail "check_json.py get val_loss: '$out', want 1.25 (the last line holding it)"
out=$(printf '{"val_loss": 1.5, "iter_ms": {"forward": 3.5}}\n{"x": 1}\n' | python3 "$j" get iter_ms.forward)
[ "$out" = 3.5 ] || fail "check_json.py get iter_ms.forward: '$out', want 3.5"
out=$(printf '{"summary": "12 ok, 0 FAIL"}\n' | python3 "$j" get summary)
[ "$out" = "12 ok, 0 FAIL" ] || fail "check_json.py get summary: '$out'"
out=$(printf 'no JSON here\n' | python3 "$j" get val_loss)
[ -z "$out" ] || fail "check_json.py get of a missing key: '$out', want nothing"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CHECK_COMMIT=abc CHECK_CARD='NVIDIA "H100"' python3 "$j" result "$tmp/r.jsonl" gpt_train cddp 123.5 \
    tokens/s 'batch 16, "quoted"' 'spread=1.0..2.0' pass=true mfu=null || fail "check_json.py result"
python3 "$j" result "$tmp/r.jsonl" gpt_train torch-eager "" tokens/s "no value" || fail "check_json.py result"
python3 "$j" result "$tmp/r.jsonl" gpt_train cddp nan tokens/s "a NaN" || fail "check_json.py result"
python3 - "$tmp/r.jsonl" <<'PYEOF' || fail "results.jsonl's lines"
import json, sys
a, b, c = [json.loads(line) for line in open(sys.argv[1])]
assert list(a)[:8] == ["date", "commit", "card", "what", "impl", "value", "unit", "config"], list(a)
assert a["commit"] == "abc" and a["card"] == 'NVIDIA "H100"', a
assert a["value"] == 123.5 and a["config"] == 'batch 16, "quoted"', a
assert a["spread"] == "1.0..2.0" and a["pass"] is True and a["mfu"] is None, a
assert b["value"] is None and b["impl"] == "torch-eager", b
assert c["value"] is None, c  # JSON has no NaN
PYEOF
echo "ok: scripts/gpu shellcheck clean, every step a file, check_json.py reads and writes the check's JSON"
