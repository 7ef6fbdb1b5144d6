#!/usr/bin/env bash
# DGL for `bench e2e`'s DGL loop only, kept out of the project's environment.
#
# Installs dgl 2.1.0 (the newest DGL on PyPI for CPython 3.11) and torchdata 0.7.1 (the last
# with the datapipes DGL imports) into a folder of their own, without dependencies (the suite's
# venv has the rest). DGL ships its graphbolt extension only for torch <= 2.2.1 and imports it
# eagerly; the loop does not use graphbolt, so the copy installed here skips that import with a
# warning. DGL's tensoradapter has no build for torch 2.13 either: DGL then allocates its own
# arrays and hands them over through DLPack, as it says when imported.
#
#   bash scripts/dgl_for_bench.sh [folder]            (default: .dgl-bench)
#   PYTHONPATH=.dgl-bench .venv/bin/python -m lightning_gnnscale.bench e2e
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-.dgl-bench}"
.venv/bin/pip install --quiet --no-deps --target "$target" dgl==2.1.0 torchdata==0.7.1
init="$target/dgl/graphbolt/__init__.py"
if ! grep -q "no graphbolt build for this torch" "$init"; then
    .venv/bin/python - "$init" <<'PY'
import sys

path = sys.argv[1]
text = open(path).read()
call = "\n\nload_graphbolt()"
if call not in text:
    sys.exit(f"{path}: no eager load_graphbolt() call to skip; is this dgl 2.1.0?")
skip = (
    "\n\ntry:\n    load_graphbolt()\n"
    "except (FileNotFoundError, ImportError) as error:  # no graphbolt build for this torch\n"
    "    import warnings\n\n    warnings.warn(str(error))"
)
open(path, "w").write(text.replace(call, skip, 1))
PY
fi
PYTHONPATH="$target" .venv/bin/python -W ignore -c "import dgl; print('dgl', dgl.__version__, 'in $target')"
