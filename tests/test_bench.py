"""The benchmark CLI end to end on tiny inputs: files written, tables well formed, bad input rejected."""

import json

import pytest

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
