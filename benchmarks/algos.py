"""hpcrl's PPO, A2C and DQN against Stable-Baselines3, in one run on one machine.

    .venv/bin/pip install 'hpcrl[bench]'          # stable-baselines3
    .venv/bin/python benchmarks/algos.py          # full budgets, one seed (~10 min on 2 cores)
    .venv/bin/python benchmarks/algos.py --skip-vizdoom --seeds 0 1 2
    .venv/bin/python benchmarks/algos.py --scale 0.2 --skip-vizdoom --no-ftz-reference

CartPole-v1: each algorithm trains with the hyperparameters and step budget of
configs/cartpole_<algo>.yaml, translated to SB3's arguments (RL Zoo's tuned sets, which both
sides implement the same way; PPO's value loss is CleanRL's 0.5 * MSE, so SB3 gets half the
vf_coef for the same loss), with the same torch thread count on both sides (--threads, 1 by
default; each row prints the count each side ran with). SPS counts environment steps over the
whole training wall time (env stepping, forward passes, updates); the final return is the mean
of 10 deterministic episodes of the trained policy on the same held-out seeds (and over
--seeds).

hpcrl runs as `hpcrl train` does, with denormal floats flushed to zero (see
hpcrl.rl.train.setup_torch); SB3 runs as installed, without. So that the table shows what
that one flag is worth, SB3 runs a second time with it (the "SB3+FTZ" column; skip it with
--no-ftz-reference).

ViZDoom: hpcrl PPO (configs/vizdoom_ppo.yaml, CPU) against the rate of the same vector env
stepped with random actions, i.e. the most any learner could reach with those envs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _args  # benchmarks/_args.py: the script's own folder is first on sys.path
import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcrl.config.load import load_experiment  # noqa: E402
from hpcrl.rl.envs import make_vec_env  # noqa: E402
from hpcrl.rl.networks import obs_to_tensor  # noqa: E402
from hpcrl.rl.train import algorithm_class, seed_everything, setup_torch  # noqa: E402

EVAL_SEED = 1_000_003
EVAL_EPISODES = 10


def evaluate(act: Callable[[np.ndarray], np.ndarray]) -> float:
    """Mean return of EVAL_EPISODES deterministic CartPole episodes, one env per episode seed."""
    returns = []
    for i in range(EVAL_EPISODES):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(act(obs[None])[0]))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def run_hpcrl(algo: str, scale: float, seed: int, threads: int) -> tuple[int, float, float]:
    setup_torch(threads)
    exp = load_experiment(ROOT / "configs" / f"cartpole_{algo}.yaml")
    cfg = exp.train
    cfg.total_steps = int(cfg.total_steps * scale)
    seed_everything(seed)
    envs = make_vec_env(exp.env)
    agent = algorithm_class(algo)(cfg, envs, torch.device("cpu"), seed)
    start = time.perf_counter()
    while not agent.finished:
        agent.train_iteration()
    wall = time.perf_counter() - start
    envs.close()
    policy = agent.policy.eval()
    ret = evaluate(lambda obs: policy.act(obs_to_tensor(obs, torch.device("cpu")), True).numpy())
    return agent.global_step, agent.global_step / wall, ret


def sb3_model(algo: str, exp: Any, seed: int) -> Any:
    """SB3's model with the config's hyperparameters (the names map one to one)."""
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env as sb3_vec_env

    t = exp.train
    env = sb3_vec_env("CartPole-v1", n_envs=exp.env.num_envs, seed=seed)
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[t.activation]
    if algo == "ppo":
        lr = (lambda p: p * t.lr) if t.anneal_lr else t.lr  # SB3 passes the fraction of training left
        clip = (lambda p: p * t.clip_coef) if t.anneal_clip else t.clip_coef
        return PPO("MlpPolicy", env, learning_rate=lr, n_steps=t.num_steps, batch_size=t.num_steps * exp.env.num_envs // t.num_minibatches,
                   n_epochs=t.update_epochs, gamma=t.gamma, gae_lambda=t.gae_lambda, clip_range=clip, ent_coef=t.ent_coef,
                   vf_coef=t.vf_coef * 0.5, max_grad_norm=t.max_grad_norm, normalize_advantage=t.norm_adv,
                   policy_kwargs={"net_arch": list(t.hidden_sizes), "activation_fn": act}, seed=seed, device="cpu")  # fmt: skip
    if algo == "a2c":
        return A2C("MlpPolicy", env, learning_rate=t.lr, n_steps=t.num_steps, gamma=t.gamma, gae_lambda=t.gae_lambda, ent_coef=t.ent_coef,
                   vf_coef=t.vf_coef, max_grad_norm=t.max_grad_norm, rms_prop_eps=t.rms_eps, normalize_advantage=t.norm_adv,
                   policy_kwargs={"net_arch": list(t.hidden_sizes), "activation_fn": act}, seed=seed, device="cpu")  # fmt: skip
    lr = (lambda p: p * t.lr) if t.anneal_lr else t.lr  # SB3 passes the fraction of training left
    return DQN("MlpPolicy", env, learning_rate=lr, buffer_size=t.buffer_size, learning_starts=t.learning_starts, batch_size=t.batch_size,
               tau=t.tau, gamma=t.gamma, n_steps=t.n_step, train_freq=t.train_freq, gradient_steps=t.gradient_steps, target_update_interval=t.target_update_freq,
               exploration_fraction=t.exploration_fraction, exploration_initial_eps=t.start_e, exploration_final_eps=t.end_e,
               max_grad_norm=t.max_grad_norm, policy_kwargs={"net_arch": list(t.hidden_sizes), "activation_fn": act}, seed=seed, device="cpu")  # fmt: skip


def run_sb3(algo: str, scale: float, seed: int, threads: int, flush_denormal: bool) -> tuple[int, float, float]:
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(threads)
    torch.set_flush_denormal(flush_denormal)
    exp = load_experiment(ROOT / "configs" / f"cartpole_{algo}.yaml")
    if algo == "dqn" and (exp.train.double_dqn or exp.train.loss != "huber"):
        raise SystemExit("SB3's DQN is plain DQN with Huber loss: the config must match it to compare")
    if algo == "ppo" and exp.train.clip_vloss:
        raise SystemExit("SB3's PPO does not clip the value loss CleanRL's way: set train.clip_vloss false to compare")
    steps = int(exp.train.total_steps * scale)
    model = sb3_model(algo, exp, seed)
    model.set_logger(Logger(None, []))  # SB3's default logger makes an empty /tmp/SB3-<time> folder each learn()
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - start
    ret = evaluate(lambda obs: model.predict(obs, deterministic=True)[0])
    return model.num_timesteps, model.num_timesteps / wall, ret


def vizdoom_rates(steps: int, threads: int) -> tuple[float, float, str]:
    """(random-action vector-env SPS, hpcrl PPO SPS, what was run) for configs/vizdoom_ppo.yaml on CPU."""
    exp = load_experiment(ROOT / "configs" / "vizdoom_ppo.yaml", ["train.device=cpu", f"train.torch_threads={threads}"])
    envs = make_vec_env(exp.env)
    envs.reset(seed=0)
    n, start = 0, time.perf_counter()
    while n < steps:
        envs.step(envs.action_space.sample())
        n += envs.num_envs
    random_sps = n / (time.perf_counter() - start)
    envs.close()
    setup_torch(threads)
    cfg = exp.train
    cfg.total_steps = steps
    seed_everything(0)
    envs = make_vec_env(exp.env)
    agent = algorithm_class("ppo")(cfg, envs, torch.device("cpu"), 0)
    agent.train_iteration()  # warm-up (worker start, first allocations)
    first, start = agent.global_step, time.perf_counter()
    while agent.global_step - first < steps:
        agent.train_iteration()
    ppo_sps = (agent.global_step - first) / (time.perf_counter() - start)
    envs.close()
    obs = exp.env
    what = f"{obs.id}, {obs.num_envs} async envs, {exp.env.kwargs.get('screen_resolution')}/{exp.env.kwargs.get('downsample', 1)}, frame skip {obs.kwargs.get('frame_skip')}, {threads} torch threads"
    return random_sps, ppo_sps, what


def _mean(results: list[tuple[int, float, float]]) -> tuple[int, float, float]:
    """(steps per seed, mean SPS, mean return) over seeds."""
    return results[0][0], float(np.mean([r[1] for r in results])), float(np.mean([r[2] for r in results]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=_args.positive_number, default=1.0, help="fraction of each config's step budget (1: the full budget)")
    parser.add_argument("--seeds", type=_args.seed, nargs="+", default=[0])
    parser.add_argument("--algos", nargs="+", choices=["ppo", "a2c", "dqn"], default=["ppo", "a2c", "dqn"])
    parser.add_argument("--skip-vizdoom", action="store_true")
    parser.add_argument("--vizdoom-steps", type=_args.positive_integer, default=4096)
    parser.add_argument("--threads", type=_args.positive_integer, default=1, help="torch threads, the same for hpcrl and SB3 (CartPole)")
    parser.add_argument("--no-ftz-reference", action="store_true", help="skip SB3's second run with denormals flushed")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} torch thread(s) for both hpcrl and SB3; seeds {args.seeds}")
    sides: list[tuple[str, Callable[[str, int], tuple[int, float, float]]]] = [
        ("hpcrl", lambda algo, seed: run_hpcrl(algo, args.scale, seed, args.threads)),
        ("SB3", lambda algo, seed: run_sb3(algo, args.scale, seed, args.threads, flush_denormal=False)),
    ]
    if not args.no_ftz_reference:
        sides.append(("SB3+FTZ", lambda algo, seed: run_sb3(algo, args.scale, seed, args.threads, flush_denormal=True)))
    rows = []
    for algo in args.algos:
        results = {}
        for name, run in sides:
            per_seed = []
            for seed in args.seeds:
                per_seed.append(run(algo, seed))
                steps, sps, ret = per_seed[-1]
                print(f"  {name:<8}{algo} seed {seed}: {steps} steps, {sps:.0f} SPS, return {ret:.1f}, {torch.get_num_threads()} torch thread(s)", flush=True)
            results[name] = _mean(per_seed)
        rows.append((algo, results))
    print()
    header = f"{'CartPole-v1':<12}{'steps':>8}{'hpcrl SPS':>11}{'SB3 SPS':>9}{'ratio':>7}"
    if not args.no_ftz_reference:
        header += f"{'SB3+FTZ SPS':>13}{'ratio':>7}"
    print(header + f"{'hpcrl return':>14}{'SB3 return':>12}")
    for algo, results in rows:
        steps, sps, ret = results["hpcrl"]
        line = f"{algo.upper():<12}{steps:>8}{sps:>11.0f}{results['SB3'][1]:>9.0f}{sps / results['SB3'][1]:>6.2f}x"
        if "SB3+FTZ" in results:
            line += f"{results['SB3+FTZ'][1]:>13.0f}{sps / results['SB3+FTZ'][1]:>6.2f}x"
        print(line + f"{ret:>14.1f}{results['SB3'][2]:>12.1f}")
    if len(args.seeds) > 1:
        print(f"(SPS and returns are means over seeds {args.seeds})")
    if not args.skip_vizdoom:
        threads = min(4, os.cpu_count() or 1)
        random_sps, ppo_sps, what = vizdoom_rates(args.vizdoom_steps, threads)
        print()
        print(f"ViZDoom ({what})")
        print(f"  random actions: {random_sps:.0f} SPS   hpcrl PPO (CPU): {ppo_sps:.0f} SPS   ({ppo_sps / random_sps:.0%} of the env's rate)")


if __name__ == "__main__":
    main()
