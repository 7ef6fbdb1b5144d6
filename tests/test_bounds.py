"""Settings that start processes, threads or allocations are bounded before any spawn, naming
the key and the bound (issue 37 items 8 and 9); ``launcher.allow_oversubscribe`` lifts the
core bounds, with a warning."""

import math
import os
from dataclasses import replace

import pytest

from lightning_gnnscale import bounds, run
from lightning_gnnscale.config_types import (
    SEED_RANGE,
    DataConfig,
    ModelConfig,
    RunFacts,
    run_config,
)
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.systems.bytegnn.config import ByteGNNConfig
from lightning_gnnscale.systems.grappa.config import GrappaConfig
from lightning_gnnscale.systems.single import SingleConfig, SingleDataModule
from tests.helpers.config import make_cfg

HATCH = "launcher.allow_oversubscribe=true"
BOUND_ENV = (bounds.THREADS_ENV, bounds.OMP_THREADS_ENV, bounds.PORT_ENV)


@pytest.fixture
def two_cores(monkeypatch):
    """A 2-core machine with none of the bounded variables set."""
    monkeypatch.setattr(bounds, "usable_cores", lambda: 2)
    for name in (*BOUND_ENV, "LOCAL_RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """The default run's typed config (composed once: composing costs a second or more)."""
    return run_config(make_cfg(tmp_path_factory.mktemp("base")))


def with_settings(run_cfg, hatch: bool = False, **sections):
    """``run_cfg`` with ``sections`` (name -> {key: value}) changed and the hatch set."""
    changed = {name: replace(getattr(run_cfg, name), **keys) for name, keys in sections.items()}
    launcher = replace(run_cfg.launcher, allow_oversubscribe=hatch)
    return replace(run_cfg, launcher=launcher, **changed)


def check(run_cfg, environ=None):
    bounds.check_run_bounds(run_cfg, spawns_ranks=True, environ=environ or {})


@pytest.mark.parametrize(
    ("section", "key", "message"),
    [
        (
            "trainer",
            "devices",
            r"trainer.devices=2000 exceeds 8 x 2 usable cores = 16 ranks per node; set "
            r"launcher.allow_oversubscribe=true if you mean it",
        ),
        ("data", "num_workers", r"data.num_workers=2000 exceeds 4 x 2 usable cores = 8 workers"),
    ],
)
def test_counts_past_the_cores_are_refused_and_the_hatch_lifts_them(
    base_run, two_cores, section, key, message
):
    too_many = {section: {key: 2000}}
    with pytest.raises(ConfigError, match=message):
        check(with_settings(base_run, **too_many))
    with pytest.warns(UserWarning, match=f"allowed by {HATCH}"):
        check(with_settings(base_run, hatch=True, **too_many))


def test_the_readme_run_fits_two_cores(base_run, two_cores):
    check(with_settings(base_run, trainer={"devices": 4}))  # 4 ranks on 2 cores


def test_the_bounds_themselves_are_allowed(base_run, two_cores):
    check(
        with_settings(base_run, trainer={"devices": 16}, data={"num_workers": 8}),
        {bounds.THREADS_ENV: "8", bounds.OMP_THREADS_ENV: "8", "MASTER_PORT": "65535"},
    )


@pytest.mark.parametrize("name", [bounds.THREADS_ENV, bounds.OMP_THREADS_ENV])
def test_thread_variables_are_bounded_by_the_cores(base_run, two_cores, name):
    with pytest.raises(ConfigError, match=rf"\${name}=100000 exceeds 4 x 2 usable cores = 8"):
        check(base_run, {name: "100000"})
    with pytest.warns(UserWarning, match=HATCH):
        check(with_settings(base_run, hatch=True), {name: "100000"})
    for bad in ("0", "-3", "many", "4,0"):  # the hatch lifts bounds, not the format
        with pytest.raises(ConfigError, match=f"{name}='{bad}' must be a positive integer"):
            check(with_settings(base_run, hatch=True), {name: bad})


def test_omp_may_give_one_count_per_nesting_level(monkeypatch):
    assert bounds.env_count(bounds.OMP_THREADS_ENV, {bounds.OMP_THREADS_ENV: "4,2"}) == 4
    with pytest.raises(ConfigError, match=bounds.THREADS_ENV):  # the suite's own: one count
        bounds.env_count(bounds.THREADS_ENV, {bounds.THREADS_ENV: "4,2"})


def test_master_port_is_a_tcp_port(base_run, two_cores):
    hatched = with_settings(base_run, hatch=True)  # whatever the hatch
    for bad, message in (
        ("99999", "MASTER_PORT=99999 is outside the TCP ports 1-65535"),
        ("0", "MASTER_PORT=0 is outside"),
        ("http", "MASTER_PORT='http' must be a TCP port"),
    ):
        with pytest.raises(ConfigError, match=message):
            check(hatched, {"MASTER_PORT": bad})
    with pytest.raises(ConfigError, match=r"65535 \+ sweep job 1 = 65536 is outside"):
        bounds.check_port({"MASTER_PORT": "65535"}, offset=1)  # job 1 of a multirun


def test_ranks_started_by_torchrun_are_not_counted(base_run, two_cores):
    """Under torchrun or srun the ranks exist already (one core each, say): nothing to bound."""
    many = with_settings(base_run, trainer={"devices": 64})
    bounds.check_run_bounds(many, spawns_ranks=False, environ={})
    with pytest.raises(ConfigError, match="trainer.devices=64"):
        check(many)


def test_train_refuses_before_any_rank_starts(tmp_path, two_cores, monkeypatch):
    """``run.train`` checks the bounds (validate) and Grappa's chunks (once the graph is
    loaded) before it starts a rank or writes a chunk."""

    def no_spawn(*_args, **_kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(run, "launch_local", no_spawn)
    monkeypatch.setenv(bounds.OMP_THREADS_ENV, "100000")
    with pytest.raises(ConfigError, match=r"\$OMP_NUM_THREADS=100000 exceeds"):
        run.train(make_cfg(tmp_path))
    monkeypatch.delenv(bounds.OMP_THREADS_ENV)
    chunks = "strategy.partitions_per_rank=1000 gives 1000 x 2 ranks = 2000 chunks"
    with pytest.raises(ConfigError, match=f"{chunks}, which exceeds the graph's 300 nodes"):
        run.train(make_cfg(tmp_path, "strategy=grappa", "strategy.partitions_per_rank=1000"))


def test_grappa_chunks_are_at_most_the_nodes():
    GrappaConfig(num_chunks=300).check_graph(300, 2)
    with pytest.raises(ConfigError, match="strategy.num_chunks=301 exceeds the graph's 300"):
        GrappaConfig(num_chunks=301).check_graph(300, 2)
    tournament = GrappaConfig(schedule="tournament", partitions_per_rank=100)
    with pytest.raises(ConfigError, match=r"100 x 2 ranks x 2 \(tournament\) = 400 chunks"):
        tournament.check_graph(300, 2)


def test_a_cgroup_quota_caps_the_usable_cores(tmp_path, monkeypatch):
    (tmp_path / "job").mkdir()
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "job" / "cpu.max").write_text("150000 100000\n")
    assert bounds.cgroup_cpu_limit(tmp_path, "0::/job\n") == 1.5
    assert bounds.cgroup_cpu_limit(tmp_path, "0::/\n") is None  # "max": no quota
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert bounds.cgroup_cpu_limit(tmp_path, "4:cpu,cpuacct:/\n") == 3.0  # cgroup v1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(bounds, "cgroup_cpu_limit", lambda: 1.5)
    assert bounds.usable_cores() == 2
    monkeypatch.setattr(bounds, "cgroup_cpu_limit", lambda: None)
    assert bounds.usable_cores() == 8


@pytest.mark.parametrize("lr", [math.inf, -math.inf, math.nan])
def test_learning_rates_are_finite(lr):
    with pytest.raises(ConfigError, match=rf"model.lr={lr} must be > 0 and finite"):
        ModelConfig(lr=lr)
    with pytest.raises(ConfigError, match="model.weight_decay=inf must be >= 0 and finite"):
        ModelConfig(weight_decay=math.inf)
    with pytest.raises(ConfigError, match=f"data.embedding_lr={lr} must be > 0 and finite"):
        DataConfig(embedding_lr=lr)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**70])
