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
  each a process of its own; sampling goes on while the learner learns), in a venv of its own built on
  first use (benchmarks/_venvs.py: sample-factory 2.1.1, gymnasium 0.29.1, vizdoom 1.3.2, torch 2.13.0
  CPU); where it cannot be built, the side is SKIPPED with pip's reason. Its own Doom env
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
  rollout, 2.1.1 trained on nothing and said nothing), num_minibatches per epoch, update_epochs, lr, gamma,
  lambda, clip 0.2 for the ratio and the value, entropy coefficient, value coefficient (half
  vf_coef: hpcrl's value loss has the factor 1/2, Sample Factory's has not), gradient clipping,
  Adam eps 1e-5, reward scale (Sample Factory's learner-side `--reward_scale`, so returns stay raw),
  pixels / 255 and nothing normalised (its Doom defaults normalise inputs and returns: hpcrl's
  config does neither). What differs, and why: the learning rate is constant (2.1.1 has no linear
  decay; hpcrl anneals it over train.total_steps); its ratio clip is 1/(1+e)..1+e, not 1-e..1+e (its
  own rule); it samples with a policy up to its max_policy_lag versions old and corrects nothing
  (hpcrl's async rollout is exactly one iteration behind); one torch thread in each of its
  processes (its rule). Steps are environment steps (`--summaries_use_frameskip=False`), those its
  learner trained on, as hpcrl counts them.
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
do (their episodes run to the 75-step time limit): read SPS with it. The last table says what such a start
does to a batched rollout: each vector step's wall time by how many of its envs ended an episode in it (the
random-action and hpcrl sides, which step hpcrl's vector env; `step_waits` in speed.json).

A second table splits each side's CPU per step by part (`_cpu.cpu_by_part`): `main` (the measuring process:
hpcrl's update when its rollout runs in the background, else rollout and update; SB3's learner; Sample
Factory's runner), `rollout` (hpcrl's background rollout thread: forward passes and pipe messages),
`inference` and `learner` (Sample Factory's processes), `env workers` (the processes that host the envs:
hpcrl's one per env, SB3's, Sample Factory's rollout workers) and `engines` (ViZDoom's game processes
under them). It is the profile that says where a side's time goes, and which part a change moved.

`--learn STEPS`: each learner trains STEPS environment steps from scratch (hpcrl: train.total_steps,
so its learning rate anneals over them; SB3 the same), then its final policy plays `--eval-episodes`
episodes (actions sampled, as configs/vizdoom_ppo.yaml's eval) on its own env of the same scenario,
one after another, and the table gives the mean raw return; SPS is then over the whole training.

Every learner measurement warms up for one iteration (worker start, first allocations, cuDNN's
autotuning), then runs whole iterations (rollout, GAE, update) until `--seconds` have passed; SPS
is environment steps per second of those iterations. Each measurement runs in a child process of
its own session with a hard limit (`--timeout`, default 3 x seconds + 180 s for worker starts): one
that fails or hangs prints its error, its process group is killed, and the others go on. The table
goes to stdout, and with `--out DIR` `speed.json` and `speed.csv` to DIR.

Figures (2026-11-26): docs/reference/benchmarks.md. On one H200 with 16 cores (`--device cuda --num-envs 8 32
--seconds 15`): 8 envs: random 6,031, sync 1,583, async 2,172, SB3 1,708; 32 envs: random 10,447,
sync 5,091, async 6,311, SB3 4,548. The rollout alone (the update replaced by nothing) ran at 2,679
with 8 envs, so what is left is the rollout's per-step inference round trip, not the update.
EnvPool 1.2.5 (`pip install envpool`; its Basic-v1 renders the scenario's 320x240 RGB and resizes,
3 channels) stepped 8 envs at 0.5-0.7x the rate of hpcrl's 8 worker processes on the 2-core VM
(1,085-1,314 against 1,850 in the same minute, quiet; 1,122 against 1,869 under load), so it is
no backend of hpcrl; the `envpool-random` side measures it where it is installed.

Figures (2026-12-03, a 2-core Xeon with AMX, quiet; `--num-envs 8 --sides random hpcrl-async sb3 sample-factory
--seconds 20`, twice, with the update yielding the cores to the rollout): random 3,937 / 3,984, hpcrl async 1,919 /
2,001 (0.49x / 0.50x random; 0.79 / 0.85 ms of CPU a step), SB3 1,331 / 1,358, Sample Factory 1,663 / 1,655 (1.13):
hpcrl 1.15x / 1.21x Sample Factory (docs/reference/benchmarks.md).
The same command later that day: random 3,645 (47.4 steps an episode), hpcrl async 1,832 (12.1; 0.50x random,
1.20x Sample Factory), SB3 1,191 (25.9), Sample Factory 1,523 (48.9: not yet learning). hpcrl with learning switched
off (`-p train.lr=1e-9`, 46.6 steps an episode), alternated with the defaults: 2,061 / 2,041 against 1,829 / 1,741
(0.55x / 0.56x of the random rate beside it against 0.48x / 0.48x).

Figures (2026-12-02, the 2-core VM quiet; `--num-envs 8 --sides random hpcrl-async sb3 sample-factory
--seconds 20`): random 3,307 (0.48 ms/step), hpcrl async 1,405 (0.48 / 1.14), SB3 1,151 (1.05 / 1.56),
Sample Factory 1,768 (1.08): on a quiet machine Sample Factory is the faster sampler, at about hpcrl's CPU
per step, by keeping both cores busy. `--learn 49152`, seed 0: hpcrl 75.0, SB3 75.8, Sample Factory 2.1.

Figures (2026-12-02, later; after the env workers' downsampling was made 11x cheaper, hpcrl.rl.vizdoom_env.block_mean;
the same command, three runs): hpcrl async against Sample Factory 1,580 / 1,475 (1.07x), 1,199 / 1,276 (0.94x),
1,175 / 1,239 (0.95x). The part table of the last: hpcrl update 0.35 + rollout thread 0.27 + env workers 0.42 +
engines 0.33 = 1.37 ms a step; Sample Factory inference 0.50 + learner 0.37 + env workers 0.42 + engines 0.25 =
1.56. hpcrl needs less CPU a step and keeps 1.6 of 2 cores busy to Sample Factory's 1.9 (docs/reference/benchmarks.md).

Figures (2026-11-27, issue 39; the 2-core VM shared with other sessions, load average 8-16 throughout,
so SPS are indicative and the CPU column is the figure to compare): 8 envs, 20 s windows, `-p
train.torch_threads=1` (SB3 at 2 threads spins in OpenMP barriers on a loaded machine: 59 SPS, 7.3 ms
of CPU a step): random 1,574 (0.90 ms/step), hpcrl async 638 (0.72 / 1.72), SB3 352 (0.88 / 1.85),
Sample Factory 333 (1.84); over 60 s windows hpcrl async 786 and Sample Factory 789 (1.80 and 1.74
ms/step): Sample Factory starts slower and then keeps pace. At equal steps (`--learn 49152`, seed 0):
final return hpcrl 74.0, SB3 41.4, Sample Factory 62.5.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
    from hpcrl.config.experiment import load_experiment

    return load_experiment(Path(args.config), _overrides(args, num_envs, extra))


PARTS: dict[str, dict[int, str]] = {"threads": {}, "processes": {}}
"""The parts of the measured side that `cpu_seconds` tells apart (_cpu.cpu_by_part's `threads` and
`processes`), named by the side's measurement once they exist."""


def cpu_seconds() -> tuple[float, float, dict[str, float]]:
    """CPU seconds used so far by (this process, it and every process under it: env workers, their game
    engines, Sample Factory's workers, those by part). Unlike steps per second, CPU time per step hardly
    depends on what else the machine runs: the figure to compare on a loaded machine (a quiet one's rate is
    at most cores / CPU time per step)."""
    from _cpu import cpu_by_part

    parts = cpu_by_part(os.getpid(), PARTS["threads"], PARTS["processes"])
    own = sum(v for k, v in parts.items() if k == "main" or k in PARTS["threads"].values())
    return own, sum(parts.values()), parts


def episodes_ended(terminated: Any, truncated: Any) -> int:
    """The episodes that ended in one vector step: each env whose episode terminated or was cut, every one of
    them where several end in the same step."""
    return int((terminated | truncated).sum())


class StepWaits:
    """Each vector step's wall time, by how many of its envs ended an episode in it: where a learner that ends
    episodes sooner waits. ViZDoom starts an episode in ~1.7 ms of wall time, and a batched rollout waits for the
    worker whose game restarts (2026-12-03, 8 envs on 2 cores: 2.9 ms a step in which none ended, 4.5 with one).
    It wraps `envs.step` of hpcrl's vector env (the random-action and hpcrl sides; a rollout that pipelines
    worker groups on a GPU steps them otherwise, and nothing is recorded)."""

    def __init__(self, envs: Any) -> None:
        self.inner = envs.step
        envs.step = self
        self.env_steps = 0
        self.episodes = 0
        """Every environment step and ended episode so far (the random-action side's counts)."""
        self.begin()

    def begin(self) -> None:
        """Forget what was recorded: the measured window starts."""
        self.counts: dict[int, int] = {}
        self.seconds: dict[int, float] = {}

    def __call__(self, actions: Any) -> Any:
        start = time.perf_counter()
        outcome = self.inner(actions)
        wall, ended = time.perf_counter() - start, episodes_ended(outcome[2], outcome[3])
        self.env_steps += len(outcome[2])
        self.episodes += ended
        counts, seconds = self.counts, self.seconds  # (one pair: `begin` may swap them from another thread)
        counts[ended] = counts.get(ended, 0) + 1
        seconds[ended] = seconds.get(ended, 0.0) + wall
        return outcome

    def fields(self) -> dict[str, Any]:
        """`step_waits`: {episodes ended in a step: [steps, mean wall ms]}, as a row's field (none recorded: none)."""
        counts, seconds = self.counts, self.seconds
        return {"step_waits": {str(k): [counts[k], 1000 * seconds[k] / counts[k]] for k in sorted(counts)}} if counts else {}


def window(steps: int, seconds: float, episodes: int, cpu: tuple[tuple[float, float, dict[str, float]], tuple[float, float, dict[str, float]]]) -> dict[str, Any]:
    """A measured window as a row's fields: SPS, steps, seconds, the episodes that ended in it, and CPU per step
    between its two `cpu_seconds()` readings (`per_step`). Every side's window is made here."""
    return {"sps": steps / seconds, "steps": steps, "seconds": seconds, "episodes": episodes, **per_step(cpu, steps)}


def per_step(cpu: tuple[tuple[float, float, dict[str, float]], tuple[float, float, dict[str, float]]], steps: int) -> dict[str, Any]:
    """CPU milliseconds per environment step between two `cpu_seconds()` readings: the measuring process,
    all, and all by part (`cpu_ms_parts`). Nothing where no step was counted (a window of a second in which Sample
    Factory, which counts its steps as its learner trains, trained none): the table then leaves the cells empty."""
    if steps <= 0:
        return {}
    (own0, all0, parts0), (own1, all1, parts1) = cpu
    ms = 1000 / steps
    parts = {k: ms * (v - parts0.get(k, 0.0)) for k, v in parts1.items()}
    return {"cpu_ms_own": ms * (own1 - own0), "cpu_ms_all": ms * (all1 - all0), "cpu_ms_parts": {k: v for k, v in parts.items() if v > 0}}


def _timed(step: Any, steps_of: Any, episodes_of: Any, seconds: float, waits: StepWaits | None = None) -> dict[str, Any]:
    """Run `step()` once to warm up, then until `seconds` have passed: SPS, steps, seconds, the episodes
    that ended meanwhile (`episodes_of()` counts them) and CPU per step, as a row's fields (with `waits`,
    the vector steps' waits in the window)."""
    step()
    if waits is not None:
        waits.begin()
    first, ended, start, cpu = steps_of(), episodes_of(), time.perf_counter(), cpu_seconds()
    while True:
        step()
        wall = time.perf_counter() - start
        if wall >= seconds:
            steps = steps_of() - first
            return {**window(steps, wall, episodes_of() - ended, (cpu, cpu_seconds())), **(waits.fields() if waits is not None else {})}


def layout(spec: Any) -> str:
    """How `make_vec_env` places the envs of `spec` in worker processes here: `2 workers x 4 envs`."""
    from hpcrl.cores import usable_cores
    from hpcrl.rl.envs import workers_for

    workers = workers_for(spec.num_envs, spec.envs_per_worker, usable_cores())
    return f"{workers} workers x {spec.num_envs // workers}{'+' if spec.num_envs % workers else ''} envs"


def measure_random(args: argparse.Namespace, num_envs: int) -> dict[str, Any]:
    from hpcrl.rl.envs import make_vec_env

    spec = _experiment(args, num_envs).env
    envs = make_vec_env(spec)
    waits = StepWaits(envs)
    try:
        envs.reset(seed=0)

        def step() -> None:
            for _ in range(16):
                envs.step(envs.action_space.sample())

        return {**_timed(step, lambda: waits.env_steps, lambda: waits.episodes, args.seconds, waits), "layout": layout(spec)}
    finally:
        envs.close()


def measure_hpcrl(args: argparse.Namespace, num_envs: int, async_rollout: bool) -> dict[str, Any]:
    import torch

    from hpcrl.rl.envs import make_vec_env
    from hpcrl.rl.rollout import THREAD_NAME
    from hpcrl.rl.train import algorithm_class, seed_everything, setup_torch

    exp = _experiment(args, num_envs, [f"train.async_rollout={str(async_rollout).lower()}", *([f"train.total_steps={args.learn}"] if args.learn else [])])
    device = setup_torch(exp.train.torch_threads, exp.train.device)
    seed_everything(args.seed)
    envs = make_vec_env(exp.env)
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

        if args.learn:  # train.total_steps as `hpcrl train` runs them (the learning rate annealed over them)
            step()
            waits.begin()
            first, ended, start, before = agent.global_step, len(agent.episodes), time.perf_counter(), cpu_seconds()
            while agent.iteration < agent.num_iterations:
                step()
            wall, steps = time.perf_counter() - start, agent.global_step - first
            timed = {**window(steps, wall, len(agent.episodes) - ended, (before, cpu_seconds())), **waits.fields()}
        else:
            timed = _timed(step, lambda: agent.global_step, lambda: len(agent.episodes), args.seconds, waits)
        from hpcrl.rl.networks import CPU_BF16

        amp = exp.train.amp if device.type == "cuda" or (exp.train.amp == "bf16" and CPU_BF16) else "none"  # bf16 on a CPU needs AMX
        result = {**timed, "device": str(device), "torch_threads": torch.get_num_threads(), "amp": amp, "layout": layout(exp.env)}
        if args.learn:
            from hpcrl.rl.envs import make_env
            from hpcrl.rl.networks import obs_to_tensor

            agent.close()
            policy = agent.policy.eval()
            result.update(total_steps=agent.global_step, final_return=mean_return(make_env(exp.env), lambda obs: int(policy.act(obs_to_tensor(obs[None], device), False)[0]), args.eval_episodes))
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
            result.update(total_steps=last, final_return=mean_return(make_env(spec), lambda obs: int(model.predict(obs, deterministic=False)[0]), args.eval_episodes))
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

        return _timed(step, lambda: count[0], lambda: ended[0], args.seconds)
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
            "gamma": t.gamma, "gae_lambda": t.gae_lambda, "clip": t.clip_coef, "clip_value": t.clip_coef if t.clip_vloss else 1e9, "ent_coef": t.ent_coef,
            "vf_coef": t.vf_coef * 0.5, "max_grad_norm": t.max_grad_norm, "reward_scale": t.reward_scale, "cnn_channels": list(t.cnn_channels),
            "hidden": t.hidden_sizes[0], "activation": t.activation, "seed": args.seed}  # fmt: skip


def _scenario_file(env_id: str) -> str:
    """The scenario file (in ViZDoom's scenarios folder) of hpcrl's `env.id`."""
    import gymnasium as gym

    from hpcrl.rl.vizdoom_env import resolve_id

    return Path(gym.registry[resolve_id(env_id)].kwargs["scenario_config_file"]).name


def _sf_env(full_env_name: str, cfg: Any, env_config: Any, render_mode: str | None = None) -> Any:
    """Sample Factory's own Doom env (sf_examples' VizdoomEnv and wrappers) on hpcrl's scenario file
    from ViZDoom's package, its frame skip, resolution, and the same downsampled grey frame
    (area interpolation: the mean of each block, as hpcrl's adapter takes it)."""
    import vizdoom
    from gymnasium.spaces import Discrete
    from sample_factory.envs.env_wrappers import PixelFormatChwWrapper, ResizeWrapper
    from sf_examples.vizdoom.doom.doom_gym import VizdoomEnv
    from sf_examples.vizdoom.doom.wrappers.observation_space import SetResolutionWrapper

    env = VizdoomEnv(Discrete(4), os.path.join(vizdoom.scenarios_path, cfg.hpcrl_scenario), skip_frames=cfg.env_frameskip, render_mode=render_mode)
    env = SetResolutionWrapper(env, cfg.hpcrl_resolution)
    env = ResizeWrapper(env, cfg.res_w, cfg.res_h, grayscale=True, add_channel_dim=True, area_interpolation=True)
    return PixelFormatChwWrapper(env) if cfg.pixel_format == "CHW" else env


def _sf_encoder(cfg: Any, obs_space: Any) -> Any:
    """hpcrl's CNN for Sample Factory: the Nature CNN's layout with train.cnn_channels' filters, then
    one hidden layer (train.hidden_sizes), built from Sample Factory's own conv encoder parts."""
    from sample_factory.model.encoder import ConvEncoderImpl, Encoder
    from sample_factory.model.model_utils import nonlinearity

    class HpcrlCNN(Encoder):
        def __init__(self, cfg: Any, obs_space: Any) -> None:
            super().__init__(cfg)
            shape = obs_space["obs"].shape
            c1, c2, c3 = cfg.hpcrl_cnn
            filters = [[shape[0], c1, 8, 4], [c1, c2, 4, 2], [c2, c3, 3, 1]]
            self.enc = ConvEncoderImpl(shape, filters, [cfg.hpcrl_hidden], nonlinearity(cfg))
            self.out = cfg.hpcrl_hidden

        def forward(self, obs_dict: Any) -> Any:
            return self.enc(obs_dict["obs"])

        def get_out_size(self) -> int:
            return self.out

    return HpcrlCNN(cfg, obs_space)


def measure_sample_factory(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    """Sample Factory's APPO (its ParallelRunner: rollout workers, an inference worker and a learner in
    processes of their own) on hpcrl's env and network; the steps its learner trained on, per second."""
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.context import global_model_factory
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from sf_examples.vizdoom.doom.doom_params import add_doom_env_args, doom_override_defaults

    s = settings
    per_worker = s["num_envs"] // s["workers"]
    train_dir = args.scratch  # its checkpoints too, in the measurement's scratch folder (its TMPDIR: a short path, see `run_child`)
    os.chdir(train_dir)  # ViZDoom's engines write ./_vizdoom* here; `run_child` removes the folder, however this ended
    learn = args.learn or 10**9
    argv = [
        "--env=hpcrl_doom", "--experiment=sf", f"--train_dir={train_dir}", "--device=cpu", f"--seed={s['seed']}",
        f"--num_workers={s['workers']}", f"--num_envs_per_worker={per_worker}", f"--worker_num_splits={2 if per_worker % 2 == 0 else 1}",
        f"--rollout={s['rollout']}", f"--batch_size={s['minibatch']}", f"--num_batches_per_epoch={s['minibatches']}",
        f"--num_epochs={s['epochs']}", f"--learning_rate={s['lr']}", f"--gamma={s['gamma']}", f"--gae_lambda={s['gae_lambda']}",
        f"--ppo_clip_ratio={s['clip']}", f"--ppo_clip_value={s['clip_value']}", "--exploration_loss=entropy", f"--exploration_loss_coeff={s['ent_coef']}",
        f"--value_loss_coeff={s['vf_coef']}", f"--max_grad_norm={s['max_grad_norm']}", f"--reward_scale={s['reward_scale']}", "--adam_eps=1e-5",
        "--normalize_input=False", "--normalize_returns=False", "--obs_scale=255.0", "--use_rnn=False", f"--nonlinearity={s['activation']}",
        f"--env_frameskip={s['frame_skip']}", f"--res_w={s['width']}", f"--res_h={s['height']}", "--summaries_use_frameskip=False",
        f"--train_for_env_steps={learn}", "--save_every_sec=100000", "--save_best_every_sec=100000", "--experiment_summaries_interval=100000",
        f"--hpcrl_scenario={s['scenario']}", f"--hpcrl_resolution={s['resolution']}", f"--hpcrl_hidden={s['hidden']}",
        "--hpcrl_cnn", *map(str, s["cnn_channels"]),
    ]  # fmt: skip
    parser, _ = parse_sf_args(argv=argv)
    add_doom_env_args(parser)
    doom_override_defaults(parser)
    parser.add_argument("--hpcrl_scenario")
    parser.add_argument("--hpcrl_resolution")
    parser.add_argument("--hpcrl_hidden", type=_args.positive_integer)
    parser.add_argument("--hpcrl_cnn", type=_args.positive_integer, nargs=3)
    cfg = parse_full_cfg(parser, argv)
    register_env("hpcrl_doom", _sf_env)
    global_model_factory().register_encoder_factory(_sf_encoder)

    class Clock(AlgoObserver):
        """(time, env steps trained on) after each training iteration; stops a timed run."""

        def __init__(self) -> None:
            self.marks: list[tuple[float, int, Any, int]] = []
            self.ended = 0

        def episode(self, runner: Any, msg: Any, policy_id: Any) -> None:
            """Its rollout workers' report of one finished episode."""
            self.ended += 1

        def on_training_step(self, runner: Any, training_iteration_since_resume: int) -> None:
            if not PARTS["processes"]:  # its learner, inference worker and rollout workers (which host the envs)
                roles = {"learner_proc": "learner", "inference_proc": "inference", "rollout_proc": "env workers"}
                for p in [*runner.processes, *runner.sampler.processes]:
                    PARTS["processes"][p.pid] = next((part for prefix, part in roles.items() if p.name.startswith(prefix)), "main")
            self.marks.append((time.perf_counter(), sum(runner.env_steps.values()), cpu_seconds(), self.ended))
            if not args.learn and len(self.marks) > 1 and self.marks[-1][0] - self.marks[1][0] >= args.seconds:
                runner._stop_training()

    cfg, runner = make_runner(cfg)
    clock = Clock()
    runner.register_observer(clock)
    runner.register_episodic_stats_handler(clock.episode)
    if runner.init() != ExperimentStatus.SUCCESS or runner.run() != ExperimentStatus.SUCCESS:
        raise RuntimeError("Sample Factory's runner did not succeed")
    if len(clock.marks) < 3:
        raise RuntimeError(f"Sample Factory did not finish one timed iteration in {args.seconds} s")
    (start, first, cpu0, ended0), (end, last, cpu1, ended1) = clock.marks[1], clock.marks[-1]
    if last == first:  # a setting its learner cannot batch: it "trains" on nothing, at once and for ever
        raise RuntimeError(f"Sample Factory's learner trained on no environment step in {end - start:.1f} s")
    result = {**window(last - first, end - start, ended1 - ended0, (cpu0, cpu1)), "device": "cpu", "torch_threads": 1, "amp": "none", "layout": f"{s['workers']} workers x {per_worker} envs"}
    if args.learn:
        result.update(total_steps=last, final_return=_sf_eval(cfg, args.eval_episodes))
    return result


def _sf_eval(cfg: Any, episodes: int) -> float:
    """The mean raw return of `episodes` episodes of Sample Factory's final policy, sampling its actions."""
    import torch
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.model.actor_critic import create_actor_critic

    env = _sf_env("hpcrl_doom", cfg, None)
    policy = create_actor_critic(cfg, _dict_space(env.observation_space), env.action_space)
    policy.load_state_dict(Learner.load_checkpoint(Learner.get_checkpoints(Learner.checkpoint_dir(cfg, 0), "checkpoint_*"), "cpu")["model"])
    policy.eval()
    rnn = torch.zeros(1, 1)

    def act(obs: Any) -> int:
        with torch.no_grad():
            out = policy(prepare_and_normalize_obs(policy, {"obs": torch.as_tensor(obs)[None]}), rnn)
        return int(out["actions"][0])

    try:
        return mean_return(env, act, episodes)
    finally:
        env.close()


def _dict_space(space: Any) -> Any:
    import gymnasium as gym

    return gym.spaces.Dict({"obs": space})


def mean_return(env: Any, act: Any, episodes: int, seed: int = 1_000_003) -> float:
    """The mean raw return of `episodes` episodes, one after another on `env` (the same loop for every side)."""
    total = 0.0
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        done, ret = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            ret += float(reward)
            done = terminated or truncated
        total += ret
        obs, _ = env.reset()
    return total / episodes


def measure(args: argparse.Namespace, side: str, num_envs: int) -> dict[str, Any]:
    if side == "random":
        return measure_random(args, num_envs)
    if side in ("hpcrl-sync", "hpcrl-async"):
        return measure_hpcrl(args, num_envs, side == "hpcrl-async")
    if side == "sb3":
        return measure_sb3(args, num_envs)
    if side == "sample-factory":
        return measure_sample_factory(args, json.loads(args.sf_settings))
    return measure_envpool(args, num_envs)


# ---------------------------------------------------------------------------- the run (parent)
def run_child(argv: list[str], side: str, num_envs: int, timeout: float, python: str = sys.executable) -> dict[str, Any]:
    """One measurement in a child process of its own session (run by `python`), killed with its group past `timeout`."""
    from hpcrl.runtime.lifeline import dies_with_me

    # Its temporary files (its envs' game folders: SB3's SubprocVecEnv workers keep theirs in TMPDIR; Sample Factory's
    # checkpoints) in a folder of its own, removed below however the measurement ended, or by the measurement itself if
    # this process dies first. Directly under /tmp and named for this process: multiprocessing's sockets in a long
    # TMPDIR pass the 108 bytes a socket's path may have (SB3's workers: "AF_UNIX path too long"; Sample Factory's
    # runner waited for ever with a 76-character pytest tmp_path; 60 characters worked).
    scratch = tempfile.mkdtemp(prefix=scratch_prefix(side, os.getpid()), dir="/tmp" if os.access("/tmp", os.W_OK) else None)
    cmd = [python, str(Path(__file__).resolve()), *argv, "--child", side, "--num-envs", str(num_envs), "--scratch", scratch]
    # A session of its own, killed as a group below; and told by the kernel when this process dies (kill -9), as
    # SIGTERM, on which it kills its group (`_end_measurement`).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=dies_with_me(signal.SIGTERM))
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
        shutil.rmtree(scratch, ignore_errors=True)
    for line in out.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    lines = [x for x in err.strip().splitlines() if x.strip()]
    return {"error": (lines[-1] if lines else f"exit {proc.returncode}, no output")[:300]}


def scratch_prefix(side: str, benchmark_pid: int) -> str:
    """The name a measurement's scratch folder starts with: the side and the benchmark's process, so a folder left
    behind says whose it was, and a measurement knows the folder its parent made (`--scratch`) from any other."""
    return f"vzd-{side}-{benchmark_pid}-"


MEASUREMENT_FOLDER: list[str] = []
"""The scratch folder a measurement (child) works in: removed by the measurement if the benchmark dies midway."""


def _end_measurement(signum: int, frame: Any) -> None:
    """A measurement's SIGTERM (the benchmark that started it died): SIGKILL its whole process group. Its env
    workers die with it anyway (their lifeline), but the game engines under them would not: orphaned, they
    waited for their controller for ever. The measurement's own folder goes first (Sample Factory's: the parent,
    which would have removed it, is gone)."""
    for folder in MEASUREMENT_FOLDER:
        shutil.rmtree(folder, ignore_errors=True)
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
    ret = f"{'return':>8}" if learn else ""
    lines = [f"{'envs':>5}  {'side':<15}{'SPS':>9}{'x random':>10}{'x SB3':>8}{'x SF':>7}{ret}{'steps/ep':>9}{'CPU ms/step':>15}  {'device / threads / amp':<24}note"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{'-':>9}{'':>10}{'':>8}{'':>7}{ret and ' ' * 8}{'':>9}{'':>15}  {'':<24}{_failed(r['error'])}")
            continue
        x_random, x_sb3, x_sf = (f"{r[k]:.2f}" if r.get(k) else "" for k in ("x_random", "x_sb3", "x_sf"))
        final = f"{r['final_return']:>8.1f}" if "final_return" in r else (f"{'':>8}" if learn else "")
        where = f"{r.get('device', '')} / {r.get('torch_threads', '')} / {r.get('amp', '')}" if "device" in r else ""
        note = f"{r['steps']} steps in {r['seconds']:.1f} s" + (f", {r['layout']}" if "layout" in r else "") + (f", {r['total_steps']} steps trained" if "total_steps" in r else "")
        cpu = f"{r['cpu_ms_own']:.2f} / {r['cpu_ms_all']:.2f}" if "cpu_ms_all" in r else ""
        lines.append(f"{r['num_envs']:>5}  {r['side']:<15}{r['sps']:>9.0f}{x_random:>10}{x_sb3:>8}{x_sf:>7}{final}{steps_per_episode(r):>9}{cpu:>15}  {where:<24}{note}")
    return "\n".join(lines)


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
    parser.add_argument("--device", default="cpu", help="train.device of hpcrl and SB3: cpu, cuda, cuda:N")
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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sf-settings", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # The folder its parent made for its temporary files, removed with the measurement: nothing else.
        scratch = Path(args.scratch or "")
        if not (scratch.name.startswith(scratch_prefix(args.child, os.getppid())) and scratch.is_dir() and not scratch.is_symlink()):
            parser.error(f"argument --scratch: not a folder this measurement's benchmark made: {_args.shown(args.scratch or '')}")
        os.environ["TMPDIR"] = tempfile.tempdir = args.scratch
        MEASUREMENT_FOLDER.append(args.scratch)
        signal.signal(signal.SIGTERM, _end_measurement)
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        result = measure(args, args.child, args.num_envs[0])
        print(RESULT + json.dumps(result), flush=True)
        return
    for n in args.num_envs:  # the experiment every side reads: a bad key or value is one line, before anything is measured
        _args.experiment(parser, args.config, _overrides(args, n))
    if args.out is not None:
        _args.make_folder(parser, args.out, "--out")
    import torch

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
    fields = ["num_envs", "side", "sps", "x_random", "x_sb3", "x_sf", "final_return", "total_steps", "episodes", "cpu_ms_own", "cpu_ms_all", "steps", "seconds", "device", "torch_threads", "amp", "layout", "error"]
    atomic_write_csv(args.out / "speed.csv", fields, ([r.get(f, "") for f in fields] for r in rows))
    print(f"\nwrote {args.out / 'speed.json'} and {args.out / 'speed.csv'}")


if __name__ == "__main__":
    main()
