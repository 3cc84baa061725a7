"""A sweep bounds its wait on a cluster controller that does not answer (issue 37, the unit tier): where
Slurm is installed and its controller is down, sinfo took 9 s to fail and a dry run asked twice (18.6 s).
A sweep-time probe waits PROBE_TIMEOUT_S, says so in one line, and asks nothing more of that controller."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.schedulers import base
from hpcrl.schedulers.base import SchedulerError
from hpcrl.schedulers.sge import SGEScheduler
from hpcrl.schedulers.slurm import DEFAULT_MAX_ARRAY_SIZE, SlurmScheduler
from hpcrl.submit.jobplan import node_requests


def hanging_tools(directory: Path, calls: Path, *tools: str) -> None:
    """Stand-ins that record their call and then wait (far longer than any probe may)."""
    directory.mkdir()
    for tool in tools:
        (directory / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexec sleep 60\n')
        (directory / tool).chmod(0o755)


@pytest.mark.parametrize(("scheduler", "tools", "default"), [
    (SlurmScheduler, ("sinfo", "scontrol", "sbatch"), DEFAULT_MAX_ARRAY_SIZE - 1),
    (SGEScheduler, ("qstat", "qconf", "qsub"), 75000),
])  # fmt: skip
def test_a_controller_that_does_not_answer_is_waited_for_once_and_named_in_one_line(
    scheduler: type, tools: tuple[str, ...], default: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    calls = tmp_path / "calls"
    hanging_tools(tmp_path / "bin", calls, *tools)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(base, "PROBE_TIMEOUT_S", 0.5)
    exp = load_experiment(write_config(tmp_path, {"resources": {"gpus": 1}}))
    backend = scheduler()
    began = time.monotonic()
    assert backend.refuse(exp, node_requests(exp)) is None  # unchecked, not refused
    assert backend.max_array_size() == default
    with pytest.raises(SchedulerError, match="not run: .*no answer within 0.5 s.*controller is not answering"):
        backend.submit(tmp_path / "train.sh", 1, [])
    assert time.monotonic() - began < 3
    assert [line.split()[0] for line in calls.read_text().splitlines()] == [tools[0]]  # one question, not one per check
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hpcrl: {tools[0]} ") and "no answer within 0.5 s" in err
