"""The benchmark CLI end to end on tiny inputs: files written, tables well formed, bad input rejected."""

import json
import statistics
import sys

import pytest
import torch

from lightning_gnnscale.bench import main


def table_rows(markdown: str, first_header: str) -> dict[str, list[str]]:
    """Rows of the markdown table whose first header cell is ``first_header``, by first cell."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.dist
def test_compare_single_and_ddp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results"
    assert (
        main(
            [
                "compare",
                "--strategies",
                "single,ddp",
                "--epochs",
                "1",
                "--out",
                str(out),
                "--override",
                "dataset.num_nodes=300",
                "--override",
                "data.batch_size=64",
            ]
        )
        == 0
    )

    for name in ("results.md", "results.json", "accuracy_vs_time.png", "bytes_by_category.png"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert results["baseline"] == "ddp"
    assert set(results["summaries"]) == {"single", "ddp"}
    assert results["summaries"]["ddp"]["world_size"] == 2
    assert results["summaries"]["single"]["world_size"] == 1

    markdown = (out / "results.md").read_text()
    assert "python -m lightning_gnnscale.bench compare --strategies single,ddp" in markdown
    assert set(table_rows(markdown, "strategy")) == {"single", "ddp"}
    ratios = table_rows(markdown, "strategy | epoch time")
    assert set(ratios) == {"single", "ddp"}
    assert ratios["ddp"][:5] == ["1.00x"] * 5  # time, train time, bytes, modelled time, RSS


def test_sampler_tiny_graph(tmp_path):
    out = tmp_path / "sampler"
    assert (
        main(
            ["sampler", "--nodes", "4096", "--edges", "40000", "--batches", "3", "--out", str(out)]
        )
        == 0
    )

    report = json.loads((out / "sampler.json").read_text())
    assert report["graph"]["num_nodes"] == 4096
    assert report["settings"]["threads"] == 1
    for name in ("ours", "plain_torch"):
        assert report["results"][name]["seeds_per_s"] > 0
        assert report["results"][name]["edges_per_s"] > 0
    assert report["pyg"]["run"] or report["pyg"]["reason"]
    markdown = (out / "sampler.md").read_text()
    assert set(table_rows(markdown, "sampler")) >= {"ours", "plain_torch"}


def test_unknown_strategy_lists_the_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--strategies", "single,nope", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "single" in err and "ddp" in err
    assert not any(tmp_path.iterdir())  # validated before anything ran


def test_partitions_bench_writes_its_report(tmp_path):
    from lightning_gnnscale.bench.cli import main

    out = tmp_path / "partitions"
    assert (
        main(
            [
                "partitions",
                "--nodes",
                "400",
                "--batch-size",
                "32",
                "--parts",
                "2",
                "--presample-epochs",
                "2",
                "--eval-epochs",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "partitions.json").read_text())
    methods = {r["method"] for r in report["results"]}
    assert methods == {"gsplit", "node", "edge", "naive", "random"}
    assert all(0 <= r["cross_share"] <= 1 for r in report["results"])
    assert "| 2 | gsplit |" in (out / "partitions.md").read_text()


def test_e2e_tiny_writes_its_report(tmp_path, monkeypatch):
    """`bench e2e` on a tiny graph: the strategy and the hand-written loop at two dropouts, a
    profile, the table, the JSON and the PNG (no timed assertions)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GNNSCALE_MALLOC", raising=False)
    out = tmp_path / "e2e"
    argv = ["e2e", "--strategies", "single", "--nodes", "300", "--features", "8"]
    argv += ["--hidden", "8", "--batch-size", "64", "--epochs", "2", "--dropouts", "0.5,0"]
    argv += ["--profile-steps", "1", "--devices", "1", "--out", str(out)]
    assert main(argv) == 0
    for name in ("e2e.md", "e2e.json", "e2e.png"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "e2e.json").read_text())
    assert set(results["runs"]) == {"0.5", "0"}
    for runs in results["runs"].values():
        assert set(runs) == {"hand-written loop", "strategy=single"}
        for run in runs.values():
            assert len(run["epochs_s"]) == 2 and run["min_s"] <= run["median_s"]
        assert runs["strategy=single"]["eval_s"] > 0
    assert all(len(ops) > 0 for ops in results["profiles"].values())
    masks = results["masks"]
    assert masks["p"] == 0.5 and masks["shape"][1] == 8
    assert set(masks) >= {"F.dropout", "row_dropout", "speedup_median"}
    markdown = (out / "e2e.md").read_text()
    assert "python -m lightning_gnnscale.bench e2e --strategies single" in markdown
    rows = table_rows(markdown, "runner")
    assert set(rows) == {"hand-written loop", "strategy=single"}
    assert rows["hand-written loop"][2:4] == ["1.00x", "1.00x"]
    assert "DGL's loop: skipped" in markdown
    assert "Dropout masks alone (p = 0.5" in markdown
    assert f"- malloc: {results['cpu_allocator']}" in markdown
    assert results["cpu_allocator"] == ("retain" if sys.platform == "linux" else "unavailable")
    phases = table_rows(markdown, "run")
    assert set(phases) == {"strategy=single, dropout 0.5", "strategy=single, dropout 0"}
    for dropout, cells in zip(("0.5", "0"), phases.values()):
        run = results["runs"][dropout]["strategy=single"]
        assert float(cells[-1]) == pytest.approx(run["input_rows_per_epoch"] / 1e6, abs=1e-3)
        assert 0 < float(cells[2]) <= run["median_s"]  # compute is part of the training epoch


