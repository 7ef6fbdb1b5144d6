"""DDP comm hook on gloo/CPU, the checkpointed bucket layout, the collective audit, and
the test launcher's failure modes."""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.nn.parallel import DistributedDataParallel

from lightning_gnnscale.comm import (
    GATHER_REDUCE_ELEMENTS,
    INTER_SERVER,
    CollectiveRecorder,
    Comm,
    CommMeter,
    GradientHookState,
    Topology,
    ddp_bucket_layout,
    exchange_rows,
    register_metered_ddp_hook,
)
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.kit import strategies
from lightning_gnnscale.kit.strategies import DDP_BUCKETS_KEY, MeteredDDPStrategy
from tests.helpers.dist import run_distributed


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    ).double()


def _batch(rank: int) -> torch.Tensor:
    return torch.randn(
        5, 6, generator=torch.Generator().manual_seed(10 + rank), dtype=torch.float64
    )


def _loss(model: torch.nn.Module, rank: int) -> torch.Tensor:
    return model(_batch(rank)).pow(2).mean()


def _ddp_case(rank: int, world_size: int) -> dict:
    comm = Comm.create(CommMeter(), Topology(world_size, 1), timeout_s=30)
    with CollectiveRecorder() as construction:
        # A bucket cap of ~100 bytes gives several buckets (from the second step on).
        ddp = DistributedDataParallel(_model(), bucket_cap_mb=1e-4)
    state = register_metered_ddp_hook(ddp, comm)
    grads = {}
    with CollectiveRecorder() as recorder:
        before = comm.meter.snapshot()
        _loss(ddp, rank).backward()
        grads["mean"] = [p.grad.clone() for p in ddp.parameters()]
        ddp.zero_grad()
        state.scale = 1.0  # a float scale means: multiply, SUM, no division
        _loss(ddp, rank).backward()  # DDP has rebuilt its buckets after the first step
        grads["sum"] = [p.grad.clone() for p in ddp.parameters()]
        received = exchange_rows(torch.ones(2, 3), torch.tensor([0, 1]), [1, 1], [1, 1], comm)
        assert received.shape == (2, 3)
        steps = comm.meter.delta(before)
        comm.reduce_meter()
    with CollectiveRecorder() as negative_control:
        dist.all_reduce(torch.ones(3))
    return {
        "grads": grads,
        "steps": steps,
        "calls": recorder.calls,
        "problems": recorder.problems(steps),
        "construction_calls": construction.calls,
        "negative_problems": negative_control.problems(CommMeter().snapshot()),
        "data_group": comm.group_name,
        "hook_group": state.comm.group_name,
    }


@pytest.mark.dist
def test_metered_ddp_hook_fires_on_gloo_and_audit_accounts_for_every_call():
    world_size = 2
    results = run_distributed(_ddp_case, world_size, timeout_s=60)
    per_rank_grads = []
    for rank in range(world_size):
        model = _model()
        _loss(model, rank).backward()
        per_rank_grads.append([p.grad for p in model.parameters()])
    num_params = sum(p.numel() for p in _model().parameters())
    for result in results:
        for got, *per_rank in zip(result["grads"]["mean"], *per_rank_grads):
            torch.testing.assert_close(got, sum(per_rank) / world_size)
        for got, *per_rank in zip(result["grads"]["sum"], *per_rank_grads):
            torch.testing.assert_close(got, sum(per_rank))
        # Ring model with P=2: each rank sends every bucket once per step: the parameter bytes.
        assert result["steps"]["bytes"]["gradient"] == 2 * num_params * 8
        assert (
            result["steps"]["category_link_bytes"]["gradient"][INTER_SERVER] == 2 * num_params * 8
        )
        gradient_calls = [c for c in result["calls"] if c.category == "gradient"]
        assert len(gradient_calls) > 2, "expected several DDP buckets in the second step"
        assert {c.logical_op for c in gradient_calls} == {"all_reduce"}
        # Two ranks: mid-sized CPU buckets are reduced by an all-gather, the rest by all_reduce.
        low, high = GATHER_REDUCE_ELEMENTS
        for call in gradient_calls:
            gathered = low <= call.numel <= high
            assert call.op == ("all_gather_single" if gathered else "all_reduce"), call
        assert {c.op for c in gradient_calls} == {"all_gather_single", "all_reduce"}
        assert sum(c.numel for c in gradient_calls) == 2 * num_params
        assert {c.group for c in gradient_calls} == {result["hook_group"]}
        exchange_calls = [c for c in result["calls"] if c.category == "activation"]
        assert [(c.op, c.group, c.nbytes) for c in exchange_calls] == [
            ("all_to_all_single", result["data_group"], 24)
        ]
        assert result["data_group"] != result["hook_group"]
        bookkeeping = [c.op for c in result["calls"] if c.bookkeeping]  # reduce_meter's gather
        assert bookkeeping in (["all_gather_single"], ["all_gather_into_tensor"])
        assert result["problems"] == []
        assert len(result["negative_problems"]) == 1
        assert "unmetered call" in result["negative_problems"][0]
        # DDP's start-up parameter sync is visible to the audit, and not metered.
        assert [c.op for c in result["construction_calls"] if c.op == "_broadcast_coalesced"]


