"""Train link prediction under the metered data-parallel reference (no Hydra).

    python examples/link_prediction_ddp.py            # 2 CPU processes, Lightning launches them

The task is a ``TaskConfig`` handed to the DataModule; the module takes it from there
(``GNNModule.from_config``), and so does the net's initialisation: Glorot, the task's, unless
``init=`` says otherwise (docs/tasks.md, "Link prediction"). The settings below are those of ``python
train.py strategy=ddp task=link_prediction dataset=sbm``, which gives the same weights.
"""

import argparse
import json
from pathlib import Path

import lightning as L
import torch

import lightning_gnnscale as gs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--num-nodes", type=int, default=10000, help="SBM size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write metrics.json and weights.pt here")
    parser.add_argument("--cache-dir", type=Path, help="preprocessing cache (default ./.cache)")
    args = parser.parse_args()

    L.seed_everything(args.seed, workers=True, verbose=False)
    Strategy, DataModule, config = gs.system("ddp")
    datamodule = DataModule(
        gs.load_dataset("sbm", num_nodes=args.num_nodes),
        config,
        gs.DataConfig(batch_size=1024, fanouts=[10, 10]),  # 1024 positive pairs per step
        seed=args.seed,
        cache_dir=args.cache_dir,
        task=gs.TaskConfig("link_prediction"),  # RandomLinkSplit's 0.05 / 0.1, 1 negative each
    )
    module = gs.GNNModule.from_config(config.model_config(name="gcn"), datamodule)
    trainer = L.Trainer(
        strategy=Strategy(config),
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        callbacks=[gs.StepSeed(args.seed)],  # dropout masks keyed by (seed, epoch, step)
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(module, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}  # val/mrr, test/auc...
    if trainer.global_rank == 0:
        print(json.dumps(metrics))
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "metrics.json").write_text(json.dumps(metrics))
            torch.save(module.state_dict(), args.out / "weights.pt")


if __name__ == "__main__":
    main()
