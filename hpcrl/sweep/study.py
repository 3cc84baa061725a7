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
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hpcrl.config.experiment import Experiment
from hpcrl.config.key_paths import learned_settings
from hpcrl.config.schema import ConfigError, plain
from hpcrl.store import expdir

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


def resolve_storage(exp: Experiment) -> None:
    """Check `sweep.search.storage` before a sweep writes anything, and fix a relative SQLite path
    now, against the experiment directory: the workers start elsewhere and read the URL from
    experiment.yaml, so they all open the same file. ConfigError (one line) for what is not an RDB
    URL SQLAlchemy knows, a database driver that is not installed, an in-memory SQLite database
    (each worker would have its own), or a SQLite file outside the experiment in a missing directory."""
    search = exp.sweep.search
    if search is None or not search.storage:
        return
    require_optuna()  # SQLAlchemy comes with it
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    where = f"{exp.source}: sweep.search.storage" if exp.source else "sweep.search.storage"
    try:
        url = make_url(search.storage)
        dialect = url.get_dialect()
        (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()  # SQLAlchemy 2 | 1.4: the driver's module
    except ArgumentError:
        raise ConfigError(f"{where}: expected an RDB URL (postgresql://user@host/db, mysql://..., sqlite:///study.db), got {search.storage!r}") from None
    except ImportError as exc:
        raise ConfigError(f"{where}: {search.storage.partition(':')[0]} needs its database driver here: {exc}") from None
    if url.get_backend_name() != "sqlite":
        return
    if not url.database or url.database == ":memory:" or url.database.startswith("file:"):
        raise ConfigError(f"{where}: expected a SQLite file (sqlite:///study.db, relative to the experiment directory); an in-memory database is not shared by the workers")
    root = Path(os.path.abspath(exp.dir))
    path = Path(os.path.abspath(root / Path(url.database).expanduser()))
    if not path.parent.is_relative_to(root) and not path.parent.is_dir():
        raise ConfigError(f"{where}: {path.parent} is not a directory (the SQLite file {path.name} would go there)")
    search.storage = url.set(database=str(path)).render_as_string(hide_password=False)


def storage(exp: Experiment, experiment_dir: Path, say: Callable[[str], None]) -> Any:
    """The study's storage: the RDB URL given (a SQLite file's directory made when it is in the
    experiment), or the journal file in the experiment directory. `say` gets the line that names
    a torn journal record set aside."""
    search = exp.sweep.search
    assert search is not None
    optuna = require_optuna()
    if search.storage:
        from sqlalchemy.engine import make_url

        url = make_url(search.storage)
        if url.get_backend_name() == "sqlite" and url.database and Path(url.database).parent.is_relative_to(os.path.abspath(experiment_dir)):
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        return search.storage
    from hpcrl.sweep.study_journal import Journal

    path = experiment_dir / STUDY_DIR / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(Journal(path, say))


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


def open_study(exp: Experiment, experiment_dir: Path, salt: int = 0, out: TextIO | None = None) -> Any:
    """The experiment's study, created when it does not exist yet. A torn journal record is set
    aside with one line to `out` (stderr when None); storage that cannot be opened is a ConfigError."""
    optuna = require_optuna()
    from sqlalchemy.exc import SQLAlchemyError

    search = exp.sweep.search
    assert search is not None

    def say(line: str) -> None:
        print(line if out is not None else f"hpcrl: {line}", file=out if out is not None else sys.stderr)

    try:
        return optuna.create_study(
            study_name=study_name(exp), storage=storage(exp, experiment_dir, say), sampler=_sampler(optuna, exp, salt),
            pruner=_pruner(optuna, exp), direction=search.direction, load_if_exists=True,
        )
    except (ImportError, ValueError, RuntimeError, SQLAlchemyError) as exc:  # a database that cannot be reached, a damaged journal
        from hpcrl.sweep.study_journal import first_bad_line

        journal = experiment_dir / STUDY_DIR / JOURNAL
        if not search.storage and isinstance(exc, ValueError) and journal.exists() and (line := first_bad_line(journal)):
            raise ConfigError(
                f"{journal}: line {line} is not an Optuna journal record (a torn record that a later one was written onto); "
                "move the file aside to start the study afresh"
            ) from None
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


def held_trials(experiment_dir: Path, name: str | None = None) -> dict[int, int]:
    """Worker task id -> the trial it holds (written by the worker when it asks, removed when it
    tells): `<trial number> <study name>`. With `name`, only that study's: a changed config is a
    new study, whose trial 0 is not the old study's trial 0."""
    held = {}
    for path in (experiment_dir / STUDY_DIR / "workers").glob("*"):
        try:
            words = path.read_text().split()
            if name is None or words[1:2] in ([], [name]):  # a record without a name: written before names were
                held[int(path.name)] = int(words[0])
        except (ValueError, IndexError, OSError):
            continue  # a record torn by a kill before its rename never exists (atomic write); anything else is not ours
    return held


def workers_to_start(exp: Experiment, experiment_dir: Path, state: StudyState) -> int:
    """Tasks of the worker array: `resources.max_concurrent` (else WORKERS), no more than the trials
    left, and at least every task id that holds an unfinished trial, so it is resumed."""
    want = min(state.remaining, exp.resources.max_concurrent or WORKERS)
    return max([want, *held_trials(experiment_dir, study_name(exp))]) if state.remaining > 0 else 0


def trial_runs(experiment_dir: Path, run_ids: list[str]) -> list[expdir.Run]:
    """The runs of a study's trials that runs.csv lists (a worker killed between asking and
    writing its row has none yet)."""
    listed = {row["run_id"] for row in expdir.read_runs_csv(experiment_dir)}
    parsed: dict[str, Experiment] = {}
    return [expdir.read_run(experiment_dir, run_id, parsed) for run_id in run_ids if run_id in listed]


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def metric_key(exp: Experiment) -> str:
    """The scalar a trial reports: the evaluations during training, or the training episodes' return."""
    search = exp.sweep.search
    assert search is not None
    use_eval = search.metric == "eval" or (search.metric == "auto" and exp.eval.every_steps is not None)
    return "eval/mean_return" if use_eval else "episodic_return"
