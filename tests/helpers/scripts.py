"""Run a script (``train.py``, an example) as ``python`` or ``torchrun`` would, in processes
forked from the run's warm rank server (:func:`tests.helpers.dist.warm_context`): no process
imports torch, Lightning and PyG again.

Each process adopts the given environment (``OMP_NUM_THREADS`` too, which torch read when the
server imported it), working directory and ``sys.argv``, then runs the script as ``__main__``
(``runpy``), its stdout and stderr going to files: the code of the opt-in warm server
(:func:`lightning_gnnscale.warm.run_script_here`). It also gets a rank server of its own, a
fork of itself (warm as well), so a script that launches ranks (``train.py`` with
``trainer.devices=2``) forks them from there, and they and their launcher stand as after a cold
start: the ranks' parent is the server, the server's parent is the launcher. The tests of the
launch paths themselves start the real ``python`` and ``torchrun``, at seconds of imports per
process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_gnnscale.warm import run_script_here
from tests.helpers.dist import free_port, warm_context

_STREAMS = ("stdout", "stderr")


def _run(script: str, args: list[str], cwd: str, env: dict, out_dir: str) -> None:
    """One process's job: ``python script *args`` with ``env`` in ``cwd``, as the warm server
    runs one (the same code)."""
    for fd, name in enumerate(_STREAMS, start=1):
        file = os.open(Path(out_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
    run_script_here(script, [script, *args], cwd, env)


class ScriptRun:
    """Started processes of one script run; :meth:`wait` gives their
    ``subprocess.CompletedProcess`` (the first non-zero exit code, the output of all)."""

    def __init__(self, command: list[str], processes: list, out_dir: str) -> None:
        self.command, self.processes, self.out_dir = command, processes, out_dir

    def wait(self, timeout: float) -> subprocess.CompletedProcess:
        deadline = time.monotonic() + timeout
        try:
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
            if any(process.exitcode is None for process in self.processes):
                raise subprocess.TimeoutExpired(self.command, timeout)
            codes = [process.exitcode for process in self.processes]
            text = [Path(self.out_dir, name).read_text() for name in _STREAMS]
        finally:
            for process in self.processes:
                if process.is_alive():
                    process.kill()
                process.join()
            for name in _STREAMS:
                Path(self.out_dir, name).unlink(missing_ok=True)
            os.rmdir(self.out_dir)
        code = next((code for code in codes if code != 0), 0)
        return subprocess.CompletedProcess(self.command, code, *text)


def start_script(
    script: str | Path,
    *args: str,
    cwd: str | Path,
    env: dict[str, str] | None = None,
    nproc: int | None = None,
) -> ScriptRun:
    """Start ``python script *args`` in ``cwd`` with ``env`` (default: this process's), or with
    ``nproc``, ``torchrun --nproc_per_node nproc script *args`` (ranks on 127.0.0.1)."""
    env = dict(os.environ if env is None else env)
    script = str(Path(cwd, script).resolve())
    command = [sys.executable, script, *args]
    rank_envs = [env]
    if nproc is not None:
        command[1:1] = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it for several ranks
        world = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0"}
        world |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        rank_envs = [
            {**env, **world, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(nproc)
        ]
    out_dir = tempfile.mkdtemp(prefix="script-")
    context = warm_context()
    processes = [
        context.Process(target=_run, args=(script, list(args), str(cwd), rank_env, out_dir))
        for rank_env in rank_envs
    ]
    for process in processes:
        process.start()
    return ScriptRun(command, processes, out_dir)


def run_script(*args, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """:func:`start_script`, waited for (``subprocess.TimeoutExpired`` after ``timeout`` s)."""
    return start_script(*args, **kwargs).wait(timeout)
