"""CUDA against the CPU in float64: the layers, the step seeds, and a whole ``single`` run.

The CPU path is the suite's oracle (every system equals ``single`` there); a CUDA run that gives
the CPU run's numbers extends that exactness to CUDA. ``scripts/gpu_check.sh`` runs these (and
every strategy on CUDA); without a CUDA device they are skipped with the reason.
"""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from lightning_gnnscale.callbacks.step_seed import seed_step_generators
from lightning_gnnscale.config_types import DataConfig
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.models.gnn import BlockGNN
from lightning_gnnscale.models.layers import row_dropout
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.single import SingleConfig, SingleDataModule
from tests.helpers.config import make_cfg

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gat"])
def test_layers_on_cuda_equal_the_cpu_on_one_sampled_batch(kind):
    dataset = sbm(num_nodes=600, num_classes=4, avg_degree=8.0, num_features=12, seed=3)
    dm = SingleDataModule(
        dataset.to(torch.float64), SingleConfig(), DataConfig(batch_size=128, fanouts=[5, 4])
    )
    batch = dm.make_batch(0, 0)
    torch.manual_seed(0)
    net = BlockGNN(kind, 12, 16, dataset.num_classes, num_layers=2, dropout=0.0, heads=4).double()
    net_cuda = copy.deepcopy(net).to(CUDA)
    outputs = []
    for model, b in ((net, batch), (net_cuda, batch.to(CUDA))):
        logits = model(b.blocks, b.x)
        F.cross_entropy(logits, b.y).backward()
        outputs.append((logits.detach().cpu(), [p.grad.cpu() for p in model.parameters()]))
    (cpu_logits, cpu_grads), (gpu_logits, gpu_grads) = outputs
    torch.testing.assert_close(gpu_logits, cpu_logits, rtol=0, atol=1e-12)
    for g, c in zip(gpu_grads, cpu_grads):
        torch.testing.assert_close(g, c, rtol=0, atol=1e-12)


def test_step_seeds_key_cuda_dropout_masks():
    h = torch.ones(1000, 16, device=CUDA)
    masks = []
    for key in (5, 5, 6):
        seed_step_generators(key, CUDA)
        masks.append(row_dropout(h, 0.5))
    assert torch.equal(masks[0], masks[1])  # the same step key: the same mask
    assert not torch.equal(masks[0], masks[2])


def _losses(tmp_path, accelerator):
    cfg = make_cfg(
        tmp_path / accelerator,
        "strategy=single",
        "trainer.devices=1",
        "dtype=float64",
        "model.dropout=0.0",
        f"trainer.accelerator={accelerator}",
    )
    metrics, _ = train(cfg)
    return [row["train_loss"] for row in metrics["history"]], metrics


def test_a_single_run_on_cuda_equals_the_same_run_on_the_cpu(tmp_path):
    cpu, _ = _losses(tmp_path, "cpu")
    gpu, metrics = _losses(tmp_path, "gpu")
    assert len(gpu) == len(cpu) == 2
    for a, b in zip(gpu, cpu):
        assert abs(a - b) <= 1e-9 * abs(b), (gpu, cpu)
    assert json.dumps(metrics["history"])  # the summary is plain JSON (no CUDA tensors in it)
