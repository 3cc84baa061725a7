"""hpcrl.halves: a list's work split over a forked child changes how long it takes, never what it answers,
and leaves no process behind, whatever happens to the child or the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from factories import alive

from hpcrl import halves
from hpcrl.cores import usable_cores

two_cores = pytest.mark.skipif(usable_cores() < 2, reason="the split needs two cores")


def pids(items: list[int]) -> list[tuple[int, int]]:
    return [(i * i, os.getpid()) for i in items]


@two_cores
def test_the_second_half_is_computed_in_another_process_and_the_answers_keep_their_order() -> None:
    answers = halves.map_in_halves(pids, list(range(11)), min_items=2)
    assert [a for a, _ in answers] == [i * i for i in range(11)]
    here = {p for _, p in answers[:5]}
    there = {p for _, p in answers[5:]}
    assert here == {os.getpid()} and len(there) == 1 and there != here


def test_below_min_items_or_on_one_core_it_is_all_computed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {p for _, p in halves.map_in_halves(pids, list(range(5)), min_items=6)} == {os.getpid()}
    monkeypatch.setattr(halves, "usable_cores", lambda: 1)
    assert {p for _, p in halves.map_in_halves(pids, list(range(50)), min_items=2)} == {os.getpid()}


@two_cores
def test_a_child_that_dies_or_answers_what_does_not_pickle_has_its_half_computed_here() -> None:
    parent = os.getpid()

    def dies(items: list[int]) -> list[int]:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return [i + 1 for i in items]

    def unpicklable(items: list[int]) -> list:
        return [(lambda i=i: i) if os.getpid() != parent else i for i in items]

    assert halves.map_in_halves(dies, list(range(8)), min_items=2) == list(range(1, 9))
    assert halves.map_in_halves(unpicklable, list(range(8)), min_items=2) == list(range(8))


@two_cores
def test_a_child_that_is_late_is_killed_and_its_half_computed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child stuck (say on a lock another thread held at the fork) delays the answer, never hangs it."""
    monkeypatch.setattr(halves, "WAIT_MIN_S", 0.5)
    monkeypatch.setattr(halves, "WAIT_FACTOR", 1.0)
    parent = os.getpid()

    def stuck_there(items: list[int]) -> list[int]:
        if os.getpid() != parent:
            time.sleep(60)
        return [i * 2 for i in items]

    started = time.monotonic()
    assert halves.map_in_halves(stuck_there, list(range(6)), min_items=2) == [0, 2, 4, 6, 8, 10]
    assert time.monotonic() - started < 10


@two_cores
def test_an_exception_here_is_raised_and_the_child_is_ended_and_reaped(tmp_path: Path) -> None:
    parent, mark = os.getpid(), tmp_path / "child"

    def fails_here(items: list[int]) -> list[int]:
        if os.getpid() == parent:
            while not mark.exists():
                time.sleep(0.01)
            raise ValueError("a corrupt log")
        (tmp_path / "pid").write_text(str(os.getpid()))
        (tmp_path / "pid").rename(mark)  # whole: the parent, which waits for the name, never reads it empty
        time.sleep(60)
        return items

    started = time.monotonic()
    with pytest.raises(ValueError, match="a corrupt log"):
        halves.map_in_halves(fails_here, list(range(4)), min_items=2)
    assert time.monotonic() - started < 10  # the sleeping child was killed, not waited for
    assert not Path(f"/proc/{mark.read_text()}").exists()  # and reaped: not even a zombie is left


@two_cores
def test_a_killed_parent_leaves_no_child_computing(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, time
        from hpcrl import halves
        def work(items):
            if items[0] >= 2:  # the child's half
                open({str(tmp_path / "child")!r}, "w").write(str(os.getpid()))
            time.sleep(120)
            return items
        halves.map_in_halves(work, [0, 1, 2, 3], min_items=2)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 60
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the child never started"
        time.sleep(0.05)
    child = int((tmp_path / "child").read_text())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(child):
        assert time.monotonic() < deadline, f"the child {child} outlived its killed parent"
        time.sleep(0.05)
