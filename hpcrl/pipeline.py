"""The stage graph: train -> eval -> aggregate, rendered and submitted as one array job per stage.

Eval task i waits for train task i; the aggregate waits for every eval task whatever its outcome.
Arrays larger than the cluster allows are split into chunks, and each chunk has a manifest (line i
is the run index of array task i), which is also how a retry resubmits an arbitrary set of runs as
one contiguous array on every scheduler.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import hpcrl
from hpcrl import rundir, sweep
from hpcrl.config import ConfigError, Experiment, format_time, parse_mem_mb, parse_time_s
from hpcrl.io import atomic_write_text
from hpcrl.schedulers import get_scheduler
from hpcrl.schedulers.base import REQUEUE_EXIT, Dependency, Job, Scheduler

STAGES = ("train", "eval", "aggregate")
_DIRECTIVE_SAFE = re.compile(r"[A-Za-z0-9._/+,=@~-]+")


def job_context(
    exp: Experiment,
    stage: str,
    argv: list[str],
    array: int,
    log_dir: Path,
    *,
    requeue: bool = False,
    gpus: int | None = None,
    cpus: int | None = None,
    mem: str | None = None,
    time: str | None = None,
) -> dict[str, Any]:
    """Everything a job template may use. The templates decide layout; this decides values."""
    res = exp.resources
    time_s = parse_time_s(time or res.time)
    container = dataclasses.asdict(exp.container)
    if exp.container.image:
        # The job writes into the experiment directory: make sure the container can see it.
        exp_dir = str(exp.dir.resolve())
        if exp_dir not in container["binds"]:
            container["binds"] = [*container["binds"], exp_dir]
    return {
        "experiment_name": exp.name,
        "hpcrl_version": hpcrl.__version__,
        "stage": stage,
        "job_name": f"{exp.name}-{stage}",
        "log_dir": str(log_dir),
        "array": array,
        "max_concurrent": res.max_concurrent,
        "requeue": requeue,
        "requeue_exit": REQUEUE_EXIT,
        "res": {
            **dataclasses.asdict(res),
            "gpus": res.gpus if gpus is None else gpus,
            "cpus": res.cpus if cpus is None else cpus,
            "mem_mb": parse_mem_mb(mem or res.mem),
            "time": format_time(time_s),
            "soft_time": format_time(max(1, time_s - res.signal_seconds)),
        },
        "cuda": dataclasses.asdict(exp.cuda),
        "container": container,
        "python": exp.python or sys.executable,
        "argv": argv,
    }


def check_directive_safe(exp: Experiment) -> None:
    """Paths and names end up in #SBATCH / #$ lines, which no shell quoting protects."""
    path = str(exp.dir.resolve())
    if not _DIRECTIVE_SAFE.fullmatch(path):
        raise ConfigError(f"output: the experiment directory {path!r} has characters that job directives cannot carry")


def resolved_image(exp: Experiment) -> str | None:
    """`container.image`, or, when the config has an `image:` section and no explicit path, the SIF
    that `hpcrl build-image` makes for it: one config then names and uses its image."""
    if exp.container.image:
        return exp.container.image
    if exp.image is not None:
        from hpcrl.image import image_path_for  # image.py renders jobs through this module

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


# --------------------------------------------------------------------------------------------
# jobs/jobs.json


def read_jobs(experiment_dir: Path) -> list[Job]:
    path = experiment_dir / "jobs" / "jobs.json"
    if not path.exists():
        return []
    jobs = []
    for item in json.loads(path.read_text()):
        item["after"] = [Dependency(**d) for d in item.get("after", [])]
        jobs.append(Job(**item))
    return jobs


def write_jobs(experiment_dir: Path, jobs: list[Job]) -> None:
    atomic_write_text(experiment_dir / "jobs" / "jobs.json", json.dumps([dataclasses.asdict(j) for j in jobs], indent=1))


def manifest_runs(experiment_dir: Path, job: Job) -> list[int]:
    """Run indices of a job's array tasks, in task order."""
    return rundir.read_manifest(experiment_dir, job.manifest) if job.manifest else []


def active_runs(experiment_dir: Path, scheduler: Scheduler, jobs: list[Job]) -> set[int]:
    """Runs whose train or eval task is still pending or running: they must not be submitted twice."""
    relevant = [j for j in jobs if j.manifest and j.scheduler == scheduler.name]
    if not relevant:
        return set()
    states = scheduler.query([j.job_id for j in relevant])
    active = set()
    for job in relevant:
        tasks = states.get(job.job_id, {})
        for task, run_index in enumerate(manifest_runs(experiment_dir, job), start=1):
            if tasks.get(task) in ("pending", "running"):
                active.add(run_index)
    return active


# --------------------------------------------------------------------------------------------
# Submission.


def chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


@dataclasses.dataclass
class PlannedJob:
    stage: str
    script: str
    """Path of the script relative to the experiment directory."""
    manifest: str | None
    runs: list[int]
    """Run indices of the array tasks, in task order (empty for the aggregate)."""
    text: str
    after: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    """Dependencies as (script of an earlier planned job, kind); submission turns scripts into job ids."""


