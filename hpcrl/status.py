"""`hpcrl status` and `hpcrl cancel`: the scheduler's view merged with the markers on disk.

One scheduler query covers every job of the experiment (not one per run). Markers win over the
scheduler: a run with DONE is done whatever the scheduler forgot; a task the scheduler says ended
without a marker is reported failed, with the log to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcrl import rundir, sweep
from hpcrl.distributed import runstats
from hpcrl.io import atomic_write_text
from hpcrl.pipeline import read_jobs
from hpcrl.schedulers import get_scheduler
from hpcrl.schedulers.base import CANCELLED, ORPHANED, PENDING, RUNNING, SchedulerError


@dataclass
class RunStatus:
    index: int
    run_id: str
    setting: str
    seed: int
    train: str
    eval: str
    step: int
    total_steps: int | None
    """None for a user's program: hpcrl does not know its budget."""
    note: str = ""
    distributed: str | None = None
    """A distributed run's learner report (actors alive, env steps/s, queue, lag, drops)."""


def cancelled_path(experiment_dir: Path) -> Path:
    """Job ids `hpcrl cancel` cancelled, one a line: Grid Engine forgets them at once, this file does not."""
    return experiment_dir / "jobs" / "cancelled"


def scheduler_states(experiment_dir: Path) -> tuple[dict[tuple[str, int], str], str | None]:
    """(stage, run index) -> state of the newest task that ran it, from one query per scheduler."""
    jobs = read_jobs(experiment_dir)
    path = cancelled_path(experiment_dir)
    cancelled = set(path.read_text().split()) if path.exists() else set()
    states: dict[tuple[str, int], str] = {}
    problem = None
    by_scheduler: dict[str, list] = {}
    for job in jobs:
        by_scheduler.setdefault(job.scheduler, []).append(job)
    for name, group in by_scheduler.items():
        try:
            answer = get_scheduler(name, experiment_dir).query([j.job_id for j in group])
        except SchedulerError as exc:
            problem, answer = f"{name}: {exc}", {}
        for job in sorted(group, key=lambda j: j.attempt):
            tasks = answer.get(job.job_id, {})
            gone = CANCELLED if job.job_id in cancelled else "gone"
            if job.manifest:
                for task, run_index in enumerate(rundir.read_manifest(experiment_dir, job.manifest), start=1):
                    states[(job.stage, run_index)] = tasks.get(task, gone)
            elif job.stage == "study":  # an Optuna study's workers: the trials' runs are theirs
                found = set(tasks.values())
                states[("study", -1)] = next((s for s in (RUNNING, PENDING) if s in found), gone if not found else next(iter(found)))
            else:
                states[(job.stage, -1)] = tasks.get(0, gone)
    return states, problem


def merge(marker_state: str, sched: str | None) -> str:
    """Markers are the truth for finished work; the scheduler knows about waiting and running."""
    if marker_state in ("done", "failed", "skipped"):
        return marker_state
    if sched in (PENDING, RUNNING, ORPHANED, CANCELLED):
        return sched
    if sched is None:
        return "not submitted"
    return "failed"  # the task ended (or the scheduler forgot it) without writing its marker


def experiment_status(experiment_dir: Path) -> tuple[list[RunStatus], str, str | None]:
    states, problem = scheduler_states(experiment_dir)
    rows = []
    for run in sweep.load_runs(experiment_dir):
        rd = sweep.run_dir(experiment_dir, run.run_id)
        # A distributed run's "train" is its learner job: it writes the markers and checkpoints.
        trainer = ("study", -1) if "trial" in run.settings else ("learner" if run.config.distributed else "train", run.index)
        train = merge(rundir.run_state(rd), states.get(trainer))
        evaluation = merge(rundir.eval_state(rd), states.get(("eval", run.index)))
        note = ""
        if train == "failed":
            note = (rundir.first_line(rd, rundir.FAILED) or "see the train log under jobs/logs")[:80]
        elif evaluation == "skipped":
            note = rundir.reason(rd, rundir.EVAL_SKIPPED)[:80]
        elif (rd / rundir.PRUNED).exists():
            note = rundir.first_line(rd, rundir.PRUNED)[:80]
        total = None if run.config.program else run.config.train.total_steps
        step = (rundir.done_step(rd) or total or 0) if train == "done" else rundir.last_logged_step(rd)
        report = runstats.status_line(rd) if run.config.distributed and train != "done" else None
        rows.append(RunStatus(run.index, run.run_id, run.setting_label, run.seed, train, evaluation, step, total, note, report))
    aggregate = "done" if (experiment_dir / "results" / "summary.csv").exists() else states.get(("aggregate", -1), "not submitted")
    return rows, aggregate, problem


def _progress(r: RunStatus) -> str:
    """Percent of the budget; a user's program has no budget hpcrl knows: the step it logged."""
    if r.total_steps:
        return f"{min(100, 100 * r.step // r.total_steps):3d}%"
    return f"step {r.step}" if r.step else ("done" if r.train == "done" else "-")


def print_status(experiment_dir: Path, out=None) -> int:
    rows, aggregate, problem = experiment_status(experiment_dir)
    header = ("#", "run", "setting", "seed", "train", "progress", "eval", "note")
    table = [header] + [
        (str(r.index), r.run_id, r.setting, str(r.seed), r.train, _progress(r), r.eval, r.note)
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1], file=out)
    for r in rows:
        if r.distributed:
            print(f"{r.index} {r.run_id} {r.distributed}", file=out)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.train] = counts.get(r.train, 0) + 1
    print(f"{len(rows)} runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; aggregate: {aggregate}", file=out)
    if problem:
        print(f"warning: scheduler query failed ({problem}); states come from markers only", file=out)
    return 0


def cancel_experiment(experiment_dir: Path, out=None) -> int:
    jobs = read_jobs(experiment_dir)
    by_scheduler: dict[str, list[str]] = {}
    # Newest first, so dependents go before what they wait for: a scheduler that releases a hold
    # when the predecessor is cancelled (Grid Engine does) could otherwise start them mid-cancel.
    for job in reversed(jobs):
        by_scheduler.setdefault(job.scheduler, []).append(job.job_id)
    for name, ids in by_scheduler.items():
        get_scheduler(name, experiment_dir).cancel(ids)
        print(f"{experiment_dir}: cancelled {len(ids)} {name} jobs", file=out)
    if jobs:
        atomic_write_text(cancelled_path(experiment_dir), "".join(f"{job.job_id}\n" for job in jobs))
    return 0
