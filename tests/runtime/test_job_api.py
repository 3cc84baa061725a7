"""hpcrl.job, the module a user's own trainer imports (issue 13), and the test programs in
tests/programs/ that the integration tests run as such trainers.

hpcrl.job keeps per-process state (the open train.csv, the stop flag), so each test reloads it with
the environment it wants, as a fresh program start would see it."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from hpcrl.store import rundir
from hpcrl.store.states import REQUEUE_EXIT

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"
ENV_VARS = ("HPCRL_RUN_DIR", "HPCRL_CHECKPOINT_DIR", "HPCRL_SEED", "HPCRL_RUN_ID", "HPCRL_REQUEUE_EXIT", "HPCRL_STOP_SIGNAL", "HPCRL_LIFETIME")


@pytest.fixture
def start(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ModuleType]]:
    """start(**env) -> hpcrl.job as a program started with that HPCRL_* environment would import it."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    loaded: list[ModuleType] = []

    def load(**env: object) -> ModuleType:
        for name in ENV_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(f"HPCRL_{name.upper()}", str(value))
        for module in loaded:
            _close(module)
        module = importlib.reload(importlib.import_module("hpcrl.job"))
        loaded.append(module)
        return module

    yield load
    load()  # leave hpcrl.job as a plain import finds it
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _close(module: ModuleType) -> None:
    if module._log is not None:
        module._log.close()


def rows(run: Path) -> list[list[str]]:
    return [line.split(",") for line in (run / "train.csv").read_text().splitlines()]


# --------------------------------------------------------------------------------------------
# The environment contract.


def test_the_contract_names_the_variables_the_wrapper_sets(start, tmp_path: Path) -> None:
    job = start()
    assert (job.RUN_DIR, job.CHECKPOINT_DIR, job.SEED, job.RUN_ID) == ("HPCRL_RUN_DIR", "HPCRL_CHECKPOINT_DIR", "HPCRL_SEED", "HPCRL_RUN_ID")
    assert (job.REQUEUE_EXIT_VAR, job.STOP_SIGNAL, job.LIFETIME) == ("HPCRL_REQUEUE_EXIT", "HPCRL_STOP_SIGNAL", "HPCRL_LIFETIME")
    job = start(run_dir=tmp_path / "run", checkpoint_dir=tmp_path / "ck" / "a", seed=7, requeue_exit=42, lifetime=2)
    assert job.inside() and job.run_dir() == tmp_path / "run"
    assert job.checkpoint_dir() == tmp_path / "ck" / "a" and (tmp_path / "ck" / "a").is_dir()
    assert (job.seed(), job.resumed(), job.requeue_exit()) == (7, True, 42)
    assert not start(run_dir=tmp_path / "run", lifetime=1).resumed()


def test_inside_without_a_checkpoint_variable_checkpoints_go_in_the_run_dir(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path)
    assert job.checkpoint_dir() == tmp_path / rundir.CHECKPOINTS and (tmp_path / rundir.CHECKPOINTS).is_dir()


