"""The GPU check (issue 26): every strategy on CUDA, the CUDA tests, and ``bench e2e`` on CUDA.

Run through ``scripts/gpu_check.sh OUT`` (which installs what is missing). Steps:

0. the fork probe: a fresh interpreter imports the rank server's modules, forks, and the child
   initialises CUDA. The servers' modules on a GPU machine (``launch.CUDA_SAFE_PRELOAD``, and
   ``warm.preload()``) must leave the child able to; the full list (``RANK_SERVER_PRELOAD``,
   PyG included) is probed for the record (docs/architecture.md, "Launching");
1. every strategy for 2 epochs on a small ``sbm`` in float64 with dropout 0, on CUDA with 1 rank
   and with 2 ranks, and the same 2-rank run on the CPU: a CUDA run must give the CPU run's
   losses (relative difference <= ``--rtol``), which extends the suite's CPU exactness tests
   (every system against ``single``) to CUDA. Two ranks on one GPU run as two one-rank "nodes"
   (``NODE_RANK`` 0 and 1, ``trainer.num_nodes=2``) over gloo, which handles CUDA tensors
   where it can; NCCL needs one GPU per rank. The CPU twin uses the same layout;
2. the ``gpu``-marked tests (``pytest -m gpu``);
3. ``bench e2e`` with ``--accelerator gpu``: ``single`` against the hand-written loop on the
   same batches, on CUDA.

Writes ``gpu_check.json`` and ``gpu_check.md`` into OUT; every run's log stays under
``OUT/runs``. Exits 0 when every step ran (a strategy that fails is a row, not a crash).
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SBM = ("dataset=sbm", "dataset.num_nodes=4000", "dataset.num_features=32")


def strategies() -> list[str]:
    """Every strategy name that ``train.py strategy=<name>`` accepts (the registry's; the
    package import is torch-free)."""
    sys.path.insert(0, str(REPO))
    from lightning_gnnscale.systems.registry import SYSTEMS

    return sorted(SYSTEMS)


_PORTS = iter(range(29600, 40000, 7))  # one per 2-rank run: ports the kernel picked raced
_PORTS_LOCK = threading.Lock()


def free_port() -> int:
    """A port no other run of this check uses, and free now."""
    with _PORTS_LOCK:
        for port in _PORTS:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port left in 29600-40000")


def error_line(log: str) -> str:
    """The most telling line of a failed run's output: the last exception line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line or "error:" in line:
            return line[:400]
    return (lines[-1] if lines else "no output")[:400]


