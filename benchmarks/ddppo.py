"""DD-PPO on one host: training SPS of CartPole PPO as N ranks against 1 rank with the same total
number of envs (1 x 16 envs against 2 x 8 by default), in the same run, on the same machine.
A benchmark prints; it does not assert.

    .venv/bin/python benchmarks/ddppo.py                          # 1 x 16 vs 2 x 8 envs, 3 repeats (~1.5 min on 2 cores)
    .venv/bin/python benchmarks/ddppo.py --envs 32 --steps 131072 --repeats 5
    .venv/bin/python benchmarks/ddppo.py --epochs 4               # fewer optimiser steps (all-reduces) per rollout
    .venv/bin/python benchmarks/ddppo.py --device cuda            # where a GPU is lent (the N-rank side needs N GPUs)

Both sides run through the real entry point: a config in a temporary directory (configs/
cartpole_ppo.yaml's settings: 32 steps per rollout, one minibatch, 20 epochs, hidden [64, 64];
one seed, torch_threads 1 per rank, sync vector envs, TensorBoard and periodic evaluation off)
and `hpcrl sweep CONFIG --scheduler local`, with `resources.ranks` set, so the N ranks are started
by `hpcrl train --ranks N` exactly as a Grid Engine job starts them. Both sides take the same
rollout per update (ranks x envs x num_steps) and the same total steps. The two sides alternate,
first one then the other, `--repeats` times; the table gives the median over repeats of:

- train SPS: the `sps` column of the run's train.csv (environment steps of all ranks per second
  of training, rollouts and updates), median of the last half of its rows;
- train s: the run's training time (train.csv's last wall_time: from the first rollout on);
- job s: the train job from start to exit (the local executor's record): the processes' start,
  torch's import, the ranks' rendezvous and the training;
- sweep s: the whole `hpcrl sweep`, with its eval and aggregate stages.

The ranks meet over gloo on CPUs and NCCL on GPUs (picked by the device, not by this script).
Every optimiser step all-reduces the gradient, and every iteration gathers the finished episodes
on rank 0 and reduces the stop flag: with one minibatch and 20 epochs, 20 all-reduces per rollout.
For a 64x64 MLP on CartPole the per-step overhead of Python and torch dominates: half the envs
cost a rank much more than half the time of all of them (about 70 % on 2 cores), and each
all-reduce of the 9k-parameter gradient over gloo adds about a millisecond, so 2 ranks on 2 cores
train slower than 1; DD-PPO pays where a rank's envs and network dominate the step (Habitat).
For reference, the raw stepping rate of the same vector envs with random actions in this process
(no policy, no learning), and the load average before the first run: other work on the machine
slows the N-rank side most, its ranks need N cores at once.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAIN = {  # configs/cartpole_ppo.yaml's (RL Zoo's) settings; total_steps and device are set per run
    "lr": 1.0e-3, "anneal_lr": True, "num_steps": 32, "num_minibatches": 1, "update_epochs": 20, "gamma": 0.98,
    "gae_lambda": 0.8, "clip_coef": 0.2, "clip_vloss": False, "anneal_clip": True, "ent_coef": 0.0, "vf_coef": 0.5,
    "max_grad_norm": 0.5, "hidden_sizes": [64, 64], "activation": "tanh", "checkpoint_every": 1_000_000, "torch_threads": 1,
}  # fmt: skip


def config(root: Path, ranks: int, envs: int, args: argparse.Namespace) -> Path:
    data = {
        "name": f"ddppo_{ranks}x{envs}",
        "algo": "ppo",
        "env": {"id": "CartPole-v1", "num_envs": envs, "vectorization": "sync"},
        "train": {**TRAIN, "num_steps": args.num_steps, "update_epochs": args.epochs, "total_steps": args.steps, "device": args.device},
        "sweep": {"seeds": [0]},
        "resources": {"ranks": ranks, "cpus": 1, "gpus": ranks if args.device == "cuda" else 0, "mem": "2G", "time": "00:30:00"},
        "eval": {"episodes": 1},
        "tracking": {"tensorboard": False},
        "output": str(root / "logs"),
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one_run(root: Path, ranks: int, envs: int, args: argparse.Namespace) -> dict[str, float]:
    """`hpcrl sweep` of one side; its figures (see the module's docstring)."""
    root.mkdir(parents=True)
    path = config(root, ranks, envs, args)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(path), "--scheduler", "local"], cwd=root, capture_output=True, text=True)
    sweep_s = time.perf_counter() - start
    (exp,) = (root / "logs").iterdir()
    runs = list((exp / "runs").glob("*/train.csv"))
    jobs = json.loads((exp / "jobs" / "local-state.json").read_text())["jobs"] if (exp / "jobs" / "local-state.json").exists() else {}
    (task,) = jobs.get("train-0-0", {None: {}}).values()
    if task.get("state") != "done" or len(runs) != 1:
        logs = "\n".join(p.read_text()[-2000:] for p in (exp / "jobs" / "logs").glob("train-*"))
        raise SystemExit(f"{ranks} x {envs} envs: the training failed (hpcrl sweep exited {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{logs}")
    if proc.returncode != 0:  # the training's figures stand; say what else failed
        failed = [f"{name}: {t.get('state')} rc {t.get('rc')}" for name, tasks in jobs.items() for t in tasks.values() if t.get("state") != "done"]
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((exp / "jobs" / "logs").glob("*")) if not p.name.startswith("train-"))
        print(f"  warning: {ranks} x {envs} envs: hpcrl sweep exited {proc.returncode} after the training ({'; '.join(failed)}), in {exp} (--dir keeps it){logs}")
    with runs[0].open() as f:
        rows = list(csv.DictReader(f))
    return {
        "sps": statistics.median(float(r["sps"]) for r in rows[len(rows) // 2 :]),
        "train_s": float(rows[-1]["wall_time"]),
        "job_s": task["ended"] - task["started"],
        "sweep_s": sweep_s,
        "steps": int(rows[-1]["step"]),
    }


def raw_env_rate(envs: int, seconds: float) -> float:
    """Steps/s of `envs` CartPole envs in one sync vector env, random actions, in this process."""
    from hpcrl.config.experiment import EnvConfig
    from hpcrl.rl.envs import make_vec_env

    vec = make_vec_env(EnvConfig(id="CartPole-v1", num_envs=envs, vectorization="sync"))
    try:
        vec.reset(seed=0)
        actions = [vec.action_space.sample() for _ in range(64)]
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            vec.step(actions[n % 64])
            n += 1
        return n * envs / (time.perf_counter() - start)
    finally:
        vec.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=_args.positive_integer, default=2, help="ranks of the DD-PPO side (the reference is 1 rank)")
    parser.add_argument("--envs", type=_args.positive_integer, default=16, help="total envs of each side; the DD-PPO side runs envs / ranks per rank")
    parser.add_argument("--num-steps", type=_args.positive_integer, default=32, help="vector steps per rollout (train.num_steps)")
    parser.add_argument("--steps", type=_args.positive_integer, default=65536, help="train.total_steps of each run")
    parser.add_argument("--epochs", type=_args.positive_integer, default=20, help="train.update_epochs: optimiser steps (so all-reduces) per rollout")
    parser.add_argument("--repeats", type=_args.positive_integer, default=3, help="runs of each side, alternating")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: where a GPU is lent (NCCL; resources.gpus = ranks)")
    parser.add_argument("--dir", type=Path, default=None, help="where the experiments go (default: a temporary directory, removed)")
    parser.add_argument("--raw-seconds", type=_args.seconds_or_zero, default=2.0, help="seconds of raw env stepping per env count (0: skip)")
    args = parser.parse_args()
    if args.envs % args.ranks:
        parser.error(f"--envs {args.envs} is not a multiple of --ranks {args.ranks}")
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < args.ranks:
            parser.error(f"--device cuda: {args.ranks} ranks need {args.ranks} GPUs (one per rank), this machine has {torch.cuda.device_count()}")
    sides = [(1, args.envs), (args.ranks, args.envs // args.ranks)]
    load = os.getloadavg()[0]
    results: dict[tuple[int, int], list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="hpcrl-ddppo-") as tmp:
        base = args.dir or Path(tmp)
        for repeat in range(args.repeats):
            for ranks, envs in sides if repeat % 2 == 0 else sides[::-1]:  # alternate which side goes first
                figures = one_run(base / f"r{repeat}-{ranks}x{envs}", ranks, envs, args)
                results[(ranks, envs)].append(figures)
                line = f"{figures['sps']:,.0f} SPS, train {figures['train_s']:.1f} s, job {figures['job_s']:.1f} s"
                print(f"  repeat {repeat + 1}: {ranks} x {envs} envs: {line}", flush=True)
    import torch  # noqa: F401 (the version line)

    print()
    print(f"CartPole-v1 PPO, {args.steps:,} steps, rollout {args.envs} envs x {args.num_steps} steps, {args.epochs} epochs per update, {args.repeats} repeats, "
          f"device {args.device}, torch {sys.modules['torch'].__version__}, {os.cpu_count()} CPUs, load average {load:.2f} before the first run")  # fmt: skip
    print(f"{'side':24}{'train SPS':>11}{'each repeat':>28}{'train s':>9}{'job s':>8}{'sweep s':>9}{'steps':>8}")
    med = {}
    for (ranks, envs), runs in results.items():
        label = f"{ranks} rank{'s' if ranks > 1 else ''} x {envs} envs" + (" (ref.)" if ranks == 1 else "")
        med[ranks] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        each = " ".join(f"{r['sps']:,.0f}" for r in runs)
        m = med[ranks]
        print(f"{label:24}{m['sps']:>11,.0f}{each:>28}{m['train_s']:>9.1f}{m['job_s']:>8.1f}{m['sweep_s']:>9.1f}{int(m['steps']):>8}")
    print(f"{args.ranks} ranks / 1 rank: train SPS x{med[args.ranks]['sps'] / med[1]['sps']:.2f}, job time x{med[args.ranks]['job_s'] / med[1]['job_s']:.2f}")
    if args.raw_seconds > 0:
        counts = sorted({args.envs, args.envs // args.ranks})
        rates = ", ".join(f"{n} envs {raw_env_rate(n, args.raw_seconds):,.0f}" for n in counts)
        print(f"raw env steps/s (random actions, one process, no policy): {rates}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
