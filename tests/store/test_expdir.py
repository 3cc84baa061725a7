"""store/expdir.py: what `hpcrl cancel` records survives later cancellations (a cancelled task stays
cancelled in `status` after Grid Engine or Slurm has forgotten it)."""

from __future__ import annotations

from pathlib import Path

from hpcrl.store import expdir


def test_each_cancel_adds_to_what_earlier_cancels_recorded(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    expdir.record_cancelled(tmp_path, ["101"])
    expdir.record_cancelled(tmp_path, ["102 3", "101"])
    expdir.record_cancelled(tmp_path, ["103 1"])
    assert expdir.read_cancelled(tmp_path) == ({"101"}, {("102", 3), ("103", 1)})
    assert expdir.cancelled_path(tmp_path).read_text().splitlines() == ["101", "102 3", "103 1"]  # once each, in order


def test_nothing_cancelled_reads_as_nothing(tmp_path: Path) -> None:
    assert expdir.read_cancelled(tmp_path) == (set(), set())
