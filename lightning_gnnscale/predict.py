"""``python -m lightning_gnnscale.predict run=<run folder> out=<file.parquet|file.csv>``: a
trained run's predictions, one row per node, in the dataset's own ids (docs/datasets.md,
"Predictions in your ids").

The run is composed again from the overrides ``train.py`` recorded in its folder
(``.hydra/overrides.yaml``), then this command's own ``train.py`` overrides
(``dataset.root=...``): the dataset never comes from a path inside the checkpoint. The
checkpoint (``checkpoints/best.ckpt`` or ``last.ckpt``) is loaded weights-only and must carry
the composed run's identity. The ranks start as ``train.py`` starts them, under the run's
strategy and world size; each writes its own nodes' part, then rank 0 writes a manifest of the
parts, last (at world size 1: one file). Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .run_folder import check_writable

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from .config_types import RunConfig
    from .kit.datamodule import GNNDataModule

USAGE = (
    "usage: python -m lightning_gnnscale.predict run=<run folder> out=<file.parquet|file.csv> "
    "[output=<kind>] [checkpoint=best|last] [pairs=<file.parquet|file.csv>, link prediction] "
    "[train.py overrides, e.g. dataset.root=<dir>]\n"
    "  e.g. python -m lightning_gnnscale.predict run=outputs/2025-01-01/12-00-00_ab12cd34 "
    "out=predictions.parquet"
)
CHECKPOINTS = ("best", "last")
FORMATS = {".parquet": "parquet", ".csv": "csv"}
# what each task can write, its default first: class and probabilities, the regression value,
# or the hidden representation the last layer reads
# (link prediction: the node embeddings the decoder scores, or with pairs= the given pairs'
# scores)
OUTPUTS = {
    "node_classification": ("probabilities", "embeddings"),
    "node_regression": ("values", "embeddings"),
    "link_prediction": ("embeddings", "scores"),
}
PAIR_COLUMNS = ("src", "dst")  # the columns of a pairs= table, raw ids
MAX_PAIRS = 1 << 25  # pairs one command scores (their ids: 512 MiB of int64)
SCORED_ELEMENTS = 1 << 24  # embedding elements gathered at once per endpoint while scoring
ALL_OUTPUTS = tuple(dict.fromkeys(kind for kinds in OUTPUTS.values() for kind in kinds))
# where train.py's Hydra records the run's command-line overrides
RECORD = Path(".hydra") / "overrides.yaml"
MANIFEST_FORMAT = "lightning_gnnscale.predictions"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class PredictJob:
    """What to predict, checked once: the run folder, the output file, which checkpoint and
    which output kind (``None``: the task's default, set once the run is composed).

    ``out``'s suffix picks the format (:data:`FORMATS`). At world size ``W > 1`` the ranks
    write ``<stem>.part-<rank>-of-<W><suffix>`` beside it, and rank 0 then writes
    ``<out's name>.manifest.json``; at world size 1, ``out`` itself."""

    run_dir: Path
    out: Path
    checkpoint: str = "best"
    output: str | None = None
    epochs_done: int | None = None  # the checkpoint's, for the manifest
    pairs: Path | None = None  # link prediction: a table of raw-id pairs to score
    # the pairs as contiguous node ids [P, 2], once read and checked (read_pairs)
    pair_ids: torch.Tensor | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.checkpoint not in CHECKPOINTS:
            raise ConfigError(
                f"checkpoint={self.checkpoint!r} is unknown; valid: {list(CHECKPOINTS)}"
            )
        if self.output is not None and self.output not in ALL_OUTPUTS:
            raise ConfigError(f"output={self.output!r} is unknown; valid: {list(ALL_OUTPUTS)}")
        if self.out.suffix not in FORMATS:
            raise ConfigError(
                f"out={self.out}: the file's extension must be one of {list(FORMATS)} (the "
                "format it is written in)"
            )
        if self.pairs is not None:
            if self.pairs.suffix not in FORMATS:
                raise ConfigError(
                    f"pairs={self.pairs}: the file's extension must be one of {list(FORMATS)} "
                    "(the format it is read in)"
                )
            if not self.pairs.is_file():
                raise ConfigError(f"pairs={self.pairs}: no such file")
        if not self.run_dir.is_dir():
            raise ConfigError(
                f"run={self.run_dir} is not a folder; give the run folder train.py printed "
                "(outputs/<date>/<time>_<token>)"
            )
        if not (self.run_dir / RECORD).is_file():
            raise ConfigError(
                f"run={self.run_dir} holds no {RECORD}: not a run folder train.py wrote (its "
                "settings are read from there)"
            )
        if not self.checkpoint_path.is_file():
            folder = self.checkpoint_path.parent
            found = sorted(p.stem for p in folder.glob("*.ckpt")) if folder.is_dir() else []
            raise ConfigError(
                f"run={self.run_dir} has no checkpoint {self.checkpoint_path.name}; "
                f"checkpoints there: {found or 'none'} (valid: checkpoint={'|'.join(CHECKPOINTS)})"
            )

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / f"{self.checkpoint}.ckpt"

    @property
    def fmt(self) -> str:
        return FORMATS[self.out.suffix]

    def part_path(self, rank: int, world_size: int) -> Path:
        return self.out.with_name(f"{self.out.stem}.part-{rank}-of-{world_size}{self.out.suffix}")

    @property
    def manifest_path(self) -> Path:
        return self.out.with_name(f"{self.out.name}.manifest.json")

    def earlier_outputs(self) -> list[Path]:
        """What an earlier prediction to ``out`` left: ``out``, its manifest and its parts
        (files of this command's names only)."""
        part = re.compile(
            rf"{re.escape(self.out.stem)}\.part-\d+-of-\d+{re.escape(self.out.suffix)}"
        )
        folder = self.out.parent
        parts = [p for p in folder.iterdir() if part.fullmatch(p.name)] if folder.is_dir() else []
        return [p for p in (self.out, self.manifest_path, *sorted(parts)) if p.is_file()]


def parse_args(args: list[str]) -> tuple[PredictJob, list[str]]:
    """The job of ``run= out= output= checkpoint=`` and the other arguments, ``train.py``
    overrides (``ckpt_path`` and ``weights_from`` are refused: the weights are the run's)."""
    own: dict[str, str] = {}
    overrides = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("run", "out", "output", "checkpoint", "pairs"):
            if key in own:
                raise ConfigError(f"{key}= is given twice")
            own[key] = value
        else:
            overrides.append(arg)
    missing = [f"{key}=" for key in ("run", "out") if not own.get(key)]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} missing\n{USAGE}")
    for override in overrides:
        if override.lstrip("+~").partition("=")[0] in ("ckpt_path", "weights_from"):
            raise ConfigError(
                f"{override}: predict takes the run's own weights; choose them with "
                f"checkpoint={'|'.join(CHECKPOINTS)}"
            )
    job = PredictJob(
        Path(own["run"]).expanduser(),
        Path(own["out"]).expanduser().absolute(),
        own.get("checkpoint", "best"),
        own.get("output"),
        pairs=Path(own["pairs"]).expanduser().absolute() if "pairs" in own else None,
    )
    return job, overrides


