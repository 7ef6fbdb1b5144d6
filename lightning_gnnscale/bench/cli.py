"""Command line of the benchmark harness; every argument is checked before any work starts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra.errors import HydraException

from ..systems.registry import SYSTEMS as STRATEGIES
from ..tasks import TASKS
from .bytegnn_partition import run_bytegnn_partition_bench
from .cluster import add_cluster_parser, run_cluster_command
from .compare import compose_configs, run_compare
from .e2e import E2ESettings, compose_run, run_e2e
from .granndis import run_granndis_e4_bench
from .grappa import run_grappa_bench
from .memory import MemorySettings, default_strategies, plan_jobs, rebuild_report, run_memory
from .partitions import run_partition_bench
from .sampler import run_sampler_bench
from .sancus import compose_variants, run_sancus_bench


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _int_list(text: str) -> list[int]:
    """``15,10,5`` -> ``[15, 10, 5]``, each >= 1."""
    try:
        return [_positive_int(part) for part in text.split(",")]
    except ValueError as err:  # int() of a non-number
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from err


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_gnnscale.bench",
        description="Benchmarks of lightning_gnnscale (see docs/benchmarks.md).",
    )
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{compare,e2e,sampler,sancus,grappa,partitions,bytegnn-partitions,granndis-e4,"
        "cluster,memory}",
    )

    compare = commands.add_parser(
        "compare",
        help="train several strategies side by side and tabulate them",
        description="Train each strategy on the same dataset, model, seed and partition cache; "
        "write results.md, results.json, accuracy_vs_time.png and "
        "bytes_by_category.png into --out.",
    )
    compare.add_argument(
        "--strategies",
        required=True,
        help=f"comma-separated strategy names; valid: {','.join(STRATEGIES)}",
    )
    compare.add_argument("--model", default="gcn", help="model config group (default: gcn)")
    compare.add_argument("--dataset", default="sbm", help="dataset config group (default: sbm)")
    compare.add_argument(
        "--epochs", type=_positive_int, default=10, help="training epochs per run (default: 10)"
    )
    compare.add_argument(
        "--devices",
        type=_positive_int,
        default=2,
        help="processes for multi-process strategies; single-process ones "
        "(single) always use 1 (default: 2)",
    )
    compare.add_argument("--seed", type=int, default=0, help="seed of every run (default: 0)")
    compare.add_argument(
        "--baseline",
        help="strategy the ratios are taken against (default: ddp if listed, "
        "else the first strategy)",
    )
    compare.add_argument(
        "--out",
        type=Path,
        default=Path("results/compare"),
        help="output directory (default: results/compare)",
    )
    compare.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".cache/lightning_gnnscale"),
        help="paths.cache_dir shared by every run, so partitioning systems "
        "reuse one partition (default: .cache/lightning_gnnscale)",
    )
    compare.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override passed to every run, after the bench's own "
        "(repeatable), e.g. --override dataset.num_nodes=50000",
    )

    sancus = commands.add_parser(
        "sancus",
        help="every SANCUS staleness policy against the exact broadcast baseline",
        description="Train CAGNET (bound 0, with and without X caching) and every SANCUS "
        "policy on the same data; write results.md and results.json into --out.",
    )
    sancus.add_argument("--dataset", default="sbm", help="dataset config group (default: sbm)")
    sancus.add_argument(
        "--epochs", type=_positive_int, default=100, help="epochs per run (default: 100)"
    )
    sancus.add_argument(
        "--devices", type=_positive_int, default=2, help="ranks per run (default: 2)"
    )
    sancus.add_argument("--seed", type=int, default=0, help="seed of every run (default: 0)")
    sancus.add_argument("--out", type=Path, default=Path("results/sancus"), help="output directory")
    sancus.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override passed to every run (repeatable)",
    )

    sampler = commands.add_parser(
        "sampler",
        help="time the neighbour sampler against baselines",
        description="Time the suite's NeighborSampler, a plain vectorised torch sampler and "
        "(when pyg_lib or torch_sparse is importable) PyG's NeighborLoader on one "
        "graph with the same seed batches; write sampler.md and sampler.json.",
    )
    sampler.add_argument(
        "--graph",
        choices=("rmat", "uniform"),
        default="rmat",
        help="rmat: Graph500 R-MAT stored undirected, as dataset=rmat; uniform: uniform random "
        "directed edges, the graph of the sampler yardstick in docs/benchmarks.md (default: rmat)",
    )
    sampler.add_argument(
        "--nodes",
        type=_positive_int,
        default=1 << 20,
        help="nodes (default: 2^20 = 1,048,576)",
    )
    sampler.add_argument(
        "--edges",
        type=_positive_int,
        default=1 << 24,
        help="directed edges drawn, before symmetrisation (rmat) and merging of duplicates "
        "(default: 2^24 = 16,777,216)",
    )
    sampler.add_argument(
        "--fanouts",
        type=_int_list,
        default=[15, 10, 5],
        help="neighbours per hop from the seeds (default: 15,10,5)",
    )
    sampler.add_argument(
        "--batch-size", type=_positive_int, default=1024, help="seeds per batch (default: 1024)"
    )
    sampler.add_argument(
        "--batches", type=_positive_int, default=50, help="timed batches per sampler (default: 50)"
    )
    sampler.add_argument(
        "--warmup",
        type=_positive_int,
        default=2,
        help="untimed warm-up batches per sampler (default: 2)",
    )
    sampler.add_argument(
        "--threads", type=_positive_int, default=1, help="torch threads (default: 1)"
    )
    sampler.add_argument(
        "--seed", type=int, default=0, help="seed of the graph and the batches (default: 0)"
    )
    sampler.add_argument(
        "--out",
        type=Path,
        default=Path("results/sampler"),
        help="output directory (default: results/sampler)",
    )
    grappa = commands.add_parser(
        "grappa",
        help="Grappa's gradient bytes vs conventional neighbour traffic (Table 1 analogue)",
        description="Count, on the same sampled batches, the neighbour traffic of partitioned "
        "mini-batch training (remote input rows + sampling structure) and Grappa's gradient "
        "all-reduce bytes per partition per epoch; write grappa_traffic.md and .json.",
    )
    grappa.add_argument("--dataset", default="sbm", choices=["sbm", "rmat"])
    grappa.add_argument("--nodes", type=_positive_int, default=20000, help="graph nodes")
    grappa.add_argument("--features", type=_positive_int, default=128, help="feature width")
    grappa.add_argument("--parts", type=_int_list, default=[2, 4, 8], help="partition counts")
    grappa.add_argument("--depths", type=_int_list, default=[2, 3, 4], help="model depths (2-4)")
    grappa.add_argument("--batch-size", type=_positive_int, default=1000, help="global seeds")
    grappa.add_argument("--hidden", type=_positive_int, default=128)
    grappa.add_argument("--partitioning", default="random,metis", help="random and/or metis")
    grappa.add_argument("--seed", type=int, default=0)
    grappa.add_argument("--out", type=Path, default=Path("results/grappa"))
    e2e = commands.add_parser(
        "e2e",
        help="training time per epoch: strategies vs a hand-written loop (and DGL's)",
        description="Train each sampled strategy, a hand-written loop on strategy=single's "
        "batches (and DGL's loop when dgl is importable) on one sbm graph, with each dropout; "
        "report training time per epoch (evaluation apart), speed-ups and the top operators of "
        "a profile; write e2e.md, e2e.json and e2e.png (matplotlib) into --out.",
    )
    e2e_defaults = E2ESettings()
    e2e.add_argument(
        "--strategies",
        default=",".join(e2e_defaults.strategies),
        help="comma-separated sampled strategies (default: single,ddp)",
    )
    e2e.add_argument("--model", default=e2e_defaults.model, help="model (default: sage)")
    e2e.add_argument("--nodes", type=_positive_int, default=e2e_defaults.nodes)
    e2e.add_argument("--avg-degree", type=float, default=e2e_defaults.avg_degree)
    e2e.add_argument("--features", type=_positive_int, default=e2e_defaults.features)
    e2e.add_argument("--hidden", type=_positive_int, default=e2e_defaults.hidden)
    e2e.add_argument("--layers", type=_positive_int, default=e2e_defaults.num_layers)
    e2e.add_argument("--fanouts", type=_int_list, default=list(e2e_defaults.fanouts))
    e2e.add_argument("--batch-size", type=_positive_int, default=e2e_defaults.batch_size)
    e2e.add_argument(
        "--epochs", type=_positive_int, default=e2e_defaults.epochs, help="epochs per runner"
    )
    e2e.add_argument(
        "--dropouts", default="0.5,0", help="comma-separated dropout values (default: 0.5,0)"
    )
    e2e.add_argument(
        "--devices", type=_positive_int, default=e2e_defaults.devices, help="ddp processes"
    )
    e2e.add_argument(
        "--threads", type=_positive_int, default=1, help="torch threads per process (default: 1)"
    )
    e2e.add_argument(
        "--profile-steps",
        type=int,
        default=e2e_defaults.profile_steps,
        help="steps of the hand-written loop profiled per dropout (0: no profile)",
    )
    e2e.add_argument("--seed", type=int, default=0)
    e2e.add_argument(
        "--task",
        choices=sorted(TASKS),
        default=e2e_defaults.task,
        help="what every runner trains (default: node_classification; link_prediction: DGL's "
        "loop is as_edge_prediction_sampler with a uniform negative sampler)",
    )
    e2e.add_argument(
        "--accelerator",
        choices=["cpu", "gpu"],
        default="cpu",
        help="where every runner trains (gpu: CUDA; the no-sync multi-process loop, DGL's loop "
        "and the CPU mask benchmark are skipped)",
    )
    e2e.add_argument("--out", type=Path, default=Path("results/e2e"))
    partitions = commands.add_parser(
        "partitions",
        help="compare GSplit's split functions by measured cross-split edges",
        description="Fit each GSplit partitioner on pre-sampled epochs of an SBM graph and "
        "measure cross-split edges and load imbalance on fresh epochs; write partitions.md "
        "and partitions.json.",
    )
    partitions.add_argument("--nodes", type=_positive_int, default=10000, help="SBM nodes")
    partitions.add_argument("--train-frac", type=float, default=0.3, help="training share")
    partitions.add_argument(
        "--fanouts",
        type=_int_list,
        default=[10, 10],
        help="neighbours per hop from the seeds (default: 10,10)",
    )
    partitions.add_argument("--batch-size", type=_positive_int, default=1024)
    partitions.add_argument(
        "--parts", type=_int_list, default=[2, 4], help="numbers of splits (default: 2,4)"
    )
    partitions.add_argument("--presample-epochs", type=_positive_int, default=10)
    partitions.add_argument("--eval-epochs", type=_positive_int, default=5)
    partitions.add_argument("--seed", type=int, default=0)
    partitions.add_argument("--out", type=Path, default=Path("results/partitions"))
    e4 = commands.add_parser(
        "granndis-e4",
        help="GraNNDIS E4: vertices and activation memory per step, MB_base vs CoB",
        description="Count one step of MB_base (a GraphSAGE MFG per worker) against GraNNDIS "
        "cooperative batching (CoB-SAGE, CoB-EAS) for the same targets on an SBM graph at "
        "several depths; write granndis_e4.md and granndis_e4.json.",
    )
    # Defaults where one MFG per worker does not yet cover the graph at 3 layers, so the table
    # shows the gap growing with depth (at 20k nodes / degree 20 / 1024 seeds both saturate).
    e4.add_argument("--nodes", type=_positive_int, default=100_000, help="SBM nodes")
    e4.add_argument("--avg-degree", type=float, default=10.0, help="SBM mean degree")
    e4.add_argument("--layers", type=_int_list, default=[3, 8], help="depths (default: 3,8)")
    e4.add_argument("--servers", type=_positive_int, default=2)
    e4.add_argument("--workers", type=_positive_int, default=2, help="workers per server")
    e4.add_argument("--batch-per-worker", type=_positive_int, default=64)
    e4.add_argument("--fanout", type=_positive_int, default=25, help="MB_base / CoB-SAGE fanout")
    e4.add_argument("--hidden", type=_positive_int, default=64)
    e4.add_argument(
        "--eas-hops", type=_nonnegative_int, default=1, help="EAS hops h (0: Cluster-GCN)"
    )
    e4.add_argument("--eas-fanout", type=_positive_int, default=15)
    e4.add_argument("--seed", type=int, default=0)
    e4.add_argument("--out", type=Path, default=Path("results/granndis_e4"))
    khop = commands.add_parser(
        "bytegnn-partitions",
        help="compare ByteGNN's K-hop block partitioner with random and METIS",
        description="Partition an SBM (every vertex labelled), a sparsely labelled SBM and "
        "Cora (when --cora-root holds it) with bytegnn, random, metis and metis_balanced; "
        "write bytegnn_partition.md and bytegnn_partition.json.",
    )
    khop.add_argument(
        "--nodes", type=_positive_int, default=100_000, help="SBM nodes (default: 100000)"
    )
    khop.add_argument("--parts", type=_int_list, default=[2, 4], help="part counts (default: 2,4)")
    khop.add_argument(
        "--hops",
        type=_positive_int,
        default=2,
        help="K of the blocks and of the locality report (default: 2)",
    )
    khop.add_argument("--seed", type=int, default=0)
    khop.add_argument(
        "--cora-root",
        type=Path,
        default=None,
        help="dataset root holding Cora/raw/ (e.g. /work/shared/datasets/planetoid); "
        "Cora is skipped without it",
    )
    khop.add_argument("--out", type=Path, default=Path("results/bytegnn_partition"))
    add_cluster_parser(commands)
    memory = commands.add_parser(
        "memory",
        help="peak RSS per rank, of the launcher and the rank server, and the node's PSS "
        "total, of every system at several world sizes",
        description="Run every system (python train.py, one process tree per job) at each P "
        "on one sbm graph, from a partition directory where the system supports one; sample "
        "every process of each job; write memory.md, memory.json and memory.png into --out.",
    )
    memory_defaults = MemorySettings()
    memory.add_argument(
        "--strategies",
        default=",".join(default_strategies()),
        help="comma-separated strategy names (single, the reference, always runs; default: "
        "one name per system)",
    )
    memory.add_argument(
        "--parts", type=_int_list, default=list(memory_defaults.parts), help="world sizes"
    )
    memory.add_argument("--nodes", type=_positive_int, default=memory_defaults.nodes)
    memory.add_argument("--features", type=_positive_int, default=memory_defaults.features)
    memory.add_argument("--avg-degree", type=float, default=memory_defaults.avg_degree)
    memory.add_argument(
        "--runtime-nodes",
        type=_positive_int,
        default=memory_defaults.runtime_nodes,
        help="nodes of the tiny graph whose footprint is the runtime term",
    )
    memory.add_argument(
        "--steps", type=_positive_int, default=memory_defaults.steps, help="training steps per job"
    )
    memory.add_argument(
        "--interval", type=float, default=memory_defaults.interval_s, help="sampling period (s)"
    )
    memory.add_argument(
        "--timeout", type=float, default=memory_defaults.timeout_s, help="seconds per job"
    )
    memory.add_argument("--seed", type=int, default=0)
    memory.add_argument(
        "--no-evaluation",
        action="store_true",
        help="training steps only (default: each job validates and tests after them, so the "
        "peaks include evaluation)",
    )
    memory.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra train.py override for every job (repeatable)",
    )
    memory.add_argument("--out", type=Path, default=Path("results/memory"))
    memory.add_argument(
        "--fresh",
        action="store_true",
        help="run every job again (default: a job --out already holds, finished with the same "
        "command, is read back; so an interrupted or extended bench runs only what is missing)",
    )
    memory.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild memory.md / .json / .png from --out's memory.json and its runs' "
        "summary.json files, running nothing",
    )
    return parser


def _strategies(parser: argparse.ArgumentParser, text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        parser.error(
            f"unknown strategy {', '.join(map(repr, unknown))}; valid: {', '.join(STRATEGIES)}"
        )
    if not names or len(set(names)) != len(names):
        parser.error(f"--strategies needs distinct names, got {text!r}")
    return names


def _composed(parser: argparse.ArgumentParser, compose, *args, **kwargs):
    """``compose(*args, **kwargs)``; a bad override or value becomes a usage error before any
    training starts."""
    try:
        return compose(*args, **kwargs)
    except (HydraException, ValueError) as err:  # ConfigError is a ValueError
        parser.error(f"bad configuration: {err}")


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments), run the subcommand, return 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "cluster":
        return run_cluster_command(parser, args, argv)
    if args.command == "memory":
        if args.report_only:
            if not (args.out / "memory.json").is_file():
                parser.error(f"--report-only: no memory.json in {args.out}")
            rebuild_report(args.out)
            return 0
        if args.interval <= 0 or args.timeout <= 0:
            parser.error("--interval and --timeout must be > 0")
        settings = MemorySettings(
            strategies=tuple(_strategies(parser, args.strategies)),
            parts=tuple(dict.fromkeys(args.parts)),
            nodes=args.nodes,
            features=args.features,
            avg_degree=args.avg_degree,
            runtime_nodes=args.runtime_nodes,
            steps=args.steps,
            interval_s=args.interval,
            timeout_s=args.timeout,
            seed=args.seed,
            overrides=tuple(args.override),
            evaluation=not args.no_evaluation,
        )
        jobs = _composed(parser, plan_jobs, settings, args.out.resolve())  # bad override: usage
        run_memory(settings, args.out, argv, jobs, fresh=args.fresh)
        return 0
    if args.command == "grappa":
        methods = [m.strip() for m in args.partitioning.split(",") if m.strip()]
        if not methods or set(methods) - {"random", "metis"}:
            parser.error(f"--partitioning {args.partitioning!r}: valid: random, metis")
        if set(args.depths) - {2, 3, 4}:
            parser.error(f"--depths {args.depths}: valid: 2, 3, 4 (the paper's fanouts)")
        run_grappa_bench(
            args.dataset,
            args.nodes,
            args.features,
            args.parts,
            args.depths,
            args.batch_size,
            args.hidden,
            methods,
            args.seed,
            args.out,
            argv,
        )
        return 0
    if args.command == "granndis-e4":
        if args.avg_degree < 0:
            parser.error(f"--avg-degree {args.avg_degree} must be >= 0")
        run_granndis_e4_bench(
            nodes=args.nodes,
            avg_degree=args.avg_degree,
            layers=args.layers,
            servers=args.servers,
            workers=args.workers,
            batch_per_worker=args.batch_per_worker,
            fanout=args.fanout,
            hidden=args.hidden,
            eas_hops=args.eas_hops,
            eas_fanout=args.eas_fanout,
            seed=args.seed,
            out=args.out,
            argv=argv,
        )
        return 0
    if args.command == "partitions":
        if not 0 < args.train_frac <= 1:
            parser.error(f"--train-frac {args.train_frac} must be in (0, 1]")
        run_partition_bench(
            nodes=args.nodes,
            train_frac=args.train_frac,
            fanouts=args.fanouts,
            batch_size=args.batch_size,
            num_parts=args.parts,
            presample_epochs=args.presample_epochs,
            eval_epochs=args.eval_epochs,
            seed=args.seed,
            out=args.out,
            argv=argv,
        )
        return 0
    if args.command == "bytegnn-partitions":
        run_bytegnn_partition_bench(
            nodes=args.nodes,
            num_parts=args.parts,
            hops=args.hops,
            seed=args.seed,
            cora_root=args.cora_root,
            out=args.out,
            argv=argv,
        )
        return 0
    if args.command == "sancus":
        variants = _composed(
            parser,
            compose_variants,
            dataset=args.dataset,
            epochs=args.epochs,
            devices=args.devices,
            seed=args.seed,
            overrides=args.override,
            out=args.out.resolve(),
        )
        run_sancus_bench(variants, args.out.resolve(), argv)
        return 0
    if args.command == "e2e":
        try:
            dropouts = tuple(float(d) for d in args.dropouts.split(","))
        except ValueError:
            parser.error(f"--dropouts {args.dropouts!r}: expected comma-separated numbers")
        if any(not 0 <= d < 1 for d in dropouts):
            parser.error(f"--dropouts {args.dropouts!r}: each must be in [0, 1)")
        settings = E2ESettings(
            strategies=tuple(_strategies(parser, args.strategies)),
            model=args.model,
            nodes=args.nodes,
            avg_degree=args.avg_degree,
            features=args.features,
            hidden=args.hidden,
            num_layers=args.layers,
            fanouts=tuple(args.fanouts),
            batch_size=args.batch_size,
            epochs=args.epochs,
            dropouts=dropouts,
            devices=args.devices,
            threads=args.threads,
            profile_steps=max(0, args.profile_steps),
            seed=args.seed,
            accelerator=args.accelerator,
            task=args.task,
        )
        for dropout in dropouts:  # every config is checked before any training
            for strategy in (*settings.strategies, "single"):
                _composed(parser, compose_run, settings, strategy, dropout, args.out.resolve())
        run_e2e(settings, args.out, argv)
        return 0
    if args.command == "sampler":
        if args.batch_size > args.nodes:
            parser.error(f"--batch-size {args.batch_size} exceeds --nodes {args.nodes}")
        run_sampler_bench(
            graph=args.graph,
            nodes=args.nodes,
            edges=args.edges,
            fanouts=args.fanouts,
            batch_size=args.batch_size,
            batches=args.batches,
            warmup=args.warmup,
            threads=args.threads,
            seed=args.seed,
            out=args.out,
            argv=argv,
        )
        return 0

    strategies = _strategies(parser, args.strategies)
    baseline = args.baseline or ("ddp" if "ddp" in strategies else strategies[0])
    if baseline not in strategies:
        parser.error(f"--baseline {baseline!r} is not among --strategies {strategies}")
    configs = _composed(
        parser,
        compose_configs,
        strategies,
        model=args.model,
        dataset=args.dataset,
        epochs=args.epochs,
        devices=args.devices,
        seed=args.seed,
        overrides=args.override,
        out=args.out.resolve(),
        cache_dir=args.cache_dir.resolve(),
    )
    run_compare(configs, baseline, args.out, argv)
    return 0
