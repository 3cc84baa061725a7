"""A user's own trainer (`algo: program`) as a run, end to end, through the real pipeline and schedulers.

What a user relies on (issue 13's "must show"):
- a swept program trains, is scored (mean of its last N training episodes, or what its eval command
  writes), collected into the usual table, curves and report; a re-sweep retrains nothing;
- a program that fails is FAILED with its own last line, `status` shows it, a re-sweep retries it alone
  and the next start gets `resume_args`;
- metrics that match no file are reported by run name at collect time, without a traceback;
- TensorBoard event files (a CleanRL-style script) and RL Zoo's Monitor CSVs are read as they are written;
- a program warned by the scheduler checkpoints, is requeued, resumes from that checkpoint and finishes.

Local processes, real Slurm and real Grid Engine, as in test_conformance.py (whose helpers this uses).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from factories import alive
from test_conformance import Backend, Local, active_tasks, backend, csv_rows, processes_of, status_text, wait_finished, wait_until  # noqa: F401 (backend: a fixture)

from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.results.collect import collect
from hpcrl.status import experiment_status
from hpcrl.store.expdir import load_runs, read_jobs, run_dir
from hpcrl.submit.pipeline import submit_experiment

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
COUNTER = DATA / "program_counter.yaml"
RLZOO = DATA / "rlzoo_cartpole_small.yaml"
PY = sys.executable


def sweep(config: Path, tmp_path: Path, scheduler: str, *overrides: str) -> tuple[Path, str]:
    """`hpcrl sweep` of a program config into tmp_path, the program run by this interpreter from the repository."""
    command = load_experiment(config).program.command
    exp = load_experiment(config, [f"output={tmp_path}", f"program.workdir={REPO}", f"program.command=[{PY}, {', '.join(command[1:])}]", *overrides])
    out = io.StringIO()
    assert submit_experiment(exp, scheduler, detach=True, out=out) == 0, out.getvalue()
    return exp.dir, out.getvalue()


def counter_returns(seed: int, lr: float, steps: range) -> list[float]:
    """The episodic returns counter_trainer.py logs at these steps."""
    return [seed % 10 + 100 * lr * s for s in steps]


def collected(exp_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    code = collect(exp_dir, out=out)
    return code, out.getvalue()


# ------------------------------------------------------------------------------------ 1. local, end to end


@pytest.mark.e2e
def test_swept_program_trains_scores_collects_and_is_not_retrained(tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = sweep(COUNTER, tmp_path, "local", "sweep.grid={program.params.lr: [0.01, 0.02]}")
    wait_finished(exp_dir, Local(), since, timeout=120)
    runs = load_runs(exp_dir)
    assert len(runs) == 4
    for run in runs:
        rd = run_dir(exp_dir, run.run_id)
        assert (rd / "DONE").exists(), status_text(exp_dir)
        lr, seed = float(run.config.program.params["lr"]), run.seed
        expected = sum(counter_returns(seed, lr, range(16, 21))) / 5
        assert f"mean of the last 5 training episodes: {expected:.6g}" in (rd / "EVAL_DONE").read_text()
        assert [float(r["episodic_return"]) for r in csv_rows(rd / "train.csv")] == pytest.approx(counter_returns(seed, lr, range(1, 21)))
    rows, aggregate, _ = experiment_status(exp_dir)
    assert [(r.train, r.eval) for r in rows] == [("done", "done")] * 4 and aggregate == "done"
    assert "20" in status_text(exp_dir)  # progress: the step a program run reached

    code, printed = collected(exp_dir)
    assert code == 0, printed
    results = exp_dir / "results"
    report = (results / "report.md").read_text()
    assert "Final score (mean of the last 5 training episodes)" in report
    summary = csv_rows(results / "summary.csv")
    assert sorted(s["n"] for s in summary) == ["2", "2"] and (results / "curves.csv").exists()
    assert (results / "plots" / "curves.png").exists() and (results / "plots" / "final.png").exists()

    _, printed = sweep(COUNTER, tmp_path, "local", "sweep.grid={program.params.lr: [0.01, 0.02]}")
    assert "nothing submitted" in printed, printed
    assert len(read_jobs(exp_dir)) == 3  # train, eval, aggregate of the first sweep only


# ------------------------------------------------------------------------------------ 2. failure and retry


@pytest.mark.e2e
def test_failed_program_shows_its_last_line_and_the_retry_resumes(tmp_path: Path) -> None:
    # The user's trainer has a bug (here: a flag file makes it fail at step 8); they fix it and sweep
    # again. The command line is unchanged, so the run is the same run, retried.
    bug = tmp_path / "bug"
    bug.write_text("")
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "import os, runpy, sys\n"
        f"if os.path.exists({str(bug)!r}):\n    sys.argv += ['--fail-at', '8']\n"
        f"runpy.run_path({str(REPO / 'tests' / 'programs' / 'counter_trainer.py')!r}, run_name='__main__')\n"
    )
    overrides = ("sweep.seeds=[0]", f"program.command=[{PY}, {trainer}]")
    since = time.time()
    exp_dir, _ = sweep(COUNTER, tmp_path, "local", *overrides)
    local = Local()
    wait_finished(exp_dir, local, since, timeout=120)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    failed = (rd / "FAILED").read_text()
    first, *tail = failed.splitlines()
    assert "RuntimeError: failing at step 8 as asked (--fail-at)" in first, failed
    assert any("Traceback" in line for line in tail), failed
    rows, _, _ = experiment_status(exp_dir)
    assert rows[0].train == "failed" and "failing at step 8" in rows[0].note
    assert "failing at step 8" in status_text(exp_dir)

    bug.unlink()
    since = time.time()
    _, printed = sweep(COUNTER, tmp_path, "local", *overrides)
    assert "submitted 1 of 1 runs" in printed, printed
    wait_finished(exp_dir, local, since, timeout=120)
    assert (rd / "DONE").exists(), status_text(exp_dir)
    log = (rd / "program.log").read_text()
    assert re.search(r"resumed from .*ckpt-5\.json at step 5", log), log
    steps = [int(r["step"]) for r in csv_rows(rd / "train.csv")]
    assert steps == list(range(1, 21))


# ------------------------------------------------------------------------------------ 3. metrics


@pytest.mark.e2e
def test_metrics_that_match_no_file_are_reported_by_run_name(tmp_path: Path) -> None:
    since = time.time()
    exp_dir, _ = sweep(COUNTER, tmp_path, "local", "sweep.seeds=[0]", "program.metrics={source: csv, path: nothing-*.csv}")
    wait_finished(exp_dir, Local(), since, timeout=120)
    (run,) = load_runs(exp_dir)
    code, printed = collected(exp_dir)
    assert "Traceback" not in printed
    assert re.search(rf"{re.escape(run.run_id)}.*eval failed: metrics: no files match", printed), printed
    assert code != 0


@pytest.mark.e2e
@pytest.mark.parametrize("eval_args,source", [([], "hpcrl"), (["--jsonl", "{run_dir}/eval.jsonl"], "jsonl")])
def test_eval_command_scores_the_run(tmp_path: Path, eval_args: list[str], source: str) -> None:
    metrics = "{source: hpcrl}" if source == "hpcrl" else "{source: jsonl, path: eval.jsonl, step: episode, value: return}"
    command = [PY, "tests/programs/eval_counter.py", "--episodes", "3", *eval_args]
    since = time.time()
    exp_dir, _ = sweep(COUNTER, tmp_path, "local", "sweep.seeds=[3]", f"program.eval={{command: {command}, metrics: {metrics}}}")
    wait_finished(exp_dir, Local(), since, timeout=120)
    (run,) = load_runs(exp_dir)
    # The final checkpoint: step 20, weight 0.2 -> base 3 + 20 = 23; episodes 22, 23, 24.
    assert "mean return over 3 evaluation episodes: 23" in (run_dir(exp_dir, run.run_id) / "EVAL_DONE").read_text()
    code, printed = collected(exp_dir)
    assert code == 0, printed
    assert float(csv_rows(exp_dir / "results" / "summary.csv")[0]["mean"]) == pytest.approx(23)


@pytest.mark.e2e
def test_tensorboard_program_is_collected_from_its_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    config = tmp_path / "tb.yaml"
    config.write_text(
        "name: cleanrl_tb\nalgo: program\nprogram:\n"
        f"  command: [{PY}, tests/programs/cleanrl_tb.py]\n"
        "  names: dashes\n  params: {total_timesteps: 4096}\n"
        "  args: [--seed, '{seed}', --log-dir, '{run_dir}/tb']\n"
        "  metrics: {source: tensorboard, last_episodes: 10}\n"
        "sweep: {seeds: [0]}\n"
    )
    since = time.time()
    exp_dir, _ = sweep(config, tmp_path, "local")
    wait_finished(exp_dir, Local(), since, timeout=180)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    assert (rd / "EVAL_DONE").exists(), status_text(exp_dir)
    curve = csv_rows(rd / "train.csv")
    assert len(curve) > 20 and all(float(r["episodic_return"]) >= 1 for r in curve)
    steps = [int(r["step"]) for r in curve]
    assert steps == sorted(steps) and steps[-1] <= 4096
    code, printed = collected(exp_dir)
    assert code == 0, printed


# ------------------------------------------------------------------------------------ 4. RL Zoo on every backend


@pytest.mark.e2e
def test_rl_zoo_sweep_is_collected_from_its_monitor_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local only: reading RL Zoo's Monitor CSVs is collect's, the same after any backend; that a program
    runs, is warned, requeued and cancelled on real Slurm and Grid Engine is the tests below, on every backend
    (4 RL Zoo runs here; 6 cost 75-84 s a backend under the suite's load)."""
    pytest.importorskip("rl_zoo3")
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3"))  # else each run's SB3 logger leaves an empty /tmp/SB3-<time>
    local = Local()
    started = since = time.time()
    exp_dir, _ = sweep(RLZOO, tmp_path, local.name)
    wait_finished(exp_dir, local, since, timeout=400)
    wall = time.time() - started
    rows, aggregate, _ = experiment_status(exp_dir)
    assert [(r.train, r.eval) for r in rows] == [("done", "done")] * 4 and aggregate == "done", status_text(exp_dir)
    for run in load_runs(exp_dir):
        assert list(run_dir(exp_dir, run.run_id).glob("zoo/ppo/CartPole-v1_*/*monitor.csv")), run.run_id
    code, printed = collected(exp_dir)
    assert code == 0, printed
    results = exp_dir / "results"
    summary = csv_rows(results / "summary.csv")
    assert sorted(s["n"] for s in summary) == ["2", "2"] and len({s["setting"] for s in summary}) == 2
    assert {c["setting"] for c in csv_rows(results / "curves.csv")} == {s["setting"] for s in summary}
    assert (results / "plots" / "curves.png").exists()
    assert "Final score (mean of the last 20 training episodes)" in (results / "report.md").read_text()
    print(f"\n{local.name}: RL Zoo 2 lr x 2 seeds (-n 2048) in {wall:.1f} s; " + "; ".join(f"{s['setting']}: {float(s['mean']):.1f}" for s in summary))

    _, printed = sweep(RLZOO, tmp_path, local.name)
    assert "nothing submitted" in printed, printed


