"""The run directory's files, each with one owner (hpcrl/rundir.py, hpcrl/rl/checkpoint.py):
train.csv's torn tails, checkpoints written atomically and pruned by write order, task manifests.
Whole `hpcrl train` lifetimes on these files are in test_run_lifetimes.py."""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from hpcrl import rundir
from hpcrl.config import ConfigError
from hpcrl.rl import checkpoint

HEADER = "step,iteration,episodic_return\n"


# ---------------------------------------------------------------------------------------------- train.csv
def test_train_log_cuts_a_torn_tail_and_rows_past_the_checkpoint(tmp_path: Path) -> None:
    """A node crash on NFS leaves half a line or NUL bytes; the resumed writer cuts back to the last
    complete row the checkpoint covers, then appends."""
    log = tmp_path / "train.csv"
    log.write_bytes((HEADER + "100,1,5\n200,2,6\n300,3,7\n30").encode() + b"\0" * 50)
    with rundir.TrainLog(tmp_path, ("step", "iteration", "episodic_return"), resume_step=200) as writer:
        writer.write([300, 3, 8])
    assert log.read_text() == HEADER + "100,1,5\n200,2,6\n300,3,8\n"


def test_train_log_never_keeps_a_damaged_line(tmp_path: Path) -> None:
    """Rows after damage cannot be trusted to follow it: the log is cut at the first bad line."""
    (tmp_path / "train.csv").write_bytes((HEADER + "100,1,5\n").encode() + b"\0\0\0\n" + b"200,2,6\n")
    with rundir.TrainLog(tmp_path, ("step", "iteration", "episodic_return"), resume_step=200) as writer:
        writer.write([300, 3, 7])
    assert (tmp_path / "train.csv").read_text() == HEADER + "100,1,5\n300,3,7\n"


@pytest.mark.parametrize("damage", [b"", b"\0" * 4096, b"step,itera"])
def test_train_log_writes_a_header_after_a_torn_header(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / "train.csv").write_bytes(damage)
    with rundir.TrainLog(tmp_path, ("step", "iteration", "episodic_return"), resume_step=0) as writer:
        writer.write([100, 1, 5])
    assert (tmp_path / "train.csv").read_text() == HEADER + "100,1,5\n"


