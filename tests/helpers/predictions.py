"""``trainer.predict`` from a rank that holds only its part: each rank's shares, and the
check that they partition the requested nodes and equal the one-process oracle."""

from __future__ import annotations

import torch

import lightning_gnnscale as gs

REQUESTED = torch.tensor([3, 290, 150, 3, 0, 149])  # logits of these (original ids, a repeat)


def predict_shares(trainer, module, datamodule) -> dict[str, dict]:
    """This rank's shares: every node's ``embeddings`` and the ``REQUESTED`` nodes' logits."""
    (embeddings,) = trainer.predict(module, datamodule=datamodule.predict_on(output="embeddings"))
    (logits,) = trainer.predict(module, datamodule=datamodule.predict_on(REQUESTED, "logits"))
    return {"embeddings": embeddings, "logits": logits}


def gather(shares: list[dict], output: str, num_nodes: int, requested=None) -> torch.Tensor:
    """The ranks' shares of ``output`` as one ``[n, d]`` table in ``requested`` order (every
    node if ``None``). Each rank's ids must be the requested ids it owns, in the requested
    order with repeats (a subsequence), and the shares together every requested id."""
    ids = torch.cat([share[output]["node_ids"] for share in shares])
    rows = torch.cat([share[output][output] for share in shares])
    want = torch.arange(num_nodes) if requested is None else requested
    assert sorted(ids.tolist()) == sorted(want.tolist()), "the shares do not partition the nodes"
    if requested is not None:
        for share in shares:
            got = share[output]["node_ids"]
            assert got.tolist() == [i for i in want.tolist() if i in set(got.tolist())]
    out = torch.empty(num_nodes, rows.shape[1], dtype=rows.dtype)
    out[ids] = rows
    return out[want]


def check_predictions(shares: list[dict], dataset, model: gs.ModelConfig, state: dict) -> None:
    """The ranks' predictions equal the oracle's full-neighbourhood rows of the trained net
    (``state``: the module's state dict) on ``dataset`` (node classification) in float64."""
    from tests.test_plain_lightning import full_neighbourhood

    net = gs.build_model(model, dataset.graph.num_features, dataset.num_classes).double()
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    graph = dataset.graph.to(torch.float64)
    embeddings = gather(shares, "embeddings", graph.num_nodes)
    logits = gather(shares, "logits", graph.num_nodes, REQUESTED)
    torch.testing.assert_close(
        embeddings, full_neighbourhood(graph, net, layers=net.num_layers - 1)
    )
    torch.testing.assert_close(
        logits, full_neighbourhood(graph, net)[REQUESTED], rtol=1e-10, atol=1e-12
    )
