"""The keeper: the process between `hpcrl train` and a user's program, so that nothing the program
starts outlives hpcrl, however hpcrl dies.

A death signal (PR_SET_PDEATHSIG) on hpcrl's child reaches only that child: a wrapper script that
does not `exec` the trainer forks it, and the trainer, hpcrl's grandchild, lived on after an OOM
kill of hpcrl or the local executor's SIGKILL, writing the run while a re-sweep could start a
second trainer on the same checkpoints. So hpcrl starts this keeper, in a session of its own (out
of reach of the job's signals, as the program was), and the keeper starts the program:

- the keeper is a child subreaper: whatever the program forks and leaves is reparented to it, not
  to init, so it stays below the keeper whatever it does with its session;
- the program dies with the keeper (its own death signal);
- the keeper holds the run's lock (hpcrl passes the locked file), so the run stays locked while
  anything of it may run;
- the keeper reads its stdin, which hpcrl never writes: end of file is hpcrl closing it (the run is
  over) or dying. Then the keeper SIGKILLs everything left in its session and below it, until
  nothing is, and exits, releasing the lock.

It reports on a pipe of its own (`status_fd`), a line each: `pid N` once the program runs (hpcrl
sends the stop signal there), `exit N` when it ended (negative: killed by signal -N), or
`error TYPE MESSAGE` when it could not be started. The program's output is hpcrl's pipe; the
keeper keeps no copy of it, so the pipe closes when the program's processes are gone.

Run as a script (`python -I -S keeper.py STATUS_FD -- WORDS...`), importing only the standard
library: it must start wherever the program does, whatever hpcrl's own import path was.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05
SWEEP_S = 10.0
"""Bound on ending what is left: SIGKILL ends a process at once unless it is in uninterruptible sleep."""


def main(argv: list[str]) -> int:
    status_fd, words = int(argv[0]), argv[2:]
    keeper = os.getpid()
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)

    def dies_with_keeper() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != keeper:  # the keeper died before the line above took effect
            os._exit(1)

    try:
        program = subprocess.Popen(words, stdin=subprocess.DEVNULL, preexec_fn=dies_with_keeper)
    except OSError as exc:
        _report(status_fd, f"error {type(exc).__name__} {exc.strerror or exc}")
        return 1
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):  # the program's output pipe is the program's alone
        os.dup2(devnull, fd)
    _report(status_fd, f"pid {program.pid}")
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        for pid, code in _reap():
            if pid == program.pid:
                _report(status_fd, f"exit {code}")
        if ready and not os.read(0, 1 << 10):
            break
    _sweep(keeper)
    return 0


def _prctl():  # noqa: ANN202 - a ctypes function, or None off Linux
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _report(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):  # hpcrl gone: nobody to tell
        os.write(fd, (line + "\n").encode())


def _reap() -> list[tuple[int, int]]:
    """Every child that ended (a subreaper inherits orphans), with its exit code."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, os.waitstatus_to_exitcode(status)))


def _sweep(keeper: int) -> None:
    """SIGKILL every process of this session and below the keeper but the keeper, until none is left."""
    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        left = [pid for pid in _ours(keeper) if pid != keeper]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)
        _reap()


def _ours(keeper: int) -> list[int]:
    """Live processes in the keeper's session or descended from it (from /proc)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat")) as f:
                    state, ppid, _pgrp, sid = f.read().rpartition(")")[2].split()[:4]
            except (OSError, ValueError):
                continue  # gone meanwhile
            if state in ("Z", "X"):
                continue
            pid = int(entry.name)
            parents[pid] = int(ppid)
            if int(sid) == keeper:
                found.add(pid)
    for pid in parents:
        ancestor = parents.get(pid)
        seen = 0
        while ancestor and seen < 64:  # a chain of parents up to the keeper (bounded: pids may be reused)
            if ancestor == keeper:
                found.add(pid)
                break
            ancestor, seen = parents.get(ancestor), seen + 1
    return sorted(found)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
