"""A list's work in two processes where two cores are free: the second half in a forked child.

Why: collect's two longest steps, parsing 10,000 training logs and the bootstrap bands of 1,000
settings' curves, are many numpy calls of a few milliseconds each. In threads they took as long as in
one (each call holds the GIL; tried and measured for issue 37); in a forked child they run beside the
parent on the second core. The child starts with the parent's memory (nothing to send it) and sends
back only its answers, pickled. Anything wrong with the child (it died, is late, its answer does not
pickle, the fork failed) and the parent computes that half itself: the split changes how long, never what.
The child dies with its parent (a death signal): a killed collect leaves nothing computing.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from hpcrl.cores import usable_cores
from hpcrl.runtime.lifeline import die_with_parent

T = TypeVar("T")
R = TypeVar("R")

WAIT_MIN_S, WAIT_FACTOR = 30.0, 4.0
"""How long the parent waits for the child's answer once its own half is done: four times what its half
took, at least 30 s. Past that the child is killed and its half computed here: a child stuck on a lock
another thread held at the fork (a fork copies only the forking thread) delays the answer, never hangs it."""


def map_in_halves(work: Callable[[Sequence[T]], list[R]], items: Sequence[T], min_items: int) -> list[R]:
    """``work(items)``, the same list, with ``work(items[half:])`` done in a forked child at the same
    time as ``work(items[:half])`` here, when there are at least `min_items` items and two cores.
    `work` must answer item by item (its answer for a part is its answer for those items): each half's
    answers are joined in order. An exception `work` raises here is raised; the child's is not trusted
    to pickle faithfully, so its half is then computed here, where the same exception would show."""
    if len(items) < min_items or usable_cores() < 2 or not hasattr(os, "fork"):
        return work(items)
    half = len(items) // 2
    first, second = items[:half], items[half:]
    parent = os.getpid()
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end), os.close(write_end)
        return work(items)
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _child(work, second, write_end, parent)
    os.close(write_end)
    started = time.monotonic()
    try:
        answers = work(first)
    except BaseException:
        os.close(read_end)
        _end(pid)
        raise
    sent = _receive(read_end, time.monotonic() + max(WAIT_MIN_S, WAIT_FACTOR * (time.monotonic() - started)))
    _end(pid)
    try:
        theirs = pickle.loads(sent) if sent else None
    except Exception:  # noqa: BLE001 - a half-written answer (the child was killed or late): recomputed below
        theirs = None
    if not isinstance(theirs, list) or len(theirs) != len(second):
        theirs = work(second)
    return answers + theirs


def _child(work: Callable, items: Sequence, write_end: int, parent: int) -> None:
    """Compute, send, exit; dies with the parent, and exits at once if the parent is already gone."""
    code = 0
    try:
        die_with_parent(signal.SIGKILL, parent)  # its prctl was looked up before the fork: no dlopen in a forked child
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the child as it does the parent
        data = pickle.dumps(work(items), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(data)
    except BaseException:  # noqa: BLE001 - nothing sent: the parent computes this half itself
        code = 1
    finally:
        os._exit(code)


def _receive(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes the pipe, or None when that takes past `deadline`."""
    chunks = []
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
        return None
    finally:
        os.close(fd)


def _end(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)