def test_readers_ignore_a_torn_last_line(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_bytes((HEADER + "100,1,5\n200,2,\n300,3,7\n4000,4,1").encode() + b"\0" * 10)
    steps, returns = rundir.read_curve(tmp_path)
    assert steps.tolist() == [100, 300] and returns.tolist() == [5, 7]
    assert rundir.last_logged_step(tmp_path) == 300
    assert rundir.final_return(tmp_path) == 6


def test_last_logged_step_reads_only_the_tail_of_a_long_log(tmp_path: Path) -> None:
    rows = "".join(f"{s},{s},1.5\n" for s in range(1, 5000))
    (tmp_path / "train.csv").write_text(HEADER + rows + "123")
    assert rundir.last_logged_step(tmp_path) == 4999


def test_read_curve_reports_damage_in_the_middle(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text(HEADER + "100,1,5\n200,2,\x00garbage\n300,3,7\n")
    with pytest.raises(ValueError):
        rundir.read_curve(tmp_path)


# ---------------------------------------------------------------------------------------------- markers
def test_done_marker_carries_the_steps_trained(tmp_path: Path) -> None:
    rundir.mark(tmp_path, rundir.FAILED, "boom")
    rundir.mark_done(tmp_path, 1792)
    assert rundir.run_state(tmp_path) == "done" and not rundir.is_failed(tmp_path)
    assert rundir.done_step(tmp_path) == 1792
    (tmp_path / rundir.DONE).write_text("done\n")  # written by an older hpcrl: no figure
    assert rundir.done_step(tmp_path) is None


# ---------------------------------------------------------------------------------------------- manifests
def test_manifest_line_i_is_task_i_and_the_kth_occurrence_is_actor_k(tmp_path: Path) -> None:
    rundir.write_manifest(tmp_path, "jobs/0-0.tasks", [5, 2, 9])
    assert [rundir.task_run(tmp_path, "jobs/0-0.tasks", t) for t in (1, 2, 3)] == [5, 2, 9]
    assert rundir.read_manifest(tmp_path, "jobs/0-0.tasks") == [5, 2, 9]
    rundir.write_manifest(tmp_path, "jobs/0-0.actors.tasks", [5, 5, 5, 2, 2, 2])
    got = [rundir.actor_of_task(tmp_path, "jobs/0-0.actors.tasks", t) for t in range(1, 7)]
    assert got == [(5, 0), (5, 1), (5, 2), (2, 0), (2, 1), (2, 2)]


def test_bad_manifests_are_one_line_config_errors(tmp_path: Path) -> None:
    rundir.write_manifest(tmp_path, "a.tasks", [3])
    with pytest.raises(ConfigError, match="--task 2: the manifest a.tasks has 1 tasks"):
        rundir.task_run(tmp_path, "a.tasks", 2)
    with pytest.raises(ConfigError, match="unreadable task manifest .*No such file"):
        rundir.task_run(tmp_path, "missing.tasks", 1)
    (tmp_path / "b.tasks").write_bytes(b"1\n\xff\xfe\n")
    with pytest.raises(ConfigError, match="unreadable task manifest"):
        rundir.read_manifest(tmp_path, "b.tasks")


# ---------------------------------------------------------------------------------------------- checkpoints
def state(value: float) -> dict:
    return {"w": torch.full((4,), value)}


def test_a_checkpoint_write_that_fails_midway_leaves_the_previous_one_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written in place instead of atomically, the half-written file would be the newest checkpoint."""
    first = checkpoint.save(tmp_path, 100, state(1.0))
    real_save = torch.save

    def dies_midway(obj, f) -> None:
        f.write(b"PK\x03\x04" + b"x" * 1000)  # some bytes of a zip, then the node runs out of luck
        raise RuntimeError("simulated failure in the middle of torch.save")

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(RuntimeError, match="simulated"):
        checkpoint.save(tmp_path, 200, state(2.0))
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(os.listdir(tmp_path)) == [first.name]
    loaded, problems = checkpoint.load_latest(tmp_path)
    assert problems == [] and torch.equal(loaded["w"], state(1.0)["w"])


def test_checkpoints_are_pruned_by_write_order_never_the_new_one(tmp_path: Path) -> None:
    """The newest files (highest steps) are unreadable, so the run went back to an older one: each
    new checkpoint must survive its own pruning, and the next start must resume from it."""
    legacy = tmp_path / f"step-{50:012d}.pt"  # named before the write sequence: older than any other
    torch.save(state(0.5), legacy)
    good = checkpoint.save(tmp_path, 1000, state(1.0), keep=9)
    for step in (3000, 4000):
        checkpoint.save(tmp_path, step, state(9.0), keep=9).write_bytes(b"\0" * 64)  # zero-filled by a crash
    loaded, problems = checkpoint.load_latest(tmp_path)
    assert torch.equal(loaded["w"], state(1.0)["w"]) and len(problems) == 2
    new = checkpoint.save(tmp_path, 1200, state(2.0), keep=2)
    assert new.exists()
    newer = checkpoint.save(tmp_path, 1400, state(3.0), keep=2)
    assert [p.name for p in checkpoint.checkpoint_files(tmp_path)] == [newer.name, new.name]
    assert not good.exists() and not legacy.exists()
    assert torch.equal(checkpoint.load_latest(tmp_path)[0]["w"], state(3.0)["w"])


def test_newest_unreadable_falls_back_to_the_one_before(tmp_path: Path) -> None:
    older = checkpoint.save(tmp_path, 100, state(1.0))
    newest = checkpoint.save(tmp_path, 200, state(2.0))
    newest.write_bytes(newest.read_bytes()[:100])
    loaded, problems = checkpoint.load_latest(tmp_path)
    assert torch.equal(loaded["w"], state(1.0)["w"]) and len(problems) == 1 and newest.name in problems[0]
    assert older.exists()


def test_checkpoints_that_all_fail_to_load_are_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    assert checkpoint.load_latest(tmp_path / "none") == (None, [])
    for step in (100, 200):
        checkpoint.save(tmp_path, step, state(1.0)).write_bytes(b"not a zip")
    with pytest.raises(checkpoint.UnreadableCheckpoints, match="none of the 2 checkpoints .* is readable"):
        checkpoint.load_latest(tmp_path)


@contextmanager
def dev_full(path: Path, mode: str = "wb"):
    """A file whose writes fail as a full disk's do (the kernel's /dev/full: ENOSPC)."""
    with open("/dev/full", mode) as f:
        yield f


def test_a_full_disk_says_so_instead_of_torchs_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "atomic_open", dev_full)
    with pytest.raises(OSError) as caught:
        checkpoint.save(tmp_path, 100, {"w": torch.zeros(100_000)})
    assert caught.value.errno == errno.ENOSPC and Path(caught.value.filename).name.startswith("step-000000000100-")
    assert rundir.one_line_reason(caught.value).startswith("No space left on device (")


def test_stale_temp_files_are_removed(tmp_path: Path) -> None:
    kept = checkpoint.save(tmp_path, 100, state(1.0))
    (tmp_path / f".{kept.name}.k3j4.tmp").write_bytes(b"half")
    assert [p.name for p in checkpoint.remove_stale_temp(tmp_path)] == [f".{kept.name}.k3j4.tmp"]
    assert os.listdir(tmp_path) == [kept.name]
