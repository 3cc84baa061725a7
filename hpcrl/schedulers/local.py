"""The embedded default: the same job scripts, run as local processes instead of cluster jobs.

`submit` only records a job (pipeline.py writes jobs.json); `start` runs every recorded job that
has not finished, as a tiny scheduler would: array tasks in a pool, eval task i after train task i,
the aggregate after all evals whatever their outcome, exit code 99 treated as a requeue, and one
GPU per task through CUDA_VISIBLE_DEVICES when the machine has GPUs. The runner runs in the
foreground with a progress line, or detached (`--detach`) in its own session; either way its state
is in jobs/local-state.json, which `status` and `cancel` read.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import yaml

from hpcrl.io import atomic_write_text
from hpcrl.schedulers.base import CANCELLED, DONE, FAILED, PENDING, REQUEUE_EXIT, RUNNING, Dependency, Scheduler

MAX_REQUEUES = 20
STAGE_ORDER = {"train": 0, "learner": 0, "actors": 0, "eval": 1, "aggregate": 2}
_FINISHED = (DONE, FAILED, CANCELLED)


def state_path(experiment_dir: Path) -> Path:
    return experiment_dir / "jobs" / "local-state.json"


def lock_path(experiment_dir: Path) -> Path:
    return experiment_dir / "jobs" / "local-runner.lock"


def read_state(experiment_dir: Path) -> dict:
    path = state_path(experiment_dir)
    return json.loads(path.read_text()) if path.exists() else {"runner_pid": None, "jobs": {}}


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
            if tasks is not None:
                # Tasks left pending or running by a runner that died will never run: call them cancelled.
                result[job_id] = {int(t): s["state"] if alive or s["state"] in _FINISHED else CANCELLED for t, s in tasks.items()}
        return result

    def cancel(self, job_ids: list[str]) -> None:
        pid = read_state(self.dir).get("runner_pid")
        if pid and runner_alive(self.dir):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while runner_alive(self.dir) and time.monotonic() < deadline:
                time.sleep(0.1)

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
            print(f"{experiment_dir}: running in the background (pid {proc.pid}); follow with `hpcrl status {experiment_dir}`")
            return 0
        return LocalRunner(experiment_dir, progress=sys.stdout).run()


def follow(experiment_dir: Path) -> int:
    """Wait for another process's runner, showing the same progress line."""
    progress = Progress(sys.stdout)
    while runner_alive(experiment_dir):
        progress.show(read_state(experiment_dir)["jobs"])
        time.sleep(1)
    progress.close(read_state(experiment_dir)["jobs"])
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


class Progress:
    """One status line, rewritten in place on a terminal and printed on change otherwise."""

    def __init__(self, stream: IO | None) -> None:
        self.stream = stream
        self.tty = bool(stream and stream.isatty())
        self.last = ""

    def line(self, jobs: dict) -> str:
        counts: dict[str, dict[str, int]] = {}
        for job_id, tasks in jobs.items():
            stage = job_id.split("-")[0]
            for s in tasks.values():
                counts.setdefault(stage, {}).setdefault(s["state"], 0)
                counts[stage][s["state"]] += 1
        parts = []
        for stage in STAGE_ORDER:
            if stage in counts:
                c = counts[stage]
                total = sum(c.values())
                extra = "".join(f", {c[k]} {k}" for k in (RUNNING, FAILED, CANCELLED) if c.get(k))
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