def test_seeds_outside_numpys_range_are_refused_naming_seed(base_run, seed):
    message = rf"seed={seed} must be an integer in \[0, 4294967295\]"
    with pytest.raises(ConfigError, match=message):
        replace(base_run, seed=seed)
    with pytest.raises(ConfigError, match=message):  # a plain Lightning script's DataModule
        SingleDataModule("sbm", SingleConfig(), seed=seed)
    assert SEED_RANGE == (0, 2**32 - 1)
    replace(base_run, seed=SEED_RANGE[1])


def test_a_lifted_bound_warns_once_in_train_pys_order(base_run, two_cores):
    """``train.py`` checks the config (check_config), then ``train`` validates that same run
    config with ``checked=True``: its bounds are not checked again, so each lifted bound is
    named once; a plain ``validate`` checks in full."""
    import warnings

    from lightning_gnnscale.preflight import check_config, validate

    lifted = with_settings(base_run, hatch=True, data={"num_workers": 2000})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_cfg = check_config(lifted)
        assert validate(run_cfg, checked=True) is run_cfg
        changed = replace(run_cfg, data=replace(run_cfg.data, num_workers=3000))
        validate(changed)  # a run config not just checked is checked in full
    named = [str(w.message) for w in caught if f"allowed by {HATCH}" in str(w.message)]
    assert [m.split(" exceeds")[0] for m in named] == [
        "data.num_workers=2000",
        "data.num_workers=3000",
    ]


def test_bytegnn_s_sampling_threads_are_bounded_by_the_usable_cores_and_the_hatch_lifts_it(
    monkeypatch,
):
    """Review nit 11: ByteGNN counted the affinity's cores only (8 here, where the cgroup
    quota allows 1) and no hatch lifted its bound."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(bounds, "cgroup_cpu_limit", lambda: 1.0)
    run = RunFacts(1, 1, 1, DataConfig(batch_size=64))
    config = ByteGNNConfig(sampling_threads=5)
    with pytest.raises(ConfigError, match=r"sampling_threads=5 exceeds 4 x 1 usable cores = 4"):
        config.check_run(run)
    with pytest.warns(UserWarning, match=f"allowed by {HATCH}"):
        config.check_run(replace(run, allow_oversubscribe=True))
