"""What the multi-node tiers of both schedulers share: checks of tests/clusters' own scripts (slurm.sh, sge.sh),
and of a run resumed after a partition."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import NODES as SUITE
from test_conformance import csv_rows, wait_until

from hpcrl.store import rundir

SLURM_NODES = [f"slurm-node{i}" for i in range(1, int(SUITE["SLURM_NODES"]) + 1)]
"""Every node of partition `multi` the suite's Slurm cluster runs with: a job there may land on any of them."""
SGE_HOSTS = [f"sge-host{i}" for i in range(1, int(SUITE["SGE_HOSTS"]) + 1)]
"""Every execution host of queue multi.q the suite's Grid Engine cluster runs with."""


def start_beside_a_killed_node(script: Path, node: str, *, kill: str, revive: str, start: list[str]) -> None:
    """The suite's session `start` runs in a pytest beside the multi-node tier. CI saw it start a daemon on a node
    a test had killed while the test's revive started another (`can't bind socket`: every test of that scheduler
    in the suite errored). `start` must leave a killed node as it is (the test is timing its loss), and a revive
    racing two starts must bring the node back with every command succeeding."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=200)

    def pids() -> list[str]:
        return subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout.split()

    assert run(kill, node).returncode == 0
    wait_until("the killed node's processes to go", lambda: not pids(), 10)
    started = run("start", *start)
    assert started.returncode == 0 and "already running" in started.stdout, started.stdout + started.stderr
    assert not pids(), "start brought the killed node's daemon back"
    reviving = subprocess.Popen(["bash", str(script), revive, node], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    starts = [run("start", *start) for _ in range(2)]
    assert reviving.wait(timeout=200) == 0, reviving.stdout.read()
    assert all(p.returncode == 0 for p in starts), [p.stdout + p.stderr for p in starts]


def assert_resumed_to_its_budget(rd: Path, learner_log: str, total: int) -> None:
    """A distributed run that a partition stopped and a later sweep resumed: it resumed from a checkpoint past
    step 0, trained exactly its budget, and its train.csv has one writer's rows (in order)."""
    assert re.search(r"resumed from step [1-9]\d* ", learner_log), learner_log
    assert int(rundir.done_step(rd) or 0) == total
    steps = [int(r["step"]) for r in csv_rows(rd / rundir.TRAIN_LOG)]
    assert steps == sorted(steps), "two writers' rows interleaved in train.csv"
