# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 08c-ipc.sh: CUDA IPC between two processes, and the ipc transport's collectives on 2 ranks
# ipc_probe (tests/gpu/ipc_probe.c): memory and an event opened by another process, its reads and
# writes checked; CUDA's words when a step fails. Then cddp_dcomm's collectives on 2 ranks sharing
# the device (tests/ipc/ipc_check.c: allreduce, reduce-scatter and allgather, back to back, every
# element bit for bit) through CUDA IPC (a small scratch, and 64 MiB) and through host copies.

ipc() {
    local line ok=FAIL transport scratch o n
    if [ "$device" = cuda ] && [ -x "$bin/ipc_probe" ]; then
        line=$(cddp timeout 90 "$bin/ipc_probe" 2>&1 | tail -n 1)
        echo "$line"
        case "$line" in "CUDA IPC: ok"*) ok=ok ;; esac
        outcome "CUDA IPC between two processes (ipc_probe)" "$ok" "$line"
        result cuda_ipc cddp "$([ $ok = ok ] && echo 1 || echo 0)" "works" "ipc_probe: $line" \
            "$(passed $ok)"
    fi
    skipped "the ipc transport's collectives, 2 ranks" 40 && return
    for transport in "ipc 65536" "ipc 67108864" "host 65536"; do
        read -r transport scratch <<<"$transport"
        o=$(cddp timeout 60 "$bin/cddprun" --nproc_per_node 2 "$bin/ipc_check" --device "$device" \
            --transport "$transport" --scratch "$scratch" --rounds 4 2>&1)
        n=$(echo "$o" | grep -c "$transport ok (2 ranks")
        echo "$o" | grep -v "$transport ok" | tail -n 4
        ok=FAIL
        [ "$n" = 2 ] && ok=ok
        outcome "cddp_dcomm through $transport, 2 ranks on one $device (scratch $scratch)" "$ok" \
            "$(echo "$o" | grep -m1 "$transport ok\|rank [01]:" | cut -c1-160)"
    done
}

ipc
