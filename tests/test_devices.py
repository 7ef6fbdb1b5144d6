"""Device handling that a CPU machine can check (the CUDA runs themselves: tests/test_gpu.py)."""

import torch

from lightning_gnnscale.systems.single import SingleStrategy


def test_a_one_process_strategy_on_cuda_without_an_index_uses_the_first_gpu():
    # torch.device("cuda") has no index, which Lightning's set_device refuses at fit time.
    assert SingleStrategy(device="cuda").root_device == torch.device("cuda", 0)
    assert SingleStrategy(device="cuda:1").root_device == torch.device("cuda", 1)
    assert SingleStrategy(device="cpu").root_device == torch.device("cpu")
