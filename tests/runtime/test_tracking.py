"""TensorBoard and W&B beside train.csv: real tiny training runs, read back with TensorBoard's own
EventAccumulator (what `tensorboard --logdir` shows) and W&B's offline folder."""

from __future__ import annotations

import importlib.util
import io
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from trainruns import forget_last_checkpoint, make_run, train, train_rows

from hpcrl.runtime import tracking
from hpcrl.store import rundir


def scalars(directory: Path) -> dict[str, list[int]]:
    """Tag -> the steps TensorBoard shows for it (after its purges of redone steps)."""
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


EXPECTED = {
    "ppo": {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate", "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac"},
    "a2c": {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate", "losses/policy_loss", "losses/value_loss", "losses/entropy"},
    "dqn": {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate", "charts/epsilon", "losses/td_loss", "losses/q_values"},
}


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_training_writes_event_files_with_cleanrl_tags_at_every_logged_step(tmp_path: Path, algo: str) -> None:
    exp, run, rd = make_run(tmp_path, {"algo": algo, "tracking": {"tensorboard": True}})
    assert train(exp, run) == 0
    tb = rundir.tensorboard_dir(exp, run.setting_label, run.run_id)
    assert tb == exp / "tensorboard" / "default" / run.run_id and run.run_id.endswith("-s0")
    got = scalars(tb)
    assert EXPECTED[algo] <= set(got)
    rows = train_rows(rd)
    assert got["charts/SPS"] == [int(r["step"]) for r in rows]
    assert got["charts/episodic_return"] == [int(r["step"]) for r in rows if r["episodic_return"]]
    if algo == "dqn":  # TD losses only once learning started
        assert got["losses/td_loss"] == [int(r["step"]) for r in rows if r["td_loss"]]


def test_a_resumed_run_shows_each_step_once(tmp_path: Path) -> None:
    """A crash after a checkpoint: the next lifetime redoes the steps after it; TensorBoard purges
    the first lifetime's events for them, so every step shows once, as in train.csv."""
    exp, run, rd = make_run(tmp_path, {"tracking": {"tensorboard": True}})
    assert train(exp, run) == 0
    resumed_from = forget_last_checkpoint(rd)
    assert train(exp, run) == 0
    tb = rundir.tensorboard_dir(exp, run.setting_label, run.run_id)
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2
    steps = [int(r["step"]) for r in train_rows(rd)]
    assert resumed_from in steps and steps == sorted(set(steps))
    assert scalars(tb)["charts/SPS"] == steps


def test_tensorboard_false_writes_nothing(tmp_path: Path) -> None:
    exp, run, _ = make_run(tmp_path, {"tracking": {"tensorboard": False}})
    assert train(exp, run) == 0
    assert not (exp / "tensorboard").exists()


def test_a_tracker_that_cannot_start_costs_one_line_not_the_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp, run, rd = make_run(tmp_path, {"tracking": {"tensorboard": True}})
    (exp / "tensorboard").write_text("a file where the directory should go\n")
    assert train(exp, run) == 0
    assert (rd / "DONE").exists() and len(train_rows(rd)) == 8
    lines = [line for line in capsys.readouterr().out.splitlines() if "tracking:" in line]
    assert len(lines) == 1 and "tensorboard could not start" in lines[0]


class Raising:
    """A tracker whose backend breaks mid-run (a full disk, a dead service)."""

    name = "raising"

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise AssertionError("a disabled tracker is not closed")


class Recording:
    name = "recording"

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.logged.append((step, dict(scalars)))

    def close(self) -> None:
        pass


def test_a_tracker_that_raises_is_switched_off_with_one_line_and_the_others_go_on() -> None:
    out, recording = io.StringIO(), Recording()
    with tracking.Trackers([Raising(), recording], "abc-s0", out) as trackers:
        trackers.log(128, {"sps": 100.0, "episodic_return": float("nan"), "step": 128})
        trackers.log(256, {"sps": 90.0, "lr": None})
    assert recording.logged == [(128, {"sps": 100.0}), (256, {"sps": 90.0})]
    (line,) = out.getvalue().splitlines()
    assert "raising failed while logging" in line and "No space left on device" in line


def test_tags_follow_cleanrl() -> None:
    assert [tracking.tag(n) for n in ("episodic_return", "sps", "lr", "epsilon", "value_loss", "clipfrac", "eval/mean_return", "queue_depth")] == [
        "charts/episodic_return", "charts/SPS", "charts/learning_rate", "charts/epsilon", "losses/value_loss", "losses/clipfrac", "eval/mean_return", "charts/queue_depth",
    ]  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (pip install 'hpcrl[wandb]')")
def test_wandb_offline_writes_its_run_folder_in_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp, run, rd = make_run(tmp_path, {"tracking": {"tensorboard": False, "wandb": True, "wandb_project": "tests"}})
    assert train(exp, run) == 0
    assert "tracking:" not in capsys.readouterr().out
    (folder,) = (rd / "wandb").glob("offline-run-*")
    assert folder.name.endswith(run.run_id) and list(folder.glob("*.wandb"))


@pytest.mark.redis
@pytest.mark.skipif(importlib.util.find_spec("redis") is None, reason="the Ape-X learner needs the redis client (pip install 'hpcrl[distributed]')")
def test_the_apex_learner_tracks_and_evaluates_its_q_network(tmp_path: Path) -> None:
    """A local sweep of a tiny Ape-X run: the learner writes event files at its train.csv steps,
    evaluates during training, and the eval stage evaluates its best policy."""
    from test_distributed_failures import PY, make_experiment

    exp, rd = make_experiment(tmp_path, {"train": {"total_steps": 1500}, "tracking": {"tensorboard": True}, "eval": {"every_steps": 500, "periodic_episodes": 2, "checkpoint": "best"}})
    proc = subprocess.run([PY, "-m", "hpcrl", "sweep", str(tmp_path / "apex.yaml"), "--scheduler", "local"], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tb,) = (exp / "tensorboard").glob("*/*")
    assert tb.name == rd.name
    assert scalars(tb)["charts/SPS"] == [int(r["step"]) for r in train_rows(rd)]
    steps, _ = rundir.read_eval_curve(rd)
    assert len(steps) >= 3 and steps[-1] == 1500 and (rd / "checkpoints" / "best.pt").exists()
    assert "of the best checkpoint" in rundir.reason(rd, rundir.EVAL_DONE)
