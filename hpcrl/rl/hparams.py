"""Training hyperparameters, one dataclass per algorithm.

They live apart from the algorithm files so that validating a config (on a login node, before
anything is submitted) never imports torch. Field names follow CleanRL so that its documentation
and the literature read across directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass
class TrainConfig:
    """What every algorithm shares: budget, optimiser basics, network, checkpoints, device."""

    total_steps: int = 100_000
    lr: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    max_grad_norm: float = 0.5
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    activation: Literal["tanh", "relu"] = "tanh"
    checkpoint_every: int = 10
    """Write a checkpoint every N updates (and always at the end and on a preemption signal)."""
    keep_checkpoints: int = 2
    device: str = "auto"
    """`auto` takes the GPU when there is one; `cpu`, `cuda`, `cuda:1` force a device."""
    torch_threads: int = 1
    """Intra-op threads for torch; 1 is fastest for small MLPs and keeps array tasks off each other's cores."""

    def check(self) -> list[tuple[str, str]]:
        """Return (key, message) pairs for values that are individually valid but jointly impossible."""
        errors = []
        if self.total_steps <= 0:
            errors.append(("total_steps", "expected a positive integer"))
        if self.lr <= 0:
            errors.append(("lr", "expected a positive number"))
        if not 0 <= self.gamma <= 1:
            errors.append(("gamma", "expected a number in [0, 1]"))
        if self.checkpoint_every <= 0:
            errors.append(("checkpoint_every", "expected a positive integer"))
        if self.keep_checkpoints < 1:
            errors.append(("keep_checkpoints", "expected at least 1"))
        if not self.hidden_sizes or any(h <= 0 for h in self.hidden_sizes):
            errors.append(("hidden_sizes", "expected a non-empty list of positive integers"))
        return errors


@dataclass
class PPOConfig(TrainConfig):
    num_steps: int = 128
    num_minibatches: int = 4
    update_epochs: int = 4
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    anneal_clip: bool = False
    clip_vloss: bool = True
    norm_adv: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    target_kl: Optional[float] = None

    def check(self) -> list[tuple[str, str]]:
        errors = super().check()
        for key in ("num_steps", "num_minibatches", "update_epochs"):
            if getattr(self, key) <= 0:
                errors.append((key, "expected a positive integer"))
        return errors


@dataclass
class A2CConfig(TrainConfig):
    """A2C as PPO with one epoch, one minibatch, no clipping and RMSprop (Huang et al. 2022)."""

    lr: float = 7e-4
    num_steps: int = 5
    gae_lambda: float = 1.0
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    norm_adv: bool = False
    rms_eps: float = 1e-5
    checkpoint_every: int = 500

    def check(self) -> list[tuple[str, str]]:
        errors = super().check()
        if self.num_steps <= 0:
            errors.append(("num_steps", "expected a positive integer"))
        return errors


@dataclass
class DQNConfig(TrainConfig):
    lr: float = 2.5e-4
    anneal_lr: bool = False
    buffer_size: int = 10_000
    batch_size: int = 128
    learning_starts: int = 10_000
    train_freq: int = 10
    gradient_steps: int = 1
    target_update_freq: int = 500
    tau: float = 1.0
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    double_dqn: bool = True
    loss: Literal["huber", "mse"] = "mse"
    hidden_sizes: list[int] = field(default_factory=lambda: [120, 84])
    activation: Literal["tanh", "relu"] = "relu"
    max_grad_norm: float = 10.0
    checkpoint_every: int = 1000
    save_replay: bool = True
    """Store the replay buffer in checkpoints so a requeued job continues with the same data."""

    def check(self) -> list[tuple[str, str]]:
        errors = super().check()
        for key in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "target_update_freq"):
            if getattr(self, key) <= 0:
                errors.append((key, "expected a positive integer"))
        if self.batch_size > self.buffer_size:
            errors.append(("batch_size", f"must not exceed buffer_size ({self.buffer_size})"))
        if not 0 < self.exploration_fraction <= 1:
            errors.append(("exploration_fraction", "expected a number in (0, 1]"))
        return errors


ALGORITHMS: dict[str, type[TrainConfig]] = {"ppo": PPOConfig, "a2c": A2CConfig, "dqn": DQNConfig}
