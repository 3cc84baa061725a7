"""`hpcrl status` and `hpcrl cancel` of big sweeps (issue 17).

- past SUMMARY_THRESHOLD runs the default view is one line per setting with counts per stage and
  state, the failures named and capped, the jobs and the totals (a synthetic 10,000-run experiment);
- `--runs` with `--state`/`--setting`/`--run`, `--json`, `--watch` (in place on a terminal, plain
  elsewhere, Ctrl-C is 130), and one scheduler query per status or refresh, whatever the run count;
- bad input is one line and exit 2 and cancels nothing;
- on every backend (local, the real Slurm and Grid Engine): `cancel --setting` cancels only that
  setting's tasks, in one scheduler call, status shows them cancelled, and a re-sweep retries them.
"""

from __future__ import annotations

import fcntl
import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_conformance import CONFIG, Backend, backend, sweep, wait_until  # noqa: F401 (backend: a fixture)

from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.schedulers.base import Scheduler, compress_ranges
from hpcrl.schedulers.local import LocalScheduler, lock_path, read_state, write_state
from hpcrl.status import FAILURES_SHOWN, SUMMARY_THRESHOLD, collect_status, experiment_status, print_status
from hpcrl.store import rundir
from hpcrl.store.expdir import Dependency, Job, load_runs, read_jobs, run_dir, write_experiment, write_jobs
from hpcrl.sweep.runs import expand

REASONS = ("RuntimeError: CUDA out of memory", "FileExistsError: [Errno 17] File exists: 'checkpoints'")


def state_of(i: int) -> str:
    """Run i's state in the synthetic experiment: 70% done, 3% failed, 5% running, 2% cancelled, 20% pending."""
    k = (i * 7919) % 100
    return "done" if k < 70 else "failed" if k < 73 else "running" if k < 78 else "cancelled" if k < 80 else "pending"


def synthetic(root: Path, settings: int, seeds: int, chunk: int = 1000) -> Path:
    """An experiment as a local sweep and its jobs leave it: runs.csv, run configs, jobs.json in arrays
    of `chunk` tasks, the local runner's task states, and per run the markers its state implies."""
    lrs = [round(1e-3 * (1 + k / settings), 8) for k in range(settings)]
    exp = load_experiment(CONFIG, [f"output={root}", "name=big", f"sweep.seeds={list(range(seeds))}", f"sweep.grid.train.lr={lrs}"])
    runs = expand(exp)
    write_experiment(exp, runs, {"scheduler": "local"})
    jobs, tasks = [], {}
    as_train = {"done": "done", "failed": "failed", "running": "running", "cancelled": "cancelled", "pending": "pending"}
    as_eval = {"done": "done", "failed": "done", "running": "pending", "cancelled": "cancelled", "pending": "pending"}
    for c, start in enumerate(range(0, len(runs), chunk)):
        part = [r.index for r in runs[start : start + chunk]]
        manifest = f"jobs/0-{c}.tasks"
        rundir.write_manifest(exp.dir, manifest, part)
        train, evaluate = f"train-0-{c}", f"eval-0-{c}"
        jobs += [Job("train", train, "local", f"jobs/{train}.sh", len(part), manifest), Job("eval", evaluate, "local", f"jobs/{evaluate}.sh", len(part), manifest, [Dependency(train, "each")])]
        tasks[train] = {str(t): {"state": as_train[state_of(i)], "rc": None, "requeues": 0} for t, i in enumerate(part, 1)}
        tasks[evaluate] = {str(t): {"state": as_eval[state_of(i)], "rc": None, "requeues": 0} for t, i in enumerate(part, 1)}
    jobs.append(Job("aggregate", "aggregate-0", "local", "jobs/aggregate-0.sh", 0, None, [Dependency(j.job_id, "all") for j in jobs if j.stage == "eval"]))
    tasks["aggregate-0"] = {"0": {"state": "pending", "rc": None, "requeues": 0}}
    write_jobs(exp.dir, jobs)
    write_state(exp.dir, {"runner_pid": None, "jobs": tasks})
    for run in runs:
        rd, state = run_dir(exp.dir, run.run_id), state_of(run.index)
        if state == "done":
            (rd / "DONE").write_text("step 2048\n")
            (rd / "EVAL_DONE").write_text("\n")
        elif state == "failed":
            (rd / "FAILED").write_text(REASONS[run.index % 2] + "\nTraceback (most recent call last):\n")
            (rd / "EVAL_SKIPPED").write_text("training did not finish (FAILED)\n")
        if state in ("running", "failed", "cancelled"):
            (rd / "train.csv").write_text("step,iteration\n1024,8\n")
    return exp.dir


