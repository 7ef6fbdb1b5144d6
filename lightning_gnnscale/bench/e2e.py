"""``bench e2e``: training time per epoch of sampled strategies against a hand-written loop.

For every dropout setting, the bench trains

- each strategy through ``train(cfg)`` (Lightning, callbacks, metered comm), reading the
  training part of every epoch (``history[].train_epoch_s``: evaluation is reported apart);
- a hand-written loop on the suite's sampler and model, without Lightning: the batches of
  ``strategy=single`` (same seeds, same keys), the same net, optimiser and step seeds;
- the same loop in ``--devices`` processes at once, each on its rank's micro-batches of every
  step (``strategy=ddp``'s split and keys) and without any gradient sync: the ceiling of plain
  data parallelism on this machine, against which ``ddp``'s sync and framework cost shows;
- DGL's idiomatic loop (``dgl.dataloading`` + ``dgl.nn.SAGEConv``, model ``sage`` only) when
  ``dgl`` is importable (``scripts/dgl_for_bench.sh``; never in CI, so no test runs that loop).

It then profiles a few steps of the hand-written loop (top operators by self CPU time) and
writes ``e2e.md``, ``e2e.json`` and, when matplotlib is importable, ``e2e.png``. Every run uses
``--threads`` torch threads per process (``$GNNSCALE_NUM_THREADS`` for the strategies), and every
runner the malloc settings training applies (:mod:`~lightning_gnnscale.cpu_memory`), set once
before the first runner so the loops without Lightning get them too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from ..callbacks.step_seed import seed_step_generators, step_key
from ..cpu_memory import retain_freed_memory
from ..files import write_json_atomic
from ..launch import launch_local
from ..models.layers import row_dropout
from ..preflight import validate
from ..run import THREADS_ENV, build_datamodule, train
from ..tasks import task_spec
from .report import command_line, environment, environment_lines, fmt, markdown_table

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
HAND = "hand-written loop"
UNSYNCED = "hand-written loop, {} processes, no gradient sync"
DGL = "DGL loop"


@dataclass(frozen=True)
class E2ESettings:
    """What ``bench e2e`` trains: an ``sbm`` graph, a model, the sampled batches, the runners."""

    strategies: tuple[str, ...] = ("single", "ddp")
    model: str = "sage"
    nodes: int = 100_000
    avg_degree: float = 10.0
    features: int = 64
    hidden: int = 64
    num_layers: int = 2
    fanouts: tuple[int, ...] = (10, 10)
    batch_size: int = 1024
    epochs: int = 3
    dropouts: tuple[float, ...] = (0.5, 0.0)
    devices: int = 2
    threads: int = 1
    profile_steps: int = 5
    top_ops: int = 8
    seed: int = 0
    accelerator: str = "cpu"
    task: str = "node_classification"


def compose_run(settings: E2ESettings, strategy: str, dropout: float, out: Path) -> DictConfig:
    """The validated run config of one strategy at one dropout (raises on a bad setting)."""
    overrides = [
        f"strategy={strategy}",
        f"model={settings.model}",
        "dataset=sbm",
        f"dataset.num_nodes={settings.nodes}",
        f"dataset.avg_degree={settings.avg_degree}",
        f"dataset.num_features={settings.features}",
        f"model.hidden={settings.hidden}",
        f"model.num_layers={settings.num_layers}",
        f"model.dropout={dropout}",
        f"data.fanouts=[{','.join(map(str, settings.fanouts))}]",
        f"data.batch_size={settings.batch_size}",
        f"trainer.max_epochs={settings.epochs}",
        f"seed={settings.seed}",
        f"task={settings.task}",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"trainer.accelerator={settings.accelerator}",
    ]
    if strategy != "single":
        overrides.append(f"trainer.devices={settings.devices}")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    cfg.paths.root = str(Path.cwd())
    cfg.paths.cache_dir = str(out / "cache")
    cfg.paths.output_dir = str(out / "runs" / f"{strategy}-dropout{dropout:g}")
    validate(cfg)
    return cfg


@contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Torch threads of this process and of the ranks it launches (restored afterwards)."""
    before, env_before = torch.get_num_threads(), os.environ.get(THREADS_ENV)
    torch.set_num_threads(threads)
    os.environ[THREADS_ENV] = str(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if env_before is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = env_before


def _times(values: list[float]) -> dict:
    """Per-epoch seconds and their min / median."""
    return {"epochs_s": values, "min_s": min(values), "median_s": statistics.median(values)}


def run_strategy(cfg: DictConfig) -> dict:
    """Train one strategy; its per-epoch training time, evaluation time and accuracy."""
    metrics, _ = train(cfg)
    if not metrics:
        raise RuntimeError(f"strategy={cfg.strategy.name} wrote no summary.json")
    history = metrics["history"]
    monitor = f"best_val_{task_spec(cfg.task.name).monitor}"
    return {
        **_times([row["train_epoch_s"] for row in history]),
        "eval_s": metrics["eval_time_s"],
        "world_size": metrics["world_size"],
        monitor: metrics[monitor],
        "input_rows_per_epoch": metrics["input_rows_per_epoch"],
        "breakdown_s": metrics["time_breakdown_s"],
    }


class HandLoop:
    """The training loop written by hand on the suite's pieces, without Lightning: the batches
    of ``strategy=single`` (its DataModule's batcher), the net its DataModule builds, the run's
    optimiser, and the :class:`~lightning_gnnscale.callbacks.StepSeed` keys."""

    def __init__(self, cfg: DictConfig, rank: int = 0, world_size: int = 1):
        run = validate(cfg)
        self.run = run
        datamodule = build_datamodule(run)
        self.batcher = datamodule.batcher()
        if world_size > 1:  # rank ``rank``'s micro-batches, rank-salted as strategy=ddp's
            self.batcher = replace(
                self.batcher, rank=rank, world_size=world_size, salt_by_rank=True
            )
        self.rank, self.task = rank, datamodule.task
        self.steps = datamodule.steps_per_epoch
        self.device = torch.device("cpu" if run.trainer.accelerator == "cpu" else "cuda")
        torch.manual_seed(run.seed)
        self.net = datamodule.build_model(run.model).to(self.device, getattr(torch, run.dtype))
        optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
        self.optimizer = optimizers[run.model.optimizer](
            self.net.parameters(), lr=run.model.lr, weight_decay=run.model.weight_decay
        )

    def step(self, epoch: int, step: int) -> float:
        """One training step (sample, forward, backward, optimiser step); returns the loss."""
        seed_step_generators(step_key(self.run.seed, epoch, step, self.rank), self.device)
        batch = self.batcher[epoch, step].to(self.device)
        self.net.train()
        out = self.net(batch.blocks, batch.x)
        loss = self.task.loss_sum(out, batch.y) / batch.global_seed_count
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss)

    def epoch(self, epoch: int) -> float:
        """One epoch's wall time (training only; queued CUDA work included)."""
        synchronize(self.device)
        start = time.perf_counter()
        for step in range(self.steps):
            self.step(epoch, step)
        synchronize(self.device)
        return time.perf_counter() - start

    def profile(self, steps: int, top: int) -> list[dict]:
        """The ``top`` operators by self CPU time over ``steps`` steps of epoch 0."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in range(min(steps, self.steps)):
                self.step(0, step)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) or 1.0
        ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        return [
            {
                "op": e.key,
                "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "share": e.self_cpu_time_total / total,
                "calls": e.count,
            }
            for e in ranked
        ]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA runs asynchronously), so a timer sees it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mask_benchmark(rows: int, width: int, p: float, reps: int = 10) -> dict:
    """``F.dropout`` against :func:`~lightning_gnnscale.models.layers.row_dropout` on a
    ``[rows, width]`` float32 input, forward + backward, interleaved in the same run."""
    h = torch.randn(rows, width, requires_grad=True)
    fns = {
        "F.dropout": lambda: F.dropout(h, p, training=True),
        "row_dropout": lambda: row_dropout(h, p),
    }
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            out = fn()
            out.backward(torch.ones_like(out))
            times[name].append(time.perf_counter() - start)
            h.grad = None
    result = {name: _times(values) for name, values in times.items()}
    result["shape"] = [rows, width]
    result["speedup_median"] = result["F.dropout"]["median_s"] / result["row_dropout"]["median_s"]
    result["speedup_min"] = result["F.dropout"]["min_s"] / result["row_dropout"]["min_s"]
    return result


def run_hand_loop(cfg: DictConfig, epochs: int) -> dict:
    """Train ``epochs`` epochs with :class:`HandLoop`; per-epoch training time."""
    loop = HandLoop(cfg)
    return _times([loop.epoch(epoch) for epoch in range(epochs)])


def _unsynced_rank(cfg: DictConfig, epochs: int, world_size: int, barrier, out: str) -> None:
    """One process of :func:`run_unsynced_hand_loops` (``$LOCAL_RANK`` names its rank)."""
    rank = int(os.environ["LOCAL_RANK"])
    torch.set_num_threads(int(os.environ[THREADS_ENV]))
    retain_freed_memory()
    loop = HandLoop(cfg, rank, world_size)
    times = []
    for epoch in range(epochs):
        barrier.wait()  # every process starts the epoch together, as synchronous ranks would
        times.append(loop.epoch(epoch))
    Path(out, f"rank{rank}.json").write_text(json.dumps(times))


def run_unsynced_hand_loops(cfg: DictConfig, epochs: int, world_size: int) -> dict:
    """:class:`HandLoop` in ``world_size`` processes at once, each on its rank's micro-batches,
    with no gradient sync; an epoch takes as long as its slowest process."""
    barrier = torch.multiprocessing.get_context("spawn").Barrier(world_size)
    with tempfile.TemporaryDirectory() as out:
        launch_local(_unsynced_rank, (cfg, epochs, world_size, barrier, out), world_size, 1)
        per_rank = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
    return {**_times([max(epoch) for epoch in zip(*per_rank)]), "world_size": world_size}


def dgl_available() -> bool:
    """Whether DGL's loop can run here."""
    return importlib.util.find_spec("dgl") is not None


