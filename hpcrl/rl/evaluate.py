"""`hpcrl eval`: play N episodes with a run's final (or best) policy and write eval.csv.

The eval stage runs after the train task on every scheduler; hpcrl.runtime.guard.guarded_eval decides from
the run's markers whether there is anything to evaluate, and records a failure. It sets torch up as
training does (`train.torch_threads`): left at torch's default, a thread per core of the node, the
small forward passes of a game's searches spent 20 ms each instead of 0.3 on a busy 2-core VM (and
an eval task given one core of a 64-core node runs 64 threads on it).

A two-player game's eval stage plays for minutes (`eval.episodes` games against each opponent, then
the Elo ladder): it prints what it will play and which keys size that as it starts, then each
match's games as they finish, at least every PROGRESS_EVERY_S seconds (flushed: a job's log is a
file), and keeps the same in the run's eval_progress file for `hpcrl status`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import gymnasium as gym
import numpy as np
import torch

from hpcrl import games
from hpcrl.rl import checkpoint, strength
from hpcrl.rl.algorithms import algorithm_class, pick_device, setup_torch
from hpcrl.rl.alphazero import make_network
from hpcrl.rl.envs import episode_metrics, make_vec_env
from hpcrl.rl.networks import obs_to_tensor
from hpcrl.rl.video import record_episodes
from hpcrl.runtime.guard import guarded_eval
from hpcrl.store import rundir
from hpcrl.store.expdir import Run

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation episodes use seeds no training env used."""
PROGRESS_EVERY_S = 20.0
"""The longest a game's eval stage goes without a line on its log (and a new eval_progress)."""


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

    The envs are reset with `seed` (default: EVAL_SEED_OFFSET + the run's seed), and sampled actions
    are drawn from a generator of that seed, so the same weights play the same episodes whenever and
    wherever they are evaluated (drawn from torch's global RNG, an eval stage's figures changed from
    one evaluation of a checkpoint to the next: 79.25 and 76.35 for one ViZDoom policy); `envs` from
    `play_envs` are used and left open, otherwise they are made and closed here."""
    n_envs = min(episodes, 8)
    quota = np.array([episodes // n_envs + (i < episodes % n_envs) for i in range(n_envs)])
    owned = envs is None
    envs = play_envs(run, episodes) if envs is None else envs
    results: list[tuple[float, int, dict[str, float]]] = []
    policy.clear_memory()
    try:
        seed = EVAL_SEED_OFFSET + run.seed if seed is None else seed
        generator = torch.Generator(device=device).manual_seed(seed)
        obs, _ = envs.reset(seed=seed)
        while len(results) < episodes:
            action = policy.act(obs_to_tensor(obs, device), deterministic, generator)
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
    return guarded_eval(experiment_dir, run, lambda rd: evaluate_trained(rd, run, out), out)


def evaluate_trained(rd: Path, run: Run, out) -> int:
    """The evaluation of run `run` in `rd`, whose training is done (guard.guarded_eval decides that)."""
    ecfg = run.config.eval
    if ecfg.threshold is not None:
        final = rundir.final_return(rd)
        if not final >= ecfg.threshold:
            rundir.mark(rd, rundir.EVAL_SKIPPED, f"final training return {final:.4g} below threshold {ecfg.threshold:g}")
            print(f"{run.run_id}: eval skipped, final training return {final:.4g} < {ecfg.threshold:g}", file=out)
            return 0
    state_dict, which = _checkpoint_to_evaluate(rd, ecfg.checkpoint)
    device = setup_torch(run.config.train.torch_threads, str(eval_device(run.config.train.device)))
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


class EvalProgress:
    """What a game's eval stage has played: a line on its log as each match against an opponent
    starts and ends (the ladder's short matches only as it starts and ends) and at least every
    `every_s` seconds in between, and the run's eval_progress file, replaced with each line (`hpcrl
    status` shows it) and removed at the end (`close`)."""

    def __init__(self, rd: Path, run_id: str, total: int, out: TextIO | None, every_s: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.rd, self.run_id, self.total, self.out, self.every_s, self.clock = rd, run_id, total, out, every_s, clock
        self.finished = 0
        """Games of the matches played to their end."""
        self.last = clock()

    def match(self, what: str, games_in_it: int, announce: bool = True) -> strength.Progress:
        """The progress of one match of `games_in_it` games (`what`: `against mcts:100`, `random vs
        5000`); `announce`: a line as it starts and ends, besides those every `every_s` seconds."""
        started = self.clock()
        if announce:
            self.tell(f"{what}: {games_in_it} games")

        def update(done: int, moves: int) -> None:
            due = self.clock() - self.last >= self.every_s
            if done == games_in_it:
                self.finished += games_in_it
                if announce or due:
                    self.tell(f"{what}: {games_in_it}/{games_in_it} games done in {self.clock() - started:.0f} s")
            elif due:
                self.tell(f"{what}: {done}/{games_in_it} games done, {moves} moves played", done)

        return update

    def tell(self, text: str, done_in_match: int = 0) -> None:
        """A line on the log and in eval_progress: the games played so far, then `text`."""
        self.last = self.clock()
        done = self.finished + done_in_match
        print(f"{self.run_id}: eval {done}/{self.total} games: {text}", file=self.out, flush=True)
        rundir.write_eval_progress(self.rd, done, self.total, text)

    def close(self) -> None:
        rundir.clear(self.rd, rundir.EVAL_PROGRESS)


def _evaluate_game(rd: Path, run: Run, weights: dict, weights_step: int, which: str, device: torch.device, out) -> int:
    """A two-player agent: eval.episodes games against each of train.opponents, both colours;
    every game in eval.csv (return +1 / 0 / -1, and the opponent), the counts per opponent in
    strength.csv; and the Elo ladder's round robin (`weights_step` names the evaluated policy in it)
    in ladder.csv."""
    cfg, episodes = run.config.train, run.config.eval.episodes
    spec = games.load(run.config.env)
    net = make_network(cfg, spec).to(device)  # type: ignore[arg-type]  # cfg is the run's AlphaZeroConfig
    net.load_state_dict(weights)
    net.eval()
    snapshots = {s: path for s, path in checkpoint.snapshots(rd / rundir.CHECKPOINTS) if s != weights_step} if cfg.ladder_games else {}
    ladder_agents = len(strength.ladder_players(list(snapshots), cfg.ladder_players)) + 1 if cfg.ladder_games else 0
    pairs = strength.ladder_pairs(ladder_agents)
    plan = f"{episodes} games against each of {', '.join(cfg.opponents)} at {cfg.eval_simulations or cfg.simulations} simulations a move (eval.episodes, train.opponents, train.eval_simulations)"
    if pairs:
        policies = f"{ladder_agents} polic{'y' if ladder_agents == 1 else 'ies'}"
        plan += f", then an Elo ladder of random and {policies}, {cfg.ladder_games} games for each of {pairs} pair{'s' * (pairs > 1)} at {cfg.simulations} simulations (train.ladder_games, train.ladder_players)"
    print(f"{run.run_id}: eval of the {which}: {plan}", file=out, flush=True)
    progress = EvalProgress(rd, run.run_id, episodes * len(cfg.opponents) + pairs * cfg.ladder_games, out)
    try:
        by_opponent = strength.evaluate_strength(spec, net, device, cfg, episodes, EVAL_SEED_OFFSET + run.seed, lambda name, n: progress.match(f"against {name}", n))
        rundir.write_eval(rd, [r for rs in by_opponent.values() for r in rs], [name for name, rs in by_opponent.items() for _ in rs])
        rows = [strength.summary(name, rs) for name, rs in by_opponent.items()]
        rundir.write_strength(rd, rows)
        if pairs:
            rundir.write_ladder(rd, _ladder(rd, spec, net, weights_step, snapshots, cfg, device, EVAL_SEED_OFFSET + run.seed, run.run_id, out, progress))
    finally:
        progress.close()
    text = ", ".join(f"{name}: {w}/{d}/{lost}" for name, _, w, d, lost, *_ in rows)
    rundir.mark(rd, rundir.EVAL_DONE, f"wins/draws/losses {text} ({episodes} games each) of the {which}")
    print(f"{run.run_id}: eval wins/draws/losses {text} of the {which}", file=out)
    return 0


def _ladder(
    rd: Path, spec: games.GameSpec, net: torch.nn.Module, step: int, saved: dict[int, Path], cfg: Any, device: torch.device, seed: int, run_id: str, out,
    progress: EvalProgress,
) -> list[list[Any]]:
    """The Elo ladder's round robin: `random`, the snapshots of the evaluations during training
    (`saved`, step -> file; at most train.ladder_players of them) and the evaluated policy, each
    named by its step. They search train.simulations, self-play's, not eval_simulations: a round
    robin is players^2 / 2 matches. A snapshot that does not read (a truncated file, another
    network's weights) is named in one line and left out, and the players are picked again from
    the rest: one damaged file must not fail the eval stage, and with it the run's whole evaluation."""
    sims = cfg.simulations
    while True:
        agents: dict[str, strength.Agent] = {}
        for at in strength.ladder_players(list(saved), cfg.ladder_players):
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
    pairs = strength.ladder_pairs(len(agents))
    progress.total = progress.finished + pairs * cfg.ladder_games  # fewer where a snapshot was left out
    started = time.monotonic()
    progress.tell(f"Elo ladder: {pairs} pair{'s' * (pairs > 1)} of {len(agents) + 1} players, {cfg.ladder_games} games each")
    rows = strength.ladder(spec, agents, cfg.ladder_games, seed, cfg.max_moves, lambda what, n: progress.match(what, n, announce=False))
    progress.tell(f"Elo ladder: {pairs} pair{'s' * (pairs > 1)} done in {time.monotonic() - started:.0f} s")
    return rows


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
