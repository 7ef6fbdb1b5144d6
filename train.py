"""Train one GNN system: ``python train.py strategy=<name> model=<gcn|sage|gat> dataset=<name>``.

See README.md and docs/configuration.md. Multirun: ``python train.py -m strategy=single,ddp``.
"""

import os
import sys


def _hand_off_to_a_warm_server() -> None:
    """Run in ``python -m lightning_gnnscale.warm``'s server when one matches (and exit with
    its status), else return and start cold (docs/architecture.md, "Start-up")."""
    name = "lightning_gnnscale.warm_client"
    if name not in sys.modules:  # load that file alone: importing the package costs 0.7 s
        from importlib.util import find_spec, module_from_spec, spec_from_file_location

        package = find_spec("lightning_gnnscale")
        if package is None or package.origin is None:  # not importable: the imports below say so
            return
        path = os.path.join(os.path.dirname(package.origin), "warm_client.py")
        sys.modules[name] = module = module_from_spec(spec_from_file_location(name, path))
        module.__spec__.loader.exec_module(module)
    sys.modules[name].hand_off(__file__)


if __name__ == "__main__":
    _hand_off_to_a_warm_server()

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

# light: no torch, Lightning, PyG or system yet
from lightning_gnnscale.launch import (  # noqa: E402
    exit_without_teardown,
    import_pandas_without_pyarrow,
    warm_start,
)
from lightning_gnnscale.preflight import check_config  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    run = check_config(cfg)  # a bad value fails here, in about a second: nothing heavy loaded
    warm_start(cfg)  # the rank server imports while this process does the same and prepares
    import_pandas_without_pyarrow()  # before PyG imports pandas (launch.py says why)
    from lightning_gnnscale.run import run_from_command_line

    return run_from_command_line(cfg, run)  # best_val_acc: the value Hydra sweepers optimise


if __name__ == "__main__":
    exit_without_teardown(main)
