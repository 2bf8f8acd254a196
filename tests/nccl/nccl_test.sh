#!/bin/sh
# nccl_test.sh BUILD_DIR: the nccl transport's bootstrap and error paths through the real launcher, with
# tests/nccl/fake_nccl.c standing in for NCCL (CDDP_NCCL_LIBRARY): 1 and 2 ranks form the
# communicator from rank 0's id and allreduce; a communicator that never forms is aborted at the
# timeout on every rank (no hang); NCCL's refusals and a peer's failure are reported with NCCL's
# words; DistributedDataParallel with the nccl option gives the host path's losses and weights, and
# passes ddp_check's modes (find_unused_parameters and join among them);
# a device NCCL cannot read and a missing library say so.
set -u
build=$1
R="$build/bin/cddprun"
T="$build/bin/nccl_test"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE FAKE_NCCL_INIT FAKE_NCCL_OP
export CDDP_LOG_LEVEL=error CDDP_NCCL_LIBRARY="$build/lib/libcddp_fake_nccl.so" FAKE_NCCL_LOG="$work/log"

fail() { echo "FAIL: $*"; exit 1; }
expect_in() { grep -qF -- "$1" "$2" || { echo "--- $2:"; cat "$2"; fail "'$1' not in $2"; }; }
# job N OUT [ARGS]: N ranks of nccl_test with ARGS, every rank's output tagged, into OUT
job() {
    n=$1 out=$2
    shift 2
    timeout 60 "$R" --standalone --nproc_per_node "$n" --tee "$T" "$@" > "$out" 2>&1
}

job 2 "$work/ok" || { rc=$?; cat "$work/ok"; fail "2 ranks exited $rc"; }
expect_in "[rank 0]: rank 0: allreduce ok (2 ranks, NCCL, cpu)" "$work/ok"
expect_in "[rank 1]: rank 1: allreduce ok (2 ranks, NCCL, cpu)" "$work/ok"
[ "$(cut -d' ' -f6 "$work/log" | sort -u | wc -l)" = 1 ] && [ "$(wc -l < "$work/log")" = 2 ] ||
    { cat "$work/log"; fail "the 2 ranks did not both join with rank 0's id"; }
echo "ok: 2 ranks form the communicator from rank 0's id and allreduce"
job 1 "$work/one" || { rc=$?; cat "$work/one"; fail "1 rank exited $rc"; }
expect_in "rank 0: allreduce ok (1 ranks, NCCL, cpu)" "$work/one"

start=$(date +%s)
FAKE_NCCL_INIT=hang job 2 "$work/hang" 1 && fail "a communicator that never formed was taken"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "the hanging communicator took $(( $(date +%s) - start )) s to give up"
for r in 0 1; do
    expect_in "[rank $r]: no communicator after 1." "$work/hang"
    expect_in "rank $r: NCCL: forming the communicator did not finish within 1 s (2 ranks: one did not join, or one is stuck): the communicator was aborted" "$work/hang"
done
# Without a timeout of its own, the group's: CDDP_TIMEOUT_S (it waited a fixed 300 s)
start=$(date +%s)
CDDP_TIMEOUT_S=2 FAKE_NCCL_INIT=hang job 2 "$work/hang2" && fail "a communicator that never formed was taken"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "with CDDP_TIMEOUT_S=2 the hanging communicator took $(( $(date +%s) - start )) s to give up"
expect_in "NCCL: forming the communicator did not finish within 2 s (2 ranks" "$work/hang2"
echo "ok: a communicator that does not form is aborted at the timeout on every rank (its own, else CDDP_TIMEOUT_S)"

FAKE_NCCL_INIT=fail job 2 "$work/initfail" && fail "a failed NCCL init was taken"
expect_in "rank 0: NCCL: forming the communicator failed (2 ranks): unhandled system error" "$work/initfail"
FAKE_NCCL_OP=fail job 2 "$work/opfail" && fail "a refused allreduce was taken"
expect_in "[rank 1]: allreduce: rank 1: NCCL: allreduce failed (2 ranks): unhandled cuda error: the fake's mode" "$work/opfail"
FAKE_NCCL_OP=remote job 2 "$work/remote" && fail "a peer's failure was not reported"
expect_in "[rank 0]: allreduce: rank 0: NCCL: a collective failed (2 ranks): remote process exited or there was a network error" "$work/remote"
echo "ok: NCCL's refusals and a peer's failure reach the caller with NCCL's words"

job 1 "$work/emu" 5 emu && fail "NCCL on the emulated device was taken"
expect_in "NCCL: emu:0: NCCL moves GPU memory: use a CUDA device" "$work/emu"
# DistributedDataParallel with the nccl option: the same losses and weights as through the host
D="$build/bin/ddp_train"
for opt in sgd adamw; do
    : > "$work/log"
    timeout 60 "$R" --standalone --nproc_per_node 2 --tee "$D" --optimizer $opt > "$work/host_$opt" 2>&1 ||
        { cat "$work/host_$opt"; fail "ddp_train --optimizer $opt failed"; }
    timeout 60 "$R" --standalone --nproc_per_node 2 --tee "$D" --optimizer $opt --nccl > "$work/nccl_$opt" 2>&1 ||
        { cat "$work/nccl_$opt"; fail "ddp_train --optimizer $opt --nccl failed"; }
    [ "$(wc -l < "$work/log")" = 2 ] || fail "ddp_train --nccl: the ranks did not form NCCL's communicator"
    grep "loss:\|\]\]\|w:" "$work/host_$opt" | sort > "$work/h"
    grep "loss:\|\]\]\|w:" "$work/nccl_$opt" | sort > "$work/n"
    [ "$(wc -l < "$work/h")" = 24 ] && cmp -s "$work/h" "$work/n" ||
        { diff "$work/h" "$work/n" | head; fail "ddp_train --optimizer $opt: NCCL's losses or weights differ from the host's"; }
