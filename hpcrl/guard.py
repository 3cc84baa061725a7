"""What every entry point that trains a run (train, learner) does around its loop.

It is idempotent (a run with DONE is not trained again), it turns the scheduler's warning signal
into a flag the loop checks at a safe point, and a crash leaves a FAILED marker with the
traceback for `hpcrl status` and `collect` to show.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hpcrl import markers
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
    """Run `body(run_dir, stop)` unless the run is done; its return value is the process exit code."""
    rd = run_dir(experiment_dir, run.run_id)
    rd.mkdir(parents=True, exist_ok=True)
    if (rd / markers.DONE).exists():
        print(f"{run.run_id}: already done", file=out)
        return 0
    markers.clear(rd, markers.FAILED)
    stop = StopFlag()
    try:
        return body(rd, stop)
    except Exception as exc:
        markers.mark(rd, markers.FAILED, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        raise
