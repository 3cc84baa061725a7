"""What evaluation during training costs: CartPole PPO (configs/cartpole_ppo.yaml's settings) trained
as `hpcrl train` trains it, without and with `eval.every_steps = total_steps / 10` and
`periodic_episodes: 5`, printing each training's wall time side by side and the overhead.
Target: at most 5 %. A benchmark prints; it does not assert.

    python benchmarks/periodic_eval.py                  # 100k steps, seed 0, best of 1
    python benchmarks/periodic_eval.py --steps 50000 --repeats 3

Both runs train the same policy (the evaluations do not change what is learned), so the difference
is the evaluations alone: 10 (+1 at the end, when the last one is not at a multiple) x 5 episodes
played by a deterministic policy on up to 5 envs that stay open between evaluations.
TensorBoard is off in both, so the figure is the evaluation's alone.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcrl.config.load import load_experiment  # noqa: E402
from hpcrl.rl.train import train_run  # noqa: E402
from hpcrl.store import rundir  # noqa: E402
from hpcrl.store.expdir import write_experiment
from hpcrl.sweep.runs import expand  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cartpole_ppo.yaml"


def train_seconds(root: Path, steps: int, every: int | None) -> tuple[float, int]:
    """Wall time of one `hpcrl train` of one seed, and the number of evaluations it made."""
    data = yaml.safe_load(CONFIG.read_text())
    data["output"] = str(root)
    data["train"]["total_steps"] = steps
    data["sweep"]["seeds"] = [0]
    data["tracking"] = {"tensorboard": False}
    data.setdefault("eval", {})
    data["eval"].pop("every_steps", None)
    if every is not None:
        data["eval"].update(every_steps=every, periodic_episodes=5)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    exp = load_experiment(path)
    (run,) = expand(exp)
    write_experiment(exp, [run], {})
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    start = time.perf_counter()
    try:
        assert train_run(exp.dir, run) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    seconds = time.perf_counter() - start
    return seconds, len(rundir.read_eval_curve(exp.dir / "runs" / run.run_id)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=_args.positive_integer, default=100_000)
    parser.add_argument("--repeats", type=_args.positive_integer, default=1, help="take the fastest of N trainings of each")
    args = parser.parse_args()
    every = args.steps // 10
    times: dict[str, list[float]] = {"without": [], "with": []}
    evals = 0
    for _ in range(args.repeats):  # interleaved, so a busy machine slows both alike
        for name, value in (("without", None), ("with", every)):
            with tempfile.TemporaryDirectory() as tmp:
                seconds, n = train_seconds(Path(tmp), args.steps, value)
            times[name].append(seconds)
            evals = max(evals, n)
    base, evaluated = min(times["without"]), min(times["with"])
    print(f"CartPole PPO, {args.steps} steps, best of {args.repeats}")
    print(f"{'':28}{'without':>10}{'with':>10}")
    print(f"{'training wall time (s)':28}{base:>10.2f}{evaluated:>10.2f}")
    print(f"{'evaluations x 5 episodes':28}{0:>10}{evals:>10}")
    print(f"overhead of eval.every_steps={every}: {100 * (evaluated - base) / base:+.1f} % (target <= 5 %)")


if __name__ == "__main__":
    main()
