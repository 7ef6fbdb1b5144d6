"""ByteGNN over several gloo ranks: the socket graph store serves exactly the reference blocks,
every seed is delivered once, the transport's bytes are counted, and failures (a dead peer, a
task that raises inside a Lightning fit) end with a clear error and no leftover threads."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
import threading
import time
from collections import Counter

import lightning as L
import pytest
import torch

from lightning_gnnscale.comm import Comm, CommMeter, Topology
from lightning_gnnscale.comm.transport import SocketTransport
from lightning_gnnscale.config_types import DataConfig, RunFacts
from lightning_gnnscale.errors import ConfigError
from lightning_gnnscale.graph.book import PartitionBook, build_local_partition, relabel_graph
from lightning_gnnscale.graph.generators import sbm
from lightning_gnnscale.graph.partition import partition
from lightning_gnnscale.graph.sampler import NeighborSampler
from lightning_gnnscale.graph.seed_split import SeedSplit
from lightning_gnnscale.models.module import GNNModule
from lightning_gnnscale.preflight import validate
from lightning_gnnscale.run import build_datamodule, build_strategy, train
from lightning_gnnscale.store_secret import read_secret
from lightning_gnnscale.systems.bytegnn.address import service_address
from lightning_gnnscale.systems.bytegnn.config import ByteGNNConfig, DagConfig, SchedulerConfig
from lightning_gnnscale.systems.bytegnn.store import GraphStore
from lightning_gnnscale.systems.bytegnn.sworker import SamplingError, SWorker
from tests.helpers.config import make_cfg
from tests.helpers.dist import run_distributed

FANOUTS = [4, 3]
SEED = 5


def _graph(world_size):
    """The relabelled graph, its targets in gids and the book."""
    dataset = sbm(num_nodes=500, num_classes=4, avg_degree=7.0, num_features=6, seed=3)
    parts = partition(dataset.graph, "random", world_size, seed=1)
    book = PartitionBook.from_parts(parts, world_size)
    return relabel_graph(dataset.graph, book), dataset.targets.rows(book.new2old), book


def _service(rank, world_size, threads, before_task=None, timeout_s=30.0):
    graph, targets, book = _graph(world_size)
    meter = CommMeter()
    comm = Comm.create(meter, Topology(world_size, world_size), timeout_s=timeout_s)
    local = build_local_partition(graph, targets, book, rank)
    store = GraphStore(local, book, graph.in_degree(), None)
    transport = SocketTransport(rank, comm.topology, timeout_s, read_secret())
    transport.start(store.serve, comm, store.request_bytes, store.max_in_degree)
    store.transport = transport
    split = SeedSplit(targets.train.nonzero().flatten(), world_size, rank, 60, SEED)
    worker = SWorker(
        store,
        split,
        FANOUTS,
        SEED,
        DagConfig(nsc_tasks=3, ff_tasks=2),
        SchedulerConfig(),
        threads,
        timeout_s,
        cpu_percent=lambda: 50.0,
        before_task=before_task,
    )
    return graph, targets, book, comm, meter, transport, worker


def _bytegnn_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("bytegnn-") and t.is_alive()]


def _exactly_once_rank(rank, world_size):
    jitter = random.Random(rank)
    graph, targets, book, comm, meter, transport, worker = _service(
        rank, world_size, threads=2, before_task=lambda t: time.sleep(jitter.random() * 0.002)
    )
    reference = NeighborSampler(graph.indptr, graph.indices, FANOUTS, seed=SEED)
    worker.last_epoch = 1
    worker.start()
    seeds, mismatches, remote_rows, remote_seeds = [], 0, 0, 0
    for epoch in range(2):
        for step in range(worker.split.steps):
            batch = worker.take(epoch, step)
            expected = reference.sample(worker.split.seeds(epoch, step), epoch, step)
            for got, want in zip(batch.blocks, expected, strict=True):
                same = torch.equal(got.src_ids, want.src_ids) and torch.equal(
                    got.edge_index, want.edge_index
                )
                mismatches += not same
            mismatches += not torch.equal(batch.x, graph.x[expected[0].src_ids])
            mismatches += not torch.equal(batch.y, targets.target[batch.blocks[-1].dst_ids])
            seeds.append(batch.blocks[-1].dst_ids)
            remote_rows += int((book.nid2part(expected[0].src_ids) != rank).sum())
            remote_seeds += int((book.nid2part(batch.blocks[-1].dst_ids) != rank).sum())
    comm.barrier()  # every rank has taken its last batch: no request is still on its way
    worker.stop()
    transport.flush(meter)
    snapshot = meter.snapshot()
    comm.barrier()
    transport.close()
    return {
        "seeds": torch.cat(seeds).tolist(),
        "mine": worker.split.mine.tolist(),
        "steps": worker.split.steps,
        "mismatches": mismatches,
        "remote": (remote_rows, remote_seeds),
        "bytes": snapshot["category_link_bytes"],
        "threads": _bytegnn_threads(),
        "row_bytes": graph.x.shape[1] * graph.x.element_size(),
    }


@pytest.mark.dist
def test_three_ranks_deliver_the_reference_blocks_and_every_seed_once():
    results = run_distributed(_exactly_once_rank, 3, timeout_s=120)
    train = torch.cat([torch.tensor(r["mine"]) for r in results])
    assert len({r["steps"] for r in results}) == 1
    for r in results:
        assert r["mismatches"] == 0
        assert Counter(r["seeds"]) == Counter(r["mine"] * 2)  # two epochs, each seed once
        assert r["threads"] == []
    assert Counter(train.tolist()) == Counter(_graph(3)[1].train.nonzero().flatten().tolist())
    # every remote input row and seed target row was answered by its owner, and counted there
    row_bytes = results[0]["row_bytes"]
    expected = sum(r["remote"][0] * row_bytes + r["remote"][1] * 8 for r in results)
    assert sum(r["bytes"]["feature"]["intra_server"] for r in results) == expected
    assert all(r["bytes"]["feature"]["inter_server"] == 0 for r in results)
    assert all(r["bytes"]["structure"]["intra_server"] > 0 for r in results)
    assert all(r["bytes"]["gradient"]["intra_server"] == 0 for r in results)


def _dead_peer_rank(rank, world_size, out_dir):
    _, _, _, comm, _, transport, worker = _service(rank, world_size, threads=2, timeout_s=20.0)
    comm.barrier()
    if rank == 1:
        os.kill(os.getpid(), 9)  # dies without closing anything
    worker.start()
    start, message = time.monotonic(), "no error"
    try:
        for epoch in range(1000):
            for step in range(worker.split.steps):
                worker.take(epoch, step)
    except SamplingError as exc:
        message = str(exc)
    elapsed = time.monotonic() - start
    worker.stop()
    transport.close()
    with open(os.path.join(out_dir, "rank0.txt"), "w") as f:
        f.write(f"{elapsed}\n{_bytegnn_threads()}\n{message}")
    return message


@pytest.mark.dist
def test_a_dead_peer_ends_sampling_with_an_error_that_names_it(tmp_path):
    with pytest.raises(RuntimeError, match="rank 1"):  # the harness reports the killed rank
        run_distributed(_dead_peer_rank, 2, str(tmp_path), timeout_s=90)
    elapsed, threads, message = (tmp_path / "rank0.txt").read_text().split("\n", 2)
    assert float(elapsed) < 20.0  # well within the transport's timeout
    assert threads == "[]"
    assert "to rank 1" in message and "failed" in message, message


# --------------------------------------------------------------------- through Lightning


class _RaisingModule(GNNModule):
    """Raises in rank 0's training step of epoch 1, while later DAGs are in flight."""

    def training_step(self, batch, batch_idx):
        if self.global_rank == 0 and self.current_epoch == 1 and batch_idx == 1:
            raise ValueError("injected trainer fault")
        return super().training_step(batch, batch_idx)


