"""HopGNN under link prediction on 2 and 3 gloo processes: exact against one process in
float64 (on a typed graph too: RGCN over the message relations, DistMult over the triples), no
evaluation pair (typed: triple, nor its inverse) in any training block, and the feature bytes
moving the model saves (docs/systems/hopgnn.md, "Link prediction", "Typed graphs")."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.contract import RankContext
from lightning_gnnscale.graph.generators import sbm, typed_sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.kit.loaders import StepBatcher
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import full_logits
from lightning_gnnscale.systems.hopgnn import HopGNNConfig, HopGNNDataModule, HopGNNPrepared
from lightning_gnnscale.systems.hopgnn.datamodule import LinkStepBatch
from lightning_gnnscale.systems.hopgnn.strategy import (
    exchanged_outputs,
    run_iteration,
    sum_gradients,
)
from lightning_gnnscale.tasks import TaskConfig, build_task
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
SEED = 3
ITERS = 3
BATCH = 12  # positive pairs per global step
VARIANTS = {
    "default": {},
    "no_pregather_grads_reverse": {"pregather": False, "payload": "grads", "direction": -1},
    "merge_model_T1": {"steps": 1},
    "merge_home_T2": {"steps": 2, "merge_policy": "home", "merge_score": "min_roots"},
    "model_centric": {"mode": "model_centric", "merge_adaptive": False},
}
TASK_SETTINGS = {
    "uniform": TaskConfig("link_prediction"),
    # the task's trained head migrates and is summed with the net; the blocks leave out the
    # step's own positive pairs
    "joint_k2_mlp_excluded": TaskConfig(
        "link_prediction",
        negatives="joint",
        num_negatives=2,
        decoder="mlp",
        exclude_target_edges=True,
    ),
    # a typed graph: triples scored by DistMult (a diagonal per relation, migrating with the
    # replica); a directed split, so RGCN passes messages over R relations and R inverses
    "typed_distmult_directed": TaskConfig("link_prediction", decoder="distmult", undirected=False),
}
TYPED_R = 3
# the typed case's schedules: the default, roots moved to other models, the baseline
TYPED_VARIANTS = ("default", "merge_home_T2", "model_centric")
EVAL_SPLITS = ("val", "test")
PER_RELATION = {"rel_1_inverse": [2, 1]}  # an inverse relation's own fanouts


def small_dataset(task_label="uniform"):
    if task_label.startswith("typed"):
        return typed_sbm(
            num_nodes=120, num_relations=TYPED_R, num_classes=3, avg_degree=3.0, num_features=6,
            seed=5,
        ).to(torch.float64)  # fmt: skip
    return sbm(num_nodes=120, num_classes=3, avg_degree=6.0, num_features=6, seed=5).to(
        torch.float64
    )


def make_net(dataset, task):
    """The net (RGCN over the task's message relations on a typed graph), then the task's head
    (``decoder=mlp`` / ``distmult``), from one seeded generator."""
    torch.manual_seed(0)
    dim, graph = task.config.embedding_dim, dataset.graph
    if graph.is_typed:
        relations = len(task.message_relations(graph))
        net = BlockGNN("rgcn", graph.num_features, 8, dim, 2, 0.0, num_relations=relations)
    else:
        net = BlockGNN("sage", graph.num_features, 8, dim, 2, 0.0)
    head = task.trained_head()
    return net.double(), None if head is None else head.double()


class Module(nn.Module):
    """What GNNModule's training step does with a batch: ``self(batch)``, then the task's loss."""

    def __init__(self, net, head, task):
        super().__init__()
        self.net, self.task, self.head = net, task, head

    def forward(self, batch):
        return self.net(batch.blocks, batch.x)

    def step_loss(self, comm):
        def loss(sub):
            assert isinstance(sub, LinkStepBatch)
            with exchanged_outputs(self, sub, comm):
                out = self(sub)
            return self.task.loss_sum(out, sub.y) / sub.global_seed_count

        return loss


def setup(dataset, config, task, part, rank, comm, batch=BATCH):
    per_relation = PER_RELATION if dataset.graph.is_typed else {}
    data = DataConfig(batch, FANOUTS, fanouts_per_relation=per_relation)
    dm = HopGNNDataModule(dataset, config, data, seed=SEED, task=task)
    dm.setup_rank(
        RankContext(comm, torch.device("cpu")), dm.part_of(HopGNNPrepared(part, {}), rank)
    )
    return dm


def _train_rank(rank, world_size, part, task_label):
    dataset, comm = small_dataset(task_label), Comm.create()
    out, blocks = {}, []
    for label, changes in VARIANTS.items():
        if task_label.startswith("typed") and label not in TYPED_VARIANTS:
            continue
        config = dataclasses.replace(HopGNNConfig(), **changes)
        task = build_task(TASK_SETTINGS[task_label])
        dm = setup(dataset, config, task, part, rank, comm)
        module = Module(*make_net(dataset, task), task)
        params = list(module.parameters())
        opt = torch.optim.SGD(params, lr=0.5)
        losses = []
        for step in range(ITERS):
            batch = dm.make_batch(1, step)
            blocks += [b for sub in batch.steps for b in sub.blocks]
            opt.zero_grad()
            loss, accumulator = run_iteration(batch, comm, params, module.step_loss(comm), config)
            loss.backward()
            sum_gradients(comm, params, accumulator)
            losses.append(float(loss))
            opt.step()
        out[label] = [p.detach().clone() for p in params]
        if label == "default" and task_label.startswith("typed"):  # triples scored by DistMult
            stats = dm.link_statistics(module.net.eval(), EVAL_SPLITS)
            out["statistics"] = comm.all_reduce(stats, category="control")
    return out, block_record(dm, blocks)


def block_record(dm, blocks):
    """The training block edges ``blocks`` (original ids; typed: with their relations), the
    sampler's structure and the evaluation pairs (typed: their relations) of ``dm``."""
    edges, types = [], []
    for block in blocks:
        edges.append(block.src_ids[block.edge_index])
        if block.edge_type is not None:
            types.append(block.edge_type)
    split = dm.targets.split
    return {
        "edges": torch.cat(edges, 1),
        "types": torch.cat(types) if types else None,
        "structure": (dm.sampler.indptr, dm.sampler.indices, dm.sampler.edge_type),
        "held_out": torch.cat([split.val_pos, split.test_pos], 1),
        "held_out_rel": torch.cat([split.val_rel, split.test_rel]) if split.is_typed else None,
        "num_nodes": dm.held.num_nodes,
        "undirected": split.undirected,
    }


def _message_keys(src, dst, rel, n, r):
    """int64 keys of message edges ``src -> dst`` under ``rel`` (``r`` message relations)."""
    return (src * n + dst) * r + rel


def assert_no_leak(record):
    """No validation or test pair, in either direction, joins its endpoints in the record's
    training blocks nor in the structure they are sampled on. Typed (a directed split): no
    held-out triple ``(s, r, d)`` passes a message ``s -> d`` under ``r`` nor ``d -> s`` under
    its inverse ``r + R`` (another relation may join them: a different, training triple)."""
    n, (src, dst), rel = record["num_nodes"], record["held_out"], record["held_out_rel"]
    indptr, indices, edge_type = record["structure"]
    dsts = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    if rel is None:
        held = set((torch.cat([src * n + dst, dst * n + src])).tolist())
        used = set((record["edges"][0] * n + record["edges"][1]).tolist())
        structure = set((indices * n + dsts).tolist())
    else:
        m = 2 * TYPED_R  # message relations: R, then their inverses
        assert not record["undirected"] and record["types"] is not None
        assert int(record["types"].max()) >= TYPED_R  # inverse messages were sampled
        keys = [_message_keys(src, dst, rel, n, m), _message_keys(dst, src, rel + TYPED_R, n, m)]
        held = set(torch.cat(keys).tolist())
        used = set(_message_keys(*record["edges"], record["types"], n, m).tolist())
        structure = set(_message_keys(indices, dsts, edge_type, n, m).tolist())
    assert held and used and not used & held
    assert not structure & held


def reference(task_label):
    """``single``: one process, its batcher (the same global pairs, negatives and keys)."""
    dataset = small_dataset(task_label)
    task = build_task(TASK_SETTINGS[task_label])
    targets = task.prepare(dataset, SEED)
    relation_fanouts = None
    if dataset.graph.is_typed:
        relations = task.message_relations(dataset.graph)
        relation_fanouts = [
            tuple(PER_RELATION.get(r, FANOUTS)[hop] for r in relations) for hop in range(2)
        ]
    batcher = StepBatcher.on_graph(
        dataset.graph,
        targets,
        task,
        FANOUTS,
        task.train_seeds(targets),
        BATCH,
        SEED,
        0,
        1,
        False,
        relation_fanouts,
    )
    net, head = make_net(dataset, task)
    params = [*net.parameters(), *(head.parameters() if head is not None else ())]
    opt = torch.optim.SGD(params, lr=0.5)
    for step in range(ITERS):
        batch = batcher[1, step]
        opt.zero_grad()
        out = net(batch.blocks, batch.x)
        (task.loss_sum(out, batch.y) / batch.global_seed_count).backward()
        opt.step()
    statistics = None
    if dataset.graph.is_typed:  # single's evaluation: every node embedded over each stage

        def embed(stage):
            graph = task.stage_graph(dataset.graph, targets, stage)
            return full_logits(graph, net.eval(), 1 << 16)

        statistics = task.link_statistics(embed, targets, EVAL_SPLITS, 0, 1)
    return params, statistics


@pytest.mark.dist
@pytest.mark.parametrize(
    ("world_size", "task_label"),
    [(2, "uniform"), (3, "joint_k2_mlp_excluded"), (2, "typed_distmult_directed")],
)
def test_link_prediction_equals_one_process(world_size, task_label):
    """float64, ``ITERS`` SGD steps: every variant (payloads, pre-gathering off, merging with
    both policies, the model-centric baseline) ends with ``single``'s parameters on every
    rank, on the same positive and negative pairs (3 ranks: with the MLP decoder's
    parameters too, and the step's target pairs excluded from its blocks; typed: RGCN's
    weights of 2R message relations and DistMult's R diagonals, and no held-out triple nor
    its inverse in the trained blocks: :func:`assert_no_leak`)."""
    part = partition(small_dataset(task_label).graph, "metis", world_size, seed=0)
    results = run_distributed(_train_rank, world_size, part, task_label, timeout_s=240)
    want, statistics = reference(task_label)
    count = {"uniform": 6, "joint_k2_mlp_excluded": 10, "typed_distmult_directed": 7}
    for r, record in results:
        if task_label.startswith("typed"):
            assert_no_leak(record)
            got = r.pop("statistics")  # partition-local scoring of the triples = single's
            assert bool((statistics[:, 2] > 0).all())
            torch.testing.assert_close(got, statistics, rtol=0, atol=1e-9)
        for label in r:
            assert len(r[label]) == len(want) == count[task_label]
            for got, ref in zip(r[label], want):
                torch.testing.assert_close(got, ref, rtol=0, atol=1e-10, msg=label)


def _blocks_rank(rank, world_size, part):
    """Every training block edge (original ids) of two epochs on this rank, the sampler's
    structure, and the evaluation pairs (:func:`block_record`)."""
    dataset, comm = small_dataset(), Comm.create()
    task = build_task("link_prediction")
    dm = setup(dataset, HopGNNConfig(), task, part, rank, comm)
    blocks = []
    for epoch in range(2):
        for step in range(dm.steps_per_epoch):
            blocks += [b for sub in dm.make_batch(epoch, step).steps for b in sub.blocks]
    return block_record(dm, blocks)


@pytest.mark.dist
def test_no_evaluation_pair_reaches_a_training_block():
    """On each of 2 ranks, over two epochs: no validation or test pair, in either direction,
    joins its endpoints in any training block, nor in the structure the blocks are sampled
    on (the typed case: in ``test_link_prediction_equals_one_process``)."""
    part = partition(small_dataset().graph, "metis", 2, seed=0)
    for record in run_distributed(_blocks_rank, 2, part, timeout_s=180):
        assert_no_leak(record)


def _bytes_rank(rank, world_size, part, mode):
    dataset = sbm(num_nodes=2000, num_classes=4, avg_degree=10.0, num_features=32, seed=1)
    comm = Comm.create()
    config = dataclasses.replace(HopGNNConfig(), mode=mode, merge_adaptive=False)
    task = build_task("link_prediction")
    dm = setup(dataset, config, task, part, rank, comm, batch=256)
    module = Module(BlockGNN("sage", 32, 16, task.config.embedding_dim, 2, 0.0), None, task)
    params = list(module.parameters())
    exchanged = 0
    before = comm.meter.snapshot()
    for step in range(4):
        batch = dm.make_batch(0, step)
        exchanged += batch.stats["exchanged_rows"]
        loss, accumulator = run_iteration(batch, comm, params, module.step_loss(comm), config)
        loss.backward()
        sum_gradients(comm, params, accumulator)
    sent = comm.meter.delta(before)["bytes"]
    return {"sent": sent, "exchanged": exchanged}


@pytest.mark.dist
def test_moving_the_model_saves_feature_bytes_under_link_prediction():
    """METIS sbm, 2 ranks, 4 steps of 256 positives: HopGNN sends under 3/4 of the feature
    bytes of its model-centric baseline (0.62x here: each endpoint's micrograph runs where
    its features live; a destination scored in both time steps is sampled in both, its
    cone's remote rows fetched once with pre-gathering); what it pays instead is the far endpoints' output rows, exactly the rows the pairs
    need (``activation`` forward and ``activation_grad`` back, 64 float32 values a row),
    which the baseline never sends."""
    part = partition(sbm(2000, 4, 10.0, num_features=32, seed=1).graph, "metis", 2, seed=0)
    hop = run_distributed(_bytes_rank, 2, part, "micrograph", timeout_s=180)
    mc = run_distributed(_bytes_rank, 2, part, "model_centric", timeout_s=180)
    feature = [sum(r["sent"]["feature"] for r in rs) for rs in (hop, mc)]
    assert 0 < feature[0] < 0.75 * feature[1], feature
    exchanged = sum(r["exchanged"] for r in hop)
    assert exchanged > 0
    for category in ("activation", "activation_grad"):
        assert sum(r["sent"][category] for r in hop) == exchanged * 64 * 4
        assert sum(r["sent"].get(category, 0) for r in mc) == 0
