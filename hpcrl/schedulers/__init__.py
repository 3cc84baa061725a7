"""Scheduler backends behind one interface (`base.Scheduler`), chosen by name or found on PATH."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from hpcrl.config.schema import ConfigError, choice_problem
from hpcrl.schedulers.base import Scheduler

BACKENDS = ("local", "slurm", "sge")
"""The schedulers with a backend class (`get_scheduler`): the one list of them."""
DEBUG = "debug"
"""Every task in the sweep's own process (hpcrl.schedulers.debug): a sweep's choice, not a build job's."""
SWEEP_CHOICES = ("auto", *BACKENDS, DEBUG)
"""What `hpcrl sweep --scheduler` and `hpcrl.api.sweep(scheduler=...)` take."""


def check_choice(name: str, choices: tuple[str, ...] = SWEEP_CHOICES) -> None:
    """`--scheduler ...` from the API (argparse checks the CLI's against the same tuple)."""
    if name not in choices:
        raise ConfigError(f"--scheduler: {choice_problem(name, choices)}")


def detect_with_reason() -> tuple[str, str]:
    """`auto`: Slurm when sbatch is on PATH, else Grid Engine when qsub is, else the local machine;
    with the reason in words, which `hpcrl sweep` prints so that a forgotten --scheduler is noticed."""
    for name, tool in (("slurm", "sbatch"), ("sge", "qsub")):
        found = shutil.which(tool)
        if found:
            return name, f"{tool} is on PATH ({found}); pass --scheduler to choose another"
    return "local", "neither sbatch nor qsub is on PATH; pass --scheduler to choose another"


def detect() -> str:
    return detect_with_reason()[0]


def backend_class(name: str) -> type[Scheduler]:
    """The backend class of a name (`auto` detects one), for its capabilities before one is made."""
    check_choice(name)
    if name == "auto":
        name = detect()
    if name == DEBUG:
        from hpcrl.schedulers.debug import DebugScheduler

        return DebugScheduler
    if name == "local":
        from hpcrl.schedulers.local import LocalScheduler

        return LocalScheduler
    if name == "slurm":
        from hpcrl.schedulers.slurm import SlurmScheduler

        return SlurmScheduler
    from hpcrl.schedulers.sge import SGEScheduler

    return SGEScheduler


def get_scheduler(
    name: str, experiment_dir: Path, *, stages: Mapping[str, Callable[..., int]] | None = None, out: IO[str] | None = None
) -> Scheduler:
    """A backend by name (`auto` detects one); the local backend keeps its state in the experiment.
    The debug backend runs tasks through `stages` (hpcrl.stages.STAGES, handed in by the caller)."""
    return backend_class(name).create(experiment_dir, stages, out)