def _failing_fit_rank(rank, world_size, run, dm, where):
    os.environ.update(
        LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1"
    )
    L.seed_everything(run.seed, verbose=False)
    setup_rank = dm.setup_rank

    def explode(task):
        if rank == 0 and task.kind == "ff" and task.dag.name.startswith("epoch 1"):
            raise ValueError("injected")

    def setup_with_fault(context, part):
        setup_rank(context, part)
        if where == "task":
            dm.sworker.executor.before_task = explode

    dm.setup_rank = setup_with_fault
    net = dm.build_model(run.model)
    module_type = _RaisingModule if where == "trainer" else GNNModule
    module = module_type(net, run.model.optimizer, run.model.lr, run.model.weight_decay)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=build_strategy(run),
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    start = time.monotonic()
    try:
        trainer.fit(module, datamodule=dm)
        outcome = "finished"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return outcome, time.monotonic() - start, _bytegnn_threads()


@pytest.mark.dist
@pytest.mark.parametrize("where", ["task", "trainer"])
def test_a_raising_task_or_trainer_fails_the_fit_clearly_and_leaves_no_threads(tmp_path, where):
    """A sampling task, or the trainer itself mid-epoch with DAGs in flight, raises on rank 0:
    both ranks end well within the timeout, rank 0 with that error, and no thread is left."""
    run = validate(
        make_cfg(
            tmp_path,
            "strategy=bytegnn",
            "model=gcn",
            "launcher.collective_timeout_s=20",
            "data.batch_size=16",  # several steps per epoch
        )
    )
    dm = build_datamodule(run)
    dm.prepare(2)
    results = run_distributed(_failing_fit_rank, 2, run, dm, where, timeout_s=150)
    outcome = results[0][0]
    if where == "task":
        assert outcome.startswith("SamplingError") and "ff[hop" in outcome, outcome
        assert "(epoch 1, step" in outcome and "injected" in outcome, outcome
    else:
        assert outcome == "ValueError: injected trainer fault", outcome
    assert results[1][0] != "finished"  # the peer's all-reduce fails instead of waiting forever
    for _, seconds, left in results:
        assert left == []
        assert seconds < 60


