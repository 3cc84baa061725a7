"""`hpcrl search-worker`: one task of an Optuna study's worker array, inside a job.

A worker asks the study for a trial, makes it a run (run directory, runs.csv row), trains it in
this process while reporting the metric to the trial (a pruner may stop it), evaluates it, tells
the study how it ended, and asks for the next, until the study has `n_trials` trials.

- Exactly `n_trials` trials: the count is checked and the trial asked for under one lock in the
  experiment directory (Optuna's own O_EXCL lock file, which holds on NFS), so two workers that
  ask at once never make a trial too many.
- No trial lost, none told twice: before asking, a worker writes nothing; after asking, it
  records the trial's number and the study's name in `optuna/workers/<task id>`, inside the same
  lock. A requeued task has the same task id (Slurm and Grid Engine keep it), finds its record,
  and resumes that trial's run from its checkpoint if the study still has the trial RUNNING; a
  record of a trial the study already knows as finished is dropped. The record goes only after
  the study is told. So a RUNNING trial that no record holds has lost its end (a torn journal
  record) or its worker died inside the lock: the next worker that asks adopts it. The one that
  asks reads the records before the trials: a trial told (and its record removed) between the
  two reads is then seen finished, not as an orphan.
- The scheduler's warning: during training, the trainer checkpoints and the worker exits with
  the requeue code, leaving the trial RUNNING for its next lifetime; between trials, the worker
  stops before asking for another.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TextIO

from hpcrl.config.experiment import Experiment
from hpcrl.config.key_paths import learned_settings
from hpcrl.config.load import apply_settings
from hpcrl.config.output_dir import run_id
from hpcrl.config.schema import ConfigError, plain
from hpcrl.config.sweep_spec import Distribution
from hpcrl.io import atomic_write_text
from hpcrl.store import expdir, rundir, runlock
from hpcrl.store.expdir import Run
from hpcrl.store.states import REQUEUE_EXIT
from hpcrl.sweep import runs as sweep
from hpcrl.sweep import study
from hpcrl.sweep.study import metric_key

_SCALAR = (str, int, float, bool, type(None))


def suggest(trial: Any, key: str, dist: Distribution) -> Any:
    """The trial's value of one searched key (a resumed trial gets the value it already has)."""
    if dist.type == "choice":
        if all(isinstance(v, _SCALAR) for v in dist.values):
            return trial.suggest_categorical(key, [plain(v) for v in dist.values])
        # Optuna's categorical takes scalars: a list option (hidden_sizes) goes as its JSON text.
        return json.loads(trial.suggest_categorical(key, [json.dumps(plain(v)) for v in dist.values]))
    assert dist.low is not None and dist.high is not None
    if dist.type == "int":
        return trial.suggest_int(key, int(dist.low), int(dist.high), log=dist.log)
    return trial.suggest_float(key, dist.low, dist.high, log=dist.type == "loguniform" or dist.log)


def trial_run(exp: Experiment, name: str, number: int, params: dict[str, Any]) -> Run:
    """The run of trial `number`: its id hashes what it learns with the study and trial number, so
    two trials that drew the same values are still two runs. ConfigError when the values break a
    rule that joins keys (a batch larger than the buffer)."""
    seed = exp.sweep.seeds[0]
    # Trained as rounded to 6 significant digits, as a random search's points are: labels stay readable.
    params = {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in params.items()}
    config = apply_settings(exp, params, seed)
    data = config.to_dict()
    settings = {"trial": number, **{key: sweep.get_dotted(data, key) for key in params}}
    blob = json.dumps([learned_settings(config), name, number], sort_keys=True, default=str).encode()
    return Run(-1, run_id(hashlib.sha256(blob).hexdigest(), seed), seed, settings, config)


