"""One behaviour, every backend: the same small CartPole sweep on local processes, Slurm and Grid Engine.

What each test pins down (issue 3):
- train -> eval -> aggregate run in that order (checked on the scheduler's own start/end records),
  arrays larger than the cluster allows are split into chunks, and `collect` works;
- a failing train task is reported, and `hpcrl sweep` again resubmits that run only;
- cancel stops every task and nothing comes back afterwards (no requeue on the way out);
- a train task that gets the scheduler's warning signal checkpoints, is requeued, resumes from
  that checkpoint and finishes, and its eval still waits for it.

Slurm and Grid Engine are the real daemons (tests/conftest.py starts them); nothing is faked.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from factories import simulators, trainers

from hpcrl.config.load import load_experiment
from hpcrl.results.collect import collect
from hpcrl.schedulers import get_scheduler
from hpcrl.schedulers.base import PENDING, RUNNING
from hpcrl.status import cancel_experiment, experiment_status, print_status
from hpcrl.store.expdir import Dependency, Job, load_runs, read_jobs, run_dir
from hpcrl.store.rundir import read_manifest
from hpcrl.submit.pipeline import submit_experiment
from hpcrl.sweep.runs import expand

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).resolve().parents[1] / "data" / "conformance.yaml"
Times = dict[tuple[str, int], tuple[float, float]]
"""(job id, array task) -> (start, end) in seconds since the epoch; task 0 for a plain job."""


class Backend:
    """What the tests need from a scheduler beyond hpcrl's interface: its records and its warning signal."""

    name = ""

    def timeline(self, exp_dir: Path, jobs: list[Job]) -> Times:
        raise NotImplementedError

    def warn(self, exp_dir: Path, job: Job, task: int) -> None:
        """Send a running train task the warning a time limit or a preemption would bring."""
        raise NotImplementedError


class Local(Backend):
    name = "local"

    def timeline(self, exp_dir: Path, jobs: list[Job]) -> Times:
        state = json.loads((exp_dir / "jobs" / "local-state.json").read_text())["jobs"]
        return {(job_id, int(t)): (s["started"], s["ended"]) for job_id, tasks in state.items() for t, s in tasks.items()}

    def warn(self, exp_dir: Path, job: Job, task: int) -> None:
        # The local executor has no time limits; the task's job shell gets the signal a cluster would send it.
        state = json.loads((exp_dir / "jobs" / "local-state.json").read_text())["jobs"]
        os.kill(state[job.job_id][str(task)]["pid"], signal.SIGUSR1)


class Slurm(Backend):
    name = "slurm"

    def timeline(self, exp_dir: Path, jobs: list[Job]) -> Times:
        # slurmctld keeps finished jobs for MinJobAge (an hour on the test cluster) with their times.
        ids = ",".join(j.job_id for j in jobs)
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i|%S|%e"], capture_output=True, text=True, check=True).stdout
        times: Times = {}
        for line in out.split():
            job, start, end = line.split("|")
            job_id, _, task = job.partition("_")
            if start != "N/A" and end != "N/A":
                times[(job_id, int(task or 0))] = (datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp())
        return times

    def warn(self, exp_dir: Path, job: Job, task: int) -> None:
        # What --signal=B:USR1@N does before the time limit, sent now: USR1 to the batch shell only.
        subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job.job_id}_{task}"], check=True)


class SGE(Backend):
    name = "sge"

    def timeline(self, exp_dir: Path, jobs: list[Job]) -> Times:
        times: Times = {}
        for job in jobs:
            expected = job.size or 1
            # qacct can miss a job for a second or two after it ends: ask again until every task is there.
            for _ in range(40):
                found = self._qacct(job.job_id)
                if len(found) == expected:
                    break
                time.sleep(0.5)
            times.update(found)
        return times

    @staticmethod
    def _qacct(job_id: str) -> Times:
        proc = subprocess.run(["qacct", "-j", job_id], capture_output=True, text=True)
        found: Times = {}
        for block in proc.stdout.split("=" * 62)[1:]:
            fields = dict(line.split(None, 1) for line in block.strip().splitlines() if len(line.split(None, 1)) == 2)
            task = 0 if fields["taskid"].strip() == "undefined" else int(fields["taskid"])
            start, end = (time.mktime(time.strptime(fields[k].strip(), "%a %b %d %H:%M:%S %Y")) for k in ("start_time", "end_time"))
            if (job_id, task) not in found or end > found[(job_id, task)][1]:  # a rescheduled task: its last run
                found[(job_id, task)] = (start, end)
        return found

    def warn(self, exp_dir: Path, job: Job, task: int) -> None:
        # Suspending a job submitted with -notify makes sge_execd send it SIGUSR1 first: Grid Engine's
        # preemption warning. (Its time-limit warning, s_rt, is tested in test_sge.py.)
        subprocess.run(["qmod", "-sj", f"{job.job_id}.{task}"], check=True, capture_output=True)


