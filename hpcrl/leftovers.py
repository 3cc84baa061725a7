"""What a finished program or job left running in its session, named and ended.

A process may outlive the one that started it: a user's trainer that forks helpers, a simulator's
engine (ViZDoom's) whose controller was SIGKILLed. A cluster ends a job's processes when the job
ends; the program supervisor (hpcrl.runtime.program) and the local executor (hpcrl.schedulers.local)
do the same through this one rule, each for the session it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

LEFTOVER_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL of what was left running."""


def end_leftovers(session: int, out: TextIO | None, who: str, spare: Sequence[int] = ()) -> None:
    """End what `who` (the program, a finished task) left running in `session` (SIGTERM, then SIGKILL
    after LEFTOVER_GRACE_S), naming each process in the job log `out`; returns when none is left.
    `spare` are not `who`'s (the program supervisor's keeper and its deputy)."""
    left = [(pid, command) for pid, command in in_session(session) if pid not in spare]
    if not left:
        return
    named = "; ".join(f"pid {pid} ({command})" for pid, command in left)
    print(f"hpcrl: {who} left {len(left)} process(es) running: {named}; ending them (SIGTERM, SIGKILL after {LEFTOVER_GRACE_S:g} s)", file=out, flush=True)
    for sig, grace in ((signal.SIGTERM, LEFTOVER_GRACE_S), (signal.SIGKILL, LEFTOVER_GRACE_S)):
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            for pid, _ in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(0.05)
            left = [(pid, command) for pid, command in in_session(session) if pid not in spare]  # also what they started meanwhile
        if not left:
            return
        if sig == signal.SIGTERM:
            print(f"hpcrl: still running after SIGTERM, sent SIGKILL: {', '.join(f'pid {pid}' for pid, _ in left)}", file=out, flush=True)
    print(f"hpcrl: could not end {', '.join(f'pid {pid}' for pid, _ in left)} (uninterruptible?)", file=out, flush=True)


def in_session(session: int) -> list[tuple[int, str]]:
    """The live (not zombie) processes of `session`, with their command lines, read from /proc
    (none without /proc: then the scheduler ends the rest)."""
    found: list[tuple[int, str]] = []
    if not Path("/proc").is_dir():
        return found
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, _pgrp, sid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            if int(sid) != session or state in ("Z", "X"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):  # gone while we looked
            continue
        found.append((int(entry.name), command[:200]))
    return found