done
# pair NAME RANKS LINES ARGS...: ARGS under cddprun on RANKS ranks through the host and with --nccl
# (their output in $work/NAME_host and NAME_nccl, with the debug log): what both give,
# fashion_mnist's final loss and test accuracy or gpt_train's loss at every iteration, must be
# the same, LINES lines of it
pair() {
    name=$1 n=$2 lines=$3
    shift 3
    for how in host nccl; do
        flag=$([ $how = nccl ] && echo --nccl)
        CDDP_LOG_LEVEL=debug timeout 120 "$R" --standalone --nproc_per_node "$n" "$@" $flag \
            > "$work/${name}_$how" 2>&1 || { tail -n 20 "$work/${name}_$how"; fail "$name $flag failed"; }
        sed -n 's/.*"final_loss": \([0-9.]*\), "test_acc": \([0-9.]*\).*/\1 \2/p; s/^\(iter [0-9]*: loss [0-9.]*\),.*/\1/p' \
            "$work/${name}_$how" > "$work/${name}_$how.res"
    done
    got=$(wc -l < "$work/${name}_host.res")
    [ "$got" = "$lines" ] && cmp -s "$work/${name}_host.res" "$work/${name}_nccl.res" ||
        { diff "$work/${name}_host.res" "$work/${name}_nccl.res" | head; fail "$name: NCCL gives '$(head -n 1 "$work/${name}_nccl.res")', the host '$(head -n 1 "$work/${name}_host.res")' ($got lines)"; }
}
# the CNN in small buckets, some of them packed (not one range of the gradient block)
F="$build/bin/fashion_mnist --model cnn --epochs 1 --limit 1280 --batch-size 32 --log-every 0 --out none --json --bucket-cap-mb 0.02"
pair fm 2 1 $F
grep -q "packed" "$work/fm_nccl" || fail "fashion_mnist --nccl: no bucket was packed"
# the bf16 and fp16 compression hooks: rounded on the device, summed by NCCL in 16 bits; the same
# numbers as the host path's (the stand-in sums as the host's transport: float32, then rounded)
pair fm_bf16 2 1 $F --hook bf16
pair fm_fp16 2 1 $F --hook fp16
# the GPT (AdamW, clipping): every iteration's loss
G="$build/bin/gpt_train --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 4 --max_iters 10 --log_interval 1 --eval_interval 10 --eval_iters 1 --final_eval 1 --out none --sample 0"
pair gpt 2 10 $G
# ZeRO-1 over NCCL on 3 ranks (buckets that do not divide evenly are padded): the CNN and the GPT
pair zfm 3 1 $F --limit 1536 --zero
pair zgpt 3 10 $G --zero
# ZeRO-2 over NCCL: the gradients outside each rank's shard released once its part is in place
pair z2gpt 3 10 $G --zero 2
FAKE_NCCL_OP=fail timeout 60 "$R" --standalone --nproc_per_node 2 --tee "$D" --nccl > "$work/ddpfail" 2>&1 &&
    fail "a refused NCCL allreduce in DDP was taken"
expect_in "ddp_train: rank 0: NCCL: allreduce failed (2 ranks): unhandled cuda error" "$work/ddpfail"
timeout 60 "$R" --standalone --nproc_per_node 2 --tee "$D" --nccl --device emu > "$work/ddpemu" 2>&1 &&
    fail "DDP over NCCL on the emulated device was taken"
expect_in "NCCL: emu:0: NCCL moves GPU memory: use a CUDA device" "$work/ddpemu"
echo "ok: DDP with nccl: the host path's losses and weights (with the bf16 and fp16 hooks too), NCCL's errors, a device NCCL cannot read"
# tests/ddp/ddp_check.c's modes with the nccl transport (CDDP_DDP_TRANSPORT), against one process on the
# whole batch as over the host: plain, accumulation, sum, find_unused_parameters (a branch used on
# some steps and ranks, a parameter no rank uses keeping its gradient) and join (uneven inputs)
for mode in "equal mlp" "equal cnn 0.0005" nosync sum unused join "buffers join"; do
    : > "$work/log"
    # shellcheck disable=SC2086 # the mode is its words
    CDDP_DDP_TRANSPORT=nccl timeout 60 "$R" --standalone --nproc_per_node 2 "$build/bin/ddp_check" $mode \
        > "$work/check" 2>&1 || { cat "$work/check"; fail "ddp_check $mode with nccl failed"; }
    [ "$(grep -c '^ok: ' "$work/check")" = 2 ] ||
        { cat "$work/check"; fail "ddp_check $mode with nccl: not every rank said ok"; }
    [ "$(wc -l < "$work/log")" -ge 2 ] || fail "ddp_check $mode: no NCCL communicator was formed"
done
echo "ok: DDP with nccl: find_unused_parameters and join as over the host (ddp_check)"

CDDP_NCCL_LIBRARY="$work/no/libnccl.so.2" job 2 "$work/missing" && fail "a missing NCCL was taken"
for r in 0 1; do
    expect_in "rank $r: NCCL is not available: $work/no/libnccl.so.2: cannot open shared object file" "$work/missing"
done
echo "ok: a missing NCCL says so on every rank"

# the stand-in leaves nothing in /dev/shm (its segment goes once every rank has it mapped)
for id in $(cut -d' ' -f6 "$work/log" | sort -u); do
    [ ! -e "/dev/shm/cddp-$id" ] || fail "/dev/shm/cddp-$id was left behind"
done
echo "ok: nothing left in /dev/shm"
