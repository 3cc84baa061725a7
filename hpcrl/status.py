"""`hpcrl status` and `hpcrl cancel`: the scheduler's view merged with the markers on disk.

One scheduler query covers every job of the experiment (not one per run, not one per chunk), and
`--watch` makes one such query per refresh. Markers win over the scheduler: a run with DONE is done
whatever the scheduler forgot; a task the scheduler says ended without a marker is reported failed,
with the log to read.

Views: up to SUMMARY_THRESHOLD runs, one line per run; past it, one line per setting with counts per
stage and state, the failures named (capped), the jobs and the totals. `--runs` and `--summary`
choose a view, `--state`, `--setting` and `--run` select runs, `--json` prints both the runs and the
settings (see `status_json` for the shape).

`cancel` cancels every job that has a task pending or running (one query and one cancel call per
scheduler; where every job has ended it says so and records nothing) or, with a selection,
only the pending and running array tasks of the selected runs, in every stage (one call per
scheduler: Slurm `scancel 123_[1-3,7]`, Grid Engine `qdel 123.1-3 123.7`, the local runner a
request file). What it cancelled is recorded in jobs/cancelled, because Slurm drops a cancelled
pending task from its listing and Grid Engine forgets every ended task; a re-sweep resubmits the
cancelled runs like any other run that is not done.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpcrl.config.experiment import Experiment
from hpcrl.config.schema import ConfigError
from hpcrl.distributed import runstats
from hpcrl.schedulers import get_scheduler
from hpcrl.schedulers.base import CANCELLED, NOT_SUBMITTED, ORPHANED, PENDING, RUNNING, Scheduler, SchedulerError, shown_state
from hpcrl.store import expdir, rundir, runlock
from hpcrl.store.expdir import Job, read_jobs
from hpcrl.store.states import State
from hpcrl.sweep import modes

SUMMARY_THRESHOLD = 50
"""More runs than this and `hpcrl status` shows one line per setting unless `--runs` is given."""
FAILURES_SHOWN = 10
"""Failed runs named in the per-setting view; the rest are counted (`--runs --state failed` lists them)."""
WATCH_MIN_S = 1.0
"""The shortest `--watch` interval: every refresh is one scheduler query, and slurmctld is shared."""

STATE_WORDS = {
    "pending": (PENDING,),
    "running": (RUNNING, ORPHANED),
    "orphaned": (ORPHANED,),
    "done": (State.DONE,),
    "failed": (State.FAILED,),
    "cancelled": (CANCELLED,),
    "skipped": (State.SKIPPED,),
    "not-submitted": (NOT_SUBMITTED,),
}
"""`--state` words and the states each selects (`running` includes a local runner's orphans)."""
CANCELLABLE = ("pending", "running", "orphaned")
ACTIVE = (PENDING, RUNNING, ORPHANED)
ENDED = (State.DONE, State.FAILED, CANCELLED, State.SKIPPED)
"""Train states after which a distributed run's last report (runstats) describes nothing that runs."""
ORDER = (State.DONE, RUNNING, ORPHANED, PENDING, State.FAILED, CANCELLED, State.SKIPPED, NOT_SUBMITTED)
"""Column order of the per-setting view."""
TOKENS = {ORPHANED: "orphaned", NOT_SUBMITTED: "not-submitted"}
"""A state as `--json` writes it: one word, as `--state` takes it."""


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
    trial: bool = False
    """A run of an Optuna study: trained by the study's workers, not by a task of its own."""
    eval_games: tuple[int, int] | None = None
    """A game's eval stage under way: (games played, games in all), from its eval_progress file."""

    @property
    def state(self) -> str:
        """The run's state as one word: its training's until that is done, then its evaluation's."""
        return self.train if self.train != State.DONE else self.eval

    @property
    def failed(self) -> bool:
        """Whether its training or its evaluation failed (the views name these runs)."""
        return self.state == State.FAILED or self.eval == State.FAILED


@dataclass
class SchedulerView:
    states: dict[tuple[str, int], str]
    """(stage, run index) -> state of the newest task that ran it (-1: a job that is not per run)."""
    active: dict[int, list[tuple[Job, int]]]
    """Run index -> its tasks the scheduler has pending or running (job, task), every stage."""
    problem: str | None
    jobs: list[Job]
    workers: dict[int, tuple[Job, str]] = field(default_factory=dict)
    """An Optuna study's worker task id -> (the newest study job that has it, the task's state)."""
    ran: dict[tuple[str, int], tuple[Job, int]] = field(default_factory=dict)
    """(stage, run index) -> the newest task that ran it (job, task), whose log says what the run did not."""


@dataclass
class Status:
    rows: list[RunStatus]
    aggregate: str
    problem: str | None
    jobs: list[Job]
    active: dict[int, list[tuple[Job, int]]] = field(default_factory=dict)
    study: str | None = None
    """The Optuna study's workers that failed, as one line naming their job (None: none did)."""


@dataclass
class Selection:
    """Which runs `--state`, `--setting` and `--run` keep (each empty: all)."""

    states: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    run_ids: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.states or self.settings or self.run_ids)

    def keep(self, rows: list[RunStatus]) -> list[RunStatus]:
        if not self:
            return rows
        labels = {r.setting for r in rows}
        chosen = set().union(*(_labels_for(s, labels) for s in self.settings)) if self.settings else None
        wanted = {s for word in self.states for s in STATE_WORDS[word]}
        return [
            r for r in rows
            if (chosen is None or r.setting in chosen) and (not self.run_ids or r.run_id in self.run_ids) and (not wanted or r.state in wanted)
        ]


