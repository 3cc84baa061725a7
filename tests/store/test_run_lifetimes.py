"""Whole `hpcrl train` lifetimes on a run directory that earlier lifetimes, crashes and full disks left
behind: a second trainer, unreadable checkpoints, a torn train.csv, stale temporary files, a full
disk, a missing run config. A real (tiny) training run through the CLI's entry point, in this
process for speed (importing torch in a fresh process costs seconds); two real processes for the
lock; a real full filesystem."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import write_config

from hpcrl import cli
from hpcrl.config.load import load_experiment
from hpcrl.rl import checkpoint
from hpcrl.status import experiment_status
from hpcrl.store import rundir, runlock
from hpcrl.store.expdir import write_experiment
from hpcrl.sweep.runs import expand

TRAIN = {"total_steps": 1024, "num_steps": 64, "num_minibatches": 2, "update_epochs": 2, "hidden_sizes": [16], "checkpoint_every": 3}
"""8 iterations of 128 steps; checkpoints after iterations 3 and 6 and at the end: 768 and 1024 are kept."""


def make_experiment(directory: Path, train: dict | None = None) -> tuple[Path, Path]:
    """An experiment of one run, written as `hpcrl sweep` writes it; (experiment dir, run dir)."""
    exp = load_experiment(write_config(directory, {"sweep": {"seeds": [0]}, "train": {**TRAIN, **(train or {})}}))
    (run,) = expand(exp)
    write_experiment(exp, [run], {})
    return exp.dir, exp.dir / "runs" / run.run_id


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """`hpcrl train` installs its warning-signal handlers in this process: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def hpcrl(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    """`hpcrl ARGS` through the CLI's main, as the job script runs it: exit code, stdout, stderr."""
    capsys.readouterr()
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def logged_steps(rd: Path) -> list[int]:
    text = (rd / "train.csv").read_text()
    assert text.endswith("\n") and "\0" not in text
    return [int(line.split(",")[0]) for line in text.splitlines()[1:]]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One real training run to completion; tests damage copies of it."""
    exp, rd = make_experiment(tmp_path_factory.mktemp("finished"))
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli.main(["train", str(exp), "--task", "0"]) == 0
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return exp, rd


@pytest.fixture
def unfinished(finished: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run whose DONE is gone: the next `hpcrl train` resumes it."""
    exp, rd = finished
    copy = Path(shutil.copytree(exp, tmp_path / exp.name))
    (copy / "runs" / rd.name / "DONE").unlink()
    return copy, copy / "runs" / rd.name


def test_done_carries_the_steps_trained_and_status_shows_them(finished: tuple[Path, Path], tmp_path: Path) -> None:
    exp, rd = finished
    assert rundir.done_step(rd) == logged_steps(rd)[-1] == 1024
    copy = Path(shutil.copytree(exp, tmp_path / exp.name))
    rundir.mark_done(copy / "runs" / rd.name, 896)  # a loop that stopped short says so, and status believes it
    (row,), _, _ = experiment_status(copy)
    assert (row.train, row.step) == ("done", 896)


def test_resumes_from_the_checkpoint_before_a_corrupt_newest_one(unfinished: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    exp, rd = unfinished
    newest, before = checkpoint.checkpoint_files(rd / "checkpoints")
    assert (newest.name[:17], before.name[:17]) == ("step-000000001024", "step-000000000768")
    newest.write_bytes(newest.read_bytes()[:1000])
    proc = hpcrl(capsys, "train", str(exp), "--task", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"skipped checkpoint {newest.name}: unreadable" in proc.stdout and "resumed from step 768" in proc.stdout
    steps = logged_steps(rd)
    assert steps == sorted(set(steps)) and steps[-3:] == [768, 896, 1024]
    assert rundir.done_step(rd) == 1024


def test_a_torn_train_csv_is_cut_back_on_resume(unfinished: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """What a node crash on NFS leaves: the file grew, but the last rows' bytes never arrived (NULs)."""
    exp, rd = unfinished
    with (rd / "train.csv").open("ab") as f:
        f.write(b"\0" * 300)
    assert rundir.last_logged_step(rd) == 1024 and rundir.read_curve(rd)[0][-1] == 1024  # readers skip the torn tail
    proc = hpcrl(capsys, "train", str(exp), "--task", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from step 1024" in proc.stdout
    steps = logged_steps(rd)
    assert steps == sorted(set(steps)) and steps[-1] == 1024


def test_temporary_files_of_a_killed_checkpoint_write_go_at_the_next_start(unfinished: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    exp, rd = unfinished
    stale = rd / "checkpoints" / ".step-000000001152-000004.pt.x81kq2.tmp"
    stale.write_bytes(b"PK\x03\x04half a checkpoint")
    proc = hpcrl(capsys, "train", str(exp), "--task", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not stale.exists() and f"removed {stale.name}" in proc.stdout
    assert not [p for p in (rd / "checkpoints").iterdir() if p.name.endswith(".tmp")]


def test_unreadable_checkpoints_fail_the_run_with_the_reason_instead_of_restarting(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp, rd = make_experiment(tmp_path)
    (rd / "checkpoints").mkdir()
    for name in ("step-000000000384-000001.pt", "step-000000000768-000002.pt"):
        (rd / "checkpoints" / name).write_bytes(b"\0" * 512)
    proc = hpcrl(capsys, "train", str(exp), "--task", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "none of the 2 checkpoints" in proc.stderr and "move them aside" in proc.stderr
    assert not (rd / "train.csv").exists() and len(checkpoint.checkpoint_files(rd / "checkpoints")) == 2
    (row,), _, _ = experiment_status(exp)
    assert row.train == "failed" and "none of the 2 checkpoints" in row.note


def test_a_second_trainer_of_a_locked_run_refuses_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp, rd = make_experiment(tmp_path, {"total_steps": 10_000_000, "checkpoint_every": 10_000})
    first = subprocess.Popen([sys.executable, "-m", "hpcrl", "train", str(exp), "--task", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ((rd / "train.csv").exists() and (rd / "train.csv").read_text().count("\n") >= 2):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
            time.sleep(0.1)
        assert runlock.lock_holder(rd) == runlock.Holder(first.pid, os.uname().nodename)
        before = (rd / "train.csv").read_bytes()
        second = hpcrl(capsys, "train", str(exp), "--task", "0")
        assert second.returncode == runlock.LOCKED_EXIT not in (0, 99)
        assert second.stderr.strip().splitlines() == [
            f"hpcrl: error: {rd.name} is being trained by pid {first.pid} on {os.uname().nodename} (lock {rd / '.lock'}); not starting a second trainer"
        ]
        assert not (rd / "FAILED").exists() and not (rd / "DONE").exists()
        assert (rd / "train.csv").read_bytes().startswith(before)  # the first trainer's log, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    assert runlock.lock_holder(rd) is None  # the lock died with its holder


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_during_a_checkpoint_fails_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        exp, rd = make_experiment(disk)
        st = os.statvfs(disk)
        (disk / "filler").write_bytes(b"x" * (st.f_bavail * st.f_frsize - 16 * 1024))  # room for the log, not a checkpoint
        proc = hpcrl(capsys, "train", str(exp), "--task", "0")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert "No space left on device" in proc.stderr and "step-000000000384-000001.pt" in proc.stderr
        assert rundir.first_line(rd, rundir.FAILED).startswith("No space left on device (")
        assert os.listdir(rd / "checkpoints") == []  # no temporary file left behind
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_task_without_its_run_config_or_manifest_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp, rd = make_experiment(tmp_path)
    (rd / "config.yaml").unlink()
    proc = hpcrl(capsys, "train", str(exp), "--task", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"hpcrl: error: {rd.resolve() / 'config.yaml'}: missing run config (`hpcrl sweep` with the experiment's config writes it again)"]
    proc = hpcrl(capsys, "eval", str(exp), "--task", "1", "--manifest", "jobs/0-0.tasks")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "unreadable task manifest" in proc.stderr
