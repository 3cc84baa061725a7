"""Edges of the files every run lives by, each pinned by the mutation audit (benchmarks/mutation.py)
as a behaviour no other test held: a change there would have gone unnoticed.

runs.csv and run configs that are damaged in ways the common tests do not make, markers and lock
files with a word too many, a train.csv whose rows are longer than the window `status` reads, a
lock that is released while a second trainer waits, and the atomic writer's clean-up.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from factories import TINY, deep_update

from hpcrl.config.load import experiment_from_dict
from hpcrl.config.schema import ConfigError
from hpcrl.io import NotRegularFile, TooLarge, atomic_open, atomic_write_text, read_regular
from hpcrl.store import rundir, runlock
from hpcrl.store.expdir import load_runs, read_runs_csv, write_experiment
from hpcrl.sweep.runs import expand


def written(tmp_path: Path) -> Path:
    exp = experiment_from_dict(deep_update(TINY, {"output": str(tmp_path)}))
    write_experiment(exp, expand(exp), {})
    return exp.dir


# --------------------------------------------------------------------------------------------
# runs.csv and run configs.


@pytest.mark.parametrize("extra", [",surplus", ""])
def test_a_runs_csv_row_with_a_field_too_many_or_too_few_is_damage(tmp_path: Path, extra: str) -> None:
    """A row longer than the header (a stray comma) or shorter (a lost field) is refused, each on its own."""
    root = written(tmp_path)
    path = root / "runs.csv"
    header, first, *rest = path.read_text().splitlines()
    cut = first + extra if extra else first.rsplit(",", 1)[0]
    path.write_text("\n".join([header, cut, *rest]) + "\n")
    with pytest.raises(ConfigError, match=f"^{path}: damaged run index .*: line 2: "):
        read_runs_csv(root)


def test_a_runs_csv_that_the_csv_module_refuses_is_damage(tmp_path: Path) -> None:
    root = written(tmp_path)
    path = root / "runs.csv"
    path.write_text(path.read_text() + '7,"' + "x" * 200_000 + '",7,0\n')  # past csv's field size limit
    with pytest.raises(ConfigError, match=f"^{path}: damaged run index .*: field larger than field limit"):
        read_runs_csv(root)


def test_run_headers_are_what_yaml_writes_and_read_back(tmp_path: Path) -> None:
    """A sweep writes each run's `run:` header directly, not through YAML's representer; the text
    is the dump's byte for byte, for settings that YAML quotes, wraps or writes as a flow list, and
    for seeds of every width."""
    import yaml

    grid = {
        "train.hidden_sizes": [[16], [8, 8]],
        "env.kwargs": [{"note": "a: b # c"}, {"note": "x" * 120}, {}],
    }
    exp = experiment_from_dict(deep_update(TINY, {"output": str(tmp_path), "sweep": {"seeds": [0, 7, 4294967295], "grid": grid}}))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for run in runs:
        head = (exp.dir / "runs" / run.run_id / "config.yaml").read_text().partition("\nconfig:")[0] + "\n"
        dumped = yaml.dump({"run": {"index": run.index, "run_id": run.run_id, "seed": run.seed, "settings": run.settings}}, Dumper=yaml.SafeDumper, sort_keys=False)
        assert head == dumped
    assert [(r.run_id, r.seed, r.settings) for r in load_runs(exp.dir)] == [(r.run_id, r.seed, r.settings) for r in runs]


@pytest.mark.parametrize("damage", ["not utf-8", "a directory"])
def test_a_run_config_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path, damage: str) -> None:
    root = written(tmp_path)
    path = next((root / "runs").iterdir()) / "config.yaml"
    if damage == "not utf-8":
        path.write_bytes(b"run: {index: 0}\n\xff\xfe\n")
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(ConfigError, match=f"^{path}: damaged run config "):
        load_runs(root)


# --------------------------------------------------------------------------------------------
# Markers, train.csv, eval.csv.


def test_a_done_marker_with_more_than_the_step_says_no_step(tmp_path: Path) -> None:
    rundir.mark(tmp_path, rundir.DONE, "step 5 extra")
    assert rundir.done_step(tmp_path) is None
    rundir.mark_done(tmp_path, 5)
    assert rundir.done_step(tmp_path) == 5


def test_last_logged_step_of_rows_longer_than_its_window(tmp_path: Path) -> None:
    """`status` reads the last 4 KB: with rows of 3 KB that window holds half a row and one whole row."""
    wide = ",".join(["0.5"] * 750)
    with rundir.TrainLog(tmp_path, ["step", "episodic_return", *[f"m{i}" for i in range(749)]], 0) as log:
        for step in (100, 200, 300):
            log.write([step, wide])
    assert (tmp_path / rundir.TRAIN_LOG).stat().st_size > 4096
    assert rundir.last_logged_step(tmp_path) == 300


def test_eval_csv_round_trip_and_an_empty_one(tmp_path: Path) -> None:
    rundir.write_eval(tmp_path, [(1.0, 10, {"success": 1.0}), (3.0, 12, {})])
    assert rundir.read_eval(tmp_path) == 2.0 and rundir.read_eval_returns(tmp_path) == [1.0, 3.0]
    rundir.write_eval(tmp_path, [])
    assert (tmp_path / rundir.EVAL_LOG).read_text() == "episode,return,length\n"
    with pytest.raises(ValueError, match="no episodes"):
        rundir.read_eval(tmp_path)


def test_a_game_s_eval_csv_names_each_opponent_and_files_without_the_column_still_read(tmp_path: Path) -> None:
    """Issue 38 item 2: eval.csv gets an `opponent` column for a game's games; an eval.csv written before it
    (no such column) reads as it did."""
    results = [(1.0, 5, {"win": 1.0}), (0.0, 9, {"win": 0.0}), (-1.0, 6, {"win": 0.0})]
    rundir.write_eval(tmp_path, results, ["random", "perfect", "mcts:100"])
    lines = (tmp_path / rundir.EVAL_LOG).read_text().splitlines()
    assert lines[0] == "episode,opponent,return,length,win" and lines[3] == "2,mcts:100,-1,6,0"
    assert rundir.read_eval_returns(tmp_path) == [1.0, 0.0, -1.0]
    (tmp_path / rundir.EVAL_LOG).write_text("episode,return,length,draw,first,loss,win\n0,1,5,0,1,0,1\n1,0,9,1,0,0,0\n2,-1,6,0,1,1,0\n")  # as written before
    assert rundir.read_eval_returns(tmp_path) == [1.0, 0.0, -1.0] and rundir.read_eval(tmp_path) == 0.0
    with pytest.raises(ValueError, match="2 opponents for 3 games"):
        rundir.write_eval(tmp_path, results, ["random", "perfect"])


# --------------------------------------------------------------------------------------------
# The run lock.


def hold(run_dir: Path, text: str, seconds: float) -> threading.Thread:
    """Another holder of the run's lock (its own open file, as another process has), for `seconds`."""
    fd = os.open(run_dir / runlock.LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)

    def release() -> None:
        time.sleep(seconds)
        os.close(fd)

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_a_second_trainer_waits_wait_s_for_the_lock_and_gets_it_when_released(tmp_path: Path) -> None:
    holder = hold(tmp_path, "1 elsewhere\n", 0.3)
    began = time.monotonic()
    with runlock.run_lock(tmp_path, wait_s=5.0):
        waited = time.monotonic() - began
    holder.join()
    assert 0.2 < waited < 3.0


