"""ViZDoom PPO speed: the env's random-action rate, hpcrl PPO (sync and async), SB3's PPO and Sample
Factory's APPO, on the same scenario; with `--learn`, each learner's final return at equal steps.

    .venv/bin/python benchmarks/vizdoom_speed.py --out /tmp/vzd                       # CPU, 8 envs, 20 s a measurement
    .venv/bin/python benchmarks/vizdoom_speed.py --device cuda --num-envs 8 32 --out results/vzd
    .venv/bin/python benchmarks/vizdoom_speed.py --sides random hpcrl-async -p train.torch_threads=1 --out /tmp/vzd
    .venv/bin/python benchmarks/vizdoom_speed.py --num-envs 8 --sides random hpcrl-async --seconds 15 -p env.envs_per_worker=1
    .venv/bin/python benchmarks/vizdoom_speed.py --num-envs 8 --sides random hpcrl-async sb3 sample-factory --seconds 20 --out /tmp/vzd
    .venv/bin/python benchmarks/vizdoom_speed.py --num-envs 8 --sides hpcrl-async sb3 sample-factory --learn 49152 --out /tmp/vzdl

For each `--num-envs`, in one run and with the same `env:` section (configs/vizdoom_ppo.yaml by
default, `-p key=value` overrides as hpcrl's):
- `random`: the vector env hpcrl trains on, stepped with random actions and nothing else: the most
  any learner could reach with these envs (the note says how its envs sit in worker processes:
  `env.envs_per_worker`, by default two workers per core, 4 x 2 here; `-p env.envs_per_worker=1` for a
  process, and a message each way, per env, hpcrl's layout until 2026-12-02);
- `hpcrl-sync`, `hpcrl-async`: `hpcrl train`'s loop without its files (setup_torch with
  train.torch_threads, the agent built as train builds it) with `train.async_rollout` false / true;
- `sb3`: Stable-Baselines3's PPO (`CnnPolicy`: the same CNN, SB3's NatureCNN or, with other
  `train.cnn_channels`, its copy with those filters; hidden_sizes[0] features, shared by both heads) over SubprocVecEnv workers running the same env adapter (hpcrl.rl.envs.make_env), with the
  same num_envs, n_steps, epochs, minibatch size, learning rate, gamma, lambda, clip range (also for
  the value), coefficients, gradient clipping and reward scale, on the same device and thread count;
  SB3 has no mixed precision, so it runs in float32;
- `sample-factory`: Sample Factory 2.1.1's APPO (rollout workers, an inference worker and a learner,
  each a process of its own; sampling goes on while the learner learns; benchmarks/_sample_factory.py), in a
  venv of its own built on first use (benchmarks/_venvs.py: sample-factory 2.1.1, gymnasium 0.29.1, vizdoom
  1.3.2, torch 2.13.0 CPU); where it cannot be built, the side is SKIPPED with pip's reason. Its own Doom env
  (sf_examples' VizdoomEnv) on the scenario file hpcrl's `env.id` names, from ViZDoom's package
  (basic.cfg: not sf_examples' own basic.cfg, which renders a HUD and has 4 game variables), the same
  frame skip and game resolution, the frame turned grey and averaged to the same size (Sample
  Factory's ResizeWrapper with area interpolation), one channel, no frame stack; `--num-envs` envs in
  one rollout worker per core (2 x 4 here; `--sf-workers`), each worker's envs split in two halves
  stepped in turn (its double buffering). The same network: hpcrl's CNN (the Nature layout with
  train.cnn_channels' filters) and one hidden layer, built from Sample Factory's own encoder parts,
  relu, no RNN (Sample Factory's default is a GRU); the same PPO numbers: rollout num_steps, minibatch
  num_envs x num_steps / num_minibatches (its minibatches are whole rollouts: where one is shorter than
  num_steps, with fewer envs than minibatches, its rollout is cut to the largest length that divides
  both, 16 steps at 2 envs, and the samples per update stay hpcrl's; with a minibatch shorter than its
  rollout, 2.1.1 trained on nothing and said nothing), each minibatch random transitions of the batch as hpcrl's
  (`--shuffle_minibatches`: Sample Factory's default takes each minibatch as a slice of the batch in order, here one
  env's 64 steps, and so trained it did not learn `basic` in 49k steps in 11 of 13 runs; shuffled, 80.65 / 82.45 /
  79.0 over seeds 0-2), num_minibatches per epoch, update_epochs, lr, gamma,
  lambda, clip 0.2 for the ratio and the value, entropy coefficient, value coefficient (half
  vf_coef: hpcrl's value loss has the factor 1/2, Sample Factory's has not), gradient clipping,
  Adam eps 1e-5, reward scale (Sample Factory's learner-side `--reward_scale`, so returns stay raw),
  pixels / 255 and nothing normalised (its Doom defaults normalise inputs and returns: hpcrl's
  config does neither), the learning rate's schedule (train.anneal_lr: hpcrl's linear decay to 0 over
  train.total_steps is Sample Factory's own linear decay, to 0 over `--train_for_env_steps` a minibatch at a
  time: its learner has it, 2.1.1's argument parser does not offer it, so it is set on the parsed config; its default is a constant rate, which at 49k steps is twice hpcrl's mean rate, and the
  comparison ran so until 2026-12-07). What differs, and why: its ratio clip is 1/(1+e)..1+e, not 1-e..1+e (its
  own rule); it samples with a policy up to its max_policy_lag versions old and corrects nothing
  (hpcrl's async rollout is exactly one iteration behind); one torch thread in each of its
  processes (its rule); float32 throughout (it has no mixed precision on a CPU; hpcrl's side runs its
  config's `amp: bf16` where the CPU runs bfloat16 faster, hpcrl.rl.networks.CPU_BF16: the `amp` column). Steps are environment steps (`--summaries_use_frameskip=False`), those its
  learner trained on, as hpcrl counts them. With `--device cuda[:N]`, its learner and inference worker run on
  the GPU hpcrl's side runs on (`--device=gpu`, that GPU the only one it sees: `sf_gpu`).
- `envpool-random` (only where envpool is installed and the scenario is `basic`): EnvPool's
  Basic-v1 at the same frame skip and 80x60 frames, stepped with random actions.

`CPU ms/step`: CPU time per environment step of the measuring process (hpcrl's and SB3's learner;
Sample Factory's runner, its learner being a process of its own) / of it and every process under it
(env workers and their game engines), read from /proc. On a loaded machine SPS depends on how many
processes a side runs against everybody else's; CPU per step hardly does, and `cores / CPU per step`
bounds what a quiet machine can reach.

`steps/ep`: environment steps per episode that ended in the window (-: none ended). A ViZDoom episode's
start costs its engine and worker about as much CPU as five steps of random actions, so a side whose agent has learned to
end episodes sooner (basic: a kill within ~12 steps) pays for four times the starts per step that random actions
do (their episodes run to the 75-step time limit): read SPS with it. `--sides random -p env.max_episode_steps=13`
steps random actions in episodes cut to about a learned policy's length (11.4 steps on basic), the reference at
equal restarts. The last table says what such a start
does to a batched rollout: each vector step's wall time by how many of its envs ended an episode in it (the
random-action and hpcrl sides, which step hpcrl's vector env; `step_waits` in speed.json).

A second table splits each side's CPU per step by part (`_cpu.cpu_by_part`): `main` (the measuring process:
hpcrl's update when its rollout runs in the background, else rollout and update; SB3's learner; Sample
Factory's runner), `rollout` (hpcrl's background rollout thread: forward passes and pipe messages),
`inference` and `learner` (Sample Factory's processes), `env workers` (the processes that host the envs:
hpcrl's one per env, SB3's, Sample Factory's rollout workers) and `engines` (ViZDoom's game processes
under them). It is the profile that says where a side's time goes, and which part a change moved.

`--learn STEPS`: each learner trains STEPS environment steps from scratch (hpcrl: train.total_steps,
so its learning rate anneals over them; SB3 and Sample Factory the same), then its final policy plays `--eval-episodes`
episodes (actions sampled, as configs/vizdoom_ppo.yaml's eval) on its own env of the same scenario,
one after another, and the table gives the mean raw return; SPS is then over the whole training.

Every learner measurement warms up for one iteration (worker start, first allocations, cuDNN's
autotuning), then runs whole iterations (rollout, GAE, update) until `--seconds` have passed; SPS
is environment steps per second of those iterations. Each measurement runs in a child process of
its own session with a hard limit (`--timeout`, default 3 x seconds + 180 s for worker starts): one
that fails or hangs prints its error, its process group is killed, and the others go on. The table
goes to stdout, and with `--out DIR` `speed.json` and `speed.csv` to DIR.

Figures, each with its machine, date and command: docs/reference/benchmarks.md (the current ones: on a 2-core Xeon
with AMX, one H200; EnvPool's random-action rate beside hpcrl's workers), and how they came to be, session by session,
on 2-core VMs quiet and loaded, a Xeon with AMX and AMD EPYCs: docs/reference/benchmark-log.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
from _window import PARTS, StepWaits, cpu_seconds, episodes_ended, return_fields, timed, window

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIDES = ("random", "hpcrl-sync", "hpcrl-async", "sb3", "sample-factory", "envpool-random")
RESULT = "RESULT "
"""The prefix of the child's one line of JSON on stdout."""