def saved_overrides(run_dir: Path) -> list[str]:
    """The ``train.py`` overrides recorded in ``run_dir`` (``.hydra/overrides.yaml``)."""
    import yaml

    path = run_dir / RECORD
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path} cannot be read: {err}") from None
    if saved is None:
        return []
    if not isinstance(saved, list) or not all(isinstance(o, str) for o in saved):
        raise ConfigError(f"{path} is not a list of overrides (as Hydra writes it)")
    return saved


def compose_run(job: PredictJob, overrides: list[str]) -> RunConfig:
    """The validated run of ``job``'s folder: its recorded overrides, then ``overrides``
    (later ones win), composed as ``train.py`` composes them from this folder."""
    from hydra import compose, initialize_config_dir

    from .launch import import_pandas_without_pyarrow
    from .preflight import check_config, validate

    conf = Path(__file__).resolve().parents[1] / "conf"
    given = [
        f"paths.root={Path.cwd()}",
        f"paths.output_dir={job.run_dir.absolute()}",
        *saved_overrides(job.run_dir),
        "ckpt_path=null",  # a resumed run's checkpoint: not what predict loads
        "weights_from=null",
        *overrides,
    ]
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose("config", overrides=given)
    except Exception as err:  # Hydra's override and composition errors
        raise ConfigError(f"bad overrides {overrides} for run={job.run_dir}: {err}") from None
    run = check_config(cfg)
    import_pandas_without_pyarrow()  # before PyG imports pandas (launch.py says why)
    return validate(run, checked=True)


