"""The run directory's files, each with one owner (hpcrl/store/rundir.py, hpcrl/rl/checkpoint.py):
train.csv's torn tails, checkpoints written atomically and pruned by write order, task manifests.
Whole `hpcrl train` lifetimes on these files are in test_run_lifetimes.py."""

from __future__ import annotations

import csv
import errno
import os
import random
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrl.config.schema import ConfigError
from hpcrl.rl import checkpoint
from hpcrl.store import columns, rundir

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


def _line_by_line(path: Path, value_column: str = "episodic_return") -> tuple:
    """How train.csv was read before issue 17 (one Python split per line, numpy's float() of each
    field): the specification the fast readers are held to, exceptions included."""
    lines = path.read_bytes().split(b"\n")[:-1]
    if not lines:
        return np.empty(0), np.empty(0)
    header = lines[0].decode().strip().split(",")
    s, r = header.index("step"), header.index(value_column)
    steps, values = [], []
    for line in lines[1:]:
        row = line.split(b",")
        if len(row) > r and row[r].strip():
            steps.append(row[s])
            values.append(row[r])
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def _outcome(read) -> tuple:
    try:
        result = read()
    except Exception as exc:  # noqa: BLE001 - the exception is part of the answer
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(result, Exception):
        return ("raised", type(result).__name__, str(result))
    return tuple((a.dtype.str, a.tobytes()) for a in result)  # bit for bit: -0.0 is not 0.0


_FIELDS = ["256", "-0", "-0.00", "+.5", "1.", "007", "123456789012345", "1234567890123456", "0.000000000000001", "12.50", "480.12",
           "-3.25", "1e5", "1E-05", "nan", "inf", "", " ", " 7", "7\r", "1_0", "abc", ".", "-", "1.2.3", "\x00", '"3"', "0x10"]  # fmt: skip


def _random_log(rng: random.Random, plain: bool) -> bytes:
    ncol = rng.choice([2, 3, 6, 13])
    cols = [f"c{i}" for i in range(ncol)]
    cols[rng.randrange(ncol)] = "step"
    cols[next(i for i in rng.sample(range(ncol), ncol) if cols[i] != "step")] = "episodic_return"
    rows = [",".join(cols)]
    for _ in range(rng.randint(0, 30)):
        width = ncol if rng.random() < 0.97 else rng.randint(1, ncol + 1)
        if plain:
            rows.append(",".join(rng.choice([str(rng.randint(-99999, 99999)), f"{rng.uniform(-1e4, 1e4):.{rng.randint(0, 9)}f}"]) for _ in range(width)))
        else:
            rows.append(",".join(rng.choice(_FIELDS) if rng.random() < 0.3 else f"{rng.uniform(0, 500):.2f}" for _ in range(width)))
    text = "\n".join(rows) + rng.choice(["\n", "", "\n12,3", "\n\x00\x00"])
    if rng.random() < 0.03:
        text = text.replace("\n", "\r\n")
    return text.encode() if rng.random() > 0.02 else b"\xff\xfe" + text.encode()


def test_read_curve_and_read_curves_read_as_line_by_line(tmp_path: Path) -> None:
    """The vectorised parser (one file, or a batch of many) gives the line-by-line reader's floats
    bit for bit, and its exceptions word for word: plain decimals, signs, -0, 15 and 16 digits,
    exponents, blanks, whitespace, CRLF, NUL, quotes, ragged rows, torn tails, undecodable headers."""
    rng = random.Random(17)
    dirs = []
    for i in range(600):
        rd = tmp_path / f"r{i}"
        rd.mkdir()
        if rng.random() > 0.01:
            (rd / "train.csv").write_bytes(_random_log(rng, plain=rng.random() < 0.6))
        dirs.append(rd)
    for rd in dirs[:4]:  # a batch of one layout, plain throughout, beside the rest
        (rd / "train.csv").write_text("step,x,episodic_return\n" + "".join(f"{k * 256},{k},{rng.uniform(-9, 500):.2f}\n" for k in range(50)))
    expected = [_outcome(lambda rd=rd: _line_by_line(rd / "train.csv")) for rd in dirs]
    assert [_outcome(lambda rd=rd: rundir.read_curve(rd)) for rd in dirs] == expected
    assert [_outcome(lambda x=x: x) for x in rundir.read_curves(dirs)] == expected
    assert sum(e[0] != "raised" for e in expected) > 200  # most files are read, not refused


