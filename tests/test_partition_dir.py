"""Partition directories (docs/partitioning.md): the format and its checks, the table-free
block builder and range book a rank uses, DistDGL ranks that hold only their own part (equal
to the in-memory path step for step), and train.py from a directory (bit for bit, resume)."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig, ModelConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.book import PartitionBook, RangeBook
from lightning_gnnscale.graph.dataset_config import SBMConfig
from lightning_gnnscale.graph.partition_dir import (
    METADATA,
    PartitionDir,
    PartitionDirError,
    PartitionDirWriter,
    metadata_digest,
    part_folder,
)
from lightning_gnnscale.graph.sampler import BlockBuilder, build_block_sorted
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.preflight import validate
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.ddp import DataParallelConfig, DataParallelDataModule
from lightning_gnnscale.systems.distdgl import DistDGLConfig, DistDGLDataModule, PartitionConfig
from tests.helpers.config import make_cfg
from tests.helpers.dist import run_distributed

FANOUTS = [5, 3]
# every strategy that loads from a partition directory, as its refusal lists them
SUPPORTING = ", ".join(
    repr(name)
    for name in (
        "bytegnn",
        "cagnet",
        "distdgl",
        "granndis",
        "granndis_cob",
        "granndis_fb_base",
        "granndis_flx",
        "grappa",
        "grappa_50s",
        "grappa_fp",
        "grappa_naive",
        "grappa_uw",
        "gsplit",
        "hopgnn",
        "hopgnn_mc",
        "sancus",
    )
)
SBM = dict(num_nodes=300, num_classes=4, avg_degree=8.0, num_features=10, seed=5)
MODEL = ModelConfig(hidden=8, num_layers=2)


def make_dm(
    cache_dir,
    partition_dir=None,
    dataset="sbm",
    method="random",
    seed=3,
    **options,
):
    """A float64 DistDGL DataModule on the small sbm graph, by name."""
    config = DistDGLConfig(partition=PartitionConfig(method=method))
    data = DataConfig(batch_size=64, fanouts=FANOUTS, partition_dir=partition_dir)
    return DistDGLDataModule(
        dataset,
        config,
        data,
        seed=seed,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options={**(SBM if dataset == "sbm" else {}), **options},
    )


def write_dir(tmp_path: Path, world_size: int = 2, name=None, **kwargs) -> Path:
    out = tmp_path / (name or f"parts{world_size}")
    if not out.exists():
        make_dm(tmp_path / "cache", **kwargs).write_partition_dir(out, world_size, log=lambda *_: 0)
    return out


# ---------------------------------------------------------------- the rank's data structures
def test_sorted_block_builder_equals_the_dense_one():
    gen = torch.Generator().manual_seed(0)
    n = 500
    degree = torch.randint(0, 40, (n,), generator=gen)
    dense = BlockBuilder(n, degree)
    for _ in range(20):
        dst = torch.randperm(n, generator=gen)[:37]
        src = torch.randint(0, n, (200,), generator=gen)
        dst_pos = torch.sort(torch.randint(0, 37, (200,), generator=gen)).values
        want = dense(dst, src, dst_pos)
        got = build_block_sorted(dst, src, dst_pos, lambda ids: degree[ids])
        assert torch.equal(got.src_ids, want.src_ids) and got.num_dst == want.num_dst
        assert torch.equal(got.edge_index, want.edge_index)
        assert torch.equal(got.src_deg, want.src_deg)


def test_range_book_equals_the_partition_book():
    parts = torch.randint(0, 4, (1000,), generator=torch.Generator().manual_seed(1))
    full = PartitionBook.from_parts(parts, 4)
    offsets = full.node_offsets.clone()
    assert offsets.tolist() == [0, *torch.bincount(parts, minlength=4).cumsum(0).tolist()]
    book = RangeBook(offsets)
    gids = torch.randint(0, 1000, (300,))
    want_part, want_local = torch.full_like(gids, -1), torch.full_like(gids, -1)
    for k in range(4):  # the contract, range by range
        inside = (gids >= offsets[k]) & (gids < offsets[k + 1])
        want_part[inside], want_local[inside] = k, gids[inside] - offsets[k]
    assert torch.equal(book.nid2part(gids), want_part)
    assert torch.equal(book.nid2local(gids), want_local)
    assert book.num_nodes == full.num_nodes and book.num_parts == 4
    with pytest.raises(ValueError, match="gids must lie"):
        book.nid2part(torch.tensor([1000]))


# ---------------------------------------------------------------------- the format itself
def test_a_part_holds_its_partition_and_loads_memory_mapped(tmp_path):
    out = write_dir(tmp_path)
    meta = json.loads((out / METADATA).read_text())
    assert meta["system"] == "distdgl" and meta["num_parts"] == 2 and meta["version"] == 1
    # the dataset's typed settings, every one (those not given at their defaults)
    assert meta["dataset"] == {"name": "sbm", "options": {**SBMConfig().options, **SBM}}
    assert meta["num_nodes"] == 300 and meta["feature_dtype"] == "float64"
    assert sum(p["nodes"] for p in meta["parts"]) == 300
    # what the in-memory path cuts out of the whole graph, part by part
    prepared = make_dm(tmp_path / "cache").prepare(2)
    degree = prepared.graph.in_degree()
    opened = PartitionDir.open(out)
    for k in range(2):
        from lightning_gnnscale.graph.book import build_local_partition

        local = build_local_partition(prepared.graph, prepared.targets, prepared.book, k)
        part, arrays = opened.load_part(k), local.arrays()
        for name in ("indptr", "indices", "local2global", "x", "y", "train_mask", "test_mask"):
            assert torch.equal(part[name], arrays[name]), name
        assert torch.equal(part["degree"], degree[local.local2global])
        lo, hi = prepared.book.node_offsets[k : k + 2].tolist()
        assert torch.equal(part["orig_ids"], prepared.book.new2old[lo:hi])
        assert meta["parts"][k]["halo"] == local.num_halo
        # memory-mapped: the features' memory is a mapping of the part's x.npy
        maps = Path("/proc/self/maps").read_text().splitlines()
        ptr, x_file = part["x"].data_ptr(), str(out / part_folder(k) / "x.npy")
        mapped = [
            line
            for line in maps
            if line.endswith(x_file)
            and int(line.split("-")[0], 16) <= ptr < int(line.split()[0].split("-")[1], 16)
        ]
        assert mapped, "x is not a mapping of x.npy"


@pytest.mark.parametrize("system", ["distdgl", "bytegnn"])
def test_a_halo_part_from_a_directory_is_the_in_memory_part(tmp_path, system):
    """DistDGL's and ByteGNN's ``load_part`` returns the part ``part_of`` builds in memory
    (what ``write_parts`` wrote): the same files, offsets and chunk sizes, hence the same
    trainer split, which equals the split over every training id; only the book, the ``[N]``
    degrees and what the ranks agree on come from what the rank holds."""
    from lightning_gnnscale.graph.seed_split import SeedSplit
    from lightning_gnnscale.systems.bytegnn import ByteGNNConfig, ByteGNNDataModule

    def dm(partition_dir=None):
        if system == "distdgl":
            return make_dm(tmp_path / "cache", partition_dir)
        data = DataConfig(batch_size=64, fanouts=FANOUTS, partition_dir=partition_dir)
        return ByteGNNDataModule(
            "sbm", ByteGNNConfig(), data, seed=3, cache_dir=tmp_path / "cache",
            dtype=torch.float64, dataset_options=SBM,
        )  # fmt: skip

    in_memory = dm()
    in_memory.write_partition_dir(tmp_path / "parts", 3, log=lambda *_: 0)
    from_dir = dm(str(tmp_path / "parts"))
    prepared, opened = in_memory.prepare(3), from_dir.prepare(3)
    train = prepared.targets.split("train").nonzero().flatten()
    for k in range(3):
        want, got = in_memory.part_of(prepared, k), from_dir.load_part(opened, k)
        files = want.arrays()
        assert ("trainer_seed_degree" in files) == (system == "bytegnn")
        assert files.keys() == got.arrays().keys()
        for name, array in files.items():
            assert torch.equal(got.arrays()[name], array), name
        assert torch.equal(got.trainer_sizes, want.trainer_sizes)
        assert torch.equal(got.book.node_offsets, want.book.node_offsets)
        assert torch.equal(want.local_degree, want.degree[want.local.local2global])
        assert got.degree is None and not hasattr(got.book, "new2old")
        assert torch.equal(want.agreed, prepared.book.new2old)
        assert got.agreed is None  # no agreement collective: the kit checked the directory
        whole = SeedSplit(train, 3, k, 64, 3)
        for part in (want, got):
            split = part.seed_split(64, 3)
            assert torch.equal(split.mine, whole.mine) and split.steps == whole.steps
            assert torch.equal(split.seeds(1, 0), whole.seeds(1, 0))


def test_the_command_refuses_a_used_out_before_loading_the_dataset(tmp_path, monkeypatch):
    from lightning_gnnscale import partition, run

    def no_load(*args, **kwargs):
        raise AssertionError("the dataset was loaded")

    monkeypatch.setattr(run, "build_datamodule", no_load)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / part_folder(0)).mkdir()  # an interrupted write: no partition.json
    with pytest.raises(PartitionDirError, match="an unfinished write; remove it"):
        partition.partition(["strategy=distdgl"], tmp_path / "half", log=lambda *_: 0)


def test_the_writer_never_overwrites(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("mine")
    with pytest.raises(PartitionDirError, match="not an empty folder"):
        PartitionDirWriter(tmp_path / "full")


# ------------------------------------------------------------------ checks before any spawn
def _edit_meta(out: Path, seal: bool = True, **changes) -> None:
    """Change ``partition.json`` as another run's partitioning would have written it (``seal``:
    with its digest), or as a hand edit (without)."""
    meta = json.loads((out / METADATA).read_text())
    meta.update(changes)
    if seal:
        meta["blake2b"] = metadata_digest(meta)
    (out / METADATA).write_text(json.dumps(meta))


def test_an_edited_or_inconsistent_metadata_file_is_refused(tmp_path):
    out = write_dir(tmp_path)
    meta = json.loads((out / METADATA).read_text())
    dm = make_dm(tmp_path / "cache", partition_dir=str(out))
    _edit_meta(out, seal=False, trainer_sizes=[size + 5 for size in meta["trainer_sizes"]])
    with pytest.raises(PartitionDirError, match=r"partition.json: its content does not match"):
        dm.prepare(2)
    offsets = list(meta["node_offsets"])
    offsets[1] += 3
    _edit_meta(out, trainer_sizes=meta["trainer_sizes"], node_offsets=offsets)
    with pytest.raises(PartitionDirError, match=r"'node_offsets' .* disagree with the parts"):
        dm.prepare(2)


@pytest.mark.parametrize(
    "kwargs, world_size, match",
    [
        ({"num_nodes": 301}, 2, "'dataset' is"),
        ({"dataset": "rmat"}, 2, "'dataset' is"),
        ({}, 3, "'num_parts' is 2 but this run has 3"),
        ({"method": "metis"}, 2, "'method' is 'random' but this run has 'metis'"),
        ({"seed": 4}, 2, "'seed' is 3 but this run has 4"),
    ],
)
def test_a_directory_for_another_run_is_refused(tmp_path, kwargs, world_size, match):
    out = write_dir(tmp_path)
    dm = make_dm(tmp_path / "cache", partition_dir=str(out), **kwargs)
    with pytest.raises(PartitionDirError, match=match) as err:
        dm.prepare(world_size)
    assert METADATA in str(err.value)


def test_a_directory_for_another_system_or_a_future_format_is_refused(tmp_path):
    out = write_dir(tmp_path)
    dm = make_dm(tmp_path / "cache", partition_dir=str(out))
    _edit_meta(out, system="bytegnn")
    with pytest.raises(PartitionDirError, match="'system' is 'bytegnn' but this run has 'distdgl'"):
        dm.prepare(2)
    _edit_meta(out, system="distdgl", version=2)
    with pytest.raises(PartitionDirError, match=r"partition.json: 'version' 2 is newer"):
        dm.prepare(2)
    (out / METADATA).unlink()
    with pytest.raises(PartitionDirError, match="partition.json is missing"):
        dm.prepare(2)


def test_missing_truncated_and_corrupt_parts_are_named(tmp_path):
    out = write_dir(tmp_path)
    part1 = out / part_folder(1)
    dm = make_dm(tmp_path / "cache", partition_dir=str(out))
    shutil.rmtree(part1)
    dm.prepare(2, ranks=[0])  # a node whose ranks need part 0 only
    with pytest.raises(PartitionDirError, match=f"part 1 is missing: {part1}"):
        make_dm(tmp_path / "cache", partition_dir=str(out)).prepare(2, ranks=[0, 1])
    x = out / part_folder(0) / "x.npy"
    data = x.read_bytes()
    x.write_bytes(data[:-8])
    with pytest.raises(PartitionDirError, match=f"{x} has {len(data) - 8} bytes"):
        make_dm(tmp_path / "cache", partition_dir=str(out)).prepare(2, ranks=[0])
    x.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    with pytest.raises(PartitionDirError, match=f"{x} does not match its digest"):
        make_dm(tmp_path / "cache", partition_dir=str(out)).prepare(2, ranks=[0])


def test_systems_without_partition_dirs_refuse_the_setting(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"strategy=ddp.*: \[" + re.escape(SUPPORTING) + r"\]",
    ):
        validate(make_cfg(tmp_path, "strategy=ddp", f"data.partition_dir={tmp_path}"))
    with pytest.raises(ConfigError, match=r"not supported by strategy=ddp"):
        DataParallelDataModule("sbm", DataParallelConfig(), DataConfig(partition_dir=str(tmp_path)))


def test_train_checks_the_directory_before_any_rank_starts(tmp_path, monkeypatch):
    import lightning_gnnscale.run as run_module
    from lightning_gnnscale.partition import partition

    def no_spawn(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(run_module, "launch_local", no_spawn)
    out = tmp_path / "parts"
    partition([*cfg_overrides(tmp_path), "dataset.num_nodes=300"], out, log=lambda *_: 0)
    cfg = make_cfg(tmp_path, *cfg_overrides(tmp_path), "trainer.devices=4")
    with pytest.raises(PartitionDirError, match="'num_parts' is 2 but this run has 4"):
        train(
            make_cfg(
                tmp_path, *cfg_overrides(tmp_path), "trainer.devices=4", f"data.partition_dir={out}"
            )
        )
    x = out / part_folder(0) / "x.npy"  # the same bytes, outside the directory
    shutil.move(x, tmp_path / "x.npy")
    x.symlink_to(tmp_path / "x.npy")
    with pytest.raises(PartitionDirError, match=f"{x} leads outside the partition directory"):
        train(make_cfg(tmp_path, *cfg_overrides(tmp_path), f"data.partition_dir={out}"))
    x.unlink()
    shutil.move(tmp_path / "x.npy", x)
    shutil.rmtree(out / part_folder(1))
    with pytest.raises(PartitionDirError, match="part 1 is missing"):
        train(make_cfg(tmp_path, *cfg_overrides(tmp_path), f"data.partition_dir={out}"))
    del cfg


def cfg_overrides(root: Path) -> list[str]:
    """A small float64 DistDGL run (the partition command gets the same, plus paths.root)."""
    return [f"paths.root={root}", "strategy=distdgl", "dtype=float64", "dataset.num_features=8"]


# ------------------------------------------------------------ ranks that hold only their part
def _steps(dm, comm, net_seed=0):
    """Per step: blocks, input rows, labels and the gradient of a GCN; then eval counts."""
    torch.manual_seed(net_seed)
    net = BlockGNN("gcn", dm.input_dim, 16, dm.out_dim, num_layers=2, dropout=0.0).double()
    out = []
    for step in range(dm.steps_per_epoch):
        batch = dm.make_batch(1, step)
        net.zero_grad()
        loss = F.cross_entropy(net(batch.blocks, batch.x), batch.y, reduction="sum")
        (loss / batch.global_seed_count).backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        comm.all_reduce(grad, category="gradient")
        blocks = [(b.src_ids, b.edge_index, b.src_deg) for b in batch.blocks]
        out.append((blocks, batch.x, batch.y, grad))
    counts = comm.all_reduce(dm.eval_statistics(net.eval(), ("val", "test")), category="control")
    return out, counts


def _own_part_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    in_memory = make_dm(tmp_path / "cache")
    context = RankContext(comm, torch.device("cpu"))
    in_memory.setup_rank(context, in_memory.rank_part(context))
    want = _steps(in_memory, comm)
    # this rank's own copy of the directory, the other parts' folders removed
    mine = tmp_path / f"rank{rank}"
    shutil.copytree(tmp_path / f"parts{world_size}", mine)
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    from_dir = make_dm(tmp_path / "cache", partition_dir=str(mine))
    from_dir.setup_rank(context, from_dir.rank_part(context))
    assert from_dir.degree is None and not hasattr(from_dir.kv.book, "new2old")
    got = _steps(from_dir, comm)
    return want, got


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_rank_with_only_its_part_equals_the_in_memory_rank(tmp_path, world_size):
    """Blocks (with their degrees), input rows, labels, gradients and evaluation counts of
    every step are equal, exactly, with the other parts' folders deleted."""
    write_dir(tmp_path, world_size)
    results = run_distributed(_own_part_rank, world_size, tmp_path, timeout_s=150)
    for want, got in results:
        (want_steps, want_counts), (got_steps, got_counts) = want, got
        assert len(want_steps) == len(got_steps) > 0
        for w, g in zip(want_steps, got_steps):
            for wb, gb in zip(w[0], g[0]):
                for a, b in zip(wb, gb):
                    assert torch.equal(a, b)
            for a, b in zip(w[1:], g[1:]):
                assert torch.equal(a, b)
        assert torch.equal(want_counts, got_counts)


