"""OpenSpiel's own AlphaZero on connect four for a fixed wall time, then its strength against the
opponents hpcrl's evaluations play: the reference side of issue 28's side-by-side.

OpenSpiel's AlphaZero (JAX/Flax, actor processes and a learner) is not in hpcrl's environment. Run
this file with the Python of a venv of its own:

    python3 -m venv /tmp/osvenv
    /tmp/osvenv/bin/pip install open_spiel==2.0.2 jax jaxlib flax optax chex orbax-checkpoint
    taskset -c 1 /tmp/osvenv/bin/python benchmarks/openspiel_alphazero.py --minutes 20 --games 40 --path /tmp/os_az

and beside it, on the other core and for the same minutes, hpcrl's side:

    taskset -c 0 python benchmarks/alphazero.py --connect-four 20 --seeds 0 --games 40 \
        --set train.simulations=50 train.eval_simulations=200

It starts OpenSpiel's example (`open_spiel.python.examples.alpha_zero`) with the example's settings
(nn_width 256, nn_depth 2, 40 simulations, 2 actors, batch 128, replay 2^13 reused 4 times, lr 1e-3)
but `--evaluators 0` (its evaluator processes would only take CPU from learning; hpcrl's side does
not evaluate while it trains either), `--max_steps 0` (no step limit: the wall time is the limit) and
`--checkpoint_freq 1`. After `--minutes` its process group is killed, the newest checkpoint that
loads is played with `--simulations` per move (OpenSpiel's MCTSBot with its AlphaZero evaluator, no
noise, the most visited move) against MCTS with random rollouts at 100 and 1,000 simulations, built
exactly as hpcrl.rl.strength builds the `mcts:N` opponent (UCT c = 2, one rollout, solver on), each
colour half of the games. A benchmark prints; it does not assert.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def train(path: Path, minutes: float) -> int:
    """Run OpenSpiel's example for `minutes`; the number of learner steps it reached."""
    path.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "open_spiel.python.examples.alpha_zero", "--game", "connect_four", "--path", str(path),
        "--evaluators", "0", "--max_steps", "0", "--checkpoint_freq", "1", "--quiet",
    ]  # fmt: skip
    with open(path / "stdout.txt", "w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            child.wait(timeout=minutes * 60)
            raise SystemExit(f"OpenSpiel's AlphaZero ended early (exit {child.returncode}): see {path / 'stdout.txt'}")
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return max(checkpoint_steps(path), default=0)


def checkpoint_steps(path: Path) -> list[int]:
    """The learner steps of the finished checkpoints in `path`, newest first (orbax writes each to a
    temporary directory and renames it: `checkpoint-N` is whole; `checkpoint--1` is its "latest" copy)."""
    return sorted((int(p.name[len("checkpoint-") :]) for p in path.glob("checkpoint-*") if p.name[len("checkpoint-") :].isdigit()), reverse=True)


def load(path: Path):  # noqa: ANN201 - OpenSpiel's model class
    """The newest checkpoint of `path` that loads (the kill may have caught one half written)."""
    from open_spiel.python.algorithms.alpha_zero import alpha_zero

    fields = json.loads((path / "config.json").read_text())
    config = alpha_zero.Config(**fields)
    for step in checkpoint_steps(path):
        model = alpha_zero._init_model_from_config(config)
        try:
            model.load_checkpoint(step)
        except Exception as exc:  # noqa: BLE001 - a torn checkpoint: try the one before
            print(f"checkpoint-{step} does not load ({type(exc).__name__}); trying the one before", flush=True)
            continue
        return config, model, step
    raise SystemExit(f"no checkpoint of {path} loads")


def strength(config, model, simulations: int, opponents: list[int], n_games: int, seed: int) -> None:  # noqa: ANN001
    import numpy as np
    import pyspiel
    from open_spiel.python.algorithms import mcts
    from open_spiel.python.algorithms.alpha_zero import evaluator as evaluator_lib

    game = pyspiel.load_game("connect_four")
    agent = mcts.MCTSBot(game, config.uct_c, simulations, evaluator_lib.AlphaZeroEvaluator(game, model), solve=False,
                         child_selection_fn=mcts.SearchNode.puct_value, random_state=np.random.RandomState(seed))  # fmt: skip
    for n in opponents:
        rng = np.random.RandomState(seed)
        opponent = mcts.MCTSBot(game, 2.0, n, mcts.RandomRolloutEvaluator(1, rng), random_state=rng, solve=True)
        counts = {"win": 0, "draw": 0, "loss": 0}
        first = 0
        start = time.monotonic()
        for k in range(n_games):
            side = k % 2
            state = game.new_initial_state()
            while not state.is_terminal():
                bot = agent if state.current_player() == side else opponent
                state.apply_action(bot.step(state))
            ret = state.returns()[side]
            outcome = "win" if ret > 0 else "loss" if ret < 0 else "draw"
            counts[outcome] += 1
            first += outcome == "win" and side == 0
        print(f"OpenSpiel AlphaZero: {100 * counts['win'] / n_games:.0f}% wins ({counts['win']} won, {counts['draw']} drawn, {counts['loss']} lost) "
              f"against mcts:{n} in {n_games} games (first {100 * first / (n_games / 2):.0f}%), {simulations} simulations a move, "
              f"{time.monotonic() - start:.0f} s", flush=True)  # fmt: skip


def positive_integer(text: str) -> int:
    """argparse type: a positive int (0 games would divide by zero in the report)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def minutes(text: str) -> float:
    """argparse type: finite, non-negative minutes (NaN would skip training without a word)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected finite minutes >= 0, got {text}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=minutes, default=20, help="0: play the checkpoints already in --path")
    parser.add_argument("--games", type=positive_integer, default=40)
    parser.add_argument("--simulations", type=positive_integer, default=200, help="per move when it plays the opponents")
    parser.add_argument("--opponents", type=positive_integer, nargs="+", default=[100, 1000], help="random-rollout MCTS simulations")
    parser.add_argument("--path", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.minutes > 0:
        start = time.monotonic()
        steps = train(args.path, args.minutes)
        print(f"OpenSpiel AlphaZero: trained {(time.monotonic() - start) / 60:.1f} min, {steps} learner steps", flush=True)
    config, model, step = load(args.path)
    print(f"OpenSpiel AlphaZero: playing checkpoint-{step}", flush=True)
    strength(config, model, args.simulations, args.opponents, args.games, args.seed)


if __name__ == "__main__":
    main()
