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
"$ckpt" > usage.out 2>&1; [ $? = 2 ] && grep -q "usage: cddp-ckpt show FILE" usage.out || fail "no usage without arguments"
"$ckpt" show > /dev/null 2>&1; [ $? = 2 ] || fail "show without a file: not exit 2"
"$ckpt" verify --with_optimizer "$C" > w.out 2>&1; [ $? = 2 ] && grep -q "goes with consolidate" w.out || fail "--with_optimizer with verify not refused"
"$ckpt" show no-such.safetensors > n.out 2>&1; [ $? = 1 ] && grep -q "no-such.safetensors" n.out || fail "a missing file not named"
echo "ok: cddp-ckpt shows, verifies (and refuses a NaN, an orphan state, a wrong shape, a missing state, a cut file), consolidates for PyTorch"