# --------------------------------------------------------------------------------- train.py
def _weights(output_dir: Path) -> dict:
    ckpt = torch.load(output_dir / "checkpoints" / "last.ckpt", weights_only=True)
    state = dict(ckpt["state_dict"])
    for key, value in ckpt.items():  # the DataModule's state (embedding tables)
        if key.endswith("DataModule"):
            state.update({f"dm.{k}": v for k, v in value.items()})
    return state


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key  # bit for bit: atol=0
        else:
            assert a[key] == b[key], key


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [[], ["strategy.embedding_dim=8"]], ids=["features", "emb"])
def test_train_from_a_directory_equals_in_memory_and_resumes(tmp_path, monkeypatch, extra):
    """float64, 2 ranks: final weights (and embedding tables) from the directory equal the
    in-memory run's bit for bit, also when the directory run stops after one epoch and
    resumes; the launcher never loads the dataset."""
    from lightning_gnnscale.partition import partition

    common = [*cfg_overrides(tmp_path), *extra]
    out = tmp_path / "parts"
    partition(["dataset.num_nodes=300", *common], out, log=lambda *_: 0)
    metrics, _ = train(make_cfg(tmp_path / "mem", *common))
    want = _weights(tmp_path / "mem" / "out")

    import lightning_gnnscale.kit.datamodule as datamodule_module
    import lightning_gnnscale.run as run_module

    def no_load(*args, **kwargs):
        raise AssertionError("the launcher loaded the dataset")

    monkeypatch.setattr(run_module, "load_dataset", no_load)
    monkeypatch.setattr(datamodule_module, "load_dataset", no_load)
    first = make_cfg(tmp_path / "dir", *common, f"data.partition_dir={out}", "trainer.max_epochs=1")
    _, objects = train(first)
    assert objects["graph"] is None
    last = tmp_path / "dir" / "out" / "checkpoints" / "last.ckpt"
    resumed = make_cfg(
        tmp_path / "resumed", *common, f"data.partition_dir={out}", f"ckpt_path={last}"
    )
    got_metrics, _ = train(resumed)
    _assert_equal(want, _weights(tmp_path / "resumed" / "out"))
    assert got_metrics["test_acc"] == metrics["test_acc"]
    assert got_metrics["config_hash"] != metrics["config_hash"]  # a resumed run is its own


