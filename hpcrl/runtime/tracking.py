"""Training scalars fanned out to optional trackers (TensorBoard, W&B) beside train.csv.

train.csv stays the source of truth; trackers are views of the same numbers for people who live in
TensorBoard or W&B. So a tracker can never fail or stall a run: one that cannot start, or raises
while logging, costs one line in the job output and is switched off for the rest of the lifetime.

Tags follow CleanRL and SB3 (`charts/episodic_return`, `losses/value_loss`, ...), keyed by the
train.csv column each comes from, with the global environment step as the x-axis, so dashboards
built for those libraries read hpcrl's runs. Names that already hold a `/` (`eval/mean_return`)
are tags as they are.

This module imports neither torch nor wandb at import time: `hpcrl sweep` calls
`missing_packages` on a login node that may have neither.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

from hpcrl.config.experiment import TrackingConfig
from hpcrl.store import rundir
from hpcrl.store.expdir import Run

TAGS = {
    "episodic_return": "charts/episodic_return",
    "episodic_length": "charts/episodic_length",
    "episodes": "charts/episodes",
    "sps": "charts/SPS",
    "lr": "charts/learning_rate",
    "epsilon": "charts/epsilon",
    "policy_loss": "losses/policy_loss",
    "value_loss": "losses/value_loss",
    "entropy": "losses/entropy",
    "approx_kl": "losses/approx_kl",
    "clipfrac": "losses/clipfrac",
    "td_loss": "losses/td_loss",
    "q_values": "losses/q_values",
    "loss": "losses/td_loss",  # the Ape-X learner's names for the same two
    "q_mean": "losses/q_values",
}
"""train.csv column -> tag; a column not named here goes to `charts/<column>`."""
NOT_SCALARS = frozenset({"step", "iteration", "wall_time"})
"""Columns that are axes or bookkeeping, not curves."""
WANDB_INIT_TIMEOUT_S = 60.0


def tag(name: str) -> str:
    return name if "/" in name else TAGS.get(name, f"charts/{name}")


def missing_packages(cfg: TrackingConfig) -> list[str]:
    """One line per tracker the config requires (`true`) whose package is not installed in this
    Python: `hpcrl sweep` refuses them when the jobs run this Python (no container image)."""
    problems = []
    if cfg.tensorboard is True and not all(importlib.util.find_spec(p) for p in ("torch", "tensorboard")):
        problems.append("tracking.tensorboard: true, but the tensorboard package is not installed (pip install tensorboard); set it to auto to train without it")
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        problems.append("tracking.wandb: true, but the wandb package is not installed (pip install 'hpcrl[wandb]')")
    return problems


class Tracker(Protocol):
    name: str

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """Event files in `rundir.tensorboard_dir`. On resume the writer purges what an earlier lifetime
    logged after the checkpoint (TensorBoard hides events at or after `purge_step`, which is one past
    the checkpoint's step: its own row was logged before and is not logged again)."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir), purge_step=resume_step + 1)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(tag(name), value, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A W&B run in offline mode (jobs have no network): `wandb sync <run dir>/wandb/offline-run-*`
    later. Its id is the run id, so a requeued lifetime continues the same W&B run; the steps it
    redoes after the checkpoint are logged again (offline W&B cannot rewind)."""

    name = "wandb"

    def __init__(self, run: Run, rd: Path) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        cfg = run.config.tracking
        settings = wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S, console="off", silent=True, x_disable_stats=True)
        self.run = wandb.init(
            mode="offline", dir=str(rd), project=cfg.wandb_project, entity=cfg.wandb_entity, group=run.config.name,
            name=run.run_id, id=run.run_id, resume="allow", config=run.config.to_dict(), settings=settings,
        )
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log({"global_step": step, **{tag(k): v for k, v in scalars.items()}})

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers of one training lifetime; `log` sends every finite scalar to each of them."""

    def __init__(self, trackers: list[Tracker], run_id: str, out: TextIO | None) -> None:
        self.trackers, self.run_id, self.out = trackers, run_id, out

    def _disable(self, tracker: Tracker, exc: BaseException, doing: str) -> None:
        self.trackers.remove(tracker)
        print(f"{self.run_id}: tracking: {tracker.name} failed while {doing} and is off for this lifetime ({type(exc).__name__}: {_first_line(exc)}); train.csv is complete", file=self.out, flush=True)

    def log(self, step: int, scalars: Mapping[str, Any]) -> None:
        values = {k: x for k, v in scalars.items() if k not in NOT_SCALARS and (x := _finite(v)) is not None}
        for tracker in list(self.trackers):
            try:
                tracker.log(step, values)
            except Exception as exc:
                self._disable(tracker, exc, "logging")

    def close(self) -> None:
        for tracker in list(self.trackers):
            try:
                tracker.close()
            except Exception as exc:
                self._disable(tracker, exc, "closing")
        self.trackers = []

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_trackers(experiment_dir: Path, run: Run, rd: Path, resume_step: int, out: TextIO | None) -> Trackers:
    """The trackers the run's `tracking:` asks for. `tensorboard: auto` without the package is
    skipped silently; any other tracker that cannot start says why in one line and is skipped."""
    cfg = run.config.tracking
    trackers: list[Tracker] = []

    def start(name: str, make: Any, quiet_if_missing: bool) -> None:
        try:
            trackers.append(make())
        except ImportError as exc:
            if not quiet_if_missing:
                print(f"{run.run_id}: tracking: {name} is on but does not import here ({_first_line(exc)}); training without it", file=out, flush=True)
        except Exception as exc:
            print(f"{run.run_id}: tracking: {name} could not start ({type(exc).__name__}: {_first_line(exc)}); training without it", file=out, flush=True)

    if cfg.tensorboard:
        start("tensorboard", lambda: TensorBoard(rundir.tensorboard_dir(experiment_dir, run.setting_label, run.run_id), resume_step), cfg.tensorboard == "auto")
    if cfg.wandb:
        start("wandb", lambda: WandB(run, rd), False)
    return Trackers(trackers, run.run_id, out)


def _finite(value: Any) -> float | None:
    """A scalar worth plotting: NaN (no episode finished), None and non-numbers are left out."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]
