"""GSplit's ``strategy.topology: partitioned`` (docs/systems/gsplit.md#topology): a rank holds
only its own vertices' CSC rows, in memory and in a partition directory, never reads another
row (spec invariant 7), and samples, trains, evaluates and predicts what ``replicated`` does;
a directory made with one topology is refused for a run with the other."""

import shutil

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.csc_rows import CSCRows
from lightning_gnnscale.graph.partition_dir import PartitionDir, PartitionDirError, part_folder
from lightning_gnnscale.systems.gsplit import GSplitConfig
from lightning_gnnscale.systems.gsplit.sampler import SplitSampler
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import (
    launcher_without_ranks,
    resume_from_directory,
    train_both_ways,
)
from tests.systems.gsplit.test_gsplit import FANOUTS, setup_graph
from tests.systems.gsplit.test_partition_dir_gsplit import _gathered, _steps, cfg_overrides, make_dm

PARTITIONED = GSplitConfig(topology="partitioned")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy.topology=ring"], "strategy.topology='ring' is unknown; valid: ['replicated', "),
        (
            ["strategy.topology=partitioned", "strategy.redundancy_probe_steps=2"],
            "needs the whole topology; set strategy.topology=replicated",
        ),
    ],
)
def test_bad_topology_settings_are_refused_at_validation(tmp_path, overrides, message):
    """An unknown topology names the valid values; the redundancy probe (whole mini-batches
    on rank 0) is refused with a partitioned topology."""
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.preflight import validate
    from tests.helpers.config import make_cfg

    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        validate(make_cfg(tmp_path, "strategy=gsplit", *overrides))


@pytest.mark.parametrize("copy_edges", [7, 1 << 20])
def test_owned_rows_are_the_whole_csc_rows_in_order(monkeypatch, copy_edges):
    """``CSCRows.owned`` copies each own row's segment in order (in chunks of ``copy_edges``
    entries, or in one): row ``i`` is vertex ``ids[i]``'s segment of the whole CSC, its
    degrees the whole graph's."""
    from lightning_gnnscale.graph import csc_rows

    monkeypatch.setattr(csc_rows, "COPY_EDGES", copy_edges)
    dataset, parts, _ = setup_graph(3)
    graph = dataset.graph
    for rank in range(3):
        own = (parts == rank).nonzero().flatten()
        held = CSCRows.owned(graph.indptr, graph.indices, own)
        assert held.num_rows == own.numel()
        for i, v in enumerate(own.tolist()):
            segment = held.indices[held.indptr[i] : held.indptr[i + 1]]
            assert torch.equal(segment, graph.indices[graph.indptr[v] : graph.indptr[v + 1]])
        assert torch.equal(held.degree(torch.arange(graph.num_nodes)), graph.in_degree())


# ------------------------------------------------------------------ sampling (invariant 7)
class ReadLog(CSCRows):
    """:class:`CSCRows` that records the ids of every row read."""

    def __init__(self, rows: CSCRows):
        super().__init__(rows.indptr, rows.indices, rows.degree, rows.ids)
        self.read: list[torch.Tensor] = []

    def rows(self, ids):
        self.read.append(ids.clone())
        return super().rows(ids)