# ------------------------------------------------------------------------------------ the scheduler


def scheduler_view(experiment_dir: Path) -> SchedulerView:
    """Every task's state from one query per scheduler (one in practice: all jobs of a sweep are
    submitted to the same one), mapped to runs through the manifests."""
    jobs = read_jobs(experiment_dir)
    cancelled_jobs, cancelled_tasks = expdir.read_cancelled(experiment_dir)
    states: dict[tuple[str, int], str] = {}
    active: dict[int, list[tuple[Job, int]]] = {}
    workers: dict[int, tuple[Job, str]] = {}
    ran: dict[tuple[str, int], tuple[Job, int]] = {}
    problem = None
    by_scheduler: dict[str, list[Job]] = {}
    for job in jobs:
        by_scheduler.setdefault(job.scheduler, []).append(job)
    manifests: dict[str, list[int]] = {}
    for name, group in by_scheduler.items():
        try:
            answer = get_scheduler(name, experiment_dir).query([j.job_id for j in group])
        except SchedulerError as exc:
            problem, answer = f"{name}: {exc}", {}
        for job in sorted(group, key=lambda j: j.attempt):
            tasks = answer.get(job.job_id, {})
            gone = CANCELLED if job.job_id in cancelled_jobs else "gone"
            if job.manifest:
                if job.manifest not in manifests:
                    manifests[job.manifest] = rundir.read_manifest(experiment_dir, job.manifest)
                for task, run_index in enumerate(manifests[job.manifest], start=1):
                    state = tasks.get(task) or (CANCELLED if (job.job_id, task) in cancelled_tasks else gone)
                    states[(job.stage, run_index)] = state
                    ran[(job.stage, run_index)] = (job, task)
                    if state in ACTIVE:
                        active.setdefault(run_index, []).append((job, task))
            elif job.stage == "study":  # an Optuna study's workers: the trials' runs are theirs
                found = set(tasks.values())
                states[("study", -1)] = next((s for s in (RUNNING, PENDING) if s in found), gone if not found else next(iter(found)))
                for task in range(1, job.size + 1):
                    workers[task] = (job, tasks.get(task) or (CANCELLED if (job.job_id, task) in cancelled_tasks else gone))
            else:
                states[(job.stage, -1)] = tasks.get(0, gone)
    return SchedulerView(states, active, problem, jobs, workers, ran)


# ---------------------------------------------------------------------------------------- the runs