def _resume_case(rank: int, world_size: int, bucket_cap_mb: float, scale: float | None) -> dict:
    """Two backwards of one DDP (its ``ddp_bucket_layout`` taken after the first, as a
    checkpoint does), then the second backward alone on a fresh DDP, with and without that
    layout: the second step's gradients of each."""
    comm = Comm.create(CommMeter(), Topology(world_size, 1), timeout_s=30)

    def second_step(layout: list[list[int]] | None, first: bool) -> tuple[list, list | None]:
        ddp = DistributedDataParallel(_model(), bucket_cap_mb=bucket_cap_mb)
        state = GradientHookState(comm.with_group(ddp.process_group), scale, layout)
        register_metered_ddp_hook(ddp, state)
        if first:
            _loss(ddp, rank + world_size).backward()
            layout = ddp_bucket_layout(ddp)
            ddp.zero_grad()
        _loss(ddp, rank).backward()
        return [p.grad.clone() for p in ddp.parameters()], layout

    want, layout = second_step(None, first=True)
    return {
        "want": want,
        "layout": layout,
        "resumed": second_step(layout, first=False)[0],
        "fresh": second_step(None, first=False)[0],
    }


@pytest.mark.dist
@pytest.mark.parametrize(("bucket_cap_mb", "scale"), [(25, None), (1e-4, 1.0)])
def test_a_resumed_ddp_sums_its_first_step_in_the_checkpointed_bucket_layout(bucket_cap_mb, scale):
    """DDP rebuilds its buckets after its first backward (in the order the gradients became
    ready) and gloo's 4-rank sum depends on where a gradient sits in its bucket: a fresh DDP's
    first step differs in the last bits from the same step of the DDP it replaces, unless the
    hook reduces it in the layout :func:`ddp_bucket_layout` took from that one."""
    num_params = len(list(_model().parameters()))
    for result in run_distributed(_resume_case, 4, bucket_cap_mb, scale, timeout_s=60):
        assert sorted(j for bucket in result["layout"] for j in bucket) == list(range(num_params))
        assert (len(result["layout"]) > 1) == (bucket_cap_mb < 1)
        for want, got in zip(result["want"], result["resumed"], strict=True):
            assert torch.equal(want, got)
        # the negative control: the fresh DDP's initial bucket sums other bits
        assert not all(map(torch.equal, result["want"], result["fresh"]))


def _skip_collective(rank: int, world_size: int) -> None:
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(120)


def _fail_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()


@pytest.mark.dist
def test_mismatched_collective_times_out_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 8"):
        run_distributed(_skip_collective, 2, timeout_s=8)
    assert time.monotonic() - start < 20


@pytest.mark.dist
def test_rank_exception_is_reraised_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="(?s)rank 1.*ValueError: boom on rank 1"):
        run_distributed(_fail_on_rank_one, 2, timeout_s=30)
    assert time.monotonic() - start < 20


def _world_rank(rank, world_size):
    return dist.get_rank()


@pytest.mark.dist
def test_a_rendezvous_port_taken_before_rank_0_binds_it_is_tried_again(monkeypatch):
    """The helper picks a free port, then rank 0 binds it: a process that takes it in between
    (here a listening socket) makes rank 0 fail with EADDRINUSE before ``fn`` runs."""
    import socket

    from tests.helpers import dist as dist_helper

    with socket.create_server(("127.0.0.1", 0)) as taken:
        ports = [taken.getsockname()[1]]
        real_free_port = dist_helper.free_port
        monkeypatch.setattr(
            dist_helper, "free_port", lambda: ports.pop() if ports else real_free_port()
        )
        assert run_distributed(_world_rank, 2, timeout_s=60) == [0, 1]
    assert not ports  # the taken port was handed out first


