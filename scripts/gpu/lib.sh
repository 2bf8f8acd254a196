# shellcheck shell=bash
# lib.sh: what the GPU check's steps share (sourced by check.sh after env.sh, before the steps):
# the outcome table, the budget, results.jsonl's lines and the JSON of the programs' output (both
# through check_json.py), the comparisons, and the runs several steps make (the tiny GPT, the 6-layer
# GPT of the speed checks, compute-sanitizer). It reads check.sh's variables: root, out, bin,
# data, device, torch_device, py, start, budget.
# shellcheck disable=SC2154 # those variables are check.sh's

summary=""
# shellcheck disable=SC2034 # check.sh's exit status
failed=0

# outcome NAME ok|FAIL|"not run" DETAIL: a row of the table check.sh prints last.
outcome() {
    summary="$summary$(printf '| %s | %s | %s |' "$1" "$2" "$3")
"
    # shellcheck disable=SC2034 # check.sh's exit status
    [ "$2" = ok ] || failed=1
}

# fits SECONDS: whether a part of up to SECONDS still ends inside the budget.
fits() { [ $(($(date +%s) - start + $1)) -le "$budget" ]; }

# skipped NAME SECONDS: false when a part of up to SECONDS fits; else NAME's outcome is "not run".
skipped() {
    fits "$2" && return 1
    outcome "$1" "not run" "out of time"
}

# result WHAT IMPL VALUE UNIT CONFIG [KEY=JSON ...]: a line of results.jsonl (VALUE empty: null).
result() { "$py" "$root/scripts/gpu/check_json.py" result "$out/results.jsonl" "$@"; }

# passed OK: results.jsonl's pass field for an outcome
passed() { if [ "$1" = ok ]; then echo pass=true; else echo pass=false; fi; }

# field PATH OUTPUT: the value at PATH ("val_loss", "bench.tokens_per_s") in OUTPUT's last JSON
# line that holds it, nothing when none does.
field() { printf '%s\n' "$2" | "$py" "$root/scripts/gpu/check_json.py" get "$1"; }

# close A B [BOUND [abs]]: A and B within BOUND (default 1e-4) relative (with abs: absolute).
close() {
    awk -v a="$1" -v b="$2" -v e="${3:-1e-4}" -v abs="${4:-}" 'BEGIN { d = a - b; if (d < 0) d = -d
        m = abs != "" ? 1 : b < 0 ? -b : b; exit !(a != "" && b != "" && d <= e * m) }'
}

# at_most A BOUND: A is a number no larger than BOUND.
at_most() { awk -v a="$1" -v e="$2" 'BEGIN { exit !(a != "" && a != "none" && a + 0 <= e) }'; }

# median VALUES...: the median, and the spread as min..max ("" without values).
median() {
    printf '%s\n' "$@" | grep . | sort -g | awk '{ v[NR] = $1 }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              if (NR) printf "%.1f %s..%s", m, v[1], v[NR] }'
}

# ratio A B: A / B to 2 decimals (nothing when B is not a number above 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b }'; }

# tokens_per_s N OUTPUT: N tokens an iteration over the median iteration of OUTPUT's JSON
# ("median_iter_ms": gpt_train's and bench/gpt_torch.py's), to 1 decimal (nothing without one).
tokens_per_s() {
    awk -v n="$1" -v ms="$(field median_iter_ms "$2")" 'BEGIN { if (ms > 0) printf "%.1f", n * 1000 / ms }'
}

# host_queue OUTPUT: "forward + backward queued in F ms of an M ms iteration" from gpt_train's
# JSON (its forward and backward time the host's queuing: no host wait inside them on one rank),
# to tell a step bound by the host's queuing (F near M) from one bound by the GPU.
host_queue() {
    awk -v m="$(field median_iter_ms "$1")" -v f="$(field iter_ms.forward "$1")" \
        -v b="$(field iter_ms.backward "$1")" 'BEGIN { if (m != "" && f != "")
        printf "forward + backward queued in %.1f ms of a %.1f ms iteration", f + b, m }'
}

