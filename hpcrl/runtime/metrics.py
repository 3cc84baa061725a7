"""The episodes a user's program already writes, read into one form: (step, return) per episode.

A program run (`algo: program`) is scored and plotted from files it writes anyway, without changing
the program (`program.metrics.source`):

- `monitor`: Stable-Baselines3's `Monitor` CSVs, as SB3 and RL Zoo write them: a `#{"t_start": ...}`
  line, a header `r,l,t`, one row per episode. A vectorised run writes one file per env; episodes
  are merged by the time each ended (t_start + t) and steps are the running sum of their lengths
  (Monitor files hold no step, so after a resume the episodes played between the checkpoint and
  the preemption stay in, and their lengths in the steps).
- `tensorboard`: event files, one scalar tag (CleanRL's `charts/episodic_return` at `global_step`),
  read with TensorBoard's own EventAccumulator. Every value is an episode, several at one step
  included (a vectorised trainer logs each env that finished at that `global_step`). Duplicates
  come from lifetimes, not steps: a resumed program opens new event files and logs again from its
  checkpoint, so what a later lifetime logged replaces the earlier lifetimes' values at and after
  the first step it logged. A file's lifetime is the run's `lifetimes` record it began after
  (rundir.lifetime_starts); without that record (files hpcrl did not supervise), each file is one.
- `csv`, `jsonl`: configured `step` and `value` columns (keys). A file appended to by several lifetimes
  holds them one after the other; each starts where the step goes down, and the same lifetime rule as
  TensorBoard's keeps the latest lifetime's episodes from the step it logged first.
- `hpcrl`: hpcrl's own train.csv, written through `hpcrl.job.log`.

Every reader drops a torn last line (a job killed mid-write), drops non-finite values, and turns
anything else wrong into a one-line MetricsError naming the file, which the eval stage writes into
EVAL_FAILED and `collect` reports by run.
"""

from __future__ import annotations

import bisect
import csv
import glob
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcrl.store import rundir

DEFAULT_PATTERNS = {"hpcrl": rundir.TRAIN_LOG, "monitor": "**/*monitor.csv", "tensorboard": "**/events.out.tfevents.*"}


class MetricsError(rundir.RunError):
    """A program's metrics cannot be read; the message says which file and what is wrong, on one line."""


@dataclass(frozen=True)
class Episodes:
    steps: np.ndarray
    """float64: environment steps at the end of each episode, non-decreasing."""
    returns: np.ndarray
    files: tuple[Path, ...]
    """What was read (for messages)."""


def default_pattern(source: str) -> str | None:
    return DEFAULT_PATTERNS.get(source)


def read_episodes(
    run_dir: Path, source: str, pattern: str | None = None, *, tag: str = "charts/episodic_return", step: str = "step", value: str = "episodic_return"
) -> Episodes:
    """The episodes of one run from `source` files matching `pattern` (relative to `run_dir`, or absolute)."""
    files = _files(run_dir, pattern or default_pattern(source), source)
    if source == "hpcrl":
        steps, returns = _read_hpcrl(files[-1])
    elif source == "monitor":
        steps, returns = _read_monitors(files)
    elif source == "tensorboard":
        steps, returns = _read_tensorboard(files, tag, rundir.lifetime_starts(run_dir))
    elif source == "csv":
        steps, returns = _concat([_latest_lifetimes(_lifetimes_in_file(*_read_csv(f, step, value))) for f in files])
    elif source == "jsonl":
        steps, returns = _concat([_latest_lifetimes(_lifetimes_in_file(*_read_jsonl(f, step, value))) for f in files])
    else:
        raise ValueError(f"unknown metrics source {source!r}")
    keep = np.isfinite(steps) & np.isfinite(returns)
    steps, returns = steps[keep], returns[keep]
    order = np.argsort(steps, kind="stable")
    return Episodes(steps[order], returns[order], tuple(files))


def _files(run_dir: Path, pattern: str | None, source: str) -> list[Path]:
    if not pattern:
        raise MetricsError(f"metrics: source {source!r} needs a path (program.metrics.path)")
    full = pattern if Path(pattern).is_absolute() else str(run_dir / pattern)
    files = sorted(Path(p) for p in glob.glob(full, recursive=True) if Path(p).is_file())
    if not files:
        raise MetricsError(f"metrics: no files match {pattern!r} under {run_dir}")
    return files


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsError(f"metrics: {path}: not UTF-8 text (byte offset {exc.start})") from None
    except OSError as exc:
        raise MetricsError(f"metrics: {path}: cannot read ({exc.strerror})") from None


def _complete(text: str) -> list[str]:
    """Lines that end in a newline: what follows the last one is a torn tail."""
    return text.split("\n")[:-1]