def _configs(experiment_dir: Path, rows: list[dict[str, str]]) -> dict[str, Experiment]:
    """The config of each setting (run id without its seed), read from the first of its runs whose
    directory is there: the seeds of a setting share it (sweep writes it once per setting), and parsing
    10,000 run headers is most of what status would otherwise spend. A run whose directory is gone is
    shown missing, not read: one lost run must not hide the others; a setting whose every run is gone has
    no config here (see collect_status)."""
    parsed: dict[str, Experiment] = {}
    configs: dict[str, Experiment] = {}
    for row in rows:
        key = row["run_id"].rpartition("-s")[0]
        if key not in configs and expdir.run_dir(experiment_dir, row["run_id"]).is_dir():
            configs[key] = expdir.read_run(experiment_dir, row["run_id"], parsed).config
    return configs


LOG_NOTE_CHARS = 120
"""The longest note made of a job log's last line (`_failure_note`): the log's path and the end of its
line, which says why (a shell's `...: No such file or directory` follows the job script's path)."""


def _failure_note(experiment_dir: Path, rd: Path, stage: str, ran: tuple[Job, int] | None) -> str:
    """Why the run's `stage` failed: what the run recorded (rundir.failure), else, for a task that failed
    before hpcrl could record anything (an interpreter that is not there, a module or container that would
    not load), the log of the task that ran it and its last line, cut at its start to fit LOG_NOTE_CHARS;
    the generic pointer to jobs/logs where that log is not there to read."""
    reason = rundir.failure_reason(rd, stage)
    log = expdir.job_log(experiment_dir, *ran) if ran and not reason else None
    last = expdir.last_log_line(log) if log else ""
    if log is None or not last:
        return rundir.failed_line(stage, reason)[:80]
    head = f"{stage} failed: {log.relative_to(experiment_dir)} ends: "
    room = max(LOG_NOTE_CHARS - len(head), 20)
    return head + (last if len(last) <= room else "..." + last[len(last) - room + 3 :])


def collect_status(experiment_dir: Path, *, detail: bool = True) -> Status:
    """Every run's state per stage, the aggregate's, and the jobs. `detail`: also what only the per-run
    view and --json show (see add_detail); the reasons of failures are always read."""
    rows_csv = expdir.listed_runs(experiment_dir)
    configs = _configs(experiment_dir, rows_csv)
    view = scheduler_view(experiment_dir)
    states = view.states
    holders = _trial_holders(experiment_dir, rows_csv)
    out = []
    for row in rows_csv:
        run_id, index = row["run_id"], int(row["index"])
        config = configs.get(run_id.rpartition("-s")[0])
        swept = expdir.swept_values(row)
        trial = "trial" in swept
        rd = expdir.run_dir(experiment_dir, run_id)
        # A distributed run's "train" is its learner job: it writes the markers and checkpoints. Without a
        # config (every run of its setting is gone) the jobs say which stage trained it.
        distributed = config.distributed if config is not None else ("learner", index) in states
        trainer = ("study", -1) if trial else ("learner" if distributed else "train", index)
        marker = rundir.stage_marker("train", rd)
        # A trial is as alive as the worker that holds it, not as the study's other workers.
        task = holders.get((row.get(expdir.GENERATION, "0"), swept["trial"])) if trial else None
        holder = view.workers.get(task) if task is not None else None
        train = shown_state(marker, holder[1] if holder else states.get(trainer))
        evaluation = shown_state(rundir.stage_marker("eval", rd), states.get(("eval", index)))
        note = ""
        if marker == State.NEW and not rd.is_dir():
            note = rundir.NO_DIRECTORY  # as collect says it; a sweep trains it again
        elif train == State.FAILED and holder and marker == State.NEW:
            note = f"worker {task} (job {holder[0].job_id}) ended{'' if holder[1] == 'gone' else f' ({holder[1]})'} holding it; the next sweep resumes it"
        elif train == State.FAILED:
            note = _failure_note(experiment_dir, rd, "train", view.ran.get(trainer))
        elif evaluation == State.FAILED:
            note = _failure_note(experiment_dir, rd, "eval", view.ran.get(("eval", index)))
        total = None if config is None or config.program else config.train.total_steps
        # The learner's last report is not shown once it has ended: a failed run's "actors 2/2 alive" is not live.
        report = runstats.status_line(rd) if distributed and train not in ENDED else None
        out.append(RunStatus(index, run_id, expdir.setting_label(swept), int(row["seed"]), train, evaluation, 0, total, note, report, trial))
    aggregate = shown_state(rundir.stage_marker("aggregate", experiment_dir), states.get(("aggregate", -1)))
    status = Status(out, aggregate, view.problem, view.jobs, view.active, _failed_workers(view.workers, set(holders.values())))
    if detail:
        add_detail(experiment_dir, status.rows)
    return status