def plan_eval(exp: Experiment, scheduler: Scheduler, script: str, manifest: str, part: list[int], trainer: str, cwd: Path | None) -> PlannedJob:
    """Eval task i after task i of the job that trains (train, or a distributed learner)."""
    root = exp.dir.resolve()
    argv = ["eval", str(root), "--manifest", manifest]
    ctx = job_context(exp, "eval", argv, len(part), root / "jobs" / "logs", gpus=exp.eval.gpus, time=exp.resources.eval_time)
    return PlannedJob("eval", script, manifest, part, scheduler.render(ctx, cwd), after=[(trainer, "each")])


def plan_aggregate(exp: Experiment, scheduler: Scheduler, attempt: int, evals: list[str], cwd: Path | None) -> PlannedJob:
    """`hpcrl collect` once every eval job has ended, whatever their outcome."""
    root = exp.dir.resolve()
    ctx = job_context(exp, "aggregate", ["collect", str(root)], 0, root / "jobs" / "logs", gpus=0, cpus=1, time=exp.resources.eval_time)
    return PlannedJob("aggregate", f"jobs/aggregate-{attempt}.sh", None, [], scheduler.render(ctx, cwd), after=[(e, "all") for e in evals])


def plan_scripts(exp: Experiment, scheduler: Scheduler, todo: list[int], attempt: int, cwd: Path | None = None) -> list[PlannedJob]:
    """Render the scripts of one submission, chunk by chunk, aggregate last."""
    if exp.distributed is not None:
        from hpcrl.distributed.jobs import plan_distributed

        return plan_distributed(exp, scheduler, todo, attempt, cwd)
    root = exp.dir.resolve()
    out = []
    evals = []
    for c, part in enumerate(chunks(todo, scheduler.max_array_size())):
        manifest, train = f"jobs/{attempt}-{c}.tasks", f"jobs/train-{attempt}-{c}.sh"
        ctx = job_context(exp, "train", ["train", str(root), "--manifest", manifest], len(part), root / "jobs" / "logs", requeue=True)
        out.append(PlannedJob("train", train, manifest, part, scheduler.render(ctx, cwd)))
        evals.append(f"jobs/eval-{attempt}-{c}.sh")
        out.append(plan_eval(exp, scheduler, evals[-1], manifest, part, train, cwd))
    out.append(plan_aggregate(exp, scheduler, attempt, evals, cwd))
    return out


def submit_experiment(
    exp: Experiment,
    scheduler_name: str = "auto",
    *,
    dry_run: bool = False,
    detach: bool = False,
    out=None,
    cwd: Path | None = None,
) -> int:
    """`hpcrl sweep`: expand, write the experiment, submit what is not done, start the local executor."""
    root = exp.dir
    scheduler = get_scheduler(scheduler_name, root)
    exp.container.image = resolved_image(exp)
    runs = sweep.expand(exp)
    if scheduler.name != "local":
        check_directive_safe(exp)
    if dry_run:
        for planned in plan_scripts(exp, scheduler, [r.index for r in runs], 0, cwd):
            size = len(planned.runs)
            print(f"# ---- {planned.script} ({planned.stage}, {size or 'single'} task{'s' if size != 1 else ''}) ----", file=out)
            print(planned.text, file=out)
        print(f"# dry run: {len(runs)} runs, nothing written, nothing submitted", file=out)
        return 0
    provenance = {"scheduler": scheduler.name, **image_provenance(exp)}
    runs = sweep.merge_runs(root, runs)
    jobs = read_jobs(root)
    active = active_runs(root, scheduler, jobs)
    sweep.write_experiment(exp, runs, provenance)
    todo = [r.index for r in runs if rundir.run_state(sweep.run_dir(root, r.run_id)) != "done" and r.index not in active]
    skipped_done = sum(1 for r in runs if rundir.run_state(sweep.run_dir(root, r.run_id)) == "done")
    if not todo:
        print(f"{root}: all {len(runs)} runs are done or in flight ({skipped_done} done); nothing submitted", file=out)
        return scheduler.start(root, detach) if scheduler.name == "local" and active else 0
    attempt = max((j.attempt for j in jobs), default=-1) + 1
    (root / "jobs" / "logs").mkdir(parents=True, exist_ok=True)
    script_ids: dict[str, str] = {}
    new_jobs = []
    for planned in plan_scripts(exp, scheduler, todo, attempt, cwd):
        stage, manifest = planned.stage, planned.manifest
        script = root / planned.script
        if manifest:
            rundir.write_manifest(root, manifest, planned.runs)
        atomic_write_text(script, planned.text)
        script.chmod(0o755)
        after = [Dependency(script_ids[s], kind) for s, kind in planned.after]
        job_id = scheduler.submit(script, len(planned.runs), after)
        script_ids[planned.script] = job_id
        new_jobs.append(Job(stage, job_id, scheduler.name, planned.script, len(planned.runs), manifest, after, attempt))
        write_jobs(root, jobs + new_jobs)  # after every submission: a crash half-way still leaves a record
    print(
        f"{root}: submitted {len(todo)} of {len(runs)} runs to {scheduler.name} "
        f"({skipped_done} done, {len(active)} in flight) as {len(new_jobs)} jobs: "
        + ", ".join(f"{j.stage} {j.job_id}" for j in new_jobs),
        file=out,
    )
    return scheduler.start(root, detach)
