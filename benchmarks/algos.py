"""hpcrl's PPO, A2C and DQN against Stable-Baselines3, in one run on one machine.

    .venv/bin/pip install 'hpcrl[bench]'          # stable-baselines3
    .venv/bin/python benchmarks/algos.py          # full budgets (~10 min on 2 cores)
    .venv/bin/python benchmarks/algos.py --scale 0.2 --skip-vizdoom

CartPole-v1: each algorithm trains with the hyperparameters and step budget of
configs/cartpole_<algo>.yaml, translated to SB3's arguments (RL Zoo's tuned sets, which both
sides implement the same way), with the same torch thread count on both sides (--threads, 1 by
default; each row prints the count each side ran with). SPS counts environment steps over the
whole training wall time (env stepping, forward passes, updates); the final return is the mean
of 10 deterministic episodes of the trained policy on the same held-out seeds.

ViZDoom: hpcrl PPO (configs/vizdoom_ppo.yaml, CPU) against the rate of the same vector env
stepped with random actions, i.e. the most any learner could reach with those envs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcrl.config import load_experiment  # noqa: E402
from hpcrl.rl.envs import make_vec_env  # noqa: E402
from hpcrl.rl.networks import obs_to_tensor  # noqa: E402
from hpcrl.rl.train import algorithm_class, seed_everything  # noqa: E402

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


def run_hpcrl(algo: str, scale: float, seed: int) -> tuple[int, float, float]:
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
                   vf_coef=t.vf_coef, max_grad_norm=t.max_grad_norm, normalize_advantage=t.norm_adv,
                   policy_kwargs={"net_arch": list(t.hidden_sizes), "activation_fn": act}, seed=seed, device="cpu")  # fmt: skip
    if algo == "a2c":
        return A2C("MlpPolicy", env, learning_rate=t.lr, n_steps=t.num_steps, gamma=t.gamma, gae_lambda=t.gae_lambda, ent_coef=t.ent_coef,
                   vf_coef=t.vf_coef, max_grad_norm=t.max_grad_norm, rms_prop_eps=t.rms_eps, normalize_advantage=t.norm_adv,
                   policy_kwargs={"net_arch": list(t.hidden_sizes), "activation_fn": act}, seed=seed, device="cpu")  # fmt: skip
    lr = (lambda p: p * t.lr) if t.anneal_lr else t.lr  # SB3 passes the fraction of training left
    return DQN("MlpPolicy", env, learning_rate=lr, buffer_size=t.buffer_size, learning_starts=t.learning_starts, batch_size=t.batch_size,
               tau=t.tau, gamma=t.gamma, train_freq=t.train_freq, gradient_steps=t.gradient_steps, target_update_interval=t.target_update_freq,
               exploration_fraction=t.exploration_fraction, exploration_initial_eps=t.start_e, exploration_final_eps=t.end_e,
               max_grad_norm=t.max_grad_norm, policy_kwargs={"net_arch": list(t.hidden_sizes), "activation_fn": act}, seed=seed, device="cpu")  # fmt: skip


def run_sb3(algo: str, scale: float, seed: int) -> tuple[int, float, float]:
    exp = load_experiment(ROOT / "configs" / f"cartpole_{algo}.yaml")
    if algo == "dqn" and (exp.train.double_dqn or exp.train.loss != "huber"):
        raise SystemExit("SB3's DQN is plain DQN with Huber loss: the config must match it to compare")
    steps = int(exp.train.total_steps * scale)
    model = sb3_model(algo, exp, seed)
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
    torch.set_num_threads(threads)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each config's step budget (1: the full budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algos", nargs="+", default=["ppo", "a2c", "dqn"])
    parser.add_argument("--skip-vizdoom", action="store_true")
    parser.add_argument("--vizdoom-steps", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same for hpcrl and SB3 (CartPole)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} torch thread(s) for both hpcrl and SB3; seed {args.seed}")
    rows = []
    for algo in args.algos:
        torch.set_num_threads(args.threads)
        ours = run_hpcrl(algo, args.scale, args.seed)
        print(f"  hpcrl {algo}: {ours[0]} steps, {ours[1]:.0f} SPS, return {ours[2]:.1f}, {torch.get_num_threads()} torch thread(s)", flush=True)
        torch.set_num_threads(args.threads)
        theirs = run_sb3(algo, args.scale, args.seed)
        print(f"  SB3   {algo}: {theirs[0]} steps, {theirs[1]:.0f} SPS, return {theirs[2]:.1f}, {torch.get_num_threads()} torch thread(s)", flush=True)
        rows.append((algo, ours, theirs))
    print()
    print(f"{'CartPole-v1':<12}{'steps':>8}{'hpcrl SPS':>11}{'SB3 SPS':>9}{'ratio':>7}{'hpcrl return':>14}{'SB3 return':>12}")
    for algo, (steps, sps, ret), (_, sb3_sps, sb3_ret) in rows:
        print(f"{algo.upper():<12}{steps:>8}{sps:>11.0f}{sb3_sps:>9.0f}{sps / sb3_sps:>6.2f}x{ret:>14.1f}{sb3_ret:>12.1f}")
    if not args.skip_vizdoom:
        threads = min(4, os.cpu_count() or 1)
        random_sps, ppo_sps, what = vizdoom_rates(args.vizdoom_steps, threads)
        print()
        print(f"ViZDoom ({what})")
        print(f"  random actions: {random_sps:.0f} SPS   hpcrl PPO (CPU): {ppo_sps:.0f} SPS   ({ppo_sps / random_sps:.0%} of the env's rate)")


if __name__ == "__main__":
    main()
