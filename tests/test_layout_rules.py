"""What a system's folder must not contain (issue 36): the kit owns where a rank's part comes
from and the checks on it, so ``systems/<name>/`` holds no branch on a partition directory and
no copy of those checks, and no task logic: targets, splits and class counts are the task's
(``NodeTargets``, which a system only selects, stores and hands back). Each row of
:data:`BANNED` is one rule."""

from __future__ import annotations

import re
from pathlib import Path

SYSTEMS = Path(__file__).resolve().parents[1] / "lightning_gnnscale" / "systems"

# pattern -> why a system must not contain it
BANNED = {
    r"isinstance\([^)]*PartitionDir": "a system branches on where its part came from",
    r"\bDirChunks\b": "Grappa's part from a directory is its list of chunks, as in memory",
    r"partition_dir is None": "a system branches on where its part came from",
    r"partition_dir is not None": "a system branches on where its part came from",
    r"\.digest\[": "the digest check is the kit's (GNNDataModule.check_rank_part), once",
    r"partitioned into \{": "the part-count check is the kit's (check_rank_part), once",
    r"\breplicated_eval_statistics\(": (
        "whole-graph evaluation is the kit's (kit.sampled.whole_graph_statistics), once"
    ),
    r"(?i)\blabels?\b": "targets are the task's (NodeTargets), not a system's labels",
    r"\b(?:train|val|test)_mask\b|\bmasks\b": "splits are the task's (NodeTargets)",
    r"\bnum_classes\b": "the head's width is the task's (NodeTargets.out_dim)",
    r"\beval_counts\b": "evaluation statistics are the task's (tasks.base.split_statistics)",
    r"\bgraph\.y\b|\.split_ids\(": "targets and splits are the task's (NodeTargets)",
}


def violations(source: str) -> list[str]:
    """The :data:`BANNED` patterns ``source`` contains."""
    return [pattern for pattern in BANNED if re.search(pattern, source)]


def system_violations() -> set[tuple[str, str]]:
    """``(file, pattern)`` for every banned pattern in a system's folder (the folders, not
    ``systems/``'s own modules)."""
    return {
        (path.relative_to(SYSTEMS).as_posix(), pattern)
        for path in sorted(SYSTEMS.glob("*/**/*.py"))
        for pattern in violations(path.read_text(encoding="utf-8"))
    }


def test_no_system_branches_on_its_parts_source_or_copies_the_kits_checks():
    found = sorted(system_violations())
    assert not found, "\n".join(f"{f}: {p} ({BANNED[p]})" for f, p in found)


def test_each_rule_finds_what_it_bans():
    samples = {
        r"isinstance\([^)]*PartitionDir": "if isinstance(prepared, PartitionDir):",
        r"\bDirChunks\b": "prepared = DirChunks(prepared, rank, dtype)",
        r"partition_dir is None": "if self.partition_dir is None:",
        r"partition_dir is not None": "if self.partition_dir is not None:",
        r"\.digest\[": "digest = torch.tensor([int(opened.digest[:15], 16)])",
        r"partitioned into \{": 'raise ValueError(f"partitioned into {n} parts")',
        r"\breplicated_eval_statistics\(": "return replicated_eval_statistics(self.task, g)",
        r"(?i)\blabels?\b": "self.kv.init_data('label', local.y)",
        r"\b(?:train|val|test)_mask\b|\bmasks\b": "seeds = graph.train_mask.nonzero()",
        r"\bnum_classes\b": "head = graph.num_classes",
        r"\beval_counts\b": "return eval_counts(out, y)",
        r"\bgraph\.y\b|\.split_ids\(": "y = graph.y[seeds]",
    }
    assert samples.keys() == BANNED.keys()
    for pattern, source in samples.items():
        assert violations(source) == [pattern], source
    assert violations("part = opened.load_part(rank)") == []
    assert violations("parts = relabel(graph); keep = keep_mask(level)") == []


class _Gathered:
    """A comm whose all-gather returns the digests ``ranks`` hold (one rank's view)."""

    def __init__(self, ranks: list[int]):
        self.ranks = ranks

    def all_gather_tensor(self, tensor, *, category):
        import torch

        return torch.tensor(self.ranks, dtype=tensor.dtype)


def test_the_kit_checks_every_systems_part_count_and_digest_once(tmp_path):
    """``check_rank_part`` runs in the base's ``setup`` for every system (Grappa's too): a
    directory for another world size, or one whose digest differs between ranks, is
    refused before the system loads its part."""
    from types import SimpleNamespace

    import pytest

    import lightning_gnnscale as gs

    _, DataModule, config = gs.system("grappa")
    dm = DataModule("sbm", config, cache_dir=tmp_path)
    digest = "0123456789abcdef"
    same = int(digest[:15], 16)
    opened = SimpleNamespace(num_parts=2, digest=digest)
    dm.check_rank_part(SimpleNamespace(world_size=2, comm=_Gathered([same, same])), opened)
    with pytest.raises(RuntimeError, match="the partition directory differs between ranks"):
        dm.check_rank_part(SimpleNamespace(world_size=2, comm=_Gathered([same, 7])), opened)
    with pytest.raises(ValueError, match="partitioned into 2 parts for 4 ranks"):
        dm.check_rank_part(SimpleNamespace(world_size=4, comm=_Gathered([same] * 4)), opened)
