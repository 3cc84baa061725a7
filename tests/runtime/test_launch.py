"""The single-host rank launcher (hpcrl.runtime.launch): its ranks never outlive it, however it dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import alive

REPO = Path(__file__).resolve().parents[2]
RANK = "import os, sys, time; open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(str(os.getpid())); time.sleep(600)"
LAUNCHER = "import sys; from hpcrl.runtime.launch import launch; launch([sys.executable, '-c', sys.argv[1], sys.argv[2]], 2, None)"


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


ORPHANING_RANK = """
import os, subprocess, sys, time
# As a simulator's engine: a process of its own, in a session of its own (no group or session holds it).
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").write(f"{os.getpid()} {helper.pid}")
time.sleep(600)
"""


@pytest.mark.e2e
def test_what_a_rank_killed_alone_left_goes_when_the_launcher_ends_the_run(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed (an OOM kill): its helper, in a session of its own, is orphaned. The launcher stops rank 0
    and ends every process that carries the ranks' mark, both ranks' helpers, named in its log; the launcher's
    caller, whose session (a person's terminal, a CI runner's step) is none of the run's, is spared."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # this session's, unmarked
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, ORPHANING_RANK, str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started: list[list[int]] = []
    try:
        deadline = time.monotonic() + 60
        while len(started) < 2:
            assert time.monotonic() < deadline and launcher.poll() is None, "the ranks never started"
            started = [words for p in tmp_path.iterdir() if len(words := [int(x) for x in p.read_text().split()]) == 2]
            time.sleep(0.05)
        ranks, helpers = [r for r, _ in started], [h for _, h in started]
        os.kill(int((tmp_path / "1").read_text().split()[0]), signal.SIGKILL)
        printed, _ = launcher.communicate(timeout=60)
        left = [pid for pid in ranks + helpers if alive(pid)]
        assert bystander.poll() is None, "a process of the caller's session was ended"
    finally:
        for pid in [pid for pair in started for pid in pair]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        bystander.kill()
        launcher.kill()
    assert not left, printed
    assert "rank 1 of 2 was killed by SIGKILL; the other ranks were stopped" in printed, printed
    assert "hpcrl: the run's ranks (exit 1) left 2 process(es) running: " in printed and all(f"pid {pid} (" in printed for pid in helpers), printed


@pytest.mark.e2e
def test_a_group_launcher_ends_what_its_rank_killed_alone_left_on_its_host(tmp_path: Path) -> None:
    """The ranks on another host of a Grid Engine run (`python -m hpcrl.runtime.launch FIRST COUNT -- ...`, under
    `qrsh -inherit`): what its killed rank left goes when the group ends, named in its log, since the launcher on
    the first host cannot see this host's processes. The group itself, which received the mark under another
    name (HPCRL_GROUP_MARK), does not carry it: it is not what its ranks left."""
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MASTER_ADDR": "192.0.2.1", "HPCRL_GROUP_MARK": f"group-{os.getpid()}",  # not loopback: a launcher's host
    }  # fmt: skip
    group = subprocess.Popen([sys.executable, "-m", "hpcrl.runtime.launch", "1", "1", "--", sys.executable, "-c", ORPHANING_RANK, str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    started: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(started) < 2:
            assert time.monotonic() < deadline and group.poll() is None, "the rank never started"
            started = [int(x) for x in (tmp_path / "1").read_text().split()] if (tmp_path / "1").exists() else []
            time.sleep(0.05)
        os.kill(started[0], signal.SIGKILL)
        printed, _ = group.communicate(timeout=60)
        left = [pid for pid in started if alive(pid)]
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        group.kill()
    assert group.returncode == 1 and not left, printed
    assert f"hpcrl: the ranks 1-1 on {socket.gethostname()} (exit 1) left 1 process(es) running: pid {started[1]} (" in printed, printed
