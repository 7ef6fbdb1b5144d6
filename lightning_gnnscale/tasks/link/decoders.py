"""Link-prediction decoders: a score per node pair from the encoder's output rows.

Blind to distribution, as the layers are: a score depends only on the two endpoint rows and
the parameters. ``score_candidates`` scores ``m`` candidates per source in one batched product,
so evaluating against 100 fixed negatives per edge is one ``einsum`` (or matmul), not a loop.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class DotDecoder(nn.Module):
    r"""The dot-product decoder (PyG's ``examples/link_pred.py``).

    .. math::
        s(u, v) = \mathbf{h}_u^\top \mathbf{h}_v

    A logit: train it with binary cross-entropy on logits. No parameters.

    Shapes:
        - **forward:** ``h_src [n, d]``, ``h_dst [n, d]`` -> ``[n]``
        - **score_candidates:** ``h_src [n, d]``, ``h_cand [n, m, d]`` -> ``[n, m]``
    """

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return (h_src * h_dst).sum(-1)

    def score_candidates(self, h_src: Tensor, h_cand: Tensor) -> Tensor:
        """Scores of every source against its own ``m`` candidates (one ``bmm``)."""
        return torch.bmm(h_cand, h_src.unsqueeze(2)).squeeze(2)


class MLPDecoder(nn.Module):
    r"""An MLP on the Hadamard product of the endpoint rows.

    .. math::
        s(u, v) = \mathrm{MLP}(\mathbf{h}_u \odot \mathbf{h}_v)

    The Hadamard product (not the concatenation) makes the score symmetric,
    :math:`s(u, v) = s(v, u)`, as an undirected split's pairs are, and keeps the MLP's input
    ``d`` wide. Hidden layers use ReLU; the output is one logit. No dropout.

    Args:
        in_channels: width ``d`` of the encoder's output rows.
        hidden_channels: width of each hidden layer.
        num_layers: number of linear layers (``>= 1``; 1 is a learned weighted dot product).

    Shapes:
        - **forward:** ``h_src [n, d]``, ``h_dst [n, d]`` -> ``[n]``
        - **score_candidates:** ``h_src [n, d]``, ``h_cand [n, m, d]`` -> ``[n, m]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, num_layers: int = 2):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"MLPDecoder needs num_layers >= 1, got {num_layers}")
        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [1]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            if i:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(a, b))
        self.mlp = nn.Sequential(*layers)

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return self.mlp(h_src * h_dst).squeeze(-1)

    def score_candidates(self, h_src: Tensor, h_cand: Tensor) -> Tensor:
        """Scores of every source against its own ``m`` candidates (the MLP on ``[n, m, d]``:
        one matmul per layer)."""
        return self.mlp(h_src.unsqueeze(1) * h_cand).squeeze(-1)
