"""collect: missing, failed and corrupt runs are reported by name while the rest aggregate; videos, threshold."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import pytest
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.results import tables
from hpcrl.results.collect import collect
from hpcrl.status import print_status
from hpcrl.store.expdir import run_dir, write_experiment
from hpcrl.sweep.runs import expand


def fake_finished_run(rd: Path, final: float) -> None:
    """What train and eval leave behind, without spending time on training."""
    rows = ["step,iteration,wall_time,sps,episodes,episodic_return,episodic_length"]
    rows += [f"{s * 100},{s},{s},100,1,{final * s / 10:.1f},20" for s in range(1, 11)]
    (rd / "train.csv").write_text("\n".join(rows) + "\n")
    (rd / "DONE").write_text("step 1000\n")
    (rd / "eval.csv").write_text(f"episode,return,length\n0,{final - 1},20\n1,{final + 1},20\n")
    (rd / "EVAL_DONE").write_text("ok\n")


def test_collect_reports_bad_runs_by_name_and_aggregates_the_rest(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path, {"sweep": {"seeds": [0, 1, 2], "grid": {"train.lr": [1e-3, 3e-4]}}})
    exp = load_experiment(config)
    runs = expand(exp)
    write_experiment(exp, runs, {})
    root = exp.dir
    for i, run in enumerate(runs):
        fake_finished_run(run_dir(root, run.run_id), 100.0 + 10 * i)
    corrupt, missing, failed = runs[0], runs[1], runs[3]
    (run_dir(root, corrupt.run_id) / "eval.csv").write_text("garbage\x00\x01,\n1,2,3\n")
    shutil.rmtree(run_dir(root, missing.run_id))
    fd = run_dir(root, failed.run_id)
    (fd / "DONE").unlink()
    (fd / "FAILED").write_text("CUDA error: out of memory\n")

    assert collect(root) == 0
    out = capsys.readouterr().out
    assert f"run {corrupt.run_id}" in out and "corrupt eval.csv" in out
    assert f"run {missing.run_id}" in out and "missing" in out
    assert f"run {failed.run_id}" in out and "CUDA error: out of memory" in out
    summary = {row["setting"]: row for row in csv.DictReader((root / "results" / "summary.csv").open())}
    first, second = summary["train.lr=0.001"], summary["train.lr=0.0003"]
    assert (first["n"], first["n_expected"]) == ("1", "3") and set(first["missing_runs"].split()) == {corrupt.run_id, missing.run_id}
    assert (second["n"], second["n_expected"]) == ("2", "3") and second["missing_runs"] == failed.run_id
    assert float(second["mean"]) == 145.0  # runs 4 and 5: eval means 140 and 150
    improvement = {(r["setting_x"], r["setting_y"]): float(r["p_x_better"]) for r in csv.DictReader((root / "results" / "improvement.csv").open())}
    assert improvement == {("train.lr=0.0003", "train.lr=0.001"): 1.0, ("train.lr=0.001", "train.lr=0.0003"): 0.0}
    report = (root / "results" / "report.md").read_text()
    assert "plots/curves.png" in report and failed.run_id in report
    for name in ("curves", "final", "profile"):
        assert (root / "results" / "plots" / f"{name}.png").stat().st_size > 5000


def test_collect_and_status_name_run_files_that_cannot_be_read_or_decoded(tmp_path: Path, capsys) -> None:
    """A run's file that exists but cannot be read (another user's, a directory in its place, an I/O error of the file
    system) and a marker whose bytes are not UTF-8 each crashed collect and status with a traceback, the other runs'
    results with them. Each is named on its run's line; an unreadable curve costs the run its curve, not its score."""
    exp = load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0, 1, 2, 3, 4]}}))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for i, run in enumerate(runs):
        fake_finished_run(run_dir(exp.dir, run.run_id), 100.0 + 10 * i)
    dirs = [run_dir(exp.dir, run.run_id) for run in runs]
    for rd, name in zip(dirs, ("train.csv", "eval.csv", "eval_curve.csv")):
        (rd / name).unlink(missing_ok=True)
        (rd / name).mkdir()
    (dirs[3] / "DONE").unlink()
    (dirs[3] / "FAILED").write_bytes(b"\xff\xfeOOM in \x1b[31mstep\n")

    assert collect(exp.dir) == 0
    out = capsys.readouterr().out
    said = (
        "no training curve: unreadable train.csv (Is a directory)",
        "unreadable eval.csv (Is a directory)",
        "no evaluation curve: unreadable eval_curve.csv (Is a directory)",
        "train failed: \ufffd\ufffdOOM in \\x1b[31mstep",
    )
    for seed, (rd, words) in enumerate(zip(dirs, said)):
        assert f"run {rd.name} (default, seed {seed}): {words}" in out, out
    summary = next(csv.DictReader((exp.dir / "results" / "summary.csv").open()))
    assert (summary["n"], float(summary["mean"])) == ("3", 120.0)  # seeds 0, 2 and 4: 100, 120 and 140
    (dirs[0] / "DONE").unlink()  # a run under way: status reads its progress from train.csv
    assert print_status(exp.dir, runs=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(dirs[3].name in line and "train failed: \ufffd\ufffdOOM in \\x1b[31mstep" in line for line in lines), lines
    assert any(dirs[0].name in line and "unreadable train.csv (Is a directory)" in line for line in lines), lines


@pytest.mark.e2e
def test_threshold_skips_and_videos_play(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"sweep": {"seeds": [0], "grid": {"eval.threshold": [0.0, 1.0e6]}}, "eval": {"episodes": 2, "video": True}})
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    root = tmp_path / "logs" / "tiny"
    rows = list(csv.DictReader((root / "runs.csv").open()))
    low, high = sorted(rows, key=lambda r: float(r["eval.threshold"]))
    kept, skipped = root / "runs" / low["run_id"], root / "runs" / high["run_id"]
    assert (kept / "EVAL_DONE").exists() and not (skipped / "eval.csv").exists()
    assert "below threshold" in (skipped / "EVAL_SKIPPED").read_text()
    frames = iio.imread(kept / "videos" / "episode-0.mp4")
    assert frames.shape[0] > 5 and frames.shape[-1] == 3 and frames.std() > 0
    assert not (skipped / "videos").exists()
    out = subprocess.run([sys.executable, "-m", "hpcrl", "collect", str(root)], capture_output=True, text=True).stdout
    assert f"run {high['run_id']}" in out and "below threshold" in out


