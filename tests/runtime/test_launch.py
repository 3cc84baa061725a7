"""The single-host rank launcher (hpcrl.runtime.launch): its ranks never outlive it, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RANK = "import os, sys, time; open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(str(os.getpid())); time.sleep(600)"
LAUNCHER = "import sys; from hpcrl.runtime.launch import launch; launch([sys.executable, '-c', sys.argv[1], sys.argv[2]], 2, None)"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.e2e
def test_ranks_die_with_a_launcher_killed_alone(tmp_path: Path) -> None:
    """The launcher SIGKILLed by itself (an OOM kill): both ranks are gone within seconds (before,
    they lived on without their rendezvous store, as long as they ran)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, RANK, str(tmp_path)], env=env)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
            pids = [int(p.read_text()) for p in tmp_path.iterdir() if p.read_text()]
            time.sleep(0.05)
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in pids if alive(pid)]
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left
