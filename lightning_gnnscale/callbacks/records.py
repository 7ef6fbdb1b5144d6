"""A callback whose per-epoch records travel in checkpoints."""

from __future__ import annotations

import lightning as L


class EpochRecords(L.Callback):
    """Keeps one dict per epoch in ``.epochs`` and saves them in checkpoints, so a resumed run
    reports every epoch of the run, not only those after the resume."""

    def __init__(self):
        self.epochs: list[dict] = []

    def state_dict(self) -> dict:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epochs = list(state_dict["epochs"])