def test_outside_hpcrl_the_defaults_let_a_script_run_by_hand(start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    job = start()
    assert not job.inside() and job.run_dir() is None
    assert job.checkpoint_dir() == Path("checkpoints") and (tmp_path / "checkpoints").is_dir()
    assert (job.seed(), job.seed(default=5), job.resumed(), job.requeue_exit()) == (0, 5, False, REQUEUE_EXIT)
    assert not job.stop_requested()
    job.log(1, episodic_return=3.0)
    job.log(2, episodic_return=4.0)
    job.log_eval([1.0, 2.0])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HPCRL_RUN_DIR" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


@pytest.mark.parametrize(("var", "value"), [("seed", "seven"), ("seed", "1.5"), ("lifetime", "x"), ("requeue_exit", "99a")])
def test_a_variable_that_is_not_an_integer_is_a_clear_error(start, var: str, value: str) -> None:
    job = start(**{var: value})
    ask = {"seed": job.seed, "lifetime": job.resumed, "requeue_exit": job.requeue_exit}[var]
    with pytest.raises(ValueError, match=f"^HPCRL_{var.upper()}: expected an integer, got '{value}'$"):
        ask()


# --------------------------------------------------------------------------------------------
# The stop signal.


@pytest.mark.parametrize(("name", "signum"), [("USR1", signal.SIGUSR1), ("TERM", signal.SIGTERM), ("SIGUSR1", signal.SIGUSR1)])
def test_stop_requested_turns_true_when_the_stop_signal_arrives(start, name: str, signum: int) -> None:
    job = start(stop_signal=name)
    os.kill(os.getpid(), signum)  # before the first stop_requested(): the handler was installed at import
    assert job.stop_requested()
    assert job.stop_requested()


def test_stop_requested_is_false_until_the_signal_arrives(start) -> None:
    job = start(stop_signal="USR1")
    assert not job.stop_requested()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert job.stop_requested()


def test_the_other_signal_does_not_stop(start) -> None:
    job = start(stop_signal="TERM")
    signal.signal(signal.SIGUSR1, lambda *_: None)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert not job.stop_requested()


def test_a_handler_the_program_installed_before_the_import_is_still_called(start) -> None:
    seen = []
    signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    job = start(stop_signal="USR1")
    os.kill(os.getpid(), signal.SIGUSR1)
    assert job.stop_requested() and seen == [signal.SIGUSR1]


def test_without_a_stop_signal_no_handler_is_installed(start) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    job = start()
    assert not job.stop_requested() and signal.getsignal(signal.SIGUSR1) is before


@pytest.mark.parametrize("value", ["BOGUS", "12x", "KILL"])
def test_a_bogus_stop_signal_is_a_clear_error(start, value: str) -> None:
    job = start(stop_signal=value)  # the import itself does not fail
    with pytest.raises(ValueError, match=f"^HPCRL_STOP_SIGNAL: '{value}' "):
        job.stop_requested()


# --------------------------------------------------------------------------------------------
# train.csv


def test_log_writes_train_csv_that_collect_reads(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path / "run")
    job.log(10, loss=0.5, episodic_return=1.5)
    job.log(20, episodic_return=2)
    job.log(20, loss=0.25)  # two rows at one step: episodes that ended together
    assert rows(tmp_path / "run") == [["step", "episodic_return", "loss"], ["10", "1.5", "0.5"], ["20", "2", ""], ["20", "", "0.25"]]
    steps, returns = rundir.read_curve(tmp_path / "run")
    assert steps.tolist() == [10, 20] and returns.tolist() == [1.5, 2.0]


def test_numpy_numbers_are_welcome(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path)
    job.log(np.int64(4), episodic_return=np.float32(2.5), loss=np.float64(np.nan))
    assert rows(tmp_path)[1] == ["4", "2.5", ""]


def test_a_torn_header_is_no_header(start, tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_bytes(b"step,episodic_ret")  # a node died while writing it
    assert rundir.train_columns(tmp_path) is None
    start(run_dir=tmp_path, lifetime=2).log(1, episodic_return=1.0)
    assert rows(tmp_path) == [["step", "episodic_return"], ["1", "1"]]


def test_an_unknown_metric_is_refused_and_writes_nothing(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path)
    job.log(1, episodic_return=1.0)
    with pytest.raises(ValueError, match="unknown metric 'lossy'; train.csv's columns are step,episodic_return"):
        job.log(2, episodic_return=2.0, lossy=1.0)
    assert rows(tmp_path) == [["step", "episodic_return"], ["1", "1"]]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_value_that_is_not_a_finite_number_is_an_empty_cell(start, tmp_path: Path, value: float) -> None:
    job = start(run_dir=tmp_path)
    job.log(1, episodic_return=value, loss=0.125)
    assert rows(tmp_path)[1] == ["1", "", "0.125"]
    assert rundir.read_curve(tmp_path)[1].tolist() == []


@pytest.mark.parametrize(("step", "metrics", "why"), [
    ("3", {"episodic_return": 1.0}, "step must be an integer"),
    (True, {"episodic_return": 1.0}, "step must be an integer"),
    (2.5, {"episodic_return": 1.0}, "step must be an integer"),
    (3, {"episodic_return": "high"}, "metric 'episodic_return' must be a number"),
    (3, {"episodic_return": "3.5"}, "metric 'episodic_return' must be a number"),  # float() would take it
    (3, {"episodic_return": None}, "metric 'episodic_return' must be a number"),
    (3, {"a,b": 1.0}, "cannot be a CSV column"),
])  # fmt: skip
def test_hostile_log_calls_are_refused(start, tmp_path: Path, step: object, metrics: dict, why: str) -> None:
    job = start(run_dir=tmp_path)
    with pytest.raises(ValueError, match=why):
        job.log(step, **metrics)
    assert not (tmp_path / "train.csv").exists()


def test_steps_may_not_go_down_within_a_lifetime(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path)
    job.log(10, episodic_return=1.0)
    with pytest.raises(ValueError, match="step 9 is below the step logged before it"):
        job.log(9, episodic_return=1.0)


def test_a_resumed_lifetime_cuts_the_rows_it_logs_again(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path, lifetime=1)
    for step in range(1, 11):
        job.log(step, episodic_return=step, loss=0.5)
    # The program checkpointed at step 6 and was killed at 10: it resumes and logs step 7 again.
    job = start(run_dir=tmp_path, lifetime=2)
    job.log(7, loss=0.25, episodic_return=70)  # another order: the earlier header stays
    job.log(8, episodic_return=80)
    table = rows(tmp_path)
    assert table[0] == ["step", "episodic_return", "loss"]
    assert [r[0] for r in table[1:]] == ["1", "2", "3", "4", "5", "6", "7", "8"]
    assert table[7:] == [["7", "70", "0.25"], ["8", "80", ""]]


def test_a_resumed_lifetime_logs_only_the_earlier_columns(start, tmp_path: Path) -> None:
    start(run_dir=tmp_path).log(1, episodic_return=1.0)
    job = start(run_dir=tmp_path, lifetime=2)
    with pytest.raises(ValueError, match="has columns step,episodic_return from an earlier lifetime; this one logs step,episodic_return,kl"):
        job.log(2, episodic_return=2.0, kl=0.1)
    assert rows(tmp_path) == [["step", "episodic_return"], ["1", "1"]]


def test_a_start_that_does_not_resume_replaces_an_earlier_attempts_columns(start, tmp_path: Path) -> None:
    start(run_dir=tmp_path).log(1, episodic_return=1.0)
    start(run_dir=tmp_path, lifetime=1).log(1, episodic_return=5.0, kl=0.5)
    assert rows(tmp_path) == [["step", "episodic_return", "kl"], ["1", "5", "0.5"]]


# --------------------------------------------------------------------------------------------
# eval.csv


def test_log_eval_writes_eval_csv_that_collect_reads(start, tmp_path: Path) -> None:
    job = start(run_dir=tmp_path)
    job.log_eval([1.0, 2.0, 4.5], [10, 20, 30])
    assert rundir.read_eval(tmp_path) == pytest.approx(2.5)
    assert (tmp_path / "eval.csv").read_text().splitlines() == ["episode,return,length", "0,1,10", "1,2,20", "2,4.5,30"]
    job.log_eval([3.0])
    assert (tmp_path / "eval.csv").read_text().splitlines() == ["episode,return,length", "0,3,"]


@pytest.mark.parametrize(("returns", "lengths", "why"), [
    ([], None, "no episode returns"),
    ([1.0, float("nan")], None, r"returns\[1\] is nan, not a finite number"),
    ([1.0, 2.0], [5], "2 returns but 1 lengths"),
])  # fmt: skip
def test_hostile_log_eval_calls_are_refused(start, tmp_path: Path, returns: list, lengths: list | None, why: str) -> None:
    job = start(run_dir=tmp_path)
    with pytest.raises(ValueError, match=why):
        job.log_eval(returns, lengths)
    assert not (tmp_path / "eval.csv").exists()


def test_importing_hpcrl_job_does_not_import_torch() -> None:
    code = "import sys, hpcrl.job; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------------------------
# The test programs, run by hand as hpcrl's wrapper would run them.


def program_env(run: Path, **extra: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_")}
    env.update(PYTHONPATH=str(REPO), HPCRL_RUN_DIR=str(run), HPCRL_CHECKPOINT_DIR=str(run / "checkpoints"), HPCRL_SEED="3", HPCRL_STOP_SIGNAL="USR1")
    env.update({f"HPCRL_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def counter(run: Path, *args: str, **extra: object) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(PROGRAMS / "counter_trainer.py"), "--checkpoint-dir", str(run / "checkpoints"), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=program_env(run, **extra), timeout=60)


def test_counter_trainer_stops_on_the_signal_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    run, ref = tmp_path / "run", tmp_path / "ref"
    common = ["--total-steps", "30", "--checkpoint-every", "4", "--lr", "0.02"]
    argv = [sys.executable, str(PROGRAMS / "counter_trainer.py"), "--checkpoint-dir", str(run / "checkpoints"), "--step-seconds", "0.1", *common]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=program_env(run))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not (run / "train.csv").exists() or len(rows(run)) < 7):
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == REQUEUE_EXIT, err
    stopped_at = int(out.split("stop requested at step ")[1].split()[0])
    assert 6 <= stopped_at < 30 and (run / "checkpoints" / f"ckpt-{stopped_at}.json").exists()
    assert int(rows(run)[-1][0]) == stopped_at

    resumed = counter(run, *common, "--resume", str(run / "checkpoints"), lifetime=2)
    assert resumed.returncode == 0 and resumed.stdout.endswith("done\n"), resumed.stderr
    assert f"resumed from {run / 'checkpoints' / f'ckpt-{stopped_at}.json'}" in resumed.stdout
    assert counter(ref, *common).returncode == 0
    assert rows(run) == rows(ref)  # no step twice, none missing, and the same numbers as a run never stopped
    assert [int(r[0]) for r in rows(run)[1:]] == list(range(1, 31))


def test_counter_trainer_resumed_after_a_crash_logs_the_lost_steps_again(tmp_path: Path) -> None:
    run, ref = tmp_path / "run", tmp_path / "ref"
    crashed = counter(run, "--total-steps", "12", "--checkpoint-every", "5", "--fail-at", "9")
    assert crashed.returncode == 1 and "Traceback" in crashed.stderr and "RuntimeError: failing at step 9" in crashed.stderr
    assert [r[0] for r in rows(run)[1:]] == ["1", "2", "3", "4", "5", "6", "7", "8"]
    resumed = counter(run, "--total-steps", "12", "--checkpoint-every", "5", "--resume", str(run / "checkpoints"), lifetime=2)
    assert resumed.returncode == 0, resumed.stderr
    assert counter(ref, "--total-steps", "12", "--checkpoint-every", "5").returncode == 0
    assert rows(run) == rows(ref)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-10.json", "ckpt-12.json", "ckpt-5.json"]


def test_counter_trainer_resume_from_an_empty_directory_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    done = counter(tmp_path, "--total-steps", "3", "--resume", str(tmp_path / "checkpoints"), lifetime=2)
    assert done.returncode == 0 and "starting from step 0" in done.stdout, done.stderr
    assert [r[0] for r in rows(tmp_path)[1:]] == ["1", "2", "3"]


def test_counter_trainer_that_ignores_signals_runs_on(tmp_path: Path) -> None:
    argv = [sys.executable, str(PROGRAMS / "counter_trainer.py"), "--total-steps", "20", "--step-seconds", "0.05", "--ignore-signals"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=program_env(tmp_path))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (tmp_path / "train.csv").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.endswith("done\n"), err
    assert len(rows(tmp_path)) == 21


def test_eval_counter_writes_eval_csv_or_json_lines(tmp_path: Path) -> None:
    assert counter(tmp_path, "--total-steps", "7", "--checkpoint-every", "5").returncode == 0
    evaluate = [sys.executable, str(PROGRAMS / "eval_counter.py"), "--episodes", "3"]
    proc = subprocess.run(evaluate, capture_output=True, text=True, env=program_env(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    # The final checkpoint is step 7: seed 3, lr 0.01 -> return 3 + 7 = 10, played as 9, 10, 11.
    assert (tmp_path / "eval.csv").read_text().splitlines() == ["episode,return,length", "0,9,7", "1,10,8", "2,11,9"]
    proc = subprocess.run([*evaluate, "--jsonl", str(tmp_path / "e.jsonl")], capture_output=True, text=True, env=program_env(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()] == [
        {"episode": i, "return": r} for i, r in enumerate([9, 10, 11])
    ]


def test_eval_counter_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    proc = subprocess.run([sys.executable, str(PROGRAMS / "eval_counter.py")], capture_output=True, text=True, env=program_env(tmp_path), timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip() == f"eval_counter: no ckpt-<step>.json in {tmp_path / 'checkpoints'}"
    assert not (tmp_path / "eval.csv").exists()


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def cleanrl(log_dir: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(PROGRAMS / "cleanrl_tb.py"), "--log-dir", str(log_dir), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.e2e
def test_cleanrl_tb_writes_cleanrls_tensorboard_tags(tmp_path: Path) -> None:
    proc = cleanrl(tmp_path, "--total-timesteps", "1024", "--num-envs", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    returns = tensorboard_scalars(tmp_path, "charts/episodic_return")
    lengths = tensorboard_scalars(tmp_path, "charts/episodic_length")
    assert returns and [s for s, _ in returns] == [s for s, _ in lengths] and all(0 < s <= 1024 for s, _ in returns)
    assert [v for _, v in returns] == [v for _, v in lengths]  # CartPole: +1 per step


@pytest.mark.slow
def test_cleanrl_tb_learns_cartpole(tmp_path: Path) -> None:
    began = time.monotonic()
    proc = cleanrl(tmp_path, "--total-timesteps", "40000", "--seed", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = [v for _, v in tensorboard_scalars(tmp_path, "charts/episodic_return")[-10:]]
    print(f"cleanrl_tb: 40k steps in {time.monotonic() - began:.1f} s, mean of the last 10 episodes {sum(last) / 10:.1f}")
    assert sum(last) / 10 > 100  # random play: ~22
