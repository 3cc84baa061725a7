"""A watch over a process group that outlives its leader: when an env worker dies, however it dies, what it started
(ViZDoom's game engines) ends, and the shared memory they held goes.

An env worker leads a process group of its own, and its game engines join it (`env_workers._lead_own_group`). A
worker killed from outside runs no cleanup: the OOM killer, a segfault, or the death signal of a trainer, an
evaluation or a benchmark killed with SIGKILL. Its engines, reparented to init, ran on for ever, each with its screen
and message queues in /dev/shm: one `kill -9` of a process stepping 4 ViZDoom envs left 3 engines and 12 files. The
trainer ends a dead worker's group when it sees the death (`env_workers.end_workers`), a task's end or a job's last
step ends what is left in its session (`leftovers`), but a process killed outside a task has neither.

So the worker forks a watcher first thing, before it makes any game: a process of its group that holds nothing but
the read end of a pipe whose write end only the worker holds (Python's pipes are close-on-exec: an engine the worker
execs does not inherit it). End of file is the worker gone, whichever way it went. The watcher then stops and kills
every other process of the group, removes the shared memory they held and the ViZDoom files made since the worker
started that nobody holds (`leftovers.remove_unheld`), and exits. A group's id is not reused while the watcher, one
of its members, lives. A worker that ends normally closes its end and waits for the watcher, which finds its group
empty.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from hpcrl.leftovers import kill_holding, process_stat, processes, remove_unheld, stop_all_found

STOP_WAIT_S = 1.0
"""How long the watcher waits for a process it stopped to stop, before it kills."""
RELEASE_WAIT_S = 15.0
"""How long a leader that ends normally waits for its watcher (whose work takes at most ~8 s: its stops and the
removal's wait for the killed), before it kills it."""


def watch_own_group() -> Callable[[], None]:
    """Fork the watcher of this process's group (call it in the group's leader, before the leader starts anything);
    returns what the leader calls at a normal end: close the pipe and wait for the watcher. Where there is no fork,
    no group of its own or no /proc (where the watcher would find nobody), nothing is watched."""
    group = os.getpgrp()
    if not hasattr(os, "fork") or group != os.getpid() or not os.path.isdir("/proc/self/fd"):
        return lambda: None
    started = time.time()
    read_end, write_end = os.pipe()
    watcher = os.fork()
    if watcher == 0:  # the watcher: never returns to the caller's code
        try:
            _close_all_but(read_end)  # nothing of the worker's (its pipe to the trainer) is held here
            _watch(read_end, group, started)
        finally:
            os._exit(0)
    os.close(read_end)

    def release() -> None:
        os.close(write_end)
        deadline = time.monotonic() + RELEASE_WAIT_S
        with contextlib.suppress(ChildProcessError):  # reaped by someone else (a user's env that waits for any child)
            while not os.waitpid(watcher, os.WNOHANG)[0]:
                if time.monotonic() > deadline:  # stopped, or stuck: a leader's close is bounded
                    os.kill(watcher, signal.SIGKILL)
                    os.waitpid(watcher, 0)
                    return
                time.sleep(0.005)

    return release


def _close_all_but(keep: int) -> None:
    """Close every file descriptor above stderr but `keep`: those /proc lists (the limit on open files may be a
    billion, and closerange walks them one by one where the kernel lacks close_range: before Linux 5.9)."""
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


def _watch(read_end: int, group: int, started: float) -> None:
    """Wait for the end of file that is the leader's end, then end the rest of its group and remove what they held
    and the ViZDoom files made since `started` that nobody holds."""
    while os.read(read_end, 1):  # the leader never writes
        pass
    me, session = os.getpid(), os.getsid(0)

    def members() -> list[int]:
        return [pid for pid in processes() if pid not in (me, group) and (stat := process_stat(pid)) is not None and stat.live and stat.group == group and stat.session == session]

    if left := stop_all_found(members, STOP_WAIT_S):
        kill_holding(left, STOP_WAIT_S)
    remove_unheld(started)
