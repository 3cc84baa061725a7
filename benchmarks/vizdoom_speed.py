"""ViZDoom PPO speed: the env's random-action rate, hpcrl PPO (sync and async) and SB3 PPO, on the same envs.

    .venv/bin/python benchmarks/vizdoom_speed.py --out /tmp/vzd                       # CPU, 8 envs, 20 s a measurement
    .venv/bin/python benchmarks/vizdoom_speed.py --device cuda --num-envs 8 32 --out results/vzd
    .venv/bin/python benchmarks/vizdoom_speed.py --sides random hpcrl-async -p train.torch_threads=1 --out /tmp/vzd

For each `--num-envs`, in one run and with the same `env:` section (configs/vizdoom_ppo.yaml by
default, `-p key=value` overrides as hpcrl's):
- `random`: the vector env hpcrl trains on, stepped with random actions and nothing else: the most
  any learner could reach with these envs;
- `hpcrl-sync`, `hpcrl-async`: `hpcrl train`'s loop without its files (setup_torch with
  train.torch_threads, the agent built as train builds it) with `train.async_rollout` false / true;
- `sb3`: Stable-Baselines3's PPO (`CnnPolicy`: the same CNN, SB3's NatureCNN or, with other
  `train.cnn_channels`, its copy with those filters; hidden_sizes[0] features, shared by both heads) over SubprocVecEnv workers running the same env adapter (hpcrl.rl.envs.make_env), with the
  same num_envs, n_steps, epochs, minibatch size, learning rate, gamma, lambda, clip range (also for
  the value), coefficients, gradient clipping and reward scale, on the same device and thread count;
  SB3 has no mixed precision, so it runs in float32;
- `envpool-random` (only where envpool is installed and the scenario is `basic`): EnvPool's
  Basic-v1 at the same frame skip and 80x60 frames, stepped with random actions.

Every learner measurement warms up for one iteration (worker start, first allocations, cuDNN's
autotuning), then runs whole iterations (rollout, GAE, update) until `--seconds` have passed; SPS
is environment steps per second of those iterations. Each measurement runs in a child process of
its own session with a hard limit (`--timeout`, default 3 x seconds + 180 s for worker starts): one
that fails or hangs prints its error, its process group is killed, and the others go on. The table
goes to stdout, and `speed.json` and `speed.csv` to `--out`.

Figures (2026-11-26): docs/reference/benchmarks.md. On one H200 with 16 cores (`--device cuda --num-envs 8 32
--seconds 15`): 8 envs: random 6,031, sync 1,583, async 2,172, SB3 1,708; 32 envs: random 10,447,
sync 5,091, async 6,311, SB3 4,548. The rollout alone (the update replaced by nothing) ran at 2,679
with 8 envs, so what is left is the rollout's per-step inference round trip, not the update.
EnvPool 1.2.5 (`pip install envpool`; its Basic-v1 renders the scenario's 320x240 RGB and resizes,
3 channels) stepped 8 envs at 0.5-0.7x the rate of hpcrl's 8 worker processes on the 2-core VM
(1,085-1,314 against 1,850 in the same minute, quiet; 1,122 against 1,869 under load), so it is
no backend of hpcrl; the `envpool-random` side measures it where it is installed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIDES = ("random", "hpcrl-sync", "hpcrl-async", "sb3", "envpool-random")
RESULT = "RESULT "
"""The prefix of the child's one line of JSON on stdout."""


# ---------------------------------------------------------------------------- one measurement (child)
def _experiment(args: argparse.Namespace, num_envs: int, extra: list[str] = ()) -> Any:
    from hpcrl.config.experiment import load_experiment

    gpus = [f"resources.gpus={int(args.device.partition(':')[2] or 0) + 1}"] if args.device.startswith("cuda") else []  # the GPUs a task asks for cover its device
    return load_experiment(Path(args.config), [f"train.device={args.device}", *gpus, f"env.num_envs={num_envs}", *args.overrides, *extra])


