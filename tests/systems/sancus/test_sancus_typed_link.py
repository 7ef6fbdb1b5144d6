"""SANCUS / CAGNET link prediction on a typed graph (docs/systems/sancus.md#typed-graphs),
float64, a directed typed graph (so the split passes messages over inverse relations), 2 ranks
with scattered (random) row blocks, bound 0:

- exact: every step's loss and the weights after it (RGCN and a DistMult head) are
  ``single``'s (full neighbourhoods, the same triples and negatives, filtered per relation);
- leakage: no validation or test triple, nor its inverse, is an entry of any rank's training
  row blocks (forward or transposed), nor a test triple of the test stage's;
- evaluation: the ranks' summed statistics are ``single``'s, scored under the relations;
- a directed split's partition directory holds the in-memory pairs, relations and blocks,
  and its relations are checked when it is loaded.
"""

from __future__ import annotations

import functools

import pytest
import torch

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig, ModelConfig
from lightning_gnnscale.contract import ModuleRuntime, RankContext
from lightning_gnnscale.kit.loaders import StepBatcher
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.inference import full_logits
from lightning_gnnscale.systems.sancus import SancusConfig
from lightning_gnnscale.systems.sancus.datamodule import SancusDataModule
from lightning_gnnscale.systems.sancus.strategy import sum_gradients
from lightning_gnnscale.tasks import TaskConfig, build_task
from tests.helpers.dist import run_distributed
from tests.test_typed_link_prediction import directed_typed

HIDDEN, LAYERS, LR, BATCH, EPOCHS, WORLD = 6, 2, 0.05, 64, 2, 2
TASK = TaskConfig(
    "link_prediction",
    num_negatives=2,
    embedding_dim=4,
    eval_negatives=20,
    decoder="distmult",
    filter_negatives=True,
)
MODEL = ModelConfig("rgcn", hidden=HIDDEN, num_layers=LAYERS, dropout=0.0, lr=LR)


def datamodule(cache_dir, partition_dir=None) -> SancusDataModule:
    return SancusDataModule(
        None if partition_dir else directed_typed(num_nodes=90),
        SancusConfig(name="cagnet", policy="none", rows="random"),
        DataConfig(batch_size=BATCH, partition_dir=partition_dir),
        task=build_task(TASK),
        cache_dir=cache_dir,
        dtype=torch.float64,
    )


def steps(dm) -> list[tuple[int, int]]:
    return [(e, s) for e in range(EPOCHS) for s in range(dm.steps_per_epoch)]


def initial(num_relations: int):
    """``single``'s RGCN (Glorot, seed 0) and a DistMult head with random diagonals."""
    torch.manual_seed(0)
    net = BlockGNN(
        "rgcn",
        6,
        HIDDEN,
        TASK.embedding_dim,
        LAYERS,
        0.0,
        init="glorot",
        num_relations=num_relations,
    ).double()
    return net


def _head(task):
    head = task.trained_head().double()
    with torch.no_grad():
        head.weight.copy_(
            torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(1))
        )
    return head


