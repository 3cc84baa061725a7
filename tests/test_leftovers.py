"""The shared memory (/dev/shm) a killed process tree held: removed with it, unless another process holds it too.

A SIGKILLed ViZDoom engine left its screen buffer (10.6 MB) and two message queues in /dev/shm, in the node's RAM,
for ever: 47 objects on this machine after one session of killed benchmark measurements. Plain processes stand in
for the engine here (tests/rl/test_vizdoom.py has the real one)."""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import alive, own_shm

from hpcrl import leftovers
from hpcrl.leftovers import end_leftovers, kill_holding, remove_shared_memory, remove_unheld, shared_memory_of, stop_session
from hpcrl.rl.env_workers import kill_trees

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.path.isdir("/proc"), reason="needs /dev/shm and /proc")

HOLDER = """
import mmap, os, subprocess, sys, time
held = []
for spec in filter(None, sys.argv[1].split(",")):
    how, _, path = spec.partition(":")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    if how == "map":  # mapped, the descriptor closed (ViZDoom's engine)
        held.append(mmap.mmap(fd, 4096))
        os.close(fd)
    else:  # open, not mapped
        held.append(fd)
if len(sys.argv) > 2:  # a process under this one, holding its own
    below = subprocess.Popen([sys.executable, __file__, *sys.argv[2:]], stdout=subprocess.PIPE, text=True)
    assert below.stdout.readline() == "ready\\n"
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def shm() -> Iterator[Callable[[str], Path]]:
    """Names of this test's own /dev/shm files, removed after it whatever happened."""
    made: list[Path] = []

    def name(what: str) -> Path:
        made.append(Path(f"/dev/shm/hpcrl-test-{uuid.uuid4().hex[:12]}-{what}"))
        return made[-1]

    yield name
    for path in made:
        path.unlink(missing_ok=True)


@pytest.fixture
def own_dev_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory that stands for /dev/shm in this process's calls (leftovers.SHARED_MEMORY): every env worker's end
    removes the ViZDoom files that nobody holds, another test's too, and a test that counts what its own call removed
    must not share them."""
    own = tmp_path / "shm"
    own.mkdir()
    monkeypatch.setattr(leftovers, "SHARED_MEMORY", f"{own}/")
    return own


def hold(tmp_path: Path, *levels: str, session: bool = False) -> subprocess.Popen:
    """A process holding `levels[0]` ("map:PATH,fd:PATH"), over one holding `levels[1]`, and so on."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(script), *levels], stdout=subprocess.PIPE, text=True, start_new_session=session)
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    return holder


def test_a_killed_tree_takes_the_shared_memory_only_it_held(tmp_path: Path, shm: Callable[[str], Path]) -> None:
    """kill_trees (an env worker that timed out, died or was closed by force, with its engine under it): what the
    worker and the process under it mapped or held open goes; what the trainer holds too stays."""
    mapped, opened, below, shared = shm("mapped"), shm("opened"), shm("below"), shm("shared")
    shared.write_bytes(b"\0" * 4096)
    with open(shared, "rb"):  # this process, which is not killed, holds it too
        holder = hold(tmp_path, f"map:{mapped},fd:{opened},map:{shared}", f"map:{below}")
        kill_trees([holder.pid])
        assert holder.wait(5) == -9
        assert not mapped.exists() and not opened.exists() and not below.exists()
        assert shared.exists()


STUCK_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)  # held as a game's controller holds its queues
print("ready", flush=True)
while True:
    with open(sys.argv[2], "w") as f:  # blocks, uninterruptibly, once the file system is frozen
        f.write("x" * 100)
