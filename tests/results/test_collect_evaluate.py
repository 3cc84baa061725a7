"""`hpcrl collect --evaluate`: the trained runs with no evaluation yet are evaluated on this machine, in parallel
processes, before the results are gathered; and those processes end with collect, however collect ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import write_config

from hpcrl.leftovers import process_stat, processes
from hpcrl.store import rundir

pytestmark = pytest.mark.e2e

SLOW_RESET = '''
import os, time
import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv


class SlowReset(CartPoleEnv):
    """CartPole whose reset waits ten minutes where SLOW_RESET is set: an evaluation that takes its time."""

    def reset(self, **kwargs):
        if os.environ.get("SLOW_RESET"):
            time.sleep(600)
        return super().reset(**kwargs)


gymnasium.register("SlowReset-v0", entry_point=SlowReset, max_episode_steps=500)
'''


def _trained_not_evaluated(tmp_path: Path) -> Path:
    """A finished sweep of two runs whose evaluations are then removed: trained runs with no evaluation yet."""
    (tmp_path / "slowenvs.py").write_text(SLOW_RESET)
    config = write_config(tmp_path, {"env": {"id": "slowenvs:SlowReset-v0"}})
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    swept = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    exp = tmp_path / "logs" / "tiny"
    runs = sorted((exp / "runs").iterdir())
    assert len(runs) == 2 and all(rundir.eval_state(rd) == rundir.State.DONE for rd in runs)
    for rd in runs:
        (rd / rundir.EVAL_DONE).unlink()
    return exp


def _evaluations(exp: Path) -> list[int]:
    """Live `hpcrl eval <exp> ...` processes."""
    found = []
    for pid in processes():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if argv[1:4] == ["-m", "hpcrl", "eval"] and str(exp) in argv and (stat := process_stat(pid)) is not None and stat.live:
                found.append(pid)
    return found


def test_collect_evaluates_the_trained_runs_without_an_evaluation_then_gathers_them(tmp_path: Path) -> None:
    exp = _trained_not_evaluated(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "hpcrl", "collect", str(exp), "--evaluate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "evaluating 2 runs with 2 processes" in done.stdout and "2/2 evaluated" in done.stdout, done.stdout
    assert all(rundir.eval_state(rd) == rundir.State.DONE for rd in (exp / "runs").iterdir())
    summary = (exp / "results" / "summary.csv").read_text().splitlines()
    assert len(summary) == 2 and summary[1].split(",")[summary[0].split(",").index("n")] == "2", summary


def test_evaluations_end_with_a_collect_killed_with_9(tmp_path: Path) -> None:
    """They were started as plain children: `kill -9` of collect (or of the shell script that ran it) left them
    running to their end, unseen."""
    exp = _trained_not_evaluated(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SLOW_RESET": "1"}
    collect = subprocess.Popen([sys.executable, "-m", "hpcrl", "collect", str(exp), "--evaluate"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(started := _evaluations(exp)) < 2:
            assert collect.poll() is None and time.monotonic() < deadline, "no evaluation started"
            time.sleep(0.1)
        collect.kill()
        collect.wait(5)
        deadline = time.monotonic() + 10
        while _evaluations(exp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _evaluations(exp), f"evaluations {_evaluations(exp)} outlived collect"
    finally:
        collect.kill()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
