"""SANCUS's skip-broadcast layer (docs/systems/sancus.md#what-is-implemented): per-rank state,
the autograd Function and the GCN built from it.

Forward of layer input ``l`` on rank ``i``: ``T_i = Â_ii H_i + sum_{j != i} Â_ij H̃_j`` where
``H̃_j`` is root ``j``'s block, fresh if ``j`` broadcast it this epoch (flag ACTIVE), else the
receivers' cached copy (STALE roots are simply not called). Backward: the output gradient
``G`` of every root is broadcast (``Â`` is symmetric, so rank ``j`` needs ``Â_ji G_i``), the
input gradient is ``(sum_j Â_ij G_j) Wᵀ`` (straight-through across stale blocks) and the weight
gradient is ``T_iᵀ G_i``, the exact gradient of the mixed-version forward. Weight gradients are
summed over ranks by the strategy. A typed graph's RGCN (:class:`SkipBroadcastRelational`)
broadcasts the same rows; its blocks give one ``T_r`` per relation and its backward multiplies
the broadcast ``G_j`` with the transposed blocks (docs/systems/sancus.md#typed-graphs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...comm import Comm
from ...config_types import MODEL_INITS
from ...contract import ModuleRuntime
from ...models.layers import BlockGCN
from ...models.relational import BlockRGCN
from .layout import RowBlocks
from .policy import NEVER, StalenessPolicy, variation_flag


class SkipBroadcast:
    """One rank's SANCUS state: caches, versions and the flag log (owned by :class:`SancusGCN`).

    It receives the rank's ``comm`` with :meth:`connect` and its row blocks with
    :meth:`use_layout` (the first layout starts empty caches).

    Attributes (after the first layout), per layer input ``l``:
        cache[l][j]: root ``j``'s block as last received ``[n_j, F_l]`` (``None`` for ``j = i``).
        last_bcast[l]: int64 ``[P]`` epoch of every root's last broadcast (``NEVER`` before).
        own_last[l]: this rank's block as last broadcast (kept for ``variation`` only).
        grad_cache / grad_last: the same for output gradients δ of layer ``l`` (SkipG only).
        forward_flags / backward_flags: ``{(epoch, l): bool [P]}`` of every training epoch.
        distances: ``{(epoch, l): float}`` this rank's variation distance at decision time.
        epoch: the training epoch running (``-1`` before the first).
    """

    def __init__(self, policy: StalenessPolicy, num_layers: int):
        self.policy, self.num_layers = policy, num_layers
        self.comm: Comm | None = None
        self.layout: RowBlocks | None = None
        self.epoch = -1

    def connect(self, comm: Comm) -> None:
        """Broadcast through ``comm`` (the rank's metered collectives)."""
        self.comm = comm

    def use_layout(self, layout: RowBlocks) -> None:
        """Work on ``layout`` (a batch's or the evaluation's row blocks); the first layout
        starts empty caches, a later one must be the same blocks (possibly moved)."""
        if self.comm is None:
            raise RuntimeError(
                "SancusGCN has no comm yet: the strategy hands it one through "
                "configure_runtime (GNNModule forwards it) before training"
            )
        if self.layout is None:
            self._start(layout)
        elif layout.rank != self.layout.rank or not torch.equal(
            layout.offsets, self.layout.offsets
        ):
            raise ValueError(
                f"SancusGCN was trained on rank {self.layout.rank}'s row blocks "
                f"{self.layout.offsets.tolist()}, now given rank {layout.rank}'s "
                f"{layout.offsets.tolist()}; its caches hold the first layout's blocks"
            )
        self.layout = layout

    def _start(self, layout: RowBlocks) -> None:
        if self.comm.world_size != layout.world_size:
            raise ValueError(
                f"row blocks for {layout.world_size} ranks but world size {self.comm.world_size}"
            )
        p, n_layers = layout.world_size, self.num_layers
        self.cache = [[None] * p for _ in range(n_layers)]
        self.last_bcast = [torch.full((p,), NEVER, dtype=torch.int64) for _ in range(n_layers)]
        self.own_last: list[Tensor | None] = [None] * n_layers
        self.grad_cache = [[None] * p for _ in range(n_layers)]
        self.grad_last = [torch.full((p,), NEVER, dtype=torch.int64) for _ in range(n_layers)]
        self.forward_flags: dict[tuple[int, int], Tensor] = {}
        self.backward_flags: dict[tuple[int, int], Tensor] = {}
        self.distances: dict[tuple[int, int], float] = {}

    def start_epoch(self) -> None:
        """One training step = one full-graph epoch (validation does not move the counter)."""
        self.epoch += 1

    # ---------------------------------------------------------------------------- flags
    def _decide(self, layer: int, h: Tensor) -> Tensor:
        layout = self.layout
        flags = self.policy.local_flags(layer, self.epoch, self.last_bcast[layer], layout.consumer)
        if flags is None:  # variation gap: each root decides, one byte per rank is gathered
            active, distance = variation_flag(
                h.detach(), self.own_last[layer], self.policy.variation_gap
            )
            self.distances[(self.epoch, layer)] = distance
            own = torch.tensor([int(active)], dtype=torch.uint8)
            flags = self.comm.all_gather_tensor(own, category="control").bool()
        self.forward_flags[(self.epoch, layer)] = flags.clone()
        return flags

    def _eval_flags(self, layer: int) -> Tensor:
        """Exact evaluation: every root broadcasts, except a root whose X every rank already
        cached (X never changes); nothing is stored. ``last_bcast`` is the same on every rank,
        so so are these flags."""
        if layer == 0:
            return self.last_bcast[0] == NEVER
        return torch.ones(self.layout.world_size, dtype=torch.bool)

    # ---------------------------------------------------------------------- aggregation
    def _broadcast_and_multiply(
        self, own: Tensor, flags: Tensor, cache: list | None, category: str, backward=False
    ) -> Tensor:
        """``sum_j Â_ij B_j`` ``[n_i, F]`` where ``B_i = own`` and, for ``j != i``, ``B_j`` is
        root ``j``'s block, broadcast now if ``flags[j]`` (stored into ``cache[j]`` when a cache
        is given), else read from ``cache[j]``. Every rank makes the same broadcast calls.
        A typed graph's blocks give ``[R * n_i, F]`` (relation-major); ``backward``: with the
        transposed blocks (:attr:`RowBlocks.backward_blocks`)."""
        layout, rank = self.layout, self.layout.rank
        blocks = layout.backward_blocks if backward else layout.blocks
        reads = layout.backward_reads if backward else lambda j: bool(layout.consumer[rank, j])
        out = blocks[rank] @ own
        for j, size in enumerate(layout.sizes):
            if j == rank:
                if flags[j]:
                    self.comm.broadcast(own.detach().contiguous(), j, category=category)
                continue
            if not flags[j] and not reads(j):
                continue  # neither sent nor read (SCS-A skips blocks nobody consumes)
            if flags[j]:
                block = own.new_empty(size, own.shape[1])
                self.comm.broadcast(block, j, category=category)
                if cache is not None:
                    cache[j] = block
            else:
                block = cache[j]
            if reads(j):
                out = out + blocks[j] @ block
        return out

    def aggregate(self, h: Tensor, layer: int, train: bool) -> Tensor:
        """``T_i = sum_j Â_ij H̃_j`` ``[n_i, F_l]`` (a typed graph: per relation, ``[R * n_i,
        F_l]``); ``train`` applies the policy and updates the caches, otherwise exact and
        stateless (reading only the exact X cache)."""
        flags = self._decide(layer, h) if train else self._eval_flags(layer)
        category = "feature" if layer == 0 else "activation"
        # Evaluation never stores: it reads a copy of the cache row so the originals stay.
        # Blocks nobody reads stale are not kept (every one broadcast now).
        if train:
            cache = self.cache[layer] if self.policy.stores_blocks(layer) else None
        else:
            cache = None if bool(flags.all()) else list(self.cache[layer])
        out = self._broadcast_and_multiply(h, flags, cache, category)
        if train:
            self.last_bcast[layer][flags] = self.epoch
            if self.policy.root_decides(layer) and flags[self.layout.rank]:
                self.own_last[layer] = h.detach().clone()
        return out

    def aggregate_gradient(self, grad: Tensor, layer: int) -> Tensor:
        """``sum_j Â_ij G_j`` ``[n_i, F_out]`` for the output gradients of layer ``layer``; roots
        broadcast ``G_j`` every epoch (SkipG: under its epoch bound, else cached δ̃_j). A typed
        graph: ``sum_j (Â_rᵀ)_ij G_j`` per relation, ``[R * n_i, F_out]``."""
        flags = self.policy.gradient_flags(self.epoch, self.grad_last[layer])
        self.backward_flags[(self.epoch, layer)] = flags.clone()
        cache = self.grad_cache[layer] if self.policy.name == "skipg" else None
        out = self._broadcast_and_multiply(grad, flags, cache, "activation_grad", backward=True)
        self.grad_last[layer][flags] = self.epoch
        return out

    # -------------------------------------------------------------------------- memory
    def cache_bytes(self) -> dict[str, int]:
        """Bytes held now: received embedding blocks, ``own_last`` (variation), δ caches."""

        def size(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors if t is not None)

        return {
            "embedding_cache": sum(size(row) for row in self.cache),
            "own_last": size(self.own_last),
            "gradient_cache": sum(size(row) for row in self.grad_cache),
        }


def cache_bytes_formula(
    num_nodes: int,
    own_rows: int,
    widths: list[int],
    element_size: int,
    policy: StalenessPolicy,
) -> int:
    """Cache bytes of rank ``i`` (docs/systems/sancus.md#cache-memory):
    ``sum_l element_size * (N - n_i) * F_l`` over the layer inputs ``l`` whose blocks are kept
    (:meth:`StalenessPolicy.stores_blocks`), plus ``element_size * n_i * F_l`` for every layer
    input whose root keeps its own last copy (SCS-H; not X under ``input_policy=once``)."""
    total = sum(
        element_size * (num_nodes - own_rows) * f
        for layer, f in enumerate(widths)
        if policy.stores_blocks(layer)
    )
    own = [f for layer, f in enumerate(widths) if policy.root_decides(layer)]
    return total + sum(element_size * own_rows * f for f in own)


class SkipBroadcastLinear(torch.autograd.Function):
    """``Z_i = T_i Wᵀ`` with ``T_i`` from :meth:`SkipBroadcast.aggregate` (bias added outside)."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, runtime: SkipBroadcast, layer: int) -> Tensor:
        aggregated = runtime.aggregate(h, layer, train=True)
        ctx.save_for_backward(aggregated, weight)
        ctx.runtime, ctx.layer = runtime, layer
        return aggregated @ weight.t()

    @staticmethod
    def backward(ctx, grad: Tensor):
        aggregated, weight = ctx.saved_tensors
        grad_h = None
        if ctx.needs_input_grad[0]:  # X needs no gradient: layer 1 skips the δ broadcast
            grad_h = ctx.runtime.aggregate_gradient(grad.contiguous(), ctx.layer) @ weight
        return grad_h, grad.t() @ aggregated, None, None


class SkipBroadcastRelational(torch.autograd.Function):
    """RGCN's neighbour term ``Z_i = sum_r T_r W_r`` with ``T = [T_0; ...; T_{R-1}]`` from
    :meth:`SkipBroadcast.aggregate` (``[R * n_i, in]``, ``weight [R, in, out]``; the root term
    and the bias are added outside). Backward: the output gradient ``G`` of every root is
    broadcast (``F_out`` wide, as GCN's), the input gradient is ``sum_r (sum_j (Â_rᵀ)_ij G_j)
    W_rᵀ`` and ``dW_r = T_rᵀ G_i``."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, runtime: SkipBroadcast, layer: int) -> Tensor:
        num_rel, n = weight.shape[0], h.shape[0]
        aggregated = runtime.aggregate(h, layer, train=True).view(num_rel, n, -1)
        ctx.save_for_backward(aggregated, weight)
        ctx.runtime, ctx.layer = runtime, layer
        return torch.bmm(aggregated, weight).sum(0)

    @staticmethod
    def backward(ctx, grad: Tensor):
        aggregated, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_h = None
        if ctx.needs_input_grad[0]:  # X needs no gradient: layer 1 skips the δ broadcast
            spread = ctx.runtime.aggregate_gradient(grad, ctx.layer).view(
                weight.shape[0], -1, grad.shape[1]
            )
            grad_h = torch.bmm(spread, weight.transpose(1, 2)).sum(0)
        grad_w = torch.matmul(aggregated.transpose(1, 2), grad)
        return grad_h, grad_w, None, None


class SancusGCN(nn.Module):
    """GCN (or, on a typed graph, RGCN) trained full-graph over row blocks; it owns its
    :class:`SkipBroadcast` runtime.

    Parameters are named and shaped as ``BlockGNN("gcn", ...)`` (``layers.<l>.lin.weight``,
    ``layers.<l>.bias``; ``rgcn``: ``BlockGNN("rgcn", ...)``'s ``layers.<l>.weight``,
    ``.comp``, ``.root.weight``, ``.bias``), so a ``single`` model's ``state_dict`` loads
    unchanged. The rank's
    ``comm`` arrives through :meth:`configure_runtime` (``GNNModule`` forwards the strategy's
    :class:`ModuleRuntime`); the row blocks come with every call.

    ``forward(blocks, x)``: one training epoch. ``blocks = [RowBlocks]`` (this rank's row
    blocks, the batch's only block), ``x`` = this rank's input rows ``[n_i, F_0]``; returns the
    logits of this rank's training rows ``blocks[0].seed_rows`` ``[n_train_i, C]``. With
    ``blocks = [RowBlocks, EndpointRows]`` (link prediction) it returns the output rows of the
    step's endpoints instead, those another rank owns exchanged from it
    (:class:`~.links.EndpointRows`).

    Args:
        in_dim, hidden, out_dim, num_layers: the GCN's sizes.
        policy: the staleness policy of its skipped broadcasts.
        init: ``torch`` | ``glorot``: the weights drawn as ``BlockGNN(kind, ..., init=)``
            draws them (the same generator calls, so the same seed gives the same weights).
        kind: ``gcn`` (GCN's ``Â``) | ``rgcn`` (a typed graph's row blocks per relation,
            :class:`~.relational.BlockRGCN`'s layers: ``h = x W_0 + sum_r Â_r x W_r + b``).
        num_relations, num_bases: RGCN's ``R`` and basis count (``kind="rgcn"``).
    """

    KINDS = ("gcn", "rgcn")

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        num_layers: int,
        policy: StalenessPolicy,
        init: str = "torch",
        kind: str = "gcn",
        num_relations: int = 1,
        num_bases: int = 0,
    ):
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"unknown SancusGCN kind {kind!r}; valid: {list(self.KINDS)}")
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.num_layers, self.kind = num_layers, kind
        self.num_relations = num_relations if kind == "rgcn" else 0
        if kind == "gcn":
            layers = (BlockGCN(dims[i], dims[i + 1]) for i in range(num_layers))
        else:
            layers = (
                BlockRGCN(dims[i], dims[i + 1], num_relations, num_bases) for i in range(num_layers)
            )
        self.layers = nn.ModuleList(layers)
        if init not in MODEL_INITS:
            raise ValueError(f"unknown init {init!r}; valid: {list(MODEL_INITS)}")
        self.init = init
        if init == "glorot":  # as BlockGNN
            for weight in self.layers.parameters():
                if weight.dim() == 2:
                    nn.init.xavier_uniform_(weight)
        self.runtime = SkipBroadcast(policy, num_layers)

    @classmethod
    def of(cls, module: nn.Module) -> SancusGCN:
        """The ``SancusGCN`` inside ``module`` (e.g. a ``GNNModule``), for report callbacks."""
        found = next((m for m in module.modules() if isinstance(m, cls)), None)
        if found is None:
            raise TypeError(f"{type(module).__name__} holds no SancusGCN")
        return found

    def configure_runtime(self, runtime: ModuleRuntime) -> None:
        """Broadcast through the strategy's metered ``comm`` (called once, before training)."""
        self.runtime.connect(runtime.context.comm)

    @property
    def widths(self) -> list[int]:
        """Width ``F_l`` of every layer input."""
        if self.kind == "rgcn":
            return [layer.in_dim for layer in self.layers]
        return [layer.lin.in_features for layer in self.layers]

    def check_layout(self, layout: RowBlocks) -> None:
        """The row blocks are this net's propagation: GCN's ``Â`` for ``gcn``, ``R`` relations'
        blocks for ``rgcn``."""
        if layout.num_relations != self.num_relations:
            have = (
                f"{layout.num_relations} relations' blocks" if layout.num_relations else "GCN's Â"
            )
            raise ValueError(
                f"SancusGCN({self.kind!r}, num_relations={self.num_relations}) given row blocks "
                f"of {have}: a typed graph trains model=rgcn, a homogeneous one model=gcn"
            )

    def forward(self, blocks: list, x: Tensor, layer_hook=None) -> Tensor:
        if layer_hook is not None:
            raise ValueError("SancusGCN moves rows itself; it takes no layer hook")
        layout = blocks[0]
        self.check_layout(layout)
        self.runtime.use_layout(layout)
        self.runtime.start_epoch()
        out = self.propagate(x, train=True)
        if len(blocks) > 1:  # link prediction: the step's endpoint rows, some from their owners
            return blocks[1].gather(out, self.runtime.comm)
        return out[layout.seed_rows]

    def propagate(self, x: Tensor, train: bool, layers: int | None = None) -> Tensor:
        """Logits of every own row ``[n_i, C]``; ``train=False`` is the exact stateless pass;
        ``layers``: stop after that many layers (the last one's input: embeddings)."""
        h = x
        for index, layer in enumerate(self.layers[:layers]):
            if self.kind == "rgcn":
                h = self._relational(layer, index, h, train)
                continue
            weight = layer.lin.weight
            if train:
                z = SkipBroadcastLinear.apply(h, weight, self.runtime, index)
            else:
                z = self.runtime.aggregate(h, index, train=False) @ weight.t()
            z = z + layer.bias
            h = F.relu(z) if index < self.num_layers - 1 else z
        return h

    def _relational(self, layer: BlockRGCN, index: int, h: Tensor, train: bool) -> Tensor:
        """RGCN layer ``index`` on the own rows: ``h W_0 + sum_r Â_r H̃ W_r + b`` (+ ReLU)."""
        weight = layer.relation_weights()  # [R, in, out]: autograd reaches the bases
        if train:
            z = SkipBroadcastRelational.apply(h, weight, self.runtime, index)
        else:
            aggregated = self.runtime.aggregate(h, index, train=False)
            z = torch.bmm(aggregated.view(weight.shape[0], h.shape[0], -1), weight).sum(0)
        z = z + layer.root(h) + layer.bias
        return F.relu(z) if index < self.num_layers - 1 else z

    @torch.no_grad()
    def exact_logits(self, x: Tensor, layout: RowBlocks, layers: int | None = None) -> Tensor:
        """Exact distributed inference of the own rows ``[n_i, C]`` (every rank must call it);
        ``layers``: of the first ``layers`` layers only."""
        self.check_layout(layout)
        self.runtime.use_layout(layout)
        return self.propagate(x, train=False, layers=layers)