def _trial_holders(experiment_dir: Path, rows: list[dict[str, str]]) -> dict[tuple[str, str], int]:
    """(runs.csv generation, trial number) -> the worker task that holds the trial, for the current
    study's trials (a changed config is a new study; its workers hold none of the old trials)."""
    if not any(row.get("trial") for row in rows):
        return {}
    try:
        exp, generation = expdir.load_experiment_config(experiment_dir)
    except ConfigError:
        return {}
    return modes.of(exp).holders(experiment_dir, exp, generation)


def _failed_workers(workers: dict[int, tuple[Job, str]], holding: set[int]) -> str | None:
    """`study job J: workers 1, 2 of 2 failed ...`: the study's worker tasks that failed, or ended holding
    a trial (Grid Engine forgets how a task ended), each under the newest study job that has its task id."""
    failed = sorted(task for task, (_, state) in workers.items() if state == State.FAILED or (state == "gone" and task in holding))
    if not failed:
        return None
    by_job: dict[str, list[int]] = {}
    for task in failed:
        by_job.setdefault(workers[task][0].job_id, []).append(task)
    return "; ".join(
        f"study job {job_id}: worker{'s' if len(tasks) > 1 else ''} {', '.join(map(str, tasks))} of {len(workers)} failed" for job_id, tasks in by_job.items()
    ) + " (their logs are in jobs/logs/; `hpcrl sweep` again restarts them)"


def add_detail(experiment_dir: Path, rows: list[RunStatus]) -> None:
    """Each run's step (from DONE, else train.csv's last row), how far a game's running eval stage
    is, and the reason of a skipped evaluation or a pruned trial."""
    for r in rows:
        rd = expdir.run_dir(experiment_dir, r.run_id)
        try:
            r.step = (rundir.done_step(rd) or r.total_steps or 0) if r.train == State.DONE else rundir.last_logged_step(rd)
        except OSError as exc:
            r.note = r.note or rundir.unreadable(exc)[:80]
        evaluating = rundir.read_eval_progress(rd) if r.eval == RUNNING else None
        if evaluating is not None:
            done, total, what = evaluating
            r.eval_games = (done, total)
            r.note = r.note or f"eval {done}/{total} games: {what}"[:80]
        if r.note:
            continue
        lost = runlock.lost_starts(rd)
        if lost:
            r.note = f"lost {lost[-1].started()}: node down or killed" + (f" ({len(lost)} lost starts)" if len(lost) > 1 else "")
        elif r.eval == State.SKIPPED:
            r.note = ("eval skipped: " + rundir.first_line(rd, rundir.EVAL_SKIPPED))[:80]
        elif r.train == State.DONE and (rd / rundir.PRUNED).exists():
            r.note = rundir.first_line(rd, rundir.PRUNED)[:80]


def experiment_status(experiment_dir: Path) -> tuple[list[RunStatus], str, str | None]:
    status = collect_status(experiment_dir)
    return status.rows, status.aggregate, status.problem


# ---------------------------------------------------------------------------------------- selection


def _labels_for(text: str, labels: Iterable[str]) -> set[str]:
    """A `--setting` value: the exact label if there is one, else every label that contains it."""
    labels = set(labels)
    return {text} if text in labels else {label for label in labels if text in label}


def selection(experiment_dir: Path, states: Iterable[str] = (), settings: Iterable[str] = (), run_ids: Iterable[str] = (), *, cancel: bool = False) -> Selection:
    """Check `--state`, `--setting` and `--run` against the experiment before anything is asked of
    the scheduler: a value that names nothing is a ConfigError (one line, exit 2)."""
    states, settings, run_ids = tuple(states), tuple(settings), tuple(run_ids)
    for value in (*states, *settings, *run_ids):
        if not value or not value.isprintable():
            raise ConfigError(f"{value!r}: a --state, --setting or --run value is one printable line")
    words = CANCELLABLE if cancel else tuple(STATE_WORDS)
    for word in states:
        if word not in STATE_WORDS:
            raise ConfigError(f"--state {word}: expected one of {', '.join(words)}")
        if word not in words:
            raise ConfigError(f"--state {word}: only {', '.join(words)} runs can be cancelled")
    rows = expdir.listed_runs(experiment_dir) if settings or run_ids else []
    labels = {expdir.row_label(row) for row in rows}
    for text in settings:
        if not _labels_for(text, labels):
            shown = sorted(labels)
            raise ConfigError(
                f"--setting {text}: no setting of {experiment_dir} is or contains it (settings: {', '.join(shown[:3])}"
                + (f" and {len(shown) - 3} more" if len(shown) > 3 else "") + ")"
            )
    known = {row["run_id"] for row in rows}
    for run_id in run_ids:
        if run_id not in known:
            raise ConfigError(f"--run {run_id}: no such run in {experiment_dir}/runs.csv")
    return Selection(states, settings, run_ids)


# ------------------------------------------------------------------------------------------- views


def _progress(r: RunStatus) -> str:
    """Percent of the budget; a user's program has no budget hpcrl knows: the step it logged. A
    game's eval stage, which plays for minutes after training is done: the percent of its games."""
    if r.eval_games is not None:
        done, total = r.eval_games
        return f"eval {min(100, 100 * done // max(total, 1))}%"
    if r.total_steps:
        return f"{min(100, 100 * r.step // r.total_steps):3d}%"
    return f"step {r.step}" if r.step else ("done" if r.train == State.DONE else "-")


