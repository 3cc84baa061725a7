"""The watch over an env worker's process group (hpcrl.runtime.group_watch): the worker killed, however, takes what
it started with it (ViZDoom's engines; here a stand-in holding a file in /dev/shm), the files nobody holds, and the
worker's own temporary directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import own_shm

from hpcrl.leftovers import process_stat, processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc") or not hasattr(os, "fork"), reason="needs /proc and fork")

LEADER = """
import os, subprocess, sys, time
os.setpgid(0, 0)  # as an env worker does first
from hpcrl.runtime.group_watch import watch_own_group
to_trainer = os.pipe()  # an env worker's pipe to its trainer, opened before the watch
release = watch_own_group(sys.argv[3])
shm, end = sys.argv[1], sys.argv[2]
with open(os.path.join(sys.argv[3], "_vizdoom.ini"), "w"):  # a game's file in the worker's own directory
    pass
member = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); print(flush=True); time.sleep(600)", shm + "/hpcrl-test-held"], stdout=subprocess.PIPE)
member.stdout.readline()  # holding its file
with open(shm + "/ViZDoomMQCtr-hpcrl-test-lost", "w"):  # a game's queue only this process held
    pass
forked = os.fork()  # a helper an env forks without exec: it holds a copy of every descriptor the leader had
if forked == 0:
    time.sleep(600)
    os._exit(0)
released = "-"
if end.startswith("release"):  # a normal end: the game closed, then the watcher let go
    member.kill()
    member.wait()
    if end == "release-stopped":  # a watcher that cannot finish (stopped): the leader's wait is bounded
        import signal, hpcrl.runtime.group_watch as group_watch
        group_watch.RELEASE_WAIT_S = 0.5
        watcher = int(open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()[0])
        os.kill(watcher, signal.SIGSTOP)
    began = time.monotonic()
    release()
    released = f"{time.monotonic() - began:.2f}"
print(member.pid, forked, released, flush=True)
time.sleep(600)
"""


def _group(leader: int) -> list[int]:
    return [pid for pid in processes() if pid != leader and (stat := process_stat(pid)) is not None and stat.live and stat.group == leader]


def _start(tmp_path: Path, end: str) -> tuple[subprocess.Popen, int, int, Path, list[int], str]:
    """The leader (in a /dev/shm of its own where it can: another test's end may remove the files nobody holds), the
    pids of what it started and of what it forked, the /dev/shm it sees (as this test sees it), the other members of
    its group, and how long its release took (seconds; "-" where it was not released). Its own directory is
    tmp_path / "own"."""
    (tmp_path / "leader.py").write_text(LEADER)
    (tmp_path / "own").mkdir()
    shm = tmp_path / "shm"
    prefix = own_shm(shm)
    seen = shm if prefix else Path("/dev/shm")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    leader = subprocess.Popen([*(prefix or []), sys.executable, str(tmp_path / "leader.py"), "/dev/shm" if prefix else str(seen), end, str(tmp_path / "own")], stdout=subprocess.PIPE, text=True, env=env)
    assert leader.stdout is not None
    member, forked, released = leader.stdout.readline().split()
    return leader, int(member), int(forked), seen, _group(leader.pid), released


def _gone(pid: int) -> bool:
    return (stat := process_stat(pid)) is None or not stat.live


def test_a_leader_killed_takes_its_group_and_the_files_they_held_and_nobody_holds(tmp_path: Path) -> None:
    """SIGKILL, as the OOM killer or a killed trainer's death signal sends it: no cleanup runs in the leader, and what
    it started ran on for ever, reparented to init."""
    leader, member, forked, shm, members, _ = _start(tmp_path, "kill")
    try:
        assert (shm / "hpcrl-test-held").exists() and (shm / "ViZDoomMQCtr-hpcrl-test-lost").exists()
        assert len(members) == 3 and {member, forked} < set(members)  # what it started and forked, and the watcher
        (watcher,) = set(members) - {member, forked}
        held = [os.readlink(f"/proc/{watcher}/fd/{fd}") for fd in os.listdir(f"/proc/{watcher}/fd") if int(fd) > 2]
        assert held == [], held  # nothing of the leader's (an env worker's pipe to its trainer)
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait(5)
        deadline = time.monotonic() + 10
        while not all(map(_gone, members)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(map(_gone, members)), [pid for pid in members if not _gone(pid)]
        assert sorted(p.name for p in shm.iterdir() if p.name.startswith(("hpcrl-test", "ViZDoom"))) == []
        assert not (tmp_path / "own").exists()  # removed by the watcher, the last of the group to go
    finally:
        for pid in [leader.pid, *members, *_group(leader.pid)]:  # what the watch failed to end, after the test has looked
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("end", ["release", "release-stopped"])
def test_a_leader_that_ends_normally_waits_for_its_watcher_and_is_left_alone(tmp_path: Path, end: str) -> None:
    """The worker's close: its games closed, it wakes the watcher and waits for it, which ends nothing of its own
    (the leader lives on) but what it left in its group (a helper its env forked without exec: it held a copy of the
    pipe whose end of file used to wake the watcher, and a close waited out its 15 s bound); the file a game left that
    nobody holds goes. A watcher that does not finish (stopped) is waited for within a bound, then killed."""
    leader, member, forked, shm, members, released = _start(tmp_path, end)
    try:
        assert float(released) < 5 if end == "release" else 0.5 <= float(released) < 5, released
        if end == "release-stopped":
            return  # the watcher was killed before it could remove anything
        assert _gone(member) and _gone(forked) and members == []  # the watcher waited for before the leader said so
        assert (stat := process_stat(leader.pid)) is not None and stat.live
        assert sorted(p.name for p in shm.iterdir() if p.name.startswith("ViZDoom")) == []
        assert not (tmp_path / "own").exists()
    finally:
        for pid in [leader.pid, *members, forked, *_group(leader.pid)]:  # a killed watcher ended nothing
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        leader.wait(5)
