"""argparse types the benchmarks share: a bad figure is one argparse line and exit 2, never a traceback or a
measurement that silently means nothing (NaN seconds never end a loop; 0 envs or games divide by zero)."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
from pathlib import Path


def at_least(low: int):
    """An int >= `low`."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text}")
        return value

    return check


positive_integer = at_least(1)
count = at_least(0)
"""count: 0 means the step the option asks for is not taken."""


def seconds(text: str) -> float:
    """A measurement's length: finite, positive, at most an hour (NaN never ended a measurement loop; 0 divided by zero)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected finite seconds > 0, at most 3600, got {text}")
    return value


def minutes(text: str) -> float:
    """Finite minutes >= 0 (0: train nothing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected minutes, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected finite minutes >= 0, got {text}")
    return value


def cpu(text: str) -> int:
    """A core this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value not in allowed:
        raise argparse.ArgumentTypeError(f"expected a core this process may use ({', '.join(map(str, allowed))}), got {text}")
    return value


def commit(repo: Path):
    """A git revision of `repo` that names a commit."""

    def check(text: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}"], capture_output=True, text=True)
        if proc.returncode != 0 or text.startswith("-"):
            raise argparse.ArgumentTypeError(f"{text!r} is no commit of {repo}")
        return text

    return check
