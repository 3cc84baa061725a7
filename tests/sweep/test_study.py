"""Optuna studies (`sweep.search.method: optuna`, issue 15): workers as array tasks, on every backend.

What a user relies on:
- the study has exactly `n_trials` trials, each asked once and told once, whatever the number of
  workers sharing its journal file; every trial is a run (run directory, runs.csv row) that
  `status` and `collect` show, and `collect` adds the best trial, importances and Optuna's plots;
- the pruner stops poor trials while they train, judged at the same percent of every budget;
- a worker warned by the scheduler (preemption, time limit) checkpoints, is requeued, and resumes
  the trial it held from that checkpoint: no trial lost, none counted twice; a worker killed outright
  leaves its trial to the next sweep's worker of the same task id;
- the bundled config, 12 trials with 2 workers, finds a policy whose final evaluation is >= 475 (local).

Local processes, real Slurm and real Grid Engine, through test_conformance's backends.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from test_conformance import BACKENDS, CONFIG, Backend, Local, backend, csv_rows, processes_of, status_text, wait_finished, wait_until  # noqa: F401 (backend: a fixture)

from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.results.collect import collect
from hpcrl.schedulers import get_scheduler
from hpcrl.stages import search_worker
from hpcrl.status import experiment_status
from hpcrl.store import expdir, rundir
from hpcrl.store.expdir import current_rows, load_experiment_config, read_jobs, read_runs_csv, run_dir
from hpcrl.submit.pipeline import submit_experiment
from hpcrl.sweep import study
from hpcrl.sweep.study_worker import Reporter, Worker

optuna = pytest.importorskip("optuna", reason="Optuna studies need the optional extra: pip install 'hpcrl[optuna]'")

REPO = Path(__file__).resolve().parents[2]
SPACE = "{train.lr: {type: loguniform, low: 1.0e-5, high: 1.0e-2}, train.ent_coef: {type: uniform, low: 0.0, high: 0.01}}"


def study_sweep(tmp_path: Path, scheduler: str, *overrides: str, config: Path = CONFIG) -> tuple[Path, str]:
    exp = load_experiment(config, [f"output={tmp_path}", "sweep.seeds=[0]", *overrides])
    out = io.StringIO()
    assert submit_experiment(exp, scheduler, detach=True, out=out) == 0, out.getvalue()
    return exp.dir, out.getvalue()


def search(n_trials: int, **extra: object) -> str:
    more = "".join(f", {k}: {v}" for k, v in extra.items())
    return f"sweep.search={{method: optuna, n_trials: {n_trials}, startup_trials: 2, space: {SPACE}{more}}}"


def trials(exp_dir: Path) -> list[optuna.trial.FrozenTrial]:
    exp = load_experiment_config(exp_dir)[0]
    return sorted(study.open_study(exp, exp_dir).get_trials(deepcopy=False), key=lambda t: t.number)


def assert_every_trial_once(exp_dir: Path, n_trials: int) -> list[optuna.trial.FrozenTrial]:
    """Trial numbers 0..n-1 each once, all finished; one run per trial, each done and evaluated."""
    found = trials(exp_dir)
    assert [t.number for t in found] == list(range(n_trials))
    states = optuna.trial.TrialState
    assert all(t.state in (states.COMPLETE, states.PRUNED) for t in found), [(t.number, t.state) for t in found]
    rows = current_rows(exp_dir)
    assert sorted(int(r["trial"]) for r in rows) == list(range(n_trials))
    assert sorted(r["run_id"] for r in rows) == sorted(t.user_attrs["run_id"] for t in found)
    for row in rows:
        rd = run_dir(exp_dir, row["run_id"])
        assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists(), status_text(exp_dir)
    assert not study.held_trials(exp_dir), "a worker still holds a finished trial"
    return found


def worker_log(exp_dir: Path) -> str:
    """Every study worker's log, in task order (read while they write: a line cut mid-character reads as U+FFFD)."""
    return "".join(p.read_text(errors="replace") for p in sorted((exp_dir / "jobs" / "logs").glob("study-*")))