def test_the_partition_command_needs_out_and_a_system_that_loads_parts(tmp_path, capsys):
    from lightning_gnnscale.partition import main

    assert main(["strategy=distdgl"]) == 2  # no out=
    assert "usage" in capsys.readouterr().err
    out = tmp_path / "parts"
    assert main([f"paths.root={tmp_path}", "strategy=ddp", f"out={out}"]) == 1
    assert (
        f"strategies that load from a partition directory: [{SUPPORTING}]"
        in capsys.readouterr().err
    )
    assert not out.exists()


# ----------------------------------------------------------------------- SANCUS and CAGNET
def make_sancus_dm(cache_dir, partition_dir=None, name="sancus", dtype=torch.float64):
    from lightning_gnnscale.systems.sancus import SancusConfig, SancusDataModule

    config = SancusConfig.preset(name)
    data = DataConfig(batch_size=-1, fanouts=[-1, -1], partition_dir=partition_dir)
    return SancusDataModule(
        "sbm", config, data, seed=3, cache_dir=cache_dir, dtype=dtype, dataset_options=SBM
    )


def _sancus_rank(rank, world_size, tmp_path):
    comm = Comm.create()
    context = RankContext(comm, torch.device("cpu"))
    in_memory = make_sancus_dm(tmp_path / "cache")
    in_memory.setup_rank(context, in_memory.rank_part(context))
    mine = tmp_path / f"sancus_rank{rank}"
    shutil.copytree(tmp_path / "sancus", mine)
    for k in range(world_size):
        if k != rank:
            shutil.rmtree(mine / part_folder(k))
    from_dir = make_sancus_dm(tmp_path / "cache", partition_dir=str(mine))
    from_dir.setup_rank(context, from_dir.rank_part(context))
    out = []
    for dm in (in_memory, from_dir):
        layout = dm.layout
        out.append(
            {
                **{f"block{j}": b.to_dense() for j, b in enumerate(layout.blocks)},
                "consumer": layout.consumer,
                "seed_rows": layout.seed_rows,
                "x": dm.x,
                **dm.own_targets.arrays(),
                "own_ids": dm.own_ids,
                "train_count": torch.tensor(dm.train_count),
            }
        )
    return out


