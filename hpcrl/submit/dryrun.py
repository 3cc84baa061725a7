"""`hpcrl sweep --dry-run`: what a sweep would write and submit, printed, with nothing written.

For each planned job: its script as it would be written; for a job whose array tasks are runs,
what each task trains (task -> run id -> seed -> swept values, by the manifest rule a job applies:
task i is the i-th run of the job's part, for hpcrl's own trainer and a user's program alike); then
the scheduler commands in submission order with their dependency flags, quoted as a shell takes
them, each later job naming the earlier one's id by a shell variable. A refusal that comes from
the live cluster (no node large enough) is a warning here: the scripts still print, and a sweep
without --dry-run refuses as before.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import IO

from hpcrl.config.experiment import Experiment
from hpcrl.schedulers.base import Scheduler
from hpcrl.store import expdir
from hpcrl.store.expdir import Dependency
from hpcrl.submit.jobplan import PlannedJob, program_in_container, program_tasks
from hpcrl.sweep import modes

RUN_STAGES = ("train", "learner")
"""Jobs whose array task i trains the i-th run of their part (eval's tasks are the same runs again)."""
MAX_TABLE_ROWS = 200
"""Tasks a dry run lists per job; a larger array ends its table with a count (runs.csv has every run)."""


def print_dry_run(exp: Experiment, scheduler: Scheduler, planned: list[PlannedJob], runs: list[expdir.Run], out: IO[str] | None, warning: str | None = None) -> int:
    """Print every planned script, each run job's task table, and the submission commands."""
    if warning:
        print(f"hpcrl: warning: {warning}; a sweep without --dry-run refuses it", file=sys.stderr)
    by_index = {r.index: r for r in runs}
    for job in planned:
        size = job.tasks
        print(f"# ---- {job.script} ({job.stage}, {size or 'single'} task{'s' if size > 1 else ''}) ----", file=out)
        print(job.text, file=out)
        if job.stage in RUN_STAGES and job.runs:
            print(task_table(job, by_index), file=out)
    if exp.program is not None and runs:
        first = program_tasks(exp, {runs[0].index: runs[0]}, [runs[0].index], "train")[0]
        where = f" (in the image {exp.container.image})" if program_in_container(exp) else ""
        print(f"# first run's command line{where}: {shlex.join(first)}", file=out)
    print(submission(scheduler, exp.dir.resolve(), planned), file=out)
    workers = sum(job.workers for job in planned)
    refused = "; a sweep would refuse it (see the warning)" if warning else ""
    print(f"# dry run: {modes.of(exp).planned(exp, len(runs), workers)}, nothing written, nothing submitted{refused}", file=out)
    return 0


def task_table(job: PlannedJob, runs: dict[int, expdir.Run]) -> str:
    """What each array task of `job` trains, as comment lines: task, run id, seed and one column per
    swept key (values as runs.csv writes them)."""
    rows = [(task, runs[index]) for task, index in enumerate(job.runs, start=1)]
    keys = sorted({key for _, run in rows for key in run.settings})
    table = [["task", "run id", "seed", *keys]]
    for task, run in rows[:MAX_TABLE_ROWS]:
        values = expdir.encoded(run.settings)
        table.append([str(task), run.run_id, str(run.seed), *(values.get(key, "") for key in keys)])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [f"# {job.script}: what each task trains (jobs write runs/<run id>/)"]
    lines += ["#   " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
    if len(rows) > MAX_TABLE_ROWS:
        lines.append(f"#   ... and {len(rows) - MAX_TABLE_ROWS} more tasks")
    return "\n".join(lines) + "\n"


def submission(scheduler: Scheduler, root: Path, planned: list[PlannedJob]) -> str:
    """The scheduler commands a sweep runs, in order, with their dependency flags: `$TRAIN_0_0`
    stands for the id the command for jobs/train-0-0.sh prints. For a backend that runs no command
    (the local executor), the order and the waits in words."""
    names = {job.script: _variable(job.script) for job in planned}
    lines = []
    for job in planned:
        after = [Dependency(f"@{names[script]}@", kind) for script, kind in job.after]  # type: ignore[arg-type]
        argv = scheduler.submit_argv(root / job.script, after)
        if argv is None:
            waits = "; ".join(f"{'task i after task i' if kind == 'each' else 'after every task'} of {script}" for script, kind in job.after)
            lines.append(f"#   {job.script}" + (f": {waits}" if waits else ""))
            continue
        lines.append(f"{_shell_line(argv, names.values())}   # -> ${names[job.script]}")
        scheduler.submitted(f"@{names[job.script]}@", job.text)
    if any(line.startswith("#") for line in lines):
        return f"# {scheduler.name} runs the jobs on this machine, in this order:\n" + "\n".join(lines) + "\n"
    return "# submitted in this order ($NAME: the id of that job, read from its command's output):\n" + "\n".join(lines) + "\n"


def _variable(script: str) -> str:
    """`jobs/train-0-1.sh` -> `TRAIN_0_1`: the shell variable that stands for that job's id."""
    return Path(script).stem.upper().replace("-", "_")


def _shell_line(argv: list[str], variables: object) -> str:
    """`argv` quoted as a shell takes it, with each stand-in id (`@TRAIN_0_0@`) written as the
    variable it is (`$TRAIN_0_0`). A stand-in sits in a word of dependency flags and ids, which
    needs no quotes; a word that did would keep the stand-in as text rather than expand a variable."""
    words = []
    for word in argv:
        quoted = shlex.quote(word)
        for name in variables:  # type: ignore[attr-defined]
            if f"@{name}@" in word and quoted == word:
                quoted = quoted.replace(f"@{name}@", f"${name}")
        words.append(quoted)
    return " ".join(words)
