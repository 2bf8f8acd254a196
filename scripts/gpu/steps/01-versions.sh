# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 01-versions.sh: the card, driver, toolkit, PyTorch and library versions; the programs' libraries
echo "== 1. versions"
CHECK_CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$CHECK_CARD" ] || CHECK_CARD="no GPU ($device rehearsal)"
echo "card: $CHECK_CARD"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
nvcc --version 2>/dev/null | tail -n 2
compute-sanitizer --version 2>/dev/null | head -n 2
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'
echo "cddp commit: $CHECK_COMMIT; library path: $ld"
unresolved=$(cddp ldd "$bin/fashion_mnist" | grep "not found")
if [ -n "$unresolved" ]; then
    outcome "libraries" FAIL "$(echo "$unresolved" | tr -s ' \t\n' ' ')"
else
    outcome "libraries" ok "every library of the programs resolved"
fi
