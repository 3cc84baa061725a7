"""`hpcrl sweep`: the stage graph train -> eval -> aggregate, planned (jobplan.py), written and submitted.

Eval task i waits for train task i; the aggregate waits for every eval task whatever its outcome.
One sweep of an experiment runs at a time (a lock on jobs/sweep.lock, held from reading jobs.json
to writing it); a second one refuses with one line and exit 1, since nothing is wrong with its
input. Every script is rendered before anything is written, so a value a directive cannot carry
(jobplan's templates refuse it) leaves nothing behind; and when the scheduler refuses the first
job, what this sweep wrote is rolled back, so a typo in a partition leaves no half experiment.
"""

from __future__ import annotations

import fcntl
import hashlib
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from hpcrl.config.experiment import Experiment
from hpcrl.config.output_dir import check_output_writable
from hpcrl.config.schema import ConfigError
from hpcrl.image.build import image_path_for
from hpcrl.io import atomic_write_text
from hpcrl.runtime import tracking
from hpcrl.schedulers import check_choice, detect_with_reason, get_scheduler
from hpcrl.schedulers.base import Scheduler, SchedulerError
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import Dependency, Job, read_jobs, write_jobs
from hpcrl.submit.distributed import plan_distributed
from hpcrl.submit.dryrun import print_dry_run
from hpcrl.submit.jobplan import (
    PlannedJob,
    check_python,
    node_requests,
    plan_aggregate,
    plan_eval_only,
    plan_study,
    plan_train,
    resolve_container_runtime,
)
from hpcrl.submit.program_module import check_module
from hpcrl.sweep import modes, study
from hpcrl.sweep import runs as sweep


def resolved_image(exp: Experiment) -> str | None:
    """`container.image`, or, when the config has an `image:` section and no explicit path, the SIF
    that `hpcrl build-image` makes for it: one config then names and uses its image."""
    if exp.container.image:
        return exp.container.image
    if exp.image is not None:
        return str(image_path_for(exp))
    return None


def image_provenance(exp: Experiment) -> dict[str, Any]:
    """Refuse to submit jobs that would fail on a missing image; record the image's hash."""
    image = exp.container.image
    if not image:
        return {"image": None}
    path = Path(image)
    if not path.exists():
        raise ConfigError(f"container.image: {image} does not exist; build it with `hpcrl build-image {exp.source or 'CONFIG'}`")
    digest = hashlib.sha256()
    if path.is_file():
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return {"image": str(path.resolve()), "image_sha256": digest.hexdigest() if path.is_file() else None}




@contextmanager
def sweep_lock(experiment_dir: Path) -> Iterator[None]:
    """One `hpcrl sweep` of an experiment at a time: two would submit everything twice and jobs.json
    would keep one set only. Held until jobs.json is written; the second sweep refuses at once."""
    path = experiment_dir / "jobs" / "sweep.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SchedulerError(f"{experiment_dir}: another `hpcrl sweep` of this experiment is submitting; run this one when it has finished") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Submission.


def plan_scripts(
    exp: Experiment, scheduler: Scheduler, todo: list[int], attempt: int, cwd: Path | None = None,
    eval_todo: list[int] | None = None, *, runs: list[expdir.Run] | None = None, workers: int = 0,
) -> list[PlannedJob]:
    """Every script of one submission: training (or learner and actors) with its evals, eval-only
    work for trained runs whose evaluation is missing, and the aggregate after all of them.
    A user's program needs the `runs` (their command lines are in the train scripts); an Optuna
    study has `workers` instead, which train and evaluate its trials."""
    if workers:
        out, evals = plan_study(exp, scheduler, workers, attempt, cwd)
    elif not todo:
        out, evals = [], []
    elif exp.distributed is not None:
        out, evals = plan_distributed(exp, scheduler, todo, attempt, cwd)
    else:
        out, evals = plan_train(exp, scheduler, todo, attempt, cwd, {r.index: r for r in runs or []})
    if eval_todo:
        extra, more = plan_eval_only(exp, scheduler, eval_todo, attempt, cwd, {r.index: r for r in runs or []})
        out, evals = out + extra, evals + more
    return [*out, plan_aggregate(exp, scheduler, attempt, evals, cwd)]