def test_a_lock_that_stays_held_is_refused_after_wait_s_not_before(tmp_path: Path) -> None:
    holder = hold(tmp_path, "4242 node07\n", 1.5)
    began = time.monotonic()
    with pytest.raises(runlock.RunLocked, match="pid 4242 on node07"), runlock.run_lock(tmp_path, wait_s=0.5):
        pass
    waited = time.monotonic() - began
    holder.join()
    assert 0.45 < waited < 1.4


def test_a_lock_file_with_a_word_too_many_names_no_holder(tmp_path: Path) -> None:
    holder = hold(tmp_path, "4242 node07 2026-11-27T14:00:00+00:00 extra\n", 0.5)
    assert runlock.lock_holder(tmp_path) == runlock.Holder(0, "?")
    holder.join()
    assert runlock.lock_holder(tmp_path) is None


def _hold_and_die(run_dir: Path, *, let_go: bool) -> int:
    """A child process that takes the run's lock, then exits cleanly (let_go) or is SIGKILLed holding it."""
    import multiprocessing as mp

    ready = mp.get_context("fork").Event()

    def child() -> None:
        with runlock.run_lock(run_dir):
            ready.set()
            time.sleep(0 if let_go else 60)

    proc = mp.get_context("fork").Process(target=child)
    proc.start()
    assert ready.wait(10)
    if not let_go:
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    return proc.pid


