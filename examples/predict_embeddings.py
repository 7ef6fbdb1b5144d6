"""Train GraphSAGE, then get every node's embedding out with ``trainer.predict`` (no Hydra).

    python examples/predict_embeddings.py             # 2 CPU processes, Lightning launches them

``datamodule.predict_on(node_ids, output)`` says what ``trainer.predict`` computes: the
``logits`` or the ``embeddings`` (the input of the last layer) of the given nodes, or of every
node. Each rank computes its share, as in evaluation (full-neighbourhood layer-wise inference,
split by node range); here every rank saves its share and rank 0 joins them into one file,
``embeddings.pt``: ``{"node_ids": [N], "embeddings": [N, hidden]}`` in node order.
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
    parser.add_argument("--out", type=Path, default=Path("embeddings"), help="output folder")
    parser.add_argument("--cache-dir", type=Path, help="preprocessing cache (default ./.cache)")
    args = parser.parse_args()

    L.seed_everything(args.seed, workers=True, verbose=False)
    Strategy, DataModule, config = gs.system("ddp")
    datamodule = DataModule(
        "sbm",  # a dataset name: every rank generates the same graph from its seed
        config,
        gs.DataConfig(batch_size=1024, fanouts=[10, 10]),
        seed=args.seed,
        cache_dir=args.cache_dir,
        dataset_options={"num_nodes": args.num_nodes},
    )
    module = gs.GNNModule.from_config(gs.ModelConfig(name="sage", hidden=32), datamodule)
    trainer = L.Trainer(
        strategy=Strategy(config),
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        callbacks=[gs.StepSeed(args.seed)],
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(module, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    datamodule.predict_on(output="embeddings")  # every node; or predict_on(ids, "logits")
    (share,) = trainer.predict(module, datamodule=datamodule)  # this rank's share
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(share, args.out / f"share-{trainer.global_rank}.pt")
    trainer.strategy.barrier()
    if trainer.global_rank == 0:
        shares = [args.out / f"share-{rank}.pt" for rank in range(trainer.world_size)]
        parts = [torch.load(path) for path in shares]
        ids = torch.cat([p["node_ids"] for p in parts])
        rows = torch.cat([p["embeddings"] for p in parts])
        order = ids.argsort()
        torch.save({"node_ids": ids[order], "embeddings": rows[order]}, args.out / "embeddings.pt")
        for path in shares:
            path.unlink()
        torch.save(module.state_dict(), args.out / "weights.pt")
        (args.out / "metrics.json").write_text(json.dumps(metrics))
        print(f"{len(ids)} node embeddings of width {rows.shape[1]}: {args.out / 'embeddings.pt'}")


if __name__ == "__main__":
    main()