def test_a_finished_run_without_train_csv_is_named_and_curves_say_how_many_seeds(tmp_path: Path, capsys) -> None:
    """Its eval score still counts; its curve cannot, and the curves must not pass for all seeds. A train.csv cut inside
    its header reads as a log without rows: named too, where a whole log whose iterations ended no episode is not."""
    exp = load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0, 1, 2, 3, 4]}}))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for run in runs:
        fake_finished_run(run_dir(exp.dir, run.run_id), 100.0)
    lost, cut, quiet = runs[1], runs[3], runs[4]
    (run_dir(exp.dir, lost.run_id) / "train.csv").unlink()
    with (run_dir(exp.dir, runs[2].run_id) / "train.csv").open("ab") as f:
        f.write(b"1100,11,11,10\0\0\0")  # a torn last line (a node crash) is not damage
    (run_dir(exp.dir, cut.run_id) / "train.csv").write_bytes(b"step,iterat")  # its header cut: not one line
    with (run_dir(exp.dir, quiet.run_id) / "train.csv").open("w") as f:  # whole, no episode ended (AlphaZero's log)
        f.write("step,iteration,wall_time,sps,episodes,episodic_return,episodic_length\n100,1,1,100,0,,\n")

    assert collect(exp.dir) == 0
    out = capsys.readouterr().out
    assert f"run {lost.run_id} (default, seed 1): no training curve: train.csv is missing" in out
    assert f"run {cut.run_id} (default, seed 3): no training curve: train.csv has no complete line" in out
    assert f"run {quiet.run_id}" not in out, "a whole log whose iterations ended no episode was called damaged"
    assert "default: training curve from 2 of 5 seeds" in out and "corrupt" not in out
    assert f"`{lost.run_id}`" in (exp.dir / "results" / "report.md").read_text()
    summary = next(csv.DictReader((exp.dir / "results" / "summary.csv").open()))
    assert summary["n"] == "5"
    assert {row["n_seeds"] for row in csv.DictReader((exp.dir / "results" / "curves.csv").open())} == {"2"}


