"""The learner's periodic report, as a file in the run directory, and the line `hpcrl status` prints.

Why a file: `hpcrl status` runs on a login node that may not reach the compute node's Redis (and
should not need the password); the run directory is on the shared filesystem anyway. The learner
rewrites the file atomically about once a second, so a reader never sees half of it, and its
`time` says how fresh it is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hpcrl.io import atomic_write_text

FILENAME = "distributed.json"


def write(run_dir: Path, stats: dict[str, Any]) -> None:
    atomic_write_text(run_dir / FILENAME, json.dumps(stats, indent=1, sort_keys=True))


def read(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / FILENAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _si(value: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.1f}{suffix}"
    return f"{value:.0f}"


def _learner_parts(s: dict[str, Any]) -> list[str]:
    """How busy the learner was and the update ratio it realised (1.00x: the set one; pace.py)."""
    parts = []
    if s.get("learning_s"):
        parts.append(f"learner busy {float(s.get('busy_s', 0.0)) / float(s['learning_s']):.0%}, waited {float(s.get('wait_s', 0.0)):.1f} s")
    if s.get("pace") is not None:
        slack = float(s.get("ratio_slack") or 0.0)
        parts.append(f"updates {float(s['pace']):.2f}x the set ratio" + (f" (slack {slack:g})" if slack else ""))
    return parts


def _where(s: dict, actor: int) -> str:
    """`1 on node7`: a dead actor and the host it last reported from (a node that died takes all its actors)."""
    host = ((s.get("actors") or {}).get(str(actor)) or {}).get("host")
    return f"{actor} on {host}" if host else str(actor)


def status_line(run_dir: Path, now: float | None = None) -> str | None:
    """`actors 2/2 alive, 8.1k env steps/s, queue 3/64, lag 0.4 (max 2), dropped 0 stale + 0 malformed, ...,
    learner busy 96%, waited 0.3 s, updates 1.04x the set ratio (slack 0.25)`; for AlphaZero's
    self-play jobs `actors 2/2 alive, 12 games/s, 98 positions/s, queue ...`."""
    s = read(run_dir)
    if s is None:
        return None
    age = (now if now is not None else time.time()) - float(s.get("time", 0))
    alive, expected = s.get("actors_alive", 0), s.get("actors_expected", 0)
    lag = s.get("lag_mean")
    steps, episodes = s.get("units") or ("env steps", "episodes")
    parts = [
        f"actors {alive}/{expected} alive" + (f" (dead: {', '.join(_where(s, i) for i in s['actors_dead'])})" if s.get("actors_dead") else ""),
        *([f"{_si(s.get('episodes_per_s', 0.0))} {episodes}/s"] if episodes == "games" else []),
        f"{_si(s.get('env_sps', 0.0))} {steps}/s",
        f"queue {s.get('queue_depth', 0)}/{s.get('queue_bound', 0)}",
        f"lag {lag:.1f} (max {s.get('lag_max', 0)})" if lag is not None else "lag -",
        f"dropped {s.get('dropped_stale', 0)} stale + {s.get('malformed', 0)} malformed + {s.get('lost', 0)} lost",
        f"backpressure {s.get('backpressure_waits', 0)} waits ({s.get('backpressure_s', 0.0):.1f} s)",
        *_learner_parts(s),
    ]
    state = s.get("status", "?")
    if state == "running" and age > 30:
        state = f"no report for {age:.0f} s"
    return f"{state}: " + ", ".join(parts)