@contextmanager
def live_runner(exp_dir: Path) -> Iterator[None]:
    """A lock held on the local runner's lock file: to status, a live runner, so pending and running
    tasks are reported as recorded (a dead runner's would be called cancelled)."""
    with lock_path(exp_dir).open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
        fcntl.flock(f, fcntl.LOCK_UN)


class Queries:
    """Scheduler queries (hpcrl's interface) and commands (sbatch, squeue, qdel, ...) made meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.queries, self.commands, self.cancels = 0, [], []
        from hpcrl.schedulers.sge import SGEScheduler
        from hpcrl.schedulers.slurm import SlurmScheduler

        for cls in (LocalScheduler, SlurmScheduler, SGEScheduler):
            query, cancel_tasks = cls.query, cls.cancel_tasks

            def counted(self_, job_ids, _query=query):
                self.queries += 1
                return _query(self_, job_ids)

            def counted_cancel(self_, tasks, _cancel=cancel_tasks):
                self.cancels.append(tasks)
                return _cancel(self_, tasks)

            monkeypatch.setattr(cls, "query", counted)
            monkeypatch.setattr(cls, "cancel_tasks", counted_cancel)
        run = Scheduler.run

        def counted_run(self_, argv, input=None, **kwargs):
            self.commands.append(argv[0])
            return run(self_, argv, input, **kwargs)

        monkeypatch.setattr(Scheduler, "run", counted_run)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """10,000 runs: 100 settings x 100 seeds, in 10 train and 10 eval arrays of 1,000, with a live runner."""
    exp = synthetic(tmp_path_factory.mktemp("big"), settings=100, seeds=100)
    with live_runner(exp):
        yield exp


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# ------------------------------------------------------------------------------ the per-setting view


@pytest.mark.slow  # the 10,000-run fixture costs 5-9 CPU seconds, charged to whichever test sets it up
def test_a_big_sweep_is_one_line_per_setting_with_counts_failures_jobs_and_totals(big: Path, capsys, monkeypatch) -> None:
    calls = Queries(monkeypatch)
    rc, out, _ = run_cli(["status", str(big)], capsys)
    lines = out.splitlines()
    assert rc == 0 and calls.queries == 1  # one query for the 21 jobs and 10,000 runs
    assert len(lines) < 130, f"{len(lines)} lines for 10,000 runs"
    # Two header lines (stages, then their states), then the 100 settings.
    assert lines[0].split() == ["train", "eval"]
    assert lines[1].split() == ["setting", "runs", "done", "running", "pending", "failed", "cancelled", "done", "pending", "cancelled", "skipped"]
    rows = [line.split() for line in lines[2:102]]
    assert [r[0] for r in rows] == [f"train.lr={round(1e-3 * (1 + k / 100), 8):g}" for k in range(100)]
    assert all(r[1:] == ["100", "70", "5", "20", "3", "2", "70", "25", "2", "3"] for r in rows), rows[:3]
    # The failures, named with their reasons, capped.
    assert lines[102] == "failed: 300 runs"
    named = lines[103 : 103 + FAILURES_SHOWN]
    runs = {r.run_id: r for r in load_runs(big)}
    for line in named:
        run_id, label, stage, failed, *reason = line.split()
        assert runs[run_id].setting_label == label and (stage, failed) == ("train", "failed:") and " ".join(reason) in REASONS and state_of(runs[run_id].index) == "failed"
    assert lines[103 + FAILURES_SHOWN] == f"  ... and {300 - FAILURES_SHOWN} more: hpcrl status {big} --runs --state failed"
    assert lines[-2] == "jobs: 21 local jobs (10 train, 10 eval, 1 aggregate; 1 submission; ids train-0-0 .. aggregate-0)"
    assert lines[-1] == "10000 runs: 7000 done, 500 running, 2000 pending, 300 failed, 200 cancelled; 100 settings; aggregate: pending"


@pytest.mark.slow  # the 10,000-run fixture costs 5-9 CPU seconds, charged to whichever test sets it up
def test_runs_filters_and_json_of_a_big_sweep(big: Path, capsys, monkeypatch) -> None:
    calls = Queries(monkeypatch)
    rc, out, _ = run_cli(["status", str(big), "--runs", "--state", "failed"], capsys)
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 1 + 300 + 2 and lines[0].split()[:3] == ["#", "run", "setting"]
    assert all(line.split()[4] == "failed" and line.split()[6] == "skipped" for line in lines[1:301])
    assert lines[-1].startswith("300 of 10000 runs selected: 300 failed; 100 settings")

    # A selection alone picks the per-run view; an exact label is that setting, a part of one every setting containing it.
    rc, out, _ = run_cli(["status", str(big), "--setting", "train.lr=0.0019"], capsys)
    assert rc == 0 and len(out.splitlines()) == 1 + 100 + 2 and "100 of 10000 runs selected" in out
    rc, out, _ = run_cli(["status", str(big), "--setting", "lr=0.0019", "--summary"], capsys)
    assert rc == 0 and len(out.splitlines()) == 2 + 10 + 1 + FAILURES_SHOWN + 1 + 2  # 0.0019, 0.00191 .. 0.00199; 10 of their 30 failures
    rc, out, _ = run_cli(["status", str(big), "--state", "running", "--state", "pending", "--setting", "train.lr=0.001"], capsys)
    assert rc == 0 and "25 of 10000 runs selected: 5 running, 20 pending" in out

    rc, out, _ = run_cli(["status", str(big), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["total_runs"] == 10000 and doc["aggregate"] == "pending" and doc["scheduler_problem"] is None
    assert doc["counts"]["runs"] == 10000
    assert doc["counts"]["state"] == {"done": 7000, "running": 500, "pending": 2000, "failed": 300, "cancelled": 200}
    assert doc["counts"]["train"] == {"done": 7000, "running": 500, "pending": 2000, "failed": 300, "cancelled": 200}
    assert doc["counts"]["eval"] == {"done": 7000, "pending": 2500, "cancelled": 200, "skipped": 300}
    assert len(doc["settings"]) == 100 and doc["settings"][0]["runs"] == 100 and len(doc["settings"][0]["failed"]) == 3
    assert len(doc["jobs"]) == 21 and len(doc["runs"]) == 10000
    first = doc["runs"][0]
    assert set(first) == {"index", "run_id", "setting", "seed", "state", "train", "eval", "step", "total_steps", "note", "distributed"}
    assert (first["state"], first["step"], first["total_steps"]) == ("done", 2048, 2048)
    assert calls.queries == 5  # one per status, whatever the view


def test_a_small_sweep_keeps_one_line_per_run(tmp_path: Path, capsys) -> None:
    exp = synthetic(tmp_path, settings=5, seeds=10)
    assert SUMMARY_THRESHOLD == 50
    with live_runner(exp):
        rc, out, _ = run_cli(["status", str(exp)], capsys)
        assert rc == 0 and len(out.splitlines()) == 1 + 50 + 2
        rc, out, _ = run_cli(["status", str(exp), "--summary"], capsys)
        assert rc == 0 and len(out.splitlines()) == 2 + 5 + 1 + 2 + 2  # 2 failed runs among 50


# ---------------------------------------------------------------------------------------------- watch


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def finish_everything(exp: Path) -> None:
    state = read_state(exp)
    for tasks in state["jobs"].values():
        for s in tasks.values():
            if s["state"] in ("pending", "running"):
                s["state"] = "done"
    write_state(exp, state)
    for run in load_runs(exp):
        rd = run_dir(exp, run.run_id)
        if not (rd / "FAILED").exists() and state_of(run.index) != "cancelled":
            (rd / "DONE").write_text("step 2048\n")
            (rd / "EVAL_DONE").write_text("\n")
    (exp / "results").mkdir(exist_ok=True)
    (exp / "results" / "summary.csv").write_text("setting\n")


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_watch_refreshes_until_nothing_is_pending_or_running(tmp_path: Path, monkeypatch, tty: bool) -> None:
    exp = synthetic(tmp_path, settings=6, seeds=10)
    calls = Queries(monkeypatch)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            finish_everything(exp)

    out = Terminal() if tty else io.StringIO()
    with live_runner(exp):
        assert print_status(exp, out, watch="2", sleep=sleep) == 0
    text = out.getvalue()
    assert slept == [2.0, 2.0, 2.0] and calls.queries == 4  # one query per refresh
    failed, cancelled = (sum(state_of(i) == s for i in range(60)) for s in ("failed", "cancelled"))
    assert "nothing pending or running" in text and f"60 runs: {60 - failed - cancelled} done, {failed} failed, {cancelled} cancelled" in text
    if tty:  # in place: cursor home, each line cleared to its end, the rest of the screen cleared
        assert text.startswith("\033[2J\033[H") and text.count("\033[H") == 4 and text.count("\033[J") == 4
    else:  # plain frames, printed when they changed: the first three are the same
        assert "\033" not in text and text.count("hpcrl status ") == 2


def test_watch_ends_on_ctrl_c_with_130(tmp_path: Path, monkeypatch, capsys) -> None:
    exp = synthetic(tmp_path, settings=1, seeds=3)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupted)
    with live_runner(exp):
        rc, out, err = run_cli(["status", str(exp), "--watch"], capsys)
    assert rc == 130 and "every 5 s, Ctrl-C to stop" in out and err == ""


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "argv, message",
    [
        (["status", "{exp}", "--watch", "0"], "--watch 0: expected a number of seconds >= 1"),
        (["status", "{exp}", "--watch", "-1"], "--watch -1: expected a number of seconds >= 1"),
        (["status", "{exp}", "--watch=nan"], "--watch nan: expected a number of seconds >= 1"),
        (["status", "{exp}", "--watch", "inf"], "--watch inf: expected"),
        (["status", "{exp}", "--watch", "--json"], "--watch and --json"),
        (["status", "{exp}", "--state", "bogus"], "--state bogus: expected one of pending, running"),
        (["status", "{exp}", "--setting", "train.lr\n=0.001"], "'train.lr\\n=0.001': a --state, --setting or --run value is one printable line"),
        (["status", "{exp}", "--setting", "nope"], "--setting nope: no setting of"),
        (["cancel", "{exp}", "--state", "done"], "--state done: only pending, running, orphaned runs can be cancelled"),
        (["cancel", "{exp}", "--state", "bogus"], "--state bogus: expected one of pending, running, orphaned"),
        (["cancel", "{exp}", "--setting", "nope"], "--setting nope: no setting of"),
        (["cancel", "{exp}", "--setting", "a\nb"], "'a\\nb': a --state, --setting or --run value"),
        (["cancel", "{exp}", "--run", "0123456789-s0"], "--run 0123456789-s0: no such run"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_cancels_nothing(tmp_path: Path, capsys, monkeypatch, argv: list[str], message: str) -> None:
    exp = synthetic(tmp_path, settings=2, seeds=3)
    before = (exp / "jobs" / "local-state.json").read_bytes()
    calls = Queries(monkeypatch)
    with live_runner(exp):
        rc, out, err = run_cli([a.replace("{exp}", str(exp)) for a in argv], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert calls.queries == 0 and calls.cancels == [] and calls.commands == []
    assert (exp / "jobs" / "local-state.json").read_bytes() == before and not (exp / "jobs" / "cancelled").exists()


def test_task_lists_and_what_qdel_says_of_tasks_that_ended() -> None:
    from hpcrl.schedulers.sge import qdel_refusals

    assert compress_ranges([7, 1, 2, 3, 5, 8, 2]) == ["1-3", "5", "7-8"] and compress_ranges([]) == []
    # Grid Engine 8.1's own words for a task range whose tasks already ended: not a refusal.
    assert qdel_refusals('job "25" task id range "1-2:1" comprises no tasks\nroot has deleted job-array task 25.4') == []
    assert qdel_refusals("denied: you are not the owner of job 25") != []


# ------------------------------------------------------------------------- cancel a subset, every backend


@pytest.mark.e2e
def test_cancel_of_a_setting_cancels_its_tasks_in_one_call_and_a_resweep_retries_them(backend: Backend, tmp_path: Path, monkeypatch, capsys) -> None:  # noqa: F811 (the fixture)
    # Two settings x one seed, one task at a time: while run 0 trains, run 1 (the other setting) waits.
    overrides = ("sweep.grid.train.lr=[0.001, 0.002]", "sweep.seeds=[0]", "resources.max_concurrent=1")
    exp_dir, _ = sweep(tmp_path, backend, *overrides)
    first, second = load_runs(exp_dir)
    wait_until("run 0 to train", lambda: experiment_status(exp_dir)[0][0].train == "running", 120)
    calls = Queries(monkeypatch)
    rc, out, err = run_cli(["cancel", str(exp_dir), "--setting", second.setting_label], capsys)
    assert rc == 0 and f"cancelled 2 {backend.name} tasks of 1 runs" in out, out + err
    # One query, then one cancel call for the two tasks (train and eval) of that run.
    assert calls.queries == 1 and len(calls.cancels) == 1 and sum(map(len, calls.cancels[0].values())) == 2
    assert [c for c in calls.commands if c in ("scancel", "qdel")] == ({"local": [], "slurm": ["scancel"], "sge": ["qdel"]}[backend.name])

    # The other run goes on and finishes, then the aggregate; `--watch` follows it with one query per refresh.
    calls = Queries(monkeypatch)
    rc, out, _ = run_cli(["status", str(exp_dir), "--watch", "1"], capsys)
    frames = out.count(f"hpcrl status {exp_dir}: ")
    assert rc == 0 and "nothing pending or running" in out and calls.queries >= frames >= 1
    status = collect_status(exp_dir)
    assert [(r.run_id, r.train, r.eval) for r in status.rows] == [(first.run_id, "done", "done"), (second.run_id, "cancelled", "cancelled")], status
    assert status.aggregate == "done"

    # A re-sweep retries the cancelled run, and only it.
    since = time.time()
    _, printed = sweep(tmp_path, backend, *overrides)
    assert "submitted 1 of 2 runs" in printed, printed
    retry = [j for j in read_jobs(exp_dir) if j.attempt == 1]
    assert rundir.read_manifest(exp_dir, retry[0].manifest) == [second.index]
    summary = exp_dir / "results" / "summary.csv"
    wait_until("the retry to finish", lambda: summary.stat().st_mtime >= since and all(r.state == "done" for r in collect_status(exp_dir).rows), 300)


def test_status_queries_the_scheduler_once_whatever_the_runs(backend: Backend, tmp_path: Path, monkeypatch) -> None:  # noqa: F811 (the fixture)
    # 60 runs on hold would need holds on every backend; instead a sweep of 60 runs is cancelled at once and
    # status asked of it: the calls do not grow with the runs.
    exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0, 1, 2]", "sweep.grid.train.lr=[0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.011, 0.012, 0.013, 0.014, 0.015, 0.016, 0.017, 0.018, 0.019, 0.02]", "resources.max_concurrent=1")
    try:
        calls = Queries(monkeypatch)
        out = io.StringIO()
        print_status(exp_dir, out)
        assert calls.queries == 1 and len(calls.commands) <= 2, calls.commands  # squeue (+ sacct for what it forgot), qstat, or none (local)
        assert out.getvalue().splitlines()[1].split()[:2] == ["setting", "runs"]  # 60 runs: the per-setting view
        calls = Queries(monkeypatch)
        rc = main(["cancel", str(exp_dir), "--state", "pending"])
        assert rc == 0 and calls.queries == 1 and len(calls.cancels) == 1
        assert len([c for c in calls.commands if c in ("scancel", "qdel")]) == (0 if backend.name == "local" else 1)
    finally:
        main(["cancel", str(exp_dir)])
    rows = experiment_status(exp_dir)[0]
    assert sum(r.train == "cancelled" for r in rows) >= 50, [r.train for r in rows]


@pytest.mark.e2e
def test_cancel_of_a_running_run_stops_it_for_good_and_the_next_one_starts(backend: Backend, tmp_path: Path, capsys) -> None:  # noqa: F811 (the fixture)
    exp_dir, _ = sweep(tmp_path, backend, "sweep.seeds=[0, 1]", "train.total_steps=10000000", "resources.max_concurrent=1")
    first, second = load_runs(exp_dir)
    try:
        wait_until("run 0 to checkpoint", lambda: any(run_dir(exp_dir, first.run_id).glob("checkpoints/*.pt")), 180)
        rc, out, err = run_cli(["cancel", str(exp_dir), "--run", first.run_id], capsys)
        assert rc == 0 and f"cancelled 2 {backend.name} tasks of 1 runs" in out, out + err  # its train task (running) and eval task
        # Its trainer checkpoints on SIGTERM and asks for a requeue (exit 99): a cancelled task is not requeued.
        wait_until("run 1 to train in its place", lambda: collect_status(exp_dir).rows[1].train == "running", 120)
        time.sleep(5)
        rows = collect_status(exp_dir).rows
        assert (rows[0].train, rows[0].eval, rows[1].train) == ("cancelled", "cancelled", "running"), rows
        assert not (run_dir(exp_dir, first.run_id) / "DONE").exists()
    finally:
        main(["cancel", str(exp_dir)])
    wait_until("every task to leave", lambda: all(r.train not in ("pending", "running") for r in collect_status(exp_dir).rows), 90)