# --------------------------------------------------------------------------------------------
# What an earlier collect wrote and this one did not (the hostile-input audit): an eval_curves.csv and its
# figures outlived the runs' evaluation curves, every figure outlived a collect of no runs.

EVAL_CURVE = "step,wall_time,mean_return,std_return,mean_length,episodes\n500,1.0,50,1,20,5\n1000,2.0,90,1,20,5\n"
STALE = ("eval_curves.csv", "plots/eval_curves.png", "plots/narrow/eval_curves.png")
USERS = ("notes.md", "plots/mine.png", "plots/narrow/sketch.png")
"""A user's own files in results/: never removed."""


def _evaluated_during_training(tmp_path: Path) -> tuple[Path, list[Path]]:
    exp = load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0, 1]}}))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    dirs = [run_dir(exp.dir, run.run_id) for run in runs]
    for i, rd in enumerate(dirs):
        fake_finished_run(rd, 100.0 + 10 * i)
        (rd / "eval_curve.csv").write_text(EVAL_CURVE)
    return exp.dir, dirs


def _write_users_files(results: Path) -> None:
    for name in USERS:
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text("the user's own\n")


def test_a_collect_removes_what_an_earlier_one_wrote_and_it_did_not(tmp_path: Path, capsys) -> None:
    root, dirs = _evaluated_during_training(tmp_path)
    results = root / "results"
    assert collect(root) == 0
    written = set(tables.collect_files(results))
    assert {p for p in results.rglob("*") if p.is_file()} == written  # every file a collect writes is one it would remove
    assert {results / name for name in STALE} <= written
    _write_users_files(results)
    for rd in dirs:
        (rd / "eval_curve.csv").unlink()
    capsys.readouterr()

    assert collect(root) == 0
    out = capsys.readouterr().out
    assert f"removed 3 files of earlier results that these have no data for: {', '.join(STALE)}" in out
    assert set(tables.collect_files(results)) == written - {results / name for name in STALE}
    assert all((results / name).read_text() == "the user's own\n" for name in USERS)
    assert "eval_curves" not in (results / "report.md").read_text()


def test_a_collect_that_fails_midway_removes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The stale files go after the new set is written: a collect killed or failing before leaves them, and the
    next collect that succeeds removes them."""
    root, dirs = _evaluated_during_training(tmp_path)
    results = root / "results"
    for name in STALE:
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text("an earlier collect's\n")
    for rd in dirs:
        (rd / "eval_curve.csv").unlink()

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tables, "atomic_write_csv", full)  # the disk full at summary.csv
    with pytest.raises(OSError, match="No space left"):
        collect(root)
    assert all((results / name).exists() for name in STALE)
    monkeypatch.undo()
    assert collect(root) == 0
    assert not any((results / name).exists() for name in STALE)


def test_a_collect_of_no_runs_says_why_it_exits_1_and_leaves_no_figure(tmp_path: Path, capsys) -> None:
    """An Optuna study before its first trial lists no run: collect exited 1 with no line saying why, beside
    every figure of an earlier collect."""
    exp = load_experiment(write_config(tmp_path))
    write_experiment(exp, [], {})
    results = exp.dir / "results"
    for name in ("summary.csv", "plots/curves.png", "plots/narrow/curves.png", "plots/final.png", "plots/profile.png"):
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text("an earlier collect's\n")
    _write_users_files(results)

    assert collect(exp.dir) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"{exp.dir}: no run to collect: runs.csv lists none yet (an Optuna study lists each trial's run as it starts)"
    assert {p.relative_to(results).as_posix() for p in results.rglob("*.png")} == {"plots/mine.png", "plots/narrow/sketch.png"}
    assert "removed 4 files of earlier results" in out
