"""What every entry point that trains a run (train, learner) does around its loop, and what every
evaluation (hpcrl's own, a user's program's) does around its work.

It is idempotent (a run with DONE is not trained again); it holds the run's lock, so a second
trainer of the same run (a re-sweep while an orphan still trains, a scheduler that reruns a task
it lost) refuses with one line instead of writing the same files; it removes the temporary files
of a checkpoint write that was killed, which only the lock makes safe; it turns the scheduler's
warning signal into a flag the loop checks at a safe point; it fails a run that keeps asking for a
requeue without progress (`resources.max_stalled_requeues`), which every scheduler would otherwise
requeue forever; and a crash leaves a FAILED marker for `hpcrl status` and `collect` to show: one
line for a failure that says it all (a full disk, unreadable checkpoints), the traceback for
anything else.
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hpcrl.store import rundir, runlock
from hpcrl.store.expdir import Run, run_dir
from hpcrl.store.states import REQUEUE_EXIT

WARNINGS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
"""What a scheduler's warning arrives as: the job script forwards it as USR1, Slurm's scancel and
`scontrol requeue` send TERM, and Grid Engine signals every process of the job itself: USR1 at
`s_rt` or before a suspend (-notify), USR2 at `s_rt` of a rescheduled task and before a kill."""


_early: list[int] = []
"""A warning that came before the first StopFlag (see catch_warnings)."""


def catch_warnings() -> None:
    """Take warnings from the first moment of a job's process: one that arrives while it still
    imports (seconds on a loaded node: torch) would kill it, and Grid Engine's warning at `s_rt`
    after a reschedule can come that early. The first StopFlag takes over what came."""
    for sig in WARNINGS:
        signal.signal(sig, lambda signum, _frame: _early.append(signum))


class StopFlag:
    """Set by a warning (WARNINGS) or SIGINT: the loop checkpoints at its next safe point.

    `signal` is the FIRST that came, the one that stopped the run: Slurm's warning (USR1) is followed
    by the TERM of the time limit, and a requeue line that named the last one blamed the limit for a
    stop the warning made. `on_first` is told that first signal once (from a signal handler: it must
    not print), so that a job killed later still says it was warned (guard records it in the run)."""

    def __init__(self, on_first: Callable[[int], None] | None = None) -> None:
        self.signal: int | None = _early[0] if _early else None
        self._on_first = on_first
        _early.clear()
        if self.signal is not None and on_first is not None:
            on_first(self.signal)
        for sig in (*WARNINGS, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signal is None:
            self.signal = signum
            if self._on_first is not None:
                self._on_first(signum)

    def __bool__(self) -> bool:
        return self.signal is not None


def ignore_warnings() -> None:
    """Let no further warning end this process: called by a job's process once its exit code is
    decided (a requeue above all; hpcrl.cli, Ranks.leave_for_requeue), never in a caller's session.
    Warnings repeat (`scancel --signal` every few seconds, Grid Engine's USR1 then USR2), and
    CPython puts the default action back on every signal it handles while the interpreter shuts
    down, so a warning in that moment would turn exit 99 into a death by signal: the job fails
    instead of being requeued. SIG_IGN survives the shutdown; SIGKILL still ends the process."""
    for sig in WARNINGS:
        signal.signal(sig, signal.SIG_IGN)


def leave_stops_to_the_trainer() -> None:
    """Called in a process the trainer starts and ends itself (an env worker, the learner process):
    ignore a scheduler's warnings and Ctrl-C, here and in every program it execs (SIG_IGN outlives an
    exec; a handler does not). Grid Engine signals every process of a job, Slurm's cancel every
    process of a step, a terminal its foreground group: the trainer checkpoints on them, and a helper
    or a ViZDoom engine they killed (its default action) would fail the run they ask to save."""
    ignore_warnings()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def guarded_run(experiment_dir: Path, run: Run, body: Callable[[Path, StopFlag], int], out: TextIO | None) -> int:
    """Run `body(run_dir, stop)` unless the run is done or locked; its return value is the exit code."""
    rd = run_dir(experiment_dir, run.run_id)
    rd.mkdir(parents=True, exist_ok=True)
    if rundir.is_done(rd):
        print(f"{run.run_id}: already done", file=out)
        return 0
    try:
        with runlock.run_lock(rd) as hold:
            for start in hold.lost:
                print(f"{run.run_id}: the start {start.started()} ended without a word: its node was lost, or it was killed", file=out)
            if rundir.is_done(rd):  # the holder we waited for finished it
                print(f"{run.run_id}: already done", file=out)
                return 0
            rundir.clear(rd, rundir.FAILED)

            for stale in rundir.remove_stale_temp(rd / rundir.CHECKPOINTS):
                print(f"{run.run_id}: removed {stale.name}, left by a checkpoint write that was killed", file=out)
            hold.code = _guarded(rd, run, body, out)
            return hold.code
    except runlock.RunLocked as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return runlock.LOCKED_EXIT


def _guarded(rd: Path, run: Run, body: Callable[[Path, StopFlag], int], out: TextIO | None) -> int:
    stop = StopFlag(lambda signum: rundir.record_signal(rd, rundir.WARNED, signum))
    before = rundir.progress_mark(rd)
    try:
        code = body(rd, stop)
        if code == REQUEUE_EXIT:
            _check_progress(rd, run, before)
        else:
            rundir.count_stalled_requeue(rd, stalled=False)
        return code
    except Exception as exc:
        line = rundir.one_line_reason(exc)
        try:
            rundir.mark(rd, rundir.FAILED, line or f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        except OSError as marker_error:  # the disk that failed the run may refuse the marker too
            print(f"hpcrl: error: {run.run_id}: could not write FAILED ({marker_error.strerror})", file=sys.stderr)
        if line is None:
            raise
        print(f"hpcrl: error: {run.run_id}: {rundir.failed_line('train', line)}", file=sys.stderr)
        return 1


def _check_progress(rd: Path, run: Run, before: tuple[int, int, int]) -> None:
    """Fail a run that asked for a requeue `resources.max_stalled_requeues` times in a row with
    nothing new in its directory (no checkpoint, no logged step): a program that exits 99 whatever
    happens would be requeued by every scheduler forever. A requeue that made progress, however
    many came before it, resets the count: a long run preempted often is never cut short."""
    limit = run.config.resources.max_stalled_requeues
    stalled = rundir.count_stalled_requeue(rd, stalled=rundir.progress_mark(rd) == before)
    if stalled >= limit:
        rundir.count_stalled_requeue(rd, stalled=False)  # a retry (the next sweep) gets the full count again
        raise rundir.RunError(f"asked for a requeue {stalled} times in a row without progress (nothing new in {rd.name}/, no checkpoint, no logged step): failed instead of requeued again (resources.max_stalled_requeues: {limit})")


def guarded_eval(experiment_dir: Path, run: Run, body: Callable[[Path], int], out: TextIO | None) -> int:
    """Run `body(run_dir)` for a run whose training is done; its return value is the exit code.

    Schedulers disagree on what a failed predecessor means (SGE runs the dependent anyway), so the
    run's markers decide: an unfinished or failed training run is recorded as skipped, with the
    reason, never evaluated. A failure leaves EVAL_FAILED: one line when that says it all, the
    exception re-raised otherwise."""
    rd = run_dir(experiment_dir, run.run_id)
    state = rundir.run_state(rd)
    if state != "done":
        rundir.mark(rd, rundir.EVAL_SKIPPED, rundir.failure(rd, "train") if state == "failed" else f"train {state}")
        print(f"{run.run_id}: eval skipped, train {state}", file=out)
        return 0
    try:
        return body(rd)
    except Exception as exc:
        line = rundir.one_line_reason(exc)
        rundir.mark(rd, rundir.EVAL_FAILED, line or f"{type(exc).__name__}: {exc}")
        if line is None:
            raise
        print(f"hpcrl: error: {run.run_id}: {rundir.failed_line('eval', line)}", file=sys.stderr)
        return 1
