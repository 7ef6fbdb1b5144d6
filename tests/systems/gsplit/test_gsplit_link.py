"""GSplit's link prediction (docs/systems/gsplit.md#link-prediction): a step split over 2 and
3 ranks (in memory and from a partition directory, both topologies) gives ``single``'s loss,
gradient and evaluation statistics in float64; no evaluation pair joins its endpoints in any
training block of any rank; every input row is loaded once, by its owner (data-parallel ranks
load more), and the endpoint exchange moves exactly the rows each rank's pairs need from
other ranks. A typed graph's case (a directed split: inverse relations; RGCN, a DistMult head,
negatives filtered per relation) checks the same, with the head's gradient, and that no
validation or test triple, nor its inverse, is an edge of any training block."""

from __future__ import annotations

from functools import cache

import pytest
import torch

import lightning_gnnscale as gs
from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig, ModelConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.generators import sbm, typed_sbm
from lightning_gnnscale.systems.gsplit import GSplitConfig, GSplitPartitionConfig
from lightning_gnnscale.systems.gsplit.strategy import shuffle_hook
from lightning_gnnscale.tasks import TaskConfig
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
EPOCH = 1
SPLITS = ("val", "test")
TASK = TaskConfig("link_prediction", num_negatives=2, eval_negatives=12)
TASKS = {  # each case's negatives
    "uniform": TASK,
    "joint": TaskConfig("link_prediction", negatives="joint", num_negatives=3, eval_negatives=12),
    "filtered": TaskConfig(
        "link_prediction", num_negatives=2, filter_negatives=True, eval_negatives=12
    ),
    "typed": TaskConfig(  # directed: every message structure adds inverse relations
        "link_prediction",
        num_negatives=2,
        filter_negatives=True,
        eval_negatives=12,
        undirected=False,
        decoder="distmult",
    ),
}


def is_typed(task) -> bool:
    return task == TASKS["typed"]


def make_dataset(typed=False):
    if typed:
        dataset = typed_sbm(num_nodes=200, num_relations=3, avg_degree=4.0, num_features=6, seed=5)
    else:
        dataset = sbm(num_nodes=240, num_classes=3, avg_degree=8.0, num_features=6, seed=5)
    return dataset.to(torch.float64)


def data(partition_dir=None) -> DataConfig:
    return DataConfig(batch_size=160, fanouts=FANOUTS, partition_dir=partition_dir)


def make_dm(name, cache_dir, topology="replicated", partition_dir=None, task=TASK):
    _, DataModule, _ = gs.system(name)
    kwargs = {"seed": 3, "task": task}
    if name == "gsplit":
        config = GSplitConfig(
            partition=GSplitPartitionConfig(presample_epochs=1), topology=topology
        )
        if partition_dir is not None:
            return DataModule(None, config, data(partition_dir), dtype=torch.float64, **kwargs)
        dataset = make_dataset(is_typed(task))
        return DataModule(dataset, config, data(), cache_dir=cache_dir, **kwargs)
    config = type(gs.system(name)[2])(salt_by_rank=False) if name == "ddp" else None
    return DataModule(make_dataset(is_typed(task)), config, data(), **kwargs)


def make_net(dm):
    """The net (typed: RGCN over the task's message relations) and the task's trained head
    (typed: DistMult, its diagonals drawn so that each relation scores differently; else
    none), in float64."""
    torch.manual_seed(0)
    model = "rgcn" if is_typed(dm.task.config) else "sage"
    net = dm.build_model(ModelConfig(name=model, hidden=10, num_layers=2, dropout=0.0))
    head = dm.task.trained_head()
    if head is not None:  # a diagonal per relation other than DistMult's initial ones
        torch.nn.init.uniform_(head.weight, 0.5, 1.5)
    return torch.nn.ModuleList([net, *([] if head is None else [head])]).double()


def flat_grad(net) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in net.parameters()])


def block_edges(block, new2old) -> torch.Tensor:
    """int64 ``[2, E]`` (typed: ``[3, E]``, the relation last) original-id edges of a block."""
    src, dst = block.edge_index
    ids = new2old[torch.stack([block.src_ids[src], block.dst_ids[dst]])]
    return ids if block.edge_type is None else torch.cat([ids, block.edge_type[None]])


