"""Compose the suite's Hydra config in tests (no ``${hydra:...}`` available, so paths are set)."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import lightning_gnnscale  # noqa: F401  (registers the config schemas Hydra composes with)

REPO = Path(__file__).resolve().parents[2]
TINY = (
    "dataset.num_nodes=300",
    "dataset.num_features=8",
    "data.batch_size=64",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "logger=none",
    "launcher.timeout_s=240",
    "launcher.collective_timeout_s=120",
)


def make_cfg(tmp_path: Path, *overrides: str, tiny: bool = True) -> DictConfig:
    """The composed run config, writing under ``tmp_path``; ``tiny`` shrinks the default job."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                f"paths.root={tmp_path}",
                f"paths.output_dir={tmp_path / 'out'}",
                *(TINY if tiny else ()),
                *overrides,
            ],
        )
