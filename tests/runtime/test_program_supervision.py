"""How `hpcrl train` supervises a user's program (issue 25), driven by hand the way a job script drives it:

- the run ends when the program ends, whatever it left running (a `cmd &`, a logging service, DataLoader
  workers hold the output pipe): those are ended, SIGTERM then SIGKILL, and named in the job log;
- output without newlines (a tqdm bar) reaches the logs as it comes, and what a FAILED marker keeps of it
  is bounded;
- warnings sent to every process of the job (Grid Engine's USR1, and USR2 after a reschedule) reach the
  program only as its stop signal, once, from hpcrl; repeated warnings while hpcrl exits do not turn its
  requeue into a death by signal;
- a run that asks for a requeue again and again without progress is failed instead of requeued forever.

Every run is bounded: a supervisor that hangs fails its test within seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from factories import alive
from test_program_wrapper import ENV, experiment, start, the_run, wait_for

from hpcrl.status import experiment_status
from hpcrl.store import rundir, runlock
from hpcrl.store.expdir import load_runs, run_dir

LEAVER = r"""
import subprocess, sys, time
from pathlib import Path
stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('stubborn up', flush=True); time.sleep(3600)"])
sleeper = subprocess.Popen(["sleep", "3600"])  # inherits the output pipe, as `cmd &` does
Path(sys.argv[1]).write_text(f"{stubborn.pid} {sleeper.pid}")
time.sleep(1)  # the stubborn child has set its handler by now
print("trained", flush=True)
"""

BAR = r"""
import sys, time
from pathlib import Path
go = Path(sys.argv[1])
sys.stdout.write("\r 50%|#####     | 5/10")
sys.stdout.flush()
deadline = time.time() + 30
while not go.exists() and time.time() < deadline:
    time.sleep(0.05)
for i in range(300000):  # 12 MB of one line, as a tqdm bar writes it
    sys.stdout.write(f"\r{i:>7}/300000 [00:01<00:00, 1000.00it/s]")
sys.stdout.write("\n")
sys.stdout.flush()
sys.exit("RuntimeError: diverged at the last step")
"""


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """The supervisor's output once it exits; one that is still running after `timeout` fails the test."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hpcrl train still running after {timeout:g} s:\n{out}{err}")


# ------------------------------------------------------------------------------------ what the program leaves


@pytest.mark.e2e
def test_the_run_ends_when_the_program_ends_and_what_it_left_is_ended_and_named(tmp_path: Path) -> None:
    (tmp_path / "leaver.py").write_text(LEAVER)
    pids_file = tmp_path / "pids"
    root = experiment(tmp_path, "done", command=[sys.executable, str(tmp_path / "leaver.py"), str(pids_file)], args=[])
    proc = start(root)
    try:
        out, err = finish(proc, timeout=40)
    finally:
        for pid in (pids_file.read_text().split() if pids_file.exists() else []):
            if alive(int(pid)):
                os.kill(int(pid), signal.SIGKILL)
    stubborn, sleeper = (int(p) for p in pids_file.read_text().split())
    assert proc.returncode == 0, out + err
    assert rundir.is_done(the_run(root))
    assert f"pid {sleeper} (sleep 3600)" in out and f"pid {stubborn} (" in out, out  # named in the job log
    assert f"sent SIGKILL: pid {stubborn}" in out, out  # it ignored SIGTERM
    assert not alive(stubborn) and not alive(sleeper)
    assert "trained" in (the_run(root) / rundir.PROGRAM_LOG).read_text()


WRITER = r"""
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))
while True:  # a trainer that keeps writing the run
    with open(sys.argv[2], "a") as f:
        f.write("row\n")
    time.sleep(0.05)
"""


def supervised(proc: subprocess.Popen, pid_file: Path, rows: Path) -> tuple[int, int, int]:
    """Once the trainer wrote a row: its pid, and the keeper's and deputy's below hpcrl's `proc`."""
    wait_for(rows, "row")
    (keeper,) = children(proc.pid)
    (deputy,) = children(keeper)
    return int(pid_file.read_text()), keeper, deputy