def test_a_start_that_never_let_go_of_its_run_is_named_by_status_and_by_the_next_start(tmp_path: Path) -> None:
    """A trainer killed (kill -9, an OOM kill) or lost with its node never releases the lock: the kernel drops
    the flock, but the file still names it. `status` names it until the next start, which names it in its log,
    and the file keeps the newest lost starts for `status` afterwards. A start that let go is never named."""
    clean = _hold_and_die(tmp_path, let_go=True)
    assert runlock.lost_starts(tmp_path) == []
    killed = _hold_and_die(tmp_path, let_go=False)
    host = os.uname().nodename
    (lost,) = runlock.lost_starts(tmp_path)
    assert (lost.pid, lost.host) == (killed, host) and re.fullmatch(rf"on {re.escape(host)} \(pid {killed}, \d\d:\d\d:\d\d\)", lost.started())
    with runlock.run_lock(tmp_path) as hold:
        assert hold.lost == [lost] and clean not in [h.pid for h in hold.lost]
        assert runlock.lock_holder(tmp_path) == runlock.Holder(os.getpid(), host)
        assert runlock.lost_starts(tmp_path) == [lost]  # still remembered while this start runs
    with runlock.run_lock(tmp_path) as hold:
        assert hold.lost == []  # the start before let go
    assert runlock.lost_starts(tmp_path) == [lost]
    for _ in range(runlock.LOST_KEPT + 2):
        _hold_and_die(tmp_path, let_go=False)
    assert len(runlock.lost_starts(tmp_path)) == runlock.LOST_KEPT + 1  # the kept ones, and the last holder, not yet followed


# --------------------------------------------------------------------------------------------
# The reader of a user's file (a config, a Dockerfile).