def dgl_version() -> str | None:
    """The importable DGL's version (``None`` without DGL)."""
    if not dgl_available():
        return None
    import dgl  # pragma: no cover - needs dgl

    return dgl.__version__  # pragma: no cover


def run_dgl_loop(cfg: DictConfig, epochs: int) -> dict:  # pragma: no cover - needs dgl
    """DGL's idiomatic GraphSAGE loop on the same graph, fanouts, batch size and optimiser:
    ``dgl.dataloading.NeighborSampler`` (C++), ``dgl.nn.SAGEConv('mean')``, ``F.dropout``.
    Link prediction: the graph of the training edges, their positive pairs as seed edges
    through ``as_edge_prediction_sampler`` with ``negative_sampler.Uniform(num_negatives)``,
    dot-product scores and binary cross-entropy (DGL's link-prediction tutorial's loop).
    Run by hand with ``scripts/dgl_for_bench.sh``'s DGL; no test runs it (CI has no DGL)."""
    import dgl
    from dgl.nn import SAGEConv

    run = validate(cfg)
    datamodule = build_datamodule(run)
    graph, targets, task = datamodule.graph, datamodule.targets, datamodule.task
    link = task.spec.seeds == "edges"
    indptr, indices = task.training_structure(graph, targets)
    dst = torch.repeat_interleave(torch.arange(graph.num_nodes), indptr.diff())
    g = dgl.graph((indices, dst), num_nodes=graph.num_nodes)
    dims = [graph.num_features] + [run.model.hidden] * (run.model.num_layers - 1)
    dims.append(targets.out_dim)
    layers = torch.nn.ModuleList(
        SAGEConv(dims[i], dims[i + 1], "mean") for i in range(run.model.num_layers)
    )
    optimizer = torch.optim.Adam(
        layers.parameters(), lr=run.model.lr, weight_decay=run.model.weight_decay
    )
    sampler = dgl.dataloading.NeighborSampler(list(run.data.fanouts)[::-1])  # input layer first
    if link:
        negatives = dgl.dataloading.negative_sampler.Uniform(task.config.num_negatives)
        sampler = dgl.dataloading.as_edge_prediction_sampler(sampler, negative_sampler=negatives)
        pairs = targets.split.train_pos
        seeds = g.edge_ids(pairs[0], pairs[1])
    else:
        seeds = datamodule.train_ids
    loader = dgl.dataloading.DataLoader(
        g, seeds, sampler, batch_size=run.data.batch_size, shuffle=True
    )

    def embed(input_nodes, blocks):
        h = graph.x[input_nodes]
        for i, (layer, block) in enumerate(zip(layers, blocks)):
            h = layer(block, F.dropout(h, run.model.dropout, training=True))
            h = F.relu(h) if i < len(layers) - 1 else h
        return h

    def score(h, pair_graph):
        src, dst = pair_graph.edges()
        return (h[src] * h[dst]).sum(-1)

    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for batch in loader:
            if link:
                input_nodes, positives, negatives_graph, blocks = batch
                h = embed(input_nodes, blocks)
                pos, neg = score(h, positives), score(h, negatives_graph)
                scores = torch.cat([pos, neg])
                labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
                loss = F.binary_cross_entropy_with_logits(scores, labels)
            else:
                input_nodes, output_nodes, blocks = batch
                h = embed(input_nodes, blocks)
                loss = F.cross_entropy(h, targets.target[output_nodes])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    return _times(times)


