"""The local executor's own behaviours: detach, Ctrl-C, kill -9, warnings, the progress line.

The end to end itself (sweep -> train -> eval -> aggregate in order, summary per setting, plots, provenance,
a resweep that submits nothing; a failed run reported and only it retried) is test_conformance.py's, on
local processes as on Slurm and Grid Engine."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import write_config

PY = sys.executable


def hpcrl(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def local_state(exp: Path) -> dict:
    return json.loads((exp / "jobs" / "local-state.json").read_text())["jobs"]


@pytest.mark.e2e
def test_detach_status_and_cancel(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"train": {"total_steps": 10_000_000}, "sweep": {"seeds": [0, 1, 2]}, "resources": {"max_concurrent": 1}})
    exp = tmp_path / "logs" / "tiny"
    proc = hpcrl("sweep", str(config), "--scheduler", "local", "--detach", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "background" in proc.stdout
    deadline = time.time() + 60
    while time.time() < deadline and not list(exp.glob("runs/*/checkpoints/*.pt")):
        time.sleep(0.5)
    status = hpcrl("status", str(exp), cwd=tmp_path).stdout
    assert "running" in status and "pending" in status
    assert hpcrl("cancel", str(exp), cwd=tmp_path).returncode == 0
    state = local_state(exp)
    assert all(s["state"] == "cancelled" for tasks in state.values() for s in tasks.values())
    status = hpcrl("status", str(exp), cwd=tmp_path).stdout
    assert "running" not in status and "cancelled" in status


@pytest.mark.e2e
def test_killed_train_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """SIGKILL (no chance to save) mid-run; the rerun resumes from the last checkpoint and finishes."""
    config = write_config(tmp_path, {"train": {"total_steps": 40_000, "checkpoint_every": 5}, "sweep": {"seeds": [0]}})
    exp = tmp_path / "logs" / "tiny"
    assert hpcrl("sweep", str(config), "--scheduler", "local", "--dry-run", cwd=tmp_path).returncode == 0
    # Write the experiment without running it, then drive `hpcrl train` directly as a job would.
    from hpcrl.config.load import load_experiment
    from hpcrl.store.expdir import write_experiment
    from hpcrl.sweep.runs import expand

    runs = expand(load_experiment(config))
    write_experiment(load_experiment(config), runs, {})
    rd = exp / "runs" / runs[0].run_id
    child = subprocess.Popen([PY, "-m", "hpcrl", "train", str(exp), "--task", "0"], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(list((rd / "checkpoints").glob("*.pt"))) < 2:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    saved = max(int(p.stem.split("-")[1]) for p in (rd / "checkpoints").glob("*.pt"))
    assert 0 < saved < 40_000 and not (rd / "DONE").exists()
    rerun = hpcrl("train", str(exp), "--task", "0", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from step {saved}" in rerun.stdout
    steps = [int(r["step"]) for r in csv.DictReader((rd / "train.csv").open())]
    assert steps == sorted(set(steps)) and steps[-1] >= 39_000  # no step logged twice
    assert (rd / "DONE").exists()


@pytest.mark.e2e
def test_warning_signal_checkpoints_and_asks_for_requeue(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"train": {"total_steps": 10_000_000, "checkpoint_every": 1000}, "sweep": {"seeds": [0]}})
    from hpcrl.config.load import load_experiment
    from hpcrl.store.expdir import write_experiment
    from hpcrl.sweep.runs import expand

    runs = expand(load_experiment(config))
    write_experiment(load_experiment(config), runs, {})
    exp = tmp_path / "logs" / "tiny"
    rd = exp / "runs" / runs[0].run_id
    child = subprocess.Popen([PY, "-m", "hpcrl", "train", str(exp), "--task", "0"], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not (rd / "train.csv").exists():
        time.sleep(0.05)
    time.sleep(1)
    child.send_signal(signal.SIGUSR1)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 99, out
    saved = [p for p in (rd / "checkpoints").glob("*.pt")]
    assert len(saved) == 1 and "asking for a requeue" in out


def test_sweep_with_missing_image_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"container": {"image": str(tmp_path / "nope.sif")}})
    proc = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path)
    assert proc.returncode == 2
    assert "container.image" in proc.stderr and "hpcrl build-image" in proc.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.e2e
def test_ctrl_c_stops_children_and_the_next_sweep_resumes(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"train": {"total_steps": 60_000, "checkpoint_every": 1000}, "sweep": {"seeds": [0]}})
    exp = tmp_path / "logs" / "tiny"
    # Like a terminal's Ctrl-C: SIGINT to the foreground process group.
    child = subprocess.Popen([PY, "-m", "hpcrl", "sweep", str(config), "--scheduler", "local"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(exp.glob("runs/*/train.csv")):
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(child.pid, signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 130, out
    rd = next(exp.glob("runs/*"))
    assert not (rd / "DONE").exists() and list((rd / "checkpoints").glob("*.pt")), "the stopped run kept no checkpoint"
    assert "pgrep" not in out
    again = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path)
    assert again.returncode == 0 and (rd / "DONE").exists()
    log = next((exp / "jobs" / "logs").glob("train-1-0.1.out")).read_text()
    assert "resumed from step" in log


@pytest.mark.e2e
def test_a_foreground_sweep_whose_reader_leaves_runs_to_its_end(tmp_path: Path) -> None:
    """`hpcrl sweep c.yaml | head -n 1`: head leaves after the first line. The sweep died of the broken pipe
    and its local jobs were cancelled with it, exit 0; now it prints nowhere and finishes the experiment."""
    config = write_config(tmp_path, {"train": {"total_steps": 2048}, "sweep": {"seeds": [0]}})
    proc = subprocess.run(["bash", "-c", f"{PY} -m hpcrl sweep {config} --scheduler local | head -n 1; exit ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1 and not proc.stderr, proc.stdout + proc.stderr
    status = json.loads(hpcrl("status", str(tmp_path / "logs" / "tiny"), "--json", cwd=tmp_path).stdout)
    assert [(r["train"], r["eval"]) for r in status["runs"]] == [("done", "done")] and status["aggregate"] == "done", status


@pytest.mark.e2e
def test_the_progress_line_counts_each_stage_as_status_shows_it(tmp_path: Path) -> None:
    """A run that fails training: its evaluation is skipped (exit 0) and collect, with no run scored,
    writes the summary naming it and exits 1. The progress line counted the skipped eval as done and
    the aggregate as failed while `status` said skipped and done; both now apply status's one rule,
    under which a summary without a score is a failed aggregate (issue 25, item 9)."""
    repo = Path(__file__).resolve().parents[2]
    command = f"program.command=[{PY}, tests/programs/counter_trainer.py]"
    overrides = [f"output={tmp_path / 'logs'}", f"program.workdir={repo}", command, "program.params.fail_at=3", "sweep.seeds=[0]"]
    proc = hpcrl("sweep", str(repo / "tests" / "data" / "program_counter.yaml"), "--scheduler", "local", *overrides, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the run failed
    assert proc.stdout.splitlines()[-1] == "train 0/1 done, 1 failed | eval 0/1 done, 1 skipped | aggregate 0/1 done, 1 failed", proc.stdout
    status = json.loads(hpcrl("status", str(tmp_path / "logs" / "counter"), "--json", cwd=tmp_path).stdout)
    assert [(r["train"], r["eval"]) for r in status["runs"]] == [("failed", "skipped")] and status["aggregate"] == "failed"


@pytest.mark.e2e
def test_a_failed_run_is_worded_once_and_its_control_characters_never_reach_the_terminal(tmp_path: Path) -> None:
    """A program whose last line clears the screen and recolours it, then exits 1: the job's log,
    `status` and `collect` word the failure alike (`train failed: ...`, one function), escaped."""
    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "bad.py").write_text("import sys\nsys.stderr.write('\\x1b[2J\\x1b[31mboom\\x1b[0m\\x07\\n')\nsys.exit(1)\n")
    overrides = [f"output={tmp_path / 'logs'}", f"program.workdir={tmp_path}", f"program.command=[{PY}, bad.py]", "sweep.seeds=[0]"]
    proc = hpcrl("sweep", str(repo / "tests" / "data" / "program_counter.yaml"), "--scheduler", "local", *overrides, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    exp = tmp_path / "logs" / "counter"
    wording = "train failed: program exited with 1: \\x1b[2J\\x1b[31mboom\\x1b[0m\\x07"
    run_id = next(csv.DictReader((exp / "runs.csv").open()))["run_id"]
    for command in (["status", str(exp)], ["status", str(exp), "--summary"], ["collect", str(exp)]):
        shown = hpcrl(*command, cwd=tmp_path)
        printed = shown.stdout + shown.stderr
        assert "\x1b" not in printed and "\x07" not in printed, (command, printed)
        assert wording[:60] in printed, (command, printed)
    assert f"): {wording}\n" in hpcrl("collect", str(exp), cwd=tmp_path).stdout
    log = (exp / "jobs" / "logs" / "train-0-0.1.out").read_text()
    assert f"hpcrl: error: {run_id}: {wording}\n" in log, log
