#!/bin/sh
# ipc_examples.sh BUILD_DIR: the examples with --ipc (DistributedDataParallel's ipc option) on the
# emulated device, 2 ranks under the real launcher, against the same runs through host copies:
# the same losses and weights (2 ranks: each sum is the same two terms either way), for
# ddp_train (SGD and AdamW), fashion_mnist's CNN in small buckets (some packed, not one range of
# the gradient block) and gpt_train, plain and with --zero (ZeRO-1: reduce-scatter and allgather
# through the other rank's device memory); and the refusals: --ipc on the CPU, with a bf16 hook,
# with --nccl, each in one line that says what to do.
set -u
build=$1
R="$build/bin/cddprun"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE
export CDDP_LOG_LEVEL=error

fail() { echo "FAIL: $*"; exit 1; }
expect_in() { grep -qF -- "$1" "$2" || { echo "--- $2:"; cat "$2"; fail "'$1' not in $2"; }; }
# pair NAME LINES SED ARGS...: ARGS under cddprun on 2 ranks through host copies and with --ipc
# (output in $work/NAME_host and NAME_ipc, with the debug log); the lines SED keeps of each must
# be the same, LINES of them (sorted: the ranks print in either order)
pair() {
    name=$1 lines=$2 keep=$3
    shift 3
    for how in host ipc; do
        flag=$([ $how = ipc ] && echo --ipc)
        CDDP_LOG_LEVEL=debug timeout 120 "$R" --standalone --nproc_per_node 2 "$@" $flag \
            > "$work/${name}_$how" 2>&1 || { tail -n 20 "$work/${name}_$how"; fail "$name $flag failed"; }
        sed -n "$keep" "$work/${name}_$how" | sort > "$work/${name}_$how.res"
    done
    grep -q "reduced there through CUDA IPC" "$work/${name}_ipc" || fail "$name --ipc: not reduced through CUDA IPC"
    got=$(wc -l < "$work/${name}_host.res")
    [ "$got" = "$lines" ] && cmp -s "$work/${name}_host.res" "$work/${name}_ipc.res" ||
        { diff "$work/${name}_host.res" "$work/${name}_ipc.res" | head; fail "$name: --ipc gives '$(head -n 1 "$work/${name}_ipc.res")', the host '$(head -n 1 "$work/${name}_host.res")' ($got lines)"; }
}
ddp='/loss:/p; /\]\]/p; /w:/p'
pair ddp_sgd 24 "$ddp" "$build/bin/ddp_train" --device emu
pair ddp_adamw 24 "$ddp" "$build/bin/ddp_train" --device emu --optimizer adamw
fm='s/.*"final_loss": \([0-9.]*\), "test_acc": \([0-9.]*\).*/\1 \2/p'
pair fm 1 "$fm" "$build/bin/fashion_mnist" --device emu --model cnn --epochs 1 --limit 1280 \
    --batch-size 32 --log-every 0 --out none --json --bucket-cap-mb 0.02
grep -q "packed" "$work/fm_ipc" || fail "fashion_mnist --ipc: no bucket was packed"
G="$build/bin/gpt_train --device emu --n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 4 --max_iters 10 --log_interval 1 --eval_interval 10 --eval_iters 1 --final_eval 1 --out none --sample 0"
gpt='s/^\(iter [0-9]*: loss [0-9.]*\),.*/\1/p'
pair gpt 10 "$gpt" $G
pair gpt_zero 10 "$gpt" $G --zero
echo "ok: --ipc gives the host path's losses and weights (ddp_train, fashion_mnist, gpt_train, --zero)"

D="$build/bin/ddp_train"
timeout 60 "$R" --standalone --nproc_per_node 2 --tee "$D" --ipc > "$work/cpu" 2>&1 &&
    fail "--ipc on the CPU was taken"
expect_in "ddp_train: rank 1: CUDA IPC: rank 0: cpu shares no memory with other processes: ranks on the CPU reduce through the group's own transports" "$work/cpu"
timeout 60 "$R" --standalone --nproc_per_node 2 "$build/bin/fashion_mnist" --device emu --ipc \
    --hook bf16 --epochs 1 --limit 64 --out none > "$work/hook" 2>&1 && fail "--ipc with a bf16 hook was taken"
expect_in "ipc does not go with a bf16/fp16 hook: CUDA IPC reduces in float32" "$work/hook"
timeout 60 "$R" --standalone --nproc_per_node 2 "$D" --device emu --ipc --nccl > "$work/both" 2>&1 &&
    fail "--ipc with --nccl was taken"
expect_in "ipc does not go with nccl: choose one of the two" "$work/both"
echo "ok: --ipc on the CPU, with a hook, with --nccl: refused in one line"