def _timed(step: Any, steps_of: Any, seconds: float) -> tuple[float, int, float]:
    """Run `step()` once to warm up, then until `seconds` have passed: (SPS, steps, seconds)."""
    step()
    first, start = steps_of(), time.perf_counter()
    while True:
        step()
        wall = time.perf_counter() - start
        if wall >= seconds:
            steps = steps_of() - first
            return steps / wall, steps, wall


def measure_random(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    from hpcrl.rl.envs import make_vec_env

    envs = make_vec_env(_experiment(args, num_envs).env)
    try:
        envs.reset(seed=0)
        count = [0]

        def step() -> None:
            for _ in range(16):
                envs.step(envs.action_space.sample())
                count[0] += envs.num_envs

        sps, steps, wall = _timed(step, lambda: count[0], args.seconds)
        return {"sps": sps, "steps": steps, "seconds": wall}
    finally:
        envs.close()


def measure_hpcrl(args: argparse.Namespace, num_envs: int, async_rollout: bool) -> dict[str, Any]:
    import torch

    from hpcrl.rl.envs import make_vec_env
    from hpcrl.rl.train import algorithm_class, seed_everything, setup_torch

    exp = _experiment(args, num_envs, [f"train.async_rollout={str(async_rollout).lower()}"])
    device = setup_torch(exp.train.torch_threads, exp.train.device)
    seed_everything(0)
    envs = make_vec_env(exp.env)
    agent = None
    try:
        agent = algorithm_class(exp.algo)(exp.train, envs, device, 0)
        agent.num_iterations = 10**9  # time-bounded: never the last iteration (whose rollout is not followed by another)

        def step() -> None:
            agent.train_iteration()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        sps, steps, wall = _timed(step, lambda: agent.global_step, args.seconds)
        from hpcrl.rl.networks import CPU_BF16

        amp = exp.train.amp if device.type == "cuda" or (exp.train.amp == "bf16" and CPU_BF16) else "none"  # bf16 on a CPU needs AMX
        return {"sps": sps, "steps": steps, "seconds": wall, "device": str(device), "torch_threads": torch.get_num_threads(), "amp": amp}
    finally:
        if agent is not None:
            agent.close()
        envs.close()


def measure_sb3(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from hpcrl.config.hparams import NATURE_CNN
    from hpcrl.rl.envs import make_env
    from hpcrl.rl.train import setup_torch

    exp = _experiment(args, num_envs)
    t, spec = exp.train, exp.env
    if exp.algo != "ppo" or t.recurrent_size or len(t.hidden_sizes) != 1:
        raise SystemExit("SB3's CnnPolicy matches a feed-forward PPO with one hidden layer after the CNN")
    device = setup_torch(t.torch_threads, t.device)
    torch.set_num_threads(min(t.torch_threads, len(os.sched_getaffinity(0))))  # as hpcrl's update: not more threads than cores

    def thunk() -> gym.Env:
        env = make_env(spec)
        return gym.wrappers.TransformReward(env, lambda r: r * t.reward_scale) if t.reward_scale != 1.0 else env

    class Clock(BaseCallback):
        """Whole iterations timed from the start of the second rollout, until `seconds` are up."""

        def __init__(self) -> None:
            super().__init__()
            self.marks: list[tuple[float, int]] = []

        def _on_rollout_start(self) -> None:
            self.marks.append((time.perf_counter(), self.num_timesteps))

        def _on_step(self) -> bool:
            return len(self.marks) < 2 or time.perf_counter() - self.marks[1][0] < args.seconds

    policy_kwargs: dict[str, Any] = {"features_extractor_kwargs": {"features_dim": t.hidden_sizes[0]}, "net_arch": []}
    if tuple(t.cnn_channels) != NATURE_CNN:
        policy_kwargs["features_extractor_class"] = _sb3_cnn(t.cnn_channels)
    envs = SubprocVecEnv([thunk for _ in range(num_envs)])
    try:
        lr = (lambda p: p * t.lr) if t.anneal_lr else t.lr  # SB3 passes the fraction of training left
        model = PPO("CnnPolicy", envs, learning_rate=lr, n_steps=t.num_steps, batch_size=t.num_steps * num_envs // t.num_minibatches,
                    n_epochs=t.update_epochs, gamma=t.gamma, gae_lambda=t.gae_lambda, clip_range=t.clip_coef,
                    clip_range_vf=t.clip_coef if t.clip_vloss else None, ent_coef=t.ent_coef, vf_coef=t.vf_coef * 0.5,
                    max_grad_norm=t.max_grad_norm, normalize_advantage=t.norm_adv,
                    policy_kwargs=policy_kwargs,
                    seed=0, device=device, verbose=0)  # fmt: skip
        clock = Clock()
        model.learn(total_timesteps=10**9, callback=clock)
        if len(clock.marks) < 3:
            raise RuntimeError(f"SB3 did not finish one timed iteration in {args.seconds} s")
        (start, first), (end, last) = clock.marks[1], clock.marks[-1]
        return {"sps": (last - first) / (end - start), "steps": last - first, "seconds": end - start, "device": str(device), "torch_threads": torch.get_num_threads(), "amp": "none"}
    finally:
        envs.close()


def _sb3_cnn(filters: list[int]) -> type:
    """SB3's NatureCNN (its conv stack, flatten, linear to features_dim, ReLU) with hpcrl's
    `train.cnn_channels` filters, so that both sides learn with the same network."""
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    c1, c2, c3 = filters

    class FilteredNatureCNN(BaseFeaturesExtractor):
        def __init__(self, observation_space: Any, features_dim: int = 512) -> None:
            super().__init__(observation_space, features_dim)
            self.cnn = nn.Sequential(
                nn.Conv2d(observation_space.shape[0], c1, 8, stride=4), nn.ReLU(),
                nn.Conv2d(c1, c2, 4, stride=2), nn.ReLU(),
                nn.Conv2d(c2, c3, 3, stride=1), nn.ReLU(),
                nn.Flatten(),
            )  # fmt: skip
            with torch.no_grad():
                flat = self.cnn(torch.as_tensor(observation_space.sample()[None]).float()).shape[1]
            self.linear = nn.Sequential(nn.Linear(flat, features_dim), nn.ReLU())

        def forward(self, observations: Any) -> Any:
            return self.linear(self.cnn(observations))

    return FilteredNatureCNN


def measure_envpool(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    import numpy as np

    try:
        import envpool
    except ImportError as exc:
        raise SystemExit(f"envpool is not installed ({exc})") from exc
    exp = _experiment(args, num_envs)
    kw = exp.env.kwargs
    if exp.env.id not in ("basic", "VizdoomBasic-v1"):
        raise SystemExit(f"envpool-random compares ViZDoom's basic only, not {exp.env.id}")
    down = int(kw.get("downsample", 1))
    env = envpool.make_gymnasium("Basic-v1", num_envs=num_envs, img_height=120 // down, img_width=160 // down, stack_num=max(1, exp.env.frame_stack),
                                 frame_skip=int(kw.get("frame_skip", 4)), use_combined_action=True, seed=0)  # fmt: skip
    try:
        env.reset()
        rng = np.random.default_rng(0)
        count = [0]

        def step() -> None:
            for _ in range(16):
                env.step(rng.integers(0, env.action_space.n, num_envs))
                count[0] += num_envs

        sps, steps, wall = _timed(step, lambda: count[0], args.seconds)
        return {"sps": sps, "steps": steps, "seconds": wall}
    finally:
        env.close()


def measure(args: argparse.Namespace, side: str, num_envs: int) -> dict[str, Any]:
    if side == "random":
        return measure_random(args, num_envs)
    if side in ("hpcrl-sync", "hpcrl-async"):
        return measure_hpcrl(args, num_envs, side == "hpcrl-async")
    if side == "sb3":
        return measure_sb3(args, num_envs)
    return measure_envpool(args, num_envs)


# ---------------------------------------------------------------------------- the run (parent)
def run_child(argv: list[str], side: str, num_envs: int, timeout: float) -> dict[str, Any]:
    """One measurement in a child process of its own session, killed with its group past `timeout`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", side, "--num-envs", str(num_envs)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"no result within {timeout:.0f} s: killed"}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it left running (env workers)
        except ProcessLookupError:
            pass
    for line in out.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    lines = [x for x in err.strip().splitlines() if x.strip()]
    return {"error": (lines[-1] if lines else f"exit {proc.returncode}, no output")[:300]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'envs':>5}  {'side':<15}{'SPS':>9}{'x random':>10}{'x SB3':>8}  {'device / threads / amp':<24}note"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{'-':>9}{'':>10}{'':>8}  {'':<24}FAILED: {r['error']}")
            continue
        x_random = f"{r['x_random']:.2f}" if r.get("x_random") else ""
        x_sb3 = f"{r['x_sb3']:.2f}" if r.get("x_sb3") else ""
        where = f"{r.get('device', '')} / {r.get('torch_threads', '')} / {r.get('amp', '')}" if "device" in r else ""
        lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{r['sps']:>9.0f}{x_random:>10}{x_sb3:>8}  {where:<24}{r['steps']} steps in {r['seconds']:.1f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "vizdoom_ppo.yaml"))
    parser.add_argument("-p", dest="overrides", action="append", default=[], help="key=value, as hpcrl's -p")
    parser.add_argument("--device", default="cpu", help="train.device of hpcrl and SB3: cpu, cuda, cuda:N")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per measurement, after one warm-up iteration")
    parser.add_argument("--timeout", type=float, default=None, help="hard limit per measurement (default 3 x seconds + 180)")
    parser.add_argument("--out", type=Path, required=True, help="directory for speed.json and speed.csv")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        result = measure(args, args.child, args.num_envs[0])
        print(RESULT + json.dumps(result), flush=True)
        return
    import torch

    argv = ["--config", args.config, "--device", args.device, "--seconds", str(args.seconds), "--out", str(args.out)]
    for o in args.overrides:
        argv += ["-p", o]
    timeout = args.timeout or 3 * args.seconds + 180
    print(f"{Path(args.config).name} {' '.join(args.overrides)}: device {args.device}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{args.seconds:.0f} s a measurement; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for n in args.num_envs:
        for side in args.sides:
            result = {"num_envs": n, "side": side, **run_child(argv, side, n, timeout)}
            rows.append(result)
            print(f"  {n} envs, {side}: " + (f"{result['sps']:.0f} SPS" if "sps" in result else f"FAILED: {result['error']}"), flush=True)
    for r in rows:
        same = {x["side"]: x.get("sps") for x in rows if x["num_envs"] == r["num_envs"]}
        if "sps" in r and r["side"] != "random" and same.get("random"):
            r["x_random"] = r["sps"] / same["random"]
        if "sps" in r and r["side"].startswith("hpcrl") and same.get("sb3"):
            r["x_sb3"] = r["sps"] / same["sb3"]
    print()
    print(table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"config": args.config, "overrides": args.overrides, "device": args.device, "seconds": args.seconds, "cpus": os.cpu_count(), "torch": torch.__version__}
    tmp = args.out / "speed.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    os.replace(tmp, args.out / "speed.json")
    fields = ["num_envs", "side", "sps", "x_random", "x_sb3", "steps", "seconds", "device", "torch_threads", "amp", "error"]
    tmp = args.out / "speed.csv.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, args.out / "speed.csv")
    print(f"\nwrote {args.out / 'speed.json'} and {args.out / 'speed.csv'}")


if __name__ == "__main__":
    main()
