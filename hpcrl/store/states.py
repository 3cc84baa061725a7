"""The states of a run's stages and of a scheduler's tasks: one Enum for rundir, status, collect and the backends;
and the exit code by which a task asks for the state it cannot write itself, to run again.

A stage's marker on disk (rundir) and a task's state at the scheduler (the backends) meet in
`schedulers.base.shown_state`, whose result `hpcrl status` shows and `collect` reports; they are
spelled here once. The members are strings, so a state compares equal to its word and is written
as it (JSON, CSV, a status line) without conversion.
"""

from __future__ import annotations

from enum import Enum

REQUEUE_EXIT = 99
"""A task that exits with this code asks to run again (SGE's reschedule code; Slurm and local map it).
Every in-job entry point (sweep's study worker, runtime, rl, distributed), the job scripts (submit)
and the backends agree on it, so it lives with the states, below all of them."""


class State(str, Enum):
    NEW = "new"
    """Nothing on disk yet."""
    STARTED = "started"
    """Training left logs or checkpoints, but no marker: it is running, or it was stopped."""
    PENDING = "pending"
    RUNNING = "running"
    ORPHANED = "running (orphaned)"
    """A local task still running after its runner died: `hpcrl cancel` or the next sweep ends it."""
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    """An evaluation not run because its training did not finish."""
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    NOT_SUBMITTED = "not submitted"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__  # f"{state}" is the word, on every Python (3.12 formats an Enum by its name)