def test_plain_decimals_parse_to_the_correctly_rounded_double() -> None:
    """m / 10**d of exact doubles is what float() gives for every plain decimal of <= 15 digits. A '+'
    (never written by hpcrl's logs) leaves the fast path, to the line-by-line parser that reads it."""
    assert columns._plain_columns(b"1,+2\n", (0, 1)) is None
    rng = random.Random(5)
    fields = [f"{rng.choice(['', '-'])}{rng.randint(0, 10 ** rng.randint(1, 15) - 1)}" for _ in range(3000)]
    fields = [f[: len(f) - k] + "." + f[len(f) - k :] if (k := rng.randint(0, 6)) < len(f.lstrip("+-")) else f for f in fields]
    body = "".join(f"{f},{f}\n" for f in fields).encode()
    steps, values, kept, _ = columns._plain_columns(body, (0, 1))
    want = np.array([float(f) for f in fields])
    assert kept is None and np.array_equal(steps.view(np.int64), want.view(np.int64)) and np.array_equal(values, steps)


@pytest.mark.parametrize(
    "text",
    ["episode,return,length\n0,1.5,10\n1,2,10\n", "episode,return\n0,3\n", "return\n-1\n2\n", "episode,return,length\r\n0,1,2\r\n",
     'episode,return\n0,"4"\n', "episode,return\n\n0,4\n\n", "episode,return\n0\n", "episode,return\n0,1,2\n", "episode,length\n0,1\n",
     "return,return\n1,2\n", "episode,return\n", "", "episode,return\n0, 5\n", "episode,return\n0,x\n", "episode,return\n0,1\x00\n"],
)  # fmt: skip
def test_read_eval_reads_as_dictreader(tmp_path: Path, text: str) -> None:
    """eval.csv's plain files are split on commas, the rest read by csv.DictReader: the same mean, or the same error."""
    (tmp_path / "eval.csv").write_text(text)

    def dictreader() -> float:
        with (tmp_path / "eval.csv").open(newline="") as f:
            returns = [float(row["return"]) for row in csv.DictReader(f)]
        if not returns:
            raise ValueError("no episodes")
        return float(np.mean(returns))

    assert _outcome(lambda: (np.array(rundir.read_eval(tmp_path)),)) == _outcome(lambda: (np.array(dictreader()),))


def test_listing_says_what_exists_says(tmp_path: Path) -> None:
    """One directory read stands for a stat per marker: a dangling symlink does not exist, a live one does."""
    rd = tmp_path / "run"
    rd.mkdir()
    for name in ("DONE", "train.csv", "EVAL_FAILED"):
        (rd / name).write_text("x\n")
    (rd / "EVAL_DONE").symlink_to(tmp_path / "nowhere")
    (rd / "eval.csv").symlink_to(rd / "train.csv")
    names = rundir.listing(rd)
    assert names == {n for n in os.listdir(rd) if (rd / n).exists()} == {"DONE", "train.csv", "EVAL_FAILED", "eval.csv"}
    assert rundir.run_state(rd, names) == rundir.run_state(rd) == "done"
    assert rundir.eval_state(rd, names) == rundir.eval_state(rd) == "failed"
    assert rundir.has_eval(rd, names) and rundir.has_train_log(rd, names)
    assert rundir.listing(tmp_path / "missing") == frozenset() and rundir.run_state(tmp_path / "missing", frozenset()) == "new"
    (rd / "DONE").unlink()
    (rd / "checkpoints").mkdir()
    (rd / "train.csv").unlink()
    assert rundir.run_state(rd, rundir.listing(rd)) == rundir.run_state(rd) == "new"
    (rd / "checkpoints" / "step_100.pt").write_bytes(b"")
    assert rundir.run_state(rd, rundir.listing(rd)) == rundir.run_state(rd) == "started"


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
    assert [p.name for p in rundir.remove_stale_temp(tmp_path)] == [f".{kept.name}.k3j4.tmp"]
    assert os.listdir(tmp_path) == [kept.name]


def test_returns_reach_train_csv_and_eval_csv_at_full_precision(tmp_path: Path) -> None:
    """Issue 37 item 16: 6 significant digits turned 1234567.8 into 1.23457e+06 in train.csv and
    eval.csv, and every mean and curve inherited it. Each writer goes through rundir's one cell format."""
    from hpcrl.runtime.runlog import fmt

    values = [1234567.8, 0.1 + 0.2, -3.0000001, 1e-07]
    with rundir.TrainLog(tmp_path, ("step", "episodic_return"), resume_step=0) as log:
        for step, value in enumerate(values, start=1):
            log.write([step, fmt(value)])
    assert rundir.read_curve(tmp_path)[1].tolist() == values
    rundir.write_eval(tmp_path, [(v, 10, {"success": v}) for v in values])
    assert rundir.read_eval_returns(tmp_path) == values
    assert "1234567.8," in (tmp_path / rundir.EVAL_LOG).read_text()
    rundir.write_curve(tmp_path, [1, 2, 3, 4], values)  # a program's episodes, converted
    assert rundir.read_curve(tmp_path)[1].tolist() == values
    assert fmt(float("nan")) == fmt(None) == ""
