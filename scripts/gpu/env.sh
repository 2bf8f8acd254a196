# shellcheck shell=bash disable=SC2154 # carry and py: the caller's
# env.sh (sourced by check.sh, quick.sh and profile.sh on the GPU machine, with carry and py set):
# unpacks the carried Debian runtime packages into /tmp/cddp-libs and defines ld (the programs'
# library path: those, cuBLASLt from PyTorch's wheels or the toolkit), CDDP_NCCL_LIBRARY (the
# wheels' NCCL), cddp CMD... (CMD run with it; python3 and PyTorch keep their own libraries) and
# data, the carried data in /tmp/cddp-data with the GPT's corpus unpacked (it travels packed, in
# data/corpus.tar.gz, so that the carry stays under 64 MiB).
libs=/tmp/cddp-libs
rm -rf "$libs" && mkdir -p "$libs"
for d in "$carry"/debs/*.deb; do
    if command -v dpkg >/dev/null; then
        dpkg -x "$d" "$libs"
    else # no dpkg: a .deb is an ar archive holding data.tar.*
        "$py" - "$d" "$libs" <<'EOF'
import io, sys, tarfile
raw = open(sys.argv[1], "rb").read()
at = 8
while at < len(raw):
    name, size = raw[at:at + 16].decode().strip().rstrip("/"), int(raw[at + 48:at + 58])
    if name.startswith("data.tar"):
        safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        tarfile.open(fileobj=io.BytesIO(raw[at + 60:at + 60 + size])).extractall(sys.argv[2], **safe)
    at += 60 + size + (size & 1)
EOF
    fi
done
ld=$libs/usr/lib/x86_64-linux-gnu:$libs/usr/lib/x86_64-linux-gnu/openblas-pthread:$libs/lib/x86_64-linux-gnu
# cuBLASLt: the Python wheels' (GPU.md), else the toolkit's.
NV=$("$py" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) && ld=$NV/cu13/lib:$ld
# NCCL for the nccl transport: the wheels' (libnccl.so.2 by its full path: they have no unversioned name)
[ -n "${NV:-}" ] && [ -f "$NV/nccl/lib/libnccl.so.2" ] && export CDDP_NCCL_LIBRARY=$NV/nccl/lib/libnccl.so.2
[ -d /usr/local/cuda/lib64 ] && ld=$ld:/usr/local/cuda/lib64
# cddp's programs get the carried libraries; python3 (PyTorch) keeps its own.
cddp() { LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
data=/tmp/cddp-data
rm -rf "$data" && mkdir -p "$data"
for f in "$carry"/data/*; do ln -s "$f" "$data/"; done
if [ -f "$carry/data/corpus.tar.gz" ]; then tar -xzf "$carry/data/corpus.tar.gz" -C "$data"; fi
