"""Issue 12 item 3: the local executor owns its tasks even when its runner dies.

`kill -9` of a foreground `hpcrl sweep --scheduler local` mid-training leaves the trainer running in
its own process group. Then: `status` says the task runs orphaned (not "cancelled"), `cancel` ends
it, and a re-sweep ends any orphan before it starts the run again, so two trainers never run on one
run directory, and the re-sweep finishes instead of waiting forever for a task nobody runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from factories import SIMULATOR_ENV, alive, own_shm, trainers, write_config

from hpcrl.schedulers.local import group_alive, task_tag

pytestmark = pytest.mark.e2e

PY = sys.executable
# Long enough that the runner is killed mid-training on a loaded 2-core machine, short enough to finish after.
TRAIN = {"sweep": {"seeds": [0]}, "train": {"total_steps": 12000}, "resources": {"max_concurrent": 2}}


def hpcrl(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def tasks(exp: Path) -> dict:
    path = exp / "jobs" / "local-state.json"
    return json.loads(path.read_text())["jobs"] if path.exists() else {}


class TrainerWatch:
    """The most trainers of the experiment seen alive at once, sampled every 50 ms in a thread."""

    def __init__(self, exp: Path) -> None:
        self.exp, self.most, self.stop = exp, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.most = max(self.most, len(trainers(self.exp)))
            time.sleep(0.05)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.most


def sweep_then_kill_the_runner(tmp_path: Path) -> tuple[Path, Path, list[tuple[int, str]]]:
    """Start a foreground local sweep, kill -9 it once its trainer has logged steps; return the
    config, the experiment and the recorded (pgid, tag) of the tasks it left running."""
    config = write_config(tmp_path, TRAIN)
    exp = tmp_path / "logs" / "tiny"
    runner = subprocess.Popen([PY, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((exp / "runs").glob("*/train.csv")) or not trainers(exp):
        assert runner.poll() is None and time.monotonic() < deadline, "the sweep ended or never trained"
        time.sleep(0.1)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    left = [(s["pgid"], task_tag(exp, job_id, int(t))) for job_id, ts in tasks(exp).items() for t, s in ts.items() if s["state"] == "running"]
    assert left and all(group_alive(pgid, tag) for pgid, tag in left), "the trainer should outlive its runner"
    return config, exp, left


def test_killed_runner_then_status_cancel_and_resweep(tmp_path: Path) -> None:
    config, exp, left = sweep_then_kill_the_runner(tmp_path)

    status = hpcrl("status", str(exp), cwd=tmp_path, timeout=60)
    assert status.returncode == 0 and "running (orphaned)" in status.stdout, status.stdout + status.stderr

    cancel = hpcrl("cancel", str(exp), cwd=tmp_path, timeout=120)
    assert cancel.returncode == 0, cancel.stderr
    assert not any(group_alive(pgid, tag) for pgid, tag in left) and not trainers(exp), "cancel left the orphan running"
    status = hpcrl("status", str(exp), cwd=tmp_path, timeout=60)
    assert "orphaned" not in status.stdout and "cancelled" in status.stdout, status.stdout

    # On a loaded machine the orphan may finish training before the cancel reaches it: then the
    # re-sweep has nothing to train. Either way, never two trainers of the run at once.
    unfinished = not list((exp / "runs").glob("*/DONE"))
    watch = TrainerWatch(exp)
    resweep = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path, timeout=300)
    assert watch.done() == int(unfinished), "a second trainer ran on the run" if unfinished else "a finished run was trained again"
    assert resweep.returncode == 0, resweep.stdout + resweep.stderr
    assert len(list((exp / "runs").glob("*/DONE"))) == 1 and not trainers(exp)


def test_resweep_after_a_killed_runner_never_starts_a_second_trainer(tmp_path: Path) -> None:
    config, exp, left = sweep_then_kill_the_runner(tmp_path)
    watch = TrainerWatch(exp)
    resweep = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path, timeout=300)
    most = watch.done()
    assert resweep.returncode == 0, resweep.stdout + resweep.stderr
    assert most == 1, f"{most} trainers of one run at once"
    assert not any(group_alive(pgid, tag) for pgid, tag in left) and not trainers(exp)
    assert len(list((exp / "runs").glob("*/DONE"))) == 1
    # Nothing is left "running" for a later sweep to wait on.
    assert all(s["state"] not in ("running", "pending") for ts in tasks(exp).values() for s in ts.values())




def test_a_trainer_killed_alone_leaves_nothing_of_its_task_running(tmp_path: Path) -> None:
    """The OOM killer takes the trainer only: the processes its env started (ViZDoom's engines; here a stand-in
    simulator) are orphaned. The local runner ends them when the task ends, as a cluster ends a job's processes,
    and names them in the task's log; the task is failed, not hung. The game's queues that the trainer alone held
    go too, named in the log: nobody held them, so no listing of processes found them, and they stayed for ever."""
    (tmp_path / "simenvs.py").write_text(SIMULATOR_ENV)
    pid_file = tmp_path / "simulators.txt"
    # A /dev/shm of its own where it can: any process that ends a run removes the ViZDoom files nobody holds, and
    # another test's (the fresh suite at 555151b) took this one's first, so that this runner had nothing to name.
    shm = tmp_path / "shm"
    prefix = own_shm(shm) or []
    queue = Path(f"/dev/shm/ViZDoomMQCtr-hpcrl-test-{uuid.uuid4().hex[:12]}")  # as the runner sees it
    seen_here = shm / queue.name if prefix else queue
    config = write_config(tmp_path, {**TRAIN, "train": {"total_steps": 10_000_000}, "env": {"id": "simenvs:WithSimulator-v0", "num_envs": 1, "kwargs": {"pid_file": str(pid_file), "queue": str(queue)}}})
    exp = tmp_path / "logs" / "tiny"
    runner = subprocess.Popen([*prefix, PY, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((exp / "runs").glob("*/train.csv")) or not trainers(exp):
            assert runner.poll() is None and time.monotonic() < deadline, "the sweep ended or never trained"
            time.sleep(0.1)
        simulators = [int(line) for line in pid_file.read_text().split()]
        assert simulators and all(alive(pid) for pid in simulators)
        for pid in trainers(exp):
            os.kill(pid, signal.SIGKILL)
        out, _ = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
        for pid in [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # only what the runner failed to end, after the test has looked
        made = seen_here.exists()
        seen_here.unlink(missing_ok=True)
    left = [pid for pid in simulators if alive(pid)]
    assert not left, f"the killed trainer's simulator(s) {left} outlived its task"
    log = "".join(p.read_text() for p in (exp / "jobs" / "logs").glob("train-*"))
    assert f"left {len(simulators)} process(es) running: pid {simulators[0]} (" in log and "time.sleep(600)" in log, log[-2000:]
    assert [s["state"] for ts in tasks(exp).values() for s in ts.values()][:1] == ["failed"], tasks(exp)
    assert not made
    if prefix:  # without a /dev/shm of its own another test's run may have taken it first
        assert f"hpcrl: removed the shared memory nobody held: {queue}" in log, log[-2000:]
    assert "No such file or directory" not in log, log[-2000:]  # the job script's read of an exit status the killed trainer never wrote