def check_checkpoint(run: RunConfig, job: PredictJob) -> PredictJob:
    """``job`` with its output kind and the checkpoint's completed epochs, once the checkpoint
    (read weights-only) is found to carry ``run``'s identity and the run's task and system can
    write that kind."""
    from .checkpoints import CHECKPOINT_KEY, identity_differences, read_checkpoint
    from .systems.registry import SYSTEMS

    kinds = OUTPUTS.get(run.task.name)
    if kinds is None:
        raise ConfigError(f"task={run.task.name} has no predictions yet; tasks: {list(OUTPUTS)}")
    output = job.output or ("scores" if job.pairs is not None else kinds[0])
    if output not in kinds:
        raise ConfigError(f"output={output} is not one of task={run.task.name}'s: {list(kinds)}")
    if (output == "scores") != (job.pairs is not None):
        raise ConfigError(
            "output=scores scores the pairs of pairs=<file.parquet|file.csv> (columns src, dst)"
            if job.pairs is None
            else f"pairs= is scored as output=scores, not output={output}"
        )
    if not SYSTEMS[run.strategy.name].supports_predict:
        predicting = [name for name, spec in SYSTEMS.items() if spec.supports_predict]
        raise ConfigError(f"strategy={run.strategy.name} cannot predict; strategies: {predicting}")
    path = job.checkpoint_path
    block = read_checkpoint(path).get(CHECKPOINT_KEY)
    if not isinstance(block, dict) or not isinstance(block.get("identity"), dict):
        raise ConfigError(f"checkpoint {path} carries no run identity to check it against")
    differences = identity_differences(run.identity, block["identity"])
    if differences:
        raise ConfigError(
            f"checkpoint {path} was written by another run than the one run={job.run_dir} and "
            f"these overrides describe: {'; '.join(differences)}. Drop the overrides that "
            "change the run (dataset.root may move, the data may not)"
        )
    done = block.get("epochs_done")
    return replace(job, output=output, epochs_done=done if isinstance(done, int) else None)


def check_out_folder(job: PredictJob) -> None:
    """``out``'s folder exists (created) and takes a new file."""
    check_writable(job.out.parent, f"out={job.out}: its folder", hint="")


def predict(
    run_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    output: str | None = None,
    checkpoint: str = "best",
    pairs: str | os.PathLike | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    log=print,
) -> list[Path]:
    """The command: ``run_dir``'s predictions to ``out`` (with ``pairs``, a link-prediction
    run's scores of those pairs); returns the files it writes (at world size 1 ``[out]``, else
    the manifest, then the parts)."""
    job, rest = parse_args(
        [
            f"run={run_dir}",
            f"out={out}",
            f"checkpoint={checkpoint}",
            *([f"output={output}"] if output is not None else []),
            *([f"pairs={pairs}"] if pairs is not None else []),
            *overrides,
        ]
    )
    return run_job(job, rest, log)


def run_job(job: PredictJob, overrides: list[str], log=print) -> list[Path]:
    """Compose and check the run of ``job`` (before any process starts), then predict."""
    run = compose_run(job, overrides)
    job = check_checkpoint(run, job)
    check_out_folder(job)
    if job.pairs is not None:
        job = replace(job, pair_ids=read_pairs(job.pairs, run))

    from .bounds import externally_launched
    from .comm.rendezvous import end_process_group
    from .graph.partition_dir import node_ranks
    from .launch import launch_local, warm_start
    from .run import build_datamodule, use_rank_threads

    warm_start(run)  # the rank server imports while this process loads the dataset

    world = run.world_size
    log(
        f"[predict] run {job.run_dir}: strategy={run.strategy.name} model={run.model.name} "
        f"dataset={run.dataset.name} task={run.task.name}, {world} rank(s); weights "
        f"{job.checkpoint_path.name} (epochs done: {job.epochs_done}); output={job.output}"
    )
    external = externally_launched()  # this process is one rank (torchrun, srun)
    if external:
        use_rank_threads(run.trainer.devices)
    datamodule = build_datamodule(run)
    datamodule.prepare(world, node_ranks(world, run.trainer.devices))
    if job.pair_ids is not None:
        check_pair_range(job.pairs, job.pair_ids, datamodule.graph.num_nodes)
        log(f"[predict] {job.pair_ids.shape[0]:,} pairs from {job.pairs}")
    if external:
        predict_rank(run, datamodule, job)
    elif world == 1:  # in this process: leave it as it was found (as train() does)
        environment = dict(os.environ)
        try:
            predict_rank(run, datamodule, job)
        finally:
            end_process_group()
            os.environ.clear()
            os.environ.update(environment)
    else:
        launch_local(
            predict_rank,
            (run, datamodule, job),
            run.trainer.devices,
            run.trainer.num_nodes,
            run.launcher.timeout_s,
            run.launcher.start_method,
        )
    if world == 1:
        return [job.out]
    return [job.manifest_path, *(job.part_path(r, world) for r in range(world))]