def tear_last_tell(exp_dir: Path) -> bytes:
    """Cut optuna/journal.log in the middle of its last tell (a trial's end), as a node that dies
    mid-append leaves it; the bytes of the torn record that stay in the file."""
    journal = exp_dir / study.STUDY_DIR / study.JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    tell = optuna.storages.journal._storage.JournalOperation.SET_TRIAL_STATE_VALUES
    last = max(i for i, line in enumerate(lines) if json.loads(line)["op_code"] == tell)
    start = sum(map(len, lines[:last]))
    os.truncate(journal, start + len(lines[last]) // 2)
    return lines[last][: len(lines[last]) // 2]


def worker_pid(exp_dir: Path, task: int) -> int:
    """The process of the study worker with this task id (not its job shell)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "search-worker" in words and str(exp_dir) in words and words[-3:-1] == ["--task", str(task)] and "python" in words[0]:
            return int(cmdline.parent.name)
    raise AssertionError(f"no worker process with task {task}: {processes_of(exp_dir)}")


# ------------------------------------------------------------------------------------ the pruner's view


def test_reporter_reports_percent_of_budget_and_prunes_a_poor_trial() -> None:
    """A real in-memory study: trial 0 does well; trial 1 is pruned at its first report past warm-up."""
    exp = load_experiment(CONFIG, ["sweep.seeds=[0]", search(4, metric="train", warmup_percent=20)])
    the_study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=20))
    first = the_study.ask()
    report = Reporter(first, exp, total_steps=1000, resume_step=0)
    for step in range(100, 1001, 100):
        assert report(step, {"episodic_return": step / 10.0}) is None
    assert first.storage.get_trial(first._trial_id).intermediate_values == {p: p / 1.0 for p in range(10, 101, 10)}
    the_study.tell(first, 100.0)

    second = the_study.ask()
    report = Reporter(second, exp, total_steps=2000, resume_step=0)  # another budget: compared at the same percents
    assert report(200, {"episodic_return": 1.0}) is None  # 10%: inside the warm-up
    assert report(210, {"episodic_return": float("nan")}) is None  # no episode finished: nothing to report
    why = report(400, {"episodic_return": 1.0})
    assert why == "pruned by the median pruner at 20% of the budget (episodic_return 1)"

    resumed = Reporter(second, exp, total_steps=2000, resume_step=400)  # a requeued trial does not report 20% again
    assert resumed(420, {"episodic_return": 50.0}) is None and resumed.last == 21


@pytest.mark.parametrize(("name", "warmup", "kind", "first"), [
    ("median", 20, "MedianPruner", 20), ("hyperband", 0, "HyperbandPruner", 1), ("hyperband", 20, "HyperbandPruner", 20),
    ("asha", 0, "SuccessiveHalvingPruner", 1), ("asha", 30, "SuccessiveHalvingPruner", 30), ("none", 20, "NopPruner", None),
])  # fmt: skip
def test_each_pruner_name_is_its_optuna_pruner_and_judges_from_the_end_of_the_warm_up(tmp_path: Path, name: str, warmup: int, kind: str, first: int | None) -> None:
    """README: `pruner: median | hyperband | asha | none`, `warmup_percent`: no pruning before that
    percent of a trial's budget (and never at 0%: the first judged percent is at least 1)."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2, metric="train", pruner=name, warmup_percent=warmup)])
    pruner = study.open_study(exp, exp.dir).pruner
    assert type(pruner).__name__ == kind
    if first is not None:
        assert (pruner._n_warmup_steps if name == "median" else pruner._min_resource) == first


# ------------------------------------------------------------------------------------ local, end to end


@pytest.mark.e2e
def test_study_has_every_trial_once_shows_in_status_and_collect_and_grows_on_resweep(tmp_path: Path) -> None:
    since = time.time()
    exp_dir, printed = study_sweep(tmp_path, "local", search(6), "resources.max_concurrent=2", "eval.every_steps=512")
    assert "submitted an Optuna study (0 of 6 trials finished)" in printed and "(2 workers)" in printed
    wait_finished(exp_dir, Local(), since, timeout=300)
    first = assert_every_trial_once(exp_dir, 6)
    assert all(len(t.intermediate_values) >= 1 for t in first)  # the evaluations during training were reported
    text = status_text(exp_dir)
    assert "6 runs: 6 done" in text and "trial=5" in text

    out = io.StringIO()
    assert collect(exp_dir, out=out) == 0
    printed = out.getvalue()
    assert re.search(r"Optuna study \S+: 6 of 6 trials \(", printed) and "best trial " in printed
    assert "parameter importances (fANOVA): train." in printed
    trials_csv = csv_rows(exp_dir / "results" / "trials.csv")
    assert [int(r["trial"]) for r in trials_csv] == list(range(6)) and all(r["final_eval"] for r in trials_csv)
    for name in ("optuna_history.png", "optuna_intermediate.png", "optuna_importances.png"):
        assert (exp_dir / "results" / "plots" / name).stat().st_size > 10_000
    html = (exp_dir / "results" / "report.html").read_text()
    assert "Optuna: optimisation history" in html and "best trial" in html

    done = {r["run_id"]: (run_dir(exp_dir, r["run_id"]) / "DONE").stat().st_mtime for r in read_runs_csv(exp_dir)}
    _, again = study_sweep(tmp_path, "local", search(6), "resources.max_concurrent=2", "eval.every_steps=512")
    assert "the study has all 6 trials (6 finished); nothing submitted" in again
    since = time.time()
    _, more = study_sweep(tmp_path, "local", search(8), "resources.max_concurrent=2", "eval.every_steps=512")
    assert "submitted an Optuna study (6 of 8 trials finished)" in more
    wait_finished(exp_dir, Local(), since, timeout=300)
    assert_every_trial_once(exp_dir, 8)
    for run_id, mtime in done.items():
        assert (run_dir(exp_dir, run_id) / "DONE").stat().st_mtime == mtime  # the first six were not trained again
    assert {r["generation"] for r in read_runs_csv(exp_dir)} == {"0"}  # one config: one study, pooled together


@pytest.mark.e2e
def test_a_changed_config_starts_a_new_study_and_leaves_the_old_trials_out(tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = study_sweep(tmp_path, "local", search(2, pruner="none"), "train.total_steps=512")
    wait_finished(exp_dir, Local(), since, timeout=120)
    since = time.time()
    _, printed = study_sweep(tmp_path, "local", search(2, pruner="none"), "train.total_steps=1024")
    assert "submitted an Optuna study (0 of 2 trials finished)" in printed
    wait_finished(exp_dir, Local(), since, timeout=120)
    assert_every_trial_once(exp_dir, 2)
    rows = read_runs_csv(exp_dir)
    assert len(rows) == 4 and sorted(r["generation"] for r in rows) == ["0", "0", "1", "1"]
    out = io.StringIO()
    collect(exp_dir, out=out)
    assert "left out 2 runs of earlier configs" in out.getvalue() and "2 of 2 trials" in out.getvalue()


@pytest.mark.e2e
def test_a_worker_killed_mid_trial_leaves_it_to_the_next_sweep(tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = study_sweep(tmp_path, "local", search(2, pruner="none"), "resources.max_concurrent=1", "train.total_steps=40960")
    wait_until("trial 0's first checkpoint", lambda: any(exp_dir.glob("runs/*/checkpoints/*.pt")), 120)
    (worker,) = [line for line in processes_of(exp_dir) if "search-worker" in line and "python" in line and "bash" not in line]
    pid = next(int(p.parent.name) for p in Path("/proc").glob("[0-9]*/cmdline") if p.read_bytes().replace(b"\0", b" ").decode(errors="replace") == worker)
    os.kill(pid, signal.SIGKILL)
    wait_finished(exp_dir, Local(), since, timeout=120)
    assert study.held_trials(exp_dir) == {1: 0}
    assert [t.state.name for t in trials(exp_dir)] == ["RUNNING"]

    since = time.time()
    _, printed = study_sweep(tmp_path, "local", search(2, pruner="none"), "resources.max_concurrent=1", "train.total_steps=40960")
    assert "submitted an Optuna study (0 of 2 trials finished)" in printed
    wait_finished(exp_dir, Local(), since, timeout=300)
    assert_every_trial_once(exp_dir, 2)
    log = worker_log(exp_dir)
    assert "trial 0: resumed by worker 1" in log and re.search(r"resumed from step \d+", log), log
    steps = [int(r["step"]) for r in csv_rows(run_dir(exp_dir, trials(exp_dir)[0].user_attrs["run_id"]) / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 40960  # cut back to the checkpoint: no step twice


@pytest.mark.e2e
def test_a_worker_killed_while_another_works_is_shown_failed_and_restarted_by_the_next_sweep(tmp_path: Path) -> None:
    """Two workers; worker 2 is killed mid-trial while worker 1 trains on. `status` shows worker 2's
    trial failed (not running) and names the failed worker; worker 1 finishes its trial and then the
    study's other trial is worker 2's, so only 1 trial is left: the next sweep must still start task 2."""
    since = time.time()
    args = (search(2, pruner="none"), "resources.max_concurrent=2", "train.total_steps=8192", "train.checkpoint_every=1")
    exp_dir, _ = study_sweep(tmp_path, "local", *args)

    def both_training() -> bool:
        # Worker 2 must still hold its trial: on a loaded machine it could finish before worker 1's
        # first checkpoint (then its record is gone and there is nothing to kill mid-trial).
        rows = read_runs_csv(exp_dir)
        return len(rows) == 2 and all(any(run_dir(exp_dir, r["run_id"]).glob("checkpoints/*.pt")) for r in rows) and 2 in study.held_trials(exp_dir)

    wait_until("both workers' trials past their first checkpoint, worker 2's unfinished", both_training, 120)
    killed = study.held_trials(exp_dir)[2]
    os.kill(worker_pid(exp_dir, 2), signal.SIGKILL)
    local = get_scheduler("local", exp_dir)
    wait_until("the killed worker's task to end", lambda: local.query(["study-0"])["study-0"][2] == "failed", 30)
    rows = {int(r.setting.rpartition("trial=")[2]): r for r in experiment_status(exp_dir)[0]}
    assert rows[killed].train == "failed" and rows[killed].note.startswith("worker 2 (job study-0) ended (failed) holding it"), rows[killed]
    assert rows[1 - killed].train in ("running", "done"), rows[1 - killed]  # worker 1 is alive (or just finished)
    wait_finished(exp_dir, Local(), since, timeout=300)
    assert "study job study-0: worker 2 of 2 failed" in status_text(exp_dir)
    assert study.held_trials(exp_dir) == {2: killed}

    since = time.time()
    _, printed = study_sweep(tmp_path, "local", *args)
    assert "submitted an Optuna study (1 of 2 trials finished)" in printed and "(2 workers)" in printed
    wait_finished(exp_dir, Local(), since, timeout=300)
    assert_every_trial_once(exp_dir, 2)
    assert f"trial {killed}: resumed by worker 2" in worker_log(exp_dir)
    assert "failed" not in status_text(exp_dir)  # the restarted worker 2 replaced the failed one


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_when_every_worker_fails_status_names_the_study_job_and_the_aggregate_failed(tmp_path: Path, request: pytest.FixtureRequest, name: str) -> None:
    """(Grid Engine forgets how a task ended, so there neither a worker that failed before it held a
    trial nor the aggregate's exit can be told from one that succeeded.)"""
    if name != "local":
        request.getfixturevalue(f"{name}_cluster")
    since = time.time()
    exp_dir, _ = study_sweep(tmp_path, name, search(2, pruner="none"), "resources.max_concurrent=2", "train.total_steps=40960")
    wait_until("both workers' runs", lambda: len(study.held_trials(exp_dir)) == 2 and len(read_runs_csv(exp_dir)) == 2, 120)
    for task in (1, 2):
        os.kill(worker_pid(exp_dir, task), signal.SIGKILL)
    wait_finished(exp_dir, BACKENDS[name](), since, timeout=120)  # the aggregate ran: collect found no score
    text = status_text(exp_dir)
    (workers,) = [j for j in read_jobs(exp_dir) if j.stage == "study"]
    assert f"study job {workers.job_id}: workers 1, 2 of 2 failed" in text, text
    assert text.rstrip().endswith("2 runs: 2 failed; 2 settings; aggregate: failed"), text


def test_a_record_left_by_a_worker_of_an_earlier_study_is_not_resumed_in_the_new_one(tmp_path: Path) -> None:
    """Worker 1 of the old config's study was killed holding its trial 0; the config changed (a new
    study, whose trial 0 worker 2 now trains). Task 1 of the new study must ask for a trial of its
    own, not "resume" the new trial 0 beside worker 2."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(3)])
    expdir.write_experiment(exp, [], {"scheduler": "local"})
    second = Worker(exp.dir, 2, io.StringIO()).claim()
    assert second.number == 0 and study.held_trials(exp.dir) == {2: 0}
    (exp.dir / study.STUDY_DIR / "workers" / "1").write_text("0 conformance-0ld5tudy\n")
    out = io.StringIO()
    first = Worker(exp.dir, 1, out).claim()
    assert first.number == 1 and "resumed" not in out.getvalue()


@pytest.mark.parametrize("storage", ["journal", "sqlite"])
def test_a_trial_told_while_another_worker_claims_is_not_adopted_as_an_orphan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str) -> None:
    """Worker 1 tells its trial and removes its record outside the ask lock, so it may do both while
    worker 2 claims. Found in a full run (SQLite storage): worker 2 read trial 1 RUNNING, then found no
    record holding it, adopted it as an orphan and died on Optuna's UpdateFinishedTrialError, leaving
    its record behind. Here worker 1 finishes exactly between worker 2's reads."""
    extra = [f"sweep.search.storage=sqlite:///{tmp_path}/study.db"] if storage == "sqlite" else []
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(3, pruner="none"), *extra])
    expdir.write_experiment(exp, [], {"scheduler": "local"})
    first = Worker(exp.dir, 1, io.StringIO())
    trial = first.claim()
    assert trial.number == 0 and study.held_trials(exp.dir) == {1: 0}
    real_held = study.held_trials

    def worker_1_finishes_then_read(*args: object) -> dict[int, int]:
        first.study.tell(trial, 100.0)
        first.record.unlink()
        return real_held(*args)

    monkeypatch.setattr(study, "held_trials", worker_1_finishes_then_read)
    out = io.StringIO()
    second = Worker(exp.dir, 2, out).claim()
    assert second.number == 1 and "adopted" not in out.getvalue(), out.getvalue()


def test_a_trial_whose_training_failed_is_told_failed_not_scored_from_the_rows_it_logged(tmp_path: Path) -> None:
    """A trial's run that fails after logging good episodes is a FAIL in the study: not evaluated,
    and its logged return is not told as the trial's value (TPE would model a crash as a score)."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(1, metric="train", pruner="none")])
    expdir.write_experiment(exp, [], {"scheduler": "local"})

    def crashes_after_logging(root: Path, run: expdir.Run, out: object, progress: object) -> int:
        rd = run_dir(root, run.run_id)
        rd.mkdir(parents=True, exist_ok=True)
        rundir.write_curve(rd, np.array([100.0, 200.0]), np.array([150.0, 200.0]))
        rundir.mark(rd, rundir.FAILED, "RuntimeError: CUDA error: an illegal memory access")
        return 1

    class NoWarning:
        signal = None

        def __bool__(self) -> bool:
            return False

    evaluated: list[str] = []
    worker = Worker(exp.dir, 1, io.StringIO(), train=crashes_after_logging, evaluate=lambda root, run, out: evaluated.append(run.run_id) or 0, stop_flag=NoWarning)
    assert worker.run_trial(worker.claim()) is None
    (trial,) = trials(exp.dir)
    assert trial.state == optuna.trial.TrialState.FAIL and trial.value is None
    assert evaluated == []


# ------------------------------------------------------------------------------------ storage


@pytest.mark.e2e
def test_an_rdb_storage_works_and_a_relative_sqlite_file_is_in_the_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README: `storage:` takes an RDB URL. A relative SQLite path is resolved against the experiment
    directory at sweep time (not the cwd of whoever sweeps), and experiment.yaml records it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    since = time.time()
    exp_dir, printed = study_sweep(tmp_path, "local", search(2, pruner="none"), "resources.max_concurrent=2", "train.total_steps=512", "sweep.search.storage=sqlite:///db/study.db")
    assert "(2 workers)" in printed
    wait_finished(exp_dir, Local(), since, timeout=120)
    assert_every_trial_once(exp_dir, 2)
    assert (exp_dir / "db" / "study.db").is_file() and not list(elsewhere.iterdir())
    assert load_experiment_config(exp_dir)[0].sweep.search.storage == f"sqlite:///{exp_dir.resolve()}/db/study.db"  # type: ignore[union-attr]
    assert not (exp_dir / study.STUDY_DIR / study.JOURNAL).exists()


@pytest.mark.parametrize("url", ["bogus", "sqlite:////nonexistent/dir/x.db", "sqlite://", "nosuchdialect://u@h/db"])
def test_a_storage_that_cannot_be_a_study_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str) -> None:
    argv = ["sweep", str(CONFIG), "--scheduler", "local", "-p", f"output={tmp_path / 'out'}", "-p", "sweep.seeds=[0]", "-p", search(2), "-p", f"sweep.search.storage={url}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"hpcrl: error: {CONFIG}: sweep.search.storage: "), err
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_torn_journal_record_is_set_aside_by_a_worker_and_by_a_resweep(tmp_path: Path) -> None:
    """A node that dies mid-append leaves half a record at the end of the journal. The next writer
    (a worker, or the sweep) sets it aside in a side file before it appends; the trial whose end was
    lost is RUNNING with no worker holding it, and is adopted and told from its finished run."""
    since = time.time()
    args = (search(2, pruner="none"), "resources.max_concurrent=2", "train.total_steps=512")
    exp_dir, _ = study_sweep(tmp_path, "local", *args)
    wait_finished(exp_dir, Local(), since, timeout=120)

    torn = tear_last_tell(exp_dir)
    out = io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        assert search_worker(exp_dir, 1, out=out) == 0  # a worker, in this process
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    (side,) = (exp_dir / study.STUDY_DIR).glob("journal.log.torn-*")
    assert side.read_bytes() == torn and f"set aside in {side.name}" in out.getvalue()
    assert re.search(r"trial \d: adopted by worker 1 \(RUNNING, held by no worker\)", out.getvalue()), out.getvalue()
    assert_every_trial_once(exp_dir, 2)

    tear_last_tell(exp_dir)
    since = time.time()
    _, printed = study_sweep(tmp_path, "local", *args)
    assert "set aside in journal.log.torn-" in printed and "submitted an Optuna study (1 of 2 trials finished)" in printed, printed
    wait_finished(exp_dir, Local(), since, timeout=120)
    assert_every_trial_once(exp_dir, 2)
    assert len(list((exp_dir / study.STUDY_DIR).glob("journal.log.torn-*"))) == 2


def test_an_append_after_a_torn_record_sets_it_aside_first_and_a_changed_config_opens(tmp_path: Path) -> None:
    """A worker with the study open while another node dies mid-append: its next write (a tell) sets
    the torn tail aside first, so every later open reads the journal; a changed config (a new study
    in the same journal) opens too. Before: the tell landed on the torn line and was lost, and the
    next open failed (JSONDecodeError, or `AssertionError: Should not reach` for a new study)."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2)])
    out = io.StringIO()
    held = study.open_study(exp, exp.dir, out=out)
    trial = held.ask()
    trial.set_user_attr("run_id", "x" * 64)
    journal = exp.dir / study.STUDY_DIR / study.JOURNAL
    data = journal.read_bytes()
    os.truncate(journal, len(data) - 40)  # the user attr's record, cut mid-way
    held.tell(trial, 1.0)
    (side,) = journal.parent.glob("journal.log.torn-*")
    assert out.getvalue() == f"{journal}: its last record was torn (a writer died mid-append); set aside in {side.name}, the study goes on without it\n"
    assert journal.read_bytes().endswith(b"\n") and len(side.read_bytes()) == len(data.splitlines()[-1]) + 1 - 40

    changed = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2), "train.total_steps=1024"])
    assert study.open_study(changed, exp.dir).get_trials() == []
    (again,) = study.open_study(exp, exp.dir).get_trials()
    assert again.state == optuna.trial.TrialState.COMPLETE and again.value == 1.0


def test_a_journal_damaged_mid_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """A torn record that an older writer already wrote onto cannot be set aside: the sweep says
    which line, and writes nothing (no experiment.yaml, no jobs)."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2)])
    study.open_study(exp, exp.dir)
    journal = exp.dir / study.STUDY_DIR / study.JOURNAL
    data = journal.read_bytes()
    journal.write_bytes(data[:-20] + data)  # its last record torn, then whole records again, the first on the same line
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(journal))}: line {len(data.splitlines())} is not an Optuna journal record"):
        submit_experiment(exp, "local", detach=True, out=io.StringIO())
    assert sorted(p.name for p in exp.dir.iterdir()) == ["jobs", "optuna"] and [p.name for p in (exp.dir / "jobs").iterdir()] == ["sweep.lock"]


# ------------------------------------------------------------------------------------ every backend


@pytest.mark.e2e
def test_warned_worker_is_requeued_and_resumes_its_trial(backend: Backend, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    since = time.time()
    exp_dir, _ = study_sweep(tmp_path, backend.name, search(2, pruner="none"), "resources.max_concurrent=1", "train.total_steps=20480")
    (workers,) = [j for j in read_jobs(exp_dir) if j.stage == "study"]
    wait_until("trial 0's first checkpoint", lambda: any(exp_dir.glob("runs/*/checkpoints/*.pt")), 180)
    backend.warn(exp_dir, workers, 1)
    wait_finished(exp_dir, backend, since, timeout=300)

    found = assert_every_trial_once(exp_dir, 2)
    log = worker_log(exp_dir)
    signalled = re.search(r"signal \d+ at step (\d+): checkpointed", log)
    resumed = re.search(r"resumed from step (\d+)", log)
    assert signalled and resumed and "trial 0: resumed by worker 1" in log, log
    assert signalled.group(1) == resumed.group(1)  # nothing lost: it resumed from the step it was warned at
    steps = [int(r["step"]) for r in csv_rows(run_dir(exp_dir, found[0].user_attrs["run_id"]) / "train.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 20480
    print(f"\n{backend.name}: worker warned at step {signalled.group(1)}, trial 0 resumed from step {resumed.group(1)}; trials {[t.state.name for t in found]}")


@pytest.mark.slow
def test_bundled_study_prunes_and_finds_a_policy_that_solves_cartpole(tmp_path: Path) -> None:
    """Issue 15's "must show": TPE + median pruner, 2 workers sharing one journal file, 12 trials. Local
    only: what the study finds is Optuna's and PPO's; that workers run as array tasks sharing the journal,
    are requeued and resume on real Slurm and Grid Engine is the warned-worker test's, on every backend."""
    local = Local()
    since = time.time()
    exp_dir, _ = study_sweep(tmp_path, local.name, config=REPO / "configs" / "cartpole_optuna.yaml")
    wait_finished(exp_dir, local, since, timeout=600)
    found = assert_every_trial_once(exp_dir, 12)
    states = [t.state.name for t in found]
    assert states.count("PRUNED") >= 1, states
    out = io.StringIO()
    assert collect(exp_dir, out=out) == 0
    best = {r["trial"]: r for r in csv_rows(exp_dir / "results" / "trials.csv")}[str(study.open_study(load_experiment_config(exp_dir)[0], exp_dir).best_trial.number)]
    assert float(best["final_eval"]) >= 475, out.getvalue()
    print(
        f"\n{local.name}: 12 trials in {time.time() - since:.0f} s, {states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned; "
        f"best trial {best['trial']}: value {best['value']}, final eval {best['final_eval']}"
    )


def test_a_trial_is_scored_by_its_last_evaluation_during_training(tmp_path: Path) -> None:
    """With evaluation during training a trial's value is its last evaluation (the one at the end),
    not an earlier, better or worse one; a trial with none yet has no value (NaN), not a zero."""
    from hpcrl.sweep.study_worker import final_value

    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2), "eval.every_steps=100"])
    rd = tmp_path / "run"
    rd.mkdir()
    with rundir.EvalCurveLog(rd, 0) as log:
        for step, mean in [(100, 10.0), (200, 300.0), (300, 120.0)]:
            log.write([step, 0.0, mean, 1.0, 20, 5])
    assert final_value(exp, rd) == 120.0
    assert np.isnan(final_value(exp, tmp_path / "no-evaluations-yet"))


