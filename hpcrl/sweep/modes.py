"""Search modes behind one seam: a grid (with or without `sweep.search` `method: random`) or an
Optuna study (`method: optuna`), as the rest of hpcrl sees them.

Each mode answers the same questions, so the sweep, `hpcrl status` and `collect` ask it instead of
testing which one it is (as Hydra's Sweeper decides what to try and its Launcher where to run):

- which runs a sweep writes (runs.csv, experiment.yaml): the expanded points merged with the runs
  already there, or the runs of the study's trials so far;
- what the job plan holds: a task per run still to train (and eval-only tasks), or worker tasks
  that ask the study for trials (`workers`);
- what is in flight: runs whose tasks are pending or running, or the study's workers, and for
  `status` the worker task that holds each trial. A task that only serves another stage's task of
  its run (Ape-X's and self-play's actors serve its learner) does not keep the run in flight once
  that task ended: the actors of a dead learner wait for it up to `learner_timeout_s` (600 s) and
  kept a failed run from being submitted again for that long. They are orphans, cancelled when the
  run is submitted again (`Round.orphans`);
- what `collect` adds to the results: nothing, or the study's table, best trial and plots.

Nothing here imports a scheduler or Optuna at import time: a sweep's round gets the scheduler's
`query` and name, and the Optuna mode imports the study's modules when it is asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.config.experiment import Experiment
from hpcrl.store import expdir, rundir
from hpcrl.store.states import State
from hpcrl.sweep import study

Query = Callable[[list[str]], dict[str, dict[int, str]]]
"""A scheduler's `query`: job ids -> {task id -> state}."""
ACTIVE = (State.PENDING, State.RUNNING)
SERVES = {"actors": "learner"}
"""Stages whose tasks only serve a task of another stage of the same run, which they wait for."""


@dataclass
class Round:
    """What one sweep of the experiment does, as its mode decides it."""

    runs: list[expdir.Run]
    """The runs the sweep writes to runs.csv and experiment.yaml."""
    idle: str
    """The line when there is nothing to submit (printed after the experiment directory)."""
    what: Callable[[str, Sequence[expdir.Job]], str]
    """The line after a submission (printed after the experiment directory), given the scheduler's name and the new jobs."""
    todo: list[int] = field(default_factory=list)
    """Runs to train, a task each."""
    eval_todo: list[int] = field(default_factory=list)
    """Trained runs whose evaluation failed, was cancelled or never ran: eval-only tasks."""
    workers: int = 0
    """Worker tasks that train and evaluate the trials of a study."""
    in_flight: bool = False
    """Work of an earlier sweep is still pending or running (the local executor must keep running it)."""
    orphans: dict[str, list[int]] = field(default_factory=dict)
    """Tasks (job id -> task ids) that serve a run in `todo` whose task they served has ended (actors
    of a dead learner): cancelled before the run is submitted again."""

    @property
    def submits(self) -> bool:
        return bool(self.todo or self.eval_todo or self.workers)


class SearchMode:
    """The questions every mode answers, with a grid's answers: grid points (crossed with the random
    search's samples, when there is one; sweep.runs.expand draws them) times seeds."""

    def first_workers(self, exp: Experiment) -> int:
        """Worker tasks of a first sweep's job plan: none, every run has a task of its own."""
        return 0

    def require(self) -> None:
        """The optional packages the mode needs installed: none."""

    def planned(self, exp: Experiment, n_runs: int, workers: int) -> str:
        """What a dry run would submit."""
        return f"{n_runs} runs"

    def trained_here(self, exp: Experiment, n_runs: int) -> str:
        """What an in-process (debug) sweep would train."""
        return f"{n_runs} runs"

    def round(self, exp: Experiment, runs: list[expdir.Run], jobs: Sequence[expdir.Job], scheduler: str, query: Query, out: Any = None) -> Round:
        """Every run not done and not in flight is trained; done runs without an evaluation get one."""
        root = exp.dir
        runs = expdir.merge_runs(root, runs)
        active = active_tasks(root, scheduler, query, jobs)
        in_flight = {run for stage, by_run in active.items() if stage not in SERVES for run in by_run}
        listings = _listings(root, runs)
        states = {r.index: rundir.run_state(expdir.run_dir(root, r.run_id), listings[r.index]) for r in runs}
        todo = [r.index for r in runs if states[r.index] != State.DONE and r.index not in in_flight]
        orphans: dict[str, list[int]] = {}
        for stage in SERVES:
            for run in todo:
                for job_id, task in active.get(stage, {}).get(run, []):
                    orphans.setdefault(job_id, []).append(task)
        eval_todo = [
            r.index for r in runs
            if states[r.index] == State.DONE and rundir.eval_state(expdir.run_dir(root, r.run_id), listings[r.index]) in (State.NEW, State.FAILED) and r.index not in in_flight
        ]  # fmt: skip
        done = sum(1 for s in states.values() if s == State.DONE)

        def what(scheduler_name: str, new_jobs: Sequence[expdir.Job]) -> str:
            work = f"{len(todo)} of {len(runs)} runs" + (f" and {len(eval_todo)} evaluations" if eval_todo else "")
            return f"submitted {work} to {scheduler_name} ({done} done, {len(in_flight)} in flight) as {len(new_jobs)} jobs: " + ", ".join(f"{j.stage} {j.job_id}" for j in new_jobs)

        idle = f"all {len(runs)} runs are done or in flight ({done} done); nothing submitted"
        return Round(runs, idle, what, todo, eval_todo, in_flight=bool(in_flight), orphans=orphans)

    def holders(self, experiment_dir: Path, exp: Experiment, generation: int) -> dict[tuple[str, str], int]:
        """(runs.csv generation, trial number) -> the worker task that holds the trial: no trials here."""
        return {}

    def collect(self, experiment_dir: Path, results_dir: Path) -> tuple[list[str], dict[str, Path] | None]:
        """Notes and extra plots for the results: none beyond hpcrl's own."""
        return [], None


