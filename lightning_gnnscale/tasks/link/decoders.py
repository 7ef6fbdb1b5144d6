"""Link-prediction decoders: a score per node pair from the encoder's output rows.

Blind to distribution, as the layers are: a score depends only on the two endpoint rows and
the parameters. ``score_candidates`` scores ``m`` candidates per source in one batched product,
so evaluating against 100 fixed negatives per edge is one ``einsum`` (or matmul), not a loop;
``score_all`` scores each query against every node (filtered ranking), one matmul for the dot
product and DistMult.

Every decoder takes a relation per pair (``rel``, int64 ``[n]``, or ``None``: a homogeneous
graph's); only :class:`DistMultDecoder` reads it. All three are symmetric,
``s(u, r, v) = s(v, r, u)``, so ``score_all`` ranks heads as it ranks tails.
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

    def forward(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        return (h_src * h_dst).sum(-1)

    def score_candidates(self, h_src: Tensor, h_cand: Tensor, rel: Tensor | None = None) -> Tensor:
        """Scores of every source against its own ``m`` candidates (one ``bmm``)."""
        return torch.bmm(h_cand, h_src.unsqueeze(2)).squeeze(2)

    def score_all(self, h_query: Tensor, emb: Tensor, rel: Tensor | None = None) -> Tensor:
        """``[n, N]``: every query row against every node's row ``emb [N, d]`` (one matmul)."""
        return h_query @ emb.T


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

    def forward(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        return self.mlp(h_src * h_dst).squeeze(-1)

    def score_candidates(self, h_src: Tensor, h_cand: Tensor, rel: Tensor | None = None) -> Tensor:
        """Scores of every source against its own ``m`` candidates (the MLP on ``[n, m, d]``:
        one matmul per layer)."""
        return self.mlp(h_src.unsqueeze(1) * h_cand).squeeze(-1)

    def score_all(self, h_query: Tensor, emb: Tensor, rel: Tensor | None = None) -> Tensor:
        """``[n, N]``: every query row against every node's row (the MLP on ``[n, N, d]``)."""
        return self.mlp(h_query.unsqueeze(1) * emb.unsqueeze(0)).squeeze(-1)


class DistMultDecoder(nn.Module):
    r"""DistMult (Yang et al., 2015): a learned diagonal per relation.

    .. math::
        s(u, r, v) = \sum_i h_{u,i} \, w_{r,i} \, h_{v,i}

    A logit, trained with binary cross-entropy as the other decoders (RGCN's link prediction,
    Schlichtkrull et al., 2018). ``w`` starts at ones, so an untrained DistMult is the dot
    product. ``rel=None`` (a homogeneous graph's pairs) is relation 0 of a one-relation
    decoder.

    Args:
        num_relations: ``R``, the relations of the scored triples.
        dim: width ``d`` of the encoder's output rows.

    Shapes:
        - **forward:** ``h_src [n, d]``, ``h_dst [n, d]``, ``rel [n]`` -> ``[n]``
        - **score_candidates:** ``h_src [n, d]``, ``h_cand [n, m, d]``, ``rel [n]`` -> ``[n, m]``
        - **score_all:** ``h_query [n, d]``, ``emb [N, d]``, ``rel [n]`` -> ``[n, N]``
    """

    def __init__(self, num_relations: int, dim: int):
        super().__init__()
        if num_relations < 1 or dim < 1:
            raise ValueError(f"DistMultDecoder needs R >= 1 and d >= 1, got {num_relations}, {dim}")
        self.weight = nn.Parameter(torch.ones(num_relations, dim))

    def _diagonal(self, rel: Tensor | None, n: int) -> Tensor:
        if rel is None:
            if self.weight.shape[0] != 1:
                raise ValueError(
                    f"DistMult over {self.weight.shape[0]} relations needs each pair's relation"
                )
            return self.weight.expand(n, -1)
        return self.weight.index_select(0, rel)

    def forward(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        return (h_src * self._diagonal(rel, h_src.shape[0]) * h_dst).sum(-1)

    def score_candidates(self, h_src: Tensor, h_cand: Tensor, rel: Tensor | None = None) -> Tensor:
        """Scores of every source against its own ``m`` candidates (one ``bmm``)."""
        query = h_src * self._diagonal(rel, h_src.shape[0])
        return torch.bmm(h_cand, query.unsqueeze(2)).squeeze(2)

    def score_all(self, h_query: Tensor, emb: Tensor, rel: Tensor | None = None) -> Tensor:
        """``[n, N]``: ``(h_query * w_rel) @ emb^T`` (one matmul)."""
        return (h_query * self._diagonal(rel, h_query.shape[0])) @ emb.T
