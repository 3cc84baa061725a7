"""Evaluation during training (eval.every_steps): rows at the right steps, nothing learned
differently, the best policy kept across a requeue and evaluated by the eval stage when asked."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from factories import write_config
from trainruns import forget_last_checkpoint, make_run, train, train_rows

from hpcrl import cli
from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.rl import checkpoint
from hpcrl.rl.evaluate import evaluate_run
from hpcrl.store import rundir

EVERY = {"eval": {"every_steps": 300, "periodic_episodes": 3, "deterministic": False}}
"""Iterations end at 128, 256, ...; due at the first boundary at or after 300, 600, 900, and at the end."""


def eval_rows(rd: Path) -> list[dict[str, str]]:
    with (rd / rundir.EVAL_CURVE).open(newline="") as f:
        return list(csv.DictReader(f))


def test_evaluations_at_the_first_boundary_after_each_multiple_and_at_the_end(tmp_path: Path) -> None:
    exp, run, rd = make_run(tmp_path, EVERY)
    assert train(exp, run) == 0
    rows = eval_rows(rd)
    assert list(rows[0]) == list(rundir.EVAL_CURVE_COLUMNS)
    assert [int(r["step"]) for r in rows] == [384, 640, 1024]  # 1024: both >= 900 and the end, once
    assert all(int(r["episodes"]) == 3 for r in rows)
    steps, returns = rundir.read_eval_curve(rd)
    assert steps.tolist() == [384, 640, 1024] and returns.tolist() == [float(r["mean_return"]) for r in rows]


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_evaluating_during_training_does_not_change_what_is_learned(tmp_path: Path, algo: str) -> None:
    """Stochastic evaluations draw from torch's RNG: without the parenthesis around them, every
    later minibatch and action would differ."""
    logs = []
    for name, changes in (("plain", {}), ("evaluated", EVERY)):
        exp, run, rd = make_run(tmp_path / name, {"algo": algo, **changes})
        assert train(exp, run) == 0
        logs.append([{k: v for k, v in r.items() if k not in ("wall_time", "sps")} for r in train_rows(rd)])
    assert logs[0] == logs[1] and len(logs[0]) > 5
    assert (rd / rundir.EVAL_CURVE).exists()


def test_the_best_checkpoint_is_the_argmax_and_survives_a_requeue(tmp_path: Path) -> None:
    exp, run, rd = make_run(tmp_path, {"eval": {"every_steps": 128, "periodic_episodes": 2}})
    assert train(exp, run) == 0
    steps, returns = rundir.read_eval_curve(rd)
    best = checkpoint.load_best(rd / "checkpoints")
    assert best is not None and best["step"] == steps[np.argmax(returns)] and best["mean_return"] == pytest.approx(returns.max(), rel=1e-5)
    assert [p.name for p in checkpoint.checkpoint_files(rd / "checkpoints")][0].startswith("step-")  # never resumed from

    resumed_from = forget_last_checkpoint(rd)
    saved = checkpoint.load_latest(rd / "checkpoints")[0]["periodic_eval"]
    assert saved["step"] <= resumed_from
    assert train(exp, run) == 0
    steps, returns = rundir.read_eval_curve(rd)
    assert steps.tolist() == list(range(128, 1025, 128))  # cut back to the checkpoint, redone once each
    best = checkpoint.load_best(rd / "checkpoints")
    assert best["step"] == steps[np.argmax(returns)] and best["mean_return"] == pytest.approx(returns.max(), rel=1e-5)
    assert (rd / "checkpoints" / checkpoint.BEST).exists() and len(checkpoint.checkpoint_files(rd / "checkpoints")) == 2


def test_the_eval_stage_evaluates_the_best_checkpoint_when_asked_and_fails_clearly_without_it(tmp_path: Path) -> None:
    exp, run, rd = make_run(tmp_path, {"eval": {"every_steps": 256, "periodic_episodes": 2, "checkpoint": "best", "episodes": 2}})
    assert train(exp, run) == 0
    best_step = int(checkpoint.load_best(rd / "checkpoints")["step"])
    assert evaluate_run(exp, run) == 0
    assert rundir.reason(rd, rundir.EVAL_DONE).endswith(f"of the best checkpoint (step {best_step}, eval return {checkpoint.load_best(rd / 'checkpoints')['mean_return']:.6g} during training)")

    (rd / "checkpoints" / checkpoint.BEST).unlink()
    assert evaluate_run(exp, run) == 1
    (line,) = rundir.reason(rd, rundir.EVAL_FAILED).splitlines()
    assert "eval.checkpoint is 'best'" in line and "best.pt does not exist" in line


def test_the_eval_stage_says_it_evaluated_the_last_checkpoint(tmp_path: Path) -> None:
    exp, run, rd = make_run(tmp_path)
    assert train(exp, run) == 0
    assert evaluate_run(exp, run) == 0
    assert "of the last checkpoint (step 1024)" in rundir.reason(rd, rundir.EVAL_DONE)


def test_best_without_every_steps_is_refused_by_sweep_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = write_config(tmp_path, {"eval": {"checkpoint": "best"}})
    assert cli.main(["sweep", str(config), "--dry-run", "--scheduler", "local"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval.checkpoint: 'best' needs eval.every_steps" in err


@pytest.mark.parametrize(
    ("key", "value"),
    [("every_steps", 0), ("every_steps", -1), ("every_steps", float("nan")), ("every_steps", 1e30), ("every_steps", "often"), ("periodic_episodes", 0), ("periodic_episodes", -3)],
)
def test_hostile_values_are_refused_with_their_key_path(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"eval\.{key}: "):
        load_experiment(write_config(tmp_path, {"eval": {key: value}}))


def test_a_run_trained_for_cuda_is_evaluated_on_the_cpu_of_an_eval_task_without_gpu(tmp_path: Path) -> None:
    """The eval stage asks for eval.gpus (0 by default): `train.device: cuda` must not fail it with
    "No CUDA GPUs are available" (seen on a GPU node), it evaluates on the CPU and says so."""
    import io

    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA, as an eval task without GPUs is")
    exp, run, rd = make_run(tmp_path)
    assert train(exp, run) == 0
    cuda_run = dataclasses.replace(run, config=dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, device="cuda")))
    out = io.StringIO()
    assert evaluate_run(exp, cuda_run, out) == 0
    assert (rd / "EVAL_DONE").exists()
    assert "this eval task has no GPU (eval.gpus: 0): evaluating on the CPU" in out.getvalue()


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_evaluating_a_checkpoint_again_plays_the_same_episodes(tmp_path: Path, algo: str) -> None:
    """Sampled actions (eval.deterministic false) come from a generator of the eval seed, not from torch's
    global RNG, which a process seeds at random: evaluating the same checkpoint twice, with whatever that
    RNG holds, writes the same eval.csv (a ViZDoom policy's eval stage read 79.25 and 76.35 before)."""
    import torch

    exp, run, rd = make_run(tmp_path, {"algo": algo, "eval": {"deterministic": False, "episodes": 6}})
    assert train(exp, run) == 0
    tables = []
    for draw in (1, 2):
        torch.manual_seed(draw)
        assert evaluate_run(exp, run) == 0
        tables.append((rd / "eval.csv").read_text())
    assert tables[0] == tables[1] and len(tables[0].splitlines()) == 7
