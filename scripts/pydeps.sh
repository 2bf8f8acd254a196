#!/bin/sh
# Installs what the tests need from PyPI, once, into a virtual environment in the source tree:
# TensorBoard, whose own reader checks the event files cddp writes (tests/tools/tensorboard_test.sh),
# and Hugging Face's tokenizers, whose ids cddp's tokenizer must give (tests/tokenizer/).
#
# Usage: scripts/pydeps.sh
#
# .pyenv/ (git ignores it) is made with Debian's python3 and sees its packages (NumPy, PyTorch);
# every build folder's tests use it. Nothing is installed outside it, and nothing is fetched when
# it already has both.
set -eu
env=$(cd "$(dirname "$0")/.." && pwd)/.pyenv
[ -x "$env/bin/python" ] && "$env/bin/python" -c "import tensorboard, tokenizers" 2>/dev/null && exit 0
rm -rf "$env"
/usr/bin/python3 -m venv --system-site-packages "$env"
echo "cddp: installing TensorBoard and tokenizers from PyPI into $env (for the tests)"
if ! "$env/bin/pip" install -q --disable-pip-version-check "tensorboard>=2.14,<3" "tokenizers>=0.19,<1"; then
    echo "cddp: cannot install TensorBoard and tokenizers from PyPI; the tests that read cddp's" >&2
    echo "cddp: event files and compare its tokenizer with them need them. Check the network (or a PyPI mirror: PIP_INDEX_URL), then run make test again." >&2
    rm -rf "$env"
    exit 1
fi