class Reporter:
    """Reports a trial's metric as it trains and asks the pruner; steps are percent of the budget,
    so trials of different batch sizes are compared at the same point of their training."""

    def __init__(self, trial: Any, exp: Experiment, total_steps: int, resume_step: int) -> None:
        search = exp.sweep.search
        assert search is not None
        self.trial, self.pruner = trial, search.pruner
        self.key = metric_key(exp)
        self.total = max(1, total_steps)
        self.last = min(100, resume_step * 100 // self.total)
        """Percent already reported by an earlier lifetime: its reports up to the checkpoint stand."""

    def __call__(self, step: int, scalars: dict[str, float]) -> str | None:
        value = scalars.get(self.key)
        at = min(100, step * 100 // self.total)
        if value is None or not math.isfinite(value) or at <= self.last:
            return None
        self.last = at
        self.trial.report(float(value), at)
        if self.pruner != "none" and self.trial.should_prune():
            return f"pruned by the {self.pruner} pruner at {at}% of the budget ({self.key} {value:.4g})"
        return None


def final_value(exp: Experiment, rd: Path) -> float:
    """A finished trial's value: its last evaluation during training (the one at the end), or the
    mean return of its last training rows."""
    if metric_key(exp) == "eval/mean_return":
        _, returns = rundir.read_eval_curve(rd)
        return float(returns[-1]) if len(returns) else math.nan
    return rundir.final_return(rd)


Train = Callable[..., int]
"""rl.train.train_run's shape: (experiment_dir, run, out, progress=...) -> exit code."""
Evaluate = Callable[[Path, Run, TextIO | None], int]
"""rl.evaluate.evaluate_run's shape."""


class Stop(Protocol):
    """runtime.guard.StopFlag's shape: true once the scheduler's warning came, `signal` says which."""

    signal: int | None

    def __bool__(self) -> bool: ...


class Worker:
    """One worker task. `train` and `evaluate` are the in-job entry points of a run, and `stop_flag`
    catches the scheduler's warning between trials (hpcrl.stages hands in hpcrl's own: guard's
    StopFlag; a worker that only claims trials needs none): a study decides what to try, and never
    imports the training stack or the job's signal handling."""

    def __init__(
        self,
        experiment_dir: Path,
        task: int,
        out: TextIO | None,
        *,
        train: Train | None = None,
        evaluate: Evaluate | None = None,
        stop_flag: Callable[[], Stop] | None = None,
    ) -> None:
        self.root, self.task, self.out = experiment_dir, task, out
        self.train, self.evaluate, self.stop_flag = train, evaluate, stop_flag
        self.exp, self.generation = expdir.load_experiment_config(experiment_dir)
        if not study.is_study(self.exp):
            raise ConfigError(f"{experiment_dir}: not an Optuna study (sweep.search.method is not optuna)")
        self.optuna = study.require_optuna()
        self.name = study.study_name(self.exp)
        self.study = study.open_study(self.exp, experiment_dir, out=out)
        self.study.sampler = study._sampler(self.optuna, self.exp, task * 100_003 + len(self.study.get_trials(deepcopy=False)))
        self.stop: Stop | None = None
        """The warning signal's flag between trials (the trainer has its own while it trains)."""
        self.record = experiment_dir / study.STUDY_DIR / "workers" / str(task)
        self.lock_path = experiment_dir / study.STUDY_DIR / "ask.lock"
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)  # an RDB study has no journal to make it

    def claim(self) -> Any | None:
        """The trial this task holds (a requeue), else a new one while the study has fewer than
        n_trials; None when it is complete. Under the ask lock, with the record written inside it."""
        # A lock file that a killed worker left is taken over after Optuna's 30 s grace period.
        lock = self.optuna.storages.journal.JournalFileOpenLock(str(self.lock_path))
        lock.acquire()
        try:
            # The records first, then the trials: a worker tells its trial and then removes its record
            # outside this lock, so read the other way round a trial told between the reads looked
            # RUNNING and held by nobody, and was adopted (Optuna refuses to update it: the worker died).
            # New records are written only under this lock, so a trial RUNNING after the records were
            # read and held by none of them is an orphan.
            held = study.held_trials(self.root, self.name)
            trials = self.study.get_trials(deepcopy=False)
            running = {t.number: t for t in trials if t.state == self.optuna.trial.TrialState.RUNNING}
            mine = held.pop(self.task, None)
            if mine is not None:
                if mine in running:
                    print(f"trial {mine}: resumed by worker {self.task}", file=self.out)
                    return self.optuna.trial.Trial(self.study, running[mine]._trial_id)
                self.record.unlink(missing_ok=True)  # told before the record went: nothing to redo
            # RUNNING but held by no worker: its end was lost with a torn journal record, or its worker
            # was killed between asking and writing the record. Nobody else will ever finish it.
            orphan = next((t for number, t in sorted(running.items()) if number not in held.values()), None)
            if orphan is not None:
                atomic_write_text(self.record, f"{orphan.number} {self.name}\n")
                print(f"trial {orphan.number}: adopted by worker {self.task} (RUNNING, held by no worker)", file=self.out)
                return self.optuna.trial.Trial(self.study, orphan._trial_id)
            search = self.exp.sweep.search
            assert search is not None and search.n_trials is not None
            if len(trials) >= search.n_trials:
                return None
            trial = self.study.ask()
            atomic_write_text(self.record, f"{trial.number} {self.name}\n")
            return trial
        finally:
            lock.release()

    def run(self) -> int:
        """Trials until the study has n_trials; the exit code of the task."""
        while True:
            trial = self.claim()
            if trial is None:
                print(f"worker {self.task}: the study has all its trials", file=self.out)
                return 0
            code = self.run_trial(trial)
            if code is not None:
                return code
            self.record.unlink(missing_ok=True)
            if self.stop:
                print(f"worker {self.task}: signal {self.stop.signal} after trial {trial.number}: asking for a requeue", file=self.out)
                return REQUEUE_EXIT

    def run_trial(self, trial: Any) -> int | None:
        """Train, evaluate and tell one trial; an exit code when the worker must stop (requeue, a run locked by another)."""
        State = self.optuna.trial.TrialState
        search = self.exp.sweep.search
        assert search is not None
        try:
            params = {key: suggest(trial, key, search.space[key]) for key in sorted(search.space)}
            run = trial_run(self.exp, self.name, trial.number, params)
        except ConfigError as exc:
            print(f"trial {trial.number}: failed: {exc}", file=self.out)
            self.study.tell(trial, state=State.FAIL)
            return None
        trial.set_user_attr("run_id", run.run_id)
        run = expdir.add_run(self.root, run, self.generation)
        rd = expdir.run_dir(self.root, run.run_id)
        print(f"trial {trial.number}: run {run.run_id} ({run.setting_label})", file=self.out)
        assert self.train is not None and self.evaluate is not None and self.stop_flag is not None, "a worker that trains is given its entry points"
        try:
            code = self.train(self.root, run, self.out, progress=Reporter(trial, self.exp, run.config.train.total_steps, rundir.last_logged_step(rd)))
        except Exception as exc:  # the FAILED marker has the traceback; the other trials go on
            print(f"trial {trial.number}: training failed: {type(exc).__name__}: {exc}", file=self.out)
            code = 1
        finally:
            self.stop = self.stop_flag()  # the warning may come while the trial is evaluated and told
        if code == REQUEUE_EXIT or code == runlock.LOCKED_EXIT:
            return code
        if rundir.run_state(rd) != "done":
            self.study.tell(trial, state=State.FAIL)
            return None
        if rundir.eval_state(rd) == "new":
            self.evaluate(self.root, run, self.out)
        if (rd / rundir.PRUNED).exists():
            self.study.tell(trial, state=State.PRUNED)
            return None
        value = final_value(self.exp, rd)
        if math.isfinite(value):
            self.study.tell(trial, value)
            print(f"trial {trial.number}: {value:.4g}", file=self.out)
        else:
            print(f"trial {trial.number}: no finite {metric_key(self.exp)} to report: failed", file=self.out)
            self.study.tell(trial, state=State.FAIL)
        return None


def run_worker(experiment_dir: Path, task: int, out: TextIO | None = None, *, train: Train, evaluate: Evaluate, stop_flag: Callable[[], Stop]) -> int:
    return Worker(experiment_dir, task, out, train=train, evaluate=evaluate, stop_flag=stop_flag).run()
