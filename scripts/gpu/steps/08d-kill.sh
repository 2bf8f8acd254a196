# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 08d-kill.sh: rank 1 of 2 on the GPU SIGKILLed mid-training, staged and with --ipc
# The job stops in seconds, naming it as the root cause (tests/ddp/device_kill.sh).

kill1() {
    skipped "2 ranks, rank 1 SIGKILLed mid-training" 40 && return
    local d=$device b ok flag
    [ "$d" = cuda ] && d=cuda:0
    for flag in "" --ipc; do
        fits 30 || break
        b=$(cddp timeout 90 "$root/tests/ddp/device_kill.sh" "$carry" "$d" ${flag:+"$flag"} 2>&1)
        ok=FAIL
        echo "$b" | grep -q "^ok: rank 1 killed" && ok=ok
        outcome "2 ranks on $d $flag, rank 1 SIGKILLed mid-training" "$ok" "$(echo "$b" | tail -n 1 | cut -c1-160)"
    done
}

kill1
