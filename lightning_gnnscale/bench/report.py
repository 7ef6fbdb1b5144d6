"""What every benchmark report shares: the command line, the machine, markdown tables."""

from __future__ import annotations

import os
import platform
import shlex
from datetime import datetime

import torch

PROGRAM = "python -m lightning_gnnscale.bench"


def command_line(argv: list[str]) -> str:
    """The exact command that produced a report, as a user would type it."""
    return f"{PROGRAM} {shlex.join(argv)}"


def environment() -> dict:
    """Date and machine facts that timings depend on."""
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def environment_lines(env: dict) -> list[str]:
    """The environment as markdown bullet lines."""
    return [
        f"- date: {env['date']}",
        f"- machine: {env['hostname']} ({env['platform']}), {env['cpu_count']} CPUs",
        f"- python {env['python']}, torch {env['torch']}",
    ]


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub markdown table as lines."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def fmt(value: float | None, digits: int = 4) -> str:
    """A number to ``digits`` significant digits; ``-`` for a missing value."""
    return "-" if value is None else f"{value:.{digits}g}"
