"""``kit.link_partitioned``: link statistics from ranks that hold only their own nodes'
embeddings sum to the one-process statistics (docs/tasks.md, "Evaluation on partitioned
ranks")."""

from __future__ import annotations

from dataclasses import replace

import torch

from lightning_gnnscale.comm import Comm, CommMeter
from lightning_gnnscale.graph.generators import sbm, typed_sbm
from lightning_gnnscale.kit.link_partitioned import owned_link_statistics
from lightning_gnnscale.tasks import TaskConfig, build_task
from tests.helpers.dist import run_distributed

SPLITS = ("val", "test")
WIDTH = 6


def _problem(typed: bool = False):
    if typed:  # a knowledge graph's triples, scored by DistMult
        dataset = typed_sbm(num_nodes=240, num_relations=3, num_classes=3, num_features=4, seed=3)
        config = TaskConfig("link_prediction", eval_negatives=20, decoder="distmult")
        task = build_task(replace(config, embedding_dim=WIDTH))
    else:
        dataset = sbm(num_nodes=240, num_classes=3, avg_degree=8.0, num_features=4, seed=3)
        task = build_task(TaskConfig("link_prediction", eval_negatives=20))
    targets = task.prepare(dataset, 11)
    if typed:  # DistMult, a diagonal per relation that is not the identity on every one
        head = task.trained_head().double()
        with torch.no_grad():
            head.weight.copy_(torch.tensor([[1.0], [-1.0], [2.0]]).expand(3, WIDTH))
    generator = torch.Generator().manual_seed(0)
    tables = {
        stage: torch.randint(-2, 3, (dataset.graph.num_nodes, WIDTH), generator=generator).double()
        for stage in ("train", "test")
    }  # small integers: many tied scores
    return task, targets, tables


def _owner(ids: torch.Tensor, world_size: int) -> torch.Tensor:
    return (ids * 7 + 3) % world_size  # scattered ownership, not ranges


def _rank_statistics(
    rank: int, world_size: int, chunk_elements: int | None, typed: bool = False
) -> dict:
    import lightning_gnnscale.kit.link_partitioned as partitioned

    if chunk_elements is not None:
        partitioned.SCORED_ELEMENTS = chunk_elements
    task, targets, tables = _problem(typed)
    comm = Comm.create(CommMeter(), timeout_s=30) if world_size > 1 else Comm.local()
    n = targets.num_nodes
    own = (_owner(torch.arange(n), world_size) == rank).nonzero().flatten().flip(0)
    pairs, relations = {}, {}
    for split in SPLITS:
        pos = targets.split.positives(split)
        mine = (_owner(pos[1], world_size) == rank).nonzero().flatten()  # by destination
        pairs[split] = pos[:, mine], mine
        relations[split] = targets.relations_of(split, mine)
    stats = owned_link_statistics(
        task,
        lambda stage: tables[stage][own],
        own,
        lambda ids: _owner(ids, world_size),
        pairs,
        n,
        targets.seed,
        SPLITS,
        comm,
        relations if typed else None,
    )
    return {"stats": stats, "meter": comm.meter.snapshot() if world_size > 1 else None}


def _one_process(typed: bool = False) -> torch.Tensor:
    task, targets, tables = _problem(typed)
    seen = {}

    def embed(stage):
        seen[stage] = True
        return tables[stage]

    stats = task.link_statistics(embed, targets, SPLITS, 0, 1)
    assert set(seen) == {"train", "test"}
    return stats


def test_owned_statistics_on_one_process_equal_link_statistics():
    expected = _one_process()
    torch.testing.assert_close(_rank_statistics(0, 1, None)["stats"], expected, rtol=1e-12, atol=0)
    chunked = _rank_statistics(0, 1, 22 * WIDTH * 3)["stats"]  # 3 edges per round
    torch.testing.assert_close(chunked, expected, rtol=1e-12, atol=0)


def test_owned_statistics_of_three_ranks_sum_to_one_process():
    """Three ranks, uneven shares and round counts (small chunks): the sums are the
    one-process statistics, and the rows an edge needs came as counted ``activation``
    bytes."""
    expected = _one_process()
    results = run_distributed(_rank_statistics, 3, 22 * WIDTH * 5, timeout_s=90)
    torch.testing.assert_close(sum(r["stats"] for r in results), expected, rtol=1e-12, atol=0)
    for result in results:
        assert result["meter"]["bytes"]["activation"] > 0


def test_owned_triples_of_three_ranks_sum_to_one_process():
    """A typed graph's triples: each rank scores its pairs under their relations (DistMult,
    one diagonal per relation), and the sums are the one-process statistics."""
    expected = _one_process(typed=True)
    results = run_distributed(_rank_statistics, 3, 22 * WIDTH * 5, True, timeout_s=90)
    torch.testing.assert_close(sum(r["stats"] for r in results), expected, rtol=1e-12, atol=0)


def test_pairs_from_outside_are_checked_before_any_round():
    """A rank's evaluation pairs come from its partition directory: ids outside the graph or a
    shape that does not match are refused before any collective."""
    import pytest

    task, targets, tables = _problem()
    n = targets.num_nodes
    own = torch.arange(n)
    good = targets.split.positives("val")
    index = torch.arange(good.shape[1])
    bad = {"outside": (good + n, index), "do not match": (good, index[:-1])}
    for message, pair in bad.items():
        with pytest.raises(ValueError, match=message):
            owned_link_statistics(
                task,
                lambda s: tables[s],
                own,
                lambda i: i * 0,
                {"val": pair},
                n,
                targets.seed,
                ("val",),
                Comm.local(),
            )


def test_pair_relations_from_outside_are_checked():
    """A typed rank's pair relations (from its partition directory) must be int64, one per
    pair, and name one of the graph's relations."""
    import pytest

    task, targets, tables = _problem(typed=True)
    pos = targets.split.positives("val")
    index = torch.arange(pos.shape[1])
    rel = targets.relations_of("val")
    bad = {"outside": rel + 3, "must be int64": rel[:-1], "int64": rel.int()}
    for message, relations in bad.items():
        with pytest.raises(ValueError, match=message):
            owned_link_statistics(
                task,
                lambda s: tables[s],
                torch.arange(targets.num_nodes),
                lambda i: i * 0,
                {"val": (pos, index)},
                targets.num_nodes,
                targets.seed,
                ("val",),
                Comm.local(),
                {"val": relations},
            )
