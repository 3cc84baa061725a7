"""`hpcrl eval`: play N episodes with a run's final (or best) policy and write eval.csv.

The eval stage runs after the train task on every scheduler; hpcrl.runtime.guard.guarded_eval decides from
the run's markers whether there is anything to evaluate, and records a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from hpcrl.rl import checkpoint, games, strength
from hpcrl.rl.algorithms import algorithm_class, pick_device
from hpcrl.rl.alphazero import make_network
from hpcrl.rl.envs import episode_metrics, make_vec_env
from hpcrl.rl.networks import obs_to_tensor
from hpcrl.rl.video import record_episodes
from hpcrl.runtime.guard import guarded_eval
from hpcrl.store import rundir
from hpcrl.store.expdir import Run

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation episodes use seeds no training env used."""


def play_envs(run: Run, episodes: int) -> gym.vector.VectorEnv:
    """The vector env `play` steps for `episodes` episodes; a caller that plays many times (the
    evaluations during training) keeps one open instead of building it each time."""
    return make_vec_env(run.config.env, min(episodes, 8))


def play(
    policy: torch.nn.Module, run: Run, episodes: int, deterministic: bool, device: torch.device,
    *, seed: int | None = None, envs: gym.vector.VectorEnv | None = None,
) -> list[tuple[float, int, dict[str, float]]]:
    """Exactly `episodes` episodes, spread evenly over up to 8 parallel envs (no bias to short ones);
    each with its return, length and the task metrics the env reports (Habitat: success, SPL).

    The envs are reset with `seed` (default: EVAL_SEED_OFFSET + the run's seed); `envs` from
    `play_envs` are used and left open, otherwise they are made and closed here."""
    n_envs = min(episodes, 8)
    quota = np.array([episodes // n_envs + (i < episodes % n_envs) for i in range(n_envs)])
    owned = envs is None
    envs = play_envs(run, episodes) if envs is None else envs
    results: list[tuple[float, int, dict[str, float]]] = []
    policy.clear_memory()
    try:
        obs, _ = envs.reset(seed=EVAL_SEED_OFFSET + run.seed if seed is None else seed)
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
        if owned:
            envs.close()
    return results


def eval_device(spec: str) -> torch.device:
    """The device an evaluation runs on: train.device's, or the CPU where that names a GPU the eval
    task does not have. The eval stage asks for `eval.gpus` (0 by default: evaluation is a few
    episodes), so a run trained with `device: cuda` must still be evaluated where no GPU is."""
    if spec.startswith("cuda") and not torch.cuda.is_available():
        return torch.device("cpu")
    return pick_device(spec)


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
    state_dict, which = _checkpoint_to_evaluate(rd, ecfg.checkpoint)
    device = eval_device(run.config.train.device)
    if run.config.train.device.startswith("cuda") and device.type == "cpu":
        print(f"{run.run_id}: train.device is {run.config.train.device}, but this eval task has no GPU (eval.gpus: {ecfg.gpus}): evaluating on the CPU", file=out)
    if games.is_game_env(run.config.env):
        step = int(state_dict["step"] if "step" in state_dict else state_dict["agent"].get("global_step", 0))
        return _evaluate_game(rd, run, state_dict["agent"]["policy"], step, which, device, out)
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
    rundir.mark(rd, rundir.EVAL_DONE, f"mean return {mean:.6g} over {len(results)} episodes of the {which}")
    print(f"{run.run_id}: eval mean return {mean:.2f} over {len(results)} episodes of the {which}", file=out)
    return 0


def _evaluate_game(rd: Path, run: Run, weights: dict, weights_step: int, which: str, device: torch.device, out) -> int:
    """A two-player agent: eval.episodes games against each of train.opponents, both colours;
    every game in eval.csv (return +1 / 0 / -1), the counts per opponent in strength.csv; and the
Elo ladder's round robin (`weights_step` names the evaluated policy in it) in ladder.csv."""
    cfg = run.config.train
    spec = games.load(run.config.env)
    net = make_network(cfg, spec).to(device)  # type: ignore[arg-type]  # cfg is the run's AlphaZeroConfig
    net.load_state_dict(weights)
    net.eval()
    by_opponent = strength.evaluate_strength(spec, net, device, cfg, run.config.eval.episodes, EVAL_SEED_OFFSET + run.seed)
    results = [r for rs in by_opponent.values() for r in rs]
    rundir.write_eval(rd, results)
    rows = [strength.summary(name, rs) for name, rs in by_opponent.items()]
    rundir.write_strength(rd, rows)
    if cfg.ladder_games:
        rundir.write_ladder(rd, _ladder(rd, spec, net, weights_step, cfg, device, EVAL_SEED_OFFSET + run.seed, run.run_id, out))
    text = ", ".join(f"{name}: {w}/{d}/{lost}" for name, _, w, d, lost, *_ in rows)
    rundir.mark(rd, rundir.EVAL_DONE, f"wins/draws/losses {text} ({run.config.eval.episodes} games each) of the {which}")
    print(f"{run.run_id}: eval wins/draws/losses {text} of the {which}", file=out)
    return 0


def _ladder(rd: Path, spec: games.GameSpec, net: torch.nn.Module, step: int, cfg: Any, device: torch.device, seed: int, run_id: str, out) -> list[list[Any]]:
    """The Elo ladder's round robin: `random`, the snapshots of the evaluations during training (at
    most strength.LADDER_PLAYERS) and the evaluated policy, each named by its step. They search
    train.simulations, self-play's, not eval_simulations: a round robin is players^2 / 2 matches.
    A snapshot that does not read (a truncated file, another network's weights) is named in one
    line and left out, and the players are picked again from the rest: one damaged file must not
    fail the eval stage, and with it the run's whole evaluation."""
    sims = cfg.simulations
    saved = {s: path for s, path in checkpoint.snapshots(rd / rundir.CHECKPOINTS) if s != step}
    while True:
        agents: dict[str, strength.Agent] = {}
        for at in strength.ladder_players(list(saved)):
            snap = make_network(cfg, spec).to(device)
            try:
                snap.load_state_dict(checkpoint.load(saved[at], device)["agent"]["policy"])
            except Exception as exc:  # whatever a damaged file makes torch raise
                print(f"{run_id}: left out of the Elo ladder: {rd / rundir.CHECKPOINTS / checkpoint.LADDER / checkpoint.unreadable(saved.pop(at), exc)}", file=out)
                break
            snap.eval()
            agents[str(at)] = strength.mcts_agent(snap, device, spec, sims, cfg.c_puct)
        else:
            break
    agents[str(step)] = strength.mcts_agent(net, device, spec, sims, cfg.c_puct)
    return strength.ladder(spec, agents, cfg.ladder_games, seed, cfg.max_moves)


def _checkpoint_to_evaluate(rd: Path, which: str) -> tuple[dict, str]:
    """(checkpoint, what it is, in words): `best.pt` for `eval.checkpoint: best`, else the newest."""
    ckpt_dir = rd / rundir.CHECKPOINTS
    if which == "best":
        best = checkpoint.load_best(ckpt_dir)
        if best is None:
            raise rundir.RunError(f"eval.checkpoint is 'best' but {ckpt_dir / checkpoint.BEST} does not exist: did the run train with eval.every_steps?")
        return best, f"best checkpoint (step {int(best['step'])}, eval return {float(best['mean_return']):.6g} during training)"
    state_dict, problems = checkpoint.load_latest(ckpt_dir)
    if state_dict is None:
        raise FileNotFoundError("no readable checkpoint" + (f" ({'; '.join(problems)})" if problems else ""))
    return state_dict, f"last checkpoint (step {int(state_dict['agent']['global_step'])})"
