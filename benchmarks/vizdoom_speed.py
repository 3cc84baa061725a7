"""ViZDoom PPO training speed against the env's own rate with random actions, in the same run.

    .venv/bin/python benchmarks/vizdoom_speed.py                    # configs/vizdoom_ppo.yaml on CPU, 3 repeats
    .venv/bin/python benchmarks/vizdoom_speed.py --repeats 5 --steps 8192
    .venv/bin/python benchmarks/vizdoom_speed.py --profile          # where a PPO iteration's time goes
    .venv/bin/python benchmarks/vizdoom_speed.py -p train.torch_threads=1 -p env.num_envs=16
    .venv/bin/python benchmarks/vizdoom_speed.py --device cuda      # where a GPU is lent

The reference is the most any learner could reach with these envs: the same vector env (same
`env:` section, so the same number of envs, the same vectorization and game settings) stepped
with random actions and nothing else. The PPO side is `hpcrl train`'s loop without its files:
the config's torch settings (`setup_torch` with train.torch_threads), the agent built as train
builds it, one warm-up iteration (worker start, first allocations), then whole iterations
(rollout, GAE, update) until `--steps` environment steps are done; SPS is environment steps per
second of that. The two sides alternate `--repeats` times, each with fresh envs; the table gives
every repeat and the median of each side, and the ratio of the medians. Other work on the
machine slows both sides, but not equally: the load average is printed before the first repeat.

`--profile` times the parts of each PPO iteration on the last repeat: env stepping (the time the
main process waits on the envs, not counting what overlaps with inference), the policy's forward
passes in the rollout, the rest of the rollout (storage, transfers, episode bookkeeping), GAE and
the update.

Figures (2026-11-25, this 2-core VM, quiet: load < 1; `--repeats 3 --profile`, 4096 steps):
- before issue 17 (one AsyncVectorEnv, 4 epochs x 4 minibatches, fp32): 680 SPS against 3,246 (21%).
- worker groups + 2 epochs x 8 minibatches, fp32: 886 against 2,820 (31.4%); per env step: update
  511 µs, rollout forward 275, the rest of the rollout 193, waiting for the envs 152.
- the same with `amp: bf16` on this CPU (AVX512-BF16): 1,111 against 3,019 (36.8%; repeats 37.3%,
  36.7%, 36.8%); the update 289 µs. One AsyncVectorEnv instead of the groups: 36.5%.
"""


from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcrl.config import load_experiment  # noqa: E402
from hpcrl.rl.envs import make_vec_env  # noqa: E402
from hpcrl.rl.train import algorithm_class, seed_everything, setup_torch  # noqa: E402


def random_sps(exp: Any, steps: int) -> float:
    envs = make_vec_env(exp.env)
    try:
        envs.reset(seed=0)
        for _ in range(8):  # warm-up: the workers' first frames
            envs.step(envs.action_space.sample())
        n, start = 0, time.perf_counter()
        while n < steps:
            envs.step(envs.action_space.sample())
            n += envs.num_envs
        return n / (time.perf_counter() - start)
    finally:
        envs.close()


class Timers:
    """Wall time spent inside wrapped callables, by name."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[name] += time.perf_counter() - start

        setattr(obj, attr, timed)


def ppo_sps(exp: Any, steps: int, device: torch.device, timers: Timers | None = None) -> float:
    cfg = exp.train
    seed_everything(0)
    envs = make_vec_env(exp.env)
    try:
        agent = algorithm_class(exp.algo)(cfg, envs, device, 0)
        agent.train_iteration()  # warm-up
        if timers is not None:
            for attr in ("step", "receive"):  # a GroupedVectorEnv's rollout sends, then receives
                if hasattr(agent.envs, attr):
                    timers.wrap(agent.envs, attr, "env")
            timers.wrap(agent.policy, "step", "policy forward (rollout)")
            timers.wrap(agent, "collect", "rollout (all)")
            timers.wrap(agent, "advantages", "GAE")
            timers.wrap(agent, "update", "update")
        first, start = agent.global_step, time.perf_counter()
        while agent.global_step - first < steps:
            agent.train_iteration()
        wall = time.perf_counter() - start
        if timers is not None:
            timers.total["all"] = wall
            timers.total["steps"] = agent.global_step - first
        return (agent.global_step - first) / wall
    finally:
        envs.close()


def print_profile(timers: Timers) -> None:
    t = timers.total
    wall, steps = t.pop("all"), t.pop("steps")
    env = t.pop("env")
    forward = t.pop("policy forward (rollout)")
    rollout = t.pop("rollout (all)")
    rows: list[tuple[str, float]] = [
        ("env stepping (waited for)", env),
        ("policy forward (rollout)", forward),
        ("rest of the rollout", rollout - env - forward),
        ("GAE", t.pop("GAE")),
        ("update", t.pop("update")),
    ]
    rows.append(("other", wall - sum(s for _, s in rows)))
    print(f"\nprofile of the last PPO repeat ({steps} steps, {wall:.2f} s, µs per env step):")
    for name, seconds in rows:
        print(f"  {name:<28}{seconds / steps * 1e6:>8.0f} µs {seconds / wall:>6.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "vizdoom_ppo.yaml"))
    parser.add_argument("-p", dest="overrides", action="append", default=[], help="key=value, as hpcrl's -p")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=4096, help="environment steps timed per repeat and side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    exp = load_experiment(Path(args.config), [f"train.device={args.device}", *args.overrides])
    device = setup_torch(exp.train.torch_threads, exp.train.device)
    e, kw = exp.env, exp.env.kwargs
    print(f"{exp.name}: {e.id}, {e.num_envs} envs ({e.vectorization}), {kw.get('screen_resolution')} / downsample {kw.get('downsample', 1)}, "
          f"frame skip {kw.get('frame_skip')}, frame stack {e.frame_stack}; {device}, train.torch_threads {exp.train.torch_threads}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}")  # fmt: skip
    print(f"load average before the first repeat: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides: list[tuple[str, Callable[[bool], float]]] = [
        ("random actions", lambda last: random_sps(exp, args.steps)),
        ("hpcrl PPO", lambda last: ppo_sps(exp, args.steps, device, timers if last and args.profile else None)),
    ]
    timers = Timers()
    results: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(args.repeats):
        for name, run in sides:
            results[name].append(run(r == args.repeats - 1))
            print(f"  repeat {r + 1}: {name:<15}{results[name][-1]:>8.0f} SPS", flush=True)
    ref, ppo = (statistics.median(results[name]) for name, _ in sides)
    ratios = [p / r for r, p in zip(*results.values())]
    print(f"\nmedian of {args.repeats}: random actions {ref:.0f} SPS, hpcrl PPO {ppo:.0f} SPS: {ppo / ref:.1%} of the env's rate")
    print(f"per repeat (PPO / the random actions just before it): {', '.join(f'{x:.1%}' for x in ratios)}; median {statistics.median(ratios):.1%}")
    if args.profile:
        print_profile(timers)


if __name__ == "__main__":
    main()
