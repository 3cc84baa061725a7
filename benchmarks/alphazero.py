"""AlphaZero on tic-tac-toe: train configs/tictactoe_alphazero.yaml as `hpcrl train` trains it (self-play
and training in one process, checkpoints as usual, no evaluations during training), then play 200
games against perfect play (minimax), each colour half of them, and print the losses and the wall
time. Issue 28's target: 0 losses in under 5 minutes on a 2-core machine. A benchmark prints; it
does not assert.

    python benchmarks/alphazero.py                    # seed 0, 200 games
    python benchmarks/alphazero.py --seeds 0 1 2 --games 200
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcrl.config.experiment import load_experiment  # noqa: E402
from hpcrl.rl import checkpoint, games  # noqa: E402
from hpcrl.rl.alphazero import make_network  # noqa: E402
from hpcrl.rl.strength import evaluate_strength  # noqa: E402
from hpcrl.rl.train import train_run  # noqa: E402
from hpcrl.store.expdir import write_experiment
from hpcrl.sweep.runs import expand  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tictactoe_alphazero.yaml"


def one_seed(config: Path, seed: int, n_games: int, root: Path) -> tuple[float, dict[str, int]]:
    exp = load_experiment(config, [f"output={root}", f"sweep.seeds=[{seed}]", "eval.every_steps=null", "tracking.tensorboard=false"])
    (run,) = expand(exp)
    write_experiment(exp, [run], {})
    start = time.monotonic()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    try:
        code = train_run(exp.dir, run, out=open("/dev/null", "w"))  # noqa: SIM115
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    train_s = time.monotonic() - start
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
    return train_s, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--games", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            start = time.monotonic()
            train_s, counts = one_seed(args.config, seed, args.games, Path(tmp) / f"s{seed}")
            total = time.monotonic() - start
            print(f"seed {seed}: {counts['loss']} losses, {counts['draw']} draws, {counts['win']} wins in {args.games} games against perfect play; "
                  f"training {train_s:.0f} s, with the games {total:.0f} s", flush=True)


if __name__ == "__main__":
    main()
