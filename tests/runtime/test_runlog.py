"""The training row sink (hpcrl.runtime.runlog): every row reaches train.csv and each tracker, a
tracker that fails is named in one line while the others and train.csv go on, a resumed lifetime
appends after the checkpoint's step, and evaluations and callbacks see the rows."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path

from hpcrl.runtime import runlog, tracking
from hpcrl.store import rundir


class Recording:
    name = "recording"

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.logged.append((step, dict(scalars)))

    def close(self) -> None:
        self.closed = True


class Broken(Recording):
    name = "broken"

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        raise OSError(28, "No space left on device")


class Evaluator:
    """Due every 200 steps and at the end; remembers the best it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []
        self.closed = False

    def due(self, step: int, final: bool) -> bool:
        return final or step % 200 == 0

    def evaluate(self, step: int, wall_time: float) -> dict[str, float]:
        self.calls.append((step, wall_time))
        return {"eval/mean_return": float(step)}

    def state_dict(self) -> dict[str, int]:
        return {"best_step": self.calls[-1][0] if self.calls else -1}

    def close(self) -> None:
        self.closed = True


def sink(rd: Path, resume_step: int, trackers: list, out: io.StringIO, **kwargs) -> runlog.RunLog:
    log = rundir.TrainLog(rd, runlog.BASE_COLUMNS + ("loss", "queue_depth"), resume_step)
    return runlog.RunLog(log, tracking.Trackers(trackers, "abc-s0", out), ("loss", "queue_depth"), counts={"queue_depth"}, **kwargs)


def rows(rd: Path) -> list[dict[str, str]]:
    with (rd / rundir.TRAIN_LOG).open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_row_reaches_train_csv_and_every_tracker_formatted_once(tmp_path: Path) -> None:
    first, second, out = Recording(), Recording(), io.StringIO()
    with sink(tmp_path, 0, [first, second], out) as log:
        scalars = log.row(100, 1, 1.23456, 81.94, [(1.0, 10), (2.0, 20)], {"loss": 0.1234567, "queue_depth": 1234567, "extra": 5.0})
        log.row(200, 2, 2.5, 80.0, [], {"loss": math.nan, "queue_depth": 0})
    assert (tmp_path / "train.csv").read_text().splitlines() == [
        "step,iteration,wall_time,sps,episodes,episodic_return,episodic_length,loss,queue_depth",
        "100,1,1.235,81.9,2,1.5,15,0.1234567,1234567",  # full precision (issue 37 item 16); a count is written whole; `extra` is no column
        "200,2,2.500,80.0,0,,,,0",
    ]
    assert scalars == {"sps": 81.94, "episodes": 2, "episodic_return": 1.5, "episodic_length": 15.0, "loss": 0.1234567, "queue_depth": 1234567, "extra": 5.0}
    assert first.logged == second.logged == [
        (100, {"sps": 81.94, "episodes": 2.0, "episodic_return": 1.5, "episodic_length": 15.0, "loss": 0.1234567, "queue_depth": 1234567.0, "extra": 5.0}),
        (200, {"sps": 80.0, "episodes": 0.0, "queue_depth": 0.0}),  # NaN is no point on a curve
    ]
    assert first.closed and second.closed and out.getvalue() == ""


def test_a_failing_tracker_is_named_in_one_line_and_the_rest_go_on(tmp_path: Path) -> None:
    broken, recording, out = Broken(), Recording(), io.StringIO()
    with sink(tmp_path, 0, [broken, recording], out) as log:
        for step in (100, 200, 300):
            log.row(step, step // 100, 1.0, 1.0, [], {"loss": 0.5, "queue_depth": 1})
    assert [step for step, _ in recording.logged] == [100, 200, 300]
    assert len(rows(tmp_path)) == 3
    (line,) = out.getvalue().splitlines()
    assert line.startswith("abc-s0: tracking: broken failed while logging") and "No space left on device" in line and "train.csv is complete" in line
    assert not broken.closed  # switched off: not called again


def test_a_resumed_lifetime_cuts_back_to_its_step_and_appends(tmp_path: Path) -> None:
    with sink(tmp_path, 0, [], io.StringIO()) as log:
        for step in (100, 200, 300):
            log.row(step, step // 100, float(step), 1.0, [], {"loss": 0.5, "queue_depth": 1})
    (tmp_path / "train.csv").open("a").write("400,4,4")  # a torn last line, as a dead node leaves it
    with sink(tmp_path, 200, [], io.StringIO()) as log:  # resumed from the checkpoint at step 200
        log.row(300, 3, 3.5, 1.0, [], {"loss": 0.25, "queue_depth": 2})
    text = (tmp_path / "train.csv").read_text()
    assert text.count("step,") == 1
    assert [(r["step"], r["loss"]) for r in rows(tmp_path)] == [("100", "0.5"), ("200", "0.5"), ("300", "0.25")]


def test_evaluations_are_tracked_and_callbacks_can_stop_at_a_row(tmp_path: Path) -> None:
    recording, evaluator, seen = Recording(), Evaluator(), []

    def pruner(step: int, scalars: dict[str, float]) -> str | None:
        seen.append((step, scalars.get("eval/mean_return")))
        return "pruned by the pruner" if step >= 400 else None

    clock = iter([7.0, 9.0])
    with sink(tmp_path, 0, [recording], io.StringIO(), evaluator=evaluator, callbacks=[pruner]) as log:
        reasons = []
        for step in (100, 200, 300, 400):
            scalars = log.row(step, step // 100, 1.0, 1.0, [], {"loss": 0.5, "queue_depth": 1})
            scalars.update(log.evaluate(step, False, lambda: next(clock)))
            reasons.append(log.report(step, scalars))
        assert log.state_dict() == {"periodic_eval": {"best_step": 400}}
    assert evaluator.calls == [(200, 7.0), (400, 9.0)] and evaluator.closed  # the clock is read only when one runs
    assert (200, {"eval/mean_return": 200.0}) in recording.logged
    assert seen == [(100, None), (200, 200.0), (300, None), (400, 400.0)]
    assert reasons == [None, None, None, "pruned by the pruner"]


def test_without_an_evaluator_nothing_is_evaluated_and_no_state_is_kept(tmp_path: Path) -> None:
    with sink(tmp_path, 0, [], io.StringIO()) as log:
        assert log.evaluate(100, True, lambda: 1.0) == {} and log.state_dict() == {} and log.report(100, {}) is None
