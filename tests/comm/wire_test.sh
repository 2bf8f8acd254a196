#!/bin/sh
# wire_test.sh BUILD_DIR: 16-bit allreduces and reduce_scatters cross the network as 16 bits. In
# a network namespace of its own (so that its loopback carries nothing else), 2 and 3 ranks under
# cddprun allreduce 4M elements over TCP (CDDP_TRANSPORT=tcp: the ring), and reduce_scatter world
# x 4M into 4M, once as float32 and once as bfloat16; the loopback's transmitted bytes of the
# bf16 run must be at most 55 % of the float32 run's (the ring's bytes: 32 MiB of float32 in all
# for either on 2 ranks; the rendezvous adds kilobytes). Where the values were widened to float32 for the wire, the two runs sent the
# same. As root (unshare -n).
set -u
build=$1
fail() { echo "FAIL: $*"; exit 1; }
if [ "${2:-}" != inside ]; then
    [ "$(id -u)" = 0 ] || { echo "SKIP: needs root for a network namespace"; exit 77; }
    command -v unshare > /dev/null || { echo "SKIP: no unshare"; exit 77; }
    exec unshare -n sh "$0" "$build" inside
fi
ip link set lo up
export CDDP_TRANSPORT=tcp OMP_NUM_THREADS=1 CDDP_LOG_LEVEL=error
tx() { awk '$1 == "lo:" { print $10 }' /proc/net/dev; } # this namespace's loopback
for op in allreduce rs; do
    for np in 2 3; do
        for dt in f32 bf16; do
            before=$(tx)
            out=$("$build/bin/cddprun" --standalone --nproc_per_node $np "$build/bin/comm_check" \
                wire $dt 4194304 $op 2>&1) || fail "$np ranks, $op, $dt: $out"
            [ "$(echo "$out" | grep -c "^ok: ")" = $np ] || fail "$np ranks, $op, $dt: $out"
            eval "bytes_$dt=$(($(tx) - before))"
        done
        echo "$op, $np ranks: float32 $bytes_f32 bytes, bfloat16 $bytes_bf16 bytes on the loopback"
        [ $((bytes_bf16 * 100)) -le $((bytes_f32 * 55)) ] ||
            fail "$op, $np ranks: bf16 sent $bytes_bf16 bytes, float32 $bytes_f32: not half"
        # all ranks together: the allreduce sends 2 (n - 1) x 16 MiB, the reduce_scatter (of n
        # x 16 MiB) n (n - 1) x 16 MiB
        least=$((4194304 * 4 * 2 * (np - 1)))
        [ $op = rs ] && least=$((4194304 * 4 * np * (np - 1)))
        [ "$bytes_f32" -ge "$least" ] ||
            fail "$op, $np ranks: float32 sent only $bytes_f32 bytes: less than the ring must move"
    done
done
echo "ok: 16-bit allreduces and reduce_scatters send half the bytes of float32 over TCP"
