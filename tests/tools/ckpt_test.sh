#!/bin/sh
# ckpt_test.sh CDDP_CKPT TEST_REFERENCE PYTHON SOURCE_DIR: cddp-ckpt on a real GPT checkpoint
# (written by test_reference --write-gpt) and on broken copies of it.
set -u
ckpt=$1 ref=$2 py=$3 src=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
mkdir g && "$ref" --write-gpt g > /dev/null || fail "test_reference --write-gpt failed"
C=g/gpt_checkpoint.safetensors
"$ckpt" show "$C" > show.out || fail "show failed"
grep -q "optimizer  *adamw" show.out && grep -q "model tensors  *[0-9]* (" show.out \
    && grep -q "optimizer state  *[1-9][0-9]* tensors" show.out || { cat show.out; fail "show lacks the optimizer or the tensors"; }
"$ckpt" verify "$C" > verify.out || { cat verify.out; fail "verify refused a good checkpoint"; }
grep -q "^ok: .*2 optimizer states over" verify.out || { cat verify.out; fail "verify: no ok line"; }
"$ckpt" consolidate "$C" g/model.safetensors > cons.out || { cat cons.out; fail "consolidate failed"; }
"$py" "$src/tests/reference/check_gpt_load.py" g model.safetensors || fail "PyTorch did not load the consolidated file"
"$ckpt" consolidate --with_optimizer "$C" g/all.safetensors > /dev/null || fail "consolidate --with_optimizer failed"
"$ckpt" verify g/all.safetensors > /dev/null || fail "the consolidated file with the optimizer does not verify"
# The same checkpoint as a set of 3 shards (test_reference wrote both): shown, verified, and
# consolidated into the same tensors as the file, which PyTorch loads.
"$ckpt" show g/gpt_sets > sshow.out || { cat sshow.out; fail "show of a set failed"; }
grep -q "set  *g/gpt_sets/step-00000003: 3 shards, step 3, commit 1" sshow.out && grep -q "optimizer state  *56 tensors" sshow.out \
    || { cat sshow.out; fail "show of a set lacks its shards or its state"; }
