"""Issue 38's accuracy target: every strategy's test AUC on Cora link prediction, seeds 0-4.

Runs ``train.py strategy=<s> task=link_prediction dataset=cora seed=<n>`` (the defaults, no
tuning flags) for every strategy and seed, one process each, into ``--out/<s>/seed<n>``; a
run whose ``summary.json`` is there is not run again. Prints and writes ``--out/cora_lp.md``:
each run's test AUC, the means, and each mean's distance to the reference mean (``--reference``,
the PyG script's, docs/benchmarks.md).

    python scripts/link_prediction_cora.py --strategies single,distdgl --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(strategy: str, seed: int, out: Path, root: str, extra: list[str]) -> dict:
    """The run's ``summary.json`` (training it first if it is missing)."""
    folder = out / strategy / f"seed{seed}"
    summary = folder / "summary.json"
    if not summary.exists():
        command = [
            sys.executable,
            str(ROOT / "train.py"),
            f"strategy={strategy}",
            "task=link_prediction",
            "dataset=cora",
            f"dataset.root={root}",
            f"seed={seed}",
            f"hydra.run.dir={folder}",
            "logger=none",
            "trainer.enable_progress_bar=false",
            *extra,
        ]
        print(" ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", required=True, help="comma-separated strategy names")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--root", default=str(ROOT.parent / "shared/datasets/planetoid"))
    parser.add_argument("--reference", type=float, default=0.8996, help="the PyG script's mean")
    parser.add_argument("--out", type=Path, default=ROOT / "results/cora_lp")
    parser.add_argument("override", nargs="*", help="extra train.py overrides for every run")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    auc = {
        s: [run(s, n, args.out, args.root, args.override)["test_auc"] for n in args.seeds]
        for s in strategies
    }
    lines = [
        "| strategy | " + " | ".join(f"seed {n}" for n in args.seeds) + " | mean | vs reference |",
        "|---|" + "---|" * (len(args.seeds) + 2),
    ]
    for s, values in auc.items():
        mean = statistics.mean(values)
        cells = " | ".join(f"{v:.4f}" for v in values)
        lines.append(
            f"| `{s}` | {cells} | **{mean:.4f}** | {100 * (mean - args.reference):+.1f} pt |"
        )
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cora_lp.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
