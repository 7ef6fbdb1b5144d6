"""ByteGNN from a partition directory (docs/partitioning.md, docs/systems/bytegnn.md): a rank
that holds only its own part (the other parts' folders deleted) samples, fetches and evaluates
exactly what the in-memory rank does; train.py from a directory equals the in-memory run bit
for bit; a directory that does not fit the run fails before any rank starts."""

import shutil
from pathlib import Path

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.book import PartitionBook, build_local_partition, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition_dir import PartitionDirError, part_folder
from lightning_gnnscale.graph.sampler import BlockBuilder, build_block_carried
from lightning_gnnscale.partition import partition
from lightning_gnnscale.systems.bytegnn import ByteGNNConfig, ByteGNNDataModule
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import launcher_without_ranks
from tests.test_partition_dir import SBM, _steps

FANOUTS = [5, 3]


def make_dm(cache_dir, partition_dir=None, fanouts=FANOUTS):
    """A float64 ByteGNN DataModule on the small sbm graph (its K-hop block partitioner, K = 2)."""
    data = DataConfig(batch_size=64, fanouts=fanouts, partition_dir=partition_dir)
    return ByteGNNDataModule(
        "sbm",
        ByteGNNConfig(),
        data,
        seed=3,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options=SBM,
    )


# ---------------------------------------------------------------- the shared machinery
def test_the_carried_degree_block_equals_the_dense_builders():
    """Degrees that travel with the sampled ids give ``BlockBuilder``'s block exactly."""
    gen = torch.Generator().manual_seed(0)
    n = 500
    degree = torch.randint(0, 40, (n,), generator=gen)
    dense = BlockBuilder(n, degree)
    for _ in range(20):
        dst = torch.randperm(n, generator=gen)[:37]
        src = torch.randint(0, n, (200,), generator=gen)
        dst_pos = torch.sort(torch.randint(0, 37, (200,), generator=gen)).values
        want = dense(dst, src, dst_pos)
        got = build_block_carried(dst, degree[dst], src, dst_pos, degree[src])
        assert torch.equal(got.src_ids, want.src_ids) and got.num_dst == want.num_dst
        assert torch.equal(got.edge_index, want.edge_index)
        assert torch.equal(got.src_deg, want.src_deg)


def test_a_partition_finds_the_ids_it_holds():
    """``LocalPartition.find``: core and halo gids map to their local ids, others are not held;
    ``arrays`` / ``from_arrays`` round-trip the partition."""
    dataset = sbm(num_nodes=200, num_classes=3, avg_degree=4.0, num_features=2, seed=1)
    parts = torch.randint(0, 3, (200,), generator=torch.Generator().manual_seed(2))
    book = PartitionBook.from_parts(parts, 3)
    graph, targets = relabel_graph(dataset.graph, book), dataset.targets.rows(book.new2old)
    for k in range(3):
        local = build_local_partition(graph, targets, book, k)
        gids = torch.arange(200)
        lid, held = local.find(gids)
        want = torch.full((200,), -1)
        want[local.local2global] = torch.arange(local.num_local)
        assert torch.equal(held, want >= 0)
        assert torch.equal(lid[held], want[held])
        again = type(local).from_arrays(local.arrays(), k, targets.out_dim)
        assert again.targets.out_dim == targets.out_dim
        assert again.arrays().keys() == local.arrays().keys()
        for name, array in local.arrays().items():
            assert torch.equal(again.arrays()[name], array), name


@pytest.mark.parametrize("task", ["node_classification", "node_regression"])
def test_a_part_holds_the_tasks_rows_and_seeds_in_memory_and_from_a_directory(tmp_path, task):
    """``part_of``: each core carries the task's rows (node regression's synthetic float
    targets, not the dataset's labels) and the trainer chunks are the task's training seeds
    (with their degrees); ``load_part`` gives the same rows with the task's head width from
    the directory's meta."""

    def dm(partition_dir=None):
        data = DataConfig(batch_size=32, fanouts=FANOUTS, partition_dir=partition_dir)
        options = dict(num_nodes=150, num_classes=3, num_features=6)
        return ByteGNNDataModule(
            "sbm", ByteGNNConfig(), data, cache_dir=tmp_path, dataset_options=options, task=task
        )

    in_memory = dm()
    prepared = in_memory.prepare(2)
    book, targets = prepared.book, in_memory.targets  # the task's rows, in original ids
    assert targets.target.is_floating_point() == (task == "node_regression")
    in_memory.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    from_dir = dm(str(tmp_path / "parts"))
    opened = from_dir.prepare(2)
    parts = [in_memory.part_of(prepared, k) for k in range(2)]
    for k, part in enumerate(parts):
        core = book.new2old[int(book.node_offsets[k]) : int(book.node_offsets[k + 1])]
        loaded = from_dir.load_part(opened, k).local.targets
        for got in (part.local.targets, loaded):
            assert got.out_dim == in_memory.out_dim == (1 if task == "node_regression" else 3)
            for name, array in targets.rows(core).arrays().items():
                assert torch.equal(got.arrays()[name], array), (k, name)
        assert torch.equal(part.seed_degree, prepared.graph.in_degree()[part.trainer_seeds])
    seeds = torch.cat([part.trainer_seeds for part in parts])
    assert torch.equal(book.new2old[seeds].sort().values, in_memory.train_ids)


