#!/bin/sh
# check_readme_example.sh SOURCE_DIR BUILD_DIR: the first C program in README.md must compile
# against the built library and train without error (it writes model.safetensors in a
# temporary folder). CDDP_EXAMPLE_CFLAGS carries the sanitizer flags of a sanitizer build.
set -eu
src=$1 ; build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -n '/^```c$/,/^```$/p' "$src/README.md" | sed '1d;$d' | awk 'NR==1,/^}$/' > "$work/train.c"
grep -q 'cddp_backward' "$work/train.c" || { echo "FAIL: no C program found in README.md"; exit 1; }
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror ${CDDP_EXAMPLE_CFLAGS:-} -I"$src/include" "$work/train.c" -o "$work/train" \
    "$build/lib/libcddp.a" $(pkg-config --libs openblas) -lz -lcjson -lm -lpthread
cd "$work" && ./train
test -s model.safetensors || { echo "FAIL: the example wrote no checkpoint"; exit 1; }
echo "ok: README's example built, trained and saved model.safetensors"
