"""``strategy=granndis``: GraNNDIS (Song et al., PACT '24), server-aware full-graph and
co-batched training on one-hop graphs with per-layer vertex masking, and its baselines FB_base and
MB_base. See docs/systems/granndis.md."""

from __future__ import annotations

from .. import lazy_exports
from ..spec import SystemSpec
from .config import GRANNDIS_PRESETS, CoBConfig, EASConfig, GraNNDISConfig, GraNNDISPartitionConfig

# which presets equal single on the same (full-graph) batches, and the setting that makes an
# approximate one exact (CoB: the exact L-hop closure; tests/test_granndis_dist.py)
_EXACT = {"granndis_flx": (), "granndis_fb_base": (), "granndis_cob": (("cob.sampler", "none"),)}
SYSTEM = tuple(
    SystemSpec(
        name=name,
        description=description,
        config_type=GraNNDISConfig,
        package=__name__,
        strategy_class="GraNNDISStrategy",
        datamodule_class="GraNNDISDataModule",
        default_devices=4,  # 2 servers x 2 workers
        # full-graph training takes one step per epoch: 200 reach FB_base's plateau on sbm
        run_settings=(("topology.servers", 2), ("trainer.max_epochs", 200)),
        ranks_per_host=2,  # workers inside each server
        bench_baseline="granndis_fb_base" if name == "granndis" else None,
        exact=_EXACT.get(name) == (),
        exact_settings=_EXACT.get(name, ()),
        exact_full_batch=name in _EXACT,  # full-graph (FLX, FB_base) or co-batched steps
    )
    for name, description in GRANNDIS_PRESETS.items()
)

# the implementation: imported when first used (lightning_gnnscale.systems.lazy_exports)
_EXPORTS = {
    "GraNNDISDataModule": ".datamodule",
    "OneHopBatch": ".datamodule",
    "OneHopPlan": ".plan",
    "build_layout": ".plan",
    "GraNNDISStrategy": ".strategy",
    "halo_hook": ".strategy",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "GRANNDIS_PRESETS",
    "CoBConfig",
    "EASConfig",
    "GraNNDISConfig",
    "GraNNDISPartitionConfig",
    *_EXPORTS,
]
