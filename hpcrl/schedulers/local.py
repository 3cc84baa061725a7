"""The embedded default: the same job scripts, run as local processes instead of cluster jobs.

`submit` only records a job (pipeline.py writes jobs.json); `start` runs every recorded job that
has not finished, as a tiny scheduler would: array tasks in a pool, eval task i after train task i,
the aggregate after all evals whatever their outcome, exit code 99 treated as a requeue (as often as
a cluster would: `hpcrl train` itself fails a run that stops making progress), and one
GPU per task through CUDA_VISIBLE_DEVICES when the machine has GPUs. The runner runs in the
foreground with a progress line, or detached (`--detach`) in its own session; either way its state
is in jobs/local-state.json, which `status` and `cancel` read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpcrl.config.schema import ConfigError
from hpcrl.cores import usable_cores
from hpcrl.io import atomic_write_text
from hpcrl.leftovers import end_leftovers, process_stat, processes
from hpcrl.schedulers.base import CANCELLED, DONE, FAILED, ORPHANED, PENDING, RUNNING, NodeRequest, Scheduler, SchedulerError, shown_state
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import Dependency, read_runs_csv
from hpcrl.store.states import REQUEUE_EXIT, State

GRACE_S = 60
"""Seconds a task has between SIGTERM (checkpoint and exit) and SIGKILL when it is stopped."""
STAGE_ORDER = {"train": 0, "study": 0, "learner": 0, "actors": 0, "eval": 1, "aggregate": 2}
_FINISHED = (DONE, FAILED, CANCELLED)


def local_slots(max_concurrent: int | None, cpus: int, cpu_count: int) -> int:
    """The one rule for the local executor's pool: `max_concurrent` tasks, else as many as the CPUs hold
    at `cpus` each (the cores this process may use, hpcrl.cores: inside an allocation, the allotment).
    GPUs do not size the pool: a task that asks for GPUs waits for free ones on its own, so CPU tasks
    (a learner's actors) still start beside a GPU task holding the only GPU."""
    return max_concurrent or max(1, cpu_count // max(1, cpus))


def state_path(experiment_dir: Path) -> Path:
    return experiment_dir / "jobs" / "local-state.json"


def lock_path(experiment_dir: Path) -> Path:
    return experiment_dir / "jobs" / "local-runner.lock"


def cancel_dir(experiment_dir: Path) -> Path:
    """Requests to cancel some tasks (`hpcrl cancel --setting/--run/--state`), one JSON file each
    (job id -> task ids): the live runner owns local-state.json, so it applies them itself."""
    return experiment_dir / "jobs" / "local-cancel"


def read_state(experiment_dir: Path) -> dict:
    """The runner's record; a damaged file is a one-line ConfigError naming it, never a traceback."""
    path = state_path(experiment_dir)
    if not path.exists():
        return {"runner_pid": None, "jobs": {}}
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("jobs"), dict):
            raise ValueError("expected an object with a 'jobs' object")
        return state
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: damaged ({str(exc)[:80]}); move it away and run `hpcrl sweep` again: runs resume from their markers and checkpoints") from None


def write_state(experiment_dir: Path, state: dict) -> None:
    atomic_write_text(state_path(experiment_dir), json.dumps(state, indent=1))


def runner_alive(experiment_dir: Path) -> bool:
    """Whether a runner holds the experiment's lock (works across processes, dies with the holder)."""
    path = lock_path(experiment_dir)
    if not path.exists():
        return False
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def task_tag(experiment_dir: Path, job_id: str, task: int) -> str:
    """The value of HPCRL_LOCAL_TASK in a task's environment: it tells a task's processes from a
    stranger that a recycled process-group id would otherwise make look like them."""
    return f"{experiment_dir}:{job_id}:{task}"


def group_alive(pgid: int, tag: str) -> bool:
    """Whether a live (not zombie) process of group `pgid` carries `tag` in its environment: the task,
    or what it started, still runs. Read from /proc; without /proc, whether the group exists."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    needle = f"HPCRL_LOCAL_TASK={tag}".encode()
    for pid in processes():
        stat = process_stat(pid)
        if stat is None or stat.group != pgid or not stat.live:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            if needle in (proc / str(pid) / "environ").read_bytes().split(b"\0"):
                return True
    return False


def end_groups(groups: list[tuple[int, str]], grace: float = GRACE_S) -> None:
    """SIGTERM each live task process group (the job shell passes it on: the trainer checkpoints),
    then SIGKILL what is still alive after `grace` seconds. Returns when none is left."""
    live = [(pgid, tag) for pgid, tag in groups if group_alive(pgid, tag)]
    for pgid, _ in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = [(pgid, tag) for pgid, tag in live if group_alive(pgid, tag)]
    for pgid, _ in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    while live:
        time.sleep(0.05)
        live = [(pgid, tag) for pgid, tag in live if group_alive(pgid, tag)]


def settle(experiment_dir: Path, state: dict, *, pending_too: bool) -> bool:
    """What a dead runner left: end its tasks' process groups (orphans still training) and call them
    cancelled, with tasks it never started when `pending_too`. True when anything changed."""
    left = [
        (job_id, t, s) for job_id, tasks in state["jobs"].items() for t, s in tasks.items()
        if s["state"] == RUNNING or (pending_too and s["state"] == PENDING)
    ]
    end_groups([(s["pgid"], task_tag(experiment_dir, job_id, int(t))) for job_id, t, s in left if s.get("pgid")])
    for _, _, s in left:
        s.update(state=CANCELLED, ended=time.time())
    return bool(left)


def cancel_in_state(state: dict, tasks: dict[str, list[int]]) -> list[tuple[str, int, dict]]:
    """Call the given pending tasks cancelled; return the running ones (job id, task, record), whose
    processes the caller ends before it calls them cancelled too."""
    running = []
    for job_id, ts in tasks.items():
        for t in ts:
            s = state["jobs"].get(job_id, {}).get(str(t))
            if s is None:
                continue
            if s["state"] == PENDING:
                s.update(state=CANCELLED, ended=time.time())
            elif s["state"] == RUNNING:
                running.append((job_id, int(t), s))
    return running


def read_requests(experiment_dir: Path) -> list[tuple[Path, dict[str, list[int]]]]:
    """The cancel requests waiting in cancel_dir, oldest first; a damaged one is dropped (its writer waits in vain and says so)."""
    found = []
    for path in sorted(cancel_dir(experiment_dir).glob("*.json")):
        try:
            tasks = json.loads(path.read_text())
            found.append((path, {str(j): [int(t) for t in ts] for j, ts in tasks.items()}))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, TypeError, AttributeError):
            path.unlink(missing_ok=True)
    return found


def gpu_count() -> int:
    """GPUs visible to this machine, without importing torch (nvidia-smi -L prints one line each)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class LocalScheduler(Scheduler):
    name = "local"
    template = "local.sh.j2"
    one_host = "runs on this machine alone"
    runs_here = True

    @classmethod
    def create(cls, experiment_dir: Path, stages: Mapping[str, Callable[..., int]] | None, out: IO[str] | None) -> LocalScheduler:
        return cls(experiment_dir)

    def task_slots(self, max_concurrent: int | None, cpus: int) -> int:
        return local_slots(max_concurrent, cpus, usable_cores())

    def refuse(self, exp: Any, requests: Sequence[NodeRequest] = ()) -> str | None:
        """Training this machine cannot run: an explicit CUDA device, or ranks that each need a GPU,
        asking for more GPUs than it has. (The executor gives a task at most the GPUs there are, so a
        GPU config with `train.device: auto` still runs on a laptop's CPU.)"""
        here, gpus = gpu_count(), exp.resources.gpus
        device, ranks = getattr(exp.train, "device", "auto"), exp.resources.ranks_per_node
        if gpus <= here or not (device.startswith("cuda") or (ranks > 1 and here > 0)):
            return None
        who = f"train.device {device!r}" if device.startswith("cuda") else f"{ranks} ranks, one GPU each,"
        return f"resources.gpus: {who} needs {gpus} GPU{'s' if gpus > 1 else ''} per task; {self.name} runs its tasks on this machine, which has {here}"

    def submit(self, script: Path, size: int, after: list[Dependency]) -> str:
        return script.stem  # unique per experiment: <stage>-<attempt>-<chunk>

    def __init__(self, experiment_dir: Path) -> None:
        super().__init__()
        self.dir = experiment_dir.resolve()
        """Local job ids (script names) are unique only within one experiment."""

    def query(self, job_ids: list[str]) -> dict[str, dict[int, str]]:
        state, alive = read_state(self.dir), runner_alive(self.dir)
        result: dict[str, dict[int, str]] = {}
        for job_id in job_ids:
            tasks = state["jobs"].get(job_id)
            if tasks is None:
                continue
            result[job_id] = {}
            for t, s in tasks.items():
                found = s["state"]
                if not alive and found == RUNNING:
                    # The runner died; its task may still be training on its own.
                    found = ORPHANED if s.get("pgid") and group_alive(s["pgid"], task_tag(self.dir, job_id, int(t))) else CANCELLED
                elif not alive and found == PENDING:
                    found = CANCELLED  # nothing will start it
                result[job_id][int(t)] = found
        return result

    def cancel(self, job_ids: list[str]) -> None:
        """Stop the runner (it stops its tasks), then end every recorded task process group still
        alive, the runner's or an orphan's, so nothing of the experiment runs on afterwards."""
        state = read_state(self.dir)
        pid = state.get("runner_pid")
        if pid and runner_alive(self.dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S + 10
            while runner_alive(self.dir) and time.monotonic() < deadline:
                time.sleep(0.1)
        if not runner_alive(self.dir):
            state = read_state(self.dir)
            if settle(self.dir, state, pending_too=True):
                write_state(self.dir, state)

    def cancel_tasks(self, tasks: dict[str, list[int]]) -> None:
        """A live runner gets a request file and applies it in its next loop (pending tasks cancelled,
        running ones sent SIGTERM, then SIGKILL after the grace); with none alive this process takes the
        runner's lock for a moment and applies it: pending tasks cancelled, orphans ended."""
        requests = cancel_dir(self.dir)
        requests.mkdir(parents=True, exist_ok=True)
        path = requests / f"{os.getpid()}-{time.time_ns()}.json"
        atomic_write_text(path, json.dumps(tasks), durable=False)
        deadline = time.monotonic() + 30
        while path.exists():
            with lock_path(self.dir).open("a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a runner is alive: it takes the request
                    if time.monotonic() > deadline:
                        raise SchedulerError(f"{self.dir}: the local runner has not taken the cancel request {path} within 30 s; it will when it loops again") from None
                    time.sleep(0.05)
                    continue
                try:  # no runner: nobody else writes the state now
                    state = read_state(self.dir)
                    for request, asked in read_requests(self.dir):
                        running = cancel_in_state(state, asked)
                        end_groups([(s["pgid"], task_tag(self.dir, j, t)) for j, t, s in running if s.get("pgid")])
                        for _, _, s in running:
                            s.update(state=CANCELLED, ended=time.time())
                        write_state(self.dir, state)
                        request.unlink(missing_ok=True)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def recover(self) -> None:
        """Before a sweep: a dead runner's orphans are ended (SIGTERM first, so they checkpoint) and its
        unfinished tasks called cancelled, so the sweep resubmits those runs and no second trainer
        ever starts beside a live one. With a live runner nothing is touched."""
        if runner_alive(self.dir):
            return
        state = read_state(self.dir)
        if settle(self.dir, state, pending_too=True):
            write_state(self.dir, state)

    def start(self, experiment_dir: Path, detach: bool) -> int:
        experiment_dir = self.dir
        if runner_alive(experiment_dir):
            print(f"{experiment_dir}: the local runner already running there picks up the new jobs")
            return 0 if detach else follow(experiment_dir)
        if detach:
            log = (experiment_dir / "jobs" / "logs" / "local-runner.log").open("a")
            proc = subprocess.Popen(
                [sys.executable, "-m", "hpcrl.schedulers.local", str(experiment_dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            # Return once it holds its lock: a sweep that follows must see a live runner, not orphans to settle.
            deadline = time.monotonic() + 60
            while not runner_alive(experiment_dir) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            print(f"{experiment_dir}: running in the background (pid {proc.pid}); follow with `hpcrl status {experiment_dir}`")
            return 0
        return LocalRunner(experiment_dir, progress=sys.stdout).run()


def follow(experiment_dir: Path) -> int:
    """Wait for another process's runner, showing the same progress line: of the jobs that had work
    left while following, as the runner's own line (an earlier attempt's failures are history)."""
    progress = Progress(sys.stdout, experiment_dir)
    watched: set[str] = set()

    def current() -> dict:
        jobs = read_state(experiment_dir)["jobs"]
        watched.update(j for j, tasks in jobs.items() if any(s["state"] in (PENDING, RUNNING) for s in tasks.values()))
        return {j: t for j, t in jobs.items() if j in watched}

    while runner_alive(experiment_dir):
        progress.show(current())
        time.sleep(1)
    progress.close(current())
    return 0


@dataclass
class _Task:
    job_id: str
    task: int
    stage: str
    script: Path
    gpus: int
    proc: subprocess.Popen | None = None
    log: IO | None = None
    devices: tuple[str, ...] = ()
    cancelled_at: float | None = None
    """When `hpcrl cancel` of this task sent it SIGTERM; SIGKILL follows after the grace."""


class Progress:
    """One status line, rewritten in place on a terminal and printed on change otherwise.

    A finished task is counted as `hpcrl status` shows its stage (`shown_state` of what it left on
    disk and its exit code): an evaluation that was skipped is skipped, not done, and an aggregate
    that wrote its summary is done even where collect exited 1. Each finished task's run files are
    read once."""

    def __init__(self, stream: IO | None, experiment_dir: Path | None = None) -> None:
        self.stream = stream
        self.tty = bool(stream and stream.isatty())
        self.last = ""
        self.dir = experiment_dir
        self._shown: dict[tuple[str, str, object], str] = {}
        self._records: dict[str, dict] = {}
        self._run_ids: dict[int, str] = {}

    def state(self, job_id: str, task: str, s: dict) -> str:
        """The state of one task as status shows its stage (the scheduler's own for unfinished tasks)."""
        stage = job_id.split("-")[0]
        if self.dir is None or s["state"] not in (DONE, FAILED) or stage not in ("train", "learner", "eval", "aggregate"):
            return s["state"]
        key = (job_id, task, s.get("ended"))
        if key not in self._shown:
            where = self._where(job_id, int(task))
            self._shown[key] = s["state"] if where is None else shown_state(rundir.stage_marker(stage, where), s["state"])
        return self._shown[key]

    def _where(self, job_id: str, task: int) -> Path | None:
        """The run directory of a task (the experiment's for the aggregate); None where not found."""
        assert self.dir is not None
        if job_id.startswith("aggregate"):
            return self.dir
        if job_id not in self._records:
            records = json.loads(expdir.jobs_path(self.dir).read_text())
            self._records = {r["job_id"]: r for r in records}
        manifest = self._records.get(job_id, {}).get("manifest")
        runs = rundir.read_manifest(self.dir, manifest) if manifest else []
        index = runs[task - 1] if 0 < task <= len(runs) else None
        if index is not None and index not in self._run_ids:
            self._run_ids = {int(r["index"]): r["run_id"] for r in read_runs_csv(self.dir)}
        return expdir.run_dir(self.dir, self._run_ids[index]) if index in self._run_ids else None

    def counts(self, jobs: dict) -> dict[str, dict[str, int]]:
        """Stage -> shown state -> tasks."""
        counts: dict[str, dict[str, int]] = {}
        for job_id, tasks in jobs.items():
            stage = job_id.split("-")[0]
            for task, s in tasks.items():
                shown = self.state(job_id, task, s)
                counts.setdefault(stage, {}).setdefault(shown, 0)
                counts[stage][shown] += 1
        return counts

    def line(self, jobs: dict) -> str:
        counts = self.counts(jobs)
        parts = []
        for stage in STAGE_ORDER:
            if stage in counts:
                c = counts[stage]
                total = sum(c.values())
                extra = "".join(f", {c[k]} {k}" for k in (RUNNING, FAILED, State.SKIPPED, CANCELLED) if c.get(k))
                parts.append(f"{stage} {c.get(DONE, 0)}/{total} done{extra}")
        return " | ".join(parts)

    def show(self, jobs: dict) -> None:
        text = self.line(jobs)
        if self.stream is None or text == self.last:
            return
        self.last = text
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, jobs: dict) -> None:
        self.show(jobs)
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def pool_size(jobs: list[dict], cpu_count: int) -> int:
    """The pool of the newest training stage's resources (local_slots, the one rule)."""
    work = [j for j in jobs if j["stage"] in ("train", "study", "learner") and j.get("resources")] or [j for j in jobs if j.get("resources")]
    if not work:
        return max(1, cpu_count)
    res = max(work, key=lambda j: j["attempt"])["resources"]
    return local_slots(res.get("max_concurrent"), int(res.get("cpus", 1)) * int(res.get("ranks", 1)), cpu_count)


class LocalRunner:
    """Runs an experiment's local jobs to completion, honouring the stage dependencies.

    Each task's resources come from its job's record in jobs.json (jobplan.py declared them); the
    pool follows local_slots, and a task that asks for GPUs also waits for free ones.
    """

    def __init__(self, experiment_dir: Path, progress: IO | None = None) -> None:
        self.dir = experiment_dir
        self.progress = Progress(progress, experiment_dir)
        self.free_gpus = [str(i) for i in range(gpu_count())]
        self.machine_gpus = len(self.free_gpus)
        self.state = read_state(experiment_dir)
        self.stopping = False
        self.pool = 1
        """Tasks at once; set from jobs.json when the run starts."""
        self.mine: set[str] = set()
        """Jobs with tasks this runner found unfinished: its progress line and exit code are about them only."""

    def _save(self) -> None:
        write_state(self.dir, self.state)
        self.progress.show({j: t for j, t in self.state["jobs"].items() if j in self.mine})

    def _load_jobs(self) -> list[dict]:
        path = expdir.jobs_path(self.dir)
        try:
            jobs = [j for j in json.loads(path.read_text()) if j["scheduler"] == "local"] if path.exists() else []
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"{path}: damaged ({str(exc)[:80]})") from None
        for job in jobs:
            tasks = self.state["jobs"].setdefault(job["job_id"], {})
            for t in range(1, job["size"] + 1) if job["size"] else [0]:
                tasks.setdefault(str(t), {"state": PENDING, "rc": None, "requeues": 0})
            if any(s["state"] in (PENDING, RUNNING) for s in tasks.values()):
                self.mine.add(job["job_id"])
        return jobs
    def _ready(self, job: dict, task: int) -> bool:
        for dep in job["after"]:
            tasks = self.state["jobs"].get(dep["job_id"], {})
            needed = [tasks.get(str(task))] if dep["kind"] == "each" else list(tasks.values())
            if not all(s and s["state"] in _FINISHED for s in needed):
                return False
        return True

    def _gpus(self, job: dict) -> int:
        """GPUs a task of this job takes: as planned (jobs.json), at most what the machine has, and
        none on a machine without GPUs (the task then runs on the CPU)."""
        return min(int(job.get("resources", {}).get("gpus", 0)), self.machine_gpus)

    def _launch(self, job: dict, task: int) -> _Task:
        stage = job["stage"]
        gpus = self._gpus(job)
        t = _Task(job["job_id"], task, stage, self.dir / job["script"], gpus)
        env = dict(os.environ, HPCRL_TASK_ID=str(task), HPCRL_LOCAL_TASK=task_tag(self.dir, job["job_id"], task))
        if gpus:
            t.devices, self.free_gpus = tuple(self.free_gpus[:gpus]), self.free_gpus[gpus:]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(t.devices)
        elif self.machine_gpus or job.get("resources", {}).get("gpus"):  # no GPU for this task: hide them all
            env["CUDA_VISIBLE_DEVICES"] = ""
        t.log = expdir.local_job_log(self.dir, job["job_id"], task, bool(job["size"])).open("a")
        # Own session and process group (pgid = pid): Ctrl-C reaches the runner only, which then stops
        # the tasks in order; `cancel` and a later sweep end the group even when this runner is gone.
        t.proc = subprocess.Popen(["bash", str(t.script)], env=env, stdin=subprocess.DEVNULL, stdout=t.log, stderr=subprocess.STDOUT, start_new_session=True)
        s = self.state["jobs"][job["job_id"]][str(task)]
        s.update(state=RUNNING, pid=t.proc.pid, pgid=t.proc.pid, started=time.time())
        return t

    def _finish(self, t: _Task, rc: int) -> None:
        """Record how task `t` ended. What it left running in its session (its own: `_launch`) ends with it,
        as a cluster ends a job's processes: a trainer killed alone (the OOM killer) leaves the processes its
        simulators started (ViZDoom's engines) orphaned, for ever, under nobody's watch."""
        assert t.log is not None
        s = self.state["jobs"][t.job_id][str(t.task)]
        if t.proc:
            end_leftovers(t.proc.pid, t.log, f"the task ended (exit {rc}) and", since=s["started"])
        t.log.close()
        self.free_gpus += list(t.devices)
        s.update(rc=rc, ended=time.time())
        if rc == REQUEUE_EXIT and not self.stopping and t.cancelled_at is None:
            s.update(state=PENDING, requeues=s["requeues"] + 1)
        elif self.stopping or t.cancelled_at is not None:
            s["state"] = CANCELLED
        else:
            s["state"] = DONE if rc == 0 else FAILED

    def _take_cancels(self, running: list[_Task]) -> list[Path]:
        """Apply the cancel requests waiting (see LocalScheduler.cancel_tasks); returns their files,
        removed once the state that shows them is saved. Also SIGKILLs what outlived its grace."""
        taken = []
        now = time.monotonic()
        for path, asked in read_requests(self.dir):
            for job_id, task, _ in cancel_in_state(self.state, asked):
                for t in running:
                    if (t.job_id, t.task) == (job_id, task) and t.cancelled_at is None and t.proc:
                        t.cancelled_at = now
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(t.proc.pid, signal.SIGTERM)
            taken.append(path)
        for t in running:
            if t.cancelled_at is not None and now - t.cancelled_at > GRACE_S and t.proc:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(t.proc.pid, signal.SIGKILL)
        return taken

    def _stop(self, signum: int, _frame) -> None:
        self.stopping = True

    def run(self) -> int:
        lock = lock_path(self.dir).open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{self.dir}: another local runner is active", file=sys.stderr)
            return 1
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.state = read_state(self.dir)  # as the last runner left it, now that none other can write it
        settle(self.dir, self.state, pending_too=False)  # tasks a dead runner left running: none runs twice
        self.state["runner_pid"] = os.getpid()
        running: list[_Task] = []
        try:
            while True:
                jobs = self._load_jobs()
                self.pool = pool_size(jobs, usable_cores())
                if self.stopping:
                    break
                taken = self._take_cancels(running)
                # Later stages first: a finished train task's eval beats starting another run.
                for job in sorted(jobs, key=lambda j: -STAGE_ORDER.get(j["stage"], 0)):
                    for key, s in self.state["jobs"][job["job_id"]].items():
                        task = int(key)
                        if len(running) >= self.pool:
                            break
                        gpus = self._gpus(job)
                        if s["state"] != PENDING or not self._ready(job, task) or gpus > len(self.free_gpus):
                            continue
                        running.append(self._launch(job, task))
                still = []
                for t in running:
                    rc = t.proc.poll() if t.proc else 0
                    if rc is None:
                        still.append(t)
                    else:
                        self._finish(t, rc)
                running = still
                self._save()
                for path in taken:
                    path.unlink(missing_ok=True)
                pending = any(s["state"] in (PENDING, RUNNING) for j in jobs for s in self.state["jobs"][j["job_id"]].values())
                if not pending and not running:
                    break
                time.sleep(0.2)
            if self.stopping:
                self._shutdown(running)
        finally:
            self.progress.close({j: t for j, t in self.state["jobs"].items() if j in self.mine})
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        # Only this runner's work counts: a failure of an earlier attempt that a retry has since
        # fixed is history, not the outcome of this sweep.
        mine = {j: t for j, t in self.state["jobs"].items() if j in self.mine}
        failed = sum(c.get(FAILED, 0) for c in self.progress.counts(mine).values())
        return 130 if self.stopping else (1 if failed else 0)

    def _shutdown(self, running: list[_Task]) -> None:
        """Ask each task to checkpoint (SIGTERM reaches the trainer through the job script's trap),
        SIGKILL what remains of its process group after the grace, then reap and record each task."""
        end_groups([(t.proc.pid, task_tag(self.dir, t.job_id, t.task)) for t in running if t.proc])
        for t in running:
            assert t.proc is not None
            self._finish(t, t.proc.wait())
        for tasks in self.state["jobs"].values():
            for s in tasks.values():
                if s["state"] == PENDING:
                    s["state"] = CANCELLED
        self._save()


if __name__ == "__main__":  # the detached runner: python -m hpcrl.schedulers.local EXPERIMENT_DIR
    sys.exit(LocalRunner(Path(sys.argv[1]).resolve(), progress=None).run())
