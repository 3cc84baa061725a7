"""The one sink of a training lifetime's rows: train.csv, the trackers, evaluations during training
and the callbacks that read each row (an Optuna trial's reporter).

Every hpcrl trainer writes its rows here: `hpcrl train` (PPO, A2C, DQN, AlphaZero; of a DD-PPO run,
rank 0 alone, as it speaks for the run) and the Ape-X learner. So one row means one thing in every
file: the same base columns, cells formatted the same way, the same scalars under the same tags.

Modelled on Stable-Baselines3's logger (one `record`/`dump` in front of several writers, plus
callbacks): the writers are train.csv (rundir.TrainLog) and the trackers (runtime/tracking.py).
train.csv is the source of truth, so a failure to write it ends the run as any I/O error does; a
tracker is a view, so one that fails is named in one line and switched off (tracking.Trackers). The
evaluator (rl/periodic_eval.py) is handed in by the trainer rather than imported: this room sits
above the training stack and imports no torch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

from hpcrl.runtime import tracking
from hpcrl.store import rundir
from hpcrl.store.expdir import Run

BASE_COLUMNS = ("step", "iteration", "wall_time", "sps", "episodes", "episodic_return", "episodic_length")
"""The first columns of every trainer's train.csv; the algorithm's metrics (and the learner's
distributed counters) follow."""

Callback = Callable[[int, dict[str, float]], "str | None"]
"""Called with the step and the scalars of each row (and of the evaluation at that row); a string
it returns stops the training there, for that reason (an Optuna pruner)."""


class Evaluator(Protocol):
    """Evaluations during training (rl/periodic_eval.PeriodicEval)."""

    def due(self, step: int, final: bool) -> bool: ...

    def evaluate(self, step: int, wall_time: float) -> dict[str, float]: ...

    def state_dict(self) -> Any: ...

    def close(self) -> None: ...


class RunLog:
    """The rows of one training lifetime. `row` writes train.csv and the trackers; `evaluate` runs a
    due evaluation and tracks it; `report` asks the callbacks whether to stop.

    `columns` are the ones after BASE_COLUMNS, in order; those in `counts` are integers written as
    they are, every other cell is a number with 6 significant digits (empty when NaN or missing)."""

    def __init__(
        self, train_log: rundir.AppendLog, trackers: tracking.Trackers, columns: Sequence[str], *,
        counts: Collection[str] = (), evaluator: Evaluator | None = None, callbacks: Sequence[Callback] = (),
    ) -> None:
        self.train_log, self.trackers, self.columns, self.counts = train_log, trackers, tuple(columns), frozenset(counts)
        self.evaluator, self.callbacks = evaluator, tuple(callbacks)

    def row(self, step: int, iteration: int, wall_time: float, sps: float, episodes: Sequence[tuple[float, int]], metrics: Mapping[str, Any]) -> dict[str, Any]:
        """One row: the mean return and length of the episodes that ended since the last row, and
        `metrics` (a name that is not a column goes to the trackers only). Returns its scalars."""
        ret = float(np.mean([e[0] for e in episodes])) if episodes else math.nan
        length = float(np.mean([e[1] for e in episodes])) if episodes else math.nan
        cells: list[object] = [step, iteration, f"{wall_time:.3f}", f"{sps:.1f}", len(episodes), fmt(ret), fmt(length)]
        cells += [metrics[k] if k in self.counts else fmt(metrics.get(k, math.nan)) for k in self.columns]
        self.train_log.write(cells)
        scalars = {"sps": sps, "episodes": len(episodes), "episodic_return": ret, "episodic_length": length, **metrics}
        self.trackers.log(step, scalars)
        return scalars

    def evaluate(self, step: int, final: bool, wall_time: Callable[[], float]) -> dict[str, float]:
        """The evaluation due at `step` (`final`: the last one), tracked; {} when none is due.
        `wall_time` is read once it is known that one runs."""
        if self.evaluator is None or not self.evaluator.due(step, final):
            return {}
        evaluated = self.evaluator.evaluate(step, wall_time())
        self.trackers.log(step, evaluated)
        return evaluated

    def report(self, step: int, scalars: dict[str, float]) -> str | None:
        """The first reason a callback gives to stop at this row, or None."""
        return next((why for callback in self.callbacks if (why := callback(step, scalars))), None)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the sink: the evaluator's best so far, when there is one."""
        return {"periodic_eval": self.evaluator.state_dict()} if self.evaluator is not None else {}

    def close(self) -> None:
        """Close the evaluator, the trackers and train.csv; train.csv last, whatever the others do."""
        with contextlib.ExitStack() as stack:
            stack.callback(self.train_log.close)
            stack.callback(self.trackers.close)
            if self.evaluator is not None:
                stack.callback(self.evaluator.close)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_runlog(
    experiment_dir: Path, run: Run, rd: Path, columns: Sequence[str], resume_step: int, out: TextIO | None, *,
    counts: Collection[str] = (), evaluator: Callable[[], Evaluator | None] = lambda: None, callbacks: Sequence[Callback] = (),
) -> RunLog:
    """The run's sink at `resume_step`: train.csv cut back to that step and appended to, the
    trackers its `tracking:` asks for, and `evaluator()` (started after them, as before)."""
    with contextlib.ExitStack() as opened:  # what opened is closed again if a later part fails
        train_log = rundir.TrainLog(rd, BASE_COLUMNS + tuple(columns), resume_step)
        opened.callback(train_log.close)
        trackers = tracking.open_trackers(experiment_dir, run, rd, resume_step, out)
        opened.callback(trackers.close)
        log = RunLog(train_log, trackers, columns, counts=counts, evaluator=evaluator(), callbacks=callbacks)
        opened.pop_all()
        return log


def fmt(value: Any) -> str:
    """A train.csv cell of a metric (a Python or numpy number, a 0-d tensor): rundir's `cell` of its float."""
    return rundir.cell(None if value is None else float(value))
