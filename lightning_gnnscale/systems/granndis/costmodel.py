"""GraNNDIS's analytic models (spec §4.8; paper §4, §5.1, §9.1) as pure functions.

Time models (eqs. 1–7) count in vertices: ``C`` is compute throughput and ``b_intra``,
``b_inter`` the per-GPU link bandwidths, all in vertices per second; ``V``/``E`` are the graph's
vertex and edge counts. The memory estimator and planner count bytes. ``modelled_epoch_time``
turns metered bytes per link class into seconds on the paper's clusters, reusing
``comm.network.NetworkModel``. Derivations and the typos kept: docs/systems/granndis.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...comm.network import PROFILES, NetworkModel
from ...comm.topology import INTER_SERVER, INTRA_SERVER, LINK_CLASSES


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def _servers_workers(num_servers: int, workers_per_server: int) -> None:
    for name, value in (("num_servers", num_servers), ("workers_per_server", workers_per_server)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


# ------------------------------------------------------------------------------- time (eqs 1-7)
def t_prev(
    V: float,
    E: float,
    num_servers: int,
    workers_per_server: int,
    C: float,
    b_intra: float,
    b_inter: float,
) -> float:
    """Eq. 1: epoch time of prior full-graph training (compute + intra + inter halo traffic)."""
    _servers_workers(num_servers, workers_per_server)
    _positive(C=C, b_intra=b_intra, b_inter=b_inter)
    ns, ng = num_servers, workers_per_server
    intra = ((ng - 1) / (ng * ns)) / b_intra
    inter = (1 - 1 / ns) / b_inter
    return V / (ns * ng * C) + E / (ns * ng) * (intra + inter)


def t_preload(
    V: float,
    E: float,
    num_servers: int,
    workers_per_server: int,
    C: float,
    b_intra: float,
    growth: float,
    num_layers: int,
) -> float:
    """Eq. 2: epoch time of FLX with ``k = L``; ``growth`` is ``D^alpha``.

    Every server recomputes its preloaded ``D^alpha * L``-fold dependency graph and exchanges
    halos only inside the server (the paper's ``B_inta`` is ``B_intra``).
    """
    _servers_workers(num_servers, workers_per_server)
    _positive(C=C, b_intra=b_intra, growth=growth)
    ns, ng = num_servers, workers_per_server
    scale = growth * num_layers
    return V * scale / (ns * ng * C) + E * scale / (ns * ng) * (((ng - 1) / ng) / b_intra)


def replication_in_range(
    growth: float, num_layers: int, num_servers: int, workers_per_server: int
) -> bool:
    """Eq. 3: ``1 < D^alpha L <= N_s N_g`` (replication never exceeds "every GPU holds all")."""
    return 1 < growth * num_layers <= num_servers * workers_per_server


def flx_threshold(D: float, alpha: float, num_layers: int) -> float:
    """Eqs. 4–5 right-hand side ``(D^alpha L - 1) / D``.

    With ``1/B_intra ~ 0``, ``1/N ~ 0`` and ``E = D V``, eq. 2 < eq. 1 reduces to
    ``C / B_inter > (D^alpha L - 1) / D``. Paper: ``D^alpha = 2, D = 10, L = 3`` gives 0.5.
    """
    _positive(D=D)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    return (D**alpha * num_layers - 1) / D


def flx_wins(C: float, b_inter: float, D: float, alpha: float, num_layers: int) -> bool:
    """Eq. 5: whether FLX (``k = L``) beats prior full-graph training in the approximation."""
    _positive(C=C, b_inter=b_inter)
    return C / b_inter > flx_threshold(D, alpha, num_layers)


def t_sampling(
    V: float,
    E: float,
    num_servers: int,
    workers_per_server: int,
    C: float,
    b_intra: float,
    m: float,
    alpha: float,
    hops: int,
) -> float:
    """Eq. 6 as printed: epoch time with EAS (growth ``m^alpha`` per hop, ``hops`` = the
    equation's ``k``, i.e. ``h``; ``m`` is about the fanout).

    The intra bracket is printed as ``(N_s N_g - 1) / B_intra``. By analogy with eq. 2 it is
    most likely meant to be ``((N_g - 1) / N_g) / B_intra`` (only intra-server halos remain);
    we keep the printed form so that the function reproduces the paper.
    """
    _servers_workers(num_servers, workers_per_server)
    _positive(C=C, b_intra=b_intra, m=m)
    ns, ng = num_servers, workers_per_server
    scale = m**alpha * hops
    return V * scale / (ns * ng * C) + E * scale / (ns * ng) * ((ns * ng - 1) / b_intra)


def eas_in_regime(
    m: float,
    alpha: float,
    hops: int,
    D: float,
    num_layers: int,
    num_servers: int,
    workers_per_server: int,
) -> bool:
    """Eq. 7: ``1 < m^alpha h < D^alpha L <= N_s N_g`` (the paper's ``<<`` read as ``<``)."""
    eas = m**alpha * hops
    return 1 < eas < D**alpha * num_layers <= num_servers * workers_per_server


# ------------------------------------------------------------------------ memory (eqs 12-14)
def m_preload(
    V: float, hidden: int, num_layers: int, alpha: float, num_servers: int, workers_per_server: int
) -> float:
    """Eq. 12: per-GPU activations (values, forward + backward) of FLX-EAS with ``h = 1``."""
    _servers_workers(num_servers, workers_per_server)
    return 2 * V * hidden * num_layers * alpha / (num_servers * workers_per_server)


def preload_total_growth(
    V: float, hidden: int, num_layers: int, alpha_1: float, alpha_2: float
) -> float:
    """Eq. 13: growth of the cluster-wide total when going from ``s1`` to ``s2`` servers."""
    return 2 * V * hidden * num_layers * (alpha_2 - alpha_1)


def preload_per_gpu_ratio(
    num_servers_1: int, num_servers_2: int, alpha_1: float, alpha_2: float
) -> float:
    """Eq. 14: ``M^{s2} / M^{s1} = N_{s1} alpha_2 / (N_{s2} alpha_1)`` (``= n / m``)."""
    _positive(num_servers_2=num_servers_2, alpha_1=alpha_1)
    return num_servers_1 * alpha_2 / (num_servers_2 * alpha_1)


# ----------------------------------------------------------------- memory estimator, planner
@dataclass(frozen=True)
class StepMemoryEstimate:
    """Estimated bytes of one worker's step (spec §4.8), by part; ``total`` sums them."""

    features: int
    activations: int
    graph: int
    keep_masks: int
    parameters: int

    @property
    def total(self) -> int:
        return self.features + self.activations + self.graph + self.keep_masks + self.parameters


def estimate_memory(
    *,
    n_owned: int,
    n_halo: int,
    num_edges: int,
    dims: Sequence[int],
    num_params: int,
    masked_layers: int | None = None,
    c_layer: int = 3,
    value_bytes: int = 4,
    typed: bool = False,
) -> StepMemoryEstimate:
    """One worker's memory for a step on a one-hop graph (spec §4.8).

    Args:
        n_owned, n_halo: the worker's owned and halo rows; ``num_edges``: its local edges.
        dims: ``[d_0, ..., d_L]``: input width of every conv layer, then the last output width
            (``d_0 = F``).
        num_params: model parameters (stored with gradient and Adam's two moments).
        masked_layers: ``K``, layers that carry a bool row mask (default ``L``).
        c_layer: tensors of width ``d_{j+1}`` kept per owned row and layer (linear output,
            norm, activation).
        typed: the edges also carry a relation (a typed graph's plans).

    Per conv layer ``j``: the exchanged input ``rows x d_j`` and its gradient, plus
    ``c_layer`` output tensors of the owned rows. Features ``rows x F``; edges two int64s
    (three when ``typed``).
    """
    dims = list(dims)
    if len(dims) < 2 or min(dims) < 1:
        raise ValueError(f"dims must list d_0..d_L (>= 2 positive widths), got {dims}")
    for name, value in (("n_owned", n_owned), ("n_halo", n_halo), ("num_edges", num_edges)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    num_layers = len(dims) - 1
    masked = num_layers if masked_layers is None else masked_layers
    rows = n_owned + n_halo
    act = sum(rows * d * value_bytes * 2 for d in dims[:-1])
    act += sum(n_owned * d * value_bytes * c_layer for d in dims[1:])
    return StepMemoryEstimate(
        features=rows * dims[0] * value_bytes,
        activations=act,
        graph=num_edges * (24 if typed else 16),
        keep_masks=masked * rows,
        parameters=num_params * value_bytes * 4,
    )


def estimate_mfg_memory(
    *,
    src_rows: Sequence[int],
    dst_rows: Sequence[int],
    num_edges: int,
    dims: Sequence[int],
    num_params: int,
    c_layer: int = 3,
    value_bytes: int = 4,
) -> StepMemoryEstimate:
    """:func:`estimate_memory` for a layer-wise MFG (MB_base's per-worker mini-batch).

    ``src_rows[j]`` / ``dst_rows[j]``: source and destination rows of the block of conv layer
    ``j`` (input layer first); ``num_edges`` summed over blocks. Same per-row costs as the
    one-hop estimate, whose rows are the same at every layer; an MFG has no keep mask.
    """
    dims = list(dims)
    if len(dims) < 2 or min(dims) < 1:
        raise ValueError(f"dims must list d_0..d_L (>= 2 positive widths), got {dims}")
    if not len(src_rows) == len(dst_rows) == len(dims) - 1:
        raise ValueError(
            f"need one src/dst row count per layer ({len(dims) - 1}), got "
            f"{len(src_rows)} and {len(dst_rows)}"
        )
    act = sum(n * d * value_bytes * 2 for n, d in zip(src_rows, dims[:-1]))
    act += sum(n * d * value_bytes * c_layer for n, d in zip(dst_rows, dims[1:]))
    return StepMemoryEstimate(
        features=src_rows[0] * dims[0] * value_bytes,
        activations=act,
        graph=num_edges * 16,
        keep_masks=0,
        parameters=num_params * value_bytes * 4,
    )


def sage_num_params(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> int:
    """Parameters of the spec's GraphSAGE (§4.7): per conv two biased linears and a LayerNorm,
    then the head ``Linear(H, out_dim)``."""
    dims = [in_dim] + [hidden] * num_layers
    conv = sum(2 * (a * b + b) + 2 * b for a, b in zip(dims[:-1], dims[1:]))
    return conv + hidden * out_dim + out_dim


def choose_k(memory_by_k: Sequence[float], budget: float | None) -> int | None:
    """Largest preload depth ``k`` whose memory fits ``budget`` (spec §4.3).

    ``memory_by_k[k]`` is the worst worker's estimate for FLX(k), ``k = 0..L``. ``budget=None``
    means unlimited (``k = L``). ``None`` if even ``k = 0`` does not fit.
    """
    if not memory_by_k:
        raise ValueError("memory_by_k must hold one estimate per k = 0..L")
    if budget is None:
        return len(memory_by_k) - 1
    for k in range(len(memory_by_k) - 1, -1, -1):
        if memory_by_k[k] <= budget:
            return k
    return None


@dataclass(frozen=True)
class ModePlan:
    """The planner's choice: a mode with its preload depth ``k`` or co-batch count ``B``."""

    mode: str
    k: int | None = None
    num_cobatches: int | None = None


def plan_mode(
    *,
    memory_flx_by_k: Sequence[float],
    budget: float | None,
    memory_eas: float | None = None,
    memory_cob_by_b: Mapping[int, float] | None = None,
    allow_sampling: bool = True,
) -> ModePlan:
    """Spec §4.8 planner: FLX(L) if it fits, else FLX-EAS (if sampling is allowed and its
    estimate is given), else FLX(k*) for the largest fitting ``k``, else CoB with the smallest
    fitting ``B`` (``memory_cob_by_b`` maps candidate ``B`` to its estimate).

    Raises ValueError when nothing fits, naming the smallest estimate seen.
    """
    num_layers = len(memory_flx_by_k) - 1
    k = choose_k(memory_flx_by_k, budget)
    if k == num_layers:
        return ModePlan("flx", k=k)
    if allow_sampling and memory_eas is not None and memory_eas <= budget:
        return ModePlan("flx_eas")
    if k is not None:
        return ModePlan("flx", k=k)
    fitting = sorted(b for b, mem in (memory_cob_by_b or {}).items() if mem <= budget)
    if fitting:
        return ModePlan("cob", num_cobatches=fitting[0])
    smallest = min([*memory_flx_by_k, *(memory_cob_by_b or {}).values()])
    raise ValueError(
        f"no GraNNDIS mode fits the memory budget of {budget:.0f} bytes per worker; the "
        f"smallest estimate is {smallest:.0f} bytes (try more co-batches or a larger budget)"
    )


# ------------------------------------------------------------------------ modelled epoch time
_NVLINK_BRIDGE = 112e9  # paper §9.2: NVLink Bridge between a server's A6000s, bytes/s
GRANNDIS_NETWORKS = {
    "paper": NetworkModel("paper", _NVLINK_BRIDGE, 2e-6, 32e9 / 8, 5e-6),
    "paper_10gbe": NetworkModel("paper_10gbe", _NVLINK_BRIDGE, 2e-6, 10e9 / 8, 20e-6),
    "paper_1gbe": NetworkModel("paper_1gbe", _NVLINK_BRIDGE, 2e-6, 1e9 / 8, 50e-6),
}
"""The paper's cluster links: NVLink inside a server; between servers InfiniBand QDR 32 Gb/s
(main cluster), 10 GbE (artifact evaluation) or 1 GbE (the low-end cluster). The intra link is
held at 112 GB/s in all three so that only the inter-server link varies."""


def network(name_or_model: str | NetworkModel) -> NetworkModel:
    """A ``GRANNDIS_NETWORKS`` or ``comm.network.PROFILES`` model by name (or the model itself)."""
    if isinstance(name_or_model, NetworkModel):
        return name_or_model
    known = {**PROFILES, **GRANNDIS_NETWORKS}
    if name_or_model not in known:
        raise ValueError(f"unknown network {name_or_model!r}; valid: {sorted(known)}")
    return known[name_or_model]


def modelled_epoch_time(
    compute_s: float,
    bytes_by_link: Mapping[str, float],
    bandwidths: Sequence[str | NetworkModel] = tuple(GRANNDIS_NETWORKS),
    messages_by_link: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Measured compute seconds plus modelled communication seconds, per network.

    ``bytes_by_link`` (and optionally ``messages_by_link``) maps ``intra_server`` /
    ``inter_server`` to what one rank sent in the epoch (take the busiest rank). Comm is not
    overlapped with compute, as in eq. 1. Returns ``{network name: seconds}``.
    """
    unknown = set(bytes_by_link) - set(LINK_CLASSES)
    if unknown:
        raise ValueError(f"unknown link classes {sorted(unknown)}; valid: {list(LINK_CLASSES)}")
    if compute_s < 0:
        raise ValueError(f"compute_s must be >= 0, got {compute_s}")
    messages = messages_by_link or {}
    snapshot = {
        "link_bytes": {c: float(bytes_by_link.get(c, 0)) for c in (INTRA_SERVER, INTER_SERVER)},
        "link_messages": {c: float(messages.get(c, 0)) for c in (INTRA_SERVER, INTER_SERVER)},
    }
    out = {}
    for item in bandwidths:
        model = network(item)
        out[model.name] = compute_s + model.modeled_time(snapshot)
    return out


# exchanges of one step by meter category, given the forward exchanges ``n`` (one per layer):
# layer 0 moves input rows, layers 1.. hidden rows and, in backward, their gradients (input
# rows need none); the gradient sync is one more barrier
def _exchanges(category: str, forward: int) -> int:
    return {
        "feature": min(forward, 1),
        "activation": max(forward - 1, 0),
        "activation_grad": max(forward - 1, 0),
        "gradient": 1,
    }.get(category, 0)


def synchronised_epoch_time(
    phase_compute: Tensor,
    category_bytes: Mapping[str, Tensor],
    category_messages: Mapping[str, Tensor],
    forward_exchanges: Sequence[int],
    *,
    spans_servers: bool,
    bandwidths: Sequence[str | NetworkModel] = tuple(GRANNDIS_NETWORKS),
) -> dict[str, float]:
    """Modelled epoch time with every exchange and the gradient sync as a barrier.

    A step runs in phases: the compute before each forward exchange, then the rest (the last
    layers, the loss and backward). Each phase ends when its slowest rank does; each exchange
    then takes as long as the slowest rank's sends on the modelled links, and at least one
    latency of the widest link its group spans (a barrier across servers costs an inter-server
    latency even when no byte crosses). A category's bytes are spread evenly over its
    exchanges of the step (:func:`_exchanges`: layer 0's input rows, the hidden rows of later
    layers and their gradients, one gradient sync).

    Args:
        phase_compute: ``[world, steps, P]`` compute seconds per rank, step and phase: the
            phases before forward exchanges ``0..P-2``, then the rest (unused phases 0).
        category_bytes, category_messages: ``{category: [world, steps, 2]}`` what each rank
            sent per step over ``(intra_server, inter_server)``.
        forward_exchanges: ``[steps]`` forward exchanges of every step (0 without a layout).
        spans_servers: whether the collectives' group spans several servers.

    Returns:
        ``{network: seconds}``.
    """
    world = phase_compute.shape[0]
    compute = float(phase_compute.amax(0).sum())  # every phase ends with its slowest rank
    forward = torch.as_tensor(list(forward_exchanges), dtype=torch.int64)
    out = {}
    for item in bandwidths:
        model = network(item)
        floor = (
            0.0 if world == 1 else (model.inter_latency if spans_servers else model.intra_latency)
        )
        per_byte = torch.tensor([1 / model.intra_bandwidth, 1 / model.inter_bandwidth])
        per_message = torch.tensor([model.intra_latency, model.inter_latency])
        total = compute
        for category, nbytes in category_bytes.items():
            count = torch.tensor([_exchanges(category, int(n)) for n in forward])  # [steps]
            sends = (nbytes.double() * per_byte).sum(-1)  # [world, steps]
            sends += (category_messages[category].double() * per_message).sum(-1)
            slowest = (sends.amax(0) / count.clamp(min=1)).clamp(min=floor)
            total += float((slowest * count).sum())
        out[model.name] = total
    return out
