#!/bin/sh
# bench/shaped_links.sh BUILD [ROUNDS] [RATE] [HOSTS...]: allreduce across emulated hosts on shaped
# links (tests/hosts/hosts.sh: network namespaces on a bridge, every link shaped with tbf to RATE
# both ways), one rank per host: cddp's TCP transport (cddprun on each host) against Open MPI's
# TCP BTL (mpirun in host 0, reaching the others through an rsh agent that enters their
# namespaces) on the same links. Rounds interleave the two, the order alternating. Prints, per
# host count and size, the median bus bandwidth and its spread across rounds, the link rate, and
# the α-β model fitted to cddp's times (bench/shaped.py). As root. SHAPED_JSONL=FILE keeps the
# raw results.
#
#   bench/shaped_links.sh build 3 1gbit 2 4
set -eu
build=$(cd "$1" && pwd)
rounds=${2:-3}
rate=${3:-1gbit}
shift $(($# < 3 ? $# : 3))
counts=${*:-2 4}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/shaped_setup.sh"
shaped_setup bench/shaped_links.sh sb
# Two sweeps, each in fresh processes: the sizes of cddp's one-hop path, then the ring's. In one
# sweep, the one-hop path's incast (every rank sends to every other at once) makes the shaped
# links drop packets, and TCP's congestion state then holds the ring's sizes below the link
# rate for the rest of the run (docs/SCALING.md).
sweeps="4K:64K 128K:16M"
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT CDDP_STORE_PORT
export CDDP_LOG_LEVEL=warn OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# Open MPI's rsh agent: "agent HOST CMD..." runs CMD on the emulated host with address HOST.
cat > "$work/agent" <<EOF
#!/bin/sh
host=\$1
shift
exec "$H" exec "$name" \$((\${host##*.} - 1)) sh -c "\$*"
EOF
chmod +x "$work/agent"

run_cddp() { # N OUT
    n=$1
    for sw in $sweeps; do run_cddp_sizes "$n" "$2" "--min-bytes ${sw%:*} --max-bytes ${sw#*:}"; done
}
run_ompi() { # N OUT
    n=$1
    for sw in $sweeps; do run_ompi_sizes "$n" "$2" "--min-bytes ${sw%:*} --max-bytes ${sw#*:}"; done
}
run_cddp_sizes() { # N OUT SIZES
    n=$1
    sizes="$3 --iters 10 --warmup 2"
    for i in $(seq 0 $((n - 1))); do
        "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes "$n" --node_rank "$i" \
            --master_addr "$("$H" addr "$name" 0)" --master_port 29400 \
            --token_file "$work/token" --local_addr "$("$H" addr "$name" "$i")" \
            "$build/bin/cddp-bench-allreduce" $sizes --json > "$work/c$i" 2> "$work/c$i.err" &
    done
    wait
    grep '^{' "$work/c0" | sed "s/^{/{\"hosts\": $n, /" >> "$2"
}
run_ompi_sizes() { # N OUT SIZES
    n=$1
    sizes="$3 --iters 10 --warmup 2"
    : > "$work/hostfile"
    for i in $(seq 0 $((n - 1))); do echo "$("$H" addr "$name" "$i") slots=1" >> "$work/hostfile"; done
    "$H" exec "$name" 0 mpirun --allow-run-as-root --hostfile "$work/hostfile" -np "$n" \
        --mca plm_rsh_agent "$work/agent" --mca btl tcp,self --mca btl_tcp_if_include eth0 \
        --mca oob_tcp_if_include eth0 "$build/bin/mpi-bench-allreduce" $sizes \
        2> "$work/o.err" | grep '^{' | sed "s/^{/{\"hosts\": $n, /" >> "$2"
}

# Data-parallel training (bench_mlp: the 784-512-512-10 MLP, 2.68 MB of gradients a step) on
# host 0 alone and on 2 hosts, one rank each: samples per second, all ranks together.
run_ddp() { # OUT
    for batch in 32 256; do
        "$H" exec "$name" 0 "$build/bin/cddprun" --master_addr "$("$H" addr "$name" 0)" \
            --master_port 29400 "$build/bin/bench_mlp" --epochs 1 --batch-size $batch 2> /dev/null |
            grep '^{' | sed "s/^{/{\"hosts\": 1, /" >> "$1"
        for i in 0 1; do
            "$H" exec "$name" "$i" "$build/bin/cddprun" --nnodes 2 --node_rank "$i" \
                --master_addr "$("$H" addr "$name" 0)" --master_port 29400 \
                --token_file "$work/token" --local_addr "$("$H" addr "$name" "$i")" \
                "$build/bin/bench_mlp" --epochs 1 --batch-size $batch > "$work/d$i" 2> /dev/null &
        done
        wait
        grep '^{' "$work/d0" | sed "s/^{/{\"hosts\": 2, /" >> "$1"
    done
}

out="$work/results.jsonl"
: > "$out"
for n in $counts; do
    "$H" start "$name" "$n" "$rate" > /dev/null
    for r in $(seq "$rounds"); do
        if [ $((r % 2)) = 1 ]; then
            run_cddp "$n" "$out"
            run_ompi "$n" "$out"
        else
            run_ompi "$n" "$out"
            run_cddp "$n" "$out"
        fi
        [ "$n" = 2 ] && run_ddp "$out"
        echo "hosts $n: round $r of $rounds done" >&2
    done
    "$H" stop "$name"
done
[ -n "${SHAPED_JSONL:-}" ] && cp "$out" "$SHAPED_JSONL"  # the raw lines, kept when asked
python3 "$here/shaped.py" "$rate" "$out"
