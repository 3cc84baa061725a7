"""The contracts the README makes across sessions, pinned where the mutation audit found them loose.

`benchmarks/mutation.py` mutates sweep.py, rl/checkpoint.py, io.py, templates.py, the markers and
the manifest readers; each test here kills mutants that the rest of the fast suite let through
(named in the docstrings). They go through public behaviour (the CLI, files on disk, public
functions) and pin no hash value: run identity is being re-hashed on canonical values.
"""

from __future__ import annotations

import os
import platform
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from factories import write_config

import hpcrl
from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.io import append_line, atomic_open, atomic_write_text
from hpcrl.rl import checkpoint
from hpcrl.store.expdir import load_run, load_runs, merge_runs, read_runs_csv, run_dir, write_experiment
from hpcrl.sweep.runs import expand
from hpcrl.templates import render, shquote

GRID = {"sweep": {"seeds": [0, 1], "grid": {"train.lr": [1e-3, 3e-4]}}}


# ---------------------------------------------------------------------------------------- run identity


def ids(tmp_path: Path, *overrides: str) -> list[str]:
    return [r.run_id for r in expand(load_experiment(write_config(tmp_path, GRID), list(overrides)))]


def test_run_ids_are_stable_ignore_resources_and_follow_what_is_learned(tmp_path: Path) -> None:
    """README: editing `resources:` does not invalidate finished runs; a new hyperparameter makes new ones."""
    first = ids(tmp_path)
    assert len(set(first)) == 4  # two grid points x two seeds, all distinct
    assert ids(tmp_path) == first  # the same config, read again
    assert ids(tmp_path, "resources.time=07:00:00", "resources.mem=3G") == first
    moved = ids(tmp_path, "train.gamma=0.9")
    assert not set(moved) & set(first)


def test_the_order_of_grid_keys_does_not_change_run_ids(tmp_path: Path) -> None:
    """The same settings are the same runs, however the config lists them."""
    grids = ({"train.lr": [1e-3, 3e-4], "train.gamma": [0.9, 0.99]}, {"train.gamma": [0.9, 0.99], "train.lr": [1e-3, 3e-4]})
    found = [{r.run_id for r in expand(load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0], "grid": g}})))} for g in grids]
    assert found[0] == found[1] and len(found[0]) == 4


def test_a_resweep_keeps_the_index_of_every_run_on_disk(tmp_path: Path) -> None:
    """Runs already on disk keep their index (their manifests and logs name it); new runs take the next ones."""
    exp = load_experiment(write_config(tmp_path, GRID))
    write_experiment(exp, merge_runs(exp.dir, expand(exp)), {})
    before = {row["run_id"]: int(row["index"]) for row in read_runs_csv(exp.dir)}
    assert sorted(before.values()) == [0, 1, 2, 3]

    wider = load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0, 1], "grid": {"train.lr": [1e-2, 1e-3, 3e-4]}}}))
    merged = merge_runs(wider.dir, expand(wider))
    write_experiment(wider, merged, {})
    after = {row["run_id"]: int(row["index"]) for row in read_runs_csv(wider.dir)}
    assert {k: after[k] for k in before} == before
    assert sorted(v for k, v in after.items() if k not in before) == [4, 5]
    assert [r.index for r in merged] == sorted(r.index for r in merged)


def test_each_run_reads_back_its_own_resolved_config(tmp_path: Path) -> None:
    """A task rebuilds its run from disk alone: id, seed, swept values and the config they resolve to."""
    exp = load_experiment(write_config(tmp_path, GRID))
    runs = merge_runs(exp.dir, expand(exp))
    write_experiment(exp, runs, {})
    for run in runs:
        back = load_run(exp.dir, run.index)
        assert (back.index, back.run_id, back.seed, back.settings) == (run.index, run.run_id, run.seed, run.settings)
        assert back.config.sweep.seeds == [run.seed] and back.config.train.lr == run.settings["train.lr"]
    assert [r.run_id for r in load_runs(exp.dir)] == [r.run_id for r in runs]
    with pytest.raises(ConfigError, match=f"no run with index {len(runs)}"):
        load_run(exp.dir, len(runs))
    with pytest.raises(ConfigError, match=r"^\S*elsewhere: not an experiment directory \(no runs.csv\)"):
        load_run(tmp_path / "elsewhere", 0)  # a job's or user's mistyped path: not a run index that lacks a row


