# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 02-device-check.sh: device_check, every CUDA kernel against the CPU's
if ! skipped "kernels against the CPU" 60; then
    timeout 60 env LD_LIBRARY_PATH="$ld" "$bin/device_check" "$device" --json >"$out/device_check.jsonl"
    rc=$?
    cat "$out/device_check.jsonl"
    line=$("$py" "$root/scripts/gpu/check_json.py" get summary <"$out/device_check.jsonl")
    outcome "kernels against the CPU (device_check $device)" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
        "${line:-exit $rc}"
    result device_check cddp "$(grep -c '"FAIL"' "$out/device_check.jsonl")" "failed cases" \
        "$device against the CPU, seed 1: $line"
fi