# ------------------------------------------------------------------------------------ 5. requeue on every backend


@pytest.mark.e2e
def test_warned_program_checkpoints_is_requeued_and_resumes(backend: Backend, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    since = time.time()
    exp_dir, _ = sweep(COUNTER, tmp_path, backend.name, "sweep.seeds=[0]", "program.params.total_steps=40", "program.params.step_seconds=0.3")
    train = read_jobs(exp_dir)[0]
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("the first checkpoint", lambda: (rd / "checkpoints" / "ckpt-5.json").exists(), 180)
    backend.warn(exp_dir, train, 1)
    wait_finished(exp_dir, backend, since, timeout=300)

    log = (rd / "program.log").read_text()
    stopped = re.search(r"stop requested at step (\d+)", log)
    resumed = re.search(r"resumed from \S+ckpt-(\d+)\.json at step (\d+)", log)
    assert stopped and resumed and "done" in log, log
    assert int(resumed.group(2)) == int(stopped.group(1)) > 0  # resumed from the checkpoint the warning made
    steps = [int(r["step"]) for r in csv_rows(rd / "train.csv")]
    assert steps == list(range(1, 41)), steps  # no step twice, none lost
    returns = [float(r["episodic_return"]) for r in csv_rows(rd / "train.csv")]
    assert returns == pytest.approx(counter_returns(0, 0.01, range(1, 41)))  # the resumed weights are the saved ones
    assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists(), status_text(exp_dir)
    print(f"\n{backend.name}: warned, stopped at step {stopped.group(1)}, resumed at step {resumed.group(2)}, done at step {steps[-1]}")


@pytest.mark.e2e
def test_cancel_stops_every_program_and_nothing_comes_back(backend: Backend, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    exp_dir, _ = sweep(COUNTER, tmp_path, backend.name, "program.params.total_steps=100000", "program.params.step_seconds=0.05")
    wait_until("a program to checkpoint", lambda: any(exp_dir.glob("runs/*/checkpoints/ckpt-*.json")), 180)
    assert active_tasks(exp_dir, backend)
    main(["cancel", str(exp_dir)])
    wait_until("every task to leave the queue", lambda: not active_tasks(exp_dir, backend), 60)
    wait_until("every job process to exit", lambda: not processes_of(exp_dir), 60)
    time.sleep(8)  # a program that asked for a requeue on its way out would be back by now
    assert not active_tasks(exp_dir, backend) and not processes_of(exp_dir)
    rows, _, _ = experiment_status(exp_dir)
    assert {r.train for r in rows} == {"cancelled"}, status_text(exp_dir)
    assert not list(exp_dir.glob("runs/*/DONE"))


def job_processes(exp_dir: Path) -> tuple[int, int]:
    """The pid of the running `hpcrl train` of the experiment's one run and its process group (the job's)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
            if "hpcrl" in words and "train" in words and str(exp_dir) in words:
                pid = int(cmdline.parent.name)
                return pid, os.getpgid(pid)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no hpcrl train of {exp_dir} is running")



@pytest.mark.e2e
@pytest.mark.parametrize("warning", ["usr2-to-the-job", "usr1-to-the-job", "repeated"])
def test_scheduler_warnings_reach_the_program_once_as_its_stop_signal_and_the_run_resumes(backend: Backend, tmp_path: Path, warning: str) -> None:  # noqa: F811 (the fixture)
    # What Grid Engine sends, on every backend: USR2 to every process of the job (s_rt after a
    # reschedule), USR1 to every process (s_rt, -notify before a suspend), and warnings that repeat
    # (scancel --signal every few seconds, USR1 then USR2) until hpcrl has exited. The program's
    # stop signal is TERM: it must get TERM, once, from hpcrl, checkpoint, and resume after the requeue.
    since = time.time()
    exp_dir, _ = sweep(COUNTER, tmp_path, backend.name, "sweep.seeds=[0]", "program.params.total_steps=20", "program.params.step_seconds=0.2",
                       "program.stop_signal=TERM", "program.args=[--note-signals]")  # fmt: skip
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("the first checkpoint", lambda: (rd / "checkpoints" / "ckpt-5.json").exists(), 180)
    hpcrl, job = job_processes(exp_dir)
    if warning == "repeated":
        deadline = time.monotonic() + 60
        sent = 0
        while alive(hpcrl) and time.monotonic() < deadline:
            for pid in (job, hpcrl):  # the job shell (the group's leader) and hpcrl, until hpcrl is gone
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, (signal.SIGUSR1, signal.SIGUSR2)[sent % 2])
            sent += 1
            time.sleep(0.02)
        assert sent > 1
    else:
        os.killpg(job, signal.SIGUSR2 if warning.startswith("usr2") else signal.SIGUSR1)
    wait_finished(exp_dir, backend, since, timeout=300)

    log = (rd / "program.log").read_text()
    first, _, later = log.partition("resumed from")
    assert [line for line in first.splitlines() if line.startswith("got signal")] == ["got signal SIGTERM"], log
    stopped = re.search(r"stop requested at step (\d+)", first)
    resumed = re.search(r"^ \S+ckpt-(\d+)\.json at step (\d+)", later)
    assert stopped and resumed and int(resumed.group(2)) == int(stopped.group(1)) > 0, log
    assert [int(r["step"]) for r in csv_rows(rd / "train.csv")] == list(range(1, 21))
    assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists(), status_text(exp_dir)


@pytest.mark.e2e
def test_a_program_that_dies_of_its_stop_signal_is_requeued_and_resumes(tmp_path: Path) -> None:
    # No handler at all (it never heard of hpcrl.job): USR1's default action kills it. After the
    # warning, that death is the preemption's doing: the run is requeued and resumes.
    config = tmp_path / "plain.yaml"
    config.write_text(
        "name: plain\nalgo: program\nprogram:\n"
        f"  command: [{PY}, tests/programs/plain_counter.py]\n"
        "  names: dashes\n  params: {total_steps: 20, step_seconds: 0.2}\n"
        "  args: [--checkpoint-dir, '{checkpoint_dir}', --metrics, '{run_dir}/metrics.csv']\n"
        "  resume_args: [--resume, '{checkpoint_dir}']\n"
        "  metrics: {source: csv, path: metrics.csv, step: step, value: return, last_episodes: 5}\n"
        "sweep: {seeds: [0]}\nresources: {mem: 500M, time: '00:10:00', signal_seconds: 60}\n"
    )
    since = time.time()
    exp_dir, _ = sweep(config, tmp_path, "local")
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_until("step 3", lambda: "step 3" in ((rd / "program.log").read_text() if (rd / "program.log").exists() else ""), 180)
    Local().warn(exp_dir, read_jobs(exp_dir)[0], 1)
    wait_finished(exp_dir, Local(), since, timeout=180)
    jobs_log = "".join(p.read_text() for p in sorted((exp_dir / "jobs" / "logs").glob("train-*")))
    assert "program stopped (killed by SIGUSR1) after the warning SIGUSR1 (passed on as SIGUSR1): asking for a requeue" in jobs_log, jobs_log
    resumed = re.search(r"resumed at step (\d+)", (rd / "program.log").read_text())
    assert resumed and int(resumed.group(1)) >= 3
    assert (rd / "lifetimes").read_text().count("\n") == 2
    assert (rd / "DONE").exists() and (rd / "EVAL_DONE").exists(), status_text(exp_dir)


@pytest.mark.e2e
def test_a_program_that_always_asks_for_a_requeue_is_failed_after_three_lifetimes(backend: Backend, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    # resources.max_stalled_requeues (3): one cap, applied by hpcrl train on every scheduler.
    config = tmp_path / "always99.yaml"
    config.write_text(
        "name: always99\nalgo: program\nprogram:\n"
        f"  command: [{PY}, -c, 'import sys; print(\"not today\"); sys.exit(99)']\n"
        "  metrics: {source: hpcrl}\nsweep: {seeds: [0]}\nresources: {mem: 500M, time: '00:10:00', signal_seconds: 60}\n"
    )
    since = time.time()
    exp_dir, _ = sweep(config, tmp_path, backend.name)
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    wait_finished(exp_dir, backend, since, timeout=240)
    assert (rd / "lifetimes").read_text().count("\n") == 3
    assert (rd / "FAILED").read_text().startswith("asked for a requeue 3 times in a row without progress"), (rd / "FAILED").read_text()
    rows, _, _ = experiment_status(exp_dir)
    assert rows[0].train == "failed" and "without progress" in rows[0].note, status_text(exp_dir)


# ------------------------------------------------------------------------------------ 6. dry run and bad input


@pytest.mark.parametrize("scheduler", ["local", "slurm", "sge"])
def test_dry_run_prints_the_program_lines_and_bad_input_is_one_line(tmp_path: Path, capsys, scheduler: str) -> None:
    args = ["sweep", str(COUNTER), "--scheduler", scheduler, "--dry-run", "-p", f"output={tmp_path / 'logs'}", "-p", f"program.workdir={REPO}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # `python` is resolved where the sweep runs: the job's PATH may lack it (Grid Engine's did).
    assert f"PROGRAM=({shutil.which('python')} tests/programs/counter_trainer.py --lr 0.01 --total-steps 20" in out, out
    assert not (tmp_path / "logs").exists()
    assert main([*args, "-p", "program.args=['{rundir}']"]) == 2
    err = capsys.readouterr().err
    assert "program.args[0]: unknown placeholder {rundir}" in err and err.count("\n") == 1, err
    assert not (tmp_path / "logs").exists()