BACKENDS = {"local": Local, "slurm": Slurm, "sge": SGE}


@pytest.fixture(params=[
    pytest.param("local"),
    pytest.param("slurm", marks=pytest.mark.slurm),
    pytest.param("sge", marks=pytest.mark.sge),
])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param != "local":
        request.getfixturevalue(f"{request.param}_cluster")
    return BACKENDS[request.param]()


# ------------------------------------------------------------------------------------------ helpers


def sweep(tmp_path: Path, backend: Backend, *overrides: str) -> tuple[Path, str]:
    """`hpcrl sweep` of the conformance config into tmp_path; returns the experiment dir and what it printed."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", *overrides])
    out = io.StringIO()
    assert submit_experiment(exp, backend.name, detach=True, out=out) == 0, out.getvalue()
    return exp.dir, out.getvalue()


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def active_tasks(exp_dir: Path, backend: Backend) -> list[tuple[str, int, str]]:
    """Tasks of the experiment the scheduler still has pending or running."""
    states = get_scheduler(backend.name, exp_dir).query([j.job_id for j in read_jobs(exp_dir)])
    return [(job_id, task, s) for job_id, tasks in states.items() for task, s in tasks.items() if s in (PENDING, RUNNING)]


def wait_finished(exp_dir: Path, backend: Backend, since: float, timeout: float = 300) -> None:
    """Until the newest aggregate has written its summary and no task is pending or running."""
    summary = exp_dir / "results" / "summary.csv"
    wait_until(
        f"{exp_dir.name} to finish on {backend.name}",
        lambda: summary.exists() and summary.stat().st_mtime >= since and not active_tasks(exp_dir, backend),
        timeout,
    )


def assert_dag_order(exp_dir: Path, jobs: list[Job], times: Times) -> list[str]:
    """Eval task i started after train task i ended; each aggregate after every eval task of its attempt."""
    train_end: dict[tuple[int, int], float] = {}
    eval_end: dict[int, list[float]] = {}
    lines = []
    origin = min(start for start, _ in times.values())
    for job in sorted(jobs, key=lambda j: ("train", "eval", "aggregate").index(j.stage)):
        runs = (read_manifest(exp_dir, job.manifest) if job.manifest else []) or [-1]
        for task, run in enumerate(runs, start=1 if job.manifest else 0):
            start, end = times[(job.job_id, task)]
            lines.append(f"{job.stage:9} attempt {job.attempt} run {run:2}: start {start - origin:7.2f} s  end {end - origin:7.2f} s")
            if job.stage == "train":
                train_end[(job.attempt, run)] = end
            elif job.stage == "eval":
                assert start >= train_end[(job.attempt, run)], f"eval of run {run} started before its train task ended"
                eval_end.setdefault(job.attempt, []).append(end)
            else:
                assert start >= max(eval_end[job.attempt]), "the aggregate started before every eval task ended"
    return lines


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def status_text(exp_dir: Path) -> str:
    out = io.StringIO()
    print_status(exp_dir, out=out)
    return out.getvalue()


# ------------------------------------------------------------------------------------------ tests


# Two learning rates x two seeds: the summary has one row per setting (the embedded default's end to end,
# once tests/schedulers/test_local_pipeline.py's own local sweep, folded in here).
GRID = ("sweep.seeds=[0, 1]", "sweep.grid={train.lr: [1.0e-3, 3.0e-4]}")


def test_sweep_runs_train_eval_aggregate_in_order_and_collects(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the cluster took arrays of 3 at most: 4 runs become two chunks, [0, 1, 2] and [3].
    monkeypatch.setattr(type(get_scheduler(backend.name, tmp_path)), "max_array_size", lambda self: 3)
    since = time.time()
    exp_dir, _ = sweep(tmp_path, backend, *GRID)
    jobs = read_jobs(exp_dir)
    assert [(j.stage, j.size) for j in jobs] == [("train", 3), ("eval", 3), ("train", 1), ("eval", 1), ("aggregate", 0)]
    train0, eval0, train1, eval1, aggregate = jobs
    assert [read_manifest(exp_dir, j.manifest) for j in (train0, train1)] == [[0, 1, 2], [3]]
    assert eval0.after == [Dependency(train0.job_id, "each")] and eval1.after == [Dependency(train1.job_id, "each")]
    assert aggregate.after == [Dependency(eval0.job_id, "all"), Dependency(eval1.job_id, "all")]

    wait_finished(exp_dir, backend, since)
    order = assert_dag_order(exp_dir, jobs, backend.timeline(exp_dir, jobs))
    print(f"\n{backend.name}: DAG timeline from the scheduler's records\n" + "\n".join(order))
    runs = load_runs(exp_dir)
    assert len(runs) == 4 and {run.config.train.lr for run in runs} == {1e-3, 3e-4}
    for run in runs:
        rd = run_dir(exp_dir, run.run_id)
        # An eval task that started before its train task had finished would have recorded a skip.
        assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists(), (rd, sorted(p.name for p in rd.iterdir()))
        assert len(csv_rows(rd / "eval.csv")) == run.config.eval.episodes
    summary = csv_rows(exp_dir / "results" / "summary.csv")
    assert sorted((s["setting"], s["n"]) for s in summary) == [("train.lr=0.0003", "2"), ("train.lr=0.001", "2")]
    assert (exp_dir / "results" / "plots" / "curves.png").stat().st_size > 10_000
    provenance = (exp_dir / "experiment.yaml").read_text()
    assert "hpcrl_version" in provenance and "submitted_at" in provenance
    rows, aggregate_state, problem = experiment_status(exp_dir)
    assert [(r.train, r.eval) for r in rows] == [("done", "done")] * 4 and aggregate_state == "done" and problem is None
    assert collect(exp_dir, out=io.StringIO()) == 0
    _, printed = sweep(tmp_path, backend, *GRID)
    assert "nothing submitted" in printed and len(read_jobs(exp_dir)) == len(jobs), printed


def test_failing_task_is_reported_and_only_it_is_retried(backend: Backend, tmp_path: Path) -> None:
    overrides = ("sweep.seeds=[0, 1]",)
    good, bad = expand(load_experiment(CONFIG, [f"output={tmp_path}", *overrides]))
    exp_dir = tmp_path / "conformance"
    # A file where run 1's checkpoint directory should be: its train task fails at its first checkpoint,
    # inside the job, as a full or read-only disk would make it fail.
    blocker = run_dir(exp_dir, bad.run_id) / "checkpoints"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory\n")
    since = time.time()
    sweep(tmp_path, backend, *overrides)
    wait_finished(exp_dir, backend, since)
    rows, _, _ = experiment_status(exp_dir)
    assert (rows[0].train, rows[0].eval) == ("done", "done")
    # Its eval is skipped (SGE, local: the eval task reads the markers) or cancelled (Slurm: --kill-on-invalid-dep).
    assert rows[1].train == "failed" and rows[1].note.startswith("train failed: FileExistsError") and rows[1].eval in ("skipped", "cancelled")
    shown = status_text(exp_dir)
    assert "failed" in shown and "FileExistsError" in shown, shown
    print(f"\n{backend.name}: status after the failure\n{shown}")
    kept = (run_dir(exp_dir, good.run_id) / "train.csv").read_bytes()

    blocker.unlink()
    since = time.time()
    _, printed = sweep(tmp_path, backend, *overrides)
    assert "submitted 1 of 2 runs" in printed, printed
    retry = [j for j in read_jobs(exp_dir) if j.attempt == 1]
    assert [j.stage for j in retry] == ["train", "eval", "aggregate"]
    assert read_manifest(exp_dir, retry[0].manifest) == [bad.index] and retry[0].size == 1
    wait_finished(exp_dir, backend, since)
    rows, aggregate_state, _ = experiment_status(exp_dir)
    assert [(r.train, r.eval) for r in rows] == [("done", "done")] * 2 and aggregate_state == "done"
    assert not (run_dir(exp_dir, bad.run_id) / "FAILED").exists()
    assert (run_dir(exp_dir, good.run_id) / "train.csv").read_bytes() == kept, "the run that had succeeded was trained again"
    assert [s["n"] for s in csv_rows(exp_dir / "results" / "summary.csv")] == ["2"]


def test_a_config_s_own_module_imports_in_every_job(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`env.id: myenvs:OwnCart-v0`, with the module's directory on the sweep's PYTHONPATH as a relative entry
    (`PYTHONPATH=own`): every job imports it. Grid Engine passed no environment to its jobs (No module named
    ...), and a relative entry named each job's working directory."""
    own = tmp_path / "own"
    own.mkdir()
    module = f"myenvs_{backend.name}"
    (own / f"{module}.py").write_text('import gymnasium\ngymnasium.register("OwnCart-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "own")
    since = time.time()
    exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0]", f"env.id={module}:OwnCart-v0")
    wait_finished(exp_dir, backend, since)
    rows, aggregate_state, _ = experiment_status(exp_dir)
    assert [(r.train, r.eval) for r in rows] == [("done", "done")] and aggregate_state == "done", status_text(exp_dir)


