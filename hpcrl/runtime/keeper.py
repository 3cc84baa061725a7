"""The keeper: the processes between `hpcrl train` and a user's program, so that nothing the program
starts outlives hpcrl, however hpcrl or the keeper dies.

A death signal (PR_SET_PDEATHSIG) on hpcrl's child reaches only that child: a wrapper script that
does not `exec` the trainer forks it, and the trainer, hpcrl's grandchild, lived on after an OOM
kill of hpcrl or the local executor's SIGKILL, writing the run while a re-sweep could start a
second trainer on the same checkpoints. So hpcrl starts this keeper, in a session of its own (out
of reach of the job's signals, as the program was), and the keeper starts the program:

- the keeper is a child subreaper: whatever the program forks and leaves is reparented to it, not
  to init, so it stays below the keeper whatever it does with its session;
- the keeper holds the run's lock (hpcrl passes the locked file), so the run stays locked while
  anything of it may run;
- the keeper reads its stdin, which hpcrl never writes: end of file is hpcrl closing it (the run is
  over) or dying. Then the keeper SIGKILLs everything left in its session and below it, until
  nothing is, and exits, releasing the lock.

A subreaper guards what is below it only while it lives: a SIGKILLed keeper's orphans went to init,
and a trainer below a wrapper lived on (the wrapper died of its death signal, its child had none).
So the keeper is two processes, each watching the other, and the program is started by the second:

    hpcrl -> keeper (session leader, subreaper, the lock, hpcrl's stdin)
               -> deputy (subreaper, the program's parent: reports its pid and exit, reaps what it leaves)
                    -> program (dies with the deputy: its death signal) -> whatever it forks

- the keeper dies (killed alone, or with hpcrl): the deputy sees end of file on a pipe only the
  keeper holds and SIGKILLs everything of the keeper's session and below itself, then exits;
- the deputy dies: the program dies of its death signal, what the program forked is reparented to
  the keeper (a subreaper), and the keeper reports the end, SIGKILLs everything below it, and waits
  for hpcrl as before.
Only a SIGKILL of both at the same moment (nothing but a kill of the whole job does that, and that
takes the program too) leaves what the program forked to init. A PID namespace, whose end the kernel
makes everyone's, would close that too, but it needs privileges or user namespaces that clusters
often disable, and it changes what the program sees of pids and /proc.

They report on a pipe of their own (`status_fd`), a line each: `pid N D` once the program runs (N;
hpcrl sends the stop signal there; D is the deputy, which hpcrl must not take for something the
program left), `exit N` when it ended (negative: killed by signal -N), or `error TYPE MESSAGE`
when it could not be started. The program's output is hpcrl's pipe; neither keeps a copy of it, so
the pipe closes when the program's processes are gone.

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
    watch, held = os.pipe()  # `held` is the keeper's alone: its end of file tells the deputy the keeper is gone
    deputy = os.fork()
    if deputy == 0:
        os.close(held)
        os._exit(_deputy(keeper, watch, status_fd, words, prctl))
    os.close(watch)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):  # the program's output pipe is the program's alone
        os.dup2(devnull, fd)
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        for pid, code in _reap():
            if pid == deputy:  # it never ends on its own: killed, and the program with it (its death signal)
                _report(status_fd, f"exit {code}")
                _sweep(keeper, keeper)
        if ready and not os.read(0, 1 << 10):
            break
    _sweep(keeper, keeper)
    return 0


def _deputy(keeper: int, watch: int, status_fd: int, words: list[str], prctl) -> int:  # noqa: ANN001 - a ctypes function or None
    """The program's parent (forked from the keeper): starts it, reports its pid and exit, reaps what
    it leaves (a subreaper too), and once the keeper is gone ends everything of the run."""
    me = os.getpid()
    if prctl is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)

    def dies_with_deputy() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:  # the deputy died before the line above took effect
            os._exit(1)

    try:
        program = subprocess.Popen(words, stdin=subprocess.DEVNULL, preexec_fn=dies_with_deputy)
    except OSError as exc:
        _report(status_fd, f"error {type(exc).__name__} {exc.strerror or exc}")
        return 1
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    _report(status_fd, f"pid {program.pid} {me}")
    while True:
        ready, _, _ = select.select([watch], [], [], POLL_S)
        for pid, code in _reap():
            if pid == program.pid:
                _report(status_fd, f"exit {code}")
        if ready and not os.read(watch, 1 << 10):  # the keeper is gone, however it went
            _sweep(keeper, me)
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


def _sweep(session: int, root: int) -> None:
    """SIGKILL every process of `session` and below `root` but `root`, until none is left."""
    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        left = [pid for pid in _ours(session, root) if pid != root]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)
        _reap()


def _ours(session: int, root: int) -> list[int]:
    """Live processes in `session` or descended from `root` (from /proc)."""
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
            if int(sid) == session:
                found.add(pid)
    return sorted(found | _below(parents, root))


def _below(parents: dict[int, int], root: int) -> set[int]:
    """The pids whose chain of parents reaches `root`, each chain followed for at most 64 steps: /proc
    is read one process at a time, and a pid reused meanwhile can make the parents a cycle."""
    found = set()
    for pid in parents:
        ancestor = parents.get(pid)
        seen = 0
        while ancestor and seen < 64:
            if ancestor == root:
                found.add(pid)
                break
            ancestor, seen = parents.get(ancestor), seen + 1
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
