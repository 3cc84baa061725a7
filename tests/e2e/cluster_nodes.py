"""What the multi-node tiers of both schedulers check of tests/clusters' own scripts (slurm.sh, sge.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_conformance import wait_until


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
