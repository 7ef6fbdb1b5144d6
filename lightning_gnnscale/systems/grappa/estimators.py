"""Coverage factors of Grappa's corrected gradient aggregation (docs/systems/grappa.md,
"Estimators").

Per seed ``v``: ``D`` its global in-degree, ``ell`` its local (owned) in-neighbours, ``s`` its
seed-hop sample count and ``alpha`` the smoothing self-term. Coverage ``kappa = (ell + alpha) /
(D + alpha)``. Every function takes 1-D tensors over the batch's seeds and returns a Python float
(the batch-level scalar ``c``) or, for ``node``, per-seed loss weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import ESTIMATORS


def kappa(ell: Tensor, deg: Tensor, alpha: float = 1.0) -> Tensor:
    """Coverage ``(ell + alpha) / (D + alpha)`` in float64; ``1`` where ``D + alpha == 0``."""
    num, den = ell.double() + alpha, deg.double() + alpha
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.ones_like(den))


def relation_kappa(ell_rel: Tensor, deg_rel: Tensor, alpha: float = 1.0) -> Tensor:
    """A typed graph's coverage ``[n]`` from per-relation counts ``[n, R]``: the mean, over the
    relations a node has in-edges under, of ``(ell_r + alpha) / (D_r + alpha)``; ``1`` for a
    node with none. RGCN averages each relation's neighbours and sums the relations, so a
    neighbour under ``r`` weighs ``p(u) = 1 / (R_v D_r)`` (``R_v`` relations present) and the
    local mass is this mean (docs/systems/grappa.md, "Typed graphs"). ``R = 1``: :func:`kappa`."""
    present = deg_rel > 0
    per = kappa(ell_rel, deg_rel, alpha)
    n = present.sum(1)
    total = torch.where(present, per, torch.zeros_like(per)).sum(1)
    if ell_rel.shape[1] == 1:  # one relation: the homogeneous formula, bit for bit
        return per[:, 0]
    return torch.where(n > 0, total / n.clamp(min=1).double(), torch.ones_like(total))


def relation_sample_counts(ell_rel: Tensor, fanouts: tuple[int, ...]) -> Tensor:
    """A typed graph's seed-hop sample count ``[n]``: ``sum_r min(f_r, ell_r)`` (``f_r = -1``:
    ``ell_r``), what the per-relation sampler draws from the local neighbours."""
    caps = torch.tensor(fanouts, dtype=ell_rel.dtype)
    return torch.where(caps < 0, ell_rel, torch.minimum(ell_rel, caps)).sum(1)


def c_uniform(k: Tensor) -> float:
    """Eq. 10: the mean coverage of the batch (``1`` for an empty batch)."""
    return float(k.mean()) if k.numel() else 1.0


def expected_rejections(k: Tensor, s: Tensor, alpha: float = 1.0) -> Tensor:
    """Per seed ``(1/kappa - 1)(s + alpha)``: global draws rejected to get ``s + alpha`` local
    ones. No draws needed (``s + alpha = 0``) -> 0; no coverage (``kappa = 0``) -> inf."""
    draws = s.double() + alpha
    return torch.where(draws > 0, (1.0 / k - 1.0) * draws, torch.zeros_like(draws))


def c_resampling(k: Tensor, s: Tensor, alpha: float = 1.0) -> float:
    """Scale-free eq. 12: ``1 / (1 + mean((1/kappa - 1) (s + alpha)))``: eq. 12 with the
    expected rejections averaged over the batch instead of summed, so ``c`` does not shrink
    with the batch size (docs/systems/grappa.md, "Estimators")."""
    if not k.numel():
        return 1.0
    return float(1.0 / (1.0 + expected_rejections(k, s, alpha).mean()))


def c_resampling_literal(k: Tensor, s: Tensor, alpha: float = 1.0) -> float:
    """Eq. 12 as printed: ``min(1, 1 / sum((1/kappa - 1)(s + alpha)))``; ``R = 0`` gives 1."""
    total = float(expected_rejections(k, s, alpha).sum()) if k.numel() else 0.0
    return 1.0 if total <= 0 else min(1.0, 1.0 / total)


def batch_factor(estimator: str, k: Tensor, s: Tensor, alpha: float = 1.0) -> float:
    """The scalar ``c`` one rank applies to its batch gradient (``node`` weights seeds instead)."""
    if estimator in ("none", "node"):
        return 1.0
    if estimator == "uniform":
        return c_uniform(k)
    if estimator == "resampling":
        return c_resampling(k, s, alpha)
    if estimator == "resampling_literal":
        return c_resampling_literal(k, s, alpha)
    raise ValueError(f"unknown estimator {estimator!r}; valid: {list(ESTIMATORS)}")


def seed_sample_counts(ell: Tensor, fanout: int) -> Tensor:
    """``s_v = min(f_seed, ell_v)``; ``fanout == -1`` (full neighbourhood) gives ``ell_v``."""
    return ell.clone() if fanout < 0 else ell.clamp(max=fanout)


def gcn_kappa(
    indptr: Tensor, indices: Tensor, local: Tensor, deg: Tensor, alpha: float = 1.0
) -> Tensor:
    """Coverage under GCN neighbour weights ``p(u) ~ (D_u + 1)^-1/2``.

    ``indptr``/``indices``: the seeds' global in-edges (CSC over the seeds); ``local`` bool per
    edge (is the source local); ``deg`` global degree of every edge's source. The self term has
    weight ``alpha`` on both sides. Returns float64 ``[n_seeds]``: local mass over total mass.
    """
    w = (deg.double() + 1.0).rsqrt()
    seg = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr.diff())
    total = torch.zeros(indptr.numel() - 1, dtype=torch.float64).index_add_(0, seg, w)
    local_mass = torch.zeros_like(total).index_add_(0, seg, w * local.double())
    den = total + alpha
    return torch.where(den > 0, (local_mass + alpha) / den.clamp(min=1e-300), torch.ones_like(den))