def run_e2e(settings: E2ESettings, out: Path, argv: list[str]) -> dict:
    """Run every runner at every dropout; write ``e2e.md``, ``e2e.json`` (and ``e2e.png``)."""
    out = out.resolve()
    cpu_allocator = retain_freed_memory()
    env = environment()
    configs = {
        dropout: {s: compose_run(settings, s, dropout, out) for s in settings.strategies}
        for dropout in settings.dropouts
    }
    hand_cfgs = {d: compose_run(settings, "single", d, out) for d in settings.dropouts}
    results: dict = {"runs": {}, "profiles": {}}
    with pinned_threads(settings.threads):
        for dropout in settings.dropouts:
            key = f"{dropout:g}"
            runs = results["runs"].setdefault(key, {})
            print(f"[bench e2e] dropout {key}: {HAND}", flush=True)
            runs[HAND] = run_hand_loop(hand_cfgs[dropout], settings.epochs)
            if settings.devices > 1 and settings.accelerator == "cpu":
                name = UNSYNCED.format(settings.devices)
                print(f"[bench e2e] dropout {key}: {name}", flush=True)
                runs[name] = run_unsynced_hand_loops(
                    hand_cfgs[dropout], settings.epochs, settings.devices
                )
            if dgl_available() and settings.model == "sage" and settings.accelerator == "cpu":
                print(f"[bench e2e] dropout {key}: {DGL}", flush=True)
                runs[DGL] = run_dgl_loop(hand_cfgs[dropout], settings.epochs)
            for strategy, cfg in configs[dropout].items():
                print(f"[bench e2e] dropout {key}: strategy={strategy}", flush=True)
                runs[f"strategy={strategy}"] = run_strategy(cfg)
            if settings.profile_steps:
                results["profiles"][key] = HandLoop(hand_cfgs[dropout]).profile(
                    settings.profile_steps, settings.top_ops
                )
            if dropout > 0 and "masks" not in results and settings.accelerator == "cpu":
                loop = HandLoop(hand_cfgs[dropout])
                rows = loop.batcher[0, 0].x.shape[0]
                print(f"[bench e2e] dropout masks on [{rows}, {settings.features}]", flush=True)
                results["masks"] = {
                    "p": dropout,
                    **mask_benchmark(rows, settings.features, dropout),
                }
    results.update(
        command=command_line(argv),
        environment=env,
        settings=asdict(settings),
        dgl=dgl_available(),
        dgl_version=dgl_version(),
        cpu_allocator=cpu_allocator,
    )
    out.mkdir(parents=True, exist_ok=True)
    png = plot_e2e(results, out / "e2e.png")
    results["png"] = str(png) if png else None
    write_json_atomic(str(out / "e2e.json"), results)
    (out / "e2e.md").write_text(e2e_markdown(results))
    print(f"[bench e2e] wrote {out / 'e2e.md'}", flush=True)
    return results