def predict_rank(run: RunConfig, datamodule: GNNDataModule, job: PredictJob) -> None:
    """One rank: the checkpoint's weights (and DataModule state) loaded weights-only,
    ``trainer.predict`` of this rank's nodes, its part written; rank 0 then writes the
    manifest from every rank's row count and digest."""
    import warnings

    import lightning as L
    import torch

    from .contract import rank_context
    from .run import build_module, build_strategy, use_rank_threads

    warnings.filterwarnings("ignore", message=".*does not have many workers")
    # the training callbacks' state in the checkpoint has nothing to give a prediction
    warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`")
    use_rank_threads(run.trainer.devices)
    L.seed_everything(run.seed, workers=True, verbose=False)
    tr = run.trainer
    trainer = L.Trainer(
        accelerator=tr.accelerator,
        devices=tr.devices,
        num_nodes=tr.num_nodes,
        strategy=build_strategy(run),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        deterministic=tr.deterministic,
        default_root_dir=str(job.run_dir),
    )
    # a node task's embeddings: its last layer's input; link prediction's: the net's output,
    # what the decoder scores
    embeddings = job.output == "embeddings" and run.task.name != "link_prediction"
    endpoints = None if job.pair_ids is None else torch.unique(job.pair_ids)
    datamodule.predict_on(endpoints, output="embeddings" if embeddings else "logits")
    (share,) = trainer.predict(
        build_module(run, datamodule),
        datamodule=datamodule,
        ckpt_path=job.checkpoint_path,
        weights_only=True,
    )
    ids, rows = share["node_ids"].cpu(), share[datamodule.predict_output].cpu()
    comm = rank_context(trainer).comm
    rank, world = comm.rank, comm.world_size
    raw_ids, classes = dataset_ids(run)
    if job.pair_ids is None:
        order = ids.argsort()
        table = prediction_table(ids[order], rows[order], job.output, raw_ids, classes)
    else:
        table = pair_table(job.pair_ids, ids, rows, datamodule.task.decoder, comm, raw_ids)
    if world == 1:
        write_table(job.out, table, job.fmt)
        for path in job.earlier_outputs():
            if path != job.out:
                path.unlink(missing_ok=True)
        print(f"[predict] wrote {job.out} ({table.num_rows:,} rows)", flush=True)
        return
    if rank == 0:  # no manifest until every new part is written
        for path in job.earlier_outputs():
            path.unlink(missing_ok=True)
    comm.barrier()
    path = job.part_path(rank, world)
    count, digest = write_table(path, table, job.fmt)
    print(f"[predict] rank {rank}: {count:,} rows -> {path}", flush=True)
    mine = torch.tensor([[count, *bytes.fromhex(digest)]], dtype=torch.int64)
    every = comm.all_gather_tensor(mine, category="control")  # after every part is written
    if rank == 0:
        write_manifest(run, job, table.column_names, every)


def write_manifest(run: RunConfig, job: PredictJob, columns: list[str], every) -> None:
    """``<out's name>.manifest.json`` (atomic): the parts, their row counts and blake2b digests
    (``every [W, 33]``: each rank's count, then its digest's 32 bytes)."""
    from .files import write_json_atomic

    world = every.shape[0]
    parts = [
        {
            "file": job.part_path(rank, world).name,
            "rank": rank,
            "rows": int(every[rank, 0]),
            "blake2b": bytes(every[rank, 1:].tolist()).hex(),
        }
        for rank in range(world)
    ]
    total = sum(part["rows"] for part in parts)
    write_json_atomic(
        job.manifest_path,
        {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "run": str(job.run_dir.absolute()),
            "checkpoint": job.checkpoint_path.name,
            "epochs_done": job.epochs_done,
            "strategy": run.strategy.name,
            "task": run.task.name,
            "output": job.output,
            **({"pairs": str(job.pairs)} if job.pairs is not None else {}),
            "world_size": world,
            "columns": columns,
            "rows": total,
            "parts": parts,
        },
    )
    names = ", ".join(part["file"] for part in parts)
    print(f"[predict] wrote {job.manifest_path} ({total:,} rows in {world} parts: {names})")


def dataset_ids(run: RunConfig) -> tuple[pa.Array | None, list | None]:
    """``(raw ids in node order, class names)`` of a constructed dataset (its id map,
    checked to be the content the run's identity names); ``(None, None)`` for a dataset
    without raw ids (its rows are named by the contiguous node id)."""
    if run.dataset.source.name != "constructed":
        return None, None
    from .graph.constructed import node_ids, read_metadata

    meta = read_metadata(run.dataset.root)
    if meta["digest"] != run.identity.get("dataset.content"):
        raise ConfigError(
            f"dataset.root={run.dataset.root} changed since the run was checked (its content "
            "digest differs); predict again"
        )
    return node_ids(run.dataset.root), list(meta["classes"])


def prediction_table(
    node_ids: torch.Tensor,
    rows: torch.Tensor,
    output: str,
    raw_ids: pa.Array | None = None,
    classes: list | None = None,
) -> pa.Table:
    """One row per node of ``node_ids [n]`` (contiguous ids) with its output ``rows [n, d]``
    (logits, or embeddings for ``output="embeddings"``): ``id`` (``raw_ids[node_ids]``, else
    the node id), then

    - ``probabilities``: ``predicted`` (the class name, else the class index) and
      ``prob_<class>`` (softmax of the logits) for each of the ``d`` classes;
    - ``values``: ``prediction`` (``d = 1``) or ``prediction_<j>``;
    - ``embeddings``: ``emb_0`` .. ``emb_<d-1>``.
    """
    import pyarrow as pa
    import torch

    index = pa.array(node_ids.numpy())
    columns: dict[str, Any] = {"id": index if raw_ids is None else raw_ids.take(index)}
    width = rows.shape[1]
    if output == "probabilities":
        names = [str(c) for c in (classes if classes is not None else range(width))]
        if len(names) != width:
            raise ValueError(f"{width} logits per node but {len(names)} classes {names}")
        best = pa.array(rows.argmax(1).numpy())
        columns["predicted"] = best if classes is None else pa.array(names).take(best)
        probabilities = torch.softmax(rows, dim=1).numpy()
        columns.update({f"prob_{name}": probabilities[:, j] for j, name in enumerate(names)})
    elif output == "values":
        values = rows.numpy()
        names = ["prediction"] if width == 1 else [f"prediction_{j}" for j in range(width)]
        columns.update({name: values[:, j] for j, name in enumerate(names)})
    elif output == "embeddings":
        values = rows.numpy()
        columns.update({f"emb_{j}": values[:, j] for j in range(width)})
    else:
        raise ValueError(f"output={output!r} is unknown; valid: {list(ALL_OUTPUTS)}")
    return pa.table(columns)


def read_pairs(path: Path, run: RunConfig) -> torch.Tensor:
    """The pairs of the table at ``path`` (columns ``src`` and ``dst``, raw ids in the
    dataset's ``id_type``; a dataset without raw ids: node ids) as contiguous node ids
    ``[P, 2]``. A missing column, an id that does not parse or names no node, an empty table
    or more than :data:`MAX_PAIRS` rows is refused with the file, row and column named (a node
    id past the graph's nodes: :func:`check_pair_range`, once the graph is loaded)."""
    import numpy as np
    import pyarrow as pa
    import torch

    from .construct import IdMap, Source, column, parse_ids, read_table

    where = Source(path, FORMATS[path.suffix])
    table = read_table(where, list(PAIR_COLUMNS))
    if table.num_rows > MAX_PAIRS:
        raise ConfigError(f"pairs={path}: {table.num_rows:,} pairs, more than {MAX_PAIRS:,}")
    raw_ids, _ = dataset_ids(run)
    id_type = "int" if raw_ids is None or pa.types.is_integer(raw_ids.type) else "str"
    find = IdMap(raw_ids) if raw_ids is not None else None
    ends = []
    for name in PAIR_COLUMNS:
        values = parse_ids(column(table, name, where), id_type, where, name)
        nodes = find(values) if find is not None else values.to_numpy().astype(np.int64)
        known = "no node of the dataset" if find is not None else "negative: not a node id"
        _refuse_unknown(where, name, nodes < 0, values, known)
        ends.append(torch.from_numpy(nodes))
    return torch.stack(ends, 1)


def check_pair_range(path: Path, pairs: torch.Tensor, num_nodes: int) -> None:
    """Refuse a node id of ``pairs [P, 2]`` (read from ``path``) outside ``[0, num_nodes)``."""
    from .construct import Source

    where = Source(path, FORMATS[path.suffix])
    for j, name in enumerate(PAIR_COLUMNS):
        nodes = pairs[:, j].numpy()
        beyond = f"not a node id: the graph has {num_nodes:,} nodes (ids 0 .. {num_nodes - 1})"
        _refuse_unknown(where, name, nodes >= num_nodes, nodes, beyond)


def _refuse_unknown(where, name: str, unknown, values, why: str) -> None:
    """A ``ConstructError`` at the first row ``unknown`` marks in column ``name``: its value
    (of ``values``) is ``why``."""
    import numpy as np

    from .construct import error_at

    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        value = values[row].as_py() if hasattr(values[row], "as_py") else int(values[row])
        raise error_at(where, row + 1, name, f"{value!r} is {why}")


def pair_table(
    pairs: torch.Tensor,
    ids: torch.Tensor,
    rows: torch.Tensor,
    decoder,
    comm,
    raw_ids: pa.Array | None = None,
) -> pa.Table:
    """This rank's block (:func:`~.models.inference.node_range` of the pair order) of
    ``pairs [P, 2]`` (node ids) scored by ``decoder`` from the embeddings ``rows [n, d]`` of
    this rank's endpoints ``ids [n]``: ``src``, ``dst`` (raw ids, else node ids), ``score``
    (the decoder's logit) and ``probability`` (its sigmoid). The endpoints' rows are
    all-gathered through ``comm`` (``activation``): every rank's, of the pairs' endpoints only."""
    import pyarrow as pa
    import torch

    from .models.inference import node_range

    every_id, _ = comm.all_gather_varlen(ids, category="control")
    every_row, _ = comm.all_gather_varlen(rows, category="activation")
    order = every_id.argsort()
    every_id, every_row = every_id[order], every_row[order]
    start, stop = node_range(pairs.shape[0], comm.rank, comm.world_size)
    mine = pairs[start:stop]
    position = torch.searchsorted(every_id, mine)
    chunk = max(1, SCORED_ELEMENTS // max(1, every_row.shape[1]))  # pairs scored at once
    scores = torch.empty(mine.shape[0], dtype=torch.float64)
    with torch.no_grad():
        for first in range(0, mine.shape[0], chunk):
            at = position[first : first + chunk]
            scores[first : first + chunk] = decoder(every_row[at[:, 0]], every_row[at[:, 1]])
    columns = {}
    for j, name in enumerate(PAIR_COLUMNS):
        index = pa.array(mine[:, j].numpy())
        columns[name] = index if raw_ids is None else raw_ids.take(index)
    columns["score"] = scores.numpy()
    columns["probability"] = torch.sigmoid(scores).numpy()
    return pa.table(columns)


def write_table(path: Path, table: pa.Table, fmt: str) -> tuple[int, str]:
    """``table`` as ``fmt`` (``parquet`` or ``csv``) at ``path``, atomically; ``(rows,
    blake2b of the file)``."""
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    from .files import atomic_path, file_digest

    with atomic_path(path) as tmp:
        if fmt == "parquet":
            pq.write_table(table, tmp)
        else:
            pa_csv.write_csv(table, tmp)
        digest = file_digest(tmp)
    return table.num_rows, digest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or any(a in ("-h", "--help") for a in args):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        job, overrides = parse_args(args)
        run_job(job, overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
