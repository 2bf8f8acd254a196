#!/bin/sh
# readme_install.sh SOURCE_DIR BUILD_DIR: README.md's first program, built and run exactly as the
# README says, after the install `make install` does: into /usr/local (a folder the loader
# searches: ldconfig must run) and into /opt/cddp (one it does not: the pkg-config line must
# carry the library's folder), directly and under the installed cddprun. It runs in a mount
# namespace of its own, with a tmpfs over each prefix and a copy of /etc (ldconfig rewrites the
# loader's cache), so that nothing of the machine changes. The data: the first 1000 samples of
# Fashion-MNIST (CDDP_DATA), so that the README's epoch takes a moment.
set -eu
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
if [ -z "${CDDP_README_NS:-}" ]; then
    exec env CDDP_README_NS=1 unshare --mount --propagation private sh "$0" "$src" "$build"
fi
scratch=$(mktemp -d)
trap 'umount /etc /usr/local /opt 2>/dev/null; rm -rf "$scratch"' EXIT
cp -a /etc "$scratch/etc"
mount --bind "$scratch/etc" /etc
mount -t tmpfs cddp-usr-local /usr/local
mount -t tmpfs cddp-opt /opt
awk '/^```c$/ { n++; if (n == 1) { on = 1; next } } /^```$/ { on = 0 } on' "$src/README.md" > "$scratch/train.c"
grep -q "int main" "$scratch/train.c" || fail "README.md's first C block is not a program"
mkdir "$scratch/data"
python3 - "$scratch/data" <<'PY'
import gzip, os, struct, sys
src, dst, n = os.environ.get("CDDP_DATA", "/usr/share/datasets/fashion-mnist"), sys.argv[1], 1000
for name, shape in (("train-images-idx3-ubyte", (28, 28)), ("train-labels-idx1-ubyte", ())):
    raw = gzip.open(os.path.join(src, name + ".gz")).read()
    head = 4 + 4 * (1 + len(shape))
    size = 1
    for d in shape:
        size *= d
    out = raw[:4] + struct.pack(">I", n) + raw[8:head] + raw[head:head + n * size]
    open(os.path.join(dst, name), "wb").write(out)
PY
export CDDP_DATA="$scratch/data" CDDP_LOG_LEVEL=error
cd "$scratch"
for prefix in /usr/local /opt/cddp; do
    cmake --install "$build" --prefix "$prefix" > install.out 2>&1 || { cat install.out; fail "installing into $prefix failed"; }
    if [ "$prefix" = /usr/local ]; then
        grep -q "cddp: ran ldconfig: programs find libcddp.so.0 in /usr/local/lib" install.out ||
            { cat install.out; fail "installing into /usr/local did not run ldconfig"; }
    else
        grep -q "cddp: /opt/cddp/lib is not a folder the loader searches" install.out ||
            { cat install.out; fail "installing into /opt/cddp did not say what to do"; }
        export PKG_CONFIG_PATH=/opt/cddp/lib/pkgconfig
    fi
    rm -f a.out model.safetensors
    # shellcheck disable=SC2046
    cc train.c $(pkg-config --cflags --libs cddp) || fail "the README's program does not build against $prefix"
    ./a.out > run.out 2>&1 || { cat run.out; fail "the README's program, installed in $prefix, exited $?"; }
    grep -q "^step 0: loss " run.out && [ -s model.safetensors ] || { cat run.out; fail "the README's program did not train"; }
    "$prefix/bin/cddprun" --standalone --nproc_per_node 1 ./a.out > launched.out 2>&1 ||
        { cat launched.out; fail "the README's program under $prefix/bin/cddprun exited $?"; }
done
echo "ok: README.md's program builds with pkg-config and runs, alone and under cddprun, after installing into /usr/local (ldconfig ran) and /opt/cddp (the run path in the pkg-config line)"
