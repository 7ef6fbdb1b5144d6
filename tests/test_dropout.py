"""Per-step dropout seeding (StepSeed) and the dropout masks of BlockGNN."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_gnnscale.callbacks.step_seed import StepSeed, step_key
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.layers import keep_threshold, row_dropout


def _fire(callback: StepSeed, epoch: int, step: int, rank: int) -> None:
    trainer = SimpleNamespace(current_epoch=epoch, global_rank=rank)
    module = SimpleNamespace(device=torch.device("cpu"))
    callback.on_train_batch_start(trainer, module, None, step)


def test_step_seed_sets_the_cpu_state_torch_manual_seed_would(monkeypatch):
    """Same keys and same CPU generator state as ``torch.manual_seed(key)`` (so checkpoints of
    earlier runs resume identically), without calling ``torch.manual_seed``."""
    torch.manual_seed(step_key(7, 3, 5, 1))
    expected = torch.rand(16)

    def forbidden(*args, **kwargs):
        raise AssertionError("StepSeed must not call torch.manual_seed")

    monkeypatch.setattr(torch, "manual_seed", forbidden)
    torch.rand(3)  # move the generator away first
    _fire(StepSeed(7), epoch=3, step=5, rank=1)
    assert torch.equal(torch.rand(16), expected)


def test_step_key_depends_on_every_key():
    base = step_key(0, 1, 2, 0)
    assert len({base, step_key(1, 1, 2, 0), step_key(0, 2, 2, 0), step_key(0, 1, 3, 0)}) == 4
    assert step_key(0, 1, 2, 1) != base
    assert 0 <= base < 1 << 63


@pytest.mark.parametrize("epoch, step", [(0, 0), (2, 9)])
def test_step_seed_is_a_function_of_the_step(epoch, step):
    cb = StepSeed(11)
    _fire(cb, epoch, step, 0)
    first = torch.rand(8)
    torch.rand(100)
    _fire(cb, epoch, step, 0)
    assert torch.equal(torch.rand(8), first)
    _fire(cb, epoch, step + 1, 0)
    assert not torch.equal(torch.rand(8), first)


def test_step_key_is_the_key_of_earlier_checkpoints():
    """The key formula of the checkpoints written before (resume across versions)."""
    from lightning_gnnscale.graph.sampler import splitmix64_int

    for seed, epoch, step, rank in [(0, 0, 0, 0), (7, 3, 5, 1), (123, 40, 1000, 3)]:
        old = splitmix64_int(seed ^ splitmix64_int((epoch << 40) ^ (step << 8) ^ rank))
        assert step_key(seed, epoch, step, rank) == old & ((1 << 63) - 1)


# ------------------------------------------------------------------------- row dropout masks


def test_keep_threshold_is_exact_on_bytes_and_close_otherwise():
    assert keep_threshold(0.5) == (128, 256)
    assert keep_threshold(0.25) == (192, 256)
    assert keep_threshold(0.0) == (256, 256)
    assert keep_threshold(1.0) == (0, 256)
    threshold, levels = keep_threshold(0.3)
    assert levels == 65536 and abs(threshold / levels - 0.7) <= 2**-17
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        keep_threshold(1.5)


@pytest.mark.parametrize("p", [0.5, 0.3, 0.9])
def test_row_dropout_keeps_one_minus_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    h = torch.rand(4000, 50, dtype=torch.float64) + 0.5
    out = row_dropout(h, p)
    threshold, levels = keep_threshold(p)
    kept = out != 0
    # kept elements are scaled by exactly 1 / q, dropped ones are 0
    torch.testing.assert_close(out[kept], h[kept] * (levels / threshold), rtol=1e-15, atol=0)
    n = h.numel()
    q = threshold / levels
    sd = (q * (1 - q) / n) ** 0.5
    assert abs(float(kept.double().mean()) - q) < 5 * sd
    # every byte of the 64-bit words is uniform (the top one too): keep rate per word position
    positions = 8 if levels == 256 else 4
    per_position = kept.flatten()[: n - n % positions].view(-1, positions).double().mean(0)
    assert (per_position - q).abs().max() < 5 * (q * (1 - q) / (n / positions)) ** 0.5
    # E[out] = h: the mean ratio out / h is 1 up to sampling noise
    ratio = float((out / h).mean())
    assert abs(ratio - 1) < 5 * ((1 - q) / q / n) ** 0.5


def test_row_dropout_is_keyed_by_the_generator_and_off_in_eval():
    h = torch.randn(300, 20)
    torch.manual_seed(3)
    a = row_dropout(h, 0.5)
    torch.manual_seed(3)
    assert torch.equal(row_dropout(h, 0.5), a)
    assert not torch.equal(row_dropout(h, 0.5), a)
    assert row_dropout(h, 0.5, training=False) is h
    assert row_dropout(h, 0.0) is h
    assert torch.equal(row_dropout(h, 1.0), torch.zeros_like(h))
    assert row_dropout(torch.empty(0, 4), 0.5).shape == (0, 4)


def test_row_dropout_gradient_is_the_mask():
    h = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    out = row_dropout(h, 0.3)
    out.sum().backward()
    mask = out.detach() / h.detach()
    torch.testing.assert_close(h.grad, mask)


def test_block_gnn_uses_row_dropout_in_training():
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.graph.sampler import NeighborSampler

    g = sbm(num_nodes=200, num_classes=3, avg_degree=5.0, num_features=6, seed=1).graph
    blocks = NeighborSampler(g.indptr, g.indices, [3, 3], 0).sample(torch.arange(20), 0, 0, 0)
    x = g.x[blocks[0].src_ids]
    net = BlockGNN("sage", 6, 8, 3, num_layers=2, dropout=0.5)
    torch.manual_seed(5)
    first = net(blocks, x)
    torch.manual_seed(5)
    assert torch.equal(net(blocks, x), first)  # per-step determinism
    calls = []

    def spy(h, p, training=True):
        calls.append((tuple(h.shape), p, training))
        return h

    import lightning_gnnscale.models.gnn as gnn

    original = gnn.row_dropout
    gnn.row_dropout = spy
    try:
        net(blocks, x)
    finally:
        gnn.row_dropout = original
    assert calls == [((blocks[0].num_src, 6), 0.5, True), ((blocks[1].num_src, 8), 0.5, True)]
