"""Scheduler backends behind one interface (`base.Scheduler`), chosen by name or found on PATH."""

from __future__ import annotations

import shutil
from pathlib import Path

from hpcrl.schedulers.base import Scheduler


def detect() -> str:
    """`auto`: Slurm when sbatch is on PATH, else Grid Engine when qsub is, else the local machine."""
    if shutil.which("sbatch"):
        return "slurm"
    if shutil.which("qsub"):
        return "sge"
    return "local"


def get_scheduler(name: str, experiment_dir: Path) -> Scheduler:
    """A backend by name (`auto` detects one); the local backend keeps its state in the experiment."""
    if name == "auto":
        name = detect()
    if name == "local":
        from hpcrl.schedulers.local import LocalScheduler

        return LocalScheduler(experiment_dir)
    if name == "slurm":
        from hpcrl.schedulers.slurm import SlurmScheduler

        return SlurmScheduler()
    if name == "sge":
        from hpcrl.schedulers.sge import SGEScheduler

        return SGEScheduler()
    raise ValueError(f"unknown scheduler {name!r}: expected auto, local, slurm or sge")
