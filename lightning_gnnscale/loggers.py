"""The run's metrics loggers: a CSV logger whose writes never leave a partial line, and the end
of the run's W&B run before its process exits (docs/configuration.md, "Loggers")."""

from __future__ import annotations

import csv
import io
import os
import tempfile
import warnings
from argparse import Namespace
from typing import Any

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from .files import atomic_write


class CSVLogger(Logger):
    """``metrics.csv`` and ``hparams.yaml`` in ``save_dir``, in the format of Lightning's
    ``CSVLogger(save_dir, name="", version="")``: one row per logging call, the columns the
    sorted metric names and ``step``.

    Every call is on disk when it returns, and no failed write (a full disk) leaves a partial
    line: new rows go in one append that is truncated back on failure; a row with a new
    metric rewrites the file under its new header into a temporary file renamed over it.
    Rank 0 writes."""

    METRICS_FILE = "metrics.csv"
    HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | os.PathLike) -> None:
        super().__init__()
        self._save_dir = os.fspath(save_dir)
        self._columns: list[str] = []
        self._hparams: dict[str, Any] = {}
        self._started = False  # whether this logger has written metrics.csv yet

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
        os.makedirs(self._save_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._save_dir, prefix=f".{self.HPARAMS_FILE}.")
        os.close(fd)
        try:
            save_hparams_to_yaml(tmp, self._hparams)
            os.replace(tmp, os.path.join(self._save_dir, self.HPARAMS_FILE))
        except BaseException:
            os.unlink(tmp)
            raise

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """One row: ``metrics`` (tensors as numbers) and ``step``."""
        row = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}
        row["step"] = step
        new = sorted(set(row) - set(self._columns))
        if not self._started or new:
            self._rewrite(sorted({*self._columns, *new}), [row])
        else:
            self._append(_csv_text(self._columns, [row]))

    def _rewrite(self, columns: list[str], rows: list[dict]) -> None:
        """The file's rows so far and ``rows`` under ``columns``, replacing the file at once."""
        earlier = []
        if self._started:
            with open(self.metrics_file, newline="") as file:
                earlier = list(csv.DictReader(file))
        elif os.path.exists(self.metrics_file):
            warnings.warn(
                f"{self.metrics_file} of an earlier run is replaced by this run's", stacklevel=3
            )
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
    first."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and rank_zero_only.rank == 0:
            logger.experiment.finish(exit_code=exit_code)
