"""Proximal Policy Optimisation (Schulman et al. 2017), after CleanRL's ppo.py.

One `iteration` = collect `num_steps` vector steps from all envs (one batched forward pass per
step), compute GAE, then `update_epochs` passes of clipped-surrogate minibatch updates. Details
that matter and are here: advantage normalisation per minibatch, clipped value loss, entropy
bonus, global gradient clipping, linear learning-rate (and optionally clip) annealing, and value
bootstrapping for truncated episodes (CartPole's 500-step limit is not a failure).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from hpcrl.rl.envs import final_observations, finished_episodes
from hpcrl.rl.hparams import PPOConfig
from hpcrl.rl.networks import ActorCritic


class PPO:
    metric_names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "lr")

    def __init__(self, cfg: PPOConfig, envs: gym.vector.VectorEnv, device: torch.device, seed: int) -> None:
        self.cfg, self.envs, self.device = cfg, envs, device
        self.policy = self.make_policy(cfg, envs.single_observation_space, envs.single_action_space).to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr, eps=1e-5)
        self.num_envs = envs.num_envs
        self.batch_size = self.num_envs * cfg.num_steps
        self.minibatch_size = max(1, self.batch_size // cfg.num_minibatches)
        self.num_iterations = max(1, cfg.total_steps // self.batch_size)
        self.global_step = 0
        self.iteration = 0
        self.episodes: list[tuple[float, int]] = []
        obs_shape = envs.single_observation_space.shape
        act_shape = envs.single_action_space.shape
        n, t = self.num_envs, cfg.num_steps
        self.obs = torch.zeros((t, n, *obs_shape), device=device)
        self.actions = torch.zeros((t, n, *act_shape), device=device)
        self.logprobs = torch.zeros((t, n), device=device)
        self.rewards = torch.zeros((t, n), device=device)
        self.dones = torch.zeros((t, n), device=device)
        self.values = torch.zeros((t, n), device=device)
        next_obs, _ = envs.reset(seed=seed)
        self.next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
        self.next_done = torch.zeros(n, device=device)

    @staticmethod
    def make_policy(cfg: PPOConfig, obs_space: gym.Space, action_space: gym.Space) -> ActorCritic:
        """The network evaluation rebuilds from a checkpoint's `policy` weights."""
        return ActorCritic(obs_space, action_space, cfg.hidden_sizes, cfg.activation)

    @property
    def finished(self) -> bool:
        return self.iteration >= self.num_iterations

    # ---------------------------------------------------------------- rollout
    @torch.no_grad()
    def collect(self) -> None:
        cfg = self.cfg
        for step in range(cfg.num_steps):
            self.global_step += self.num_envs
            self.obs[step] = self.next_obs
            self.dones[step] = self.next_done
            action, logprob, _, value = self.policy.act_and_value(self.next_obs)
            self.values[step] = value
            self.actions[step] = action
            self.logprobs[step] = logprob
            obs, reward, terminated, truncated, info = self.envs.step(action.cpu().numpy())
            reward = torch.as_tensor(reward, dtype=torch.float32, device=self.device)
            if truncated.any():
                # A time limit is not a terminal state: bootstrap from the value of the last observation.
                last = final_observations(obs, info)[truncated & ~terminated]
                if len(last):
                    boot = self.policy.value(torch.as_tensor(last, dtype=torch.float32, device=self.device))
                    idx = torch.as_tensor(np.flatnonzero(truncated & ~terminated), device=self.device)
                    reward[idx] += cfg.gamma * boot
            self.rewards[step] = reward
            self.next_obs = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            self.next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=self.device)
            returns, lengths = finished_episodes(info)
            self.episodes.extend(zip(returns.tolist(), lengths.tolist()))

    @torch.no_grad()
    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        next_value = self.policy.value(self.next_obs)
        adv = torch.zeros_like(self.rewards)
        last = torch.zeros(self.num_envs, device=self.device)
        for t in reversed(range(cfg.num_steps)):
            if t == cfg.num_steps - 1:
                nonterminal, next_values = 1.0 - self.next_done, next_value
            else:
                nonterminal, next_values = 1.0 - self.dones[t + 1], self.values[t + 1]
            delta = self.rewards[t] + cfg.gamma * next_values * nonterminal - self.values[t]
            last = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last
            adv[t] = last
        return adv, adv + self.values

    # ---------------------------------------------------------------- update
    def train_iteration(self) -> dict[str, float]:
        cfg = self.cfg
        frac = 1.0 - self.iteration / self.num_iterations
        lr = cfg.lr * frac if cfg.anneal_lr else cfg.lr
        clip = cfg.clip_coef * frac if cfg.anneal_clip else cfg.clip_coef
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.collect()
        adv, returns = self.advantages()

        b_obs = self.obs.reshape((-1, *self.envs.single_observation_space.shape))
        b_actions = self.actions.reshape((-1, *self.envs.single_action_space.shape))
        b_logprobs, b_adv = self.logprobs.reshape(-1), adv.reshape(-1)
        b_returns, b_values = returns.reshape(-1), self.values.reshape(-1)

        clipfracs, approx_kl = [], torch.zeros(())
        for _ in range(cfg.update_epochs):
            perm = torch.randperm(self.batch_size, device=self.device)
            for start in range(0, self.batch_size, self.minibatch_size):
                mb = perm[start : start + self.minibatch_size]
                _, newlogprob, entropy, newvalue = self.policy.act_and_value(b_obs[mb], b_actions[mb])
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > clip).float().mean())
                mb_adv = b_adv[mb]
                if cfg.norm_adv and len(mb) > 1:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                if cfg.clip_vloss:
                    v_clipped = b_values[mb] + (newvalue - b_values[mb]).clamp(-clip, clip)
                    v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb]) ** 2).mean()
                entropy_loss = entropy.mean()
                loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
            if cfg.target_kl is not None and approx_kl > cfg.target_kl:
                break
        self.iteration += 1
        return {
            "policy_loss": pg_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": entropy_loss.item(),
            "approx_kl": approx_kl.item(),
            "clipfrac": torch.stack(clipfracs).mean().item(),
            "lr": lr,
        }

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(), "global_step": self.global_step, "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])
