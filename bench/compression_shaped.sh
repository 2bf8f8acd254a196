#!/bin/sh
# bench/compression_shaped.sh BUILD [ROUNDS] [RATE] [BATCH]: data-parallel training across 2
# emulated hosts on shaped links (tests/hosts/hosts.sh: network namespaces on a bridge, every
# link shaped with tbf to RATE both ways), one rank each, with each gradient compression hook:
# none (float32), bf16, and PowerSGD of rank 1 and 4 (from step 10); and host 0 alone. bench_mlp
# (the 784-512-512-10 MLP, 2.68 MB of gradients a step), 1 epoch, BATCH samples per rank (default
# 32). Rounds interleave the hooks, the order turning each round. Prints each setting's median
# samples/s (all ranks together), its spread, and the bytes a step sent. As root.
#
#   bench/compression_shaped.sh build 3 1gbit
set -eu
build=$(cd "$1" && pwd)
rounds=${2:-3}
rate=${3:-1gbit}
batch=${4:-32}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/shaped_setup.sh"
shaped_setup bench/compression_shaped.sh cs
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT CDDP_STORE_PORT
export CDDP_LOG_LEVEL=warn OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

settings="none bf16 powersgd1 powersgd4"
args_of() { # SETTING: bench_mlp's options
    case "$1" in
    none) echo "--hook none" ;;
    bf16) echo "--hook bf16" ;;
    powersgd*) echo "--hook powersgd --powersgd-rank ${1#powersgd} --powersgd-start 10" ;;
    esac
}
run_two() { # SETTING OUT
    for i in 0 1; do
        # shellcheck disable=SC2046
        "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes 2 --node_rank "$i" \
            --master_addr "$("$H" addr "$name" 0)" --master_port 29400 \
            --token_file "$work/token" --local_addr "$("$H" addr "$name" "$i")" \
            "$build/bin/bench_mlp" --epochs 1 --batch-size "$batch" $(args_of "$1") \
            > "$work/d$i" 2> "$work/e$i" &
    done
    wait
    grep '^{' "$work/d0" | sed "s/^{/{\"setting\": \"$1\", \"hosts\": 2, /" >> "$2" ||
        { cat "$work/e0" "$work/e1" >&2; exit 1; }
}

out="$work/results.jsonl"
: > "$out"
"$H" start "$name" 2 "$rate" > /dev/null
for r in $(seq "$rounds"); do
    "$H" exec "$name" 0 "$build/bin/cddprun" --master_addr "$("$H" addr "$name" 0)" \
        --master_port 29400 "$build/bin/bench_mlp" --epochs 1 --batch-size "$batch" 2> /dev/null |
        grep '^{' | sed 's/^{/{"setting": "1 host", "hosts": 1, /' >> "$out"
    order=$settings
    [ $((r % 2)) = 0 ] && order=$(echo "$settings" | tr ' ' '\n' | sort -r | tr '\n' ' ')
    for s in $order; do run_two "$s" "$out"; done
    echo "round $r of $rounds done" >&2
done
python3 - "$out" "$rate" "$batch" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("2 hosts on %s links, bench_mlp (784-512-512-10), batch %s per rank, samples/s of all "
      "ranks over %d rounds:" % (sys.argv[2], sys.argv[3], len([r for r in rows if r["hosts"] == 1])))
print("| setting | samples/s, median | min-max | bytes a step |")
print("|---|---|---|---|")
for s in ["1 host", "none", "bf16", "powersgd1", "powersgd4"]:
    v = [r["samples_per_s"] for r in rows if r["setting"] == s]
    if not v:
        continue
    b = [r.get("bytes_per_step", 0) for r in rows if r["setting"] == s][-1]
    print("| %s | %.0f | %.0f-%.0f | %s |" % (s, statistics.median(v), min(v), max(v),
                                              "-" if s == "1 host" else b))
EOF
