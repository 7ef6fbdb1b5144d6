"""Communication layer: the only code in the suite that calls ``torch.distributed``.

Metered collectives (``Comm``), the differentiable row exchange (``exchange_rows``), owner
routing of requests and their answers (``OwnerRoute``), the DDP
comm hook, the byte meter, the server topology, the network cost model and the audit.
"""

from lightning_gnnscale.comm.audit import CollectiveCall, CollectiveRecorder
from lightning_gnnscale.comm.collectives import (
    GATHER_REDUCE_ELEMENTS,
    REDUCE_OPS,
    Comm,
    ring_allreduce_bytes,
)
from lightning_gnnscale.comm.exchange import exchange_rows
from lightning_gnnscale.comm.hooks import (
    GradientHookState,
    metered_allreduce_hook,
    register_metered_ddp_hook,
)
from lightning_gnnscale.comm.meter import (
    CATEGORIES,
    CommMeter,
    diff_snapshots,
    sum_snapshots,
)
from lightning_gnnscale.comm.network import PROFILES, NetworkModel
from lightning_gnnscale.comm.routing import OwnerRoute
from lightning_gnnscale.comm.topology import INTER_SERVER, INTRA_SERVER, LINK_CLASSES, Topology

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
    "diff_snapshots",
    "exchange_rows",
    "metered_allreduce_hook",
    "register_metered_ddp_hook",
    "ring_allreduce_bytes",
    "sum_snapshots",
]