def test_e2e_link_prediction_trains_the_task_in_every_runner(tmp_path, monkeypatch):
    """`bench e2e --task link_prediction`: the hand-written loop's first step has the loss of
    `single`'s module on the same batch (the task's pair loss, not cross-entropy), and the
    report names the task and carries the strategy's best validation MRR."""
    from lightning_gnnscale.bench.e2e import E2ESettings, HandLoop, compose_run
    from lightning_gnnscale.preflight import validate
    from lightning_gnnscale.run import build_datamodule

    monkeypatch.chdir(tmp_path)
    settings = E2ESettings(nodes=300, features=8, hidden=8, batch_size=64, task="link_prediction")
    cfg = compose_run(settings, "single", 0.0, tmp_path)
    loop = HandLoop(cfg)
    dm = build_datamodule(validate(cfg))
    batch = dm.make_batch(0, 0)
    net = dm.build_model(validate(cfg).model)
    net.load_state_dict(loop.net.state_dict())
    want = dm.task.loss_sum(net(batch.blocks, batch.x), batch.y) / batch.global_seed_count
    assert batch.y.shape[1] == 3  # pairs: source row, destination row, label
    assert loop.step(0, 0) == pytest.approx(float(want), rel=1e-6)
    out = tmp_path / "e2e"
    argv = ["e2e", "--strategies", "single", "--nodes", "300", "--features", "8"]
    argv += ["--hidden", "8", "--batch-size", "64", "--epochs", "1", "--dropouts", "0"]
    argv += ["--profile-steps", "0", "--devices", "1", "--task", "link_prediction"]
    assert main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "e2e.json").read_text())
    assert 0 < results["runs"]["0"]["strategy=single"]["best_val_mrr"] <= 1
    assert "# bench e2e: link_prediction, sage-2" in (out / "e2e.md").read_text()


def test_unsynced_hand_loops_train_ddp_micro_batches_in_every_process(tmp_path):
    """The ceiling runner: each process trains strategy=ddp's micro-batches of its rank; an
    epoch lasts as long as its slowest process."""
    from lightning_gnnscale.bench.e2e import (
        E2ESettings,
        HandLoop,
        compose_run,
        pinned_threads,
        run_unsynced_hand_loops,
    )
    from lightning_gnnscale.preflight import validate
    from lightning_gnnscale.run import build_datamodule

    settings = E2ESettings(nodes=300, features=8, hidden=8, batch_size=64)
    single_cfg = compose_run(settings, "single", 0.5, tmp_path)
    ddp = build_datamodule(validate(compose_run(settings, "ddp", 0.5, tmp_path)))
    ddp.rank, ddp.world_size = 1, 2  # what setup_rank gives rank 1 of 2
    loop = HandLoop(single_cfg, rank=1, world_size=2)
    for step in range(loop.steps):
        got, want = loop.batcher[1, step], ddp.make_batch(1, step)
        assert torch.equal(got.blocks[0].src_ids, want.blocks[0].src_ids)
        assert torch.equal(got.y, want.y) and got.global_seed_count == want.global_seed_count
    with pinned_threads(1):
        result = run_unsynced_hand_loops(single_cfg, epochs=2, world_size=2)
    assert result["world_size"] == 2 and len(result["epochs_s"]) == 2
    assert 0 < result["min_s"] <= result["median_s"]


def test_e2e_rejects_a_bad_dropout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["e2e", "--dropouts", "0.5,1.5", "--out", str(tmp_path)])
    assert "each must be in [0, 1)" in capsys.readouterr().err


def test_hand_loop_trains_on_the_single_strategys_batches(tmp_path):
    """The hand-written loop's batches are `single`'s: same seeds and input rows per step."""
    from lightning_gnnscale.bench.e2e import E2ESettings, HandLoop, compose_run
    from lightning_gnnscale.preflight import validate
    from lightning_gnnscale.run import build_datamodule

    settings = E2ESettings(nodes=300, features=8, hidden=8, batch_size=64)
    cfg = compose_run(settings, "single", 0.5, tmp_path)
    loop = HandLoop(cfg)
    reference = build_datamodule(validate(cfg))
    for step in range(loop.steps):
        got, want = loop.batcher[1, step], reference.make_batch(1, step)
        assert torch.equal(got.blocks[0].src_ids, want.blocks[0].src_ids)
        assert torch.equal(got.y, want.y)
    losses = [loop.step(0, s) for s in range(loop.steps)]
    assert all(loss > 0 for loss in losses)