@pytest.mark.dist
def test_a_sancus_rank_with_only_its_part_holds_the_in_memory_row_block(tmp_path):
    make_sancus_dm(tmp_path / "cache").write_partition_dir(tmp_path / "sancus", 2, log=print)
    for want, got in run_distributed(_sancus_rank, 2, tmp_path, timeout_s=120):
        _assert_equal(want, got)
    with pytest.raises(PartitionDirError, match="'feature_dtype' is 'float64' but this run has"):
        make_sancus_dm(tmp_path / "cache", str(tmp_path / "sancus"), dtype=torch.float32).prepare(2)
    with pytest.raises(PartitionDirError, match="'system' is 'sancus' but this run has 'cagnet'"):
        make_sancus_dm(tmp_path / "cache", str(tmp_path / "sancus"), name="cagnet").prepare(2)


@pytest.mark.e2e
@pytest.mark.parametrize("strategy", ["cagnet"])  # sancus: tests/systems/test_conformance.py
def test_sancus_and_cagnet_train_from_a_directory_as_in_memory(tmp_path, strategy):
    """float64, 2 ranks: the final weights equal the in-memory run's bit for bit."""
    from lightning_gnnscale.partition import partition

    common = [f"paths.root={tmp_path}", f"strategy={strategy}", "dtype=float64"]
    common += ["dataset.num_features=8"]
    out = tmp_path / "parts"
    partition(["dataset.num_nodes=300", *common], out, log=lambda *_: 0)
    mem, _ = train(make_cfg(tmp_path / "mem", *common))
    got, objects = train(make_cfg(tmp_path / "dir", *common, f"data.partition_dir={out}"))
    assert objects["graph"] is None
    _assert_equal(_weights(tmp_path / "mem" / "out"), _weights(tmp_path / "dir" / "out"))
    assert [h["val_acc"] for h in got["history"]] == [h["val_acc"] for h in mem["history"]]


