#!/bin/bash
# profile.sh CARRY [gpt_train OPTIONS]: where a GPT training step's time goes on the GPU, kernel by
# kernel, measured by Nsight Compute (ncu) on the GPU machine.
#
#   scripts/gpu/profile.sh build-gpu/carry --n_layer 6 --n_head 6 --n_embd 384 --block_size 256
#
# Runs gpt_train on the GPU for 3 iterations (one evaluation batch before and after, no sample),
# every kernel timed by ncu (gpu__time_duration, clocks as the card runs them), then prints each
# kernel's launches, total time and share of all kernels' time, largest first, into
# $OUT/profile.txt (or build-gpu/out; the run's output in /tmp/cddp-profile.log). The options
# given go to gpt_train after the defaults.
set -u
carry=$(cd "${1:?usage: profile.sh CARRY [gpt_train OPTIONS]}" && pwd)
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/build-gpu/out}
py=${CDDP_CHECK_PYTHON:-python3}
mkdir -p "$out"
. "$root/scripts/gpu/env.sh"
command -v ncu >/dev/null || {
    echo "profile.sh: no ncu (Nsight Compute) on PATH" >&2
    exit 2
}
rep=/tmp/cddp-profile
rm -f "$rep.ncu-rep"
cddp ncu --metrics gpu__time_duration.sum --clock-control none -o "$rep" -f \
    "$carry/bin/gpt_train" --device cuda --max_iters 3 --eval_interval 1000 --eval_iters 1 \
    --final_eval 1 --sample 0 --out none --data "$data/fortunes" "$@" >/tmp/cddp-profile.log 2>&1 || {
    tail -n 20 /tmp/cddp-profile.log
    exit 1
}
ncu -i "$rep.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum >/tmp/cddp-profile.csv
"$py" - /tmp/cddp-profile.csv <<'PYEOF' | tee "$out/profile.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
name, t = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}
unit, per = 1.0, {}
for r in rows[1:]:
    if len(r) <= t:
        continue
    try:
        v = float(r[t].replace(",", ""))
    except ValueError:
        unit = scale.get(r[t], unit)  # the units row
        continue
    k = r[name].replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    k = k.removeprefix("void ").split("(")[0]
    n, s = per.get(k, (0, 0.0))
    per[k] = (n + 1, s + v * unit)
total = sum(s for _, s in per.values())
print(f"{'kernel':48} {'launches':>8} {'total us':>10} {'share':>6}")
for k, (n, s) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print(f"{k[:48]:48} {n:8d} {s:10.1f} {100 * s / total:5.1f}%")
print(f"{'all kernels':48} {sum(n for n, _ in per.values()):8d} {total:10.1f}")
PYEOF
