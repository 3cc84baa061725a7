"""hpcrl from Python (a notebook, a script that drives several sweeps)::

    from hpcrl.api import collect, status, sweep

    exp_dir = sweep("configs/cartpole_ppo.yaml", "train.lr=3e-4", "sweep.seeds=3", scheduler="local")
    print(status(exp_dir)["counts"])           # {'runs': 3, 'state': {'done': 3}, 'train': ..., 'eval': ...}
    collect(exp_dir)                           # results/summary.csv, curves.csv, plots, report.html

Each function does what its command does, with the same arguments (overrides are the CLI's
`key=value` words), the same checks and the same files, and prints what the command prints to
`out` (stdout by default). Where the command prints `hpcrl: error: ...` and exits 2 (a bad config,
a bad selection) or 1 (a scheduler that refused), the function raises `ConfigError` or
`SchedulerError` with that line. A command's non-zero exit that is not an error of the call (a run
that failed) is the function's return value, as the exit code is the command's, except where a
function returns data: `sweep` returns the experiment directory and `status` the `--json` document.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from hpcrl.config.experiment import Experiment
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.schedulers.base import SchedulerError
from hpcrl.store import expdir

__all__ = ["ConfigError", "SchedulerError", "SweepFailed", "cancel", "collect", "load", "status", "sweep"]


class SweepFailed(RuntimeError):
    """A sweep that ran (locally, or in debug) and ended with failed runs: `exit_code` is the CLI's."""

    def __init__(self, experiment_dir: Path, exit_code: int) -> None:
        super().__init__(f"{experiment_dir}: the sweep ended with exit code {exit_code}; `hpcrl status {experiment_dir}` names the failed runs")
        self.experiment_dir, self.exit_code = experiment_dir, exit_code


def load(config: str | Path, *overrides: str, name: str | None = None) -> Experiment:
    """The validated config, as `hpcrl sweep` reads it (ConfigError naming the file and key)."""
    return load_experiment(config, list(overrides), name=name)


def sweep(
    config: str | Path, *overrides: str, scheduler: str = "auto", name: str | None = None, dry_run: bool = False, detach: bool = False,
    out: IO[str] | None = None,
) -> Path:
    """`hpcrl sweep CONFIG key=value ... --scheduler S`: the experiment directory. Raises SweepFailed
    where the command would exit non-zero without an error of the call (a local run that failed)."""
    from hpcrl.rl.envcheck import check_environment
    from hpcrl.stages import STAGES
    from hpcrl.submit.pipeline import submit_experiment

    exp = load(config, *overrides, name=name)
    check_environment(exp)
    if exp.program is not None:
        from hpcrl.submit.program_help import warn_unlisted_flags

        warn_unlisted_flags(exp)
    code = submit_experiment(exp, scheduler, dry_run=dry_run, detach=detach, out=out or sys.stdout, stages=STAGES)
    if code != 0:
        raise SweepFailed(exp.dir, code)
    return exp.dir


def status(experiment: str | Path, *, states: Iterable[str] = (), settings: Iterable[str] = (), run_ids: Iterable[str] = ()) -> dict[str, Any]:
    """`hpcrl status EXP --json [--state ...] [--setting ...] [--run ...]`, as a dict (one scheduler query)."""
    from hpcrl.status import add_detail, collect_status, selection, status_json

    root = experiment_dir(experiment)
    selected = selection(root, states, settings, run_ids)
    found = collect_status(root, detail=False)
    add_detail(root, selected.keep(found.rows))
    return status_json(root, found, selected)


def collect(experiment: str | Path, *, agg: str = "iqm", evaluate: bool = False, normalize: bool | None = None, out: IO[str] | None = None) -> int:
    """`hpcrl collect EXP`: writes results/ and returns the command's exit code (1 when runs are missing or corrupt)."""
    from hpcrl.results.collect import collect as collect_experiment

    return collect_experiment(experiment_dir(experiment), out=out or sys.stdout, agg=agg, evaluate=evaluate, normalize=normalize)


def cancel(experiment: str | Path, *, states: Iterable[str] = (), settings: Iterable[str] = (), run_ids: Iterable[str] = (), out: IO[str] | None = None) -> int:
    """`hpcrl cancel EXP [--state ...] [--setting ...] [--run ...]`."""
    from hpcrl.status import cancel_experiment

    return cancel_experiment(experiment_dir(experiment), out=out or sys.stdout, states=states, settings=settings, run_ids=run_ids)


def experiment_dir(experiment: str | Path) -> Path:
    """An experiment directory (it has runs.csv), as the commands check it."""
    return expdir.require_experiment(Path(experiment))
