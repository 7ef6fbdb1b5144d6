"""The run's metrics loggers: a CSV logger whose writes never leave a partial line, and the end
of the run's W&B run before its process exits (docs/configuration.md, "Loggers")."""

from __future__ import annotations

import csv
import io
import logging
import os
from argparse import Namespace
from typing import Any

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from .files import atomic_path, atomic_write

_log = logging.getLogger(__name__)


class CSVLogger(Logger):
    """``metrics.csv`` and ``hparams.yaml`` in ``save_dir``, in the format of Lightning's
    ``CSVLogger(save_dir, name="", version="")``: one row per logging call, the columns the
    sorted metric names and ``step``.

    Every call's row is written to the file when it returns (appends are not fsynced: a power
    cut may lose the last rows), and no failed write (a full disk) leaves a partial line: new
    rows go in one append that is truncated back on failure; a row with a new metric rewrites
    the file under its new header into a temporary file, fsynced and renamed over it. A
    ``metrics.csv`` already in ``save_dir`` (an earlier run into the same folder, a resumed
    run) is continued: its header and rows are kept, this run's rows follow. Rank 0 writes."""

    METRICS_FILE = "metrics.csv"
    HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | os.PathLike) -> None:
        super().__init__()
        self._save_dir = os.fspath(save_dir)
        self._columns: list[str] = []
        self._hparams: dict[str, Any] = {}
        self._adopted = False  # whether an earlier run's metrics.csv was looked for
        self._started = False  # whether metrics.csv holds this logger's header (written or adopted)

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def log_dir(self) -> str:
        return self._save_dir

    @property
    def metrics_file(self) -> str:
        return os.path.join(self._save_dir, self.METRICS_FILE)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        """Merge ``params`` into ``hparams.yaml``, written whole (temporary file, rename)."""
        self._hparams.update(vars(params) if isinstance(params, Namespace) else params)
        with atomic_path(os.path.join(self._save_dir, self.HPARAMS_FILE)) as tmp:
            save_hparams_to_yaml(tmp, self._hparams)
        self._adopt_earlier_rows()  # a metrics.csv this logger cannot continue fails before fit

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """One row: ``metrics`` (tensors as numbers) and ``step``."""
        row = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}
        row["step"] = step
        self._adopt_earlier_rows()
        new = sorted(set(row) - set(self._columns))
        if not self._started or new:
            self._rewrite(sorted({*self._columns, *new}), [row])
        else:
            self._append(_csv_text(self._columns, [row]))

    def _adopt_earlier_rows(self) -> None:
        """Once, before this logger's first write: continue a ``metrics.csv`` already in the
        folder under its header (an empty one is simply replaced). One whose last line was
        cut short (another writer's full disk) is first rewritten whole, so that appends
        start on a line of their own."""
        if self._adopted:
            return
        self._adopted = True
        if not os.path.exists(self.metrics_file):
            return
        columns, _, whole_lines = _read_metrics(self.metrics_file)
        if not columns:
            return
        self._columns, self._started = columns, True
        if not whole_lines:
            self._rewrite(columns, [])

    def _rewrite(self, columns: list[str], rows: list[dict]) -> None:
        """The file's rows so far and ``rows`` under ``columns``, replacing the file at once."""
        earlier = _read_metrics(self.metrics_file)[1] if self._started else []
        text = _csv_text(columns, [*earlier, *rows], header=True)
        atomic_write(self.metrics_file, lambda file: file.write(text.encode()))
        self._columns, self._started = columns, True

    def _append(self, text: str) -> None:
        """Append ``text`` (whole lines); on any failure cut the file back to its old end."""
        data = text.encode()
        fd = os.open(self.metrics_file, os.O_WRONLY | os.O_APPEND)
        try:
            end = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
            except BaseException:
                os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)


def _read_metrics(path: str) -> tuple[list[str], list[dict], bool]:
    """The header and rows of the ``metrics.csv`` at ``path``, and whether it ends with a
    whole line. A row with more values than the header is refused (a ``ValueError`` naming the
    file and line: no row is dropped or guessed)."""
    with open(path, newline="") as file:
        text = file.read()
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    for row in reader:
        if None in row:
            raise ValueError(
                f"{path} line {reader.line_num} has more values than its header "
                f"{reader.fieldnames}; this run would add its rows to that file: move it away "
                f"(or give the run another folder)"
            )
        rows.append(row)
    return list(reader.fieldnames or []), rows, text.endswith("\n")


def _csv_text(columns: list[str], rows: list[dict], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def finish_wandb_runs(loggers: list[Logger], exit_code: int) -> None:
    """Finish the W&B run of each :class:`WandbLogger` in ``loggers`` (rank 0's; other ranks
    hold a no-op): its history, summary and exit record are written before this returns.
    Lightning leaves that to wandb's exit handler, which a rank (a multiprocessing child)
    never runs, and which in a process that trains twice would add the second run to the
    first.

    Only a run that exists is finished: the active one (``wandb.run``) when it is the
    logger's (``logger.version``, its id; the logger never started one if fit failed early),
    so none is started here just to end it. With ``exit_code != 0`` (the run failed) an error
    of ``finish`` is logged, not raised: the run's own error is the one to see."""
    if rank_zero_only.rank != 0 or not any(isinstance(lg, WandbLogger) for lg in loggers):
        return
    import wandb  # only with a WandbLogger, which imports it too

    for logger in loggers:
        run = wandb.run
        if not isinstance(logger, WandbLogger) or run is None or logger.version != run.id:
            continue
        try:
            run.finish(exit_code=exit_code)
        except Exception:
            if exit_code == 0:
                raise
            _log.exception("finishing the W&B run %s of the failed run failed", run.id)