def _triples(layout, new2old, lo, transposed: bool) -> torch.Tensor:
    """``[3, e]`` original ``(src, dst, relation)`` of every entry of the row blocks (the
    transposed blocks' rows are sources)."""
    n_i, out = layout.num_rows, []
    for j, block in enumerate(layout.transposed if transposed else layout.blocks):
        crow, col = block.crow_indices(), block.col_indices()
        rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow.diff())
        own, far = new2old[lo + rows % n_i], new2old[layout.offsets[j] + col]
        pair = (own, far) if transposed else (far, own)
        out.append(torch.stack([*pair, rows // n_i]))
    return torch.cat(out, 1)


def _rank(rank, world_size, cache_dir):
    dm = datamodule(cache_dir)
    comm = Comm.create()
    dm.setup_rank(RankContext(comm, torch.device("cpu")), dm.part_of(dm.prepare(world_size), rank))
    net = dm.build_model(MODEL).double()
    net.load_state_dict(initial(dm.num_relations).state_dict())
    net.configure_runtime(ModuleRuntime(RankContext(comm, torch.device("cpu"))))
    head = _head(dm.task)
    params = [*net.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=LR)
    losses, weights = [], []
    for epoch, step in steps(dm):
        batch = dm.make_batch(epoch, step)
        optimizer.zero_grad()
        loss_sum = dm.task.loss_sum(net(batch.blocks, batch.x), batch.y)
        (loss_sum / batch.global_seed_count).backward()
        sum_gradients(comm, params)
        losses.append(comm.all_reduce(loss_sum.detach().clone(), category="control"))
        optimizer.step()
        weights.append([p.detach().clone() for p in params])
    new2old, lo = dm.links.part.new2old, dm.links.lo
    return {
        "losses": torch.stack(losses),
        "weights": weights,
        "train": _triples(dm.layout, new2old, lo, False),
        "train_t": _triples(dm.layout, new2old, lo, True),
        "test": _triples(dm.stage_layouts["test"], new2old, lo, False),
        "stats": dm.eval_statistics(net, ("val", "test")),
    }


@functools.cache
def single_reference():
    """``single``'s steps (full neighbourhoods over the training triples and their inverses)
    on the same triples: losses, weights after every step, the final embeddings' statistics."""
    dm = datamodule("unused")
    task, targets = dm.task, dm.targets
    batcher = StepBatcher.on_graph(
        dm.graph, targets, task, [-1] * LAYERS, dm.train_ids, BATCH, dm.seed, 0, 1, False
    )
    net = initial(dm.num_relations)
    head = _head(task)
    params = [*net.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=LR)
    losses, weights = [], []
    for epoch, step in steps(dm):
        batch = batcher[(epoch, step)]
        optimizer.zero_grad()
        loss_sum = task.loss_sum(net(batch.blocks, batch.x), batch.y)
        (loss_sum / batch.global_seed_count).backward()
        optimizer.step()
        losses.append(loss_sum.detach())
        weights.append([p.detach().clone() for p in params])
    with torch.no_grad():
        emb = {
            s: full_logits(task.stage_graph(dm.graph, targets, s), net, 64)
            for s in ("train", "test")
        }
    stats = task.link_statistics(lambda s: emb[s], targets, ("val", "test"), 0, 1)
    return torch.stack(losses), weights, stats, dm


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("sancus-typed-lp"))
    return run_distributed(_rank, WORLD, cache, timeout_s=180)


@pytest.mark.dist
def test_cagnet_takes_singles_typed_steps_exactly(ranks):
    ref_losses, ref_weights, ref_stats, dm = single_reference()
    assert dm.num_relations == 6 and len(ref_losses) > EPOCHS  # inverses; several steps
    for r in ranks:
        torch.testing.assert_close(r["losses"], ref_losses, rtol=0, atol=1e-10)
        for got, want in zip(r["weights"], ref_weights, strict=True):
            for p, q in zip(got, want, strict=True):
                torch.testing.assert_close(p, q, rtol=0, atol=1e-10)
    torch.testing.assert_close(sum(r["stats"] for r in ranks), ref_stats, rtol=0, atol=1e-9)


def test_the_filter_redraws_some_negative():
    """The typed filter matters on these steps (so the exact test checks it): some negative
    of the whole run is a training triple of its relation before the filter."""
    import dataclasses

    dm = datamodule("unused")
    unfiltered = build_task(dataclasses.replace(TASK, filter_negatives=False))
    differs = False
    for epoch, step in steps(dm):
        seeds = dm.order.step(epoch, step, BATCH)
        at = torch.arange(seeds.numel())
        a = dm.task.step_rows(dm.targets, seeds, at, epoch=epoch, step=step)
        b = unfiltered.step_rows(dm.targets, seeds, at, epoch=epoch, step=step)
        differs |= not torch.equal(a[0][a[1]], b[0][b[1]])
    assert differs


def _keys(triples: torch.Tensor, n: int, r: int) -> torch.Tensor:
    src, dst, rel = triples
    return (src * r + rel) * n + dst


@pytest.mark.dist
def test_no_evaluation_triple_nor_its_inverse_is_in_a_training_row_block(ranks):
    _, _, _, dm = single_reference()
    split, n, r = dm.targets.split, dm.graph.num_nodes, dm.num_relations
    base = split.num_relations

    def held_out(name):
        (src, dst), rel = split.positives(name), split.positive_relations(name)
        triple = _keys(torch.stack([src, dst, rel]), n, r)
        inverse = _keys(torch.stack([dst, src, rel + base]), n, r)
        return torch.cat([triple, inverse])

    val, test = held_out("val"), held_out("test")
    for stage, keys in (("train", "train"), ("train", "train_t"), ("test", "test")):
        got = torch.cat([_keys(x[keys], n, r) for x in ranks])
        indptr, indices = split.structure(stage)
        dst = torch.repeat_interleave(torch.arange(n), indptr.diff())
        want = _keys(torch.stack([indices, dst, split.structure_edge_type(stage)]), n, r)
        assert not bool(torch.isin(got, test).any()), keys
        assert bool(torch.isin(got, val).any()) == (stage == "test"), keys
        assert torch.equal(torch.sort(got).values, torch.sort(want).values), keys


def test_a_directed_typed_partition_directory_holds_the_pairs_and_is_checked(tmp_path):
    """The parts hold the in-memory part's triples (pairs, positions, relations) and its
    typed stage blocks (forward and transposed); a relation outside the triples' range, or
    ``pair_relations`` that are not the first of ``relations``, is refused."""
    import json

    import numpy as np

    from lightning_gnnscale.files import file_digest
    from lightning_gnnscale.graph.partition_dir import (
        METADATA,
        PartitionDirError,
        metadata_digest,
        part_folder,
    )

    memory = datamodule(tmp_path / "cache")
    out = tmp_path / "parts"
    memory.write_partition_dir(out, WORLD, log=lambda *_: 0)
    meta = json.loads((out / METADATA).read_text())
    assert meta["pair_relations"] == list(memory.graph.relations)
    assert meta["relations"][3:] == [f"{name}_inverse" for name in memory.graph.relations]
    loaded = datamodule(tmp_path / "cache", str(out))
    assert loaded.num_relations == 6
    for rank in range(WORLD):
        want = memory.part_of(memory.prepare(WORLD), rank).link
        got = loaded.load_part(loaded.prepare(WORLD), rank).link
        assert got.message_relations == want.message_relations and got.num_pair_relations == 3
        for name in ("train", "val", "test"):
            assert all(torch.equal(a, b) for a, b in zip(got.pairs[name], want.pairs[name]))
            assert torch.equal(got.relations[name], want.relations[name])
        for a, b in ((got.test_layout, want.test_layout), (got.full_layout(), want.full_layout())):
            assert a.num_relations == b.num_relations == 6
            for x, y in zip(a.blocks + a.transposed, b.blocks + b.transposed, strict=True):
                assert torch.equal(x.to_dense(), y.to_dense())
    assert loaded.task.relations == tuple(memory.graph.relations)

    def reseal(edit) -> None:
        changed = json.loads((out / METADATA).read_text())
        edit(changed)
        changed["blake2b"] = metadata_digest(changed)
        (out / METADATA).write_text(json.dumps(changed))

    rel_file = out / part_folder(0) / "val_rel.npy"
    np.save(rel_file, np.full_like(np.load(rel_file), 3))  # same bytes, resealed digest
    digest = file_digest(rel_file)
    reseal(lambda m: m["parts"][0]["files"]["val_rel.npy"].update(blake2b=digest))
    fresh = datamodule(tmp_path / "cache", str(out))
    with pytest.raises(PartitionDirError, match=r"val_rel holds relations outside \[0, 3\)"):
        fresh.load_part(fresh.prepare(WORLD), 0)
    reseal(lambda m: m.update(pair_relations=m["relations"][3:]))
    with pytest.raises(PartitionDirError, match="'pair_relations' .* first names of 'relations'"):
        datamodule(tmp_path / "cache", str(out)).prepare(WORLD, [0])


@pytest.mark.e2e
@pytest.mark.conformance_full  # CI time: the typed exact test above trains DistMult in CI
@pytest.mark.parametrize(
    ("task", "decoder"), [("typed_link_prediction", "distmult"), ("link_prediction", "mlp")]
)
def test_train_py_cagnet_trains_the_task_head_as_single_does(tmp_path, task, decoder):
    """``train.py`` end to end (2 ranks, float64, full batches): CAGNET ends with ``single``'s
    net and head, the head broadcast at the start and summed with the net's gradients by the
    strategy (``TRAINS_TASK_HEAD``)."""
    from tests.systems.conformance import (
        Runs,
        exact_batches,
        exact_settings,
        overrides,
        weights,
    )
    from tests.systems.test_conformance import _model_settings

    runs, extra = Runs(tmp_path), [f"task.decoder={decoder}"]
    batches = exact_batches("cagnet", task)
    settings = overrides("cagnet", task, *exact_settings("cagnet"), "model.dropout=0.0", *batches)
    _, got_out = runs.train(*settings, *extra)
    single = overrides("single", task, *_model_settings(settings, tmp_path / "m"), *batches)
    _, want_out = runs.train(*single, *extra)
    ref, mine = weights(want_out), weights(got_out)
    assert any(key.startswith("head.") for key in ref)
    for key in ref:
        torch.testing.assert_close(mine[key], ref[key], rtol=0, atol=1e-9, msg=key)