def set_up(dm, comm):
    context = RankContext(comm, torch.device("cpu"))
    dm.context = context
    prepared = dm.prepare(comm.world_size, list(range(comm.world_size)))
    part = dm.load_part(prepared, comm.rank) if dm.partition_dir else None
    dm.setup_rank(context, part or dm.part_of(prepared, comm.rank))


def _gsplit_rank(rank, world_size, cache_dir, topology, partition_dir, task):
    comm = Comm.create()
    dm = make_dm("gsplit", cache_dir, topology, partition_dir, task)
    set_up(dm, comm)
    modules = make_net(dm)
    net = modules[0]
    out = {"steps": [], "edges": []}
    n = dm.held.num_nodes
    new2old = torch.empty(n, dtype=torch.int64)  # identity in memory
    new2old[dm.held.link.ids(torch.arange(n))] = torch.arange(n)
    for step in range(dm.steps_per_epoch):
        modules.zero_grad()
        batch = dm.make_batch(EPOCH, step)
        before = comm.meter.snapshot()["bytes"]
        rows = net(batch.blocks, batch.x, layer_hook=shuffle_hook(comm)(batch))
        loss = dm.task.loss_sum(rows, batch.y) / batch.global_seed_count
        loss.backward()
        moved = {k: v - before.get(k, 0) for k, v in comm.meter.snapshot()["bytes"].items()}
        grad = comm.all_reduce(flat_grad(modules), category="gradient")
        total = comm.all_reduce(loss.detach().clone(), category="control")
        out["edges"] += [block_edges(block, new2old) for block in batch.blocks]
        endpoint = batch.plans[-1]
        out["steps"].append(
            {
                "loss": total,
                "grad": grad,
                "inputs": batch.x.shape[0],
                "endpoint_rows": endpoint.rows_from_others(rank),
                "activation": moved.get("activation", 0),
                "traffic": list(batch.traffic.rows),
                "hidden_rows": batch.plans[1].rows_from_others(rank),
                "pairs": batch.y.shape[0],
            }
        )
    stats = dm.eval_statistics(net, SPLITS)
    out["stats"] = comm.all_reduce(stats, category="control")
    return out


@cache
def single_reference(task=TASK):
    dm = make_dm("single", None, task=task)
    modules = make_net(dm)
    net = modules[0]
    steps = []
    for step in range(dm.steps_per_epoch):
        modules.zero_grad()
        batch = dm.make_batch(EPOCH, step)
        rows = net(batch.blocks, batch.x)
        loss = dm.task.loss_sum(rows, batch.y) / batch.global_seed_count
        loss.backward()
        grad = flat_grad(modules)
        steps.append({"loss": loss.detach(), "grad": grad, "inputs": batch.x.shape[0]})
    return dm, steps, dm.eval_statistics(net, SPLITS)


def evaluation_pairs(split) -> set[tuple[int, ...]]:
    """The validation and test pairs in both directions; a typed split's triples
    ``(src, dst, relation)`` and their inverses ``(dst, src, relation + R)``."""
    pairs = torch.cat([split.val_pos, split.test_pos], 1)
    if split.is_typed:
        rel = torch.cat([split.val_rel, split.test_rel])[None]
        both = torch.cat([torch.cat([pairs, rel]), torch.cat([pairs.flip(0), rel + 3])], 1)
    else:
        both = torch.cat([pairs, pairs.flip(0)], 1)
    return set(map(tuple, both.t().tolist()))


def write_dir(tmp_path, topology, world_size, task):
    from lightning_gnnscale.comm import Topology

    dm = make_dm("gsplit", tmp_path / "cache", topology, task=task)
    dm.launch_topology = Topology.from_launch(world_size)
    out = tmp_path / f"parts-{topology}"
    dm.write_partition_dir(out, world_size, log=lambda *_: 0)
    return str(out)


