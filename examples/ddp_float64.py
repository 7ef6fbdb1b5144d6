"""Train GCN under the metered data-parallel reference in float64, through Lightning's own
``precision="64-true"`` (no Hydra).

    python examples/ddp_float64.py                    # 2 CPU processes, Lightning launches them

Float64 is how the suite checks that a system is exact; Lightning's precision setting is all a
plain script needs: the DataModule follows the Trainer's precision (its features become
float64), Lightning converts the module. The script leaves ``use_distributed_sampler`` alone:
the suite's loaders already give every rank its share, and Lightning keeps them as they are.
The settings below are those of ``python train.py strategy=ddp model=gcn dataset=sbm
dtype=float64``, which gives the same weights.
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
    Strategy, DataModule, config = gs.system("data_parallel")  # the same as gs.system("ddp")
    datamodule = DataModule(
        gs.load_dataset("sbm", num_nodes=args.num_nodes),  # float32 features
        config,
        gs.DataConfig(batch_size=1024, fanouts=[10, 10]),
        seed=args.seed,
        cache_dir=args.cache_dir,
    )
    module = gs.GNNModule.from_config(config.model_config(name="gcn"), datamodule)
    trainer = L.Trainer(
        strategy=Strategy(config),
        accelerator="cpu",
        devices=2,
        precision="64-true",
        max_epochs=args.epochs,
        callbacks=[gs.StepSeed(args.seed)],  # dropout masks keyed by (seed, epoch, step)
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(module, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if trainer.global_rank == 0:
        print(json.dumps(metrics))
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "metrics.json").write_text(json.dumps(metrics))
            torch.save(module.state_dict(), args.out / "weights.pt")


if __name__ == "__main__":
    main()