class Optuna(SearchMode):
    """An Optuna study: no runs until its workers ask for trials; workers are the job plan."""

    def first_workers(self, exp: Experiment) -> int:
        assert exp.sweep.search is not None and exp.sweep.search.n_trials is not None
        return min(exp.sweep.search.n_trials, exp.resources.max_concurrent or study.WORKERS)

    def require(self) -> None:
        study.require_optuna()

    def planned(self, exp: Experiment, n_runs: int, workers: int) -> str:
        assert exp.sweep.search is not None
        return f"an Optuna study of {exp.sweep.search.n_trials} trials, {workers} workers"

    def trained_here(self, exp: Experiment, n_runs: int) -> str:
        return "an Optuna study's trials"

    def round(self, exp: Experiment, runs: list[expdir.Run], jobs: Sequence[expdir.Job], scheduler: str, query: Query, out: Any = None) -> Round:
        """Workers for the trials still to run, unless workers of an earlier sweep are still pending
        or running; a trial left RUNNING by a worker that died is resumed by the task of the same id."""
        root = exp.dir
        state = study.study_state(exp, study.open_study(exp, root, out=out))
        trial_runs = study.trial_runs(root, state.run_ids)
        workers_jobs = [j for j in jobs if j.stage == "study" and j.scheduler == scheduler]
        answer = query([j.job_id for j in workers_jobs]) if workers_jobs else {}
        if any(s in ACTIVE for tasks in answer.values() for s in tasks.values()):
            idle = f"workers of this study are still in flight ({state.finished}/{state.n_trials} trials finished); nothing submitted"
            return Round(trial_runs, idle, _never, in_flight=True)
        workers = study.workers_to_start(exp, root, state)

        def what(scheduler_name: str, new_jobs: Sequence[expdir.Job]) -> str:
            return f"submitted an Optuna study ({state.finished} of {state.n_trials} trials finished) to {scheduler_name} as {len(new_jobs)} jobs: " + ", ".join(
                f"{j.stage} {j.job_id}" + (f" ({workers} workers)" if j.stage == "study" else "") for j in new_jobs
            )

        idle = f"the study has all {state.n_trials} trials ({state.finished} finished); nothing submitted"
        return Round(trial_runs, idle, what, workers=workers)

    def holders(self, experiment_dir: Path, exp: Experiment, generation: int) -> dict[tuple[str, str], int]:
        """The current study's trials (a changed config is a new study; its workers hold none of the old trials)."""
        return {(str(generation), str(number)): task for task, number in study.held_trials(experiment_dir, study.study_name(exp)).items()}

    def collect(self, experiment_dir: Path, results_dir: Path) -> tuple[list[str], dict[str, Path] | None]:
        """The study's own table, best trial and Optuna's plots (sweep/study_results.py)."""
        from hpcrl.sweep.study_results import write_study_results  # deferred: it imports matplotlib and Optuna

        (results_dir / "plots").mkdir(parents=True, exist_ok=True)
        return write_study_results(experiment_dir, results_dir)


MODES: dict[str, SearchMode] = {"grid": SearchMode(), "random": SearchMode(), "optuna": Optuna()}
"""`sweep.search.method` -> its mode; no `sweep.search` is a grid. Random samples are grid points
(sweep.runs.expand crosses them), so random is the grid's mode."""


def of(exp: Experiment) -> SearchMode:
    """The mode of an experiment."""
    return MODES[exp.sweep.search.method if exp.sweep.search is not None else "grid"]


def of_config(config: Mapping[str, Any]) -> SearchMode:
    """The mode of a config as experiment.yaml stores it (a plain dict, as `collect` reads it)."""
    method = ((config.get("sweep") or {}).get("search") or {}).get("method")
    return MODES.get(method or "grid", MODES["grid"])


def active_tasks(experiment_dir: Path, scheduler: str, query: Query, jobs: Sequence[expdir.Job]) -> dict[str, dict[int, list[tuple[str, int]]]]:
    """Stage -> run -> its tasks of that stage (job id, task id) still pending or running: they must
    not be submitted twice."""
    relevant = [j for j in jobs if j.manifest and j.scheduler == scheduler]
    active: dict[str, dict[int, list[tuple[str, int]]]] = {}
    if not relevant:
        return active
    states = query([j.job_id for j in relevant])
    for job in relevant:
        assert job.manifest is not None
        tasks = states.get(job.job_id, {})
        for task, run_index in enumerate(rundir.read_manifest(experiment_dir, job.manifest), start=1):
            if tasks.get(task) in ACTIVE:
                active.setdefault(job.stage, {}).setdefault(run_index, []).append((job.job_id, task))
    return active


def _listings(root: Path, runs: list[expdir.Run]) -> dict[int, frozenset[str]]:
    """Each run's `rundir.listing`, reading only the run directories that exist (one scandir of
    runs/): a first sweep of 10,000 runs makes no call per run."""
    try:
        with os.scandir(expdir.runs_dir(root)) as entries:
            present = {e.name for e in entries}
    except (FileNotFoundError, NotADirectoryError):
        present = set()
    return {r.index: rundir.listing(expdir.run_dir(root, r.run_id)) if r.run_id in present else frozenset() for r in runs}


def _never(scheduler_name: str, new_jobs: Sequence[expdir.Job]) -> str:
    raise AssertionError("a round that submits nothing has no submission line")
