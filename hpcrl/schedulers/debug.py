"""`hpcrl sweep --scheduler debug`: every stage's work in the calling process, one after the other.

As submitit's DebugExecutor and SEML's `--debug` do, so that `breakpoint()`, pdb and a debugger's
breakpoints work in hpcrl's code and a traceback reaches the terminal. It writes the same run
directories a scheduler's jobs would (experiment.yaml, runs.csv, each run's train.csv, checkpoints,
eval.csv, the results), so a debugged run is an ordinary run of the experiment: a later sweep on a
cluster skips what is done. There are no job scripts, no array, no requeue and no parallelism:
runs train one at a time, then each is evaluated, then `collect` runs. What needs several
processes is refused in one line: Ape-X actors, and more than one rank per run.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from hpcrl.config.experiment import ConfigError, Experiment
from hpcrl.schedulers import DEBUG
from hpcrl.store import rundir
from hpcrl.sweep import runs as sweep
from hpcrl.sweep import study

NAME = DEBUG


def check(exp: Experiment) -> None:
    """What cannot run in one process, refused before anything is written."""
    if exp.distributed is not None:
        raise ConfigError("--scheduler debug: distributed (Ape-X) runs a learner beside actor jobs, which one process cannot; debug the learner on a cluster or locally")
    if exp.resources.ranks > 1:
        raise ConfigError(f"--scheduler debug: resources.ranks is {exp.resources.ranks}; one process is one rank (use -p resources.ranks=1 to debug the algorithm)")


def run(exp: Experiment, runs: list[sweep.Run], provenance: dict[str, Any], out: IO[str] | None) -> int:
    """Train, evaluate and collect every run in this process (the caller holds the sweep lock); the
    exit code of the first failure, else 0.

    An exception is not caught beyond what a job would do (the run's FAILED marker): it reaches
    the caller with its traceback, where a debugger stops."""
    from hpcrl.results.collect import collect  # deferred: collect imports matplotlib

    root = exp.dir
    check(exp)
    if study.is_study(exp):
        from hpcrl.sweep.study_worker import Worker

        state = study.study_state(exp, study.open_study(exp, root))
        sweep.write_experiment(exp, study.trial_runs(root, state.run_ids), provenance)
        code = Worker(root, 0, out).run()
    else:
        runs = sweep.merge_runs(root, runs)
        sweep.write_experiment(exp, runs, provenance)
        code = _train_and_evaluate(exp, runs, out)
    collect(root, out=out)
    return code


def _train_and_evaluate(exp: Experiment, runs: list[sweep.Run], out: IO[str] | None) -> int:
    root = exp.dir
    first_failure = 0
    for run in runs:
        print(f"[debug] train {run.run_id} ({run.setting_label}, seed {run.seed})", file=out)
        code = _train(root, run, out)
        first_failure = first_failure or code
    for run in runs:
        rd = sweep.run_dir(root, run.run_id)
        if rundir.eval_state(rd) == "done":
            continue
        print(f"[debug] eval {run.run_id}", file=out)
        first_failure = first_failure or _evaluate(root, run, out)
    return first_failure


def _train(root: Path, run: sweep.Run, out: IO[str] | None) -> int:
    if run.config.algo == "program":
        from hpcrl.runtime.program import train_program

        return train_program(root, run, None, out=out)
    from hpcrl.rl.train import train_run

    return train_run(root, run, out=out)


def _evaluate(root: Path, run: sweep.Run, out: IO[str] | None) -> int:
    if run.config.algo == "program":
        from hpcrl.runtime.program import evaluate_program

        return evaluate_program(root, run, out=out)
    from hpcrl.rl.evaluate import evaluate_run

    return evaluate_run(root, run, out=out)
