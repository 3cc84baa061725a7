"""How long N ViZDoom envs in worker processes take to start, reset (every worker's games start at once) and close.

    .venv/bin/python benchmarks/vizdoom_start.py                # 32 and 64 envs, a worker each, configs/vizdoom_ppo.yaml's env
    .venv/bin/python benchmarks/vizdoom_start.py 8 16 --steps 100 --envs-per-worker 4

Each row is a fresh vector env from `make_vec_env` with the bundled config's `env:` section,
`env.num_envs` = N and `env.envs_per_worker` (1 by default here: every game starts at the same
instant, the hardest case; 0 for the config's own layout, two workers per core): `start` is building it
(the worker processes forked, each building its envs; the games are not running yet), `reset` the
first reset (each worker's games start at once: the moment their engines used to race on
`./_vizdoom/` in the shared working directory), `steps` that many random vector steps, `close`
closing it. Before each row the load average is printed: the machine's other work slows all of it.

Figures (2026-11-26, a worker per env, this 2-core VM shared with other work; `benchmarks/vizdoom_start.py`):
- 32 workers: start 2.3 s, reset 12.7 s, 50 steps 1.3 s, close 1.5 s (load 6).
- 64 workers: start 2.8 s, reset 31.6 s, 50 steps 2.3 s, close 2.9 s (load 15).
- before issue 26 (shared working directory, groups reset one after the other), load 34-37:
  32: 1.3 / 13.8 / 1.0 / 0.4 s; 64: 1.8 / 33.0 / 4.4 / 2.1 s. On 2 cores the engines' starts are
  serialised by the CPU and did not collide; on a 16-core node 32 did.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcrl.config.load import load_experiment  # noqa: E402
from hpcrl.rl.envs import make_vec_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workers", nargs="*", type=_args.positive_integer, default=[32, 64], help="envs (each a game)")
    parser.add_argument("--steps", type=_args.count, default=50, help="random vector steps after the reset")
    parser.add_argument("--envs-per-worker", type=_args.count, default=1, help="env.envs_per_worker; 0: the config's (two workers per usable core)")
    args = parser.parse_args()
    env = load_experiment(ROOT / "configs" / "vizdoom_ppo.yaml").env
    print(f"{'envs':>7} {'start s':>8} {'reset s':>8} {'steps s':>8} {'close s':>8}  load")
    for n in args.workers:
        load = os.getloadavg()[0]
        spec = dataclasses.replace(env, num_envs=n, vectorization="async", envs_per_worker=args.envs_per_worker or env.envs_per_worker)
        t0 = time.monotonic()
        envs = make_vec_env(spec)
        t1 = time.monotonic()
        try:
            envs.reset(seed=0)
            t2 = time.monotonic()
            rng = np.random.default_rng(0)
            for _ in range(args.steps):
                envs.step(rng.integers(envs.single_action_space.n, size=n))
            t3 = time.monotonic()
        finally:
            envs.close()
        t4 = time.monotonic()
        print(f"{n:>7} {t1 - t0:>8.1f} {t2 - t1:>8.1f} {t3 - t2:>8.1f} {t4 - t3:>8.1f}  {load:.1f}", flush=True)


if __name__ == "__main__":
    main()
