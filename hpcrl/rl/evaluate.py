"""`hpcrl eval`: play N episodes with a run's final policy and write eval.csv.

The eval stage runs after the train task on every scheduler; hpcrl.guard.guarded_eval decides from
the run's markers whether there is anything to evaluate, and records a failure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hpcrl import rundir
from hpcrl.guard import guarded_eval
from hpcrl.rl import checkpoint
from hpcrl.rl.envs import episode_metrics, make_vec_env
from hpcrl.rl.networks import obs_to_tensor
from hpcrl.rl.train import algorithm_class, pick_device
from hpcrl.rl.video import record_episodes
from hpcrl.sweep import Run

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation episodes use seeds no training env used."""


def play(policy: torch.nn.Module, run: Run, episodes: int, deterministic: bool, device: torch.device) -> list[tuple[float, int, dict[str, float]]]:
    """Exactly `episodes` episodes, spread evenly over up to 8 parallel envs (no bias to short ones);
    each with its return, length and the task metrics the env reports (Habitat: success, SPL)."""
    n_envs = min(episodes, 8)
    quota = np.array([episodes // n_envs + (i < episodes % n_envs) for i in range(n_envs)])
    envs = make_vec_env(run.config.env, n_envs)
    results: list[tuple[float, int, dict[str, float]]] = []
    try:
        obs, _ = envs.reset(seed=EVAL_SEED_OFFSET + run.seed)
        while len(results) < episodes:
            action = policy.act(obs_to_tensor(obs, device), deterministic)
            obs, _, terminated, truncated, info = envs.step(action.cpu().numpy())
            policy.reset_memory(terminated | truncated)  # a recurrent policy forgets finished episodes
            if "_episode" in info and info["_episode"].any():
                for i in np.flatnonzero(info["_episode"]):
                    if quota[i] > 0:
                        quota[i] -= 1
                        results.append((float(info["episode"]["r"][i]), int(info["episode"]["l"][i]), episode_metrics(info, i)))
    finally:
        envs.close()
    return results


def evaluate_run(experiment_dir: Path, run: Run, out=None) -> int:
    return guarded_eval(experiment_dir, run, lambda rd: _evaluate(rd, run, out), out)


def _evaluate(rd: Path, run: Run, out) -> int:
    ecfg = run.config.eval
    if ecfg.threshold is not None:
        final = rundir.final_return(rd)
        if not final >= ecfg.threshold:
            rundir.mark(rd, rundir.EVAL_SKIPPED, f"final training return {final:.4g} below threshold {ecfg.threshold:g}")
            print(f"{run.run_id}: eval skipped, final training return {final:.4g} < {ecfg.threshold:g}", file=out)
            return 0
    state_dict, problems = checkpoint.load_latest(rd / rundir.CHECKPOINTS)
    if state_dict is None:
        raise FileNotFoundError("no readable checkpoint" + (f" ({'; '.join(problems)})" if problems else ""))
    device = pick_device(run.config.train.device)
    probe = make_vec_env(run.config.env, 1)
    try:
        cls = algorithm_class(run.config.algo)
        policy = cls.make_policy(run.config.train, probe.single_observation_space, probe.single_action_space).to(device)
    finally:
        probe.close()
    policy.load_state_dict(state_dict["agent"]["policy"])
    policy.eval()
    results = play(policy, run, ecfg.episodes, ecfg.deterministic, device)
    if ecfg.video and ecfg.video_episodes:
        for path, frames in record_episodes(policy, run.config.env, ecfg.video_episodes, EVAL_SEED_OFFSET + run.seed, rd / "videos", device):
            print(f"{run.run_id}: wrote {path.name} ({frames} frames)", file=out)
    rundir.write_eval(rd, results)
    mean = float(np.mean([r for r, *_ in results]))
    rundir.mark(rd, rundir.EVAL_DONE, f"mean return {mean:.6g} over {len(results)} episodes")
    print(f"{run.run_id}: eval mean return {mean:.2f} over {len(results)} episodes", file=out)
    return 0