def process_table(needle: str) -> dict[int, str]:
    """Pid -> command line (words joined by spaces) of every live process whose command line contains `needle`."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if needle in text:
            found[int(cmdline.parent.name)] = text
    return found


def processes_of(exp_dir: Path) -> list[str]:
    """Command lines of live processes that work on this experiment (job shells, trainers)."""
    return list(process_table(str(exp_dir)).values())


def test_cancel_stops_everything(backend: Backend, tmp_path: Path) -> None:
    exp_dir, _ = sweep(tmp_path, backend, "train.total_steps=10000000")
    wait_until("a train task to checkpoint", lambda: any(exp_dir.glob("runs/*/checkpoints/*.pt")), 180)
    assert active_tasks(exp_dir, backend)
    cancel_experiment(exp_dir, out=io.StringIO())
    wait_until("every task to leave the queue", lambda: not active_tasks(exp_dir, backend), 60)
    wait_until("every job process to exit", lambda: not processes_of(exp_dir), 60)
    # The trainers checkpointed on the way out (exit 99); a task requeued by that would be back by now.
    time.sleep(8)
    assert not active_tasks(exp_dir, backend) and not processes_of(exp_dir)
    rows, aggregate_state, _ = experiment_status(exp_dir)
    assert {(r.train, r.eval) for r in rows} == {("cancelled", "cancelled")} and aggregate_state == "cancelled", status_text(exp_dir)
    assert not list(exp_dir.glob("runs/*/DONE"))


def test_requeued_train_task_resumes_from_its_checkpoint(backend: Backend, tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0]", "train.total_steps=20480")
    train = read_jobs(exp_dir)[0]
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("the first checkpoint", lambda: any((rd / "checkpoints").glob("*.pt")), 180)
    backend.warn(exp_dir, train, 1)
    wait_finished(exp_dir, backend, since)

    log = "".join(p.read_text() for p in sorted((exp_dir / "jobs" / "logs").glob("train-*")))
    signalled = re.search(r"signal \d+ at step (\d+): checkpointed", log)
    resumed = re.search(r"resumed from step (\d+)", log)
    finished = re.search(r"done at step (\d+)", log)
    assert signalled and resumed and finished, log
    interval = run.config.train.checkpoint_every * run.config.train.num_steps * run.config.env.num_envs
    lost = int(signalled.group(1)) - int(resumed.group(1))
    # The warned trainer checkpoints at the step it was signalled at: a requeue that resumed from an
    # older checkpoint (losing up to an interval) would be a trainer that requeued without saving.
    assert lost == 0 and 0 < int(resumed.group(1)) < run.config.train.total_steps
    steps = [int(r["step"]) for r in csv_rows(rd / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == int(finished.group(1)) == run.config.train.total_steps  # no step twice
    assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists()
    jobs = read_jobs(exp_dir)
    order = assert_dag_order(exp_dir, jobs, backend.timeline(exp_dir, jobs))
    print(
        f"\n{backend.name}: warned at step {signalled.group(1)}, resumed from step {resumed.group(1)} "
        f"({lost} steps lost; checkpoint interval {interval}), done at step {steps[-1]}\n" + "\n".join(order)
    )


def test_a_trainer_killed_alone_leaves_nothing_of_its_job_running(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The OOM killer takes the trainer only, and the processes its env started (ViZDoom's engines; here a stand-in
    simulator) are orphaned. A cluster ends a job's processes when the job ends, but only those it tracks: Slurm's
    proctrack/linuxproc and /pgid lose a process reparented to init, or in a group of its own (an env worker's), and no
    scheduler removes what they held in the node's /dev/shm (a ViZDoom engine's screen, 10.6 MB at 160x120). The job
    script ends them itself when its trainer left no exit status, names them in the job log, removes the file the
    simulator held and the game's queue file the trainer alone held; the task is failed, not hung."""
    with simulators(tmp_path, monkeypatch, f"simenvs_{backend.name}") as sims:
        exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0]", "train.total_steps=10000000", "env.num_envs=1", *sims.overrides)
        wait_until("a trainer with its simulator and files", lambda: bool(trainers(exp_dir)) and bool(sims.pids()) and sims.held.exists(), 180)
        for pid in trainers(exp_dir):
            os.kill(pid, signal.SIGKILL)
        wait_until("every task to leave the queue", lambda: not active_tasks(exp_dir, backend), 120)
        alive, left, simulator = sims.alive(), sims.left(), sims.pids()[0]
    log = "".join(p.read_text() for p in (exp_dir / "jobs" / "logs").glob("train-*"))
    assert not alive, f"the killed trainer's simulator(s) {alive} outlived its job:\n{log[-2000:]}"
    assert not left, f"left in /dev/shm: {left}\n{log[-2000:]}"
    assert f"left 1 process(es) running: pid {simulator} (" in log and "time.sleep(600)" in log, log[-2000:]
    assert f"removed the shared memory they left: {sims.held}" in log, log[-2000:]
    assert not list((exp_dir / "jobs" / "logs").glob(".exit-*")), "an exit status file left in the logs"
    rows, _, _ = experiment_status(exp_dir)
    assert rows[0].train == "failed", status_text(exp_dir)