# ------------------------------------------------------------ ranks that hold only their part
def _run_steps(dm, comm):
    """:func:`tests.test_partition_dir._steps` on the S-Worker's batches of epoch 1."""
    dm.sworker.last_epoch = 1
    dm.sworker.start()
    try:
        return _steps(dm, comm)
    finally:
        comm.barrier()  # no peer still samples from this rank's store
        dm.stop_service()


def _own_part_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    in_memory = make_dm(tmp_path / "cache")
    in_memory.setup_rank(context, in_memory.rank_part(context))
    in_memory.context = context  # as setup() sets it (evaluation and the meter read it)
    # this rank's own copy of the directory, the other parts' folders removed
    mine = tmp_path / f"rank{rank}"
    shutil.copytree(tmp_path / "parts", mine)
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    from_dir = make_dm(tmp_path / "cache", partition_dir=str(mine))
    from_dir.setup_rank(context, from_dir.rank_part(context))
    from_dir.context = context
    store = from_dir.sworker.store
    assert from_dir.degree is None and store.degree is None
    assert not isinstance(store.book, PartitionBook)  # the [P + 1] offsets only
    structure = []
    for dm in (in_memory, from_dir):
        before = comm.meter.snapshot()["bytes"]["structure"]
        structure.append(_run_steps(dm, comm))
        structure.append(comm.meter.snapshot()["bytes"]["structure"] - before)
    want, mem_bytes, got, dir_bytes = structure
    return want, got, (mem_bytes, dir_bytes)


@pytest.mark.dist
def test_a_bytegnn_rank_with_only_its_part_equals_the_in_memory_rank(tmp_path):
    """Blocks (with their degrees), input rows, target rows, gradients and evaluation counts of
    every step are equal, exactly, with the other part's folder deleted; the degrees of
    vertices beyond the halo arrived with the owners' sampling answers."""
    make_dm(tmp_path / "cache").write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    results = run_distributed(_own_part_rank, 2, tmp_path, timeout_s=150)
    for want, got, structure in results:
        (want_steps, want_counts), (got_steps, got_counts) = want, got
        assert len(want_steps) == len(got_steps) > 0
        for w, g in zip(want_steps, got_steps):
            for wb, gb in zip(w[0], g[0], strict=True):
                for a, b in zip(wb, gb, strict=True):
                    assert torch.equal(a, b)
            for a, b in zip(w[1:], g[1:], strict=True):
                assert torch.equal(a, b)
        assert torch.equal(want_counts, got_counts)
        mem_bytes, dir_bytes = structure  # the owners' answers carry the sources' degrees
        assert 0 < mem_bytes < dir_bytes


# --------------------------------------------------------------------------------- train.py
def cfg_overrides(root: Path) -> list[str]:
    """A small float64 ByteGNN run (the partition command gets the same, plus paths.root)."""
    return [
        f"paths.root={root}",
        "strategy=bytegnn",
        "dtype=float64",
        "dataset.num_features=8",
        "data.fanouts=[5,3]",
    ]


def test_a_bytegnn_directory_that_does_not_fit_fails_before_any_rank_starts(tmp_path, monkeypatch):
    """Another part count, another system's directory, another depth (K-hop blocks for
    K = len(data.fanouts)) and a missing part are refused in the launcher, naming the key or
    the file."""
    common = cfg_overrides(tmp_path)
    out, run = launcher_without_ranks(tmp_path, monkeypatch, common)
    other = tmp_path / "distdgl"

    with pytest.raises(PartitionDirError, match="'num_parts' is 2 but this run has 3") as err:
        run("trainer.devices=3")
    assert "partition.json" in str(err.value)
    with pytest.raises(PartitionDirError, match="'partition_options' is .*'hops': 2"):
        run("data.fanouts=[5,3,2]", "model.num_layers=3")
    distdgl = [*common, "strategy=distdgl", "dataset.num_nodes=300"]
    partition(distdgl, other, log=lambda *_: 0)
    with pytest.raises(PartitionDirError, match="'system' is 'distdgl' but this run has 'bytegnn'"):
        run(parts=other)
    shutil.rmtree(out / part_folder(1))
    with pytest.raises(PartitionDirError, match=f"part 1 is missing: {out / part_folder(1)}"):
        run()
