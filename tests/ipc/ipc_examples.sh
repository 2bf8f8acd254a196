#!/bin/sh
# ipc_examples.sh BUILD_DIR: the examples with --transport ipc (DistributedDataParallel's ipc
# transport) on the emulated device, 2 ranks under the real launcher, against the same runs left
# to the transport's auto choice (host copies on the emulated device, rank 0 saying why): the same
# losses and weights (2 ranks: each sum is the same two terms either way), for ddp_train (SGD and
# AdamW), fashion_mnist's CNN in small buckets (some packed, not one range of the gradient block)
# and gpt_train, plain and with --zero (ZeRO-1: reduce-scatter and allgather through the other
# rank's device memory); CDDP_DDP_TRANSPORT=ipc as --transport ipc; and the refusals, each in one
# line that says what to do: ipc on the CPU, ipc with a bf16 hook, a transport that is none
# (--transport, CDDP_DDP_TRANSPORT), ranks that ask for different transports.
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
        flag=$([ $how = ipc ] && echo "--transport ipc")
        CDDP_LOG_LEVEL=debug timeout 120 "$R" --standalone --nproc_per_node 2 "$@" $flag \
            > "$work/${name}_$how" 2>&1 || { tail -n 20 "$work/${name}_$how"; fail "$name $flag failed"; }
        sed -n "$keep" "$work/${name}_$how" | sort > "$work/${name}_$how.res"
    done
    expect_in "its gradients are reduced through CUDA IPC (each rank sums its part from the others' memory), on a stream of its own (transport ipc, as named)" "$work/${name}_ipc"
    expect_in "its gradients are reduced from host copies by the group's transports (auto: NCCL moves GPU memory only (cuda devices), not emu:0's (rank 0); ipc shares it when named)" "$work/${name}_host"
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
pair gpt_zero2 10 "$gpt" $G --zero 2
echo "ok: --transport ipc gives the host path's losses and weights (ddp_train, fashion_mnist, gpt_train, --zero 1 and 2)"
CDDP_DDP_TRANSPORT=ipc CDDP_LOG_LEVEL=info timeout 60 "$R" --standalone --nproc_per_node 2 \
    "$build/bin/ddp_train" --device emu > "$work/knob" 2>&1 || { cat "$work/knob"; fail "CDDP_DDP_TRANSPORT=ipc failed"; }
expect_in "(transport ipc, as CDDP_DDP_TRANSPORT names)" "$work/knob"
sed -n "$ddp" "$work/knob" | sort | cmp -s - "$work/ddp_sgd_ipc.res" || fail "CDDP_DDP_TRANSPORT=ipc: not --transport ipc's losses and weights"
echo "ok: CDDP_DDP_TRANSPORT=ipc is --transport ipc"

D="$build/bin/ddp_train"
timeout 60 "$R" --standalone --nproc_per_node 2 --tee "$D" --ipc > "$work/cpu" 2>&1 &&
    fail "--ipc on the CPU was taken"
expect_in "ddp_train: rank 1: CUDA IPC: rank 0: cpu shares no memory with other processes: ranks on the CPU reduce through the group's own transports" "$work/cpu"
timeout 60 "$R" --standalone --nproc_per_node 2 "$build/bin/fashion_mnist" --device emu --ipc \
    --hook bf16 --epochs 1 --limit 64 --out none > "$work/hook" 2>&1 && fail "--ipc with a bf16 hook was taken"
expect_in "the ipc transport does not go with a bf16/fp16 hook: CUDA IPC reduces in float32" "$work/hook"
"$D" --transport gloo > "$work/gloo" 2>&1 && fail "--transport gloo was taken"
expect_in "ddp_train: --transport: 'gloo' is not a transport: expected auto, nccl, ipc or host" "$work/gloo"
CDDP_DDP_TRANSPORT=fast timeout 60 "$R" --standalone --nproc_per_node 2 "$D" --device emu > "$work/fast" 2>&1 &&
    fail "CDDP_DDP_TRANSPORT=fast was taken"
expect_in "CDDP_DDP_TRANSPORT=fast: 'fast' is not a transport: expected auto, nccl, ipc or host" "$work/fast"
timeout 60 "$R" --standalone --nproc_per_node 2 sh -c \
    '[ "$RANK" = 1 ] && export CDDP_DDP_TRANSPORT=ipc; exec "$0" --device emu' "$D" > "$work/differ" 2>&1 &&
    fail "ranks asking for different transports were taken"
expect_in "DDP: rank 1 wraps with transport = ipc but rank 0 with auto; every rank must pass the same options" "$work/differ"
echo "ok: ipc on the CPU, with a hook, transports that are none, ranks that differ: refused in one line"