def test_experiment_yaml_records_the_resolved_config_and_its_provenance(tmp_path: Path) -> None:
    """README: experiment.yaml holds the resolved config + provenance (hpcrl version, git commit, host)."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    config = write_config(tmp_path, GRID)
    subprocess.run([*git, "add", "config.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "config"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    exp = load_experiment(config)
    write_experiment(exp, merge_runs(exp.dir, expand(exp)), {"scheduler": "local"})
    recorded = yaml.safe_load((exp.dir / "experiment.yaml").read_text())
    assert recorded["config"] == exp.to_dict()
    prov = recorded["provenance"]
    assert (prov["git_commit"], prov["config_file"], prov["hpcrl_version"], prov["host"], prov["scheduler"]) == (head, str(config.resolve()), hpcrl.__version__, platform.node(), "local")


# ---------------------------------------------------------------------------------------- atomic writes


def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    atomic_write_text(path, "old\n")
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]
    atomic_write_text(path, "new\n", durable=False)
    assert path.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_written_files_follow_the_umask_like_any_other_file(tmp_path: Path) -> None:
    """Results are shared with a group: an atomic write must not leave mkstemp's private 0600 mode."""
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a", "x")
        (tmp_path / "b").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == (tmp_path / "b").stat().st_mode & 0o777 == 0o644


def test_appended_lines_are_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    append_line(path, "step,return")
    append_line(path, "1,2\n")
    assert path.read_text() == "step,return\n1,2\n"


# ---------------------------------------------------------------------------------------- checkpoints


class _FailsToPickle:
    """A value torch.save reaches after it has started writing the file: a write that dies half-way."""

    def __reduce__(self):
        raise OSError("No space left on device")


def test_a_checkpoint_write_that_fails_half_way_keeps_the_previous_one(tmp_path: Path) -> None:
    """README: a requeued job resumes from its checkpoint. A failed save must not cost the previous one."""
    checkpoint.save(tmp_path, 100, {"w": torch.arange(4.0)})
    with pytest.raises(OSError, match="No space"):
        checkpoint.save(tmp_path, 200, {"w": torch.ones(1000), "z": _FailsToPickle()})
    assert [p.name for p in tmp_path.iterdir()] == [p.name for p in checkpoint.checkpoint_files(tmp_path)] and len(list(tmp_path.iterdir())) == 1
    state, problems = checkpoint.load_latest(tmp_path)
    assert state is not None and torch.equal(state["w"], torch.arange(4.0)) and problems == []


def test_resume_skips_an_unreadable_newest_checkpoint_and_says_so(tmp_path: Path) -> None:
    """README: resume from the newest READABLE checkpoint (a node died mid-write on a non-atomic filesystem)."""
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step * 10, {"step": step}, keep=3)
    newest = checkpoint.checkpoint_files(tmp_path)[0]
    assert newest.name.startswith("step-000000000030-")
    newest.write_bytes(newest.read_bytes()[:50])
    state, problems = checkpoint.load_latest(tmp_path)
    assert state == {"step": 2}
    assert len(problems) == 1 and problems[0].startswith(f"{newest.name}: unreadable")
    for path in tmp_path.iterdir():
        path.write_bytes(b"garbage")
    with pytest.raises(checkpoint.UnreadableCheckpoints, match="none of the 3 checkpoints"):
        checkpoint.load_latest(tmp_path)  # never a silent restart from step 0
    assert checkpoint.load_latest(tmp_path / "never-made") == (None, [])