def submit_experiment(
    exp: Experiment,
    scheduler_name: str = "auto",
    *,
    dry_run: bool = False,
    detach: bool = False,
    out: IO[str] | None = None,
    cwd: Path | None = None,
    stages: Mapping[str, Callable[..., int]] | None = None,
) -> int:
    """`hpcrl sweep`: expand, write the experiment, submit what is not done, start the local executor
    (or, with the debug backend, run every task here through `stages`, hpcrl.stages.STAGES)."""
    root = exp.dir
    check_choice(scheduler_name)
    study.resolve_storage(exp)  # before anything is written: a bad URL is refused in one line
    if scheduler_name == "auto":
        scheduler_name, why = detect_with_reason()
        print(f"hpcrl: --scheduler auto chose {scheduler_name}: {why}", file=sys.stderr)
    scheduler = get_scheduler(scheduler_name, root, stages=stages, out=out)
    if cannot := scheduler.cannot(exp):
        raise ConfigError(cannot)
    if (refused := scheduler.refuse(exp, node_requests(exp))) and not dry_run:
        raise ConfigError(refused)  # the machines are too small: a dry run prints the scripts with it as a warning
    # In-process tasks run in this Python, not in a container.
    exp.container.image = None if scheduler.in_process else resolved_image(exp)
    resolve_container_runtime(exp)
    check_python(exp, scheduler)
    check_module(exp)
    if not exp.container.image:  # the jobs run this Python: a required tracker it lacks would be missing in every job
        if problems := tracking.missing_packages(exp.tracking):
            raise ConfigError("; ".join(problems))
    runs = sweep.expand(exp)
    if dry_run and scheduler.in_process:
        what = modes.of(exp).trained_here(exp, len(runs))
        print(f"# dry run (--scheduler {scheduler.name}): {what} would train, be evaluated and collected in this process; nothing written", file=out)
        return 0
    if dry_run:
        planned = plan_scripts(exp, scheduler, list(range(len(runs))), 0, cwd, runs=runs, workers=modes.of(exp).first_workers(exp))
        return print_dry_run(exp, scheduler, planned, runs, out, warning=refused)
    check_output_writable(exp)
    # Every template renders before anything is written: a refused directive value leaves nothing.
    plan_scripts(exp, scheduler, list(range(len(runs))), 0, cwd, eval_todo=[0], runs=runs, workers=modes.of(exp).first_workers(exp))
    modes.of(exp).require()
    provenance = {"scheduler": scheduler.name, **image_provenance(exp)}
    rollback = expdir.Rollback(root)
    try:
        return _sweep_locked(exp, scheduler, runs, provenance, rollback, detach, out, cwd)
    except ConfigError:
        if rollback.created:  # a damaged file found on the way: a new experiment leaves nothing behind
            rollback.undo()
        raise


def _sweep_locked(
    exp: Experiment, scheduler: Scheduler, runs: list[expdir.Run], provenance: dict[str, Any], rollback: expdir.Rollback,
    detach: bool, out: IO[str] | None, cwd: Path | None,
) -> int:
    """The part of a sweep that holds the experiment's sweep lock: from reading jobs.json to writing
    it. The search mode says which runs it writes, what it submits and what is still in flight."""
    root = exp.dir
    with sweep_lock(root):
        scheduler.recover()
        jobs = read_jobs(root)
        plan = modes.of(exp).round(exp, runs, jobs, scheduler.name, scheduler.query, out)
        expdir.write_experiment(exp, plan.runs, provenance)
        if not plan.submits:
            print(f"{root}: {plan.idle}", file=out)
            if not scheduler.runs_here or not plan.in_flight:
                return 0
        else:
            if plan.orphans:  # they would wait for the dead learner, or join the new one beside its own actors
                scheduler.cancel_tasks(plan.orphans)
                print(f"{root}: cancelled {sum(map(len, plan.orphans.values()))} tasks that served runs whose learner had ended", file=out)
            attempt = max((j.attempt for j in jobs), default=-1) + 1
            new_jobs = _submit(exp, scheduler, plan_scripts(exp, scheduler, plan.todo, attempt, cwd, plan.eval_todo, runs=plan.runs, workers=plan.workers), attempt, jobs, rollback)
            print(f"{root}: {plan.what(scheduler.name, new_jobs)}", file=out)
        if detach:  # inside the lock: the next sweep must find the runner alive, not its jobs to settle
            return scheduler.start(root, detach)
    return scheduler.start(root, detach)


def _submit(exp: Experiment, scheduler: Scheduler, planned_jobs: list[PlannedJob], attempt: int, jobs: list[Job], rollback: expdir.Rollback) -> list[Job]:
    """Write and submit each planned job in order; jobs.json is rewritten after every accepted one."""
    root = exp.dir
    (root / "jobs" / "logs").mkdir(parents=True, exist_ok=True)
    script_ids: dict[str, str] = {}
    new_jobs: list[Job] = []
    for planned in planned_jobs:
        script = root / planned.script
        if planned.manifest:
            rundir.write_manifest(root, planned.manifest, planned.runs)
            rollback.written.append(root / planned.manifest)
        if not scheduler.in_process:  # a task in this process needs no script
            atomic_write_text(script, planned.text)
            rollback.written.append(script)
            script.chmod(0o755)
        after = [Dependency(script_ids[s], kind) for s, kind in planned.after]  # type: ignore[arg-type]
        try:
            job_id = scheduler.submit(script, planned.tasks, after)
        except SchedulerError:
            if not new_jobs:  # nothing accepted: leave the experiment as it was before this sweep
                rollback.undo()
            raise
        script_ids[planned.script] = job_id
        new_jobs.append(Job(planned.stage, job_id, scheduler.name, planned.script, planned.tasks, planned.manifest, after, attempt, planned.resources.as_dict()))
        write_jobs(root, jobs + new_jobs)  # after every submission: a crash half-way still leaves a record
    return new_jobs
