"""A process a run starts dies with the process that started it, however that one dies.

A trainer killed with SIGKILL (an OOM kill, a scheduler's or the local executor's kill) runs no
cleanup: its env worker processes, forked ones holding each other's pipe ends, never saw end of
file and lived on, one stuck in a user's env for ever. Linux's PR_SET_PDEATHSIG has the kernel
send a signal to a child when its parent dies; the child asks for it itself, first thing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _prctl():  # noqa: ANN202 - a ctypes function, or None off Linux
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
"""Looked up at import, in the parent: a child between fork and exec (a preexec_fn) of a process
with threads must not load libraries (dlopen's lock may be held by a thread that did not fork)."""


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Called in a child: have the kernel send it `sig` when its parent dies; exit at once when the
    parent is already gone. `parent` is the parent's pid where the caller knows it (taken before the
    fork: a preexec_fn); otherwise the parent is the one this process has just before it asks, and
    only a parent that dies between the two reads is caught. (It used to take a parent of pid 1
    for a dead one: a launcher or trainer that is PID 1 of its PID namespace, a container started
    without an init, had every child exit at its start.) The parent is the thread that started this
    process, so call it only in processes started from a thread that lives as long as they should.
    Off Linux, nothing: the scheduler's own process tracking is all there is."""
    if not signal_at_parent_death(sig, parent):  # the parent died before the death signal was asked for
        os._exit(1)


def signal_at_parent_death(sig: int, parent: int | None = None) -> bool:
    """Have the kernel send this process `sig` when its parent (`parent`, or the one it has now) dies; False where
    that parent is gone already, and the signal will never come. Off Linux nothing is asked, and True."""
    if _PRCTL is None:
        return True
    expected = os.getppid() if parent is None else parent
    _PRCTL(PR_SET_PDEATHSIG, sig)
    return os.getppid() == expected


def dies_with_me(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn for a child started from this process: `die_with_parent` with this process's pid."""
    return functools.partial(die_with_parent, sig, os.getpid())
