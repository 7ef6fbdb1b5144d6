"""Plug your own LightningModule, built on the suite's ``BlockGNN``, into DistDGL.

    python examples/distdgl_own_module.py             # 2 CPU processes, Lightning launches them

The module below is an ordinary LightningModule. What the suite asks of it:
- a training batch is a ``lightning_gnnscale.Batch`` (sampled ``blocks``, input rows ``x``,
  labels ``y`` of this rank's seeds); its loss is the *sum* over the rank's seeds divided by
  ``batch.global_seed_count``: the suite's strategies sum gradients over ranks, so the update
  equals one process training on the whole mini-batch;
- a validation batch is a ``lightning_gnnscale.Evaluation``: ``evaluation.metrics(net)`` runs
  this rank's share of full-graph inference and sums the counts over ranks (every rank calls it).

With the settings below it gives the same result as
``python train.py strategy=distdgl model=sage dataset=sbm``.
"""

import argparse
import json
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

import lightning_gnnscale as gs


class NodeClassifier(L.LightningModule):
    """GraphSAGE node classifier on sampled blocks, trained with Adam."""

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 64, lr: float = 0.01):
        super().__init__()
        self.net = gs.BlockGNN("sage", in_dim, hidden, num_classes, num_layers=2, dropout=0.5)
        self.lr = lr

    def training_step(self, batch: gs.Batch, batch_idx: int) -> torch.Tensor:
        logits = self.net(batch.blocks, batch.x)
        return F.cross_entropy(logits, batch.y, reduction="sum") / batch.global_seed_count

    def validation_step(self, evaluation: gs.Evaluation, batch_idx: int) -> None:
        metrics = evaluation.metrics(self.net, ("val", "test"))  # {split: {"acc": ...}}
        self.log("val/acc", metrics["val"]["acc"], batch_size=1)
        self.log("test/acc", metrics["test"]["acc"], batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.lr, weight_decay=5e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--num-nodes", type=int, default=10000, help="SBM size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write metrics.json and weights.pt here")
    parser.add_argument("--cache-dir", type=Path, help="preprocessing cache (default ./.cache)")
    args = parser.parse_args()

    L.seed_everything(args.seed, workers=True, verbose=False)
    datamodule = gs.DistDGLDataModule(
        "sbm",  # a dataset name: every rank loads (here: generates) it on first use
        gs.DistDGLConfig(),  # METIS with balanced training nodes, KV store, Adagrad embeddings off
        gs.DataConfig(batch_size=1024, fanouts=[10, 10]),
        seed=args.seed,
        cache_dir=args.cache_dir,
        dataset_options={"num_nodes": args.num_nodes},
    )
    module = NodeClassifier(datamodule.input_dim, datamodule.out_dim)  # the head: the classes
    trainer = L.Trainer(
        strategy="distdgl",
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        use_distributed_sampler=False,
        callbacks=[gs.StepSeed(args.seed)],
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