def _table(table: list[tuple[str, ...]], right: int = 0) -> list[str]:
    """Columns padded to their widest cell; the last column is not padded; the `right` columns from
    the second on are right-aligned (counts)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = []
    for row in table:
        cells = [cell.rjust(w) if 0 < i <= right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append(("  ".join(cells) + "  " + row[-1]).rstrip())
    return lines


def _counts(values: Iterable[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for v in values:
        found[v] = found.get(v, 0) + 1
    return {s: found[s] for s in sorted(found, key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER))}


def _jobs_line(jobs: list[Job]) -> str:
    if not jobs:
        return "jobs: none submitted"
    parts = []
    for name in dict.fromkeys(j.scheduler for j in jobs):
        mine = [j for j in jobs if j.scheduler == name]
        stages = _counts(j.stage for j in mine)
        attempts = len({j.attempt for j in mine})
        ids = [j.job_id for j in mine]
        parts.append(
            f"{len(mine)} {name} jobs ({', '.join(f'{n} {s}' for s, n in stages.items())}; "
            f"{attempts} submission{'s' if attempts > 1 else ''}; ids {ids[0]}{' .. ' + ids[-1] if len(ids) > 1 else ''})"
        )
    return "jobs: " + "; ".join(parts)


def _total_line(rows: list[RunStatus], status: Status, selected: Selection) -> str:
    counts = _counts(r.state for r in rows)
    what = f"{len(rows)} of {len(status.rows)} runs selected" if selected else f"{len(rows)} runs"
    settings = len({r.setting for r in rows})
    text = f"{what}: " + (", ".join(f"{n} {s}" for s, n in counts.items()) or "none")
    return text + f"; {settings} setting{'s' if settings != 1 else ''}; aggregate: {status.aggregate}"


def per_run_lines(rows: list[RunStatus]) -> list[str]:
    header = ("#", "run", "setting", "seed", "train", "progress", "eval", "note")
    table = [header] + [(str(r.index), r.run_id, r.setting, str(r.seed), r.train, _progress(r), r.eval, r.note) for r in rows]
    lines = _table(table)
    lines += [f"{r.index} {r.run_id} {r.distributed}" for r in rows if r.distributed]
    return lines


def _by_setting(rows: list[RunStatus]) -> dict[str, list[RunStatus]]:
    by_setting: dict[str, list[RunStatus]] = {}
    for r in rows:
        by_setting.setdefault(r.setting, []).append(r)
    return by_setting


def per_setting_lines(rows: list[RunStatus], experiment_dir: Path) -> list[str]:
    """One line per setting: runs, then per stage a count per state (columns only for states seen)."""
    by_setting = _by_setting(rows)
    stages = (("train", lambda r: r.train), ("eval", lambda r: r.eval))
    columns = [(stage, s, get) for stage, get in stages for s in _counts(get(r) for r in rows)]
    head = ["setting", "runs"] + [s for _, s, _ in columns] + [""]
    group = ["", ""] + [stage if i == 0 or columns[i - 1][0] != stage else "" for i, (stage, _, _) in enumerate(columns)] + [""]
    table = [tuple(group), tuple(head)]
    for label, mine in by_setting.items():
        cells = [label, str(len(mine))]
        for _, s, get in columns:
            n = sum(1 for r in mine if get(r) == s)
            cells.append(str(n) if n else ".")
        table.append((*cells, ""))
    lines = _table(table, right=len(columns) + 1)
    failed = [r for r in rows if r.failed]
    if failed:
        lines.append(f"failed: {len(failed)} runs")
        shown = failed[:FAILURES_SHOWN]
        lines += _table([(f"  {r.run_id}", r.setting, r.note) for r in shown])
        if len(failed) > len(shown):
            lines.append(f"  ... and {len(failed) - len(shown)} more: hpcrl status {experiment_dir} --runs --state failed")
    reports = [r for r in rows if r.distributed]
    for r in reports[:FAILURES_SHOWN]:
        lines.append(f"{r.index} {r.run_id} {r.distributed}")
    if len(reports) > FAILURES_SHOWN:
        lines.append(f"... and {len(reports) - FAILURES_SHOWN} more distributed runs: hpcrl status {experiment_dir} --runs")
    return lines


def status_lines(experiment_dir: Path, status: Status, view: str, selected: Selection) -> list[str]:
    rows = selected.keep(status.rows)
    lines = per_run_lines(rows) if view == "runs" else per_setting_lines(rows, experiment_dir)
    lines += [_jobs_line(status.jobs), *([status.study] if status.study else []), _total_line(rows, status, selected)]
    if status.problem:
        lines.append(f"warning: scheduler query failed ({status.problem}); states come from markers only")
    return lines


def _token(state: str) -> str:
    return TOKENS.get(state, state)


def status_json(experiment_dir: Path, status: Status, selected: Selection) -> dict:
    """`hpcrl status --json`: one object.

    {"experiment": path, "aggregate": state, "scheduler_problem": null or text, "study_workers_failed": null or text,
     "selection": {"state": [...], "setting": [...], "run": [...]}, "total_runs": n,
     "counts": {"runs": n, "state": {state: n}, "train": {state: n}, "eval": {state: n}},
     "jobs": [{"stage", "job_id", "scheduler", "size", "attempt", "manifest"}],
     "settings": [{"setting", "runs", "state": {..}, "train": {..}, "eval": {..}, "failed": [run ids]}],
     "runs": [{"index", "run_id", "setting", "seed", "state", "train", "eval", "step", "total_steps", "note", "distributed"}]}

    States are the words --state takes (`not-submitted`, `orphaned` as one word); `state` is the
    run's training state until it is done, then its evaluation's. Counts and settings cover the
    selected runs; `total_runs` counts all.
    """
    rows = selected.keep(status.rows)

    def counts(mine: list[RunStatus]) -> dict:
        return {
            "state": {_token(s): n for s, n in _counts(r.state for r in mine).items()},
            "train": {_token(s): n for s, n in _counts(r.train for r in mine).items()},
            "eval": {_token(s): n for s, n in _counts(r.eval for r in mine).items()},
        }

    by_setting = _by_setting(rows)
    return {
        "experiment": str(experiment_dir.resolve()),
        "aggregate": _token(status.aggregate),
        "scheduler_problem": status.problem,
        "study_workers_failed": status.study,
        "selection": {"state": list(selected.states), "setting": list(selected.settings), "run": list(selected.run_ids)},
        "total_runs": len(status.rows),
        "counts": {"runs": len(rows), **counts(rows)},
        "jobs": [{"stage": j.stage, "job_id": j.job_id, "scheduler": j.scheduler, "size": j.size, "attempt": j.attempt, "manifest": j.manifest} for j in status.jobs],
        "settings": [
            {"setting": label, "runs": len(mine), **counts(mine), "failed": [r.run_id for r in mine if r.failed]}
            for label, mine in by_setting.items()
        ],
        "runs": [
            {
                "index": r.index, "run_id": r.run_id, "setting": r.setting, "seed": r.seed, "state": _token(r.state), "train": _token(r.train),
                "eval": _token(r.eval), "step": r.step, "total_steps": r.total_steps, "note": r.note, "distributed": r.distributed,
            }
            for r in rows
        ],
    }


def choose_view(n_runs: int, runs: bool, summary: bool, selected: Selection) -> str:
    """`runs` or `settings`: as asked, else per run for a selection or a small sweep."""
    if runs or summary:
        return "runs" if runs else "settings"
    return "runs" if selected or n_runs <= SUMMARY_THRESHOLD else "settings"


def watch_interval(text: str | float | None) -> float | None:
    """`--watch [SECONDS]`: a finite number of seconds, at least WATCH_MIN_S."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < WATCH_MIN_S:
        raise ConfigError(f"--watch {text}: expected a number of seconds >= {WATCH_MIN_S:g} (each refresh queries the scheduler once)")
    return seconds


