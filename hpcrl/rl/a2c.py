"""Advantage Actor-Critic, synchronous (Mnih et al. 2016; the A2C of OpenAI Baselines and SB3).

A2C is PPO's rollout with a simpler update (Huang et al. 2022, arXiv:2205.09123): one gradient
step per rollout on the whole batch, the plain policy-gradient loss (no ratio, no clipping), no
advantage normalisation by default, RMSprop, and short rollouts (5 steps) with lambda = 1, i.e.
n-step returns. So this file reuses `OnPolicyAgent` from ppo.py (collection, truncation
bootstrapping, GAE, the GRU's sequence handling, checkpoints) and holds only what differs: the
optimiser and the loss.

Losses follow SB3's A2C, so its hyperparameters carry over unchanged: the value loss is the mean
squared error without PPO's 1/2 factor, weighted by vf_coef.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch

from hpcrl.config.hparams import A2CConfig
from hpcrl.rl.optim import FlatOptimizer, RMSprop
from hpcrl.rl.ppo import OnPolicyAgent


class A2C(OnPolicyAgent):
    metric_names = ("policy_loss", "value_loss", "entropy", "lr")
    cfg: A2CConfig

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> FlatOptimizer:
        return RMSprop(params, lr=self.cfg.lr, alpha=self.cfg.rms_alpha, eps=self.cfg.rms_eps)

    def update_steps(self, batch: dict[str, Any]) -> Generator[None, None, dict[str, float]]:
        cfg = self.cfg
        state = self.rollout_state  # the whole batch is one minibatch: every env's full sequence
        firsts = batch["firsts"] if state is not None else None
        logprob, params, value = self.policy.evaluate_params(batch["obs"], batch["actions"], state, firsts)
        adv = batch["adv"]
        if cfg.norm_adv:
            mean, std = self.ranks.mean_std(adv)
            adv = (adv - mean) / (std + 1e-8)
        policy_loss = -(adv * logprob).mean()
        value_loss = ((batch["returns"] - value) ** 2).mean()
        self.step_with_entropy(policy_loss + cfg.vf_coef * value_loss, params)
        yield  # its one gradient step
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "entropy": self.mean_entropy(params).item()}
