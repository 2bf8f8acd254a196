# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 06-mlp-speed.sh: the MLP's training speed, cddp and PyTorch eager on the same card
# bench_mlp and bench/mlp_torch.py, 3 rounds interleaved (median and spread), batch 32 and 256.

# speed BATCH: one batch size's rounds.
speed() {
    local batch=$1 rounds=3 cs="" ts="" c t
    skipped "mlp_train batch $batch" 120 && return
    for _ in $(seq $rounds); do
        c=$(cddp timeout 60 "$bin/bench_mlp" --device "$device" --batch-size "$batch" --epochs 3 \
            --data "$data" 2>&1)
        t=$(timeout 90 "$py" "$root/bench/mlp_torch.py" --device "$torch_device" \
            --batch-size "$batch" --epochs 3 --data "$data" 2>&1)
        echo "$c" | grep '"impl"'
        echo "$t" | grep '"impl"'
        cs="$cs $(field samples_per_s "$c")"
        ts="$ts $(field samples_per_s "$t")"
    done
    versus mlp_train samples/s "mlp_train batch $batch" "$rounds" "$cs" "$ts" \
        "784-512-512-10 fp32, SGD lr 0.01, batch $batch, 3 epochs of 20000 samples, each batch copied from the host; $rounds rounds interleaved"
}

speed 32
speed 256
