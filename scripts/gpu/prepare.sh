#!/bin/sh
# prepare.sh: builds, on a machine without a GPU, what scripts/gpu/check.sh needs on the GPU
# machine, into build-gpu/carry (ignored by git; about 30 MB):
#
#   bin/    device_check, fashion_mnist, ddp_train, bench_mlp, gpt_train, nccl_test, cddprun,
#           ipc_probe and ipc_check, built with the CUDA device (Release, -Werror, sm_90 + PTX) and without MPI,
#           so that they need nothing from the GPU machine but its driver, cuBLASLt (from its
#           Python wheels) and the Debian libraries below
#   debs/   Debian's runtime packages of OpenBLAS, oneDNN, cJSON and OpenSSL with what they
#           need (the GPU machine has no apt; check.sh unpacks them in /tmp)
#   data/   Fashion-MNIST: the first 20,000 training images and the 10,000 test images; the GPT's
#           corpus, Debian's fortunes (fortunes, and as llm.c's token files in fortunes_tokens;
#           the two packed in data/corpus.tar.gz, which env.sh unpacks into /tmp/cddp-data);
#           1M random GPT-2 tokens as llm.c's token files
#           (data/gpt2_train.bin, gpt2_val.bin) for GPT-2's speed
#   commit  the commit the programs were built from (+dirty when the tree had changes)
#
# The carried folder and the tree travel together, 64 MiB at most: this one is about 53 MiB.
#
# Then the session with the GPU machine runs, as one call with `carry: ["build-gpu/carry"]`:
#   scripts/gpu/check.sh build-gpu/carry
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-gpu
carry=$build/carry
cd "$root"
mkdir -p "$build"
command -v nvcc >/dev/null || {
    echo "prepare.sh: no nvcc on PATH: the CUDA toolkit is needed to build the CUDA device" >&2
    exit 2
}
scripts/deps.sh gpu
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCDDP_WERROR=ON -DCDDP_BUILD_TESTS=ON \
    -DCDDP_CUDA=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$build/configure.log" || {
    cat "$build/configure.log" >&2
    exit 1
}
grep -q "the CUDA device is built" "$build/configure.log" || {
    echo "prepare.sh: CMake did not configure the CUDA device (see $build/configure.log)" >&2
    exit 1
}
programs="device_check fashion_mnist ddp_train bench_mlp gpt_train cddprun ipc_probe ipc_check"
# nccl_test where NCCL's header was found (the toolkit's): check.sh's NCCL steps need it
grep -q "the nccl transport is built" "$build/configure.log" && programs="$programs nccl_test"
# shellcheck disable=SC2086 # the programs are words
cmake --build "$build" -j "$(nproc)" --target $programs cddp-tokenize
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/debs" "$carry/data"
# stripped: each program holds the library and its GPU code, and the carry must fit
for p in $programs; do strip -o "$carry/bin/$p" "$build/bin/$p"; done

# The runtime libraries the programs load (ldd here), by the Debian packages that hold them.
(cd "$carry/debs" && apt-get download -q libopenblas0-pthread libgfortran5 libquadmath0 \
    libdnnl2 ocl-icd-libopencl1 libcjson1 libnettle8 libgomp1 >/dev/null 2>&1) || {
    echo "prepare.sh: apt-get download failed (Debian's mirror unreachable?)" >&2
    exit 1
}

# A smaller training set (the carried folder travels with the tree, 64 MiB in all): the first
# 20,000 training samples, rewritten with their count in the IDX header.
data=${CDDP_DATA:-/usr/share/datasets/fashion-mnist}
python3 - "$data" "$carry/data" 20000 <<'EOF'
import gzip, os, shutil, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, item in (("train-images-idx3-ubyte.gz", 784), ("train-labels-idx1-ubyte.gz", 1)):
    with gzip.open(os.path.join(src, name)) as f:
        raw = f.read()
    dims = raw[3]
    head = bytearray(raw[:4 + 4 * dims])
    struct.pack_into(">I", head, 4, n)
    with gzip.open(os.path.join(dst, name), "wb") as f:
        f.write(bytes(head) + raw[len(head):len(head) + n * item])
for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    shutil.copy(os.path.join(src, name), os.path.join(dst, name))
EOF

fortunes=${CDDP_FORTUNES:-/usr/share/games/fortunes}
[ -d "$fortunes" ] || {
    echo "prepare.sh: no $fortunes (Debian's fortunes package: the GPT's corpus)" >&2
    exit 1
}
cp -rL "$fortunes" "$carry/data/fortunes"
# the same corpus as llm.c's token files (bytes; the last tenth for validation), which PyTorch
# reads as they are: step 5's checkpoint check evaluates the device's checkpoint on them
"$build/bin/cddp-tokenize" "$fortunes" "$carry/data/fortunes_tokens" >/dev/null
# both packed (10 MB of text and tokens in 3.5 MB): env.sh unpacks them on the GPU machine
tar -czf "$carry/data/corpus.tar.gz" -C "$carry/data" fortunes fortunes_tokens
rm -rf "$carry/data/fortunes" "$carry/data/fortunes_tokens"
# GPT-2's speed on random tokens (llm.c's token files: a header of 256 int32, then uint16 tokens)
python3 - "$carry/data" <<'EOF'
import random, struct, sys
rng = random.Random(1)
for name, n in (("gpt2_train.bin", 1 << 20), ("gpt2_val.bin", 1 << 17)):
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
EOF

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+dirty"
echo "$commit" >"$carry/commit"
echo "prepare.sh: $carry ($(du -sh "$carry" | cut -f1)) from $commit; on the GPU machine run"
echo "    scripts/gpu/check.sh build-gpu/carry        (carry: [\"build-gpu/carry\"])"
