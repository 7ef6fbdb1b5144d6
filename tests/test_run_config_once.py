"""One run's config is typed once, turned into plain settings once, and each of its rules is
checked once: the pre-launch check and the strategy's binding are one ``check_run``."""

from __future__ import annotations

import sys
from collections import Counter

from lightning_gnnscale import config_types
from lightning_gnnscale.run import train
from lightning_gnnscale.systems.single.config import SingleConfig
from tests.helpers.config import make_cfg


def _count(monkeypatch, counts: Counter, owner, name: str, key: str, when=lambda *a: True):
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        if when(*args):
            counts[key] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return original


def test_a_resumed_train_builds_its_settings_and_identity_once_and_checks_each_rule_once(
    tmp_path, monkeypatch
):
    """On one ``train(cfg)`` (``single``, in this process, resumed so that the resume check
    and the checkpoints both need the identity, with a logger that records the settings):
    ``as_dict`` of the run once, its checkpoint identity once, the depth, data and run rules
    once each."""
    first, _ = train(make_cfg(tmp_path / "a", "strategy=single", "trainer.max_epochs=1"))
    ckpt = tmp_path / "a" / "out" / "checkpoints" / "last.ckpt"
    assert first["epochs"] == 1 and ckpt.is_file()
    cfg = make_cfg(
        tmp_path / "b", "strategy=single", "trainer.max_epochs=2", f"ckpt_path={ckpt}", "logger=csv"
    )
    counts: Counter = Counter()
    _count(
        monkeypatch,
        counts,
        config_types,
        "as_dict",
        "as_dict",
        lambda c: isinstance(c, config_types.RunConfig),
    )
    _count(monkeypatch, counts, config_types, "run_identity", "identity")
    depth = config_types.check_depth
    for module in list(sys.modules.values()):  # wherever the depth check was imported
        if getattr(module, "check_depth", None) is depth and module.__name__.startswith(
            "lightning_gnnscale"
        ):
            _count(monkeypatch, counts, module, "check_depth", "depth")
    _count(monkeypatch, counts, SingleConfig, "check_data", "data")
    _count(monkeypatch, counts, SingleConfig, "check_run", "run")
    metrics, _ = train(cfg)
    assert metrics["epochs"] == 2  # it resumed and trained its second epoch
    assert counts == {"as_dict": 1, "identity": 1, "depth": 1, "data": 1, "run": 1}