def _speedup(base: dict | None, other: dict) -> str:
    """``base median / other median`` as ``1.23x`` (above 1: ``other`` is faster)."""
    if base is None:
        return "-"
    return f"{base['median_s'] / other['median_s']:.2f}x"


def e2e_markdown(results: dict) -> str:
    """The report: training time per epoch by runner and dropout, speed-ups, top operators."""
    s = results["settings"]
    dropouts = list(results["runs"])
    runners = list(dict.fromkeys(r for runs in results["runs"].values() for r in runs))
    rows = []
    for runner in runners:
        row = [runner]
        for d in dropouts:
            r = results["runs"][d].get(runner)
            row.append("-" if r is None else f"{fmt(r['min_s'], 3)} / {fmt(r['median_s'], 3)}")
        for d in dropouts:
            r = results["runs"][d].get(runner)
            row.append("-" if r is None else _speedup(results["runs"][d][HAND], r))
        for d in dropouts:
            r = results["runs"][d].get(runner)
            row.append("-" if r is None or r.get("eval_s") is None else fmt(r["eval_s"], 3))
        rows.append(row)
    headers = ["runner"]
    headers += [f"train s/epoch, dropout {d} (min / median)" for d in dropouts]
    headers += [f"speed-up vs hand loop, dropout {d}" for d in dropouts]
    headers += [f"eval s/epoch, dropout {d}" for d in dropouts]
    lines = [
        f"# bench e2e: {s.get('task', 'node_classification')}, {s['model']}-{s['num_layers']} "
        f"(hidden {s['hidden']}) on sbm {s['nodes']} nodes, fanouts {list(s['fanouts'])}, "
        f"batch {s['batch_size']}",
        "",
        "Command:",
        "",
        f"    {results['command']}",
        "",
        *environment_lines(results["environment"]),
        f"- {s['threads']} torch thread(s) per process; {s['epochs']} epochs per runner",
        f"- malloc: {results.get('cpu_allocator', 'system')} (every runner; "
        "`lightning_gnnscale/cpu_memory.py`)",
        *(
            [
                f"- DGL {results['dgl_version']} on torch {torch.__version__}, without its "
                "tensoradapter (no build for this torch: DGL allocates its own arrays and hands "
                "them over through DLPack) or graphbolt (its import skipped; "
                "`scripts/dgl_for_bench.sh`)"
            ]
            if results.get("dgl_version")
            else []
        ),
        "",
        "Training time per epoch only (evaluation is reported apart, from `summary.json`'s "
        "`eval_time_s`). Speed-up: the hand-written loop's median over the runner's (above 1: "
        "faster than the loop). The hand-written loop trains on `strategy=single`'s batches "
        "without Lightning.",
        "",
        *markdown_table(headers, rows),
        "",
    ]
    if not results["dgl"]:
        lines += ["DGL's loop: skipped (`dgl` is not importable here).", ""]
    ddp, single = "strategy=ddp", "strategy=single"
    for d in dropouts:
        runs = results["runs"][d]
        if ddp in runs and single in runs:
            lines.append(
                f"- dropout {d}: ddp ({runs[ddp]['world_size']} processes) vs single: "
                f"{_speedup(runs[single], runs[ddp])} (training time per epoch, medians)"
            )
        unsynced = UNSYNCED.format(s["devices"])
        if unsynced in runs:
            lines.append(
                f"- dropout {d}: {unsynced} vs the hand-written loop: "
                f"{_speedup(runs[HAND], runs[unsynced])} (plain data parallelism without "
                "Lightning, DDP or gradient sync: the ceiling for ddp)"
            )
        if DGL in runs:
            for runner in runners:
                if runner.startswith("strategy=") and runner in runs:
                    lines.append(
                        f"- dropout {d}: {runner} vs DGL: {_speedup(runs[DGL], runs[runner])}"
                    )
    lines.append("")
    lines += _breakdown_lines(results, dropouts)
    masks = results.get("masks")
    if masks:
        ours, torch_ = masks["row_dropout"], masks["F.dropout"]
        lines += [
            f"Dropout masks alone (p = {masks['p']:g}, the first step's input rows "
            f"{masks['shape']}, forward + backward, interleaved): `F.dropout` "
            f"{fmt(torch_['min_s'] * 1e3, 3)} / {fmt(torch_['median_s'] * 1e3, 3)} ms, "
            f"`row_dropout` {fmt(ours['min_s'] * 1e3, 3)} / {fmt(ours['median_s'] * 1e3, 3)} ms "
            f"(min / median): {masks['speedup_min']:.2f}x / {masks['speedup_median']:.2f}x.",
            "",
        ]
    for d, ops in results["profiles"].items():
        lines += [
            f"Top operators of the hand-written loop, dropout {d} "
            f"({s['profile_steps']} steps, self CPU time):",
            "",
            *markdown_table(
                ["operator", "self CPU (ms)", "share", "calls"],
                [
                    [o["op"], fmt(o["self_cpu_ms"], 4), f"{o['share']:.0%}", str(o["calls"])]
                    for o in ops
                ],
            ),
            "",
        ]
    lines.append(
        f"PNG: `{Path(results['png']).name}`"
        if results.get("png")
        else "PNG: skipped (matplotlib is not importable)."
    )
    return "\n".join(lines) + "\n"


