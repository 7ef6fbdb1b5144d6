"""Communication layer: the only code in the suite that calls ``torch.distributed``.

Metered collectives (``Comm``), the differentiable row exchange (``exchange_rows``), owner
routing of requests and their answers (``OwnerRoute``), the DDP
comm hook, the byte meter, the server topology, the network cost model and the audit. The
names load on first use.
"""

from importlib import import_module
from typing import Any

# public name -> the submodule that defines it, imported on first use: ``comm.network`` and
# ``comm.topology`` need no torch, so the run config checks ``network=`` before torch loads
_LAZY = {
    **dict.fromkeys(("CollectiveCall", "CollectiveRecorder"), ".audit"),
    **dict.fromkeys(
        ("GATHER_REDUCE_ELEMENTS", "REDUCE_OPS", "Comm", "ring_allreduce_bytes"), ".collectives"
    ),
    "exchange_rows": ".exchange",
    **dict.fromkeys(
        (
            "GradientHookState",
            "ddp_bucket_layout",
            "metered_allreduce_hook",
            "register_metered_ddp_hook",
        ),
        ".hooks",
    ),
    **dict.fromkeys(("CATEGORIES", "CommMeter", "diff_snapshots", "sum_snapshots"), ".meter"),
    **dict.fromkeys(("PROFILES", "NetworkModel"), ".network"),
    "OwnerRoute": ".routing",
    **dict.fromkeys(("INTER_SERVER", "INTRA_SERVER", "LINK_CLASSES", "Topology"), ".topology"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "CATEGORIES",
    "GATHER_REDUCE_ELEMENTS",
    "INTER_SERVER",
    "INTRA_SERVER",
    "LINK_CLASSES",
    "PROFILES",
    "REDUCE_OPS",
    "CollectiveCall",
    "CollectiveRecorder",
    "Comm",
    "CommMeter",
    "GradientHookState",
    "NetworkModel",
    "OwnerRoute",
    "Topology",
    "ddp_bucket_layout",
    "diff_snapshots",
    "exchange_rows",
    "metered_allreduce_hook",
    "register_metered_ddp_hook",
    "ring_allreduce_bytes",
    "sum_snapshots",
]
