"""The model zoo: GCN / SAGE / GAT / RGCN as stacks of block layers, plus user PyG models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from ..config_types import MODEL_INITS
from ..contract import LayerHook
from ..graph.block import Block, blocks_to_subgraph
from .layers import BlockGAT, BlockGCN, BlockSAGE, row_dropout
from .relational import BlockRGAT, BlockRGCN

if TYPE_CHECKING:
    from ..config_types import ModelConfig

MODEL_KINDS = ("gcn", "sage", "gat", "rgcn", "rgat")


class BlockGNN(nn.Module):
    """``num_layers`` block layers; dropout on every layer's input, ReLU between layers.

    Dropout on the input features too, and (GAT) on attention coefficients, as in the GCN and
    GAT papers. Row dropout uses :func:`~.layers.row_dropout` (masks from random bytes, the
    same expectation as ``F.dropout``, keyed by the step seed as ``F.dropout`` is). ``forward(blocks, x, layer_hook)`` runs layer ``l`` on ``blocks[l]`` (input layer
    first). ``layer_hook(l, h)`` is called before every layer, after dropout (so the rows' owner
    applies the mask); systems use it to move rows between processes (e.g. GSplit's shuffle)
    without the model knowing anything about distribution.

    ``rgcn`` and ``rgat`` layers (:class:`~.relational.BlockRGCN`,
    :class:`~.relational.BlockRGAT`) weigh each block edge by its relation (``num_relations``,
    ``num_bases``); the other kinds ignore relations.

    ``init="glorot"`` redraws every 2-D weight of the layers Glorot-uniform (PyG's
    ``GCNConv`` and the GCN paper draw GCN's so; ``torch``, the default, keeps the layers' own
    initialisation: ``nn.Linear``'s for GCN, PyG's for SAGE and GAT).
    """

    def __init__(
        self,
        kind: str,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_layers: int = 2,
        dropout: float = 0.5,
        heads: int = 4,
        init: str = "torch",
        num_relations: int = 1,
        num_bases: int = 0,
    ):
        super().__init__()
        if kind not in MODEL_KINDS:
            raise ValueError(f"unknown model {kind!r}; valid: {list(MODEL_KINDS)} or 'custom'")
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        self.kind, self.num_layers, self.dropout = kind, num_layers, dropout
        self.hidden, self.heads = hidden, heads
        self.num_relations, self.num_bases = num_relations, num_bases
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(
            self._layer(kind, dims[i], dims[i + 1], heads, dropout, last=i == num_layers - 1)
            for i in range(num_layers)
        )
        if init not in MODEL_INITS:
            raise ValueError(f"unknown init {init!r}; valid: {list(MODEL_INITS)}")
        self.init = init
        if init == "glorot":
            for weight in self.layers.parameters():
                if weight.dim() == 2:
                    nn.init.xavier_uniform_(weight)

    def _layer(
        self, kind: str, in_dim: int, out_dim: int, heads: int, dropout: float, last: bool
    ) -> nn.Module:
        if kind == "gcn":
            return BlockGCN(in_dim, out_dim)
        if kind == "rgcn":
            return BlockRGCN(in_dim, out_dim, self.num_relations, self.num_bases)
        if kind == "rgat":
            return BlockRGAT(
                in_dim,
                out_dim,
                self.num_relations,
                heads=1 if last else heads,
                concat=not last,
                num_bases=self.num_bases,
                attention_dropout=dropout,
            )
        if kind == "sage":
            return BlockSAGE(in_dim, out_dim)
        return BlockGAT(
            in_dim, out_dim, heads=1 if last else heads, concat=not last, attention_dropout=dropout
        )

    def forward(
        self, blocks: list[Block], x: Tensor, layer_hook: LayerHook | None = None
    ) -> Tensor:
        """``x``: ``[blocks[0].num_src, in]`` -> logits ``[blocks[-1].num_dst, out]``."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"model has {self.num_layers} layers but got {len(blocks)} blocks")
        h = x
        for i, block in enumerate(blocks):
            h = row_dropout(h, self.dropout, self.training)
            if layer_hook is not None:
                h = layer_hook(i, h)
            h = self.layer_output(i, block, h)
        return h

    def layer_output(self, i: int, block: Block, h: Tensor) -> Tensor:
        """Layer ``i`` on its (already dropped-out) input rows, plus ReLU unless last."""
        h = self.layers[i](block, h)
        return F.relu(h) if i < self.num_layers - 1 else h


class SubgraphModel(nn.Module):
    """Adapter for a user PyG model ``model(x, edge_index)``: runs it on the sampled subgraph.

    The subgraph is the union of the blocks' edges over the input nodes (PyG ``NeighborLoader``
    semantics); the seeds are the first rows, so the first ``blocks[-1].num_dst`` rows are kept.
    Only systems that hand the model a whole (sub)graph on one process can run it.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, blocks: list[Block], x: Tensor, layer_hook: LayerHook | None = None
    ) -> Tensor:
        if layer_hook is not None:
            raise ValueError(
                "a custom (x, edge_index) model cannot run under a strategy that "
                "moves rows between layers; use model=gcn|sage|gat"
            )
        return self.model(x, blocks_to_subgraph(blocks))[: blocks[-1].num_dst]


def build_model(cfg: ModelConfig, in_dim: int, out_dim: int, num_relations: int = 1) -> nn.Module:
    """Model from its config (:class:`~lightning_gnnscale.config_types.ModelConfig`): ``name`` in gcn|sage|gat|rgcn
    (``num_relations``: the graph's, for rgcn), or ``custom`` with ``target`` (a dotted
    path to a class called as ``cls(in_channels=, hidden_channels=, out_channels=, num_layers=,
    **kwargs)``, e.g. ``torch_geometric.nn.models.GraphSAGE``)."""
    if cfg.name == "custom":
        module_name, _, cls_name = str(cfg.target).rpartition(".")
        cls = getattr(importlib.import_module(module_name), cls_name)
        net = cls(
            in_channels=in_dim,
            hidden_channels=cfg.hidden,
            out_channels=out_dim,
            num_layers=cfg.num_layers,
            **dict(cfg.kwargs or {}),
        )
        return SubgraphModel(net)
    return BlockGNN(
        cfg.name,
        in_dim,
        cfg.hidden,
        out_dim,
        num_layers=cfg.num_layers,
        dropout=cfg.dropout,
        heads=cfg.heads,
        init=cfg.init or "torch",
        num_relations=num_relations,
        num_bases=cfg.num_bases,
    )
