#!/bin/sh
# house_test.sh SOURCE_DIR: the house rules hold for the tree (tests/house/check_house.py), and the
# check catches each kind of breach when one is planted in a copy of the tree.
set -u
src=$1
py=${CDDP_PYTHON3:-python3}
check="$src/tests/house/check_house.py"
"$py" "$check" "$src" || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
plant() { # a fresh copy of src/, tools/, include/ and examples/, then the breach described by "$@"
    rm -rf "$work/t"
    mkdir -p "$work/t"
    cp -r "$src/src" "$src/tools" "$src/include" "$src/examples" "$work/t/"
}
expect() { # the check fails on the copy, saying $1
    "$py" "$check" "$work/t" > "$work/out" 2>&1 && { cat "$work/out"; fail "the check passed a tree with: $1"; }
    grep -qF -- "$1" "$work/out" || { cat "$work/out"; fail "the check did not say: $1"; }
}
plant
printf '#include "comm/internal.h"\n' >> "$work/t/src/ddp/reducer.c"
expect 'src/ddp/reducer.c: includes "comm/internal.h", a private header of another module'
plant
printf '#include "store/internal.h"\n' >> "$work/t/tools/cddprun/report.c"
expect 'tools/cddprun/report.c: includes "store/internal.h": the programs use only public headers'
plant
printf 'void cddp__house_a(void);\nvoid cddp__house_a(void) { cddp_comm_abort(0, 0); }\n' >> "$work/t/src/comm/reduce.c"
expect 'src/comm/reduce.c -> src/comm/group.c (cddp_comm_abort)'
plant
i=0; while [ $i -lt 710 ]; do echo "/* padding */"; i=$((i + 1)); done >> "$work/t/src/core/arena.c"
expect 'src/core/arena.c: '
plant
printf 'void cddp__house_b(void);\nvoid cddp__house_b(void) { cddp_device_cpu(); }\n' >> "$work/t/src/comm/reduce.c"
expect 'src/comm/reduce.c calls src/tensor/devices.c (cddp_device_cpu): comm is below tensor'
plant
mkdir "$work/t/src/extra"
printf 'void cddp_extra(void);\nvoid cddp_extra(void) {}\n' > "$work/t/src/extra/extra.c"
expect 'src/extra: a module without a floor'
# A device-kind branch above the devices' seam (outside src/tensor/).
plant
printf 'int cddp__house_k(const cddp_device *d);\nint cddp__house_k(const cddp_device *d) { return cddp_device_kind_of(d) == CDDP_DEVICE_CUDA; }\n' >> "$work/t/src/dcomm/nccl.c"
expect "src/dcomm/nccl.c: names CDDP_DEVICE_CUDA: above the devices' seam"
# The library's seams kept internal: exported, included by a public header, or by a program.
plant
printf 'CDDP_API void cddp_house_seam(void);\n' >> "$work/t/include/cddp/internal/device.h"
expect "include/cddp/internal/device.h: exports a function (CDDP_API)"
plant
printf '#include "cddp/internal/device.h"\n' >> "$work/t/include/cddp/nn.h"
expect "include/cddp/nn.h: a public header includes cddp/internal/"
plant
printf '#include "cddp/internal/device.h"\n' >> "$work/t/tools/cddprun/util.c"
expect "tools/cddprun/util.c: includes cddp/internal/: the programs use the public API only"
# A tensor's own fields read outside tensor and autograd.
plant
printf 'static void *house_half(cddp_tensor *t) {\n    return t->own.half;\n}\n' >> "$work/t/src/ddp/reducer.c"
expect "src/ddp/reducer.c: reads a tensor's own field (own.half)"
# The CUDA device's kernel list against its launchers: one defined but not listed, one listed
# but not defined.
plant
printf 'void cddp__cuda_house(cddp__kq *q, const void *a) {\n    (void)q, (void)a;\n}\n' >> "$work/t/src/tensor/cuda/basic.cu"
expect "src/tensor/cuda/cuda.h: cddp__cuda_house is defined but not in CDDP_CUDA_KERNELS"
plant
sed -i 's/K(qkv_pack_grad)/K(qkv_pack_grad) K(house_missing)/' "$work/t/src/tensor/cuda/cuda.h"
expect "src/tensor/cuda/cuda.h: CDDP_CUDA_KERNELS lists house_missing, whose launcher"
# A program's files: no circle either (util.c is below workers.c, which calls it).
plant
printf 'void cddprun_house_e(void);\nvoid cddprun_house_e(void) { cddprun_pump(0, 0); }\n' >> "$work/t/tools/cddprun/util.c"
expect 'tools/cddprun/util.c: in a circle of files of tools/cddprun (util.c -> workers.c)'
# CUDA files are held to the same rules: a long .cu, a .cu's private include of another module,
# a .cuh's, and a launcher that calls a floor above; a function of an anonymous namespace is the
# file's own (no link to it).
plant
i=0; while [ $i -lt 710 ]; do echo "/* padding */"; i=$((i + 1)); done >> "$work/t/src/tensor/cuda/basic.cu"
expect 'src/tensor/cuda/basic.cu: '
plant
printf '#include "ddp/internal.h"\n' >> "$work/t/src/tensor/cuda/loss.cu"
expect 'src/tensor/cuda/loss.cu: includes "ddp/internal.h", a private header of another module'
plant
printf '#include "io/internal.h"\n' >> "$work/t/src/tensor/cuda/common.cuh"
expect 'src/tensor/cuda/common.cuh: includes "io/internal.h", a private header of another module'
plant
printf 'void cddp__house_c(void);\nvoid cddp__house_c(void) { cddp_optim_step(0); }\n' >> "$work/t/src/tensor/cuda/optim.cu"
expect 'src/tensor/cuda/optim.cu calls src/optim/optim.c (cddp_optim_step): tensor is below optim'
plant
printf 'namespace {\n__device__ float house_own(float x) {\n    return x;\n}\n} // namespace\n' >> "$work/t/src/tensor/cuda/optim.cu"
printf 'void cddp__house_d(void);\nvoid cddp__house_d(void) {\n    int house_own = 0;\n    (void)house_own;\n}\n' >> "$work/t/src/core/arena.c"
"$py" "$check" "$work/t" > "$work/out" 2>&1 || { cat "$work/out"; fail "a function of an anonymous namespace was taken for a name of another file"; }
echo "ok: the house rules hold, and a private include, a program's private include, a circle, a" \
     "long file, a call to a floor above, a module without a floor, a circle in a program and a" \
     "device-kind branch above the seam, an internal header exported or included by a public" \
     "header or a program, a tensor's own field read outside tensor, and the CUDA kernel list out of" \
     "step with the launchers are each caught, in C and CUDA"