"$ckpt" verify g/gpt_sets > sverify.out || { cat sverify.out; fail "verify refused a good set"; }
grep -q "every shard's checksum right" sverify.out || { cat sverify.out; fail "verify of a set: no ok line"; }
"$ckpt" consolidate g/gpt_sets g/set_model.safetensors > /dev/null || fail "consolidate of a set failed"
"$py" "$src/tests/reference/check_gpt_load.py" g set_model.safetensors || fail "PyTorch did not load the set's consolidated file"
"$ckpt" consolidate --with_optimizer g/gpt_sets g/set_all.safetensors > /dev/null || fail "consolidate --with_optimizer of a set failed"
PYTHONPATH="$src/tests/reference" "$py" - g/all.safetensors g/set_all.safetensors <<'PYEOF' || fail "the set's consolidation differs from the file's"
import sys
import numpy as np
import safetensors_np as st
a, _ = st.load(sys.argv[1])
b, _ = st.load(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
for k in a:
    assert np.array_equal(np.array(a[k]), np.array(b[k])), k
PYEOF
# A set with a changed byte fails verify by its checksum; a folder without a complete set says so.
cp -r g/gpt_sets bad_sets
S=bad_sets/step-00000003/shard-00001-of-00003.safetensors
printf '\125' | dd of="$S" bs=1 seek=$(( $(stat -c %s "$S") - 3 )) conv=notrunc 2> /dev/null
if "$ckpt" verify bad_sets > bv.out 2>&1; then fail "verify accepted a changed shard"; fi
grep -q "shard-00001-of-00003.safetensors: .* CRC-32" bv.out || { cat bv.out; fail "verify did not name the changed shard"; }
# A set whose shard was cut: the folder holds no complete set, and says which is damaged how.
cp -r g/gpt_sets cut_sets
truncate -s 100 cut_sets/step-00000003/shard-00002-of-00003.safetensors
if "$ckpt" show cut_sets > cs.out 2>&1; then fail "show accepted a cut shard"; fi
grep -q "1 damaged (the newest: .*shard-00002-of-00003.safetensors is 100 bytes" cs.out ||
    { cat cs.out; fail "show did not name the cut shard"; }
# A shard whose header moved a range (the same size): show fails when it reads it, naming it, and
# frees what it had read (LeakSanitizer, in the sanitizer build).
cp -r g/gpt_sets moved_sets
"$py" - moved_sets/step-00000003/shard-00001-of-00003.safetensors <<'PYEOF' || fail "cannot move a range"
import re, sys
raw = bytearray(open(sys.argv[1], "rb").read())
m = re.search(rb'"flat\.(\d+)"', raw)
digit = m.end(1) - 1
raw[digit] = ord("0") + (raw[digit] - ord("0") + 1) % 10
open(sys.argv[1], "wb").write(raw)
PYEOF
"$ckpt" show moved_sets > ms.out 2>&1
rc=$?
[ $rc = 1 ] || { cat ms.out; fail "show of a shard whose ranges moved: exit $rc, not 1 (LeakSanitizer exits 23)"; }
grep -q "^cddp-ckpt: moved_sets/step-00000003/shard-00001-of-00003.safetensors: " ms.out ||
    { cat ms.out; fail "show did not name the shard whose ranges moved"; }
rm bad_sets/step-00000003/manifest.safetensors
if "$ckpt" show bad_sets > bs.out 2>&1; then fail "show accepted a folder without a complete set"; fi
grep -q "holds no complete checkpoint set" bs.out || { cat bs.out; fail "no 'no complete set' message"; }
# Broken copies, each refused with its reason.
PYTHONPATH="$src/tests/reference" "$py" - "$C" <<'PYEOF' || fail "cannot write the broken copies"
import sys
import numpy as np
import safetensors_np as st
t, meta = st.load(sys.argv[1])
t = {k: np.array(v) for k, v in t.items()}
name = next(k for k in t if not k.startswith("optim.") and t[k].ndim == 2)
nan = dict(t); nan[name] = t[name].copy(); nan[name][0, 0] = np.nan
st.save("nan.safetensors", nan, meta)
orphan = dict(t); orphan["optim.exp_avg.no.such.weight"] = np.zeros(3, np.float32)
st.save("orphan.safetensors", orphan, meta)
shape = dict(t); shape["optim.exp_avg." + name] = np.zeros(5, np.float32)
st.save("shape.safetensors", shape, meta)
missing = {k: v for k, v in t.items() if k != "optim.exp_avg_sq." + name}
st.save("missing.safetensors", missing, meta)
print(name)
PYEOF
head -c 200 "$C" > cut.safetensors
expect() { # FILE TEXT: verify exits 1 and says TEXT
    if "$ckpt" verify "$1" > v.out 2>&1; then fail "verify accepted $1"; fi
    grep -q -- "$2" v.out || { cat v.out; fail "verify $1 did not say: $2"; }
}
expect nan.safetensors "NaN or infinite"
expect orphan.safetensors "'optim.exp_avg.no.such.weight' is the state of no model tensor"
expect shape.safetensors "has another shape than"
expect missing.safetensors "covers .* tensors but its exp_avg_sq"
expect cut.safetensors "cut.safetensors"
"$ckpt" > usage.out 2>&1; [ $? = 2 ] && grep -q "usage: cddp-ckpt show PATH" usage.out || fail "no usage without arguments"
"$ckpt" show > /dev/null 2>&1; [ $? = 2 ] || fail "show without a file: not exit 2"
"$ckpt" verify --with_optimizer "$C" > w.out 2>&1; [ $? = 2 ] && grep -q "goes with consolidate" w.out || fail "--with_optimizer with verify not refused"
# consolidate never writes over what it reads, into it, or over a training checkpoint; nothing changes.
cp "$C" g/keep.safetensors
for out in "$C" g/keep.safetensors; do
    before=$(cksum < g/keep.safetensors)
    if "$ckpt" consolidate "$C" "$out" > o.out 2>&1; then fail "consolidate $C $out was accepted"; fi
    grep -q "choose another OUT" o.out || { cat o.out; fail "consolidate into $out: no reason given"; }
    [ "$(cksum < g/keep.safetensors)" = "$before" ] && cmp -s "$C" g/keep.safetensors || fail "consolidate into $out changed a checkpoint"
done
if "$ckpt" consolidate g/gpt_sets g/gpt_sets/x.safetensors > o.out 2>&1; then fail "consolidate into the set's folder was accepted"; fi
grep -q "inside the checkpoint it reads" o.out && [ ! -e g/gpt_sets/x.safetensors ] || { cat o.out; fail "consolidate into the set: no reason"; }
"$ckpt" show no-such.safetensors > n.out 2>&1; [ $? = 1 ] && grep -q "no-such.safetensors" n.out || fail "a missing file not named"
echo "ok: cddp-ckpt shows, verifies (and refuses a NaN, an orphan state, a wrong shape, a missing state, a cut file, a changed shard), consolidates files and sets for PyTorch, never over a checkpoint"
