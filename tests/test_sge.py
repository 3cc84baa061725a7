"""Grid Engine's own time limit: a run longer than one job's h_rt goes on in the next lifetime.

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

from hpcrl.config import load_experiment
from hpcrl.pipeline import submit_experiment
from hpcrl.status import cancel_experiment, experiment_status
from hpcrl.sweep import load_runs, run_dir

CONFIG = Path(__file__).resolve().parent / "data" / "conformance.yaml"


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
