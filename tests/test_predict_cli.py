"""``python -m lightning_gnnscale.predict`` on a graph nobody here wrote (Zachary's karate
club from networkx, its members renamed ``m-<i>`` and written in shuffled row order): a
``single`` run's predictions in one file and a 2-rank DistDGL run's in one part per rank, each
row checked against ``trainer.predict``'s row of the node its raw id names, and the bad
inputs refused before any rank starts (docs/datasets.md, "Predictions in your ids")."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from unittest import mock

import lightning as L
import networkx as nx
import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from lightning_gnnscale import predict as predict_command
from lightning_gnnscale.checkpoints import read_checkpoint
from lightning_gnnscale.construct import construct
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.files import file_digest
from lightning_gnnscale.predict import predict
from tests.helpers.config import REPO, make_cfg
from tests.helpers.scripts import run_script

pytestmark = pytest.mark.e2e

TRAIN = (
    "dataset=constructed",
    "trainer.max_epochs=2",
    "data.batch_size=16",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "launcher.timeout_s=240",
)
CLASSES = ["Mr. Hi", "Officer"]  # the club labels, sorted: class 0 and class 1


def karate(folder: Path, seed: int = 7) -> tuple[Path, list[str]]:
    """The karate club as CSV tables (rows shuffled by ``seed``; member ``i`` is ``m-<i>``),
    constructed into ``folder/data``; returns it and the raw id of each row, which is the
    contiguous id construct gives that row's node."""
    graph = nx.karate_club_graph()
    rng = np.random.default_rng(seed)
    order = rng.permutation(graph.number_of_nodes())  # row j holds member order[j]
    raw = [f"m-{i}" for i in order]
    nodes = {
        "member": raw,
        "club": [graph.nodes[int(i)]["club"] for i in order],
        "deg": [float(graph.degree(int(i))) for i in order],
        **{f"f_{j}": rng.normal(size=len(order)).tolist() for j in range(3)},
    }
    edges = rng.permutation(np.array(graph.edges()))
    tables = {
        "nodes.csv": nodes,
        "edges.csv": {"a": [f"m-{s}" for s, _ in edges], "b": [f"m-{d}" for _, d in edges]},
    }
    folder.mkdir(parents=True)
    for name, table in tables.items():
        pa_csv.write_csv(pa.table(table), folder / name)
    spec = {
        "name": "karate",
        "nodes": {
            "file": "nodes.csv",
            "id": "member",
            "id_type": "str",
            "label": "club",
            "features": [{"columns": ["deg"], "transform": "standardise"}, {"prefix": "f_"}],
            "split_fractions": {"train": 0.5, "val": 0.25, "seed": 0},
        },
        "edges": [{"file": "edges.csv", "src": "a", "dst": "b"}],
        "undirected": True,
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    construct(folder / "spec.yaml", folder / "data", log=lambda *_: None)
    return folder / "data", raw


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The constructed karate club, and a ``single`` and a 2-rank ``distdgl`` run on it, each
    trained 2 epochs by ``train.py``."""
    tmp = tmp_path_factory.mktemp("predict")
    data, raw = karate(tmp / "tables")
    folders = {}
    for name, extra in (("single", ()), ("distdgl", ("trainer.devices=2",))):
        folders[name] = tmp / name
        done = run_script(
            "train.py",
            *TRAIN,
            f"dataset.root={data}",
            f"strategy={name}",
            *extra,
            f"hydra.run.dir={folders[name]}",
            cwd=REPO,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return {"tmp": tmp, "data": data, "raw": raw, **folders}


def oracle(tmp: Path, data: Path, checkpoint: Path, output: str, *extra: str) -> torch.Tensor:
    """``trainer.predict``'s ``output`` rows ``[N, d]`` (node order) of the checkpoint's
    weights, in this process under ``single`` (with the overrides ``extra``): the rows the
    command's must equal."""
    from lightning_gnnscale.preflight import validate
    from lightning_gnnscale.run import build_datamodule, build_module, build_strategy

    cfg = make_cfg(tmp, *TRAIN, f"dataset.root={data}", "strategy=single", *extra, tiny=False)
    run = validate(cfg)
    datamodule = build_datamodule(run)
    module = build_module(run, datamodule)
    module.load_state_dict(read_checkpoint(checkpoint)["state_dict"])
    trainer = L.Trainer(
        strategy=build_strategy(run),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (share,) = trainer.predict(module, datamodule=datamodule.predict_on(output=output))
    rows = torch.empty_like(share[output])
    rows[share["node_ids"]] = share[output]
    return rows


def read(path: Path) -> pa.Table:
    if path.suffix == ".parquet":
        return pq.read_table(path)
    return pa_csv.read_csv(
        path, convert_options=pa_csv.ConvertOptions(column_types={"id": pa.string()})
    )


def check_rows(table: pa.Table, raw: list[str], expected: torch.Tensor, output: str) -> None:
    """Row by row: the row of raw id ``r`` holds ``expected``'s row of node ``raw.index(r)``."""
    contiguous = {r: node for node, r in enumerate(raw)}  # node i = row i of the node table
    ids = table.column("id").to_pylist()
    rows = expected[[contiguous[r] for r in ids]].double().numpy()
    if output == "embeddings":
        assert table.column_names == ["id", *(f"emb_{j}" for j in range(rows.shape[1]))]
        got = np.stack([table.column(f"emb_{j}").to_numpy() for j in range(rows.shape[1])], 1)
        np.testing.assert_allclose(got, rows, rtol=1e-5, atol=1e-6)
        return
    assert table.column_names == ["id", "predicted", *(f"prob_{c}" for c in CLASSES)]
    probabilities = np.exp(rows - rows.max(1, keepdims=True))
    probabilities /= probabilities.sum(1, keepdims=True)
    got = np.stack([table.column(f"prob_{c}").to_numpy() for c in CLASSES], 1)
    np.testing.assert_allclose(got, probabilities, rtol=1e-5, atol=1e-6)
    assert table.column("predicted").to_pylist() == [CLASSES[k] for k in rows.argmax(1)]


def test_a_single_run_writes_one_file_in_the_raw_ids(runs, tmp_path):
    out = tmp_path / "predictions" / "predictions.parquet"
    assert predict(runs["single"], out, log=lambda *_: None) == [out]
    table = read(out)
    assert table.schema.field("id").type in (pa.string(), pa.large_string())
    assert sorted(table.column("id").to_pylist()) == sorted(runs["raw"])
    assert table.column("id").to_pylist() == runs["raw"]  # in node (= node table) order
    best = runs["single"] / "checkpoints" / "best.ckpt"
    check_rows(table, runs["raw"], oracle(tmp_path, runs["data"], best, "logits"), "probabilities")

    moved = shutil.copytree(runs["data"], tmp_path / "moved")  # dataset.root may move
    csv = out.with_name("embeddings.csv")
    predict(
        runs["single"],
        csv,
        output="embeddings",
        checkpoint="last",
        overrides=[f"dataset.root={moved}"],
        log=lambda *_: None,
    )
    last = runs["single"] / "checkpoints" / "last.ckpt"
    expected = oracle(tmp_path, runs["data"], last, "embeddings")
    check_rows(read(csv), runs["raw"], expected, "embeddings")
    assert sorted(p.name for p in out.parent.iterdir()) == ["embeddings.csv", "predictions.parquet"]


def test_each_rank_writes_its_own_part_and_the_manifest_lists_them(runs, tmp_path, capfd):
    out = tmp_path / "predictions" / "predictions.csv"
    out.parent.mkdir()
    out.write_text("an earlier prediction at world size 1\n")
    written = predict(runs["distdgl"], out, checkpoint="last", log=lambda *_: None)
    parts = [out.with_name(f"predictions.part-{r}-of-2.csv") for r in range(2)]
    manifest_path = out.with_name("predictions.csv.manifest.json")
    assert written == [manifest_path, *parts]
    assert not out.exists()  # the earlier single file is replaced by the parts
    printed = capfd.readouterr().out
    for rank, part in enumerate(parts):  # each rank wrote its own
        assert re.search(rf"\[predict\] rank {rank}: \d+ rows -> {re.escape(str(part))}", printed)
    manifest = json.loads(manifest_path.read_text())
    assert manifest["world_size"] == 2 and manifest["strategy"] == "distdgl"
    assert manifest["rows"] == 34 and manifest["epochs_done"] == 2
    tables = [read(part) for part in parts]
    assert [p["file"] for p in manifest["parts"]] == [part.name for part in parts]
    assert [p["rows"] for p in manifest["parts"]] == [t.num_rows for t in tables]
    assert [p["blake2b"] for p in manifest["parts"]] == [file_digest(part) for part in parts]
    ids = [set(t.column("id").to_pylist()) for t in tables]
    assert all(ids) and not ids[0] & ids[1] and ids[0] | ids[1] == set(runs["raw"])
    last = runs["distdgl"] / "checkpoints" / "last.ckpt"
    expected = oracle(tmp_path, runs["data"], last, "logits")
    for table in tables:
        check_rows(table, runs["raw"], expected, "probabilities")
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        [manifest_path.name, *(part.name for part in parts)]
    )


def test_a_failed_write_leaves_nothing_behind(runs, tmp_path):
    out = tmp_path / "predictions.parquet"

    def write_half_then_fail(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    with (
        mock.patch.object(pq, "write_table", write_half_then_fail),
        pytest.raises(OSError, match="No space left"),
    ):
        predict(runs["single"], out, log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def link_runs(runs):
    """Link prediction on the same karate club: a ``single`` and a 2-rank ``ddp`` run of
    ``train.py``, and a pairs table of raw ids (members' pairs, edges and not, in a shuffled
    order with a repeat)."""
    tmp = runs["tmp"]
    folders = {}
    for name, extra in (("single", ()), ("ddp", ("trainer.devices=2",))):
        folders[name] = tmp / f"link-{name}"
        done = run_script(
            "train.py",
            *TRAIN,
            "task=link_prediction",
            f"dataset.root={runs['data']}",
            f"strategy={name}",
            *extra,
            f"hydra.run.dir={folders[name]}",
            cwd=REPO,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    rng = np.random.default_rng(3)
    members = rng.integers(0, 34, size=(40, 2))
    members[7] = members[3]  # a pair asked for twice
    pairs = {"src": [f"m-{s}" for s, _ in members], "dst": [f"m-{d}" for _, d in members]}
    pa_csv.write_csv(pa.table(pairs), tmp / "pairs.csv")
    pq.write_table(pa.table(pairs), tmp / "pairs.parquet")
    return {**folders, "pairs": pairs, "csv": tmp / "pairs.csv", "parquet": tmp / "pairs.parquet"}


def check_scores(table: pa.Table, pairs: dict, raw: list[str], embeddings: torch.Tensor) -> None:
    """Row by row: the pairs in the file's order, each scored as the dot product of its raw
    ids' embedding rows, and its sigmoid."""
    assert table.column_names == ["src", "dst", "score", "probability"]
    assert table.column("src").to_pylist() == pairs["src"]
    assert table.column("dst").to_pylist() == pairs["dst"]
    node = {r: i for i, r in enumerate(raw)}
    emb = embeddings.double().numpy()
    src = emb[[node[r] for r in pairs["src"]]]
    dst = emb[[node[r] for r in pairs["dst"]]]
    expected = (src * dst).sum(1)
    np.testing.assert_allclose(table.column("score").to_numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        table.column("probability").to_numpy(), 1 / (1 + np.exp(-expected)), rtol=1e-5
    )


def test_link_prediction_scores_raw_id_pairs_and_writes_embeddings(runs, link_runs, tmp_path):
    link = ("task=link_prediction",)
    best = link_runs["single"] / "checkpoints" / "best.ckpt"
    embeddings = oracle(tmp_path, runs["data"], best, "logits", *link)
    out = tmp_path / "scores.csv"
    assert predict(link_runs["single"], out, pairs=link_runs["csv"], log=lambda *_: None) == [out]
    table = pa_csv.read_csv(
        out,
        convert_options=pa_csv.ConvertOptions(
            column_types=dict.fromkeys(("src", "dst"), pa.string())
        ),
    )
    check_scores(table, link_runs["pairs"], runs["raw"], embeddings)
    emb = tmp_path / "emb.parquet"
    predict(link_runs["single"], emb, log=lambda *_: None)  # the default: embeddings
    table = read(emb)
    assert table.column_names == ["id", *(f"emb_{j}" for j in range(embeddings.shape[1]))]
    check_rows(table, runs["raw"], embeddings, "embeddings")

    out = tmp_path / "ranks" / "scores.parquet"
    written = predict(link_runs["ddp"], out, pairs=link_runs["parquet"], log=lambda *_: None)
    manifest = json.loads(written[0].read_text())
    assert manifest["output"] == "scores" and manifest["rows"] == 40
    parts = [pq.read_table(part) for part in written[1:]]
    assert [p["rows"] for p in manifest["parts"]] == [20, 20]  # each rank its block of pairs
    best = link_runs["ddp"] / "checkpoints" / "best.ckpt"
    embeddings = oracle(tmp_path, runs["data"], best, "logits", *link)  # its weights, in single
    check_scores(pa.concat_tables(parts), link_runs["pairs"], runs["raw"], embeddings)


def test_bad_pairs_are_refused_before_any_rank_starts(runs, link_runs, tmp_path, capsys):
    out = tmp_path / "scores.csv"
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("src,dst\nm-1,m-2\nm-3,m-99\n")
    misspelt = tmp_path / "misspelt.csv"
    misspelt.write_text("source,dst\nm-1,m-2\n")
    single = link_runs["single"]
    cases = {
        "an unknown id": (
            [f"run={single}", f"out={out}", f"pairs={unknown}"],
            f"{unknown}, row 2 (line 3), column 'dst': 'm-99' is no node of the dataset",
        ),
        "a misspelt column": (
            [f"run={single}", f"out={out}", f"pairs={misspelt}"],
            "no column 'src' (did you mean 'source'?); its columns: ['source', 'dst']",
        ),
        "no such file": (
            [f"run={single}", f"out={out}", f"pairs={tmp_path / 'none.csv'}"],
            "none.csv: no such file",
        ),
        "an empty pairs=": (
            [f"run={single}", f"out={out}", "pairs="],
            "the file's extension must be one of ['.parquet', '.csv'] (the format it is read in)",
        ),
        "scores without pairs": (
            [f"run={single}", f"out={out}", "output=scores"],
            "output=scores scores the pairs of pairs=<file.parquet|file.csv>",
        ),
        "pairs of a node task": (
            [f"run={runs['single']}", f"out={out}", f"pairs={link_runs['csv']}"],
            "output=scores is not one of task=node_classification's",
        ),
    }
    for name, (args, message) in cases.items():
        code, err = _main(args, capsys)
        assert code == 1 and message in err, (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["misspelt.csv", "unknown.csv"]
    # a dataset without raw ids: node ids, checked against the graph once it is loaded
    node_ids = torch.tensor([[0, 1], [4, 5]])
    predict_command.check_pair_range(unknown, node_ids, 6)
    with pytest.raises(ConfigError, match=r"row 2 \(line 3\), column 'dst': 5 is not a node id: "):
        predict_command.check_pair_range(unknown, node_ids, 5)


def _main(args: list[str], capsys) -> tuple[int, str]:
    with (
        mock.patch("lightning_gnnscale.launch.launch_local", side_effect=AssertionError),
        mock.patch("lightning_gnnscale.launch.warm_start", side_effect=AssertionError),
    ):
        code = predict_command.main(args)
    return code, capsys.readouterr().err


def test_bad_input_is_refused_before_any_rank_starts(runs, tmp_path, capsys):
    fake = tmp_path / "fake_run"
    (fake / ".hydra").mkdir(parents=True)
    (fake / ".hydra" / "overrides.yaml").write_text("- strategy=single\n")
    (fake / "checkpoints").mkdir()
    (fake / "checkpoints" / "last.ckpt").write_bytes(b"")
    ranks, out = runs["distdgl"], tmp_path / "p.parquet"
    other, _ = karate(tmp_path / "other", seed=8)  # the same graph, other rows and features
    cases = {
        "no such folder": (
            [f"run={tmp_path / 'nowhere'}", f"out={out}"],
            "is not a folder; give the run folder train.py printed",
        ),
        "not a run folder": (
            [f"run={runs['data']}", f"out={out}"],
            "holds no .hydra/overrides.yaml: not a run folder train.py wrote",
        ),
        "missing checkpoint": (
            [f"run={fake}", f"out={out}"],
            "has no checkpoint best.ckpt; checkpoints there: ['last']",
        ),
        "unknown checkpoint": (
            [f"run={ranks}", f"out={out}", "checkpoint=worst"],
            "checkpoint='worst' is unknown; valid: ['best', 'last']",
        ),
        "unknown output": (
            [f"run={ranks}", f"out={out}", "output=logits"],
            "output='logits' is unknown; valid: ['probabilities', 'embeddings', 'values', 'scores']",
        ),
        "another task's output": (
            [f"run={ranks}", f"out={out}", "output=values"],
            "output=values is not one of task=node_classification's: "
            "['probabilities', 'embeddings']",
        ),
        "another extension": (
            [f"run={ranks}", f"out={tmp_path / 'p.json'}"],
            "the file's extension must be one of ['.parquet', '.csv']",
        ),
        "another run's weights": (
            [f"run={ranks}", f"out={out}", "ckpt_path=elsewhere.ckpt"],
            "predict takes the run's own weights; choose them with checkpoint=best|last",
        ),
        "other data": (
            [f"run={ranks}", f"out={out}", f"dataset.root={other}"],
            "dataset.content: checkpoint '",
        ),
        "another model": (
            [f"run={ranks}", f"out={out}", "model.hidden=32"],
            "was written by another run than the one run=",
        ),
    }
    for name, (args, message) in cases.items():
        code, err = _main(args, capsys)
        assert code == 1 and message in err, (name, err)
    assert "model.hidden: checkpoint 64, this run 32" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_run", "other"]
    code, err = _main([f"out={out}"], capsys)
    assert code == 1 and "run= missing" in err and "usage:" in err
