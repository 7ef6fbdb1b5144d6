"""`ddp` with unsalted keys equals `single` on the same step: logits, loss and gradients (float64).

Each rank samples its share of the step's seeds; by split invariance the union of the ranks'
samples is the single-process sample, and since the loss is divided by the global seed count,
the summed rank gradients equal the single-process gradient.
"""

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.comm import Comm
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.systems.ddp import DataParallelConfig, DataParallelDataModule
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
EPOCH, STEP = 1, 1  # step 1 is the short last step (24 of 120 seeds)


def make_dataset():
    return sbm(num_nodes=400, num_classes=4, avg_degree=8.0, num_features=12, seed=3).to(
        torch.float64
    )


def make_net(kind, dataset):
    torch.manual_seed(0)
    return BlockGNN(
        kind, dataset.graph.num_features, 16, dataset.targets.out_dim, 2, dropout=0.0, heads=4
    ).double()


def step_outputs(kind, rank, world_size, salt_by_rank=False):
    """(seed ids, logits, loss contribution, flat gradient) of this rank for one step."""
    dataset = make_dataset()
    dm = DataParallelDataModule(
        dataset,
        DataParallelConfig(salt_by_rank=salt_by_rank),
        DataConfig(batch_size=96, fanouts=FANOUTS),
        seed=7,
    )
    dm.rank, dm.world_size = rank, world_size
    net = make_net(kind, dataset)
    batch = dm.make_batch(EPOCH, STEP)
    logits = net(batch.blocks, batch.x)
    loss = F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in net.parameters()])
    return batch.blocks[-1].dst_ids, logits.detach(), loss.detach(), grad


KINDS = ("gcn", "sage", "gat")


def _ddp_rank(rank, world_size, salt_by_rank):
    comm = Comm.create()
    out = {}
    for kind in KINDS:
        seeds, logits, loss, grad = step_outputs(kind, rank, world_size, salt_by_rank)
        comm.all_reduce(grad, category="gradient")
        comm.all_reduce(loss, category="control")
        out[kind] = (seeds, logits, loss, grad)
    return out


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_equals_single(world_size):
    results = run_distributed(_ddp_rank, world_size, False, timeout_s=120)
    for kind in KINDS:
        ref_seeds, ref_logits, ref_loss, ref_grad = step_outputs(kind, 0, 1)
        row = {int(s): i for i, s in enumerate(ref_seeds)}
        covered = torch.cat([r[kind][0] for r in results])
        assert sorted(covered.tolist()) == sorted(ref_seeds.tolist())  # each seed exactly once
        for seeds, logits, loss, grad in (r[kind] for r in results):
            rows = torch.tensor([row[int(s)] for s in seeds], dtype=torch.long)
            torch.testing.assert_close(logits, ref_logits[rows], rtol=0, atol=1e-12)
            torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-12)
            torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)


@pytest.mark.dist
def test_rank_salted_ddp_samples_differently():
    """The default data-parallel baseline samples independent micro-batches (salted keys)."""
    _, _, _, ref_grad = step_outputs("sage", 0, 1)
    results = run_distributed(_ddp_rank, 2, True, timeout_s=120)
    assert not torch.allclose(results[0]["sage"][3], ref_grad, atol=1e-9)