"""


@contextlib.contextmanager
def file_system_to_freeze(folder: Path) -> Iterator[Path]:
    """A small ext4 file system mounted at `folder` (a loop device), to be frozen with fsfreeze(8): thawed, unmounted
    and its image removed after, whatever happened. Skips the test where root, the tools or a loop device lack."""
    if os.geteuid() != 0 or not all(map(shutil.which, ("mkfs.ext4", "mount", "umount", "fsfreeze"))):
        pytest.skip("needs root, mkfs.ext4, mount and fsfreeze to stall a file system")
    image = folder.with_suffix(".img")
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    folder.mkdir()
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", str(image), str(folder)], capture_output=True).returncode == 0
    if not mounted:
        image.unlink()
        pytest.skip("no loop device to mount a file system image on here")
    try:
        yield folder
    finally:
        subprocess.run(["fsfreeze", "-u", str(folder)], capture_output=True)  # fails where not frozen: nothing to do
        subprocess.run(["umount", str(folder)], check=True)
        image.unlink()


@contextlib.contextmanager
def stuck_writer(tmp_path: Path, held: Path, fs: Path, session: bool = False) -> Iterator[subprocess.Popen]:
    """A process holding `held` open, stuck (state D) in a write to `fs`, frozen here; killed and reaped after."""
    script = tmp_path / "writer.py"
    script.write_text(STUCK_WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(held), str(fs / "out")], stdout=subprocess.PIPE, text=True, start_new_session=session)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        subprocess.run(["fsfreeze", "-f", str(fs)], check=True)
        deadline = time.monotonic() + 10
        while (stat := leftovers.process_stat(writer.pid)) is not None and stat.state != "D":
            assert time.monotonic() < deadline, f"the writer never blocked on the frozen file system: {stat}"
            time.sleep(0.01)
        yield writer
    finally:  # thawed first: a process in the frozen write dies no sooner
        subprocess.run(["fsfreeze", "-u", str(fs)], capture_output=True)
        writer.kill()
        writer.wait(10)


def test_a_process_killed_in_an_uninterruptible_wait_takes_its_shared_memory_once_it_is_gone(tmp_path: Path, shm: Callable[[str], Path]) -> None:
    """kill_holding on a process that cannot die at once: one stuck writing to a file system that stalls (an NFS
    home whose server is slow; a frozen ext4 here) dies when the write returns, 7 s later here. What it held goes
    then; with a 5 s wait for the killed to be gone, it stayed in /dev/shm for ever (as a killed benchmark
    measurement's game queues did under the full suite on 2 cores, most likely a worker that slow to die)."""
    held = shm("held")
    with file_system_to_freeze(tmp_path / "fs") as fs, stuck_writer(tmp_path, held, fs) as writer:
        thaw = threading.Timer(7.0, subprocess.run, (["fsfreeze", "-u", str(fs)],))
        thaw.start()
        try:
            assert kill_holding([writer.pid], stop_wait=0.5) == [str(held)]
        finally:
            thaw.join()
        assert writer.wait(5) == -signal.SIGKILL
        assert not held.exists()


def test_a_leftover_stuck_in_an_uninterruptible_wait_is_waited_for_and_its_shared_memory_goes(tmp_path: Path, shm: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """end_leftovers (a job's end) on a process deaf to SIGTERM and SIGKILL while its write to a stalled file system
    waits: it is waited for past the SIGTERM grace (1 s here) until it is gone, 4 s later, and what it held goes,
    named in the job log, where it was once reported "could not end" and its file left."""
    monkeypatch.setattr(leftovers, "LEFTOVER_GRACE_S", 1.0)
    held = shm("held")
    with file_system_to_freeze(tmp_path / "fs") as fs, stuck_writer(tmp_path, held, fs, session=True) as writer:
        thaw = threading.Timer(4.0, subprocess.run, (["fsfreeze", "-u", str(fs)],))
        thaw.start()
        log = io.StringIO()
        try:
            end_leftovers(writer.pid, log, "the program")
        finally:
            thaw.join()
        assert writer.wait(5) in (-signal.SIGTERM, -signal.SIGKILL)
        assert not held.exists()
        assert f"hpcrl: removed the shared memory they left: {held}" in log.getvalue(), log.getvalue()


def test_unheld_shared_memory_goes_only_by_its_makers_name_since_the_given_time(tmp_path: Path, own_dev_shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """remove_unheld (an env worker killed from outside, which alone held its game's message queues): the files
    named with the prefix, made since the given time, that no process holds go; one a live process holds, one of
    another maker's name, and all when the time given is later than they were made or when /proc shows no process, stay."""
    lost, other = own_dev_shm / "ViZDoomMQCtr-lost", own_dev_shm / "hpcrl-test-other"
    held_map, held_fd = own_dev_shm / "ViZDoomSM-map", own_dev_shm / "ViZDoomMQDoom-fd"
    try:
        lost.write_bytes(b"\0")
        other.write_bytes(b"\0")
        holder = hold(tmp_path, f"map:{held_map},fd:{held_fd}")
        try:
            assert remove_unheld(time.time() + 60) == []  # all made more than a second before that
            assert lost.exists()
            with monkeypatch.context() as without_proc:  # no holder can be seen: nothing goes
                without_proc.setattr(leftovers, "processes", list)
                assert remove_unheld(time.time() - 60) == []
            assert remove_unheld(time.time() - 60) == [str(lost)]
            assert held_map.exists() and held_fd.exists() and other.exists()
        finally:
            holder.kill()
            holder.wait(5)
    finally:
        for path in (lost, held_map, held_fd):
            path.unlink(missing_ok=True)


def test_the_leftovers_of_a_session_are_ended_with_their_shared_memory_named_in_the_log(tmp_path: Path, shm: Callable[[str], Path]) -> None:
    """end_leftovers (what a finished task or program left running in its session): their shared memory is removed
    once they are gone, and the job log names it."""
    mapped, below = shm("mapped"), shm("below")
    holder = hold(tmp_path, f"map:{mapped}", f"map:{below}", session=True)
    log = io.StringIO()
    end_leftovers(holder.pid, log, "the program")
    holder.wait(5)
    assert not mapped.exists() and not below.exists()
    assert f"hpcrl: removed the shared memory they left: {min(mapped, below)}, {max(mapped, below)}" in log.getvalue(), log.getvalue()


def test_the_leftovers_of_something_that_started_at_a_given_time_take_what_it_made_and_nobody_holds(own_dev_shm: Path) -> None:
    """end_leftovers with the start of what it ends (a task, a program): a game's queues, made since then and held by
    nobody (their one holder killed), go and are named in the log; without the start they stay."""
    lost = own_dev_shm / "ViZDoomMQCtr-lost"
    try:
        lost.write_bytes(b"\0")
        ended = subprocess.Popen(["true"], start_new_session=True)  # a session whose processes are all gone
        ended.wait()
        log = io.StringIO()
        end_leftovers(ended.pid, log, "the task")
        assert lost.exists() and log.getvalue() == ""
        end_leftovers(ended.pid, log, "the task", since=time.time() - 60)
        assert not lost.exists()
        assert log.getvalue() == f"hpcrl: removed the shared memory nobody held: {lost}\n"
    finally:
        lost.unlink(missing_ok=True)


MAKER = """
import mmap, os, signal, sys, time
if len(sys.argv) > 2:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to SIGTERM: ended by SIGKILL
kept = []
for i in range(100_000):  # a game engine in its start, without end: a new file of shared memory, mapped, every moment
    fd = os.open(f"{sys.argv[1]}-{i}", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    kept.append(mmap.mmap(fd, 4096))
    os.close(fd)
    if len(sys.argv) > 2:
        time.sleep(0.001)  # through a 5 s grace, short of the limits on files and maps
    if i == 20:
        print("ready", flush=True)
time.sleep(600)
"""


def test_a_session_killed_while_it_makes_shared_memory_leaves_none_of_it(tmp_path: Path) -> None:
    """A measurement's session SIGKILLed while its processes still make files in /dev/shm (benchmarks/vizdoom_speed.py,
    killed while its games started, left their screen buffers): stopped before its files are listed
    (`stop_session`), it makes none after the listing, so every one is removed once it is gone."""
    prefix = f"/dev/shm/hpcrl-test-{uuid.uuid4().hex[:12]}-made"
    script = tmp_path / "maker.py"
    script.write_text(MAKER)
    maker = subprocess.Popen([sys.executable, str(script), prefix], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert maker.stdout is not None and maker.stdout.readline() == "ready\n"
        stopped = stop_session(maker.pid)
        assert stopped == [maker.pid]
        held = shared_memory_of(stopped)
        os.killpg(maker.pid, signal.SIGKILL)
        assert maker.wait(5) == -9
        remove_shared_memory(held, stopped)
        made = glob.glob(f"{prefix}-*")
        assert len(held) > 20 and not made, f"{len(made)} of the files it made are left"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(maker.pid, signal.SIGKILL)
        for path in glob.glob(f"{prefix}-*"):
            os.unlink(path)


def test_leftovers_deaf_to_sigterm_and_making_shared_memory_leave_none_of_it(tmp_path: Path) -> None:
    """end_leftovers's SIGKILL, after a SIGTERM the process ignored while it went on making files in /dev/shm:
    it is stopped before the last listing of what it holds, so every file it made goes."""
    prefix = f"/dev/shm/hpcrl-test-{uuid.uuid4().hex[:12]}-deaf"
    script = tmp_path / "maker.py"
    script.write_text(MAKER)
    maker = subprocess.Popen([sys.executable, str(script), prefix, "deaf"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert maker.stdout is not None and maker.stdout.readline() == "ready\n"
        log = io.StringIO()
        end_leftovers(maker.pid, log, "the program")
        assert maker.wait(5) == -9
        assert "still running after SIGTERM, sent SIGKILL" in log.getvalue(), log.getvalue()
        made = glob.glob(f"{prefix}-*")
        assert not made, f"{len(made)} of the files it made are left"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(maker.pid, signal.SIGKILL)
        for path in glob.glob(f"{prefix}-*"):
            os.unlink(path)


SEMAPHORES = """
import multiprocessing, time
if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queues = [ctx.Queue() for _ in range(2)]  # 3 named semaphores each, registered with its resource tracker
    helper = ctx.Process(target=time.sleep, args=(600,))
    helper.start()  # the tracker is started and the semaphores shared, as Sample Factory's runner does
    print("ready", flush=True)
    time.sleep(600)
"""


def test_a_session_killed_whole_leaves_none_of_its_multiprocessing_semaphores(tmp_path: Path) -> None:
    """kill_holding on a session with multiprocessing's spawn-context queues (Sample Factory's measurement, killed
    at its timeout, left 3 sem.mp-* files each time): its resource tracker is spared the SIGKILL and unlinks them."""
    script = tmp_path / "semaphores.py"
    script.write_text(SEMAPHORES)
    before = set(glob.glob("/dev/shm/sem.mp-*"))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        made = set(glob.glob("/dev/shm/sem.mp-*")) - before
        members = stop_session(proc.pid)
        assert len(members) == 3 and len(made) >= 6, (members, made)  # it, its resource tracker, its helper
        kill_holding(members)
        assert proc.wait(5) == -9
        assert not [path for path in made if os.path.exists(path)], made
        assert not [pid for pid in members if alive(pid)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for path in set(glob.glob("/dev/shm/sem.mp-*")) - before:
            os.unlink(path)


JOB = """
"$3" -c 'import os, time; os.open("'"$1"'", os.O_RDWR | os.O_CREAT, 0o600); time.sleep(600)' &
echo "$!" > "$2"
while [ ! -e "$1" ]; do sleep 0.01; done
"$3" -m hpcrl end-leftovers --since "$4" --status 137
status=$?
kill -0 "$!" 2> /dev/null && simulator=alive || simulator=gone
echo "status $status, shell $$ alive, simulator $simulator"
"""
"""A job shell whose hpcrl was killed: what it started (a simulator holding $1) runs on, then its last step."""


def test_a_job_s_last_step_ends_what_its_killed_hpcrl_left_and_spares_the_job_shell(tmp_path: Path, shm: Callable[[str], Path]) -> None:
    """`hpcrl end-leftovers` in a job's session (no terminal): the processes left in the session end, named in the job
    log; what they held goes, and a game's file made since the job's start that nobody holds; the shell it runs under
    lives on and exits as it will."""
    prefix = own_shm(tmp_path / "shm")  # where it can: every env worker's end removes the ViZDoom files nobody holds
    here = tmp_path / "shm" if prefix else Path("/dev/shm")  # what the job sees as /dev/shm, as this test sees it
    held, lost, pid_file = shm("held").name, f"ViZDoomMQCtr{shm('').name}lost", tmp_path / "pid"
    try:
        (here / lost).write_bytes(b"\0")
        job = subprocess.run([*(prefix or []), "bash", "-c", JOB, "job", f"/dev/shm/{held}", str(pid_file), sys.executable, str(time.time() - 60)], capture_output=True, text=True, start_new_session=True, timeout=60)
        left = int(pid_file.read_text())
        assert re.search(r"status 0, shell \d+ alive, simulator gone\n$", job.stdout), job.stdout + job.stderr
        assert f"hpcrl: the job's hpcrl, killed (exit 137), left 1 process(es) running: pid {left} ({sys.executable} -c import os" in job.stdout, job.stdout
        assert f"hpcrl: removed the shared memory they left: /dev/shm/{held}\n" in job.stdout and f"hpcrl: removed the shared memory nobody held: /dev/shm/{lost}\n" in job.stdout
        assert not (here / held).exists() and not (here / lost).exists()
        assert (stat := leftovers.process_stat(left)) is None or not stat.live
    finally:
        (here / lost).unlink(missing_ok=True)
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_job_s_last_step_typed_in_a_terminal_ends_nothing(tmp_path: Path, shm: Callable[[str], Path]) -> None:
    """The same command in a person's session (one with a terminal: their shell, its background jobs, their editor)
    would end all of it: one line, exit 2, nothing ended."""
    import pty

    held, pid_file = shm("held"), tmp_path / "pid"
    pid, terminal = pty.fork()  # the child leads a session whose controlling terminal is this pty
    if pid == 0:
        os.execvp("bash", ["bash", "-c", JOB, "job", str(held), str(pid_file), sys.executable, str(time.time() - 60)])
    out = b""
    with contextlib.suppress(OSError):  # EIO once the child's side is closed
        while chunk := os.read(terminal, 4096):
            out += chunk
    os.waitpid(pid, 0)
    os.close(terminal)
    try:
        text = out.decode()
        assert "hpcrl: error: this session has a terminal: end-leftovers ends every process of a job's session" in text, text
        assert "status 2, shell" in text and "simulator alive" in text and "removed" not in text, text
        assert held.exists()
    finally:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


SLEEPER = "import os, sys, time; os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600) if len(sys.argv) > 1 else None; time.sleep(600)"


def test_the_step_after_a_failed_ranks_step_ends_every_process_carrying_its_mark_whatever_its_session(tmp_path: Path, shm: Callable[[str], Path]) -> None:
    """`hpcrl end-leftovers --mark M` (a Slurm job's step on each node after its ranks' srun failed) ends the processes
    whose environment has HPCRL_STEP_MARK=M: an orphan in a session of its own, as a killed rank's engine is, named in
    the log with what it held; not one whose mark differs (another start of the job, M's prefix), not one without,
    nor the shell it runs under, though that carries the mark."""
    mark = f"1234.0.{uuid.uuid4().hex[:8]}"
    held = shm("held")
    base = {k: v for k, v in os.environ.items() if k != leftovers.STEP_MARK}
    away = subprocess.Popen([sys.executable, "-c", SLEEPER, str(held)], env={**base, leftovers.STEP_MARK: mark}, start_new_session=True)
    spared = [
        subprocess.Popen([sys.executable, "-c", SLEEPER], env={**base, **extra}, start_new_session=True)
        for extra in ({leftovers.STEP_MARK: mark + "1"}, {leftovers.STEP_MARK: mark[:-1]}, {})
    ]
    try:
        deadline = time.monotonic() + 30
        while not held.exists():
            assert time.monotonic() < deadline, "the marked process did not start"
            time.sleep(0.01)
        step = subprocess.run(
            ["bash", "-c", '"$1" -m hpcrl end-leftovers --mark "$2" --since "$3" --status 137; echo "status $?, shell alive"', "step", sys.executable, mark, str(time.time())],
            env={**base, leftovers.STEP_MARK: mark}, capture_output=True, text=True, start_new_session=True, timeout=60,
        )  # fmt: skip
        assert step.stdout.endswith("status 0, shell alive\n"), step.stdout + step.stderr
        assert f"hpcrl: the job's ranks (srun, exit 137) left 1 process(es) running: pid {away.pid} ({sys.executable} -c import os" in step.stdout, step.stdout
        assert f"hpcrl: removed the shared memory they left: {held}\n" in step.stdout and not held.exists(), step.stdout
        assert away.wait(10) == -signal.SIGTERM
        assert all(proc.poll() is None for proc in spared)
    finally:
        for proc in (away, *spared):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mark", ["", "1234.0\nHOME=/root"])
def test_a_step_mark_that_names_no_start_ends_nothing(mark: str) -> None:
    """An empty mark would match every process that has the variable set empty; one with a line break is no start's."""
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "end-leftovers", "--mark", mark, "--since", "0", "--status", "137"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1 and "not a step mark" in proc.stderr, proc.stderr
