"""Optuna studies (`sweep.search.method: optuna`, issue 15): workers as array tasks, on every backend.

What a user relies on:
- the study has exactly `n_trials` trials, each asked once and told once, whatever the number of
  workers sharing its journal file; every trial is a run (run directory, runs.csv row) that
  `status` and `collect` show, and `collect` adds the best trial, importances and Optuna's plots;
- the pruner stops poor trials while they train, judged at the same percent of every budget;
- a worker warned by the scheduler (preemption, time limit) checkpoints, is requeued, and resumes
  the trial it held from that checkpoint: no trial lost, none counted twice; a worker killed outright
  leaves its trial to the next sweep's worker of the same task id;
- the bundled config, 12 trials with 2 workers, finds a policy whose final evaluation is >= 475.

Local processes, real Slurm and real Grid Engine, through test_conformance's backends.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_conformance import CONFIG, Backend, Local, backend, csv_rows, processes_of, status_text, wait_finished, wait_until  # noqa: F401 (backend: a fixture)

from hpcrl import study
from hpcrl.collect import collect
from hpcrl.config import load_experiment
from hpcrl.pipeline import read_jobs, submit_experiment
from hpcrl.study_worker import Reporter, load_experiment_config
from hpcrl.sweep import current_rows, read_runs_csv, run_dir

optuna = pytest.importorskip("optuna", reason="Optuna studies need the optional extra: pip install 'hpcrl[optuna]'")

REPO = Path(__file__).resolve().parent.parent
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
    return "".join(p.read_text() for p in sorted((exp_dir / "jobs" / "logs").glob("study-*")))


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


# ------------------------------------------------------------------------------------ local, end to end


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


# ------------------------------------------------------------------------------------ every backend


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
def test_bundled_study_prunes_and_finds_a_policy_that_solves_cartpole(backend: Backend, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    """Issue 15's "must show": TPE + median pruner, 2 workers sharing one journal file, 12 trials."""
    since = time.time()
    exp_dir, _ = study_sweep(tmp_path, backend.name, config=REPO / "configs" / "cartpole_optuna.yaml")
    wait_finished(exp_dir, backend, since, timeout=600)
    found = assert_every_trial_once(exp_dir, 12)
    states = [t.state.name for t in found]
    assert states.count("PRUNED") >= 1, states
    out = io.StringIO()
    assert collect(exp_dir, out=out) == 0
    best = {r["trial"]: r for r in csv_rows(exp_dir / "results" / "trials.csv")}[str(study.open_study(load_experiment_config(exp_dir)[0], exp_dir).best_trial.number)]
    assert float(best["final_eval"]) >= 475, out.getvalue()
    print(
        f"\n{backend.name}: 12 trials in {time.time() - since:.0f} s, {states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned; "
        f"best trial {best['trial']}: value {best['value']}, final eval {best['final_eval']}"
    )