@pytest.mark.dist
@pytest.mark.parametrize(
    ("world_size", "topology", "directory", "negatives"),
    [
        (2, "replicated", False, "uniform"),
        (3, "partitioned", False, "joint"),
        (2, "partitioned", True, "filtered"),
        (2, "partitioned", True, "typed"),
    ],
)
def test_gsplit_link_prediction_equals_single(tmp_path, world_size, topology, directory, negatives):
    """Every step of an epoch: the ranks' summed loss and gradient are ``single``'s (float64,
    1e-12), and so are the evaluation statistics; the inputs are ``single``'s, each loaded by
    one rank; the endpoint exchange's bytes are the rows each rank's pairs need from others; no
    training block edge is an evaluation pair."""
    task = TASKS[negatives]
    ref_dm, ref_steps, ref_stats = single_reference(task)
    parts = write_dir(tmp_path, topology, world_size, task) if directory else None
    ranks = run_distributed(
        _gsplit_rank, world_size, tmp_path / "cache", topology, parts, task, timeout_s=240
    )
    # (b) leakage: no evaluation pair (typed: triple, nor its inverse) is an edge of any rank's
    # training block
    split = ref_dm.targets.split
    held_out = evaluation_pairs(split)
    for r in ranks:
        edges = torch.cat(r["edges"], 1)
        assert edges.shape[1] > 500
        assert not held_out & set(map(tuple, edges.t().tolist()))
        if split.is_typed:  # every relation, inverses included, reaches the blocks
            assert edges[2].unique().tolist() == list(range(6)) == list(range(len(split.relations)))
    assert len(ranks[0]["steps"]) == len(ref_steps) > 1
    for i, want in enumerate(ref_steps):
        got = [r["steps"][i] for r in ranks]
        # (a) exact: the summed loss and gradient are single's
        torch.testing.assert_close(got[0]["loss"], want["loss"], rtol=0, atol=1e-12)
        torch.testing.assert_close(got[0]["grad"], want["grad"], rtol=0, atol=1e-12)
        # (c) split-parallel: each input row loaded once, by its owner: single's inputs
        assert sum(g["inputs"] for g in got) == want["inputs"]
        # the endpoint exchange after the last layer: the rows a rank's pairs need from others
        # (bytes summed over ranks: a rank meters what it sends, the others receive it)
        width = ref_dm.task.config.embedding_dim  # float64 rows: hidden 10, output width
        for g in got:
            assert len(g["traffic"]) == len(FANOUTS) + 1
            assert g["traffic"][-1] == g["endpoint_rows"]
        received = sum(g["hidden_rows"] * 10 + g["endpoint_rows"] * width for g in got) * 8
        assert sum(g["activation"] for g in got) == received
        assert sum(g["endpoint_rows"] for g in got) > 0
    torch.testing.assert_close(ranks[0]["stats"], ref_stats, rtol=0, atol=1e-9)


def test_data_parallel_ranks_load_more_input_rows_than_split_parallel(tmp_path):
    """The point under link prediction: the same steps on 2 data-parallel ranks (``ddp``,
    unsalted: ``single``'s samples) load the rows of every vertex both ranks' pairs reach,
    split-parallel ranks (``single``'s inputs, test above) each once."""
    ddp = make_dm("ddp", None)
    _, ref_steps, _ = single_reference()
    ddp_rows = 0
    for step in range(len(ref_steps)):
        for rank in range(2):
            ddp.rank, ddp.world_size = rank, 2
            ddp_rows += ddp.make_batch(EPOCH, step).x.shape[0]
    assert ddp_rows > 1.2 * sum(s["inputs"] for s in ref_steps)


def test_link_prediction_refuses_the_redundancy_probe():
    from lightning_gnnscale.errors import ConfigError

    config = GSplitConfig(redundancy_probe_steps=2)
    with pytest.raises(ConfigError, match="redundancy_probe_steps"):
        config.check_task("link_prediction")


def test_the_redundancy_probe_is_refused_for_link_prediction_settings_too():
    """A DataModule checks its task as settings (``TaskConfig``): the probe's refusal must
    read the name from them."""
    from lightning_gnnscale.errors import ConfigError
    from lightning_gnnscale.systems.gsplit.config import GSplitConfig
    from lightning_gnnscale.tasks import TaskConfig

    config = GSplitConfig(redundancy_probe_steps=2)
    for task in ("link_prediction", TaskConfig("link_prediction")):
        with pytest.raises(ConfigError, match="redundancy_probe_steps"):
            config.check_task(task)
