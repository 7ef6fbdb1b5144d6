#!/usr/bin/env bash
# The GPU check (issue 26), one command: bash scripts/gpu_check.sh OUT_DIR
#
# Finds a Python whose torch sees a CUDA GPU ($PYTHON, else .venv/bin/python, else python3);
# when none has one, makes .venv with a CUDA build of torch from download.pytorch.org
# ($TORCH_CUDA_INDEX, default cu124). Installs what else is missing: from the wheels in
# $GPU_CHECK_WHEELS when set (a machine without a registry; installed with --no-index into
# .gpu-check-site), else with pip from the registry (the suite and its dev extra, which keeps
# the CUDA torch). Then runs scripts/gpu_check.py: every strategy on CUDA, `pytest -m gpu`, and
# `bench e2e --accelerator gpu`, writing OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR}
has_cuda() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
PY=""
for candidate in ${PYTHON:-} .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1 && has_cuda "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
    echo "gpu-check: no Python here sees a CUDA GPU; installing a CUDA torch into .venv"
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install --quiet torch \
        --index-url "https://download.pytorch.org/whl/${TORCH_CUDA_INDEX:-cu124}" || exit 1
    PY=.venv/bin/python
    has_cuda "$PY" || { echo "gpu-check: torch still sees no CUDA GPU (driver?)" >&2; exit 1; }
fi
needed="import lightning, torch_geometric, hydra, omegaconf, pymetis, psutil"
if ! "$PY" -c "$needed" 2>/dev/null; then
    if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
        "$PY" -m pip install --quiet --no-index --no-deps --no-compile --upgrade \
            --target .gpu-check-site "$GPU_CHECK_WHEELS"/*.whl || exit 1
        export PYTHONPATH="$PWD/.gpu-check-site${PYTHONPATH:+:$PYTHONPATH}"
    else
        "$PY" -m pip install --quiet -e ".[dev]" || exit 1
    fi
    "$PY" -c "$needed" || { echo "gpu-check: still missing a package (above)" >&2; exit 1; }
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu-check: $("$PY" -c 'import torch, lightning, torch_geometric as g; print(f"torch {torch.__version__}, lightning {lightning.__version__}, pyg {g.__version__}, {torch.cuda.get_device_name(0)}")')"
exec "$PY" scripts/gpu_check.py "$out" "${@:2}"
