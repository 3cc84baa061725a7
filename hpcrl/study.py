"""An Optuna study (`sweep.search.method: optuna`) as the sweep and `collect` see it.

The study lives in the experiment directory: Optuna's journal file `optuna/journal.log` (no
database server; its lock works on the NFS and Lustre homes of clusters), or the RDB that
`sweep.search.storage` names. Its name carries a hash of what its trials learn from (the config
without the searched keys' values, the space, sampler, pruner, metric and seed), so a changed
config starts a new study instead of mixing trials of two configs; `n_trials` is left out, so a
re-sweep with more trials continues the study.

Trials are runs: each has a run directory and a runs.csv row (its `trial` number is a swept
value, so every trial is a setting of its own), written by the worker that asked for it
(study_worker.py). Optuna is imported here only when a study is used: it is an optional extra.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from hpcrl import sweep
from hpcrl.config import ConfigError, Experiment, learned_settings
from hpcrl.schema import plain

STUDY_DIR = "optuna"
JOURNAL = "journal.log"
WORKERS = 4
"""Workers of a study when `resources.max_concurrent` does not say."""


def is_study(exp: Experiment) -> bool:
    return exp.sweep.search is not None and exp.sweep.search.method == "optuna"


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("sweep.search.method: optuna needs the optuna package: pip install 'hpcrl[optuna]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def study_name(exp: Experiment) -> str:
    search = exp.sweep.search
    assert search is not None
    what = {k: v for k, v in plain(dataclasses.asdict(search)).items() if k not in ("n_trials", "storage")}
    blob = json.dumps([learned_settings(exp), what, exp.sweep.seeds, dataclasses.asdict(exp.eval)], sort_keys=True, default=str).encode()
    return f"{exp.name}-{hashlib.sha256(blob).hexdigest()[:8]}"


def storage(exp: Experiment, experiment_dir: Path) -> Any:
    """The study's storage: the RDB URL given, or the journal file in the experiment directory."""
    search = exp.sweep.search
    assert search is not None
    if search.storage:
        return search.storage
    optuna = require_optuna()
    path = experiment_dir / STUDY_DIR / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))


def _sampler(optuna: Any, exp: Experiment, salt: int) -> Any:
    """TPE or random. `salt` (the worker's task id and the trials before it started) keeps two
    workers from drawing the same random points while TPE has too few trials to model."""
    search = exp.sweep.search
    assert search is not None
    seed = (search.seed * 1_000_003 + salt) % 2**32
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=search.startup_trials)


def _pruner(optuna: Any, exp: Experiment) -> Any:
    """Steps are percent of a trial's budget (study_worker.Reporter), so trials of different batch
    sizes are compared at the same point of their training."""
    search = exp.sweep.search
    assert search is not None
    warmup = search.warmup_percent
    if search.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=search.startup_trials, n_warmup_steps=warmup)
    if search.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup), max_resource=100)
    if search.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, warmup))
    return optuna.pruners.NopPruner()


def open_study(exp: Experiment, experiment_dir: Path, salt: int = 0) -> Any:
    """The experiment's study, created when it does not exist yet."""
    optuna = require_optuna()
    search = exp.sweep.search
    assert search is not None
    try:
        return optuna.create_study(
            study_name=study_name(exp), storage=storage(exp, experiment_dir), sampler=_sampler(optuna, exp, salt),
            pruner=_pruner(optuna, exp), direction=search.direction, load_if_exists=True,
        )
    except (ImportError, ValueError, RuntimeError) as exc:  # a bad RDB URL, a driver that is not installed
        raise ConfigError(f"sweep.search.storage: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


@dataclasses.dataclass
class StudyState:
    n_trials: int
    finished: int
    """Complete, pruned or failed: trials the study will not run again."""
    running: int
    run_ids: list[str]
    """The runs of the study's trials, in trial order."""

    @property
    def remaining(self) -> int:
        """Trials still to ask for or to finish (a running trial whose worker is gone resumes)."""
        return self.n_trials - self.finished


def study_state(exp: Experiment, study: Any) -> StudyState:
    optuna = require_optuna()
    search = exp.sweep.search
    assert search is not None and search.n_trials is not None
    trials = study.get_trials(deepcopy=False)
    running = sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)
    run_ids = [t.user_attrs["run_id"] for t in sorted(trials, key=lambda t: t.number) if "run_id" in t.user_attrs]
    return StudyState(search.n_trials, len(trials) - running, running, run_ids)


def held_trials(experiment_dir: Path) -> dict[int, int]:
    """Worker task id -> the trial it holds (written by the worker when it asks, removed when it tells)."""
    held = {}
    for path in (experiment_dir / STUDY_DIR / "workers").glob("*"):
        try:
            held[int(path.name)] = int(path.read_text().split()[0])
        except (ValueError, IndexError, OSError):
            continue  # a record torn by a kill before its rename never exists (atomic write); anything else is not ours
    return held


def workers_to_start(exp: Experiment, experiment_dir: Path, state: StudyState) -> int:
    """Tasks of the worker array: `resources.max_concurrent` (else WORKERS), no more than the trials
    left, and at least every task id that holds an unfinished trial, so it is resumed."""
    want = min(state.remaining, exp.resources.max_concurrent or WORKERS)
    return max([want, *held_trials(experiment_dir)]) if state.remaining > 0 else 0


def trial_runs(experiment_dir: Path, run_ids: list[str]) -> list[sweep.Run]:
    """The runs of a study's trials that runs.csv lists (a worker killed between asking and
    writing its row has none yet)."""
    listed = {row["run_id"] for row in sweep.read_runs_csv(experiment_dir)}
    parsed: dict[str, Experiment] = {}
    return [sweep.read_run(experiment_dir, run_id, parsed) for run_id in run_ids if run_id in listed]


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
