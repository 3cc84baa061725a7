"""How actors find their learner: a small JSON file in the run directory, readable only by its owner.

The run directory is on the shared filesystem every job of the run already sees, so no extra
service is needed to discover an address that exists only once the learner job has started on
some node. The file holds the Redis password, so it is created with mode 600 (never world
readable, not even for the instant before a chmod) and replaced atomically, so a reader sees the
old learner's file or the new one, never half of one. Each learner start gets a new `instance`
token: an actor that sees a different token knows the learner was restarted.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

FILENAME = "rendezvous.json"


@dataclass(frozen=True)
class Rendezvous:
    host: str
    port: int
    password: str
    prefix: str
    """Key prefix of this run on the Redis (several runs may share an external one)."""
    instance: str
    """Random token of this learner start."""
    learner_host: str
    learner_pid: int


def path(run_dir: Path) -> Path:
    return run_dir / FILENAME


def write(run_dir: Path, info: Rendezvous) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{FILENAME}.", suffix=".tmp", dir=run_dir)  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(info), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path(run_dir))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(run_dir: Path) -> Rendezvous | None:
    """The current rendezvous, or None when there is none or it is unreadable (being replaced, foreign)."""
    try:
        data = json.loads(path(run_dir).read_text())
        return Rendezvous(
            host=str(data["host"]), port=int(data["port"]), password=str(data["password"]), prefix=str(data["prefix"]),
            instance=str(data["instance"]), learner_host=str(data["learner_host"]), learner_pid=int(data["learner_pid"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove(run_dir: Path, instance: str) -> None:
    """Remove the file if it is still this learner's (a restarted learner may already have replaced it)."""
    current = read(run_dir)
    if current is not None and current.instance == instance:
        path(run_dir).unlink(missing_ok=True)


def wait(run_dir: Path, timeout: float, give_up: Callable[[], bool] = lambda: False, not_instance: str | None = None) -> Rendezvous | None:
    """Poll for a rendezvous (optionally one from a different learner start) with backoff up to 2 s.

    Returns None after `timeout` seconds or as soon as `give_up()` says waiting is pointless
    (the run is finished, or the process was asked to stop).
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        info = read(run_dir)
        if info is not None and info.instance != not_instance:
            return info
        if give_up() or time.monotonic() >= deadline:
            return None
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(2.0, delay * 2)
