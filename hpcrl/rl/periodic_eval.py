"""Evaluation during training (`eval.every_steps`): a curve of held-out returns and the best policy.

Every `every_steps` environment steps (at the first iteration boundary at or after each multiple)
and once at the end, the trainer (or the Ape-X learner) plays `eval.periodic_episodes` episodes
with its live policy through evaluate.py's `play`, appends a row to eval_curve.csv (rundir owns
it), and keeps `checkpoints/best.pt` when the mean return beats every earlier evaluation.

It must not change what is learned, so an evaluation is a parenthesis: the python, numpy, torch
(and CUDA) RNG states are saved before and restored after (a stochastic evaluation draws actions
from torch's generator), the policy's train/eval mode is put back, and it plays on its own envs
(the training envs and the recurrent state of the rollout are never touched; `act` keeps its own
memory, cleared before every evaluation). The eval envs stay open across evaluations: building
them each time would be most of the cost for cheap envs.

A two-player game (AlphaZero) plays `periodic_episodes` games against each of `train.opponents`
instead (hpcrl.rl.strength), a row per opponent in strength_curve.csv; each game is an episode of
return +1 / 0 / -1 in eval_curve.csv's mean. Each such evaluation also keeps the policy as a ladder
snapshot (checkpoints/ladder/), the players of the eval stage's Elo ladder; a resumed run drops the
snapshots of the steps it redoes.

Seeds: every evaluation replays the same held-out episodes (PERIODIC_SEED_OFFSET + the run's seed,
one env each from there). Successive evaluations then differ only in the policy, so `best` is the
better policy, not the one that drew easier starts. They are a block of seeds apart from the eval
stage's (EVAL_SEED_OFFSET + seed), so that `eval.checkpoint: best` is scored on episodes that had
no part in choosing it.

The best-so-far (value, step and weights) rides in the regular checkpoint's payload: a requeued
run restores it, and rewrites best.pt when the file on disk came from steps it is about to redo.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from hpcrl import games
from hpcrl.rl import checkpoint, strength
from hpcrl.rl.evaluate import EVAL_SEED_OFFSET, play, play_envs
from hpcrl.store import rundir
from hpcrl.store.expdir import Run

PERIODIC_SEED_OFFSET = 2 * EVAL_SEED_OFFSET
"""Seeds of the evaluations during training: held out from training and from the eval stage."""


class PeriodicEval:
    """The evaluations of one training lifetime; `state_dict` carries the best across lifetimes."""

    def __init__(self, run: Run, rd: Path, policy: torch.nn.Module, device: torch.device, resume_step: int, saved: dict[str, Any] | None, out: TextIO | None) -> None:
        ecfg = run.config.eval
        assert ecfg.every_steps is not None
        self.run, self.policy, self.device, self.out = run, policy, device, out
        self.every, self.episodes, self.deterministic = ecfg.every_steps, ecfg.periodic_episodes, ecfg.deterministic
        self.ckpt_dir = rd / rundir.CHECKPOINTS
        self.next_due = (resume_step // self.every + 1) * self.every
        """Evaluations at steps up to the checkpoint happened before it was written (same iteration)."""
        self.last_step = -1
        self.best: dict[str, Any] | None = saved
        self.log = rundir.EvalCurveLog(rd, resume_step)
        self.envs: Any = None
        self.game = games.load(run.config.env) if games.is_game_env(run.config.env) else None
        """A two-player game (AlphaZero): each evaluation plays train.opponents instead of episodes."""
        self.strength_log = rundir.StrengthCurveLog(rd, resume_step) if self.game is not None else None
        if self.game is not None:
            checkpoint.drop_snapshots_after(self.ckpt_dir, resume_step)
        self._restore_best_file()

    def _restore_best_file(self) -> None:
        """best.pt must be the best of the evaluations this run keeps: one written after the
        checkpoint resumed from (a crash between two checkpoints) belongs to steps being redone."""
        on_disk = checkpoint.load_best(self.ckpt_dir)
        if self.best is None:
            if on_disk is not None:
                (self.ckpt_dir / checkpoint.BEST).unlink()
        elif on_disk is None or int(on_disk["step"]) != int(self.best["step"]):
            self._write_best()

    def due(self, step: int, final: bool) -> bool:
        """At the first boundary at or after each multiple of every_steps, and once at the end."""
        return step >= self.next_due or (final and step != self.last_step)

    def evaluate(self, step: int, wall_time: float) -> dict[str, float]:
        """Play, log a row, keep the best; returns the scalars for the trackers."""
        results = self._play_isolated(step, wall_time)
        returns = np.array([r for r, *_ in results], dtype=float)
        mean, std, length = float(returns.mean()), float(returns.std()), float(np.mean([n for _, n, _ in results]))
        self.log.write([step, f"{wall_time:.3f}", float(mean), float(std), float(length), len(results)])
        self.last_step, self.next_due = step, (step // self.every + 1) * self.every
        if self.best is None or mean > float(self.best["mean_return"]):
            weights = {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}
            self.best = {"step": step, "mean_return": mean, "policy": weights}
            self._write_best()
        print(f"{self.run.run_id}: step {step}: eval mean return {mean:.2f} over {len(results)} episodes (best {float(self.best['mean_return']):.2f} at step {self.best['step']})", file=self.out)
        return {"eval/mean_return": mean, "eval/std_return": std, "eval/mean_length": length, "eval/best_return": float(self.best["mean_return"])}

    def _play_isolated(self, step: int, wall_time: float) -> list[tuple[float, int, dict[str, float]]]:
        rng, training = checkpoint.rng_state(), self.policy.training
        try:
            if self.game is not None:
                return self._play_opponents(step, wall_time)
            if self.envs is None:
                self.envs = play_envs(self.run, self.episodes)
            self.policy.eval()
            return play(self.policy, self.run, self.episodes, self.deterministic, self.device, seed=PERIODIC_SEED_OFFSET + self.run.seed, envs=self.envs)
        finally:
            self.policy.train(training)
            checkpoint.set_rng_state(rng)

    def _play_opponents(self, step: int, wall_time: float) -> list[tuple[float, int, dict[str, float]]]:
        """`periodic_episodes` games against each opponent, the same seeds every time; a row per opponent in strength_curve.csv."""
        assert self.game is not None and self.strength_log is not None
        seed = PERIODIC_SEED_OFFSET + self.run.seed
        random.seed(seed)  # the players' draws too (the RNGs are restored after): evaluations differ only in the policy
        np.random.seed(seed % 2**32)
        by_opponent = strength.evaluate_strength(self.game, self.policy, self.device, self.run.config.train, self.episodes, seed)
        for name, results in by_opponent.items():
            self.strength_log.write([step, f"{wall_time:.3f}", *strength.summary(name, results)])
        checkpoint.snapshot(self.ckpt_dir, step, {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()})
        return [r for results in by_opponent.values() for r in results]

    def _write_best(self) -> None:
        assert self.best is not None
        checkpoint.save_best(self.ckpt_dir, {"agent": {"policy": self.best["policy"]}, "step": self.best["step"], "mean_return": self.best["mean_return"]})

    def state_dict(self) -> dict[str, Any] | None:
        """For the regular checkpoint's payload: the best so far (None before the first evaluation)."""
        return self.best

    def close(self) -> None:
        self.log.close()
        if self.strength_log is not None:
            self.strength_log.close()
        if self.envs is not None:
            self.envs.close()


def start(run: Run, rd: Path, policy: torch.nn.Module, device: torch.device, resume_step: int, saved: dict[str, Any] | None, out: TextIO | None) -> PeriodicEval | None:
    """The run's evaluations during training, or None when `eval.every_steps` is not set. `saved`
    is the `periodic_eval` entry of the checkpoint resumed from (None: fresh, or no best yet)."""
    if run.config.eval.every_steps is None:
        return None
    return PeriodicEval(run, rd, policy, device, resume_step, saved, out)
