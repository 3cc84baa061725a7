"""The run lock: which process trains a run, and how the run's earlier starts ended.

`runs/<run_id>/.lock` is held (flock) by the one process that trains the run. While held it says "pid host
time"; once its holder let go, "ended CODE pid host time"; below that, one line per earlier holder that never
let go ("lost pid host time": killed, or lost with its node). The trainer takes it (`run_lock`), `status` asks
who holds it (`lock_holder`) and which starts were lost (`lost_starts`), and the marker logic reads how the last
start ended (`last_start`, hpcrl.store.rundir.silent_end). Kept apart from the run's other files
(hpcrl.store.rundir) because its rules are about processes and nodes, not file contents.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

LOCK = ".lock"
"""The lock file's name in a run directory."""

LOCKED_EXIT = 75
"""Exit code of a trainer that found its run locked by another (EX_TEMPFAIL): neither 0, which would
pass for a finished run, nor the requeue code, which would have the scheduler retry it forever."""


class RunLocked(Exception):
    """Another live process trains this run."""


@dataclass(frozen=True)
class Holder:
    """Who holds a run's lock, as it wrote itself into the lock file."""

    pid: int
    host: str
    at: str = field(default="", compare=False)
    """When it took the lock, on its host's clock (ISO 8601), for messages only."""

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def started(self) -> str:
        """`on node3 (pid 812, 14:31:07)`: where a start of the run was, and when."""
        return f"on {self.host} (pid {self.pid}, {self.at[11:19] or '?'})"


LOST_KEPT = 8
"""Lost holders the lock file remembers (the newest): `status` names the last, the log each at the next start."""


@dataclass
class Hold:
    """What `run_lock` gives its holder: the start before it if that one never let go (died with its node, or
    was killed), for the log to name; and `code`, which the holder sets to what its start ended with."""

    lost: list[Holder]
    code: int | None = None


@contextmanager
def run_lock(run_dir: Path, wait_s: float = 1.0) -> Iterator[Hold]:
    """Hold the run's lock while training it; RunLocked if another live process holds it. The lock file
    says who holds it, and once it let go, what its start ended with (`last_start`).

    An flock on `runs/<id>/.lock` belongs to the open file, so the kernel drops it when its holder
    dies, however it dies (kill -9, out of memory): a lock can never outlive a trainer, and a stale
    lock file means nothing. The file is never removed (removing it would let a second trainer lock
    a new inode while the first still holds the old one). `wait_s` rides out a `status` that
    probes the lock at that moment.

    Network filesystems: Linux clients (NFS v3 with lockd, v4) turn flock into a lock on the server,
    so it holds across nodes; when a whole node dies, the server frees its locks only after its
    lease (NFSv4: 90 s by default), and a run requeued sooner refuses to start until then. A mount
    with `nolock` or `local_lock=flock` keeps locks on one node only: there the lock guards against
    a second trainer on the same node, not on another.
    """
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLocked(f"{run_dir.name} is being trained by {holder or 'another process'} (lock {run_dir / LOCK}); not starting a second trainer") from None
            time.sleep(0.05)
    try:
        previous, lost = _read_lock_file(fd)
        if previous is not None:  # it took the lock and never let go: it died with its node, or was killed
            lost.append(previous)
        me = Holder(os.getpid(), socket.gethostname(), datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
        _write_lock_file(fd, f"{me.pid} {me.host} {me.at}", lost)
        _held[run_dir.resolve()] = fd
        hold = Hold([previous] if previous is not None else [])
        yield hold
        try:  # let go: the next holder knows this start ended, and how
            _write_lock_file(fd, f"ended {'-' if hold.code is None else hold.code} {me.pid} {me.host} {me.at}", lost)
        except OSError:
            pass  # a full disk: the next start names this one as lost, which says less but nothing false
    finally:
        _held.pop(run_dir.resolve(), None)
        os.close(fd)


def _read_lock_file(fd: int) -> tuple[Holder | None, list[Holder]]:
    """(the holder that has not let go, or None; the earlier holders that never let go), as written."""
    lines = os.pread(fd, 8192, 0).decode(errors="replace").split("\n")
    lost = []
    for line in lines[1:]:
        words = line.split()
        if len(words) >= 3 and words[0] == "lost" and words[1].isdigit():
            lost.append(Holder(int(words[1]), words[2], words[3] if len(words) > 3 else ""))
    return _holder(lines[0]), lost[-LOST_KEPT:]


def _write_lock_file(fd: int, first: str, lost: list[Holder]) -> None:
    """Written over the old content, then cut to length (never truncated first): the file keeps the block it
    has, so a full disk cannot refuse this write."""
    text = "\n".join([first, *(f"lost {h.pid} {h.host} {h.at}" for h in lost[-LOST_KEPT:])]) + "\n"
    data = text.encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _holder(line: str) -> Holder | None:
    words = line.split()
    return Holder(int(words[0]), words[1], words[2] if len(words) > 2 else "") if len(words) in (2, 3) and words[0].isdigit() else None


def last_start(run_dir: Path) -> tuple[Holder, int | None] | None:
    """The last start that took the run's lock, and the code it ended with (None: it has not let go, or did
    without one); None when no start took it."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        first = os.pread(fd, 512, 0).decode(errors="replace").split("\n")[0].split()
    finally:
        os.close(fd)
    if first[:1] == ["ended"] and len(first) >= 4 and first[2].isdigit():
        return Holder(int(first[2]), first[3], first[4] if len(first) > 4 else ""), (int(first[1]) if first[1].lstrip("-").isdigit() else None)
    holder = _holder(" ".join(first))
    return (holder, None) if holder else None


def lost_starts(run_dir: Path) -> list[Holder]:
    """The starts of the run that took its lock and never let go (killed, or lost with their node), oldest
    first: those the lock file remembers, and its last holder where no live process holds the lock now."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return []
    try:
        previous, lost = _read_lock_file(fd)
    finally:
        os.close(fd)
    if previous is not None and lock_holder(run_dir) is None:
        lost.append(previous)
    return lost


_held: dict[Path, int] = {}
"""The open lock file of each run this process holds locked (`run_lock`)."""


def held_lock(run_dir: Path) -> int | None:
    """The descriptor of the run's lock while this process holds it, else None: a process it
    passes the descriptor to holds the lock too, until both have closed it (the program's keeper
    does, so that the run stays locked while anything the run started may still run)."""
    return _held.get(run_dir.resolve())


def lock_holder(run_dir: Path) -> Holder | None:
    """The live process that holds the run's lock, or None: how `status` tells a running trainer
    from a task the scheduler lost. It takes a shared lock for an instant, never blocking."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd) or Holder(0, "?")
    finally:
        os.close(fd)
    return None


def _read_holder(fd: int) -> Holder | None:
    return _read_lock_file(fd)[0]