# versus WHAT UNIT LABEL ROUNDS "CDDP'S VALUES" "PYTORCH'S VALUES" CONFIG: the median and spread
# of each side's rounds as results.jsonl lines and one outcome (ok when every round gave a value).
versus() {
    local cm tm cspread tspread ok=FAIL
    # shellcheck disable=SC2086 # the values are words
    read -r cm cspread <<<"$(median $5)"
    # shellcheck disable=SC2086
    read -r tm tspread <<<"$(median $6)"
    result "$1" cddp "$cm" "$2" "$7, $device" "spread=$cspread"
    result "$1" torch-eager "$tm" "$2" "$7, $torch_device" "spread=$tspread"
    [ "$(echo "$5" | wc -w)" = "$4" ] && [ "$(echo "$6" | wc -w)" = "$4" ] && ok=ok
    outcome "$3, $2" $ok "cddp ${cm:-none} ($cspread), PyTorch eager ${tm:-none} ($tspread), ratio $(ratio "$cm" "$tm")"
}

# The tiny GPT (2 layers, width 64), 20 iterations: steps 5 and 8.
# shellcheck disable=SC2034 # the steps'
tiny=(--n_layer 2 --n_head 4 --n_embd 64 --block_size 32 --batch_size 8 --max_iters 20
    --warmup_iters 5 --log_interval 1 --eval_interval 10 --eval_iters 2 --out none --sample 60
    --temperature 0 --prompt A --json --data "$data/fortunes")
# The 6-layer GPT of the speed checks (steps 7 and 8): its shape and 30 iterations, for cddp and
# bench/gpt_torch.py alike; gpt6 adds gpt_train's one short evaluation and its JSON.
gpt6_shape=(--n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --batch_size 16 --max_iters 30)
# shellcheck disable=SC2034 # the steps'
gpt6=("${gpt6_shape[@]}" --eval_interval 1000 --eval_iters 1 --final_eval 2 --sample 0 --out none
    --json --data "$data/fortunes")

# val_loss OUTPUT: gpt_train's validation loss in its JSON line.
val_loss() { field val_loss "$1"; }

# losses OUTPUT: gpt_train's iteration losses, then its validation loss.
losses() {
    printf '%s\n' "$1" | sed -n 's/^iter [0-9]*: loss \([0-9.]*\).*/\1/p' | tr '\n' ' '
    val_loss "$1"
}

# apart OUTPUT OUTPUT: the largest relative difference between two gpt_train runs' 20 iteration
# losses and validation losses ("none" when either has not all 21).
apart() {
    awk -v a="$(losses "$1")" -v b="$(losses "$2")" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ")
        if (n != 21 || m != n) { print "none"; exit }
        for (i = 1; i <= n; i++) { d = (x[i] - y[i]) / x[i]; if (d < 0) d = -d; if (d > w) w = d }
        printf "%.2g", w }'
}

# sanitize TOOL SECONDS [PROGRAM ARGS...]: compute-sanitizer's TOOL on PROGRAM (default
# device_check) on the device; its report appended to sanitizer-PROGRAM.txt (a file per program:
# $OUT brings back 8 files at most).
sanitize() {
    local tool=$1 secs=$2 prog=${3:-device_check} label report args
    if [ $# -gt 2 ]; then shift 3; else shift 2; fi
    args=("$@")
    report=$out/sanitizer-$prog.txt
    if [ "$prog" = device_check ]; then
        args=(cuda) label=$tool
    else
        label="$tool on $prog"
    fi
    if ! command -v compute-sanitizer >/dev/null || [ "$device" != cuda ]; then
        outcome "compute-sanitizer $label" "not run" "no compute-sanitizer or no GPU"
        return
    fi
    skipped "compute-sanitizer $label" "$secs" && return
    local t0 rc s
    t0=$(date +%s)
    echo "== compute-sanitizer --tool $tool $prog ${args[*]}" >>"$report"
    timeout "$secs" env LD_LIBRARY_PATH="$ld" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        --print-limit 20 "$bin/$prog" "${args[@]}" >>"$report" 2>&1
    rc=$?
    s=$(grep "ERROR SUMMARY\|RACECHECK SUMMARY" "$report" | tail -n 1)
    tail -n 3 "$report"
    outcome "compute-sanitizer $label" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "${s:-exit $rc} ($(($(date +%s) - t0)) s)"
}