def test_a_running_trial_is_still_to_finish_and_finished_ones_are_not(tmp_path: Path) -> None:
    """What a re-sweep starts workers for: a RUNNING trial (its worker may be gone) still counts as
    remaining; complete, pruned and failed trials do not."""
    import optuna

    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(5)])
    s = optuna.create_study()
    for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
        s.add_trial(optuna.trial.create_trial(state=state, value=1.0 if state == optuna.trial.TrialState.COMPLETE else None))
    s.ask()  # RUNNING
    got = study.study_state(exp, s)
    assert (got.finished, got.running, got.remaining) == (3, 1, 2)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:study?mode=memory&uri=true"])
def test_an_in_memory_sqlite_storage_is_refused_before_anything_is_written(tmp_path: Path, url: str) -> None:
    """Every worker would open its own empty database: the study would never see another's trials."""
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2, storage=f"'{url}'")])
    with pytest.raises(ConfigError, match="in-memory database is not shared by the workers"):
        study.resolve_storage(exp)
    assert not exp.dir.exists()


def test_an_absolute_sqlite_file_in_an_existing_directory_is_kept_as_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shared/study.db"
    (tmp_path / "shared").mkdir()
    exp = load_experiment(CONFIG, [f"output={tmp_path}", "sweep.seeds=[0]", search(2, storage=f"'{url}'")])
    study.resolve_storage(exp)
    assert exp.sweep.search.storage == url