def print_status(
    experiment_dir: Path, out=None, *, runs: bool = False, summary: bool = False, as_json: bool = False,
    states: Iterable[str] = (), settings: Iterable[str] = (), run_ids: Iterable[str] = (), watch: str | float | None = None,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """`hpcrl status`: the view asked for, once, or every `watch` seconds until nothing is pending or running."""
    if runs and summary:
        raise ConfigError("--runs and --summary: choose one view")
    interval = watch_interval(watch)
    if interval is not None and as_json:
        raise ConfigError("--watch and --json: --json prints one document; run it again to poll")
    selected = selection(experiment_dir, states, settings, run_ids)
    if interval is not None:
        return _watch(experiment_dir, out, interval, runs, summary, selected, sleep or time.sleep)
    status = collect_status(experiment_dir, detail=False)
    view = choose_view(len(status.rows), runs, summary, selected)
    if as_json or view == "runs":
        add_detail(experiment_dir, selected.keep(status.rows))
    if as_json:
        print(json.dumps(status_json(experiment_dir, status, selected)), file=out)
    else:
        print("\n".join(status_lines(experiment_dir, status, view, selected)), file=out)
    return 0


def in_flight(status: Status, selected: Selection) -> bool:
    """Whether a watch goes on: a selected run pending or running in any stage, the aggregate (for the
    whole experiment), or no answer from the scheduler (then the markers alone cannot tell)."""
    rows = selected.keep(status.rows)
    if status.problem or any(r.train in ACTIVE or r.eval in ACTIVE for r in rows):
        return True
    return not selected and status.aggregate in (PENDING, RUNNING)


def _watch(experiment_dir: Path, out, interval: float, runs: bool, summary: bool, selected: Selection, sleep: Callable[[float], None]) -> int:
    """Refresh in place on a terminal (cursor home, each line cleared to its end, the rest of the screen
    cleared); elsewhere print a frame when it changed. Ctrl-C ends it with 130."""
    stream = out if out is not None else sys.stdout
    tty = stream.isatty() if hasattr(stream, "isatty") else False
    last = None
    try:
        if tty:
            stream.write("\033[2J")
        while True:
            status = collect_status(experiment_dir, detail=False)
            view = choose_view(len(status.rows), runs, summary, selected)
            if view == "runs":
                add_detail(experiment_dir, selected.keep(status.rows))
            lines = status_lines(experiment_dir, status, view, selected)
            going = in_flight(status, selected)
            stamp = time.strftime("%H:%M:%S")
            head = f"hpcrl status {experiment_dir}: " + (f"every {interval:g} s, Ctrl-C to stop" if going else "nothing pending or running") + f"  [{stamp}]"
            if tty:
                stream.write("\033[H" + "".join(f"{line}\033[K\n" for line in [head, *lines]) + "\033[J")
            elif lines != last:
                stream.write("\n".join([head, *lines]) + "\n\n")
            stream.flush()
            last = lines
            if not going:
                return 0
            sleep(interval)
    except KeyboardInterrupt:
        stream.write("\n")
        stream.flush()
        return 130


# ------------------------------------------------------------------------------------------ cancel


def cancel_experiment(experiment_dir: Path, out=None, *, states: Iterable[str] = (), settings: Iterable[str] = (), run_ids: Iterable[str] = ()) -> int:
    """`hpcrl cancel`: every job (one cancel call per scheduler), or with `--state`, `--setting` or
    `--run` only the pending and running tasks of the selected runs (the same: one call per scheduler)."""
    selected = selection(experiment_dir, states, settings, run_ids, cancel=True)
    if selected:
        return _cancel_runs(experiment_dir, selected, out)
    jobs = read_jobs(experiment_dir)
    if not jobs:
        print(f"{experiment_dir}: nothing to cancel: no job was submitted", file=out)
        return 0
    by_scheduler: dict[str, list[str]] = {}
    # Newest first, so dependents go before what they wait for: a scheduler that releases a hold
    # when the predecessor is cancelled (Grid Engine does) could otherwise start them mid-cancel.
    for job in reversed(jobs):
        by_scheduler.setdefault(job.scheduler, []).append(job.job_id)
    cancelled: list[str] = []
    for name, ids in by_scheduler.items():
        scheduler = get_scheduler(name, experiment_dir)
        live = _unended(scheduler, ids)
        if live:
            scheduler.cancel(live)
            ended = len(ids) - len(live)
            print(f"{experiment_dir}: cancelled {len(live)} {name} jobs" + (f"; {ended} had ended" if ended else ""), file=out)
            cancelled += live
    if not cancelled:
        print(f"{experiment_dir}: nothing to cancel: its {len(jobs)} jobs have all ended", file=out)
        return 0
    expdir.record_cancelled(experiment_dir, cancelled)
    return 0


def _unended(scheduler: Scheduler, job_ids: list[str]) -> list[str]:
    """The jobs among `job_ids` with a task pending, running or orphaned (a dead local runner's task still
    at work), from one query: only these are cancelled and recorded in jobs/cancelled, so a cancel of
    finished work says so instead of calling it cancelled. Every one where the scheduler gives no answer:
    then a cancel that asks too much is the one that surely stops what runs."""
    try:
        answer = scheduler.query(job_ids)
    except SchedulerError:
        return job_ids
    return [j for j in job_ids if any(s in ACTIVE for s in answer.get(j, {}).values())]


def _cancel_runs(experiment_dir: Path, selected: Selection, out) -> int:
    status = collect_status(experiment_dir, detail=False)
    rows = selected.keep(status.rows)
    trials = [r for r in rows if r.trial]
    if trials:
        raise ConfigError(f"{trials[0].run_id}: a run of an Optuna study is trained by the study's workers, not by a task of its own; `hpcrl cancel {experiment_dir}` stops the study")
    chosen = {r.index for r in rows}
    tasks = [(job, task) for index in sorted(chosen) for job, task in status.active.get(index, [])]
    if not tasks:
        print(f"{experiment_dir}: nothing to cancel: none of the {len(rows)} selected runs has a pending or running task", file=out)
        return 0
    by_scheduler: dict[str, dict[str, list[int]]] = {}
    # Later stages first (an eval task before the train task it waits for), as for a whole cancel.
    for job, task in sorted(tasks, key=lambda jt: (-jt[0].attempt, jt[0].stage == "train", jt[0].job_id, jt[1])):
        by_scheduler.setdefault(job.scheduler, {}).setdefault(job.job_id, []).append(task)
    for name, asked in by_scheduler.items():
        get_scheduler(name, experiment_dir).cancel_tasks(asked)
        n_runs = len({r.index for r in rows if any(j.scheduler == name for j, _ in status.active.get(r.index, []))})
        print(f"{experiment_dir}: cancelled {sum(map(len, asked.values()))} {name} tasks of {n_runs} runs in {len(asked)} jobs", file=out)
    expdir.record_cancelled(experiment_dir, [f"{job.job_id} {task}" for job, task in tasks])
    return 0
