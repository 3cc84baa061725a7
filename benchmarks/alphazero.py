"""AlphaZero on tic-tac-toe: train configs/tictactoe_alphazero.yaml as `hpcrl train` trains it (self-play
and training in one process, checkpoints as usual, no evaluations during training), then play 200
games against perfect play (minimax), each colour half of them, and print the losses and the wall
time. Issue 28's target: 0 losses in under 5 minutes on a 2-core machine. A benchmark prints; it
does not assert.

    python benchmarks/alphazero.py                    # seed 0, 200 games
    python benchmarks/alphazero.py --seeds 0 1 2 --games 200

Connect four (`--connect-four MINUTES`): train configs/connect4_alphazero.yaml's agent for that long
or its train.total_steps positions, whichever comes first (self-play and training alternating in
this process, the same AlphaZero class `hpcrl train` runs), then play `--games` games against OpenSpiel's MCTS with random rollouts at 100 and 1,000
simulations, each colour half of them. Issue 28's target: >= 90% wins against 100 simulations
over 3 seeds in 60 minutes on this 2-core machine, >= 50% against 1,000 as a goal.

    python benchmarks/alphazero.py --connect-four 20 --seeds 0 --games 50
    python benchmarks/alphazero.py --connect-four 60 --seeds 0 1 2 --parallel --games 100   # 3 processes in the same hour

Figures (2026-11-26, the 2-core VM, the config's 50 self-play and 400 evaluation simulations, mirrored
minibatches): the 3 seeds at once for 60 min, the config as it is (value targets (z + q) / 2, the search
on a copy of the network with BatchNorm folded in, channels-last training; ~39.5 CPU min and ~330k
positions each): 97 / 93 / 94% wins against MCTS-100, 86 / 86 / 82% against MCTS-1000, 100 games each.
Before those three (the outcome z alone as the value target, ~37 CPU min and ~250k positions each):
88 / 85 / 90% wins against MCTS-100, 61 / 52 / 85% against MCTS-1000. The value target alone, seed 0 on
one core each for 20 min (`taskset -c 0 ... --connect-four 20 --seeds 0 --games 50 --set
train.value_target_q=0`, and 0.5 on core 1 at once): 161k / 165k positions, 82% / 82% against MCTS-100,
54% / 72% against MCTS-1000. The same with the learning rate
annealed to 0 over 250k positions (`--set train.anneal_lr=true train.total_steps=250000`: 52-56 min to
250k): 85 / 87 / 87% against MCTS-100, 56 / 78 / 63% against MCTS-1000. One seed alone on one core for 20 min
(`taskset -c 0 ... --connect-four 20 --seeds 0 --games 40 --set train.eval_simulations=40`, beside
benchmarks/openspiel_alphazero.py on the other core): 137k positions, 72% against MCTS-100, 32% against
MCTS-1000 at 40 simulations a move.

OpenSpiel's own AlphaZero (its example, JAX/Flax) is not in hpcrl's environment; in a venv of its own
(`pip install open_spiel==2.0.2 jax jaxlib flax optax chex orbax-checkpoint`: wheels exist for
Python 3.11 x86-64) it runs here on the same game and network size:

    python -m open_spiel.python.examples.alpha_zero --game connect_four --nn_model resnet \
        --nn_width 32 --nn_depth 3 --max_simulations 50 --actors 1 --evaluators 1 --path DIR
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _args  # noqa: E402  # benchmarks/_args.py: the script's own folder is first on sys.path

from hpcrl import games  # noqa: E402
from hpcrl.config.load import load_experiment  # noqa: E402
from hpcrl.rl import checkpoint  # noqa: E402
from hpcrl.rl.alphazero import AlphaZero, make_network  # noqa: E402
from hpcrl.rl.strength import evaluate_strength  # noqa: E402
from hpcrl.rl.train import train_run  # noqa: E402
from hpcrl.store.expdir import write_experiment
from hpcrl.sweep.runs import expand  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tictactoe_alphazero.yaml"
CONNECT_FOUR = CONFIG.parent / "connect4_alphazero.yaml"


def one_seed(config: Path, seed: int, n_games: int, root: Path, overrides: list[str]) -> tuple[float, float, dict[str, int]]:
    exp = load_experiment(config, [f"output={root}", f"sweep.seeds=[{seed}]", "eval.every_steps=null", "tracking.tensorboard=false", *overrides])
    (run,) = expand(exp)
    write_experiment(exp, [run], {})
    start, cpu = time.monotonic(), time.process_time()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        code = train_run(exp.dir, run, out=open("/dev/null", "w"))  # noqa: SIM115
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    train_s, train_cpu = time.monotonic() - start, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"seed {seed}: hpcrl train exited {code}")
    state, _ = checkpoint.load_latest(exp.dir / "runs" / run.run_id / "checkpoints")
    assert state is not None
    spec = games.load(exp.env)
    net = make_network(exp.train, spec)  # type: ignore[arg-type]
    net.load_state_dict(state["agent"]["policy"])
    net.eval()
    exp.train.opponents = ["perfect"]  # type: ignore[attr-defined]
    results = evaluate_strength(spec, net, torch.device("cpu"), exp.train, n_games, 1_000_003 + seed)["perfect"]
    counts = {k: int(sum(m[k] for *_, m in results)) for k in ("win", "draw", "loss")}
    return train_s, train_cpu, counts


def connect_four(config: Path, seed: int, minutes: float, n_games: int, overrides: list[str], save: Path | None) -> None:
    """Train for `minutes` of wall time or train.total_steps positions, whichever comes first (the
    learning rate anneals over total_steps with train.anneal_lr), then play OpenSpiel's MCTS at 100
    and 1,000 simulations."""
    exp = load_experiment(config, [f"sweep.seeds=[{seed}]", *overrides])
    spec = games.load(exp.env)
    torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
    agent = AlphaZero(exp.train, spec, torch.device("cpu"), seed)  # type: ignore[arg-type]
    start, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - start < minutes * 60 and agent.global_step < exp.train.total_steps:
        metrics = agent.train_iteration()
        print(f"seed {seed}: {agent.global_step} positions, {agent.version} gradient steps, value loss {metrics.get('value_loss', float('nan')):.3f}, "
              f"{time.monotonic() - start:.0f} s", flush=True)
    train_s, train_cpu = time.monotonic() - start, time.process_time() - cpu
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        torch.save(agent.policy.state_dict(), save / f"connect_four-seed{seed}.pt")
    agent.policy.eval()
    exp.train.opponents = ["mcts:100", "mcts:1000"]  # type: ignore[attr-defined]
    by_opponent = evaluate_strength(spec, agent.policy, torch.device("cpu"), exp.train, n_games, 1_000_003 + seed)
    for name, results in by_opponent.items():
        wins = [m["win"] for *_, m in results]
        first = [m["win"] for *_, m in results if m["first"]]
        second = [m["win"] for *_, m in results if not m["first"]]
        won, draws, losses = (int(sum(m[k] for *_, m in results)) for k in ("win", "draw", "loss"))
        print(f"seed {seed}: {100 * sum(wins) / len(wins):.0f}% wins ({won} won, {draws} drawn, {losses} lost) against {name} in {len(wins)} games "
              f"(first {100 * sum(first) / len(first):.0f}%, "
              f"second {100 * sum(second) / len(second):.0f}%); trained {train_s / 60:.1f} min ({train_cpu / 60:.1f} CPU min), "
              f"{agent.global_step} positions, {time.monotonic() - start:.0f} s with the games", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--seeds", type=_args.seed, nargs="+", default=[0])
    parser.add_argument("--games", type=_args.positive_integer, default=200)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides, as `hpcrl sweep` takes them")
    parser.add_argument("--connect-four", type=_args.minutes, metavar="MINUTES", help="connect four instead: train this long, then play OpenSpiel's MCTS")
    parser.add_argument("--parallel", action="store_true", help="connect four: every seed at once, one process each (the minutes are the machine's, not each seed's)")
    parser.add_argument("--save", type=Path, help="connect four: save each seed's trained network here")
    args = parser.parse_args()
    config = CONNECT_FOUR if args.connect_four is not None and args.config == CONFIG else args.config
    _args.experiment(parser, config, args.set)  # what each seed reads: a bad key or value is one line, before anything is trained
    torch.set_num_threads(1)
    if args.connect_four is not None and args.parallel and len(args.seeds) > 1:
        argv = [a for a in sys.argv[1:] if a != "--parallel"]  # a later --seeds overrides the earlier one
        children = [subprocess.Popen([sys.executable, __file__, *argv, "--seeds", str(seed)]) for seed in args.seeds]
        sys.exit(max(child.wait() for child in children))
    if args.connect_four is not None:
        for seed in args.seeds:
            connect_four(config, seed, args.connect_four, args.games, args.set, args.save)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            start = time.monotonic()
            train_s, train_cpu, counts = one_seed(args.config, seed, args.games, Path(tmp) / f"s{seed}", args.set)
            total = time.monotonic() - start
            print(f"seed {seed}: {counts['loss']} losses, {counts['draw']} draws, {counts['win']} wins in {args.games} games against perfect play; "
                  f"training {train_s:.0f} s ({train_cpu:.0f} s CPU), with the games {total:.0f} s", flush=True)


if __name__ == "__main__":
    main()
