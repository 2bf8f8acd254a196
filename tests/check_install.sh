#!/bin/sh
# check_install.sh SOURCE_DIR BUILD_DIR: installs cddp into a temporary prefix, then builds and
# runs a consumer project with CMake's find_package (shared and static) and with pkg-config.
set -eu
src=$1 ; build=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/cddp/cddp.h lib/libcddp.a lib/pkgconfig/cddp.pc lib/cmake/cddp/cddpConfig.cmake; do
    [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
ls "$prefix"/lib/libcddp.so* >/dev/null || { echo "FAIL: no shared library installed"; exit 1; }
# the library's own seams between its modules are not part of what it installs
[ ! -e "$prefix/include/cddp/internal" ] || { echo "FAIL: include/cddp/internal/ was installed"; exit 1; }
! grep -rq "cddp/internal/" "$prefix/include/cddp" || { echo "FAIL: an installed header includes cddp/internal/"; exit 1; }
cmake -S "$src/tests/install" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
"$prefix/consumer/consumer"
"$prefix/consumer/consumer_static"
# shellcheck disable=SC2046
cc -std=c11 "$src/tests/install/consumer.c" -o "$prefix/pc_consumer" \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs cddp) -Wl,-rpath,"$prefix/lib"
"$prefix/pc_consumer"
echo "ok: find_package(cddp) and pkg-config cddp both build and run a consumer"