def _carried_layout_case(rank: int, world_size: int, path: str) -> dict:
    """A resumed strategy's checkpoints: before its first backward, then after it."""
    comm = Comm.create(CommMeter(), Topology(world_size, 1), timeout_s=30)
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=1e-4)
    carried = [[3], [2, 1], [0]]
    strategy = MeteredDDPStrategy()
    strategy.model = ddp
    strategy.grad_hook_state = register_metered_ddp_hook(
        ddp, GradientHookState(comm.with_group(ddp.process_group), 1.0, carried)
    )
    saved = {}
    for when in ("before", "after"):
        checkpoint = {}
        strategy.save_checkpoint(checkpoint, f"{path}-{rank}-{when}.ckpt")
        saved[when] = checkpoint[DDP_BUCKETS_KEY]
        _loss(ddp, rank).backward()
    saved["carried"] = carried
    saved["rebuilt"] = ddp_bucket_layout(ddp)
    return saved


@pytest.mark.dist
def test_a_resumed_ddp_saving_before_its_first_backward_saves_the_layout_it_carries(tmp_path):
    for saved in run_distributed(_carried_layout_case, 2, str(tmp_path / "c"), timeout_s=60):
        assert saved["before"] == saved["carried"]  # not DDP's initial single bucket
        assert saved["after"] == saved["rebuilt"] != saved["carried"]


def _several_initial_buckets_case(rank: int, world_size: int) -> list[str]:
    comm = Comm.create(CommMeter(), Topology(world_size, 1), timeout_s=30)
    # find_unused_parameters lets DDP start with several buckets of the cap
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=1e-4, find_unused_parameters=True)
    layout = [[0, 1, 2, 3]]
    register_metered_ddp_hook(
        ddp, GradientHookState(comm.with_group(ddp.process_group), 1.0, layout)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loss(ddp, rank).backward()
    return [str(w.message) for w in caught]


@pytest.mark.dist
def test_a_checkpointed_layout_that_ddp_s_initial_buckets_cannot_take_is_dropped_with_a_warning():
    for messages in run_distributed(_several_initial_buckets_case, 2, timeout_s=60):
        assert [m for m in messages if "several gradient buckets" in m], messages


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = _model()
        self.net[0].bias.requires_grad_(False)  # positions 0, 2, 3 are trainable


def _strategy_for(fn: TrainerFn) -> MeteredDDPStrategy:
    strategy = MeteredDDPStrategy()
    module = _Tiny()
    module.trainer = SimpleNamespace(state=SimpleNamespace(fn=fn))
    strategy.connect(module)
    return strategy


def test_only_a_fit_takes_the_checkpoint_s_bucket_layout(tmp_path):
    path = tmp_path / "c.ckpt"
    torch.save({DDP_BUCKETS_KEY: [[3, 2], [0]]}, path)
    fitting = _strategy_for(TrainerFn.FITTING)
    fitting.load_checkpoint(path)
    assert fitting.resume_layout == [[3, 2], [0]]
    for fn in (TrainerFn.VALIDATING, TrainerFn.TESTING, TrainerFn.PREDICTING):
        strategy = _strategy_for(fn)
        strategy.resume_layout = [[0]]  # a fit's, already handed over or not: not this run's
        strategy.load_checkpoint(path)
        assert strategy.resume_layout is None, fn


@pytest.mark.parametrize(
    "layout",
    [
        [[3, 2]],
        [[3, 2], [0, 0]],
        [[3, 2], [1]],
        [[3, 2], [0.0]],
        [[3, 2], 0],
        "0,2,3",
        [[3, 2, True]],
    ],
)
def test_a_malformed_checkpointed_bucket_layout_is_a_config_error_naming_the_key(tmp_path, layout):
    path = tmp_path / "c.ckpt"
    torch.save({DDP_BUCKETS_KEY: layout}, path)
    with pytest.raises(ConfigError, match=DDP_BUCKETS_KEY):
        _strategy_for(TrainerFn.FITTING).load_checkpoint(path)


def test_configure_ddp_hands_the_layout_over_once(monkeypatch):
    """A later fit on the same Trainer without a checkpoint starts from DDP's own buckets."""
    monkeypatch.setattr(DDPStrategy, "configure_ddp", lambda self: None)
    monkeypatch.setattr(strategies, "register_metered_ddp_hook", lambda model, state: state)
    strategy = _strategy_for(TrainerFn.FITTING)
    strategy.comm = SimpleNamespace(with_group=lambda group: None, broadcast=lambda *a, **k: None)
    strategy.model = SimpleNamespace(process_group=None, parameters=list, buffers=list)
    strategy.resume_layout = [[3, 2], [0]]
    strategy.configure_ddp()
    assert strategy.grad_hook_state.resume_layout == [[3, 2], [0]]
    strategy.configure_ddp()
    assert strategy.grad_hook_state.resume_layout is None
