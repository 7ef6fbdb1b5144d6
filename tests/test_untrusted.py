"""Untrusted files run no code: checkpoints, cache entries and processed dataset files are
loaded as tensors and plain data only; a file that needs more is refused by name before any
of it runs (docs/testing.md, "Faults and bad inputs")."""

from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

import pytest
import torch

from lightning_gnnscale.files import UnsafeFileError
from lightning_gnnscale.graph.cache import artifact_path, cached, read_verified
from lightning_gnnscale.graph.datasets import load_dataset
from lightning_gnnscale.preflight import ConfigError, validate
from tests.helpers.config import make_cfg
from tests.test_datasets import _write_ogb_fixture


class _Payload:
    """Unpickling this runs code: it writes ``marker`` (as a hostile file's ``os.system`` would)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def _payload_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A Lightning-shaped checkpoint whose run-identity block carries the payload."""
    marker = tmp_path / "payload-ran"
    path = tmp_path / "evil.ckpt"
    torch.save(
        {
            "state_dict": {"net.weight": torch.zeros(2)},
            "lightning_gnnscale": {"identity": _Payload(marker), "epochs_done": 1},
        },
        path,
    )
    return path, marker


@pytest.mark.parametrize("key", ["ckpt_path", "weights_from"])
def test_a_checkpoint_that_would_run_code_is_refused_before_it_runs(tmp_path, key):
    path, marker = _payload_checkpoint(tmp_path)
    cfg = make_cfg(tmp_path, "strategy=single", "trainer.max_epochs=4", f"{key}={path}")
    with pytest.raises(ConfigError, match=f"checkpoint {path} was refused.*GLOBAL"):
        validate(cfg)
    assert not marker.exists(), "the checkpoint's payload ran"


def test_a_cache_entry_that_would_run_code_is_rebuilt_not_run(tmp_path):
    """A payload with a valid digest header in the cache folder: refused by name and rebuilt."""
    marker = tmp_path / "payload-ran"
    key = {"kind": "test", "n": 3}
    buffer = io.BytesIO()
    torch.save(_Payload(marker), buffer)
    body = buffer.getvalue()
    path = artifact_path(key, tmp_path)
    path.write_bytes(hashlib.sha256(body).hexdigest().encode() + body)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = cached(key, lambda: torch.arange(3), tmp_path)
    assert not marker.exists(), "the cache entry's payload ran"
    assert torch.equal(value, torch.arange(3))
    assert any(str(path) in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_an_ogb_processed_file_that_would_run_code_is_refused(tmp_path):
    _write_ogb_fixture(tmp_path, "ogbn-arxiv")
    processed = tmp_path / "ogbn_arxiv" / "processed" / "data_processed"
    processed.parent.mkdir()
    marker = tmp_path / "payload-ran"
    torch.save({"graph": _Payload(marker)}, processed, pickle_protocol=4)  # as ogb writes it
    with pytest.raises(UnsafeFileError, match=f"dataset file {processed} was refused"):
        load_dataset("ogbn-arxiv", root=tmp_path, cache_dir=tmp_path / "cache")
    assert not marker.exists(), "the dataset file's payload ran"


def test_a_planetoid_processed_file_that_would_run_code_is_refused(tmp_path):
    """PyG reads ``processed/data.pt`` weights-only but falls back to a full unpickle when
    that fails; the fallback must not run the file either."""
    raw = tmp_path / "Cora" / "raw"
    raw.mkdir(parents=True)
    for suffix in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"):
        (raw / f"ind.cora.{suffix}").write_bytes(b"")
    processed = tmp_path / "Cora" / "processed" / "data.pt"
    processed.parent.mkdir()
    marker = tmp_path / "payload-ran"
    torch.save((_Payload(marker), None, None), processed)
    with pytest.raises(UnsafeFileError, match=f"dataset file {processed} was refused"):
        load_dataset("cora", root=tmp_path, cache_dir=tmp_path / "cache")
    assert not marker.exists(), "the dataset file's payload ran"


def test_a_partition_artifact_copied_over_another_keys_file_is_rebuilt(tmp_path):
    """Copying the ``random`` partition artifact over the ``metis_balanced`` one (a valid
    file with a valid digest) must not hand the random partition to a metis_balanced run."""
    from lightning_gnnscale.graph.cache import cached_partition
    from lightning_gnnscale.graph.generators import sbm
    from lightning_gnnscale.graph.partition import partition

    dataset = sbm(num_nodes=400, num_features=4, seed=0)
    graph, targets = dataset.graph, dataset.targets
    random_parts = cached_partition(graph, "random", 2, 0, tmp_path, targets=targets)
    metis = cached_partition(graph, "metis_balanced", 2, 0, tmp_path, targets=targets)
    files = sorted(tmp_path.glob("partition-*.pt"))
    assert len(files) == 2 and not torch.equal(random_parts, metis)
    random_file = next(p for p in files if torch.equal(read_verified(p), random_parts))
    metis_file = next(p for p in files if p != random_file)
    metis_file.write_bytes(random_file.read_bytes())
    with pytest.warns(UserWarning, match=f"cache entry {metis_file} was built for another key"):
        again = cached_partition(graph, "metis_balanced", 2, 0, tmp_path, targets=targets)
    assert torch.equal(again, metis)
    splits = targets.split_matrix()
    assert torch.equal(again, partition(graph, "metis_balanced", 2, seed=0, splits=splits))
    assert not torch.equal(again, random_parts)