def run_job(strategy: str, accelerator: str, ranks: int, out: Path, timeout_s: float) -> dict:
    """One ``train.py`` run (two launchers for 2 ranks); its result row."""
    name = f"{strategy}-{accelerator}-{ranks}r"
    run_dir = out / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"strategy={strategy}",
        "model=gcn",  # the one model every system trains (SANCUS and CAGNET: GCN only)
        *SBM,
        "trainer.max_epochs=2",
        "dtype=float64",
        "model.dropout=0.0",
        f"trainer.accelerator={accelerator}",
        "trainer.devices=1",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"launcher.timeout_s={int(timeout_s)}",
        "launcher.collective_timeout_s=60",
        f"hydra.run.dir={run_dir}",
        f"paths.cache_dir={out / 'cache'}",
    ]
    env = {**os.environ, "GNNSCALE_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    if ranks == 1:
        overrides.append("topology.servers=1")  # GraNNDIS presets default to 2 servers
    else:
        overrides += [f"trainer.num_nodes={ranks}", "trainer.process_group_backend=gloo"]
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, str(REPO / "train.py"), *overrides]
    start = time.perf_counter()
    procs = []
    for node in range(ranks):
        log = open(run_dir / f"node{node}.log", "w")  # noqa: SIM115 (closed below)
        procs.append(
            (
                subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    env={**env, "NODE_RANK": str(node)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - start))))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append("timeout")
        log.close()
    if "timeout" in codes:  # say so rather than quote whatever line the run had reached
        return {
            "strategy": strategy,
            "accelerator": accelerator,
            "ranks": ranks,
            "ok": False,
            "exit_codes": codes,
            "error": f"did not finish within {timeout_s:.0f} s (killed)",
        }
    row = {
        "strategy": strategy,
        "accelerator": accelerator,
        "ranks": ranks,
        "ok": all(code == 0 for code in codes),
        "exit_codes": codes,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    summary = run_dir / "summary.json"
    if row["ok"] and summary.exists():
        metrics = json.loads(summary.read_text())
        row.update(
            losses=[h["train_loss"] for h in metrics["history"]],
            best_val_acc=metrics["best_val_acc"],
            train_epoch_time_s=metrics["train_epoch_time_s"],
            world_size=metrics["world_size"],
        )
    elif row["ok"]:
        row.update(ok=False, error="no summary.json")
    else:
        logs = [(run_dir / f"node{n}.log").read_text(errors="replace") for n in range(ranks)]
        row["error"] = " | ".join(dict.fromkeys(error_line(log) for log in logs))
    print(f"[gpu-check] {name}: {'ok' if row['ok'] else row.get('error')}", flush=True)
    return row


FORK_PROBE = r"""
import importlib, os, sys
import torch
for module in sys.argv[1:]:
    importlib.import_module(module)
pid = os.fork()
if pid == 0:
    try:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    except Exception as error:
        print(f"{type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
        os._exit(3)
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def fork_probe() -> dict:
    """Whether a child forked after importing each preload list can initialise CUDA: the rank
    server's and the warm server's on a GPU machine (both must), and the full list."""
    from lightning_gnnscale import warm
    from lightning_gnnscale.launch import CUDA_SAFE_PRELOAD, RANK_SERVER_PRELOAD

    def probe(modules: tuple[str, ...]) -> dict:
        row = {"modules": list(modules)}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", FORK_PROBE, *modules],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
        except subprocess.TimeoutExpired:
            return {**row, "child_uses_cuda": False, "error": "did not finish within 120 s"}
        row["child_uses_cuda"] = proc.returncode == 0
        if proc.returncode != 0:
            row["error"] = error_line(proc.stdout + proc.stderr)
        return row

    lists = {
        "cuda_safe_preload": CUDA_SAFE_PRELOAD,
        "warm_server_preload": warm.preload(),
        "rank_server_preload": RANK_SERVER_PRELOAD,
    }
    with futures.ThreadPoolExecutor(len(lists)) as pool:
        rows = dict(zip(lists, pool.map(probe, lists.values())))
    for name, row in rows.items():
        print(f"[gpu-check] fork probe, {name}: {row.get('error', 'child uses CUDA')}", flush=True)
    return rows


def compare(gpu: dict, cpu: dict | None, rtol: float) -> str:
    """``equal`` when the CUDA run's losses match the CPU run's, else why not."""
    if not gpu["ok"]:
        return "-"
    if cpu is None or not cpu["ok"]:
        return "no CPU run to compare"
    a, b = gpu["losses"], cpu["losses"]
    worst = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))
    return f"equal (rel {worst:.1e})" if worst <= rtol else f"DIFFERS (rel {worst:.1e})"


def run_matrix(out: Path, jobs: int, timeout_s: float, rtol: float, budget_s: float) -> list[dict]:
    """Every strategy's runs, ``jobs`` at a time; a run not started within ``budget_s`` is a
    row that says so (the whole check must fit a short GPU lease)."""
    names = strategies()
    plan = [("single", "cpu", 1)]
    for s in names:  # each 2-rank CUDA run beside its CPU twin, then the 1-rank CUDA runs
        plan += [] if s == "single" else [(s, "gpu", 2), (s, "cpu", 2)]
    plan += [(s, "gpu", 1) for s in names]
    deadline = time.monotonic() + budget_s

    def job(spec: tuple) -> dict:
        left = deadline - time.monotonic()
        if left < 30:
            strategy, accelerator, ranks = spec
            row = {"strategy": strategy, "accelerator": accelerator, "ranks": ranks, "ok": False}
            return {**row, "error": f"not run: the check's --budget-s {budget_s:g} was spent"}
        return run_job(*spec, out, min(timeout_s, left))

    with futures.ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(job, plan))
    by_key = {(r["strategy"], r["accelerator"], r["ranks"]): r for r in rows}
    table = []
    for s in names:
        one, two = by_key[(s, "gpu", 1)], by_key.get((s, "gpu", 2))
        cpu_one = by_key.get((s, "cpu", 1))
        table.append(
            {
                "strategy": s,
                "gpu_1_rank": one,
                "gpu_2_ranks": two,
                "cpu_2_ranks": by_key.get((s, "cpu", 2)),
                "gpu_1_vs_cpu": compare(one, cpu_one, rtol) if cpu_one else None,
                "gpu_2_vs_cpu": compare(two, by_key.get((s, "cpu", 2)), rtol) if two else None,
            }
        )
    return table


def run_step(cmd: list[str], log: Path, timeout_s: float) -> dict:
    start = time.perf_counter()
    with open(log, "w") as f:
        try:
            code = subprocess.run(
                cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    text = log.read_text(errors="replace")
    tail = [line for line in text.splitlines() if line.strip()][-3:]
    print(f"[gpu-check] {' '.join(cmd[2:5])}: exit {code}", flush=True)
    return {"exit_code": code, "wall_s": round(time.perf_counter() - start, 1), "tail": tail}


def cell(row: dict | None) -> str:
    if row is None:
        return "n/a"
    if row["ok"]:
        return f"runs ({row['train_epoch_time_s']:.3f} s/epoch)"
    return f"fails: {row['error']}"


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "# GPU check",
        "",
        f"Device: {env['device']} ({env['torch']}, CUDA {env['cuda']}); {env['date']}.",
        f"Command: `{result['command']}`",
        "",
        "Every strategy: 2 epochs, GCN, sbm 4,000 nodes, float64, dropout 0. "
        "2 ranks on one GPU = two one-rank nodes over gloo. 'vs CPU': the CUDA run's losses "
        f"against the same run on the CPU (relative tolerance {result['rtol']:g}).",
        "",
        "| strategy | CUDA, 1 rank | CUDA, 2 ranks | 1 rank vs CPU | 2 ranks vs CPU |",
        "|---|---|---|---|---|",
    ]
    probes = [
        f"- fork probe, {key} ({', '.join(row['modules'])}): "
        + ("the child uses CUDA" if row["child_uses_cuda"] else f"**fails**: {row['error']}")
        for key, row in result["fork_probe"].items()
    ]
    lines[-3:-3] = [*probes, ""] if probes else []
    for r in result["strategies"]:
        lines.append(
            f"| {r['strategy']} | {cell(r['gpu_1_rank'])} | {cell(r['gpu_2_ranks'])} "
            f"| {r['gpu_1_vs_cpu'] or '-'} | {r['gpu_2_vs_cpu'] or '-'} |"
        )
    tests = result["pytest_gpu"]
    lines += ["", f"`pytest -m gpu`: exit {tests['exit_code']}; {' / '.join(tests['tail'])}"]
    e2e = result["bench_e2e"]
    lines += ["", f"`bench e2e --accelerator gpu`: exit {e2e['exit_code']}"]
    md = Path(result["out"]) / "e2e" / "e2e.md"
    if md.exists():
        lines += ["", md.read_text()]
    return "\n".join(lines) + "\n"


def environment() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "gpus": torch.cuda.device_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=12, help="train.py runs at once")
    parser.add_argument("--timeout-s", type=float, default=150, help="per run")
    parser.add_argument("--budget-s", type=float, default=300, help="for all strategy runs")
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["fork-probe", "matrix", "pytest", "e2e"]
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "environment": environment(),
        "rtol": args.rtol,
        "out": str(out),
    }
    print(f"[gpu-check] {result['environment']}", flush=True)
    skip = set(args.skip)
    result["fork_probe"] = {} if "fork-probe" in skip else fork_probe()
    result["strategies"] = (
        []
        if "matrix" in skip
        else run_matrix(out, args.jobs, args.timeout_s, args.rtol, args.budget_s)
    )
    py = sys.executable
    result["pytest_gpu"] = (
        {"exit_code": "skipped", "tail": []}
        if "pytest" in skip
        else run_step(
            [py, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider"],
            out / "pytest_gpu.log",
            90,
        )
    )
    result["bench_e2e"] = (
        {"exit_code": "skipped", "tail": []}
        if "e2e" in skip
        else run_step(
            [
                py,
                "-m",
                "lightning_gnnscale.bench",
                "e2e",
                "--accelerator",
                "gpu",
                "--strategies",
                "single",
                "--epochs",
                "3",
                "--dropouts",
                "0.5",
                "--profile-steps",
                "0",
                "--out",
                str(out / "e2e"),
            ],
            out / "bench_e2e.log",
            120,
        )
    )
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "gpu_check.md").write_text(markdown(result))
    print(f"[gpu-check] wrote {out / 'gpu_check.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
