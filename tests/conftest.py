"""Suite-wide test hooks: ``gpu``-marked tests skip, with the reason, where no CUDA device is."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    reason = (
        f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False): "
        "GPU tests run on a GPU machine through scripts/gpu_check.sh"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
