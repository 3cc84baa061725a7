"""argparse types the benchmarks share: a bad figure is one argparse line and exit 2, never a traceback or a
measurement that silently means nothing (NaN seconds never end a loop; 0 envs or games divide by zero)."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
from pathlib import Path


def positive_integer(text: str) -> int:
    """A positive int."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def count(text: str) -> int:
    """An int >= 0 (0: the step this option asks for is not taken)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def seconds(text: str) -> float:
    """Finite seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected finite seconds > 0, got {text}")
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
