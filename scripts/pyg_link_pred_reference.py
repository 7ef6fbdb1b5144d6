"""PyG's link-prediction recipe on Cora (examples/link_pred.py), the reference issue 38 targets.

Written with PyG and scikit-learn's ``roc_auc_score`` only, never the suite's own code: GCN
128 -> 64, dot-product decoder, ``RandomLinkSplit(0.05, 0.1, is_undirected=True,
add_negative_train_samples=False)``, one fresh negative per training positive each epoch
(``negative_sampling``), BCE, Adam 0.01, 100 full-graph epochs; the test AUC at the epoch of
the best validation AUC. ``torch_geometric.seed_everything(seed)`` seeds the split and the
initialisation (torch) and the negatives (``negative_sampling`` draws with Python's
``random``). Recorded in docs/benchmarks.md, "Link prediction: the PyG reference".

    python scripts/pyg_link_pred_reference.py --root ../shared/datasets/planetoid --seeds 0 1 2 3 4

PyG writes ``processed/`` next to ``raw/``; the raw files are copied to a temporary folder
first so the dataset root is only read.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
import torch_geometric.transforms as T
from sklearn.metrics import roc_auc_score
from torch_geometric import seed_everything
from torch_geometric.datasets import Planetoid
from torch_geometric.nn import GCNConv
from torch_geometric.utils import negative_sampling


class Net(torch.nn.Module):
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def encode(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def decode(self, z, edge_label_index):
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)


def train_epoch(model, optimizer, criterion, data) -> None:
    model.train()
    optimizer.zero_grad()
    z = model.encode(data.x, data.edge_index)
    neg = negative_sampling(
        edge_index=data.edge_index,
        num_nodes=data.num_nodes,
        num_neg_samples=data.edge_label_index.size(1),
        method="sparse",
    )
    index = torch.cat([data.edge_label_index, neg], dim=-1)
    label = torch.cat([data.edge_label, data.edge_label.new_zeros(neg.size(1))])
    loss = criterion(model.decode(z, index).view(-1), label)
    loss.backward()
    optimizer.step()


@torch.no_grad()
def evaluate(model, data) -> float:
    model.eval()
    z = model.encode(data.x, data.edge_index)
    out = model.decode(z, data.edge_label_index).view(-1).sigmoid()
    return float(roc_auc_score(data.edge_label.cpu().numpy(), out.cpu().numpy()))


def run_seed(raw_root: Path, seed: int, epochs: int) -> tuple[float, float]:
    """``(best validation AUC, test AUC at that epoch)`` of one seed."""
    seed_everything(seed)
    transform = T.Compose(
        [
            T.NormalizeFeatures(),
            T.RandomLinkSplit(
                num_val=0.05, num_test=0.1, is_undirected=True, add_negative_train_samples=False
            ),
        ]
    )
    train_data, val_data, test_data = Planetoid(str(raw_root), name="Cora", transform=transform)[0]
    model = Net(train_data.num_features, 128, 64)
    optimizer = torch.optim.Adam(params=model.parameters(), lr=0.01)
    criterion = torch.nn.BCEWithLogitsLoss()
    best_val = final_test = 0.0
    for _ in range(epochs):
        train_epoch(model, optimizer, criterion, train_data)
        val_auc, test_auc = evaluate(model, val_data), evaluate(model, test_data)
        if val_auc > best_val:
            best_val, final_test = val_auc, test_auc
    return best_val, final_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="folder holding Cora/raw (read only)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()
    raw = Path(args.root) / "Cora" / "raw"
    if not raw.is_dir():
        raise SystemExit(f"no Cora raw folder at {raw}")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(raw, Path(tmp) / "Cora" / "raw")
        tests = []
        for seed in args.seeds:
            val_auc, test_auc = run_seed(Path(tmp), seed, args.epochs)
            tests.append(test_auc)
            print(f"seed {seed}: best val AUC {val_auc:.4f}, test AUC {test_auc:.4f}", flush=True)
    print(f"mean test AUC over {len(tests)} seeds: {statistics.fmean(tests):.4f}")


if __name__ == "__main__":
    main()
