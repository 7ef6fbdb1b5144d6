"""``python -m lightning_gnnscale.cluster --hosts S --bandwidth <Mbit/s|unlimited> -- <overrides>``.

Runs one ``train.py`` job, or with ``-m`` a Hydra multirun, over S emulated hosts
(docs/cluster.md). Every argument is checked, and the machine probed, before anything is
created.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ConfigError
from .job import ClusterJob, ClusterJobFailed, StopRequested, run_job
from .memory import check_cap
from .network import ClusterLeftovers, ClusterUnavailable


def parse_rate(text: str) -> float | None:
    """``unlimited`` -> None; a positive number of Mbit/s otherwise."""
    if text.lower() == "unlimited":
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not rate > 0 or rate != rate or rate == float("inf"):
        raise argparse.ArgumentTypeError(f"expected Mbit/s > 0 or 'unlimited', got {text!r}")
    return rate


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def parse_memory_cap(text: str) -> int:
    """``--memory-mb``: checked by :func:`memory.check_cap`, the cluster's one rule for it."""
    try:
        value = int(text)
    except ValueError:
        value = text  # not an integer: check_cap's message names it
    try:
        return check_cap(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_gnnscale.cluster",
        description="Run one train.py job, or a multirun (-m after --), over emulated hosts "
        "(network namespaces on a bridge, each host's egress shaped with tbf); needs root. "
        "See docs/cluster.md.",
        epilog="example: python -m lightning_gnnscale.cluster --hosts 2 --bandwidth 100 -- "
        "strategy=distdgl trainer.devices=1 dataset.num_nodes=50000",
    )
    parser.add_argument("--hosts", type=_positive(int), required=True, help="emulated hosts")
    parser.add_argument(
        "--bandwidth",
        type=parse_rate,
        required=True,
        metavar="MBIT|unlimited",
        help="each host's egress rate in Mbit/s, or 'unlimited' (no shaping)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="run folder (or hydra.run.dir=...); default outputs/cluster/<date>/<time>_<prefix>",
    )
    parser.add_argument(
        "--timeout-s",
        type=_positive(float),
        default=3600.0,
        help="stop the job (a multirun: all its jobs) and remove the cluster after this long "
        "(default 3600)",
    )
    parser.add_argument(
        "--memory-mb",
        type=parse_memory_cap,
        metavar="MIB",
        help="each host's memory cap in MiB, at least 64 (a cgroup per host: the host is a "
        "machine of that size); default: no cap",
    )
    parser.add_argument(
        "--prefix",
        help="name prefix of the namespaces, links and cgroups: 2-9 lowercase letters/digits, "
        "starting with a letter; one in use is refused (default: lgc + 6 random, unique)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="train.py overrides after --; -m among them: a multirun"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        job = ClusterJob(
            args.hosts,
            args.bandwidth,
            list(args.overrides),
            run_dir=args.run_dir,
            timeout_s=args.timeout_s,
            memory_mb=args.memory_mb,
            **({"prefix": args.prefix} if args.prefix else {}),
        )
        summaries = run_job(job)
    except (ClusterUnavailable, ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ClusterJobFailed, ClusterLeftovers, TimeoutError, StopRequested) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the emulated hosts were removed", file=sys.stderr)
        return 130
    if job.multirun:
        print(
            f"cluster multirun of {len(summaries)} jobs: {job.run_dir} (cluster.json, "
            f"host<i>/<job>/, node 0's summaries in host0/<job>/summary.json, host<i>.log)"
        )
    else:
        print(f"cluster run: {job.run_dir} (summary.json, cluster.json, host<i>/, host<i>.log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
