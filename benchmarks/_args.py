"""argparse types the benchmarks share: a bad figure is one argparse line and exit 2, never a traceback or a
measurement that silently means nothing (NaN seconds never end a loop; 0 envs or games divide by zero; a seed of
-1 failed each side in numpy). Every numeric option of a benchmark takes one of these (tests/test_benchmarks.py
checks that none is a bare int or float)."""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpcrl.config.limits import MAX_RUNS, MAX_SEED  # noqa: E402  # hpcrl's own bounds; no dependency (other venvs parse these too)


def shown(text: str) -> str:
    """An argument as a refusal quotes it: as typed, or escaped where it would break the one line (a line break)."""
    return text if text.isprintable() else repr(text)


def integer(low: int, high: int | None = None, what: str = "an integer"):
    """An int >= `low` (and <= `high`, where given)."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what} >= {low}, got {shown(text)}" if high is None else f"expected {what} in [{low}, {high}], got {shown(text)}")
        return value

    return check


positive_integer = integer(1)
count = integer(0)
"""count: 0 means the step the option asks for is not taken."""
seed = integer(0, MAX_SEED, "a seed")
"""A seed as hpcrl's configs take it (sweep.seeds): numpy's legacy seeding, which gymnasium and SB3 use, takes no other."""
runs = integer(1, MAX_RUNS, "a number of runs")
"""Runs of a made-up experiment: at most what one sweep may have (a typo must not fill the disk)."""


def positive_number(text: str) -> float:
    """A finite number > 0 (a factor, a fraction, a timeout)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {shown(text)}")
    return value


def device(text: str) -> str:
    """Where a benchmark's learners run, named as torch does: cpu, cuda or cuda:N. Not `auto`: a figure
    says which device made it."""
    if not re.fullmatch(r"cpu|cuda|cuda:[0-9]+", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {shown(text)}")
    return text


def seconds(text: str) -> float:
    """A measurement's length: finite, positive, at most an hour (NaN never ended a measurement loop; 0 divided by zero)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected finite seconds > 0, at most 3600, got {shown(text)}")
    return value


def seconds_or_zero(text: str) -> float:
    """`seconds`, or 0: the measurement is not taken."""
    try:
        zero = float(text) == 0
    except ValueError:
        zero = False
    return 0.0 if zero else seconds(text)


def minutes(text: str) -> float:
    """Finite minutes >= 0 (0: train nothing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected minutes, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected finite minutes >= 0, got {shown(text)}")
    return value


def cpu(text: str) -> int:
    """A core this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value not in allowed:
        raise argparse.ArgumentTypeError(f"expected a core this process may use ({', '.join(map(str, allowed))}), got {shown(text)}")
    return value


def experiment(parser: argparse.ArgumentParser, config: str | Path, overrides: list[str]) -> Any:
    """hpcrl's experiment of `config` with `overrides`, or the config's own refusal (an unknown key, a value out of
    range, no such file) as argparse's one line and exit 2, before a benchmark builds or measures anything."""
    from hpcrl.config.load import load_experiment  # here: other projects' venvs import this module too
    from hpcrl.config.schema import ConfigError  # here: other projects' venvs import this module too

    try:
        return load_experiment(Path(config), overrides)
    except ConfigError as exc:
        parser.error(str(exc))


def empty_folder(text: str) -> Path:
    """A folder that is new or empty: in one that holds an earlier run, `hpcrl sweep` finds its runs done, trains
    nothing, and the benchmark would print that run's figures as its own. (Made by `make_folder`.)"""
    if not text or not text.isprintable():
        raise argparse.ArgumentTypeError(f"expected a folder's path on one line, got {text!r}")
    path = Path(text)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise argparse.ArgumentTypeError(f"{text!r} is not an empty folder (in one that holds an earlier run, nothing would be trained anew)")
    return path


def make_folder(parser: argparse.ArgumentParser, path: Path, option: str) -> None:
    """Make the folder an option names, now: a path that cannot be one is argparse's one line, before minutes of
    measuring rather than after."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"argument {option}: cannot make a directory there ({exc.strerror}): {str(path)!r}")


def commit(repo: Path):
    """A git revision of `repo` that names a commit."""

    def check(text: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}"], capture_output=True, text=True)
        if proc.returncode != 0 or text.startswith("-"):
            raise argparse.ArgumentTypeError(f"{text!r} is no commit of {repo}")
        return text

    return check
