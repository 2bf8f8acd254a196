#!/bin/sh
# device_kill.sh BUILD_DIR DEVICE [FLAG]: a rank killed in the middle of data-parallel training on
# a device. 2 ranks of gpt_train (a tiny GPT on a text of its own) train on DEVICE (emu in CI, cuda
# on the GPU machine), DDP's gradients going through host copies (or as FLAG says: --ipc, through
# the other rank's device memory); rank 1 is SIGKILLed in the
# middle of its steps. The job must stop within seconds (no rank waits for ever on the device or
# on the dead peer), exit 1, and cddprun must name rank 1, killed by SIGKILL, as the root cause;
# no cddp name is left in /dev/shm.
set -u
build=$1 device=$2 flag=${3:-}
work=$(mktemp -d)
job=""
cleanup() {
    [ -n "$job" ] && kill -9 "$job" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- the job:"; cat "$work/out"; exit 1; }
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS RANK WORLD_SIZE
export CDDP_LOG_LEVEL=error
ls /dev/shm | grep '^cddp-' | sort > "$work/shm.before"
python3 - "$work/text.txt" <<'EOF'
import random, sys
random.seed(1)
words = "the quick brown fox jumps over a lazy dog and runs far from home".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(40000)))
EOF
gpt="exec $build/bin/gpt_train --device $device --data $work/text.txt --n_layer 2 --n_head 2"
gpt="$gpt --n_embd 64 --block_size 32 --batch_size 8 --max_iters 1000000 --log_interval 1"
gpt="$gpt --eval_interval 1000000 --eval_iters 1 --sample 0 --out none $flag"
"$build/bin/cddprun" --standalone --nproc_per_node 2 sh -c "echo \$\$ > $work/pid.\$RANK; $gpt" \
    > "$work/out" 2>&1 &
job=$!
i=0
until grep -q "^iter 20:" "$work/out" && [ -s "$work/pid.1" ]; do
    i=$((i + 1))
    [ $i -gt 600 ] && fail "20 iterations did not pass in 60 s"
    kill -0 "$job" 2>/dev/null || fail "the job ended before the kill"
    sleep 0.1
done
kill -9 "$(cat "$work/pid.1")"
killed=$(date +%s)
wait "$job"
rc=$?
job=""
took=$(($(date +%s) - killed))
[ "$rc" = 1 ] || fail "the job exited $rc after rank 1 was killed (expected 1)"
[ "$took" -le 20 ] || fail "the job took $took s to stop after rank 1 was killed"
grep -q "root cause: rank 1 (local rank 1, host .*) was killed by SIGKILL" "$work/out" ||
    fail "cddprun does not name rank 1, killed by SIGKILL, as the root cause"
ls /dev/shm | grep '^cddp-' | sort | comm -23 - "$work/shm.before" > "$work/shm.left"
[ ! -s "$work/shm.left" ] || fail "cddp names left in /dev/shm: $(cat "$work/shm.left")"
echo "ok: rank 1 killed in training on $device${flag:+ ($flag)}: the job stopped in $took s, exit 1, root cause rank 1; nothing left in /dev/shm"