def _sampling_rank(rank, world_size):
    dataset, parts, seeds = setup_graph(world_size)
    graph = dataset.graph
    comm = Comm.create()
    own = (parts == rank).nonzero().flatten()
    whole = CSCRows.whole(graph.indptr, graph.indices)
    held = ReadLog(CSCRows.owned(graph.indptr, graph.indices, own))
    # the rank's topology holds its own rows, each segment in order, and nothing else
    assert torch.equal(held.ids, own)
    assert held.num_rows == own.numel()
    assert torch.equal(
        held.indices, torch.cat([graph.indices[graph.indptr[v] : graph.indptr[v + 1]] for v in own])
    )
    others = (parts != rank).nonzero().flatten()
    with pytest.raises(KeyError, match=f"vertex {int(others[0])}'s CSC row is not held"):
        held.rows(others[:1])
    held.read.clear()
    out = []
    for topology in (whole, held):
        sampler = SplitSampler(comm, parts, topology, FANOUTS, seed=5)
        for epoch, step in ((0, 0), (3, 1), (3, 2)):
            part = seeds.roll(7 * step)[: 40 - 5 * step]  # a different global batch per step
            blocks, plans, inputs = sampler.sample(part[parts[part] == rank], epoch, step)
            out.append(
                (
                    [(b.src_ids, b.edge_index, b.src_deg) for b in blocks],
                    [(p.send_index, p.send_splits, p.recv_splits, p.recv_order) for p in plans],
                    inputs,
                )
            )
    read = torch.cat(held.read)
    assert bool((parts[read] == rank).all()), "read a row it does not own"
    return out, held.num_entries, graph.num_edges, read.numel()


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_partitioned_sampling_reads_only_owned_rows_and_equals_replicated(world_size):
    """Spec invariant 7: every row the sampler reads is the rank's own (it holds no other),
    and every step's blocks, shuffle plans and input vertices ``D^0`` equal the replicated
    topology's, on every rank; the ranks' rows together are the graph's edges, once."""
    results = run_distributed(_sampling_rank, world_size, timeout_s=120)
    assert sum(r[3] for r in results) > 0  # rows were read
    for out, *_ in results:
        replicated, partitioned = out[: len(out) // 2], out[len(out) // 2 :]
        for want, got in zip(replicated, partitioned, strict=True):
            for w, g in zip(want[0] + want[1], got[0] + got[1], strict=True):
                for a, b in zip(w, g, strict=True):
                    assert torch.equal(a, b) if torch.is_tensor(a) else a == b
            assert torch.equal(want[2], got[2])
    assert sum(r[1] for r in results) == results[0][2]


# ------------------------------------------------- DataModules: memory, directory, evaluation
def _topology_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))

    def set_up(dm):
        dm.setup_rank(context, dm.rank_part(context))
        dm.context = context  # as setup() sets it (evaluation reads it)
        return dm

    want = _steps(set_up(make_dm(tmp_path / "cache")), comm, probe=False)
    in_memory = set_up(make_dm(tmp_path / "cache", config=PARTITIONED))
    own = (in_memory.parts == rank).nonzero().flatten()
    assert torch.equal(in_memory.sampler.topology.ids, own)  # own rows only
    # this rank's own copy of the partitioned directory, the other parts' folders removed
    mine = tmp_path / f"rank{rank}"
    shutil.copytree(tmp_path / "parts", mine)
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    from_dir = set_up(make_dm(tmp_path / "cache", str(mine), PARTITIONED))
    held = from_dir.sampler.topology
    assert (
        held.num_rows == own.numel() and held.num_entries == in_memory.sampler.topology.num_entries
    )
    return want, _steps(in_memory, comm, probe=False), _steps(from_dir, comm, probe=False)


@pytest.mark.dist
def test_partitioned_ranks_equal_replicated_in_memory_and_from_a_directory(tmp_path):
    """2 ranks, float64, GCN: with ``topology: partitioned``, in memory and from a directory
    whose other part folder is deleted (and which has no shared topology), every step's
    blocks, input rows, labels, loss and gradient equal the replicated in-memory rank's
    exactly, and so do the evaluation counts; the predictions (each rank its own vertices)
    equal the replicated node-range rows to 1e-12, and the two partitioned paths' bit for
    bit."""
    make_dm(tmp_path / "cache", config=PARTITIONED).write_partition_dir(
        tmp_path / "parts", 2, log=lambda *_: 0
    )
    opened = PartitionDir.open(tmp_path / "parts")
    assert opened.meta["partition_options"]["topology"] == "partitioned"
    assert set(opened.meta["shared"]) == {"vertices"}
    assert not (tmp_path / "parts" / "shared-topology").exists()
    assert all(p["shared"] == ["vertices"] for p in opened.meta["parts"])
    new2old = torch.cat([opened.load_part(k)["orig_ids"] for k in range(2)])
    results = run_distributed(_topology_rank, 2, tmp_path, timeout_s=150)
    for want, memory, directory in results:
        assert len(want[0]) == len(memory[0]) == len(directory[0]) > 0
        for w, m, d in zip(want[0], memory[0], directory[0], strict=True):
            for (w_ids, w_edges, w_deg), (m_ids, m_edges, m_deg), (d_ids, d_edges, d_deg) in zip(
                w[0], m[0], d[0], strict=True
            ):
                assert torch.equal(w_ids, m_ids) and torch.equal(w_ids, new2old[d_ids])
                assert torch.equal(w_edges, m_edges) and torch.equal(w_edges, d_edges)
                assert torch.equal(w_deg, m_deg) and torch.equal(w_deg, d_deg)
            for a, b, c in zip(w[1:], m[1:], d[1:], strict=True):
                assert torch.equal(a, b) and torch.equal(a, c)
        assert torch.equal(want[1], memory[1]) and torch.equal(want[1], directory[1])
    for output in (0, 1):  # every node's logits; four nodes' embeddings
        want_ids, want_rows = _gathered([r[0][2][output] for r in results])
        memory_ids, memory_rows = _gathered([r[1][2][output] for r in results])
        dir_ids, dir_rows = _gathered([r[2][2][output] for r in results])
        assert torch.equal(want_ids, memory_ids) and torch.equal(want_ids, dir_ids)
        assert torch.equal(memory_rows, dir_rows)  # the same rows beside the same rows
        torch.testing.assert_close(memory_rows, want_rows, rtol=0, atol=1e-12)
    assert want_ids.tolist() == [0, 7, 150, 299]