class LocalRunner:
    """Runs an experiment's local jobs to completion, honouring the stage dependencies."""

    def __init__(self, experiment_dir: Path, progress: IO | None = None) -> None:
        self.dir = experiment_dir
        self.progress = Progress(progress)
        config = yaml.safe_load((experiment_dir / "experiment.yaml").read_text())["config"]
        res = config["resources"]
        self.train_gpus = int(res["gpus"])
        self.eval_gpus = int(config["eval"]["gpus"])
        self.free_gpus = [str(i) for i in range(gpu_count())]
        default_pool = max(1, (os.cpu_count() or 1) // max(1, int(res["cpus"])))
        if self.train_gpus and self.free_gpus:
            default_pool = max(1, len(self.free_gpus) // self.train_gpus)
        self.pool = int(res["max_concurrent"] or default_pool)
        self.state = read_state(experiment_dir)
        self.stopping = False

    def _save(self) -> None:
        atomic_write_text(state_path(self.dir), json.dumps(self.state, indent=1))
        self.progress.show(self.state["jobs"])

    def _load_jobs(self) -> list[dict]:
        path = self.dir / "jobs" / "jobs.json"
        jobs = [j for j in json.loads(path.read_text()) if j["scheduler"] == "local"] if path.exists() else []
        for job in jobs:
            tasks = self.state["jobs"].setdefault(job["job_id"], {})
            for t in range(1, job["size"] + 1) if job["size"] else [0]:
                tasks.setdefault(str(t), {"state": PENDING, "rc": None, "requeues": 0})
        return jobs

    def _ready(self, job: dict, task: int) -> bool:
        for dep in job["after"]:
            tasks = self.state["jobs"].get(dep["job_id"], {})
            needed = [tasks.get(str(task))] if dep["kind"] == "each" else list(tasks.values())
            if not all(s and s["state"] in _FINISHED for s in needed):
                return False
        return True

    def _gpus(self, stage: str) -> int:
        """GPUs a task of this stage takes: a distributed learner trains like a train task; actors act on CPU."""
        return self.train_gpus if stage in ("train", "learner") else self.eval_gpus if stage == "eval" else 0

    def _launch(self, job: dict, task: int) -> _Task:
        stage = job["stage"]
        gpus = self._gpus(stage)
        t = _Task(job["job_id"], task, stage, self.dir / job["script"], gpus)
        env = dict(os.environ, HPCRL_TASK_ID=str(task))
        if gpus and self.free_gpus:
            t.devices, self.free_gpus = tuple(self.free_gpus[:gpus]), self.free_gpus[gpus:]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(t.devices)
        elif self.free_gpus or gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        suffix = f".{task}" if job["size"] else ""
        t.log = (self.dir / "jobs" / "logs" / f"{job['job_id']}{suffix}.out").open("a")
        # Own session: Ctrl-C reaches the runner only, which then stops the tasks in order.
        t.proc = subprocess.Popen(["bash", str(t.script)], env=env, stdin=subprocess.DEVNULL, stdout=t.log, stderr=subprocess.STDOUT, start_new_session=True)
        s = self.state["jobs"][job["job_id"]][str(task)]
        s.update(state=RUNNING, pid=t.proc.pid, started=time.time())
        return t

    def _finish(self, t: _Task, rc: int) -> None:
        assert t.log is not None
        t.log.close()
        self.free_gpus += list(t.devices)
        s = self.state["jobs"][t.job_id][str(t.task)]
        s.update(rc=rc, ended=time.time())
        if rc == REQUEUE_EXIT and not self.stopping and s["requeues"] < MAX_REQUEUES:
            s.update(state=PENDING, requeues=s["requeues"] + 1)
        elif self.stopping:
            s["state"] = CANCELLED
        else:
            s["state"] = DONE if rc == 0 else FAILED

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
        self.state["runner_pid"] = os.getpid()
        running: list[_Task] = []
        try:
            while True:
                jobs = self._load_jobs()
                if self.stopping:
                    break
                # Later stages first: a finished train task's eval beats starting another run.
                for job in sorted(jobs, key=lambda j: -STAGE_ORDER.get(j["stage"], 0)):
                    for key, s in self.state["jobs"][job["job_id"]].items():
                        task = int(key)
                        if len(running) >= self.pool:
                            break
                        gpus = self._gpus(job["stage"])
                        if s["state"] != PENDING or not self._ready(job, task) or (self.free_gpus and gpus > len(self.free_gpus)):
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
                pending = any(s["state"] in (PENDING, RUNNING) for j in jobs for s in self.state["jobs"][j["job_id"]].values())
                if not pending and not running:
                    break
                time.sleep(0.2)
            if self.stopping:
                self._shutdown(running)
        finally:
            self.progress.close(self.state["jobs"])
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        failed = sum(1 for tasks in self.state["jobs"].values() for s in tasks.values() if s["state"] == FAILED)
        return 130 if self.stopping else (1 if failed else 0)

    def _shutdown(self, running: list[_Task]) -> None:
        """Ask each task to checkpoint (SIGTERM reaches the trainer through the job script's trap)."""
        for t in running:
            if t.proc and t.proc.poll() is None:
                os.killpg(t.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for t in running:
            assert t.proc is not None
            try:
                t.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(t.proc.pid, signal.SIGKILL)
                t.proc.wait()
            self._finish(t, t.proc.returncode)
        for tasks in self.state["jobs"].values():
            for s in tasks.values():
                if s["state"] == PENDING:
                    s["state"] = CANCELLED
        self._save()


if __name__ == "__main__":  # the detached runner: python -m hpcrl.schedulers.local EXPERIMENT_DIR
    sys.exit(LocalRunner(Path(sys.argv[1]).resolve(), progress=None).run())