def test_bench_cluster_reports_steady_and_whole_run_speedups(tmp_path, monkeypatch):
    """Each run's steady epochs (median after the warm-up) and its whole fit
    (``train_time_s`` / epochs) give two speed-ups; a kept run is read back, and one recorded
    before the whole-run figure existed is run again. The cluster job is replaced by
    summaries made up here: a "prefetching" system whose first epoch carries the run's work."""
    import lightning_gnnscale.bench.cluster as bench_cluster

    histories = {  # strategy -> (train_epoch_s of each epoch, train_time_s)
        "strategy=bytegnn": ([3.0, 0.1, 0.1], 3.6),
        "strategy=distdgl": ([1.0, 0.8, 0.9], 3.0),
    }
    calls = []

    def fake_run_job(job, strategy="strategy=bytegnn"):
        strategy = job.overrides[0] if job is not None else strategy
        calls.append(strategy)
        times, fit_s = histories[strategy]
        return [
            {
                "history": [{"train_epoch_s": t} for t in times],
                "train_time_s": fit_s,
                "epochs": len(times),
                "modeled_comm_time_s": 0.01,
                "inter_server_bytes_per_epoch": 1e6,
                "world_size": 2,
                "train_loss": 1.0,
            }
        ]

    monkeypatch.setattr(bench_cluster, "run_job", fake_run_job)
    settings = bench_cluster.ClusterBenchConfig(
        pairs=(("bytegnn", "distdgl"),), rates=(None,), epochs=3
    )
    result = bench_cluster.run_cluster_bench(settings, tmp_path, ["cluster"])
    (row,) = result["rows"]
    steady = {k: statistics.median(v[0][1:]) for k, v in histories.items()}
    whole = {k: v[1] / len(v[0]) for k, v in histories.items()}
    assert row["speedup"] == pytest.approx(steady["strategy=distdgl"] / steady["strategy=bytegnn"])
    assert row["run_speedup"] == pytest.approx(
        whole["strategy=distdgl"] / whole["strategy=bytegnn"]
    )
    markdown = (tmp_path / "cluster.md").read_text()
    assert f"**{row['run_speedup']:.2f}x**" in markdown and "speed-up (whole run)" in markdown
    assert len(calls) == 2
    bench_cluster.run_cluster_bench(settings, tmp_path, ["cluster"])
    assert len(calls) == 2  # both kept
    # records from before the whole-run figure: completed from the run's kept summary.json,
    # or, without one, run again
    for variant, summary in (("bytegnn", True), ("distdgl", False)):
        run_dir = tmp_path / "runs" / f"{variant}@unlimited"
        record = json.loads((run_dir / "record.json").read_text())
        del record["run_epoch_s"]
        (run_dir / "record.json").write_text(json.dumps(record))
        if summary:
            (run_dir / "job").mkdir(parents=True)
            (run_dir / "job" / "summary.json").write_text(json.dumps(fake_run_job(None)[0]))
    calls.clear()
    again = bench_cluster.run_cluster_bench(settings, tmp_path, ["cluster"])
    assert calls == ["strategy=distdgl"]
    assert again["rows"][0]["run_speedup"] == pytest.approx(row["run_speedup"])
    # a failed run is kept as failed: not run again on every call
    run_dir = tmp_path / "runs" / "bytegnn@unlimited"
    record = json.loads((run_dir / "record.json").read_text())
    record.update(error="timed out", epoch_s=None, run_epoch_s=None)
    del record["run_epoch_s"]
    (run_dir / "record.json").write_text(json.dumps(record))
    calls.clear()
    failed = bench_cluster.run_cluster_bench(settings, tmp_path, ["cluster"])
    assert calls == [] and failed["rows"][0]["error"] == "timed out"
    # a run measured before each host had cores of its own (no host_cpus) is run again
    run_dir = tmp_path / "runs" / "distdgl@unlimited"
    record = json.loads((run_dir / "record.json").read_text())
    del record["host_cpus"]
    (run_dir / "record.json").write_text(json.dumps(record))
    calls.clear()
    bench_cluster.run_cluster_bench(settings, tmp_path, ["cluster"])
    assert calls == ["strategy=distdgl"]


def test_cluster_task_is_checked_and_reaches_every_run(tmp_path, capsys):
    """`bench cluster --task`: an unknown task is refused with the valid ones before any
    host starts, and the task is an override of every run."""
    import lightning_gnnscale.bench.cluster as bench_cluster

    with pytest.raises(SystemExit):
        main(["cluster", "--task", "edge_regression", "--out", str(tmp_path)])
    assert "--task 'edge_regression': unknown; valid: ['link_prediction'" in capsys.readouterr().err
    settings = bench_cluster.ClusterBenchConfig(task="link_prediction")
    for variant in ("distdgl", "ddp"):
        overrides = bench_cluster.variant_overrides(settings, variant, None, tmp_path)
        assert "task=link_prediction" in overrides