def _concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _read_hpcrl(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        return rundir.read_curve(path.parent)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MetricsError(f"metrics: {path}: damaged ({type(exc).__name__}: {exc})") from None


def _read_monitors(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """All episodes of every env, in the order they ended; steps are the running sum of lengths."""
    ends, returns, lengths = [], [], []
    for path in files:
        t_start = 0.0
        columns: list[str] | None = None
        for number, line in enumerate(_complete(_text(path)), start=1):
            if line.startswith("#"):  # a (re)started Monitor: its start time, then a header again
                try:
                    t_start = float(json.loads(line[1:]).get("t_start", 0.0))
                except (ValueError, AttributeError):
                    raise MetricsError(f"metrics: {path}, line {number}: not a Monitor header: {line[:80]!r}") from None
                columns = None
                continue
            if columns is None:
                columns = next(csv.reader([line]))
                if not {"r", "l", "t"} <= set(columns):
                    raise MetricsError(f"metrics: {path}, line {number}: expected a Monitor header with r,l,t, got {line[:80]!r}")
                r, n, t = columns.index("r"), columns.index("l"), columns.index("t")
                continue
            row = line.split(",") if '"' not in line else next(csv.reader([line]), [])
            if len(row) < len(columns) or "\0" in line:
                raise MetricsError(f"metrics: {path}, line {number}: damaged row {line[:80]!r}")
            ends.append(t_start + _number(row[t]))
            returns.append(_number(row[r]))
            lengths.append(_number(row[n]))
    order = np.argsort(np.asarray(ends, dtype=float), kind="stable")
    steps = np.cumsum(np.nan_to_num(np.asarray(lengths, dtype=float)[order]))
    return steps, np.asarray(returns, dtype=float)[order]


def _read_tensorboard(files: list[Path], tag: str, lifetime_starts: list[float]) -> tuple[np.ndarray, np.ndarray]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    except ImportError:
        raise MetricsError("metrics: reading TensorBoard files needs tensorboard: pip install 'hpcrl[tensorboard]'") from None
    by_lifetime: dict[tuple[float, str], list[tuple[int, float]]] = {}  # a lifetime (without records: a file) -> its episodes' (step, value)
    tags: set[str] = set()
    for path in files:
        accumulator = EventAccumulator(str(path), size_guidance={SCALARS: 0})
        try:
            accumulator.Reload()
        except Exception as exc:  # the reader's own errors for a damaged file: report it, not a traceback
            raise MetricsError(f"metrics: {path}: unreadable event file ({type(exc).__name__}: {exc})") from None
        found = accumulator.Tags().get("scalars", [])
        tags.update(found)
        events = accumulator.Scalars(tag) if tag in found else []
        if not events:
            continue
        try:
            opened = accumulator.FirstEventTimestamp()  # the writer's first record: when its process wrote it
        except ValueError:
            opened = events[0].wall_time
        key = (bisect.bisect_right(lifetime_starts, opened), "") if lifetime_starts else (opened, str(path))
        by_lifetime.setdefault(key, []).extend((event.step, event.value) for event in events)
    if not by_lifetime:
        shown = ", ".join(sorted(tags)[:8]) or "none"
        raise MetricsError(f"metrics: no scalar {tag!r} in {len(files)} event file(s) under {files[0].parent} (scalars there: {shown})")
    # Where a lifetime resumed, as near as the tag tells: not from other scalars, as one logged without
    # a step sits at 0 (add_hparams' metrics) and would drop every earlier lifetime's episode.
    return _latest_lifetimes([by_lifetime[key] for key in sorted(by_lifetime)])


def _latest_lifetimes(lifetimes: list[list[tuple[float, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """The one lifetime rule of every source with steps: in order, each lifetime's (step, value) episodes
    replace the earlier lifetimes' at and after the first step it logged (it produced them again, from a
    checkpoint or afresh). A retry that started afresh kept every lifetime's rows (81 rows for 60 steps)."""
    kept: list[tuple[float, float]] = []
    for episodes in lifetimes:
        if episodes:
            resumed_at = min(step for step, _ in episodes)
            kept = [episode for episode in kept if episode[0] < resumed_at] + episodes
    return np.asarray([step for step, _ in kept], dtype=float), np.asarray([value for _, value in kept], dtype=float)


def _lifetimes_in_file(steps: np.ndarray, values: np.ndarray) -> list[list[tuple[float, float]]]:
    """A CSV or JSONL file's rows split into the lifetimes that appended them: a step below the step
    before it starts the next (a resumed or restarted program logs again from its checkpoint or from 0;
    within one lifetime steps never go down, several episodes at one step included). Rows without a
    number for a step are dropped here, as every reader drops them."""
    lifetimes: list[list[tuple[float, float]]] = [[]]
    for step, value in zip(steps.tolist(), values.tolist()):
        if not math.isfinite(step):
            continue
        if lifetimes[-1] and step < lifetimes[-1][-1][0]:
            lifetimes.append([])
        lifetimes[-1].append((step, value))
    return lifetimes


def _read_csv(path: Path, step: str, value: str) -> tuple[np.ndarray, np.ndarray]:
    lines = _complete(_text(path))
    if not lines:
        raise MetricsError(f"metrics: {path}: empty (no header)")
    try:
        rows = list(csv.reader(io.StringIO("\n".join(lines) + "\n")))
    except csv.Error as exc:
        raise MetricsError(f"metrics: {path}: damaged CSV ({exc})") from None
    header = rows[0]
    missing = [c for c in (step, value) if c not in header]
    if missing:
        raise MetricsError(f"metrics: {path}: no column {missing[0]!r} (columns: {','.join(header)[:200]})")
    s, v = header.index(step), header.index(value)
    kept = [(row[s], row[v]) for row in rows[1:] if len(row) > max(s, v) and row[v].strip()]
    return np.asarray([_number(a) for a, _ in kept], dtype=float), np.asarray([_number(b) for _, b in kept], dtype=float)


def _read_jsonl(path: Path, step: str, value: str) -> tuple[np.ndarray, np.ndarray]:
    steps, values = [], []
    for number, line in enumerate(_complete(_text(path)), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise MetricsError(f"metrics: {path}, line {number}: not JSON: {line[:80]!r}") from None
        if not isinstance(record, dict) or value not in record:
            continue  # a line that logs something else (losses, evaluations)
        if step not in record:
            raise MetricsError(f"metrics: {path}, line {number}: has {value!r} but no {step!r}")
        steps.append(_as_float(record[step]))
        values.append(_as_float(record[value]))
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def _as_float(x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        return math.nan
    return _number(x) if isinstance(x, str) else float(x)
