"""`hpcrl sweep --scheduler debug`: the planned jobs, run in the calling process one after the other.

As submitit's DebugExecutor and SEML's `--debug` do, so that `breakpoint()`, pdb and a debugger's
breakpoints work in hpcrl's code and a traceback reaches the terminal. It is a backend like the
others: the sweep plans the jobs by the same rules (a done run is skipped; a done run's evaluation
runs again only where it failed or never ran) and records them in jobs.json, so a debugged run is
an ordinary run of the experiment and a later sweep on a cluster skips what is done. `start` then
runs every task of those jobs in the order they were submitted (each job after the jobs it depends
on) through the in-job entry points that job scripts call (hpcrl.stages, handed in by the caller:
nothing here imports the training stack). There are no job scripts, no requeue and no
parallelism. What needs several processes is refused in one line: Ape-X actors, and more than one
rank per run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, ClassVar

from hpcrl.config.experiment import Experiment
from hpcrl.schedulers.base import Scheduler, SchedulerError
from hpcrl.store import rundir
from hpcrl.store.expdir import Dependency, load_run, read_jobs


class DebugScheduler(Scheduler):
    name: ClassVar[str] = "debug"
    template: ClassVar[str] = "local.sh.j2"
    runs_here: ClassVar[bool] = True
    in_process: ClassVar[bool] = True

    def __init__(self, experiment_dir: Path, stages: Mapping[str, Callable[..., int]] | None = None, out: IO[str] | None = None) -> None:
        super().__init__()
        self.dir = experiment_dir
        self.stages = stages
        self.out = out
        self.submitted: list[str] = []
        """The job ids this sweep submitted, in order: what `start` runs."""

    @classmethod
    def create(cls, experiment_dir: Path, stages: Mapping[str, Callable[..., int]] | None, out: IO[str] | None) -> DebugScheduler:
        return cls(experiment_dir, stages, out)

    def cannot(self, exp: Experiment) -> str | None:
        if exp.distributed is not None:
            return "--scheduler debug: distributed (Ape-X) runs a learner beside actor jobs, which one process cannot; debug the learner on a cluster or locally"
        if exp.resources.ranks > 1:
            return f"--scheduler debug: resources.ranks is {exp.resources.ranks}; one process is one rank (use -p resources.ranks=1 to debug the algorithm)"
        return None

    def render(self, context: dict[str, Any], cwd: Path | None = None) -> str:
        return ""  # no script is written or run: the tasks are calls in this process

    def submit(self, script: Path, size: int, after: list[Dependency]) -> str:
        self.submitted.append(f"debug-{script.stem}")
        return self.submitted[-1]

    def query(self, job_ids: list[str]) -> dict[str, dict[int, str]]:
        return {}  # no task outlives the sweep that ran it: the markers on disk say how each ended

    def cancel(self, job_ids: list[str]) -> None:
        return None

    def start(self, experiment_dir: Path, detach: bool) -> int:
        """Every task of this sweep's jobs, here: the exit code of the first failure, else 0. An
        exception is not caught beyond what a job would do: it reaches the caller, where a debugger stops."""
        if self.stages is None:
            raise SchedulerError("--scheduler debug: no in-job entry points to run the tasks with (hpcrl.api.sweep and the CLI pass hpcrl.stages)")
        mine = {job.job_id: job for job in read_jobs(experiment_dir) if job.scheduler == self.name}
        first_failure = 0
        for job in (mine[job_id] for job_id in self.submitted if job_id in mine):
            for task in range(1, job.size + 1) if job.size else [0]:
                print(self._what(experiment_dir, job.stage, task, job.manifest), file=self.out)
                code = self.stages[job.stage](experiment_dir, task, job.manifest, out=self.out)
                first_failure = first_failure or code
        self.submitted = []
        return first_failure

    @staticmethod
    def _what(experiment_dir: Path, stage: str, task: int, manifest: str | None) -> str:
        """The line printed before a task: the run of a train or eval task, else the stage and task."""
        if manifest and stage in ("train", "eval"):
            run = load_run(experiment_dir, rundir.task_run(experiment_dir, manifest, task))
            return f"[debug] {stage} {run.run_id}" + (f" ({run.setting_label}, seed {run.seed})" if stage == "train" else "")
        return f"[debug] {stage}" + (f" task {task}" if task else "")
