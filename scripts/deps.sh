#!/bin/sh
# Installs the Debian packages a make target needs, and nothing when they are all present.
#
# Usage: scripts/deps.sh build|test|demo|demo-gpt|bench|gpu
#        scripts/deps.sh --list build|test|demo|demo-gpt|bench|gpu   (print the target's packages, install nothing)
#
# Each target names the packages it needs; the script asks dpkg which are missing. If none are,
# it does nothing (apt is never called). If some are and we are root, it runs `apt-get update`
# once and installs them quietly. If we are not root, it prints the exact command to run and
# exits 1 so that make stops before a confusing compiler error.
set -eu

build_pkgs="cmake make gcc pkg-config libopenblas-dev libdnnl-dev nettle-dev zlib1g-dev libcjson-dev \
libpcre2-dev"
# The tests also run a PyTorch script under cddprun (python3-torch) and render SVG curves the way
# a user would look at them (librsvg2-bin's rsvg-convert). The GPT's corpus is Debian's fortunes.
# CI fuzzes the readers with clang's libFuzzer (clang, libclang-rt-14-dev). A real Slurm runs on
# this host for the srun and sbatch tests (munge, slurmctld, slurmd, slurm-client); cddprun
# --hosts is tested over ssh, with an sshd of its own in each emulated host (openssh-server,
# openssh-client). The GPU check's scripts are held to shellcheck's rules (shellcheck). TensorBoard,
# which reads the event files back, comes from PyPI into a virtual environment (python3-venv;
# scripts/pydeps.sh).
test_pkgs="$build_pkgs libcmocka-dev dataset-fashion-mnist python3-numpy libopenmpi-dev openmpi-bin \
python3-torch librsvg2-bin fortunes clang libclang-rt-14-dev munge slurmctld slurmd slurm-client \
python3-venv openssh-client openssh-server shellcheck"
demo_pkgs="$build_pkgs dataset-fashion-mnist"
demo_gpt_pkgs="$build_pkgs fortunes"
bench_pkgs="$test_pkgs stress-ng"  # PyTorch and Open MPI are the peers; stress-ng loads a core
# scripts/gpu/prepare.sh: the programs of the GPU check (device_check is built with the tests) and
# the data they train on.
gpu_pkgs="$build_pkgs libcmocka-dev dataset-fashion-mnist fortunes python3"

list=false
if [ "${1:-}" = "--list" ]; then
    list=true
    shift
fi
case "${1:-}" in
build) want=$build_pkgs ;;
test) want=$test_pkgs ;;
demo) want=$demo_pkgs ;;
demo-gpt) want=$demo_gpt_pkgs ;;
bench) want=$bench_pkgs ;;
gpu) want=$gpu_pkgs ;;
*)
    echo "usage: $0 [--list] build|test|demo|demo-gpt|bench|gpu" >&2
    exit 2
    ;;
esac
if $list; then
    echo $want
    exit 0
fi

missing=""
for p in $want; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
    esac
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "cddp: missing Debian packages:$missing" >&2
    echo "cddp: install them as root, then run make again:" >&2
    echo "    apt-get update && apt-get install -y$missing" >&2
    exit 1
fi

echo "cddp: installing missing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "cddp: installed:$missing"
