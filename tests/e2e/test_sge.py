"""Grid Engine's own time limit: a run longer than one job's h_rt goes on in the next lifetime, for
hpcrl's trainer and for a user's program (whose warning is USR1 at the first s_rt, USR2 at the next).

The train job asks for `-l s_rt` (signal_seconds before h_rt) and `-r y`: at s_rt sge_execd sends
SIGUSR1, the job shell passes it on, the trainer checkpoints and exits 99, Grid Engine reschedules
the task, and the next lifetime resumes from the checkpoint. Real daemons (tests/conftest.py).
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from test_program_runs import COUNTER, sweep

from hpcrl.config.load import load_experiment
from hpcrl.status import cancel_experiment, experiment_status
from hpcrl.store.expdir import load_runs, run_dir
from hpcrl.submit.pipeline import submit_experiment

CONFIG = Path(__file__).resolve().parents[1] / "data" / "conformance.yaml"


@pytest.mark.sge
def test_time_limit_checkpoints_and_the_next_lifetime_resumes(sge_cluster: None, tmp_path: Path) -> None:
    # s_rt = 15 s and a budget no lifetime can finish: the first lifetime is warned, the second resumes.
    # (Only one hand-over is checked: Grid Engine 8.1.9's qmaster measures h_rt of a rescheduled task
    # from its first start, so a second hand-over within one h_rt is not reliable; see the README.)
    overrides = [f"output={tmp_path}", "sweep.seeds=[0]", "train.total_steps=100000000", "resources.time=00:00:25", "resources.signal_seconds=10"]
    exp = load_experiment(CONFIG, overrides)
    assert submit_experiment(exp, "sge", out=io.StringIO()) == 0
    (run,) = load_runs(exp.dir)
    rd = run_dir(exp.dir, run.run_id)
    logs = exp.dir / "jobs" / "logs"

    def log() -> str:
        return "".join(p.read_text() for p in sorted(logs.glob("train-*")))

    try:
        deadline = time.monotonic() + 240
        while not re.search(r"resumed from step", log()):
            assert time.monotonic() < deadline, f"no second lifetime within 240 s:\n{log()}"
            assert not (rd / "FAILED").exists(), (rd / "FAILED").read_text()
            time.sleep(1)
        signalled = [int(s) for s in re.findall(r"signal \d+ at step (\d+): checkpointed", log())]
        resumed = [int(s) for s in re.findall(r"resumed from step (\d+)", log())]
        print(f"\nsge: lifetimes of s_rt 15 s; checkpointed at steps {signalled}, resumed from {resumed}")
        assert resumed == signalled and resumed[0] > 0, log()
        rows, _, _ = experiment_status(exp.dir)
        assert rows[0].train == "running" and rows[0].step >= resumed[0]
    finally:
        cancel_experiment(exp.dir, out=io.StringIO())
    steps = [int(line.split(",")[0]) for line in (rd / "train.csv").read_text().splitlines()[1:]]
    assert steps == sorted(set(steps)), "a step was logged twice: a lifetime did not resume where the last stopped"


@pytest.mark.sge
def test_a_program_is_warned_at_each_soft_limit_once_and_checkpoints_each_time(sge_cluster: None, tmp_path: Path) -> None:
    # What sge_execd really sends, to every process of the job (verified on 8.1.9): USR1 at s_rt of the
    # first lifetime; in the rescheduled one USR2 about s_rt after its start, before qmaster's h_rt kill
    # (qacct: "failed 37: qmaster enforced h_rt"; that lifetime is not rescheduled, see the README: the
    # next sweep resumes it). hpcrl must take both as the warning (USR2 killed it, nothing saved), and
    # the program (stop_signal TERM) must get TERM from hpcrl, once each time (USR1 killed it).
    exp_dir, _ = sweep(COUNTER, tmp_path, "sge", "sweep.seeds=[0]", "program.params.total_steps=100000", "program.params.step_seconds=0.2",
                       "program.stop_signal=TERM", "program.args=[--note-signals]", "resources.time=00:00:45", "resources.signal_seconds=15")  # fmt: skip
    (run,) = load_runs(exp_dir)
    rd = run_dir(exp_dir, run.run_id)
    log = rd / "program.log"
    try:
        deadline = time.monotonic() + 240
        while (log.read_text() if log.exists() else "").count("stop requested") < 2:
            assert time.monotonic() < deadline, f"no second warning within 240 s:\n{log.read_text() if log.exists() else ''}"
            assert not (rd / "FAILED").exists(), (rd / "FAILED").read_text()
            time.sleep(1)
        jobs_log = exp_dir / "jobs" / "logs"
        wait_until = time.monotonic() + 30
        while "".join(p.read_text() for p in jobs_log.glob("train-*")).count("asking for a requeue") < 2 and time.monotonic() < wait_until:
            time.sleep(0.5)
    finally:
        cancel_experiment(exp_dir, out=io.StringIO())
    text = log.read_text()
    lifetimes = text.split("resumed from")
    assert len(lifetimes) == 2, text
    for part in lifetimes:
        assert [line for line in part.splitlines() if line.startswith("got signal")] == ["got signal SIGTERM"], text
    stopped = [int(s) for s in re.findall(r"stop requested at step (\d+)", text)]
    resumed = [int(s) for s in re.findall(r"ckpt-\d+\.json at step (\d+)", text)]
    print(f"\nsge: program warned at s_rt (USR1), then after the reschedule (USR2); stopped at steps {stopped}, resumed at {resumed}")
    assert resumed == stopped[:1] and stopped[0] > 0 and stopped[1] > stopped[0]
    assert (rd / "checkpoints" / f"ckpt-{stopped[1]}.json").exists()  # the second lifetime's work is saved
    assert "".join(p.read_text() for p in jobs_log.glob("train-*")).count("asking for a requeue") == 2
    assert not (rd / "FAILED").exists()