def test_save_keeps_the_newest_checkpoints_and_resume_reads_the_newest(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        checkpoint.save(tmp_path, step, {"step": step}, keep=2)
    assert sorted(p.name.split("-")[1] for p in tmp_path.iterdir()) == ["000000000015", "000000000020"]
    assert checkpoint.load_latest(tmp_path)[0] == {"step": 20}
    checkpoint.save(tmp_path, 100, {"step": 100})  # the default keeps two as well
    assert sorted(p.name.split("-")[1] for p in tmp_path.iterdir()) == ["000000000020", "000000000100"]


class _RunsCode:
    """What a foreign or tampered checkpoint could hold: unpickling it would run os.mkdir."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_checkpoint_that_would_run_code_is_refused_not_run(tmp_path: Path) -> None:
    """Checkpoints are weights only: a file from disk is data, never code (DESIGN: rl/checkpoint.py)."""
    directory, ran = tmp_path / "checkpoints", tmp_path / "code-ran"
    directory.mkdir()
    torch.save({"w": torch.zeros(1), "x": _RunsCode(ran)}, directory / "step-000000000001.pt")
    with pytest.raises(checkpoint.UnreadableCheckpoints, match="Weights only load failed"):
        checkpoint.load_latest(directory)
    assert not ran.exists()


def test_rng_states_survive_a_checkpoint_and_replay_the_same_draws(tmp_path: Path) -> None:
    """README: every checkpoint carries the RNG states, so a requeued job continues where it stopped."""
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    checkpoint.save(tmp_path, 1, {"rng": checkpoint.rng_state()})
    draws = (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint.set_rng_state(checkpoint.load_latest(tmp_path)[0]["rng"])
    assert (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()) == draws


def test_numpy_state_round_trips_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    replay = {"obs": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2], "meta": {"pos": np.array([3])}, "size": 2}
    checkpoint.save(tmp_path, 1, {"replay": checkpoint.numpy_to_torch(replay)})
    back = checkpoint.torch_to_numpy(checkpoint.load_latest(tmp_path)[0]["replay"])
    assert back["size"] == 2 and back["meta"]["pos"].tolist() == [3]
    assert isinstance(back["obs"], np.ndarray) and back["obs"].tolist() == replay["obs"].tolist()


# ---------------------------------------------------------------------------------------- shell quoting


@pytest.mark.parametrize("value", ["plain", "two words", "it's", "$(touch pwned)", "`id`; rm -rf /", "a\nb", "", "*", 3e-4, 7])
def test_a_quoted_value_reaches_the_shell_as_one_literal_word(value, tmp_path: Path) -> None:
    """README: values that reach a shell are quoted (a hyperparameter cannot run a command)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\n' {shquote(value)} | wc -l; printf %s {shquote(value)}"], capture_output=True, text=True, cwd=tmp_path, check=True)
    count, _, text = out.stdout.partition("\n")
    assert text == str(value) and int(count) == 1 + str(value).count("\n")
    assert list(tmp_path.iterdir()) == []


def test_booleans_and_none_reach_the_shell_as_yaml_reads_them_back() -> None:
    assert [shquote(v) for v in (True, False, None)] == ["true", "false", "null"]


def test_a_template_typo_is_an_error_not_an_empty_string(tmp_path: Path) -> None:
    (tmp_path / "job_templates").mkdir()
    (tmp_path / "job_templates" / "t.sh.j2").write_text("echo {{ argv | shquote }} {{ misspelt }}\n")
    with pytest.raises(Exception, match="misspelt"):
        render("job_templates", "t.sh.j2", {"argv": "x"}, cwd=tmp_path)
    (tmp_path / "job_templates" / "t.sh.j2").write_text("echo {{ argv | shquote }}\n")
    assert render("job_templates", "t.sh.j2", {"argv": "a b"}, cwd=tmp_path) == "echo 'a b'\n"


# ---------------------------------------------------------------------------------------- task -> run, markers


def experiment_on_disk(tmp_path: Path) -> Path:
    exp = load_experiment(write_config(tmp_path, GRID))
    write_experiment(exp, merge_runs(exp.dir, expand(exp)), {})
    return exp.dir


def test_eval_task_i_reads_the_run_on_manifest_line_i(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README: a manifest's line i is the run index of task i (retries and chunks are plain 1-N arrays)."""
    root = experiment_on_disk(tmp_path)
    runs = {r.index: r for r in load_runs(root)}
    (root / "jobs" / "0-0.tasks").write_text("3\n0\n2\n")
    (run_dir(root, runs[2].run_id) / "FAILED").write_text("CUDA error: out of memory\n")
    (run_dir(root, runs[3].run_id) / "EVAL_DONE").write_text("from an earlier config\n")
    for task, index in ((1, 3), (2, 0), (3, 2)):
        assert main(["eval", str(root), "--manifest", "jobs/0-0.tasks", "--task", str(task)]) == 0
        assert capsys.readouterr().out.startswith(f"{runs[index].run_id}: eval skipped")
    skipped = sorted(i for i, r in runs.items() if (run_dir(root, r.run_id) / "EVAL_SKIPPED").exists())
    assert skipped == [0, 2, 3]
    assert "CUDA error: out of memory" in (run_dir(root, runs[2].run_id) / "EVAL_SKIPPED").read_text()
    assert not list(root.glob("runs/*/EVAL_DONE"))  # README: EVAL_DONE | EVAL_SKIPPED, never both
    # Without --manifest, the task id is the run index.
    assert main(["eval", str(root), "--task", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"{runs[1].run_id}: eval skipped")


def test_an_eval_task_of_a_failed_run_marks_it_skipped_without_loading_torch(tmp_path: Path) -> None:
    """Every scheduler starts the eval task of a run whose training failed (SGE regardless of the dependency, the
    local runner after any end): it only marks the run skipped, so it must not pay for torch (~2 CPU-s a task),
    nor for Jinja, which only a process that renders a job script needs (every job imports hpcrl.templates)."""
    root = experiment_on_disk(tmp_path)
    run = {r.index: r for r in load_runs(root)}[1]
    (run_dir(root, run.run_id) / "FAILED").write_text("CUDA error: out of memory\n")
    probe = "import sys; from hpcrl.cli import main; rc = main(sys.argv[1:]); print('torch' in sys.modules, 'jinja2' in sys.modules, rc)"
    done = subprocess.run([sys.executable, "-c", probe, "eval", str(root), "--task", "1"], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == [f"{run.run_id}: eval skipped, train failed", "False False 0"], done.stdout + done.stderr
    assert "CUDA error: out of memory" in (run_dir(root, run.run_id) / "EVAL_SKIPPED").read_text()


@pytest.mark.e2e
def test_a_retried_run_is_not_left_marked_failed_while_it_trains_again(tmp_path: Path) -> None:
    """A retry clears the earlier FAILED as it starts: `status` must not call a run failed while it trains,
    nor after a requeue (exit 99 leaves no marker of its own)."""
    exp = load_experiment(write_config(tmp_path, {**GRID, "train": {"total_steps": 10**6}}))
    write_experiment(exp, merge_runs(exp.dir, expand(exp)), {})
    rd = run_dir(exp.dir, load_run(exp.dir, 0).run_id)
    (rd / "FAILED").write_text("the earlier attempt\n")
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "train", str(exp.dir), "--task", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (rd / "train.csv").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR1)  # the scheduler's warning: checkpoint and exit 99 for a requeue
        assert proc.wait(timeout=120) == 99, proc.stderr.read()
    finally:
        proc.kill()
    assert not (rd / "FAILED").exists() and not (rd / "DONE").exists()


@pytest.mark.parametrize("task", [0, 4])
def test_a_task_outside_its_manifest_is_one_line_and_exit_2(tmp_path: Path, task: int, capsys: pytest.CaptureFixture[str]) -> None:
    root = experiment_on_disk(tmp_path)
    (root / "jobs" / "0-0.tasks").write_text("3\n0\n2\n")
    assert main(["eval", str(root), "--manifest", "jobs/0-0.tasks", "--task", str(task)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--task {task}" in err and "3 tasks" in err
    assert not list(root.glob("runs/*/EVAL_*"))


def test_actor_tasks_outside_their_manifest_are_refused(tmp_path: Path) -> None:
    from hpcrl.store.rundir import actor_of_task

    (tmp_path / "a.tasks").write_text("4\n4\n7\n7\n")
    assert actor_of_task(tmp_path, "a.tasks", 4) == (7, 1)
    for task in (0, 5):
        with pytest.raises(ConfigError, match=f"--task {task}: .* has 4 tasks"):
            actor_of_task(tmp_path, "a.tasks", task)


def test_status_reads_done_and_failed_from_the_markers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README: markers on disk are the truth for finished work; a failure's reason is shown."""
    root = experiment_on_disk(tmp_path)
    runs = load_runs(root)
    (run_dir(root, runs[0].run_id) / "DONE").write_text("step 1024\n")
    (run_dir(root, runs[1].run_id) / "FAILED").write_text("CUDA error: out of memory\nmore\n")
    (run_dir(root, runs[2].run_id) / "EVAL_DONE").write_text("ok\n")
    assert main(["status", str(root)]) == 0
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()}
    assert lines[runs[0].run_id].split()[4:6] == ["done", "100%"]
    assert lines[runs[1].run_id].split()[4] == "failed" and lines[runs[1].run_id].endswith("CUDA error: out of memory")
    assert lines[runs[2].run_id].split()[-1] == "done"  # train not submitted, eval done
