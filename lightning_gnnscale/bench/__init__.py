"""Side-by-side benchmark harness: ``python -m lightning_gnnscale.bench {compare,sampler}``.

``compare`` trains several strategies on the same data and seed and tabulates accuracy, time,
counted bytes and modelled communication time; ``sampler`` times the neighbour sampler against
baselines on a large R-MAT graph. See docs/benchmarks.md.
"""

from .cli import main

__all__ = ["main"]
