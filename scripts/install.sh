#!/usr/bin/env bash
# Installs what is missing into .venv (idempotent): a CPU torch, then the package with its
# dev extra. Uses the local torch==2.13.0 CPU wheel when the machine has one, so no CUDA wheels
# are downloaded. GPU users: install your CUDA build of torch into .venv first (see README);
# this script keeps any torch that is already importable.
#
# With the local wheel, one pip call resolves torch and the package together (one resolver
# pass, not two). Pip prefers wheels to source builds and skips byte-compiling every installed
# file: the modules a run imports are compiled on their first import (a fraction of the files).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check --prefer-binary --no-compile)
TORCH=()
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    wheel=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1 || true)
    if [ -n "$wheel" ]; then
        echo "install: torch from local wheel $wheel"
        TORCH=("$wheel")
    else
        echo "install: torch==2.13.0 (CPU build)"
        "${PIP[@]}" torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
            --extra-index-url https://pypi.org/simple
    fi
fi
"${PIP[@]}" "${TORCH[@]}" -e ".[dev]"
echo "install: ok ($(.venv/bin/python -c 'import torch, lightning, torch_geometric as g; print(f"torch {torch.__version__}, lightning {lightning.__version__}, pyg {g.__version__}")'))"
