"""An emulated multi-host cluster on one Linux machine (network namespaces, a bridge, ``tbf``
shaping), and ``train.py`` jobs run over it through the ordinary multi-node launch path.

``python -m lightning_gnnscale.cluster --hosts 2 --bandwidth 100 -- strategy=ddp``; see
docs/cluster.md.
"""

from .job import ClusterJob, ClusterJobFailed, run_job
from .network import (
    ClusterLeftovers,
    ClusterUnavailable,
    EmulatedCluster,
    PrefixInUse,
    leftovers,
    preflight,
)

__all__ = [
    "ClusterJob",
    "ClusterJobFailed",
    "ClusterLeftovers",
    "ClusterUnavailable",
    "EmulatedCluster",
    "PrefixInUse",
    "leftovers",
    "preflight",
    "run_job",
]
