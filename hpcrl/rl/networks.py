"""Torsos and heads: MLP for vector observations, actor-critic and Q-network wrappers.

Initialisation follows CleanRL (orthogonal, sqrt(2) gain in the torso, 0.01 on the policy
head, 1 on the value head), which matters more for PPO's early learning than most
hyperparameters.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: list[int], activation: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for size in hidden:
        layers += [layer_init(nn.Linear(in_dim, size)), ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


def torso(obs_space: gym.Space, hidden: list[int], activation: str) -> tuple[nn.Module, int]:
    """A feature extractor for the observation space: MLP on flat vectors."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observations of type {type(obs_space).__name__} are not supported")
    in_dim = int(np.prod(obs_space.shape))
    body, out = mlp(in_dim, hidden, activation)
    return nn.Sequential(nn.Flatten(), body), out


class ActorCritic(nn.Module):
    """Separate actor and critic torsos (CleanRL's default for vector observations)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden: list[int], activation: str) -> None:
        super().__init__()
        self.actor_torso, a_dim = torso(obs_space, hidden, activation)
        self.critic_torso, c_dim = torso(obs_space, hidden, activation)
        self.critic_head = layer_init(nn.Linear(c_dim, 1), std=1.0)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            self.actor_head = layer_init(nn.Linear(a_dim, int(action_space.n)), std=0.01)
        elif isinstance(action_space, gym.spaces.Box):
            n = int(np.prod(action_space.shape))
            self.actor_head = layer_init(nn.Linear(a_dim, n), std=0.01)
            self.log_std = nn.Parameter(torch.zeros(1, n))
        else:
            raise ValueError(f"actions of type {type(action_space).__name__} are not supported")

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic_head(self.critic_torso(obs)).squeeze(-1)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        logits = self.actor_head(self.actor_torso(obs))
        if self.discrete:
            return Categorical(logits=logits)
        return Normal(logits, self.log_std.expand_as(logits).exp())

    def act_and_value(
        self, obs: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Action (sampled unless given), its log-probability, the entropy and the value, in one call."""
        dist = self.distribution(obs)
        if action is None:
            action = dist.sample()
        logprob, entropy = dist.log_prob(action), dist.entropy()
        if not self.discrete:
            logprob, entropy = logprob.sum(-1), entropy.sum(-1)
        return action, logprob, entropy, self.value(obs)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        dist = self.distribution(obs)
        if not deterministic:
            return dist.sample()
        return dist.probs.argmax(-1) if self.discrete else dist.mean