def gone_within(pid: int, seconds: float, check: Callable[[], None] = lambda: None) -> bool:
    """Whether `pid` ends within `seconds`; `check` runs at each look while it lives."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        check()
        time.sleep(0.02)
    return not alive(pid)


def wrapped_trainer(tmp_path: Path, trainer_line: str) -> tuple[Path, Path, Path]:
    """An experiment whose program is a shell wrapper that runs `trainer_line` (WRITER, not exec'd); its
    experiment root, the trainer's pid file and the rows file it writes."""
    (tmp_path / "writer.py").write_text(WRITER)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(f"#!/bin/sh\n{trainer_line}\necho wrapper done\n")
    wrapper.chmod(0o755)
    pid_file, rows = tmp_path / "trainer.pid", tmp_path / "rows"
    return experiment(tmp_path, "done", command=[str(wrapper), str(pid_file), str(rows)], args=[]), pid_file, rows


@pytest.mark.e2e
def test_a_trainer_under_a_wrapper_that_does_not_exec_it_dies_with_hpcrl_however_hpcrl_dies(tmp_path: Path) -> None:
    """A shell wrapper forks the trainer (no `exec`), so the trainer is hpcrl's grandchild, out of
    reach of a death signal set on hpcrl's own child. hpcrl is SIGKILLed alone (an OOM kill, the
    local executor's cancel after its grace): the trainer is gone within seconds, and while it
    still runs the run's lock is held, so that no second trainer could start on its checkpoints.
    (Before, it kept writing the run for as long as it lived.)"""
    root, pid_file, rows = wrapped_trainer(tmp_path, f"{sys.executable} {tmp_path / 'writer.py'} \"$@\"")
    proc = start(root)
    try:
        wait_for(rows, "row")  # written after its pid
        trainer = int(pid_file.read_text())
        os.kill(proc.pid, signal.SIGKILL)  # hpcrl alone, not its process group
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while alive(trainer) and time.monotonic() < deadline:
            assert runlock.lock_holder(the_run(root)) is not None, "the trainer runs on while its run is unlocked"
            time.sleep(0.02)
        assert not alive(trainer), "the trainer outlived hpcrl by 10 s"
    finally:
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    size = rows.stat().st_size
    time.sleep(0.3)
    assert rows.stat().st_size == size  # nothing writes the run any more
    assert runlock.lock_holder(the_run(root)) is None  # a re-sweep may start the run again


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            except (OSError, IndexError):
                continue
            if int(ppid) == pid and state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("killed", ["keeper and hpcrl", "keeper, trainer in a session of its own", "keeper, trainer a daemon", "deputy"])
def test_a_trainer_below_a_wrapper_dies_when_its_keeper_is_killed_whoever_else_is(tmp_path: Path, killed: str) -> None:
    """The keeper (hpcrl.runtime.keeper) is a subreaper, and a subreaper guards what is below it only
    while it lives: SIGKILLed together with hpcrl, its orphans went to init, and a trainer forked by a
    wrapper that does not `exec` it (the wrapper died of its death signal, the trainer had none) kept
    writing the run, unlocked. Alone, it left a trainer that started a session of its own out of
    reach of hpcrl, which ends the keeper's session only. Now the keeper's deputy ends them; and when the
    deputy is killed, the keeper does. Within 5 s, and the run is unlocked only once nothing writes it."""
    own_session = "setsid " if "session" in killed else ""
    trainer_line = f"{own_session}{sys.executable} {tmp_path / 'writer.py'} \"$@\""
    if "daemon" in killed:  # forked twice into a session of its own, its parent gone: whoever adopts it must end it
        trainer_line = f"( setsid {trainer_line} & )\nsleep 60"
    root, pid_file, rows = wrapped_trainer(tmp_path, trainer_line)
    proc = start(root)
    try:
        trainer, keeper, deputy = supervised(proc, pid_file, rows)
        targets = {"keeper and hpcrl": [keeper, proc.pid], "deputy": [deputy]}.get(killed, [keeper])
        for pid in targets:
            os.kill(pid, signal.SIGKILL)
        def locked() -> None:
            assert runlock.lock_holder(the_run(root)) is not None, "the trainer runs on while its run is unlocked"

        assert gone_within(trainer, 5, locked), f"the trainer outlived its keeper ({killed} SIGKILLed) by 5 s"
        proc.communicate(timeout=30)
    finally:
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    size = rows.stat().st_size
    time.sleep(0.2)
    assert rows.stat().st_size == size  # nothing writes the run any more
    assert runlock.lock_holder(the_run(root)) is None


def test_the_program_itself_dies_of_its_death_signal_when_every_process_of_hpcrl_is_killed_at_once(tmp_path: Path) -> None:
    """hpcrl, the keeper and its deputy SIGKILLed at the same moment: no one is left to sweep, and the
    program (exec'd, the deputy's child) still dies, of the death signal it was started with."""
    (tmp_path / "writer.py").write_text(WRITER)
    pid_file, rows = tmp_path / "trainer.pid", tmp_path / "rows"
    root = experiment(tmp_path, "done", command=[sys.executable, str(tmp_path / "writer.py"), str(pid_file), str(rows)], args=[])
    proc = start(root)
    try:
        trainer, keeper, deputy = supervised(proc, pid_file, rows)
        for pid in (deputy, keeper, proc.pid):
            os.kill(pid, signal.SIGKILL)
        assert gone_within(trainer, 5), "the program outlived every process of hpcrl by 5 s"
    finally:
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        proc.communicate(timeout=30)


# ------------------------------------------------------------------------------------ output without newlines


def test_a_progress_bar_reaches_the_log_as_it_comes_and_the_failed_marker_keeps_its_last_state(tmp_path: Path) -> None:
    (tmp_path / "bar.py").write_text(BAR)
    go = tmp_path / "go"
    root = experiment(tmp_path, "done", command=[sys.executable, str(tmp_path / "bar.py"), str(go)], args=[])
    rd = run_dir(root, load_runs(root)[0].run_id)
    proc = start(root)
    try:
        wait_for(rd / rundir.PROGRAM_LOG, "5/10", timeout=15)  # no newline yet: read in chunks, not lines
    finally:
        go.write_text("")
    out, err = finish(proc, timeout=60)
    assert proc.returncode == 1, err
    assert rundir.first_line(rd, rundir.FAILED) == "program exited with 1: RuntimeError: diverged at the last step"
    failed = (rd / rundir.FAILED).read_text()
    assert " 299999/300000 [00:01<00:00, 1000.00it/s]" in failed and " 299998/300000" not in failed  # the bar's last state only
    assert len(failed) < 25_000, len(failed)  # 12 MB of output, a bounded marker
    assert (rd / rundir.PROGRAM_LOG).stat().st_size > 12_000_000  # the whole output is kept in the log


# ------------------------------------------------------------------------------------ warnings to the whole job


@pytest.mark.parametrize("warning", ["USR1", "USR2"])
def test_a_warning_to_every_process_of_the_job_reaches_the_program_once_as_its_stop_signal(tmp_path: Path, warning: str) -> None:
    # Grid Engine signals the job's whole process group: USR1 at s_rt or before a suspend (-notify),
    # USR2 at s_rt after a reschedule. The program (stop_signal TERM) must get TERM, from hpcrl, once.
    root = experiment(tmp_path, "linger", stop_signal="TERM")  # takes 0.5 s to stop: a stop passed on again would be seen
    proc = start(root)  # its own process group, as a job's
    wait_for(tmp_path / "notes", "ready")
    for _ in range(3):  # and again: hpcrl passes a stop on once
        os.killpg(proc.pid, getattr(signal, f"SIG{warning}"))
        time.sleep(0.1)
    out, err = finish(proc, timeout=60)
    assert proc.returncode == 99, out + err
    notes = (tmp_path / "notes").read_text()
    assert [line for line in notes.splitlines() if line.startswith("got")] == ["got SIGTERM"], notes
    assert "asking for a requeue" in out
    assert not rundir.is_failed(the_run(root))


@pytest.mark.e2e
def test_repeated_warnings_while_hpcrl_exits_leave_the_requeue_code(tmp_path: Path) -> None:
    # `scancel --signal=USR1 --batch` repeats the warning every few seconds, Grid Engine sends USR1 then
    # USR2: one that arrives while the interpreter shuts down (default handlers back) must not kill it.
    for attempt in range(3):
        here = tmp_path / str(attempt)
        here.mkdir()
        proc = start(experiment(here, "stop", stop_signal="TERM"))
        wait_for(here / "notes", "ready")
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                break
            time.sleep(0.001)
        out, err = finish(proc, timeout=10)
        assert proc.returncode == 99, f"attempt {attempt}: {proc.returncode}\n{out}{err}"


# ------------------------------------------------------------------------------------ the requeue cap


@pytest.mark.e2e
def test_a_program_that_always_asks_for_a_requeue_is_failed_after_the_cap(tmp_path: Path) -> None:
    root = experiment(tmp_path, "done", command=[sys.executable, "-c", "import sys; print('not today'); sys.exit(99)"], args=[], resume_args=[])
    codes = [subprocess.run([sys.executable, "-m", "hpcrl", "train", str(root), "--task", "0"], env=ENV, capture_output=True, text=True, timeout=60) for _ in range(3)]
    assert [c.returncode for c in codes] == [99, 99, 1], [c.stdout + c.stderr for c in codes]
    rd = the_run(root)
    reason = rundir.first_line(rd, rundir.FAILED)
    assert reason.startswith("asked for a requeue 3 times in a row without progress") and "resources.max_stalled_requeues: 3" in reason, reason
    assert codes[-1].stderr.count("\n") == 1, codes[-1].stderr  # one line, no traceback
    rows, _, _ = experiment_status(root)
    assert rows[0].train == "failed" and rows[0].note.startswith("train failed: asked for a requeue 3 times")


@pytest.mark.e2e
def test_a_program_that_checkpoints_before_each_requeue_is_never_capped(tmp_path: Path) -> None:
    # A long run preempted often: each lifetime writes something new, so the count starts again each time.
    script = "import os, sys, time; d = os.environ['HPCRL_CHECKPOINT_DIR']; open(os.path.join(d, 'ckpt-%d' % time.time_ns()), 'w').close(); sys.exit(99)"
    root = experiment(tmp_path, "done", command=[sys.executable, "-c", script], args=[], resume_args=[])
    codes = [subprocess.run([sys.executable, "-m", "hpcrl", "train", str(root), "--task", "0"], env=ENV, capture_output=True, text=True, timeout=60).returncode for _ in range(3)]
    assert codes == [99] * 3
    assert not rundir.is_failed(the_run(root))


# ------------------------------------------------------------------------------------ a job killed after its warning


def test_a_program_killed_at_the_time_limit_says_it_was_warned_and_what_it_was_sent(tmp_path: Path) -> None:
    # The time limit: the warning (USR1) reaches hpcrl, the program ignores its stop signal, and the
    # scheduler then SIGKILLs the whole job. Nothing can write FAILED; the run's `starts` says what happened,
    # where `train failed: no reason recorded` was all status had.
    root = experiment(tmp_path, "ignore", stop_signal="TERM")
    proc = start(root)
    wait_for(tmp_path / "notes", "ready")
    proc.send_signal(signal.SIGUSR1)
    rd = the_run(root)
    wait_for(rd / "starts", "passed ", timeout=30)
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert "warning SIGUSR1 arrived: passed on to the program as SIGTERM" in out
    line = rundir.failure(rd)
    assert line.startswith("train failed: killed after the warning SIGUSR1 at ") and ", passed on to the program as SIGTERM at " in line, line
    assert "time limit" in line


def test_the_requeue_line_names_the_warning_that_stopped_the_program_not_a_later_signal(tmp_path: Path) -> None:
    # Slurm's warning (USR1) and then the TERM of the time limit: the program stopped on the first.
    root = experiment(tmp_path, "stop", stop_signal="TERM")
    proc = start(root)
    wait_for(tmp_path / "notes", "ready")
    proc.send_signal(signal.SIGUSR1)
    wait_for(the_run(root) / "starts", "passed ", timeout=30)
    proc.send_signal(signal.SIGTERM)
    out, err = finish(proc, timeout=60)
    assert proc.returncode == 99, out + err
    assert "program stopped (exited with 99) after the warning SIGUSR1 (passed on as SIGTERM): asking for a requeue" in out, out


def test_a_requeue_the_scheduler_never_made_is_named(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    rd.mkdir()
    with runlock.run_lock(rd) as hold:
        rundir.record_signal(rd, rundir.WARNED, signal.SIGUSR2)
        hold.code = 99
    line = rundir.failure(rd)
    assert line.startswith("train failed: asked for a requeue (after the warning SIGUSR2") and "not started again" in line, line
    # A later start (another process) that recorded nothing yet: no story of the earlier one is told for it.
    later = subprocess.Popen([sys.executable, "-c", LATER_START, str(rd)], stdout=subprocess.PIPE, text=True)
    assert later.stdout is not None and later.stdout.readline().strip() == "holding"
    try:
        assert rundir.failure(rd) == "train failed: no reason recorded (see the train log under jobs/logs)"
    finally:
        later.kill()
        later.wait()


LATER_START = """
import sys, time
from pathlib import Path
from hpcrl.store import runlock
with runlock.run_lock(Path(sys.argv[1])):
    print("holding", flush=True)
    time.sleep(60)
"""


def test_a_program_that_dies_of_its_stop_signal_after_the_warning_is_requeued_not_failed(tmp_path: Path) -> None:
    # A program without a handler for its stop signal dies of it (-15): after the warning, that is the
    # preemption's doing, and the next lifetime resumes.
    root = experiment(tmp_path, "plain", stop_signal="TERM")
    proc = start(root)
    wait_for(tmp_path / "notes", "ready")
    proc.send_signal(signal.SIGUSR1)
    out, err = finish(proc, timeout=60)
    assert proc.returncode == 99, out + err
    assert "program stopped (killed by SIGTERM) after the warning SIGUSR1 (passed on as SIGTERM): asking for a requeue" in out, out
    assert not rundir.is_failed(the_run(root))


EARLY_WARNING = """
import os, signal
from hpcrl.cli import _job_entry
from hpcrl.runtime.guard import StopFlag

seen = []

@_job_entry
def job(args):
    os.kill(os.getpid(), signal.SIGUSR2)  # the warning, while the job still imports (before any StopFlag)
    stop = StopFlag(seen.append)
    os.kill(os.getpid(), signal.SIGTERM)  # the time limit's TERM, later
    return stop.signal

print(job(None), seen)
"""


def test_a_warning_that_arrives_while_the_job_still_imports_stops_the_run_and_is_reported() -> None:
    # Grid Engine's USR2 at s_rt after a reschedule can come while the job imports torch: it must neither
    # kill the job nor be lost; the run's first StopFlag takes it as the signal that stopped it, and tells it once.
    done = subprocess.run([sys.executable, "-c", EARLY_WARNING], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(int(signal.SIGUSR2)), f"[{int(signal.SIGUSR2)}]"], done.stdout


def test_the_stop_flag_keeps_the_first_signal_and_reports_it_once() -> None:
    from hpcrl.runtime.guard import StopFlag

    seen: list[int] = []
    stop = StopFlag(seen.append)
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2):
        os.kill(os.getpid(), sig)
        time.sleep(0.01)
    assert stop.signal == signal.SIGUSR1 and seen == [signal.SIGUSR1]