def test_a_user_s_file_of_exactly_the_limit_is_read_whole_and_one_byte_more_is_too_large(tmp_path: Path) -> None:
    """`read_regular(path, limit)` promises files of at most `limit` bytes, whole: the limit itself is allowed."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 64)
    assert read_regular(path, 64) == b"x" * 64
    with pytest.raises(TooLarge):
        read_regular(path, 63)
    os.mkfifo(tmp_path / "fifo")  # opened without blocking, named for what it is, never read
    for what, kind, is_dir in ((tmp_path / "fifo", "a FIFO", False), (tmp_path, "a directory", True), (Path("/dev/zero"), "a device", False)):
        with pytest.raises(NotRegularFile) as raised:
            read_regular(what, 64)
        assert (raised.value.kind, raised.value.is_dir) == (kind, is_dir)


# --------------------------------------------------------------------------------------------
# The atomic writer.


def test_an_atomic_write_makes_the_directories_it_needs(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a" / "b" / "f.txt", "x")
    assert (tmp_path / "a" / "b" / "f.txt").read_text() == "x"


def test_a_failed_atomic_write_whose_temp_file_is_gone_raises_its_own_error(tmp_path: Path) -> None:
    """The clean-up must not hide why the write failed behind a FileNotFoundError of its own."""
    with pytest.raises(ValueError, match="the write failed"), atomic_open(tmp_path / "f.txt"):
        for temp in tmp_path.glob(".f.txt.*.tmp"):
            temp.unlink()
        raise ValueError("the write failed")
    assert os.listdir(tmp_path) == []


def test_a_disk_that_fills_up_during_a_checkpoint_reports_the_disk_not_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once some writes of torch.save succeeded, a failing one comes out as `RuntimeError: unexpected
    pos`; the run must report the disk's error. The kernel's file size limit (RLIMIT_FSIZE, EFBIG) is
    the disk filling up mid-write; the file is unbuffered so that no later flush repeats the error."""
    import errno
    import resource
    import signal
    from contextlib import contextmanager

    import torch

    from hpcrl.rl import checkpoint

    @contextmanager
    def unbuffered(path: Path, mode: str = "wb"):
        with open(path, mode, buffering=0) as f:
            yield f

    monkeypatch.setattr(checkpoint, "atomic_open", unbuffered)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal's kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, limits[1]))
    try:
        with pytest.raises(OSError) as caught:
            checkpoint.save(tmp_path, 7, {"w": torch.zeros(10_000)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.errno == errno.EFBIG and Path(caught.value.filename).name.startswith("step-000000000007-")
    assert rundir.one_line_reason(caught.value).startswith("File too large (")


def test_a_checkpoint_holding_numpy_scalars_is_read_back(tmp_path: Path) -> None:
    """A counter that met a numpy array is a numpy scalar; torch.save pickles it and the weights-only
    reader refused it, so the checkpoint was written and could never be resumed or evaluated (a
    decoupled AlphaZero trainer's game count after the budget cut a game, on Grid Engine)."""
    import numpy as np
    import torch

    from hpcrl.rl import checkpoint

    state = {"games": np.float64(2.5), "credit": [np.float32(0.5), (np.int64(3), 1)], "w": torch.ones(2)}
    path = checkpoint.save(tmp_path, 7, state)
    loaded = checkpoint.load(path)
    assert loaded["games"] == 2.5 and loaded["credit"] == [0.5, (3, 1)] and torch.equal(loaded["w"], torch.ones(2))
    assert type(loaded["games"]) is float and type(loaded["credit"][1][0]) is int


def test_lifetimes_count_each_start_and_make_a_run_started(tmp_path: Path) -> None:
    assert rundir.run_state(tmp_path) == "new"
    assert [rundir.begin_lifetime(tmp_path) for _ in range(3)] == [1, 2, 3]
    assert rundir.run_state(tmp_path) == "started"


@pytest.mark.parametrize("text", ["step", "", "step x", "program exited with 0"])
def test_a_done_marker_without_a_step_count_says_no_step(tmp_path: Path, text: str) -> None:
    rundir.mark(tmp_path, rundir.DONE, text)
    assert rundir.done_step(tmp_path) is None


def test_readers_of_a_run_that_logged_nothing(tmp_path: Path) -> None:
    assert rundir.last_logged_step(tmp_path) == 0 and rundir.train_columns(tmp_path) is None
    assert rundir.final_return(tmp_path) != rundir.final_return(tmp_path)  # NaN: no train.csv
    (tmp_path / rundir.TRAIN_LOG).write_text("step,episodic_return\n")
    assert rundir.last_logged_step(tmp_path) == 0 and rundir.train_columns(tmp_path) == ["step", "episodic_return"]


@pytest.mark.parametrize("header", [b"step,episodic_ret", b"\nstep\n", b"st\0ep,x\n"])
def test_a_torn_or_damaged_header_is_no_columns(tmp_path: Path, header: bytes) -> None:
    (tmp_path / rundir.TRAIN_LOG).write_bytes(header)
    assert rundir.train_columns(tmp_path) is None


def test_a_disk_error_without_its_text_is_still_named(tmp_path: Path) -> None:
    import errno

    assert rundir.one_line_reason(OSError(errno.ENOSPC, "", "/x/ckpt")) == "No space left on device (/x/ckpt)"
