"""store/expdir.py: what `hpcrl cancel` records survives later cancellations (a cancelled task stays
cancelled in `status` after Grid Engine or Slurm has forgotten it); a runs.csv that lost its rows is refused
by those who report on the runs and repaired by a sweep."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from factories import TINY, deep_update

from hpcrl.cli import main
from hpcrl.config.experiment import Experiment
from hpcrl.config.load import experiment_from_dict
from hpcrl.config.schema import ConfigError
from hpcrl.store import expdir
from hpcrl.store.expdir import Run, write_experiment
from hpcrl.sweep.runs import expand


def test_each_cancel_adds_to_what_earlier_cancels_recorded(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    expdir.record_cancelled(tmp_path, ["101"])
    expdir.record_cancelled(tmp_path, ["102 3", "101"])
    expdir.record_cancelled(tmp_path, ["103 1"])
    assert expdir.read_cancelled(tmp_path) == ({"101"}, {("102", 3), ("103", 1)})
    assert expdir.cancelled_path(tmp_path).read_text().splitlines() == ["101", "102 3", "103 1"]  # once each, in order


def test_nothing_cancelled_reads_as_nothing(tmp_path: Path) -> None:
    assert expdir.read_cancelled(tmp_path) == (set(), set())


# --------------------------------------------------------------------------------------------
# A runs.csv that lists no run beside runs that trained (the hostile-input audit): status said "0 runs: none"
# with exit 0, and collect exited 1 without a line.


def _swept(tmp_path: Path) -> tuple[Experiment, list[Run]]:
    exp = experiment_from_dict(deep_update(TINY, {"output": str(tmp_path), "sweep": {"seeds": [0, 1]}}))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    return exp, runs


def test_a_runs_csv_that_lists_no_run_beside_runs_that_began_is_damage_a_sweep_repairs(tmp_path: Path) -> None:
    exp, runs = _swept(tmp_path)
    path = exp.dir / "runs.csv"
    whole = path.read_text()
    path.write_text(whole.splitlines()[0] + "\n")  # `head -1 runs.csv`
    # Run directories of runs that never began are no sign of it: an Optuna worker writes its trial's just before the row.
    assert expdir.listed_runs(exp.dir) == []
    (expdir.run_dir(exp.dir, runs[1].run_id) / "DONE").write_text("step 1024\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: damaged run index: it lists no run, but runs/ holds 1 runs that began .*`hpcrl sweep`"):
        expdir.listed_runs(exp.dir)
    assert expdir.read_runs_csv(exp.dir) == []  # what a sweep reads: it lists the runs again, under the same ids
    write_experiment(exp, expand(exp), {})
    assert path.read_text() == whole and [r["run_id"] for r in expdir.listed_runs(exp.dir)] == [r.run_id for r in runs]


@pytest.mark.parametrize("command", ["status", "collect"])
def test_status_and_collect_of_a_runs_csv_that_lost_its_rows_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    exp, runs = _swept(tmp_path)
    for run in runs:
        (expdir.run_dir(exp.dir, run.run_id) / "DONE").write_text("step 1024\n")
    path = exp.dir / "runs.csv"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    rc = main([command, str(exp.dir)])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "") and err.count("\n") == 1, out + err
    assert err.startswith(f"hpcrl: error: {path}: damaged run index: it lists no run, but runs/ holds 2 runs that began")
    assert not (exp.dir / "results").exists()
