#!/bin/sh
# Installs what the tests need from PyPI, once, into a virtual environment in the source tree:
# TensorBoard, whose own reader checks the event files cddp writes (tests/tools/tensorboard_test.sh).
#
# Usage: scripts/pydeps.sh
#
# .pyenv/ (git ignores it) is made with Debian's python3 and sees its packages (NumPy, PyTorch);
# every build folder's tests use it. Nothing is installed outside it, and nothing is fetched when
# it already has TensorBoard.
set -eu
env=$(cd "$(dirname "$0")/.." && pwd)/.pyenv
[ -x "$env/bin/python" ] && "$env/bin/python" -c "import tensorboard" 2>/dev/null && exit 0
rm -rf "$env"
/usr/bin/python3 -m venv --system-site-packages "$env"
echo "cddp: installing TensorBoard from PyPI into $env (for the tests)"
if ! "$env/bin/pip" install -q --disable-pip-version-check "tensorboard>=2.14,<3"; then
    echo "cddp: cannot install TensorBoard from PyPI; the test that reads cddp's event files with" >&2
    echo "cddp: it needs it. Check the network (or a PyPI mirror: PIP_INDEX_URL), then run make test again." >&2
    rm -rf "$env"
    exit 1
fi
