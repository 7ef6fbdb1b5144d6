"""Train GAT with GSplit on the embedded SBM graph from a plain Lightning script (no Hydra).

    python examples/gsplit_gat_sbm.py                 # 2 CPU processes, Lightning launches them
    torchrun --nproc_per_node 2 examples/gsplit_gat_sbm.py

Every rank runs this whole script (Lightning re-executes it for the other ranks); the graph is
generated from its seed, so every rank builds the same one. The settings below are those of
``python train.py strategy=gsplit model=gat dataset=sbm``, which gives the same result.
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
    dataset = gs.load_dataset("sbm", num_nodes=args.num_nodes)
    datamodule = gs.GSplitDataModule(
        dataset,
        gs.GSplitConfig(),  # the paper's defaults: pre-sampled weighted METIS, 25 % cache
        gs.DataConfig(batch_size=1024, fanouts=[10, 10]),
        seed=args.seed,
        cache_dir=args.cache_dir,
    )
    model = gs.ModelConfig(name="gat", hidden=64, heads=8, dropout=0.6, lr=0.005)
    module = gs.GNNModule(
        datamodule.build_model(model),
        optimizer=model.optimizer,
        lr=model.lr,
        weight_decay=model.weight_decay,
    )
    trainer = L.Trainer(
        strategy="gsplit",
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        use_distributed_sampler=False,  # the DataModule splits every step across ranks itself
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
