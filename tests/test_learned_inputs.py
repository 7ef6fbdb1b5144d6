"""Learned input rows of featureless node types (``kit.embeddings.LearnableInputs``,
``data.featureless=learned``; docs/architecture.md, "Learnable inputs") and the per-rank
checkpoint shards that keep them (``checkpoints.checkpoint_shards``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_gnnscale.checkpoints import (
    SHARDS_KEY,
    checkpoint_shards,
    read_rank_shard,
    shard_file,
)
from lightning_gnnscale.comm import Comm
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.batch import Batch
from lightning_gnnscale.graph.block import Block
from lightning_gnnscale.graph.book import RangeBook
from lightning_gnnscale.graph.generators import typed_sbm
from lightning_gnnscale.kit.embeddings import KVStore, LearnableInputs, embedding_init
from tests.helpers.config import make_cfg

FEATURELESS = ("dataset=typed_sbm", "dataset.num_relations=3", "dataset.featureless_node_types=1")
N, D = 10, 3


def _inputs(learned: torch.Tensor | None) -> LearnableInputs:
    kv = KVStore(Comm.local(), RangeBook(torch.tensor([0, N])))
    return LearnableInputs(kv, D, 7, torch.float64, "sgd", 0.5, torch.arange(N), learned)


def _batch(src: torch.Tensor) -> Batch:
    block = Block(src, 1, torch.zeros(2, 0, dtype=torch.long), torch.ones_like(src))
    x = torch.arange(len(src) * D, dtype=torch.float64).view(-1, D) + 100
    return Batch([block], x, torch.zeros(1, dtype=torch.long), 1)


def test_a_lookup_learns_the_featureless_rows_only():
    """The looked-up rows of learned nodes are the table's and take the gradient (SGD moves
    exactly those table rows by ``lr * grad``); the other rows are the batch's features."""
    learned = torch.zeros(N, dtype=torch.bool)
    learned[[2, 5, 7]] = True
    inputs = _inputs(learned)
    table = inputs.embedding.kv.local_shard("learned_inputs")
    start = table.clone()
    torch.testing.assert_close(start, embedding_init(D, 7, torch.float64)(torch.arange(N)))
    src = torch.tensor([5, 1, 2, 9, 5])
    batch = _batch(src)
    x = inputs.lookup(batch, "cpu").x
    is_learned = learned[src]
    torch.testing.assert_close(x[is_learned], start[src[is_learned]])
    torch.testing.assert_close(x[~is_learned], batch.x[~is_learned])
    weights = torch.arange(1.0, 1 + len(src) * D, dtype=torch.float64).view(-1, D)
    (x * weights).sum().backward()
    inputs.step()
    expected = start.clone()
    expected[5] -= 0.5 * (weights[0] + weights[4])  # a row looked up twice sums its gradients
    expected[2] -= 0.5 * weights[2]
    torch.testing.assert_close(table, expected, rtol=0, atol=1e-12)


def test_evaluation_rows_are_the_tables_learned_rows_and_the_features_elsewhere():
    learned = torch.arange(N) % 3 == 0
    inputs = _inputs(learned)
    x = torch.randn(N, D, dtype=torch.float64)
    rows = inputs.input_rows(torch.arange(N), x)
    table = inputs.embedding.kv.local_shard("learned_inputs")
    torch.testing.assert_close(rows[learned], table[learned])
    torch.testing.assert_close(rows[~learned], x[~learned])
    torch.testing.assert_close(inputs.own_rows(x), rows)
    assert inputs.own_rows(x).data_ptr() != table.data_ptr()


def test_typed_sbm_zeroes_and_names_its_featureless_types():
    dataset = typed_sbm(num_nodes=200, num_node_types=3, featureless_node_types=2, seed=1)
    graph = dataset.graph
    assert graph.meta["featureless_node_types"] == ["type_1", "type_2"]
    featureless = graph.node_type >= 1
    assert featureless.any() and (~featureless).any()
    assert not graph.x[featureless].any() and graph.x[~featureless].abs().sum(1).gt(0).all()


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    from lightning_gnnscale.run import train

    tmp = tmp_path_factory.mktemp("learned")
    metrics, objects = train(make_cfg(tmp, "strategy=single", *FEATURELESS, "dtype=float64"))
    return Path(objects["output_dir"]), objects


def test_training_moves_the_learned_rows_and_checkpoints_them_per_rank(single_run):
    """After training, the shard's table differs from its initial rows exactly on learned
    nodes that training looked up (Adagrad state > 0 there); featured nodes' rows never move."""
    output_dir, objects = single_run
    (shard,) = checkpoint_shards(output_dir / "checkpoints" / "last.ckpt")
    rows = shard["SingleDataModule"]
    graph = objects["graph"]
    learned = graph.node_type == graph.node_types.index("type_1")
    init = embedding_init(graph.num_features, 0, torch.float64)(rows["orig_ids"])
    moved = (rows["learned_inputs"] != init).any(1)
    touched = rows["learned_inputs@adagrad_state"].gt(0).any(1)
    assert moved.any() and torch.equal(moved, touched)
    assert not (moved & ~learned).any()