# --------------------------------------------------------------------------------- train.py
@pytest.mark.e2e
def test_partitioned_trains_as_replicated_in_memory_and_from_a_directory(tmp_path, monkeypatch):
    """float64, 2 ranks, GAT: ``topology: partitioned`` in memory and from a directory give
    the replicated run's final weights bit for bit, and its every epoch's loss and validation
    accuracy and its test accuracy; a directory run stopped after one epoch and resumed from
    its checkpoint ends with the uninterrupted run's weights bit for bit."""
    from lightning_gnnscale.run import train
    from tests.helpers.config import make_cfg
    from tests.test_partition_dir import _assert_equal, _weights

    replicated, _ = train(make_cfg(tmp_path / "replicated", *cfg_overrides(tmp_path)))
    common = [*cfg_overrides(tmp_path), "strategy.topology=partitioned"]
    partitioned, from_dir = train_both_ways(tmp_path, monkeypatch, common, keys=("train_loss",))
    resume_from_directory(tmp_path, common, from_dir)
    _assert_equal(_weights(tmp_path / "replicated" / "out"), _weights(tmp_path / "mem" / "out"))
    for key in ("train_loss", "val_acc"):
        assert [h[key] for h in partitioned["history"]] == [
            h[key] for h in replicated["history"]
        ], key
    assert partitioned["test_acc"] == replicated["test_acc"]


def test_a_directory_of_the_other_topology_is_refused_before_any_rank_starts(tmp_path, monkeypatch):
    """A replicated directory for a partitioned run, and a partitioned one for a replicated
    run, fail in the launcher, naming ``partition_options``' ``topology``."""
    from lightning_gnnscale.partition import partition
    from tests.helpers.partition_runs import NODES

    common = cfg_overrides(tmp_path)
    _, run = launcher_without_ranks(tmp_path, monkeypatch, common)
    with pytest.raises(
        PartitionDirError, match="'partition_options' is .*'topology': 'replicated'"
    ):
        run("strategy.topology=partitioned")
    other = tmp_path / "partitioned"
    partition([NODES, *common, "strategy.topology=partitioned"], other, log=lambda *_: 0)
    with pytest.raises(
        PartitionDirError, match="'partition_options' is .*'topology': 'partitioned'"
    ):
        run(parts=other)
    with pytest.raises(AssertionError, match="a rank was started"):  # the fitting run starts
        run("strategy.topology=partitioned", parts=other)


# ----------------------------------------------------------------------- plain Lightning
def _plain_lightning_ranks(out) -> None:
    """One epoch, then ``trainer.predict``, under ``L.Trainer(precision="64-true")``: the
    replicated in-memory DataModule, and partitioned ones in memory and from the directory."""
    import lightning as L

    import lightning_gnnscale as gs
    from tests.helpers.partition_runs import float64_trainer
    from tests.helpers.predictions import predict_shares
    from tests.test_partition_dir import MODEL

    results = {}
    for key in ("replicated", "memory", "directory"):
        L.seed_everything(0, verbose=False)
        config = GSplitConfig() if key == "replicated" else PARTITIONED
        parts = str(out / "parts") if key == "directory" else None
        dm = make_dm(out / "cache", parts, config)
        module = gs.GNNModule.from_config(MODEL, dm)
        trainer = float64_trainer(gs.GSplitStrategy(dm.config), max_epochs=1)
        trainer.fit(module, datamodule=dm)
        weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        results[key] = (weights, predict_shares(trainer, module, dm))
    torch.save(results, out / f"rank{trainer.global_rank}.pt")


@pytest.mark.dist
def test_trainer_predict_under_a_partitioned_topology_gives_the_replicated_rows(tmp_path):
    """A plain Lightning script: one epoch with ``topology: partitioned`` (in memory, and from
    a directory) trains the replicated run's weights bit for bit; ``trainer.predict``'s shares
    (each rank its own vertices) cover every requested node once, equal the oracle's
    full-neighbourhood rows and the replicated run's to 1e-12."""
    from lightning_gnnscale.graph.datasets import load_dataset
    from lightning_gnnscale.launch import launch_local
    from tests.helpers.predictions import REQUESTED, check_predictions, gather
    from tests.test_partition_dir import MODEL, SBM, _assert_equal

    make_dm(tmp_path / "cache", config=PARTITIONED).write_partition_dir(
        tmp_path / "parts", 2, log=lambda *_: 0
    )
    launch_local(_plain_lightning_ranks, (tmp_path,), devices=2, num_nodes=1, timeout_s=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    dataset = load_dataset("sbm", **SBM)
    num_nodes = dataset.graph.num_nodes
    replicated = [r["replicated"][1] for r in ranks]
    for key in ("memory", "directory"):
        _assert_equal(ranks[0]["replicated"][0], ranks[0][key][0])
        shares = [r[key][1] for r in ranks]
        check_predictions(shares, dataset, MODEL, ranks[0][key][0])
        for output, requested in (("embeddings", None), ("logits", REQUESTED)):
            torch.testing.assert_close(
                gather(shares, output, num_nodes, requested),
                gather(replicated, output, num_nodes, requested),
                rtol=0,
                atol=1e-12,
            )
