#!/bin/sh
# Installs what the tests need from PyPI, once, into a virtual environment in the source tree:
# TensorBoard, whose own reader checks the event files cddp writes (tests/tools/tensorboard_test.sh),
# Hugging Face's tokenizers, whose ids cddp's tokenizer must give, and transformers, which must
# load the GPT-2 that cddp exports (tests/tokenizer/). transformers 4.45 is the last that runs on
# Debian's PyTorch 1.13.
#
# Usage: scripts/pydeps.sh
#
# .pyenv/ (git ignores it) is made with Debian's python3 and sees its packages (NumPy, PyTorch);
# every build folder's tests use it. Nothing is installed outside it, and nothing is fetched when
# it already has them.
set -eu
env=$(cd "$(dirname "$0")/.." && pwd)/.pyenv
[ -x "$env/bin/python" ] && "$env/bin/python" -c "import tensorboard, tokenizers, transformers" 2>/dev/null && exit 0
rm -rf "$env"
/usr/bin/python3 -m venv --system-site-packages "$env"
echo "cddp: installing TensorBoard, tokenizers and transformers from PyPI into $env (for the tests)"
if ! "$env/bin/pip" install -q --disable-pip-version-check "tensorboard>=2.14,<3" "tokenizers>=0.19,<1" \
    "transformers>=4.40,<4.46"; then
    echo "cddp: cannot install TensorBoard, tokenizers and transformers from PyPI; the tests that" >&2
    echo "cddp: read cddp's event files, compare its tokenizer and load its exports need them. Check the network (or a PyPI mirror: PIP_INDEX_URL), then run make test again." >&2
    rm -rf "$env"
    exit 1
fi