def test_a_node_verifies_the_parts_of_its_own_ranks(monkeypatch):
    from lightning_gnnscale.graph.partition_dir import node_ranks

    for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    assert node_ranks(4, 2) == [0, 1]  # node 0 of 2 nodes x 2 devices
    monkeypatch.setenv("NODE_RANK", "1")
    assert node_ranks(4, 2) == [2, 3]
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert node_ranks(4, 2) == [3]  # a manually launched rank: NODE_RANK x devices + LOCAL_RANK
    monkeypatch.setenv("RANK", "2")
    assert node_ranks(4, 2) == [2]  # torchrun's RANK
    for key in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert node_ranks(4, 2) == [1]  # a task of a multi-task srun


def test_shared_groups_are_written_once_verified_with_their_parts_and_mapped(tmp_path):
    out = tmp_path / "dir"
    writer = PartitionDirWriter(out)
    topology = {"indptr": torch.arange(5), "indices": torch.tensor([3, 2, 1, 0])}
    writer.write_shared("topology", topology)
    writer.write_part(0, {"x": torch.ones(2, 3)}, {"nodes": 2}, shared=["topology"])
    writer.write_part(1, {"x": torch.zeros(2, 3)}, {"nodes": 2})
    meta = writer.finish({"num_parts": 2, "node_offsets": [0, 2, 4], "system": "t", "dataset": {}})
    assert meta["parts"][0]["shared"] == ["topology"] and "shared" not in meta["parts"][1]
    opened = PartitionDir.open(out)
    loaded = opened.load_shared("topology", 0)
    assert all(torch.equal(loaded[name], topology[name]) for name in topology)
    with pytest.raises(PartitionDirError, match="part 1 does not list shared group 'topology'"):
        opened.load_shared("topology", 1)
    indices = out / "shared-topology" / "indices.npy"
    data = indices.read_bytes()
    indices.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    PartitionDir.open(out).verify_parts([1])  # part 1 does not need the group
    with pytest.raises(PartitionDirError, match=f"shared group 'topology': {indices} does not"):
        PartitionDir.open(out).verify_parts([0])
    shutil.rmtree(out / "shared-topology")
    with pytest.raises(PartitionDirError, match="shared group 'topology' is missing"):
        PartitionDir.open(out).verify_parts([0])
    unwritten = PartitionDirWriter(tmp_path / "other")
    unwritten.write_part(0, {"x": torch.ones(1)}, {"nodes": 1}, shared=["topology"])
    with pytest.raises(ValueError, match=r"shared groups \['topology'\] are needed"):
        unwritten.finish({"num_parts": 1, "node_offsets": [0, 1], "system": "t", "dataset": {}})
    unlisted = PartitionDirWriter(tmp_path / "third")
    unlisted.write_shared("topology", topology)
    unlisted.write_part(0, {"x": torch.ones(1)}, {"nodes": 1})
    with pytest.raises(ValueError, match=r"shared groups \['topology'\] were written but no part"):
        unlisted.finish({"num_parts": 1, "node_offsets": [0, 1], "system": "t", "dataset": {}})


def test_own_predictions_keep_the_requested_order_and_repeats():
    """A rank's share: the requested ids it owns, in the requested order with repeats (as the
    one-process split returns them), each with its own row; bad ids are refused."""
    from lightning_gnnscale.kit.partitions import own_predictions

    own = torch.tensor([40, 7, 19, 3])
    rows = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    requested = torch.tensor([19, 5, 3, 19, 40])
    ids, got = own_predictions(own, rows, requested, 50)
    row_of = {int(i): float(r) for i, r in zip(own, rows[:, 0])}
    assert ids.tolist() == [i for i in requested.tolist() if i in row_of]
    assert got[:, 0].tolist() == [row_of[i] for i in ids.tolist()]
    assert own_predictions(own, rows, None, 50)[0] is own
    with pytest.raises(ValueError, match=r"must be in \[0, 50\)"):
        own_predictions(own, rows, torch.tensor([3, 50]), 50)
    with pytest.raises(ValueError, match="must be 1-D"):
        own_predictions(own, rows, requested.reshape(1, -1), 50)
