#!/usr/bin/env bash
# Installs what is missing into .venv (idempotent): a CPU torch, then the package with its
# dev extra. Uses the local torch==2.13.0 CPU wheel when the machine has one, so no CUDA wheels
# are downloaded. GPU users: install your CUDA build of torch into .venv first (see README);
# this script keeps any torch that is already importable.
#
# The packages are installed by uv (pip-installed into the venv first, a few seconds): it
# resolves and installs the same versions as pip in about a tenth of the time (10 s against
# 101 s for a fresh .venv here), which is most of CI's install. With the local wheel, one call
# resolves torch and the package together. Installed files are byte-compiled here: with
# PYTHONDONTWRITEBYTECODE=1 (set on these machines and in CI) Python never writes a .pyc, so
# without them every interpreter (each test's train.py, each cold rank server) compiled torch,
# Lightning and PyG again: 33 s for `import torch, lightning, torch_geometric` against 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "uv>=0.5,<1"
# uv reads no pip.conf: pass this machine's local wheel folder (as pip's find-links) on.
FIND_LINKS=()
[ -d /opt/wheels ] && FIND_LINKS=(--find-links /opt/wheels)
PIP=(.venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "${FIND_LINKS[@]}")
TORCH=()
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    wheel=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1 || true)
    if [ -n "$wheel" ]; then
        echo "install: torch from local wheel $wheel"
        TORCH=("$wheel")
    else
        echo "install: torch==2.13.0 (CPU build)"
        "${PIP[@]}" torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
            --extra-index-url https://pypi.org/simple --index-strategy unsafe-best-match
    fi
fi
"${PIP[@]}" "${TORCH[@]}" -e ".[dev]"
# The tests read PyKEEN's knowledge-graph triples (Nations, Kinships) by path, without
# importing pykeen: its wheel alone (730 KB), not its dependencies, which a pyproject extra
# cannot say (docs/testing.md).
"${PIP[@]}" --no-deps "pykeen==1.11.1"
echo "install: ok ($(.venv/bin/python -c 'import torch, lightning, torch_geometric as g; print(f"torch {torch.__version__}, lightning {lightning.__version__}, pyg {g.__version__}")'))"
