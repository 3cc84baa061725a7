"""What every entry point that trains a run (train, learner) does around its loop, and what every
evaluation (hpcrl's own, a user's program's) does around its work.

It is idempotent (a run with DONE is not trained again); it holds the run's lock, so a second
trainer of the same run (a re-sweep while an orphan still trains, a scheduler that reruns a task
it lost) refuses with one line instead of writing the same files; it removes the temporary files
of a checkpoint write that was killed, which only the lock makes safe; it turns the scheduler's
warning signal into a flag the loop checks at a safe point; and a crash leaves a FAILED marker for
`hpcrl status` and `collect` to show: one line for a failure that says it all (a full disk,
unreadable checkpoints), the traceback for anything else.
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hpcrl import rundir
from hpcrl.rl.checkpoint import remove_stale_temp
from hpcrl.sweep import Run, run_dir


class StopFlag:
    """Set by SIGUSR1 (the job script forwards the scheduler's warning as USR1), SIGTERM or SIGINT."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


def guarded_run(experiment_dir: Path, run: Run, body: Callable[[Path, StopFlag], int], out: TextIO | None) -> int:
    """Run `body(run_dir, stop)` unless the run is done or locked; its return value is the exit code."""
    rd = run_dir(experiment_dir, run.run_id)
    rd.mkdir(parents=True, exist_ok=True)
    if rundir.is_done(rd):
        print(f"{run.run_id}: already done", file=out)
        return 0
    try:
        with rundir.run_lock(rd):
            if rundir.is_done(rd):  # the holder we waited for finished it
                print(f"{run.run_id}: already done", file=out)
                return 0
            rundir.clear(rd, rundir.FAILED)
            for stale in remove_stale_temp(rd / rundir.CHECKPOINTS):
                print(f"{run.run_id}: removed {stale.name}, left by a checkpoint write that was killed", file=out)
            return _guarded(rd, run, body, out)
    except rundir.RunLocked as exc:
        print(f"hpcrl: error: {exc}", file=sys.stderr)
        return rundir.LOCKED_EXIT


def _guarded(rd: Path, run: Run, body: Callable[[Path, StopFlag], int], out: TextIO | None) -> int:
    stop = StopFlag()
    try:
        return body(rd, stop)
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