def _breakdown_lines(results: dict, dropouts: list[str]) -> list[str]:
    """Where each strategy's training epoch goes on rank 0 (``summary.json``'s medians)."""
    rows = []
    for d in dropouts:
        for runner, r in results["runs"][d].items():
            parts = r.get("breakdown_s")
            if not parts:
                continue
            named = ("sample_s", "load_s", "compute_s", "comm_s")
            other = r["median_s"] - sum(parts[k] for k in named[:3])
            rows.append(
                [f"{runner}, dropout {d}", *(fmt(parts[k], 3) for k in named), fmt(other, 3)]
                + [f"{r['input_rows_per_epoch'] / 1e6:.3f}"]
            )
    if not rows:
        return []
    headers = ["run", "sample", "load", "compute", "comm wait", "rest", "input rows"]
    return [
        "Training epoch by phase on rank 0 (`summary.json`'s `time_breakdown_s`; seconds, "
        "medians over epochs, so they need not add up). Compute: forward, backward (the gradient "
        "all-reduce completes in it) and optimiser step. Comm wait: time inside metered "
        "collectives over the epoch, evaluation's all-gathers included. Rest: the training epoch "
        "less sample, load and compute (the loop, Lightning, hooks). Input rows: millions per "
        "epoch, summed over ranks.",
        "",
        *markdown_table(headers, rows),
        "",
    ]


def plot_e2e(results: dict, path: Path) -> Path | None:
    """Median training time per epoch by runner, one bar group per dropout; ``None`` (no file)
    when matplotlib is not importable."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    dropouts = list(results["runs"])
    runners = list(dict.fromkeys(r for runs in results["runs"].values() for r in runs))
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    width = 0.8 / max(len(runners), 1)
    for i, runner in enumerate(runners):
        xs = [j + i * width for j, d in enumerate(dropouts) if runner in results["runs"][d]]
        ys = [
            results["runs"][d][runner]["median_s"] for d in dropouts if runner in results["runs"][d]
        ]
        ax.bar(xs, ys, width, label=runner)
    ax.set_xticks([j + width * (len(runners) - 1) / 2 for j in range(len(dropouts))])
    ax.set_xticklabels([f"dropout {d}" for d in dropouts])
    ax.set_ylabel("training time per epoch, median (s)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return path