def _copy_checkpoint(output_dir: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "checkpoints"
    shutil.copytree(output_dir / "checkpoints", copy)
    return copy / "last.ckpt"


def test_a_damaged_missing_or_foreign_shard_is_refused(single_run, tmp_path):
    output_dir, _ = single_run
    path = _copy_checkpoint(output_dir, tmp_path)
    manifest = torch.load(path, weights_only=True)[SHARDS_KEY]
    shard = shard_file(path, manifest["token"], 0, 1)
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match="does not match its checkpoint"):
        checkpoint_shards(path)
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        checkpoint_shards(path)


def test_shards_for_another_world_size_are_refused(single_run):
    """(A resume with another world size is refused earlier, by the run's identity; a test or
    predict from the checkpoint reaches the shards.)"""
    output_dir, _ = single_run
    path = output_dir / "checkpoints" / "last.ckpt"
    manifest = torch.load(path, weights_only=True)[SHARDS_KEY]
    with pytest.raises(ConfigError, match="shards of 1 ranks .* resume with 1 ranks"):
        read_rank_shard(path, manifest, 0, 2)
    with pytest.raises(ValueError, match="manifest is damaged"):
        read_rank_shard(path, {**manifest, "token": "../../etc"}, 0, 1)


def test_a_system_that_does_not_learn_inputs_refuses_before_spawn(tmp_path):
    from lightning_gnnscale.run import train

    with pytest.raises(ConfigError, match=r"strategies that do: \['ddp', 'distdgl', 'single'\]"):
        train(make_cfg(tmp_path, "strategy=bytegnn", *FEATURELESS))
    # zeros: the featureless rows stay zero, accepted
    assert make_cfg(tmp_path, "strategy=bytegnn", *FEATURELESS, "data.featureless=zeros")


def test_a_gradient_scaler_is_refused_with_learned_inputs(tmp_path):
    """16-mixed's scaler scales the loss: the sparse step would apply scaled gradients (and
    step where the scaler skips), so the first step refuses it."""
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    import lightning_gnnscale as gs
    from lightning_gnnscale.run import build_datamodule, build_module, build_strategy, validate

    run = validate(make_cfg(tmp_path, "strategy=single", *FEATURELESS))
    dm = build_datamodule(run)
    dm.prepare(1)
    trainer = L.Trainer(
        strategy=build_strategy(run),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[gs.StepSeed(0)],
    )
    with pytest.raises(ConfigError, match="gradient scaler"):
        trainer.fit(build_module(run, dm), datamodule=dm)


def test_weights_from_says_the_learned_rows_start_afresh(single_run):
    from lightning_gnnscale.checkpoints import load_weights
    from lightning_gnnscale.run import build_datamodule, build_module, validate

    output_dir, _ = single_run
    run = validate(make_cfg(output_dir.parent / "w", "strategy=single", *FEATURELESS))
    dm = build_datamodule(run)
    dm.prepare(1)
    module = build_module(run, dm)
    with pytest.warns(UserWarning, match="learned input rows .* start from their initial rows"):
        load_weights(module, output_dir / "checkpoints" / "last.ckpt")


def test_a_checkpoints_rows_are_not_dropped_by_a_run_that_learns_none(single_run):
    """A shard the run does not consume (data.featureless=zeros) is refused, not ignored."""
    from lightning_gnnscale.run import build_datamodule, validate

    output_dir, _ = single_run
    run = validate(
        make_cfg(output_dir.parent / "z", "strategy=single", *FEATURELESS, "data.featureless=zeros")
    )
    dm = build_datamodule(run)
    dm.prepare(1)
    with pytest.raises(ValueError, match="learns none"):
        dm.load_state_dict({"train_epoch": 1, "rank_shard": {"orig_ids": torch.arange(3)}})


def test_a_manifest_token_outside_the_shards_folder_is_refused_on_every_path(single_run, tmp_path):
    from lightning_gnnscale.checkpoints import copy_rank_shards, shards_intact

    output_dir, _ = single_run
    path = output_dir / "checkpoints" / "last.ckpt"
    manifest = torch.load(path, weights_only=True)[SHARDS_KEY]
    bad = {**manifest, "token": "../../secret"}
    assert shards_intact(path, manifest) and not shards_intact(path, bad)
    with pytest.raises(ValueError, match="manifest is damaged"):
        copy_rank_shards(path, tmp_path / "copy.ckpt", bad)
    assert not (tmp_path / "secret").exists()


def test_a_typed_directory_that_does_not_name_its_featureless_types_is_refused(tmp_path):
    """A typed partition directory written before directories named their featureless types
    (here: the key removed and the metadata resealed) is refused before any rank starts, so
    its zero rows are never taken for features; the current one carries the flags."""
    import lightning_gnnscale as gs
    from tests.test_partition_dir_untrusted import reseal

    dataset = gs.load_dataset("typed_sbm", num_nodes=200, num_relations=2, featureless_node_types=1)
    config = gs.system("distdgl")[2]
    data = gs.DataConfig(batch_size=64, fanouts=[5, 5])
    dm = gs.system("distdgl")[1](dataset, config, data, cache_dir=tmp_path / "cache")
    dm.write_partition_dir(tmp_path / "parts", 2, log=lambda *_: 0)

    def from_directory():
        return gs.system("distdgl")[1](
            None, config, gs.DataConfig(partition_dir=str(tmp_path / "parts"))
        )

    flags = from_directory().featureless_nodes(0)
    assert torch.equal(flags, dataset.graph.node_type == 1)
    reseal(tmp_path / "parts", lambda meta: meta.pop("featureless_node_types"))
    with pytest.raises(ConfigError, match="partition again"):
        from_directory().prepare(2)
