"""Entry point of ``python -m lightning_gnnscale.bench``.

The guard matters: multi-process runs start their ranks with the spawn method, which re-imports
this module in every child.
"""

import sys

from lightning_gnnscale.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
