"""A watch over a process group that outlives its leader: when an env worker dies, however it dies, what it started
(ViZDoom's game engines) ends, and the shared memory they held goes.

An env worker leads a process group of its own, and its game engines join it (`env_workers._lead_own_group`). A
worker killed from outside runs no cleanup: the OOM killer, a segfault, or the death signal of a trainer, an
evaluation or a benchmark killed with SIGKILL. Its engines, reparented to init, ran on for ever, each with its screen
and message queues in /dev/shm: one `kill -9` of a process stepping 4 ViZDoom envs left 3 engines and 12 files. The
trainer ends a dead worker's group when it sees the death (`env_workers.end_workers`), a task's end or a job's last
step ends what is left in its session (`leftovers`), but a process killed outside a task has neither.

So the worker forks a watcher first thing, before it makes any game: a process of its group that holds no file of
the worker's and waits for one signal, LEADER_GONE. The kernel sends it when the worker dies, whichever way it went
(PR_SET_PDEATHSIG, asked for by the watcher); the worker sends it itself at a normal end, then waits for the
watcher. (End of file on a pipe whose write end only the worker held, the first version, never came while an env's
child forked without exec held a copy.) The watcher then stops and kills every other process of the group, removes
the shared memory they held and the ViZDoom files made since the worker started that nobody holds
(`leftovers.remove_unheld`), removes the leader's own directory where it was given one (a worker's temporary files:
its games' directories), and exits. A group's id is not reused while the watcher, one of its members, lives.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable

from hpcrl.leftovers import kill_holding, process_stat, processes, stop_all_found
from hpcrl.runtime.lifeline import signal_at_parent_death

STOP_WAIT_S = 1.0
"""How long the watcher waits for a process it stopped to stop, before it kills."""
LEADER_GONE = signal.SIGRTMIN + 1
"""What wakes the watcher: a real-time signal, which no scheduler, terminal or user sends (a scheduler's warnings,
USR1, USR2 and TERM, are ignored here, as in the worker)."""
RELEASE_WAIT_S = 15.0
"""How long a leader that ends normally waits for its watcher (whose work takes at most ~8 s: its stops and the
removal's wait for the killed), before it kills it."""


def watch_own_group(directory: str | None = None) -> Callable[[], None]:
    """Fork the watcher of this process's group (call it in the group's leader, from the thread that lives as long
    as the leader, before the leader starts anything); returns what the leader calls at a normal end: wake the
    watcher and wait for it. `directory`, the leader's own, goes with what is in it once the group has ended: a
    killed worker's games' directories stayed in /tmp before, one set for each `kill -9` of a trainer. Where there
    is no fork, no group of its own or no /proc (where the watcher would find nobody), nothing is watched."""
    group = os.getpgrp()
    if not hasattr(os, "fork") or group != os.getpid() or not os.path.isdir("/proc/self/fd"):
        return lambda: None
    started = time.time()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [LEADER_GONE])  # held until the watcher can take it
    watcher = os.fork()
    if watcher == 0:  # the watcher: never returns to the caller's code
        try:
            _close_inherited()  # nothing of the worker's (its pipe to the trainer) is held here
            _watch(group, started, directory)
        finally:
            os._exit(0)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def release() -> None:
        deadline = time.monotonic() + RELEASE_WAIT_S
        with contextlib.suppress(ProcessLookupError, ChildProcessError):  # reaped by someone else (a user's env that waits for any child)
            os.kill(watcher, LEADER_GONE)
            while not os.waitpid(watcher, os.WNOHANG)[0]:
                if time.monotonic() > deadline:  # stopped, or stuck: a leader's close is bounded
                    os.kill(watcher, signal.SIGKILL)
                    os.waitpid(watcher, 0)
                    return
                time.sleep(0.005)

    return release


def _close_inherited() -> None:
    """Close every file descriptor above stderr: those /proc lists (the limit on open files may be a billion, and
    closerange walks them one by one where the kernel lacks close_range: before Linux 5.9)."""
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


class _LeaderGone(Exception):
    """LEADER_GONE arrived."""


def _leader_gone(signum: int, frame: object) -> None:
    raise _LeaderGone


def _watch(group: int, started: float, directory: str | None) -> None:
    """Wait for LEADER_GONE (the leader's death, or its normal end), then end the rest of its group and remove what
    they held, the ViZDoom files made since `started` that nobody holds, and `directory`."""
    signal.signal(LEADER_GONE, _leader_gone)
    try:
        if signal_at_parent_death(LEADER_GONE, group):  # else the leader died before it could be asked
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [LEADER_GONE])  # one sent meanwhile arrives here
            while True:
                signal.pause()
    except _LeaderGone:
        pass
    signal.signal(LEADER_GONE, signal.SIG_IGN)  # a second one (the death after a release) changes nothing
    me, session = os.getpid(), os.getsid(0)

    def members() -> list[int]:
        return [pid for pid in processes() if pid not in (me, group) and (stat := process_stat(pid)) is not None and stat.live and stat.group == group and stat.session == session]

    kill_holding(stop_all_found(members, STOP_WAIT_S), STOP_WAIT_S, since=started)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
