"""Imported first by the warm rank server (``launch.RANK_SERVER_PRELOAD``), and nowhere else:
Linux then kills the server when the launcher that started it dies, even by SIGKILL.

Each rank holds the server's "alive" pipe open (multiprocessing's forkserver hands it to every
child), so the server's own exit-on-EOF never fires while a rank lives, and a rank's death
signal is tied to the server: without this guard a SIGKILLed launcher left the server, and a
stopped or hung rank, running for ever.
"""

import os
import sys

from .launch import kill_me_when_my_parent_dies

_launcher = os.getppid()
kill_me_when_my_parent_dies()
if os.getppid() != _launcher:  # the launcher died before the request took effect
    os._exit(1)

# PyG (preloaded next) imports pandas, which imports pyarrow when it is installed (the tables
# reader's dependency); pyarrow starts a jemalloc background thread and a pool thread at import,
# and ranks must fork from a one-thread server. So pandas is imported here with pyarrow blocked,
# and the block is lifted at once (a pyarrow imported earlier is put back). The ranks' pandas
# then runs without pyarrow (pandas.compat.HAS_PYARROW is False: no pyarrow dtypes or engines);
# no rank code uses pandas, and the tables reader (construct.py) imports pyarrow itself.
_missing = object()
_earlier = sys.modules.get("pyarrow", _missing)
sys.modules["pyarrow"] = None  # type: ignore[assignment]
try:
    import pandas  # noqa: F401
finally:
    if _earlier is _missing:
        del sys.modules["pyarrow"]
    else:
        sys.modules["pyarrow"] = _earlier