@pytest.mark.e2e
def test_bytegnn_trains_end_to_end_with_gat_and_a_clean_audit(tmp_path):
    """audit=true: every torch.distributed call is metered, and the socket bytes declared to
    the audit (comm.audit.declare_transport_bytes) match what the meter counted."""
    metrics, _ = train(
        make_cfg(tmp_path, "strategy=bytegnn", "model=gat", "model.heads=2", "audit=true")
    )
    assert metrics["strategy"] == "bytegnn" and metrics["world_size"] == 2
    per_epoch = metrics["comm_bytes_per_epoch"]
    assert per_epoch["structure"] > 0 and per_epoch["feature"] > 0 and per_epoch["gradient"] > 0
    system = metrics["system"]
    assert system["seeds_per_s"] > 0 and 0 <= system["wait_fraction"] <= 1
    assert len(system["epochs"]) == 2 and system["trajectory"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("strategy.partition.method=spectral", "valid:"),
        ("+strategy.partition.options.ufactor=3", "not options of"),
        ("+strategy.partition.options.weights=[0.5,0.5,0.5]", "partition.options: .*weights"),
        ("+strategy.partition.options.hops=0", "partition.options: .*hops"),
        ("+strategy.partition.options.order=sideways", "partition.options: .*order"),
        ("strategy.dag.mode=unsupervised", "valid:"),
        ("strategy.dag.nsc_tasks=0", "nsc_tasks"),
        ("strategy.scheduler.max_inflight=0", "max_inflight"),
        ("strategy.sampling_threads=0", "sampling_threads"),
        ("data.num_workers=1", "data.num_workers=0"),
        # issue 24 item 3: settings that exhaust the machine, refused with their bound
        (
            "strategy.sampling_threads=100000",
            r"sampling_threads=100000 exceeds 4 x \d+ usable cores = \d+ threads per rank; set "
            "launcher.allow_oversubscribe=true",
        ),
        ("strategy.dag.nsc_tasks=1000000", r"nsc_tasks=1000000 must be <= 4096"),
        ("strategy.dag.nsc_tasks=40", r"nsc_tasks=40 must be <= the seeds per step \(32,"),
        ("strategy.dag.ff_tasks=65", r"ff_tasks=65 must be <= the seeds per step \(64,"),
        ("strategy.scheduler.sleep_ms=1e9", r"sleep_ms=1000000000.0 must be in \(0, 1000\]"),
        ("strategy.scheduler.cpu_window_ms=5", "cpu_window_ms=5.0 must be in"),
        ("strategy.scheduler.prefetch_mb=0", "prefetch_mb=0.0 must be > 0"),
        # issue 24 item 5 / issue 22 item 14: strategy.host
        ("strategy.host=localhost", "strategy.host='localhost' is not an IP address"),
        ("strategy.host=999.1.1.1", "strategy.host='999.1.1.1' is not an IP address"),
        ("strategy.host=8.8.8.8", "strategy.host='8.8.8.8' cannot be listened on here"),
        ("strategy.host='::1'", "strategy.host='::1': .*IPv4 only"),
    ],
)
def test_bad_settings_fail_at_config_time_naming_the_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "strategy=bytegnn", "data.batch_size=64", override))


def test_an_explicit_host_is_refused_for_several_nodes(monkeypatch):
    """One address cannot be every node's: a multi-node run leaves strategy.host null."""
    monkeypatch.setenv("GNNSCALE_STORE_SECRET", "the user's secret on every node")
    config = ByteGNNConfig(host="127.0.0.1")
    run = RunFacts(world_size=4, devices=2, num_nodes=2, data=DataConfig(batch_size=64))
    with pytest.raises(ConfigError, match="one address for ranks on 2 nodes"):
        config.check_run(run)
    ByteGNNConfig().check_run(run)  # null: every rank chooses its own


def _non_loopback_ipv4():
    import psutil

    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family == socket.AF_INET and not entry.address.startswith("127."):
                return entry.address
    return None


def test_each_rank_publishes_the_address_its_peers_reach_it_by():
    """Chosen as gloo chooses: GLOO_SOCKET_IFNAME's address, else the local end of the route
    to MASTER_ADDR. A single-node run (MASTER_ADDR loopback) publishes 127.0.0.1; a rank whose
    master is reached over a real interface publishes that interface's address, not
    loopback (the old default published 127.0.0.1 to every peer)."""
    assert service_address(None, {"MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    assert service_address(None, {}) == "127.0.0.1"
    assert service_address(None, {"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    assert service_address("127.0.0.1", {"MASTER_ADDR": "10.0.0.1"}) == "127.0.0.1"
    with pytest.raises(ConfigError, match="GLOO_SOCKET_IFNAME='nosuch0' names no interface"):
        service_address(None, {"GLOO_SOCKET_IFNAME": "nosuch0"})
    address = _non_loopback_ipv4()
    assert address is not None, "this test needs a machine with a non-loopback IPv4 address"
    chosen = service_address(None, {"MASTER_ADDR": address})
    assert chosen == address and not ipaddress.ip_address(chosen).is_loopback
