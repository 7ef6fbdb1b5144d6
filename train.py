"""Train one GNN system: ``python train.py strategy=<name> model=<gcn|sage|gat> dataset=<name>``.

See README.md and docs/configuration.md. Multirun: ``python train.py -m strategy=single,ddp``.
"""

import hydra
from omegaconf import DictConfig

from lightning_gnnscale.launch import (  # light: no Lightning, PyG or system yet
    exit_without_teardown,
    warm_start,
)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    warm_start(cfg)  # the rank server imports while this process does the same and prepares
    from lightning_gnnscale.run import run_from_command_line

    return run_from_command_line(cfg)  # best_val_acc: the value Hydra sweepers optimise


if __name__ == "__main__":
    exit_without_teardown(main)
