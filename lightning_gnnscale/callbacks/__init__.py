"""Per-epoch measurements every run reports (docs/configuration.md, outputs), and the run summary.

Callbacks keep their epoch figures in ``.epochs`` (a list of dicts) so that
:class:`RunSummary` can read them in the same hook, whatever Lightning's logging order is.
Cross-rank reductions go through the strategy's metered ``comm``. One callback a file.
"""

from .audit import CollectiveAudit
from .comm_stats import CommStats
from .epoch_stats import EpochStats, peak_rss_mb
from .step_seed import StepSeed
from .summary import RunSummary, format_table

__all__ = [
    "CollectiveAudit",
    "CommStats",
    "EpochStats",
    "RunSummary",
    "StepSeed",
    "format_table",
    "peak_rss_mb",
]
