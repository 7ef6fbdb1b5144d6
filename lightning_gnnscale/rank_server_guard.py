"""Imported first by the warm rank server (``launch.RANK_SERVER_PRELOAD``), and nowhere else:
Linux then kills the server when the launcher that started it dies, even by SIGKILL.

Each rank holds the server's "alive" pipe open (multiprocessing's forkserver hands it to every
child), so the server's own exit-on-EOF never fires while a rank lives, and a rank's death
signal is tied to the server: without this guard a SIGKILLed launcher left the server, and a
stopped or hung rank, running for ever.
"""

import os

from .launch import import_pandas_without_pyarrow, kill_me_when_my_parent_dies

_launcher = os.getppid()
kill_me_when_my_parent_dies()
if os.getppid() != _launcher:  # the launcher died before the request took effect
    os._exit(1)

# PyG (preloaded next) imports pandas, which would import pyarrow (one more thread pool in every
# fork; see the function)
import_pandas_without_pyarrow()
