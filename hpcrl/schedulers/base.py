"""One interface for every scheduler: render a stage's script, submit it, query it, cancel it.

A backend is a thin class over the scheduler's own command-line tools (modelled on submitit's
executors). Job scripts are rendered from `job_templates/<name>.sh.j2`; dependencies are passed on
the submit command line because job ids exist only once the predecessor is submitted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from hpcrl import templates
from hpcrl.store.expdir import Dependency
from hpcrl.store.states import State

# The states `hpcrl status` shows, from any scheduler: the members of store.states.State.
PENDING, RUNNING, DONE, FAILED, CANCELLED, UNKNOWN = State.PENDING, State.RUNNING, State.DONE, State.FAILED, State.CANCELLED, State.UNKNOWN
ORPHANED, NOT_SUBMITTED = State.ORPHANED, State.NOT_SUBMITTED


def shown_state(marker: str, sched: str | None) -> State:
    """A stage's state of a run (or of the experiment, for the aggregate), by the one rule that
    `hpcrl status` and the local runner's progress line and exit code apply: what the stage left on
    disk (`rundir.stage_marker`) is the truth for finished work, so a skipped evaluation is skipped
    and an aggregate that wrote a summary with a score is done whatever the task's exit code; the scheduler
    knows about waiting and running."""
    if marker in (State.DONE, State.FAILED, State.SKIPPED):
        return State(marker)
    if sched in (PENDING, RUNNING, ORPHANED, CANCELLED):
        return sched
    if sched is None:
        return NOT_SUBMITTED
    return State.FAILED  # the task ended (or the scheduler forgot it) without writing its marker


def expand_ranges(text: str) -> list[int]:
    """Task ids from the range lists both Slurm and Grid Engine print: `7`, `5-9`, `1-9:2,12`."""
    tasks: list[int] = []
    for part in filter(None, text.split(",")):
        span, _, step = part.partition(":")
        low, _, high = span.partition("-")
        tasks.extend(range(int(low), int(high or low) + 1, int(step or 1)))
    return tasks


def compress_ranges(tasks: list[int]) -> list[str]:
    """The inverse of expand_ranges, without steps: [1, 2, 3, 5, 7, 8] -> ["1-3", "5", "7-8"]."""
    spans: list[list[int]] = []
    for t in sorted(set(tasks)):
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return [f"{low}-{high}" if high > low else str(low) for low, high in spans]


@dataclass(frozen=True)
class NodeRequest:
    """What one node must hold for one kind of job, with the config keys that ask for it (the
    submit stage builds these from each stage's resources; a cluster's `refuse` compares them
    with its largest node)."""

    cpus_key: str
    cpus: int
    """CPUs on one node: per rank, times the ranks on a node."""
    mem_key: str
    mem: str
    """As the config wrote it, for the message."""
    mem_mb: int
    cpus_detail: str = field(default="", compare=False)
    """How `cpus` adds up, for the message only (` (2 ranks x 4)`), or empty."""
    gpus: int = 0
    gpus_key: str = ""
    """The key that asks for the `gpus` (resources.gpus, eval.gpus), for the message."""


class SchedulerError(RuntimeError):
    """A scheduler command failed; the message carries its command line and stderr."""


class SchedulerTimeout(SchedulerError):
    """A scheduler command gave no answer in its time: the controller may be down."""


PROBE_TIMEOUT_S = 5.0
"""How long a sweep waits for the answer to a question that only sharpens a check (node sizes, the array
limit): a controller that is down makes sinfo fail only after its own 9-10 s message timeout, once per
question, and a dry run asked two (18.6 s)."""


class Scheduler(ABC):
    name: ClassVar[str]
    template: ClassVar[str]
    one_host: ClassVar[str | None] = "runs a run's ranks on one host"
    """Why a run's ranks cannot span nodes here (the one-line refusal of resources.nodes > 1);
    None where they can (Slurm's srun)."""

    runs_here: ClassVar[bool] = False
    """`start` runs the submitted tasks on this machine (local, debug), so a sweep with tasks still in
    flight starts it again; a cluster runs its jobs on its own, and cannot build an image in one here."""
    in_process: ClassVar[bool] = False
    """The tasks run in the calling Python process (debug): no container, no job script written."""

    @classmethod
    def create(cls, experiment_dir: Path, stages: Mapping[str, Callable[..., int]] | None, out: IO[str] | None) -> Scheduler:
        """The backend for one experiment (get_scheduler): a cluster's needs neither; local keeps
        its state in the experiment; debug runs tasks through `stages` and prints to `out`."""
        return cls()

    def cannot(self, exp: Any) -> str | None:
        """Why this backend cannot run the experiment whatever machines it has (one line; debug: work
        that needs several processes), before anything is written, a dry run included; None where it can."""
        return None

    def refuse(self, exp: Any, requests: Sequence[NodeRequest] = ()) -> str | None:
        """Why the machines this backend would run on cannot hold the experiment now (one line: a live
        cluster's largest node, this machine's GPUs), before anything is written; None where they can.
        A dry run prints the scripts with it as a warning. `requests`: what one node must hold for each
        kind of job it submits."""
        return None

    def refuse_nodes(self, res: Any) -> str | None:
        """Why a run's ranks cannot span `res.nodes` nodes here (the end of a one-line refusal of
        resources.nodes > 1, after the backend's name); None where they can. `one_host` unless the
        backend asks its cluster (Grid Engine: whether the parallel environment spans hosts)."""
        return self.one_host

    def task_slots(self, max_concurrent: int | None, cpus: int) -> int | None:
        """How many tasks of `cpus` CPUs each run at once, where this backend decides it (local's
        pool); None where the cluster does."""
        return None

    def __init__(self) -> None:
        self.calls = 0
        """Scheduler commands run so far (the submit benchmark counts them)."""
        self.unreachable: str | None = None
        """Set once a probe went unanswered: the controller is taken as down for the rest of this
        object's life, and every later command fails at once with this line instead of waiting again."""
        self._max_array_size: int | None = None

    def render(self, context: dict[str, Any], cwd: Path | None = None) -> str:
        return templates.render("job_templates", self.template, {"scheduler": self.name, **context}, cwd)

    def max_array_size(self) -> int:
        """The largest array the cluster accepts; bigger stages are split into chunks. Asked once."""
        if self._max_array_size is None:
            self._max_array_size = self._read_max_array_size()
        return self._max_array_size

    def _read_max_array_size(self) -> int:
        return 1_000_000

    def config_value(self, argv: list[str], pattern: str, default: int) -> int:
        """An integer setting from the cluster's configuration listing (`pattern` captures it), or
        `default` when the listing lacks it or no cluster answers (a dry run on a machine without one)."""
        try:
            found = re.search(pattern, self.probe(argv), re.MULTILINE)
        except SchedulerError:
            found = None
        return int(found.group(1)) if found else default

    @abstractmethod
    def submit(self, script: Path, size: int, after: list[Dependency]) -> str:
        """Submit a rendered script; return the job id."""

    def submit_argv(self, script: Path, after: list[Dependency]) -> list[str] | None:
        """The command `submit` runs for `script` with its dependencies (a dry run shows it as it
        would run); None for a backend that runs no command to submit (local, debug)."""
        return None

    def submitted(self, job_id: str, text: str) -> None:
        """What a backend keeps of a job it submitted (its script's `text`) for the jobs after it: a
        dry run tells it of each planned job too, under a stand-in id, so its commands read as a sweep's.
        Nothing by default."""
        return None

    @abstractmethod
    def query(self, job_ids: list[str]) -> dict[str, dict[int, str]]:
        """States of the given jobs in as few scheduler calls as possible: job id -> task -> state.

        Task 0 stands for a non-array job. Jobs the scheduler no longer knows are left out.
        """

    @abstractmethod
    def cancel(self, job_ids: list[str]) -> None: ...

    def cancel_tasks(self, tasks: dict[str, list[int]]) -> None:
        """Cancel some array tasks (job id -> task ids, counted from 1), in one scheduler call where the
        scheduler can say it in one; tasks that already ended are no error. The rest of each array
        runs on."""
        raise SchedulerError(f"{self.name}: cancelling single array tasks is not supported")

    def recover(self) -> None:
        """Settle what a dead predecessor left before a sweep looks at the jobs. Clusters own their jobs; the local backend overrides this."""
        return None

    def start(self, experiment_dir: Path, detach: bool) -> int:
        """Called after every stage is submitted. Clusters run on their own; the local backend works here."""
        return 0

    def probe(self, argv: list[str]) -> str:
        """A question asked before submitting whose answer only sharpens a check (`refuse`, `config_value`):
        bounded by PROBE_TIMEOUT_S. One left unanswered is said once on stderr, in one line, and marks the
        controller unreachable (see `unreachable`); a command that fails at once is no such sign."""
        try:
            return self.run(argv, timeout=PROBE_TIMEOUT_S)
        except SchedulerTimeout as exc:
            self.unreachable = f"{exc}: {self.name}'s controller is not answering"
            print(f"hpcrl: {self.unreachable}; the sweep goes on without {argv[0]}'s answer (a dry run shows defaults; a submission fails at once)", file=sys.stderr)
            raise

    def run(self, argv: list[str], input: str | None = None, timeout: float = 120.0) -> str:
        """Run one scheduler command (no shell), count it, and raise SchedulerError with its stderr;
        SchedulerTimeout after `timeout` seconds, and at once where the controller proved unreachable."""
        if self.unreachable:
            raise SchedulerError(f"{argv[0]}: not run: {self.unreachable}")
        self.calls += 1
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]}: not found on PATH") from None
        except subprocess.TimeoutExpired:
            raise SchedulerTimeout(f"{' '.join(argv)}: no answer within {timeout:g} s") from None
        if proc.returncode != 0:
            raise SchedulerError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout
