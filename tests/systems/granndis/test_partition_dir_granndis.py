"""GraNNDIS from a partition directory (docs/partitioning.md, docs/systems/granndis.md): a rank
that holds only its own part and its server's shared rows (the other parts and server groups
deleted) computes every step, the evaluation counts and the predictions exactly as the
in-memory rank does, in every mode with a layout; train.py from a directory equals the
in-memory run bit for bit; a directory that does not fit the run fails before any rank
starts."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.config_types import DataConfig, ModelConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.partition_dir import PartitionDirError, part_folder, shared_folder
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.partition import partition
from lightning_gnnscale.systems.granndis import GraNNDISConfig, GraNNDISDataModule, halo_hook
from lightning_gnnscale.systems.granndis.config import CoBConfig
from tests.helpers.dist import run_distributed
from tests.helpers.partition_runs import launcher_without_ranks
from tests.test_partition_dir import SBM

LAYERS = 2
# mode -> (config, workers per server) for 2 ranks
VARIANTS = {
    "flx_eas": (GraNNDISConfig(), 1),
    "flx_eas_1x2": (GraNNDISConfig(), 2),
    "flx_k1": (GraNNDISConfig(mode="flx", preload_k=1), 1),
    "flx_auto": (GraNNDISConfig(mode="flx", preload_auto=True, memory_budget_mb=1.0), 1),
    "cob": (GraNNDISConfig(mode="cob", cob=CoBConfig(num_per_epoch=2)), 1),
    "fb_base": (GraNNDISConfig.preset("granndis_fb_base"), 1),
}


# labels whose directory is also run with GCN (whole-graph degrees in the plans and in the
# evaluation shares) and GAT, besides SAGE: FB_base and a 2-server mode
OTHER_MODELS = {"flx_eas": ("gcn", "gat"), "fb_base": ("gcn", "gat")}


def make_dm(cache_dir, config, partition_dir=None, topology=None):
    """A GraNNDIS DataModule on the small sbm graph, by name, in float64."""
    data = DataConfig(batch_size=-1, fanouts=[-1] * LAYERS, partition_dir=partition_dir)
    dm = GraNNDISDataModule(
        "sbm",
        config,
        data,
        seed=3,
        cache_dir=cache_dir,
        dtype=torch.float64,
        dataset_options=SBM,
        topology=topology,
    )
    dm.build_model(ModelConfig(name="sage", hidden=8, num_layers=LAYERS))  # preload_auto's dims
    return dm


def _run(dm, comm, kind="sage"):
    """Per step: loss, logits and summed gradient of a ``kind`` net; then the evaluation
    counts, every rank's prediction rows (logits and embeddings), its rows of a few requested
    ids, and what asking for an id past the graph raises."""
    torch.manual_seed(0)
    net = BlockGNN(kind, dm.input_dim, 8, dm.out_dim, LAYERS, dropout=0.0).double()
    steps = []
    for step in range(dm.steps_per_epoch):
        batch = dm.make_batch(1, step)
        net.zero_grad()
        logits = net(batch.blocks, batch.x, layer_hook=halo_hook(comm)(batch))
        loss = F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in net.parameters()])
        steps.append((loss.detach(), logits.detach(), comm.all_reduce(grad, category="gradient")))
    net.eval()
    counts = comm.all_reduce(dm.eval_statistics(net, ("train", "val", "test")), category="control")
    predicted = {out: dm.predict_rows(net, None, out) for out in ("logits", "embeddings")}
    predicted["some"] = dm.predict_rows(net, torch.tensor([7, 0, 299, 150]), "logits")
    try:
        dm.predict_rows(net, torch.tensor([0, 10**6]), "logits")
        predicted["past_the_graph"] = None
    except ValueError as err:
        predicted["past_the_graph"] = str(err)
    return steps, counts, predicted


def _own_part_rank(rank, world_size, tmp_path):
    """Per variant: the in-memory rank's results, then those of a rank given its own copy of
    the directory with the other parts, and the shared groups its part does not list, gone."""
    results = {}
    for label, (config, workers) in VARIANTS.items():
        topology = Topology(world_size, workers)
        comm = Comm.create(CommMeter(), topology)
        context = RankContext(comm, torch.device("cpu"))
        in_memory = make_dm(tmp_path / "cache", config, topology=topology)
        in_memory.setup_rank(context, in_memory.rank_part(context))
        in_memory.context = context  # as setup() sets it (evaluation reads its comm)
        want = _run(in_memory, comm)
        mine = tmp_path / f"{label}-rank{rank}"
        shutil.copytree(tmp_path / label, mine)
        for k in range(world_size):
            if k != rank:
                shutil.rmtree(mine / part_folder(k))
        for server in range(topology.num_servers):
            if server != topology.server_of(rank):
                shutil.rmtree(mine / shared_folder(f"server{server}"))
        from_dir = make_dm(tmp_path / "cache", config, partition_dir=str(mine))
        from_dir.setup_rank(context, from_dir.rank_part(context))
        from_dir.context = context
        depths = (in_memory.preload_depth, from_dir.preload_depth)
        results[label] = (want, _run(from_dir, comm), depths)
        for kind in OTHER_MODELS.get(label, ()):
            results[f"{label}_{kind}"] = (
                _run(in_memory, comm, kind),
                _run(from_dir, comm, kind),
                depths,
            )
    return results


@pytest.mark.dist
def test_a_granndis_rank_with_only_its_part_equals_the_in_memory_rank(tmp_path):
    """In every mode with a layout (FLX-EAS on 2 servers x 1 worker and on 1 x 2, FLX with
    k < L, FLX with preload_auto, CoB with 2 steps, FB_base; SAGE, and GCN and GAT on FLX-EAS
    2 x 1 and FB_base, whose degrees come from the plans and the inference shares): every
    step's loss, logits and summed gradient, the evaluation counts and the predicted rows
    (logits, embeddings) of every node and of a few requested ones are equal, exactly (atol
    0), with the other parts deleted; an id past the graph is refused as in memory."""
    for label, (config, workers) in VARIANTS.items():
        writer = make_dm(tmp_path / "cache", config)
        writer.launch_topology = Topology(2, workers)
        writer.write_partition_dir(tmp_path / label, 2, log=lambda *_: 0)
    results = run_distributed(_own_part_rank, 2, tmp_path, timeout_s=240)
    labels = [*VARIANTS, *(f"{v}_{kind}" for v, kinds in OTHER_MODELS.items() for kind in kinds)]
    for label in labels:
        predicted = {"memory": [], "directory": []}
        for by_label in results:
            (want_steps, want_counts, want_rows), (got_steps, got_counts, got_rows), depths = (
                by_label[label]
            )
            assert depths[0] == depths[1], label
            assert len(want_steps) == len(got_steps) > 0, label
            for w, g in zip(want_steps, got_steps):
                for a, b in zip(w, g, strict=True):
                    assert torch.equal(a, b), label
            assert torch.equal(want_counts, got_counts) and want_counts[:, 1].sum() > 0, label
            predicted["memory"].append(want_rows)
            predicted["directory"].append(got_rows)
            # ids past the graph are refused from a directory as in memory
            assert want_rows["past_the_graph"] == "node ids must be in [0, 300)", label
            assert got_rows["past_the_graph"] == want_rows["past_the_graph"], label
        for output in ("logits", "embeddings", "some"):
            rows = {}
            for key, shares in predicted.items():
                ids = torch.cat([share[output][0] for share in shares])
                order = torch.argsort(ids)
                rows[key] = (ids[order], torch.cat([share[output][1] for share in shares])[order])
            everything = torch.arange(SBM["num_nodes"])
            wanted = torch.tensor([0, 7, 150, 299]) if output == "some" else everything
            assert torch.equal(rows["memory"][0], wanted)
            assert torch.equal(rows["memory"][0], rows["directory"][0]), label
            assert torch.equal(rows["memory"][1], rows["directory"][1]), (label, output)
    # preload_auto picks k on the ranks: its directory holds every k, and a fixed k's does
    # not serve it
    auto = make_dm(tmp_path / "cache", VARIANTS["flx_auto"][0], str(tmp_path / "flx_k1"))
    with pytest.raises(PartitionDirError, match="'preload_depths': \\[1\\]"):
        auto.prepare(2, [0])


# --------------------------------------------------------------------------------- train.py
def cfg_overrides(root, *extra) -> list[str]:
    """A small float64 GraNNDIS run on 2 simulated servers x 1 worker."""
    return [
        f"paths.root={root}",
        "strategy=granndis",
        "dtype=float64",
        "dataset.num_features=8",
        "topology.servers=2",
        *extra,
    ]


def test_a_granndis_directory_that_does_not_fit_fails_before_any_rank_starts(tmp_path, monkeypatch):
    """Other EAS settings, another mode, another servers x workers split and ``mb_base`` are
    refused in the launcher, naming the key (or the modes that can train from a directory)."""
    common = cfg_overrides(tmp_path)
    out, run = launcher_without_ranks(tmp_path, monkeypatch, common)

    with pytest.raises(PartitionDirError, match="'partition_options' is .*'fanout': 15") as err:
        run("strategy.eas.fanout=5")
    assert "partition.json" in str(err.value)
    with pytest.raises(PartitionDirError, match="'method' is 'flx_eas' but this run has 'flx'"):
        run("strategy.mode=flx")
    with pytest.raises(PartitionDirError, match="'topology' is .*'servers': 2.*'servers': 1"):
        run("topology.servers=1")
    with pytest.raises(ConfigError, match="mode=mb_base .*'fb_base', 'flx', 'flx_eas', 'cob'"):
        run("strategy=granndis_mb_base")
    with pytest.raises(ConfigError, match="mode=mb_base"):
        partition([*common, "strategy=granndis_mb_base"], tmp_path / "mb", log=lambda *_: 0)


def test_a_rank_refuses_a_directory_of_another_topology_when_the_launcher_did_not_know_it(
    tmp_path,
):
    """A plain Lightning script's launcher does not know the servers x workers
    (``launch_topology`` is ``None``), so the directory's topology is checked on the rank,
    as it opens its part (``check_rank_part``): a 2 x 1 directory is refused on 1 x 2 ranks,
    naming 'topology', before any collective."""
    writer = make_dm(tmp_path / "cache", GraNNDISConfig())
    writer.launch_topology = Topology(2, 1)
    writer.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    dm = make_dm(tmp_path / "cache", GraNNDISConfig(), partition_dir=str(tmp_path / "parts"))
    assert dm.launch_topology is None
    dm.prepare(2, [0])  # the launcher's checks pass: it knows no topology
    context = RankContext(Comm(CommMeter(), Topology(2, 2), rank=0), torch.device("cpu"))
    with pytest.raises(PartitionDirError, match="'topology' is .*'workers_per_server': 1.* but"):
        dm.rank_part(context)


def test_partitioning_without_a_topology_is_refused(tmp_path):
    """A DataModule built directly knows no servers x workers: ``write_partition_dir`` fails
    naming how to set them, and writes nothing; a topology for another world size fails too."""
    dm = make_dm(tmp_path / "cache", GraNNDISConfig())
    with pytest.raises(
        ConfigError, match="launch_topology = Topology.*lightning_gnnscale.partition"
    ):
        dm.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)
    assert not (tmp_path / "parts" / "partition.json").exists()
    dm.launch_topology = Topology(4, 2)
    with pytest.raises(ConfigError, match="not for 2 ranks"):
        dm.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)


def test_partitioning_writes_one_server_at_a_time_and_no_row_ids(tmp_path, monkeypatch):
    """2 servers x 2 workers: each server's group of input rows is written, then its ranks'
    parts, before the next server's rows are gathered (what partitioning holds at once is one
    server's output); the parts store no ids of the plans' owned and halo rows (no rank reads
    them), only their numbers."""
    from lightning_gnnscale.graph.partition_dir import PartitionDirWriter

    order = []
    write_shared, write_part = PartitionDirWriter.write_shared, PartitionDirWriter.write_part

    def shared(self, name, arrays):
        order.append(name)
        return write_shared(self, name, arrays)

    def part(self, k, arrays, sizes, shared=()):
        order.append(k)
        return write_part(self, k, arrays, sizes, shared)

    monkeypatch.setattr(PartitionDirWriter, "write_shared", shared)
    monkeypatch.setattr(PartitionDirWriter, "write_part", part)
    dm = make_dm(tmp_path / "cache", GraNNDISConfig(mode="flx", preload_k=1))
    dm.launch_topology = Topology(4, 2)
    dm.write_partition_dir(tmp_path / "parts", 4, log=lambda *_: 0)
    assert order == ["server0", 0, 1, "server1", 2, 3]
    files = [p.name for p in (tmp_path / "parts").glob("part-*/*.npy")]
    assert any(name.endswith("_final_values.npy") for name in files)
    assert any(name.endswith("_preload_values.npy") for name in files)
    assert not [name for name in files if name.endswith(("_owned.npy", "_halo.npy"))]