# ---------------------------------------------------------------------------- one measurement (child)
def _overrides(args: argparse.Namespace, num_envs: int, extra: list[str] = ()) -> list[str]:
    """The overrides of every side's experiment: the config's -p, the device and the envs measured."""
    gpus = [f"resources.gpus={int(args.device.partition(':')[2] or 0) + 1}"] if args.device.startswith("cuda") else []  # the GPUs a task asks for cover its device
    return [f"train.device={args.device}", *gpus, f"env.num_envs={num_envs}", *args.overrides, *extra]


def _experiment(args: argparse.Namespace, num_envs: int, extra: list[str] = ()) -> Any:
    from hpcrl.config.load import load_experiment

    return load_experiment(Path(args.config), _overrides(args, num_envs, extra))


def layout(spec: Any) -> str:
    """How `make_vec_env` places the envs of `spec` in worker processes here: `2 workers x 4 envs`."""
    from hpcrl.cores import usable_cores
    from hpcrl.rl.envs import workers_for

    workers = workers_for(spec.num_envs, spec.envs_per_worker, usable_cores())
    return f"{workers} workers x {spec.num_envs // workers}{'+' if spec.num_envs % workers else ''} envs"


def measure_random(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    from hpcrl.rl.algorithms import pick_device, pipelines_envs
    from hpcrl.rl.envs import make_vec_env

    exp = _experiment(args, num_envs)
    spec = exp.env
    envs = make_vec_env(spec, pipelined=pipelines_envs(exp.algo, pick_device(exp.train.device)))  # as hpcrl's side places them
    waits = StepWaits(envs)
    try:
        envs.reset(seed=0)

        def step() -> None:
            for _ in range(16):
                envs.step(envs.action_space.sample())

        return {**timed(step, lambda: waits.env_steps, lambda: waits.episodes, args.seconds, waits), "layout": layout(spec)}
    finally:
        envs.close()


def measure_hpcrl(args: argparse.Namespace, num_envs: int, async_rollout: bool) -> dict[str, Any]:
    import torch

    from hpcrl.rl.algorithms import pipelines_envs
    from hpcrl.rl.envs import make_vec_env
    from hpcrl.rl.rollout import THREAD_NAME
    from hpcrl.rl.train import algorithm_class, seed_everything, setup_torch

    exp = _experiment(args, num_envs, [f"train.async_rollout={str(async_rollout).lower()}", *([f"train.total_steps={args.learn}"] if args.learn else [])])
    device = setup_torch(exp.train.torch_threads, exp.train.device)
    seed_everything(args.seed)
    envs = make_vec_env(exp.env, pipelined=pipelines_envs(exp.algo, device))
    waits = StepWaits(envs)
    agent = None
    try:
        agent = algorithm_class(exp.algo)(exp.train, envs, device, args.seed)
        if not args.learn:
            agent.num_iterations = 10**9  # time-bounded: never the last iteration (whose rollout is not followed by another)

        def step() -> None:
            agent.train_iteration()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if not PARTS["threads"]:  # the background rollout's thread starts in the first iteration
                PARTS["threads"] = {t.native_id: "rollout" for t in threading.enumerate() if t.name == THREAD_NAME and t.native_id}
            if agent._learner is not None and not PARTS["processes"]:  # and the learner process, where it pays
                PARTS["processes"] = {agent._learner.process.pid: "learner"}

        if args.learn:  # train.total_steps as `hpcrl train` runs them (the learning rate annealed over them)
            step()
            waits.begin()
            first, ended, start, before = agent.global_step, len(agent.episodes), time.perf_counter(), cpu_seconds()
            while agent.iteration < agent.num_iterations:
                step()
            wall, steps = time.perf_counter() - start, agent.global_step - first
            measured = {**window(steps, wall, len(agent.episodes) - ended, (before, cpu_seconds())), **waits.fields()}
        else:
            measured = timed(step, lambda: agent.global_step, lambda: len(agent.episodes), args.seconds, waits)
        from hpcrl.rl.networks import CPU_BF16

        amp = exp.train.amp if device.type == "cuda" or (exp.train.amp == "bf16" and CPU_BF16) else "none"  # bf16 on a CPU needs AMX
        result = {**measured, "device": str(device), "torch_threads": torch.get_num_threads(), "amp": amp, "layout": layout(exp.env)}
        if args.learn:
            from hpcrl.rl.envs import make_env
            from hpcrl.rl.networks import obs_to_tensor

            agent.close()
            policy = agent.policy.eval()
            result.update(total_steps=agent.global_step, **return_fields(make_env(exp.env), lambda obs: int(policy.act(obs_to_tensor(obs[None], device), False)[0]), args.eval_episodes))
        return result
    finally:
        if agent is not None:
            agent.close()
        envs.close()


def measure_sb3(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
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
            self.marks: list[tuple[float, int, Any, int]] = []
            self.ended = 0

        def _on_rollout_start(self) -> None:
            self.marks.append((time.perf_counter(), self.num_timesteps, cpu_seconds(), self.ended))

        def _on_step(self) -> bool:
            self.ended += int(self.locals["dones"].sum())
            return bool(args.learn) or len(self.marks) < 2 or time.perf_counter() - self.marks[1][0] < args.seconds

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
                    seed=args.seed, device=device, verbose=0)  # fmt: skip
        model.set_logger(Logger(None, []))  # SB3's default logger makes an empty /tmp/SB3-<time> folder each learn()
        clock = Clock()
        model.learn(total_timesteps=args.learn or 10**9, callback=clock)
        if args.learn:
            clock._on_rollout_start()  # the end of the last iteration
        if len(clock.marks) < 3:
            raise RuntimeError(f"SB3 did not finish one timed iteration in {args.seconds} s")
        (start, first, cpu0, ended0), (end, last, cpu1, ended1) = clock.marks[1], clock.marks[-1]
        result = {**window(last - first, end - start, ended1 - ended0, (cpu0, cpu1)), "device": str(device), "torch_threads": torch.get_num_threads(), "amp": "none"}
        if args.learn:
            result.update(total_steps=last, **return_fields(make_env(spec), lambda obs: int(model.predict(obs, deterministic=False)[0]), args.eval_episodes))
        return result
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
        count, ended = [0], [0]

        def step() -> None:
            for _ in range(16):
                _, _, terminated, truncated, _ = env.step(rng.integers(0, env.action_space.n, num_envs))
                count[0] += num_envs
                ended[0] += episodes_ended(terminated, truncated)

        return timed(step, lambda: count[0], lambda: ended[0], args.seconds)
    finally:
        env.close()


# ---------------------------------------------------------------------------- Sample Factory (its own venv)
SF_REQUIREMENTS = ["torch==2.13.0", "sample-factory==2.1.1", "gymnasium==0.29.1", "vizdoom==1.3.2"]
"""Sample Factory's venv (torch 2.13.0 is the CPU wheel here: see benchmarks/_venvs.py)."""


def sf_settings(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    """What Sample Factory's side needs of hpcrl's experiment, read here in hpcrl's environment (the
    child runs in Sample Factory's venv, which has no hpcrl)."""
    exp = _experiment(args, num_envs)
    t, spec, kw = exp.train, exp.env, exp.env.kwargs
    scenario = _scenario_file(spec.id)
    down = int(kw.get("downsample", 1))
    width, height = (int(x) for x in str(kw.get("screen_resolution", "RES_160X120")).removeprefix("RES_").split("X"))
    if exp.algo != "ppo" or t.recurrent_size or len(t.hidden_sizes) != 1 or spec.frame_stack != 1 or str(kw.get("screen_format", "GRAY8")) != "GRAY8":
        raise SystemExit("Sample Factory's side matches a feed-forward PPO with one hidden layer on single grey frames")
    workers = args.sf_workers or min(num_envs, len(os.sched_getaffinity(0)))
    if num_envs % workers:
        raise SystemExit(f"--sf-workers {workers} does not divide {num_envs} envs")
    minibatch = num_envs * t.num_steps // t.num_minibatches
    return {"scenario": scenario, "frame_skip": int(kw.get("frame_skip", 4)), "resolution": f"{width}x{height}", "width": width // down, "height": height // down,
            "num_envs": num_envs, "workers": workers, "rollout": math.gcd(t.num_steps, minibatch), "minibatch": minibatch, "minibatches": t.num_minibatches, "epochs": t.update_epochs, "lr": t.lr,
            "lr_schedule": "linear_decay" if t.anneal_lr else "constant",
            "gamma": t.gamma, "gae_lambda": t.gae_lambda, "clip": t.clip_coef, "clip_value": t.clip_coef if t.clip_vloss else 1e9, "ent_coef": t.ent_coef,
            "vf_coef": t.vf_coef * 0.5, "max_grad_norm": t.max_grad_norm, "reward_scale": t.reward_scale, "cnn_channels": list(t.cnn_channels),
            "hidden": t.hidden_sizes[0], "activation": t.activation, "seed": args.seed,
            "gpu": sf_gpu(args.device)}  # fmt: skip


def sf_gpu(device: str) -> str | None:
    """The one GPU Sample Factory's side sees (its CUDA_VISIBLE_DEVICES) where hpcrl's side runs on `device`:
    its learner takes the first GPU it sees, so cuda:N is the Nth of those this process sees. None: the CPU."""
    if device == "cpu":
        return None
    index = int(device.partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    if index >= len(ids):
        raise SystemExit(f"--device {device}: CUDA_VISIBLE_DEVICES={visible!r} shows {len(ids)} GPU(s)")
    return ids[index]


def _scenario_file(env_id: str) -> str:
    """The scenario file (in ViZDoom's scenarios folder) of hpcrl's `env.id`."""
    import gymnasium as gym

    from hpcrl.rl.vizdoom_env import resolve_id

    return Path(gym.registry[resolve_id(env_id)].kwargs["scenario_config_file"]).name


def measure(args: argparse.Namespace, side: str, num_envs: int) -> dict[str, Any]:
    if side == "random":
        return measure_random(args, num_envs)
    if side in ("hpcrl-sync", "hpcrl-async"):
        return measure_hpcrl(args, num_envs, side == "hpcrl-async")
    if side == "sb3":
        return measure_sb3(args, num_envs)
    if side == "sample-factory":
        from _sample_factory import measure_sample_factory  # in Sample Factory's venv

        return measure_sample_factory(args, json.loads(args.sf_settings))
    return measure_envpool(args, num_envs)


# ---------------------------------------------------------------------------- the run (parent)
def run_child(argv: list[str], side: str, num_envs: int, timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """One measurement in a child process of its own session (run by `python`), killed with its group past `timeout`."""
    from hpcrl.runtime.lifeline import dies_with_me

    # Its temporary files (its envs' game folders: SB3's SubprocVecEnv workers keep theirs in TMPDIR; Sample Factory's
    # checkpoints) go in a folder of its own that it makes itself once its SIGTERM handler is set (`measurement_folder`),
    # removed below however the measurement ended, or by the measurement if this process dies first. Made here, a TERM
    # in the measurement's start (before its handler) left it behind.
    cmd = [python, str(Path(__file__).resolve()), *argv, "--child", side, "--num-envs", str(num_envs)]
    # A session of its own, killed as a group below; and told by the kernel when this process dies (kill -9), as
    # SIGTERM, on which it kills its group (`_end_measurement`).
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=dies_with_me(signal.SIGTERM))
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=1.0)  # a retry after TimeoutExpired loses no output
                break
            except subprocess.TimeoutExpired:
                if proc.poll() is not None:  # it ended, and what it left holds its pipes open (a game engine
                    _kill_group(proc.pid, started)  # orphaned by a killed worker): until now, the whole timeout went by
                elif time.monotonic() > deadline:
                    _kill_group(proc.pid, started)
                    _, err = proc.communicate()
                    said = what_it_said(err)  # where it was: a start that never ended, say
                    return {"error": (f"no result within {timeout:.0f} s: killed" + (f"; its last line: {said}" if said else ""))[:400]}
    finally:
        _kill_group(proc.pid, started)  # whatever it left running (env workers)
        _remove_folders(scratch_prefix(side, os.getpid()))
    for line in out.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    return {"error": (what_it_said(err) or f"exit {proc.returncode}, no output")[:400]}


def _kill_group(pgid: int, started: float) -> None:
    """SIGKILL a measurement's process group (its own session), what is left of it, and the shared memory only
    those processes held: a killed ViZDoom engine's screen buffer and message queues stayed in /dev/shm for ever.
    Then the games' files that nobody holds, made since the measurement `started`: a process of the side killed
    from outside in its game's start (Sample Factory's env_info process, in the test that kills it; the OOM
    killer) left its game's message queues, which no listing of live processes can find."""
    from hpcrl.leftovers import kill_holding, stop_session

    kill_holding(stop_session(pgid), since=started)  # stopped first: a game in its start makes its screen buffer after the listing


def _said(text: str) -> list[str]:
    """A measurement's stderr, the lines that say something, without terminal colours (Sample Factory's log lines
    come coloured, and a cut one would leave the table's rest in its colour)."""
    return [x.strip() for x in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if x.strip()]


_EXCEPTION = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|$)")


def what_it_said(text: str) -> str:
    """A failed measurement's last line, and the first line naming a Python exception (`ValueError: ...`) where that
    is another: a process of the side that died first while the rest went on. Sample Factory's runner outlives its
    rollout workers: with numpy 2 under its 2.1.1 each died at its first step ("setting an array element with a
    sequence"), and the runner's last line, until killed, was its report of 0 frames."""
    lines = _said(text)
    last = lines[-1] if lines else ""
    first = next((x for x in lines if _EXCEPTION.match(x)), "")
    return last if first in ("", last) else f"{last}; its first error: {first}"


def scratch_prefix(side: str, benchmark_pid: int) -> str:
    """Where a measurement's scratch folder is and what its name starts with: the side and the benchmark's process,
    so a folder left behind says whose it was, and the benchmark finds the folder its measurement made. Directly
    under /tmp: multiprocessing's sockets in a long TMPDIR pass the 108 bytes a socket's path may have (SB3's workers:
    "AF_UNIX path too long"; Sample Factory's runner waited for ever with a 76-character pytest tmp_path; 60
    characters worked)."""
    return os.path.join("/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir(), f"vzd-{side}-{benchmark_pid}-")


MEASUREMENT_PREFIX: list[str] = []
"""The prefix of the scratch folder a measurement (child) works in (`scratch_prefix`): removed by the measurement if
the benchmark dies midway."""
MEASUREMENT_STARTED: list[float] = []
"""When the measurement (child) started (a `time.time()`): the games' files made since then that nobody holds are its
own, removed by its end as by the benchmark's (`_kill_group`)."""


def measurement_folder(side: str) -> str:
    """The measurement's scratch folder, made once its SIGTERM handler is set: a TERM at any point after that removes
    it (`_end_measurement`), and before it there is none."""
    MEASUREMENT_STARTED.append(time.time())
    MEASUREMENT_PREFIX.append(scratch_prefix(side, os.getppid()))
    signal.signal(signal.SIGTERM, _end_measurement)
    prefix = MEASUREMENT_PREFIX[0]
    return tempfile.mkdtemp(prefix=os.path.basename(prefix), dir=os.path.dirname(prefix))


def _remove_folders(prefix: str) -> None:
    """The scratch folders whose path starts with `prefix`."""
    for folder in glob.glob(glob.escape(prefix) + "*"):
        shutil.rmtree(folder, ignore_errors=True)


def _end_measurement(signum: int, frame: Any) -> None:
    """A measurement's SIGTERM (the benchmark that started it died): end its whole session. Its env workers die
    with it anyway (their lifeline), but the game engines under them would not: orphaned, they waited for their
    controller for ever. The measurement's own folder goes first (Sample Factory's: the parent, which would have
    removed it, is gone). The rest stops at once (`stop_session`: nothing it makes goes unlisted) and a fresh
    process of a session of its own ends it as the benchmark would have (`_kill_group`): `leftovers.kill_holding`,
    SIGKILL, the resource trackers left to unlink the semaphores of their killed clients, the shared memory only
    the session held removed once it is gone, and the games' files made since the measurement started that
    nobody holds. A SIGKILL of the whole group left the games' message queues in
    /dev/shm, and a Sample Factory measurement's semaphores (sem.mp-*). Fresh, not forked: a fork holds this
    process's mappings and the write end of its resource tracker's pipe, so that the one would look held and the
    other would wait."""
    try:
        for prefix in MEASUREMENT_PREFIX:  # by its prefix: a TERM between the folder's making and its name's return
            _remove_folders(prefix)
        from hpcrl.leftovers import LEFTOVER_GRACE_S, stop_session

        others = stop_session(os.getsid(0), spare=[os.getpid()])
        ender = "import sys; sys.path.insert(0, sys.argv[1]); from hpcrl.leftovers import kill_holding; kill_holding([int(pid) for pid in sys.argv[3:]], since=float(sys.argv[2]))"
        subprocess.Popen([sys.executable, "-I", "-S", "-c", ender, str(ROOT), repr(MEASUREMENT_STARTED[0]), *map(str, [*others, os.getpid()])],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        time.sleep(3 * LEFTOVER_GRACE_S)  # it SIGKILLs this process; should it fail, the group goes below
    finally:  # whatever failed above (no process to be had), the group goes
        os.killpg(os.getpgid(0), signal.SIGKILL)


def sample_factory_child(args: argparse.Namespace, argv: list[str], num_envs: int, timeout: float) -> dict[str, Any]:
    """Sample Factory's measurement, in its venv (built on first use); SKIPPED with pip's reason where it cannot be built."""
    from _venvs import Unavailable, venv_python

    try:
        python = venv_python("sample-factory", SF_REQUIREMENTS)
    except Unavailable as exc:
        return {"error": f"SKIPPED: {exc}"}
    return run_child([*argv, "--sf-settings", json.dumps(sf_settings(args, num_envs))], "sample-factory", num_envs, timeout, str(python))


def _failed(error: str) -> str:
    return error if error.startswith("SKIPPED") else f"FAILED: {error}"


def table(rows: list[dict[str, Any]]) -> str:
    learn = any("final_return" in r for r in rows)
    width = 17  # room for a return and error of an unlearned policy: -197.0 ± 108.5
    ret = f"{'return ± se':>{width}}" if learn else ""
    lines = [f"{'envs':>5}  {'side':<15}{'SPS':>9}{'x random':>10}{'x SB3':>8}{'x SF':>7}{ret}{'steps/ep':>9}{'CPU ms/step':>15}  {'device / threads / amp':<24}note"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{'-':>9}{'':>10}{'':>8}{'':>7}{ret and ' ' * width}{'':>9}{'':>15}  {'':<24}{_failed(r['error'])}")
            continue
        x_random, x_sb3, x_sf = (f"{r[k]:.2f}" if r.get(k) else "" for k in ("x_random", "x_sb3", "x_sf"))
        final = f"{_return_cell(r):>{width}}" if "final_return" in r else (f"{'':>{width}}" if learn else "")
        where = f"{r.get('device', '')} / {r.get('torch_threads', '')} / {r.get('amp', '')}" if "device" in r else ""
        note = f"{r['steps']} steps in {r['seconds']:.1f} s" + (f", {r['layout']}" if "layout" in r else "") + (f", {r['total_steps']} steps trained" if "total_steps" in r else "")
        cpu = f"{r['cpu_ms_own']:.2f} / {r['cpu_ms_all']:.2f}" if "cpu_ms_all" in r else ""
        lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{r['sps']:>9.0f}{x_random:>10}{x_sb3:>8}{x_sf:>7}{final}{steps_per_episode(r):>9}{cpu:>15}  {where:<24}{note}")
    return "\n".join(lines)


def _return_cell(row: dict[str, Any]) -> str:
    """A row's final return and its standard error over the evaluation's episodes (the mean alone for one episode)."""
    se = row.get("final_return_se")
    return f"{row['final_return']:.1f}" + ("" if se is None else f" ± {se:.1f}")


def steps_per_episode(row: dict[str, Any]) -> str:
    """A row's environment steps per episode that ended in its window, as a cell: a ViZDoom episode's start
    costs the engine about as much CPU as one or two steps, so a side whose agent has learned to end episodes
    sooner (basic: a kill) pays for more starts per step than random actions, whose episodes run to the time
    limit. `-` where no episode ended or no step was counted."""
    return f"{row['steps'] / row['episodes']:.1f}" if row.get("episodes") and row.get("steps") else "-"


PART_ORDER = ("main", "rollout", "inference", "learner", "env workers", "engines")
"""The parts' columns, in the order a step flows through them (cpu_seconds' parts)."""


def parts_table(rows: list[dict[str, Any]]) -> str:
    """Where each side's CPU time goes, in milliseconds per environment step: the measuring process (`main`:
    hpcrl's update with an async rollout, else rollout and update; SB3's learner; Sample Factory's runner),
    hpcrl's background rollout thread, Sample Factory's inference and learner processes, the processes that
    host the envs, and the game engines under them."""
    parts = [p for p in PART_ORDER if any(p in r.get("cpu_ms_parts", {}) for r in rows)]
    lines = [f"{'envs':>5}  {'side':<15}" + "".join(f"{p:>13}" for p in parts) + f"{'all':>8}"]
    for r in rows:
        if "cpu_ms_parts" in r:
            cells = "".join(f"{r['cpu_ms_parts'][p]:>13.3f}" if p in r["cpu_ms_parts"] else f"{'':>13}" for p in parts)
            lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{cells}{r['cpu_ms_all']:>8.3f}")
    return "\n".join(lines)


def waits_table(rows: list[dict[str, Any]]) -> str:
    """Each side's vector steps by the episodes that ended in them (0, 1, 2, 3 or more): the mean wall time of
    such a step and its share of the steps (`StepWaits`)."""
    lines = [f"{'envs':>5}  {'side':<15}" + "".join(f"{f'{k} ended':>17}" for k in ("0", "1", "2", "3+"))]
    for r in rows:
        if "step_waits" not in r:
            continue
        waits = {int(k): v for k, v in r["step_waits"].items()}
        total = sum(n for n, _ in waits.values())
        cells = ""
        for low, high in ((0, 0), (1, 1), (2, 2), (3, None)):
            group = [(n, ms) for k, (n, ms) in waits.items() if low <= k and (high is None or k <= high)]
            n = sum(g for g, _ in group)
            cells += f"{sum(g * ms for g, ms in group) / n:>9.2f} ms {100 * n / total:>3.0f}%" if n else f"{'-':>17}"
        lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "vizdoom_ppo.yaml"))
    parser.add_argument("-p", dest="overrides", action="append", default=[], help="key=value, as hpcrl's -p")
    parser.add_argument("--device", type=_args.device, default="cpu", help="train.device of hpcrl and SB3 (Sample Factory: the same GPU): cpu, cuda, cuda:N")
    parser.add_argument("--num-envs", type=_args.positive_integer, nargs="+", default=[8])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--seconds", type=_args.seconds, default=20.0, help="timed seconds per measurement, after one warm-up iteration")
    parser.add_argument("--timeout", type=_args.seconds, default=None, help="hard limit per measurement (default 3 x seconds + 180)")
    parser.add_argument("--learn", type=_args.count, default=0, metavar="STEPS",
                        help="instead of --seconds: each learner trains STEPS env steps from scratch (hpcrl: train.total_steps), then its final policy plays --eval-episodes")
    parser.add_argument("--eval-episodes", type=_args.positive_integer, default=20, help="with --learn: episodes of the final evaluation (actions sampled), raw returns")
    parser.add_argument("--seed", type=_args.seed, default=0, help="every learner's seed")
    parser.add_argument("--sf-workers", type=_args.count, default=0, help="Sample Factory's rollout workers (default: one per core, at most one per env)")
    parser.add_argument("--out", type=Path, default=None, help="directory for speed.json and speed.csv (without it, the tables are only printed)")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--sf-settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.scratch = measurement_folder(args.child)  # its temporary files, removed with the measurement: nothing else
        os.environ["TMPDIR"] = tempfile.tempdir = args.scratch
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        result = measure(args, args.child, args.num_envs[0])
        print(RESULT + json.dumps(result), flush=True)
        return
    # A TERM (a job's time limit, gpu_node.sh's stop) unwinds through each measurement's cleanup (`run_child`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for n in args.num_envs:  # the experiment every side reads: a bad key or value is one line, before anything is measured
        _args.experiment(parser, args.config, _overrides(args, n))
    if args.out is not None:
        _args.make_folder(parser, args.out, "--out")
    import torch

    if args.device != "cpu":  # a GPU that is not there: one line before any side runs, not each side failing its own way
        index, count = int(args.device.partition(":")[2] or 0), torch.cuda.device_count()
        if index >= count:
            parser.error(f"argument --device: {args.device} is not among the {count} GPU(s) torch sees here")
        if "sample-factory" in args.sides:
            try:
                sf_gpu(args.device)
            except SystemExit as refused:
                parser.error(str(refused))

    argv = ["--config", args.config, "--device", args.device, "--seconds", str(args.seconds), "--learn", str(args.learn), "--eval-episodes", str(args.eval_episodes), "--seed", str(args.seed)]
    for o in args.overrides:
        argv += ["-p", o]
    timeout = args.timeout or (3 * args.seconds + 180 if not args.learn else args.learn / 20 + 300)  # learning: at least 20 steps/s
    print(f"{Path(args.config).name} {' '.join(args.overrides)}: device {args.device}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{args.seconds:.0f} s a measurement; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for n in args.num_envs:
        for side in args.sides:
            if side == "sample-factory":
                result = {"num_envs": n, "side": side, **sample_factory_child(args, argv, n, timeout)}
            elif args.learn and side in ("random", "envpool-random"):
                continue
            else:
                result = {"num_envs": n, "side": side, **run_child(argv, side, n, timeout)}
            rows.append(result)
            print(f"  {n} envs, {side}: " + (f"{result['sps']:.0f} SPS" if "sps" in result else _failed(result["error"])), flush=True)
    for r in rows:
        same = {x["side"]: x.get("sps") for x in rows if x["num_envs"] == r["num_envs"]}
        if "sps" in r and r["side"] != "random" and same.get("random"):
            r["x_random"] = r["sps"] / same["random"]
        if "sps" in r and r["side"].startswith("hpcrl") and same.get("sb3"):
            r["x_sb3"] = r["sps"] / same["sb3"]
        if "sps" in r and r["side"].startswith("hpcrl") and same.get("sample-factory"):
            r["x_sf"] = r["sps"] / same["sample-factory"]
    print()
    print(table(rows))
    if any("cpu_ms_parts" in r for r in rows):
        print("\nCPU ms per environment step, by part (where the time goes):")
        print(parts_table(rows))
    if any("step_waits" in r for r in rows):
        print("\nA vector step's wall time by the episodes that ended in it, and its share of the steps (a restarting game holds up its batch):")
        print(waits_table(rows))
    if args.out is None:
        return
    meta = {"config": args.config, "overrides": args.overrides, "device": args.device, "seconds": args.seconds, "cpus": os.cpu_count(), "torch": torch.__version__}
    from hpcrl.io import atomic_write_csv, atomic_write_text  # a temporary file of its own per writer: two runs into one --out never mix

    atomic_write_text(args.out / "speed.json", json.dumps({"meta": meta, "rows": rows}, indent=1))
    fields = ["num_envs", "side", "sps", "x_random", "x_sb3", "x_sf", "final_return", "final_return_se", "total_steps", "episodes", "cpu_ms_own", "cpu_ms_all", "steps", "seconds", "device", "torch_threads", "amp", "layout", "error"]
    atomic_write_csv(args.out / "speed.csv", fields, ([r.get(f, "") for f in fields] for r in rows))
    print(f"\nwrote {args.out / 'speed.json'} and {args.out / 'speed.csv'}")


if __name__ == "__main__":
    main()
