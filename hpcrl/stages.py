"""The one table of in-job entry points: what a job script's `hpcrl <stage> EXPERIMENT --task N`
runs, and what the debug backend calls in its own process.

Each entry takes the experiment directory and the array task (with the job's manifest, task N is
the run on its line N; without one, the run index itself) and returns the exit code a job would.
The CLI only parses arguments and calls these (after taking the scheduler's warnings, which a job
needs and a debugger's process must not get); `schedulers.debug` calls them, through STAGES, for
the jobs a sweep planned. The training stack is imported inside the entries, when one runs.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from hpcrl.config.schema import ConfigError
from hpcrl.store import rundir
from hpcrl.store.expdir import Run, load_run, run_dir


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Import a stage's stack (torch: ~170k objects) with the garbage collector off, then freeze what exists.

    A job's imports are kept for its life, yet they cost full collections over every object so far: three while
    torch imported and one more at the interpreter's exit. `import torch` alone took 1.45 s of user CPU here and
    1.05 s this way; a train or eval task of the conformance sweep is ~1.4 s in all, and the suite starts hundreds.
    Frozen, they are also left out of the full collections that come later in a long run. Only the first time in a
    process: a freeze keeps for ever the cyclic garbage not yet collected, and a process that runs several stages (the
    debug backend, an Optuna worker) would keep what each earlier stage left."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            gc.freeze()
        if enabled:
            gc.enable()


def task_run(experiment_dir: Path, task: int, manifest: str | None) -> Run:
    """The run of an array task: line `task` of the manifest, or run index `task` without one."""
    return load_run(experiment_dir, rundir.task_run(experiment_dir, manifest, task) if manifest else task)


def train(experiment_dir: Path, task: int, manifest: str | None = None, *, ranks: int | None = None, program: list[str] | None = None, out: IO[str] | None = None) -> int:
    """`hpcrl train`: one run's training; with `ranks`, the single-host launcher of its ranks (local, Grid Engine)."""
    out = out or sys.stdout
    run = task_run(experiment_dir, task, manifest)
    if ranks is not None:
        if ranks != run.config.resources.ranks:
            raise ConfigError(f"--ranks {ranks}: run {run.run_id} has resources.ranks {run.config.resources.ranks}")
        if ranks > 1:
            from hpcrl.runtime.launch import launch

            child = [sys.executable, "-m", "hpcrl", "train", str(experiment_dir), "--task", str(task), *(["--manifest", manifest] if manifest else [])]
            return launch(child, ranks, run_dir(experiment_dir, run.run_id), out=out)
    if run.config.algo == "program":
        with quiet_imports():
            from hpcrl.runtime.program import train_program
        return train_program(experiment_dir, run, program, out=out)
    if program:
        raise ConfigError(f"{run.run_id}: a command after -- is for algo 'program'; this run's algo is {run.config.algo!r}")
    with quiet_imports():
        from hpcrl.rl.train import train_run
    return train_run(experiment_dir, run, out=out)


def evaluate(experiment_dir: Path, task: int, manifest: str | None = None, *, program: list[str] | None = None, out: IO[str] | None = None) -> int:
    """`hpcrl eval`: one run's evaluation (its markers decide whether there is one: guard.guarded_eval)."""
    out = out or sys.stdout
    run = task_run(experiment_dir, task, manifest)
    if run.config.algo == "program":
        from hpcrl.runtime.program import evaluate_program

        return evaluate_program(experiment_dir, run, program, out=out)
    if program:
        raise ConfigError(f"{run.run_id}: a command after -- is for algo 'program'; this run's algo is {run.config.algo!r}")
    from hpcrl.runtime.guard import guarded_eval

    def body(rd: Path) -> int:
        # torch and the env stack (~2 CPU-s) only for a run whose training is done: an eval task of a failed or
        # unfinished one (every scheduler starts it: SGE regardless, the local runner after any end) only marks it skipped
        with quiet_imports():
            from hpcrl.rl.evaluate import evaluate_trained
        return evaluate_trained(rd, run, out)

    return guarded_eval(experiment_dir, run, body, out)


def learner(experiment_dir: Path, task: int, manifest: str | None = None, *, out: IO[str] | None = None) -> int:
    """`hpcrl learner`: the learner of one distributed run."""
    with quiet_imports():
        from hpcrl.distributed.learner import run_learner
    return run_learner(experiment_dir, task_run(experiment_dir, task, manifest), out=out or sys.stdout)


def actor(experiment_dir: Path, task: int, manifest: str | None = None, *, actor: int = 0, out: IO[str] | None = None) -> int:
    """`hpcrl actor`: one actor of a distributed run (with a manifest, task N is actor k of run R)."""
    with quiet_imports():
        from hpcrl.distributed.actor import run_actor
    index, which = rundir.actor_of_task(experiment_dir, manifest, task) if manifest else (task, actor)
    return run_actor(experiment_dir, load_run(experiment_dir, index), which, out=out or sys.stdout)


def search_worker(experiment_dir: Path, task: int, manifest: str | None = None, *, out: IO[str] | None = None) -> int:
    """`hpcrl search-worker`: one worker of an Optuna study, trials until n_trials."""
    with quiet_imports():
        from hpcrl.rl.evaluate import evaluate_run
        from hpcrl.rl.train import train_run
        from hpcrl.runtime.guard import StopFlag
        from hpcrl.sweep.study_worker import run_worker
    return run_worker(experiment_dir, task, out or sys.stdout, train=train_run, evaluate=evaluate_run, stop_flag=StopFlag)


def aggregate(experiment_dir: Path, task: int = 0, manifest: str | None = None, *, out: IO[str] | None = None) -> int:
    """The aggregate stage (`hpcrl collect`): tables, plots and the report of every run."""
    with quiet_imports():
        from hpcrl.results.collect import collect
    return collect(experiment_dir, out=out)


STAGES: dict[str, Callable[..., int]] = {
    "train": train, "eval": evaluate, "learner": learner, "actors": actor, "study": search_worker, "aggregate": aggregate,
}
"""A planned job's stage (jobs.json `stage`) -> its entry point: what the debug backend runs."""
