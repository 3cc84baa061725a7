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
    """MLP layers for vector observations; for images, the width of the layer after the Nature CNN."""
    activation: Literal["tanh", "relu"] = "tanh"
    reward_scale: float = 1.0
    """Rewards are multiplied by this before learning (ViZDoom's +100 kills); logged returns stay raw."""
    checkpoint_every: int = 10
    """Write a checkpoint every N updates (and always at the end and on a preemption signal)."""
    keep_checkpoints: int = 2
    device: str = "auto"
    """`auto` takes the GPU when there is one; `cpu`, `cuda`, `cuda:1` force a device."""
    amp: Literal["none", "bf16", "fp16"] = "none"
    """Mixed precision for the observation encoder (the CNN, where the FLOPs are) on CUDA; heads,
    recurrent core and losses stay float32. `fp16` adds gradient scaling. Ignored on CPU."""
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
        if self.reward_scale <= 0:
            errors.append(("reward_scale", "expected a positive number"))
        if self.checkpoint_every <= 0:
            errors.append(("checkpoint_every", "expected a positive integer"))
        if self.keep_checkpoints < 1:
            errors.append(("keep_checkpoints", "expected at least 1"))
        if not self.hidden_sizes or any(h <= 0 for h in self.hidden_sizes):
            errors.append(("hidden_sizes", "expected a non-empty list of positive integers"))
        if self.torch_threads < 1:
            errors.append(("torch_threads", "expected a positive integer"))
        return errors


@dataclass
class OnPolicyConfig(TrainConfig):
    """What PPO and A2C share: the rollout (n-step batches from all envs, GAE) and the policy shape."""

    num_steps: int = 128
    """Vector steps per rollout; the batch is num_steps x num_envs transitions."""
    gae_lambda: float = 0.95
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    norm_adv: bool = True
    recurrent_size: int = 0
    """Width of a GRU core between encoder and heads; 0 for a feed-forward policy. Recurrent
    minibatches are whole env sequences (truncated BPTT over `num_steps`)."""
    normalize_obs: bool = False
    """Running mean/std normalisation of vector observations, held in the policy (so evaluation
    uses the training statistics). Helps when features have very different scales (MuJoCo);
    pixels are always scaled to [0, 1] instead."""

    def check(self) -> list[tuple[str, str]]:
        errors = super().check()
        if self.num_steps <= 0:
            errors.append(("num_steps", "expected a positive integer"))
        if not 0 <= self.gae_lambda <= 1:
            errors.append(("gae_lambda", "expected a number in [0, 1]"))
        if self.recurrent_size < 0:
            errors.append(("recurrent_size", "expected 0 (no GRU) or a positive width"))
        return errors


@dataclass
class PPOConfig(OnPolicyConfig):
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    anneal_clip: bool = False
    clip_vloss: bool = True
    target_kl: Optional[float] = None

    def check(self) -> list[tuple[str, str]]:
        errors = super().check()
        for key in ("num_minibatches", "update_epochs"):
            if getattr(self, key) <= 0:
                errors.append((key, "expected a positive integer"))
        return errors


@dataclass
class A2CConfig(OnPolicyConfig):
    """A2C as PPO with one epoch, one minibatch, no clipping and RMSprop (Huang et al. 2022).

    Defaults are Stable-Baselines3's, which RL Zoo's tuned CartPole set keeps except ent_coef 0.
    """

    lr: float = 7e-4
    anneal_lr: bool = False
    num_steps: int = 5
    gae_lambda: float = 1.0
    ent_coef: float = 0.0
    norm_adv: bool = False
    rms_alpha: float = 0.99
    rms_eps: float = 1e-5
    checkpoint_every: int = 500


@dataclass
class DQNConfig(TrainConfig):
    """Step-based counters are in environment steps (transitions), as in SB3 and CleanRL, whatever
    the number of envs; defaults are CleanRL's."""

    lr: float = 2.5e-4
    anneal_lr: bool = False
    buffer_size: int = 10_000
    batch_size: int = 128
    learning_starts: int = 10_000
    """Gradient steps begin after this many environment steps. A run resumed without its buffer
    also waits until the new buffer holds this many (or is full) before it trains again."""
    train_freq: int = 10
    """Environment steps between training phases; one iteration = one such phase."""
    gradient_steps: int = 1
    """Gradient steps per training phase."""
    target_update_freq: int = 500
    """Environment steps between target-network updates (SB3's `target_update_interval`, CleanRL's
    `target_network_frequency`). With train_freq 256 and gradient_steps 128 and a value below 256,
    the target is refreshed between training phases, never inside one, exactly as in SB3."""
    tau: float = 1.0
    """1.0 copies the online network; below 1, Polyak averaging at each target update."""
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    """Fraction of total_steps over which epsilon falls linearly from start_e to end_e."""
    n_step: int = 1
    """TD targets from n-step returns. Single-process DQN computes them from the buffer when it samples
    (as SB3's `n_steps`); Ape-X actors send them. Either way a return stops at an episode's end."""
    double_dqn: bool = False
    """Pick the next action with the online network, value it with the target (van Hasselt et al. 2016)."""
    loss: Literal["huber", "mse"] = "mse"
    hidden_sizes: list[int] = field(default_factory=lambda: [120, 84])
    activation: Literal["tanh", "relu"] = "relu"
    max_grad_norm: float = 10.0
    checkpoint_every: int = 1000
    save_replay: bool = True
    """Store the replay buffer in checkpoints so a requeued job continues with the same data. Off
    for large image buffers (a checkpoint then costs buffer_size x 2 observations of disk): a resumed
    run refills learning_starts transitions before it trains again."""

    def check(self) -> list[tuple[str, str]]:
        errors = super().check()
        for key in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "target_update_freq", "n_step"):
            if getattr(self, key) <= 0:
                errors.append((key, "expected a positive integer"))
        if self.batch_size > self.buffer_size:
            errors.append(("batch_size", f"must not exceed buffer_size ({self.buffer_size})"))
        if self.learning_starts < 0:
            errors.append(("learning_starts", "expected a non-negative integer"))
        if not 0 < self.exploration_fraction <= 1:
            errors.append(("exploration_fraction", "expected a number in (0, 1]"))
        if not 0 < self.tau <= 1:
            errors.append(("tau", "expected a number in (0, 1]"))
        for key in ("start_e", "end_e"):
            if not 0 <= getattr(self, key) <= 1:
                errors.append((key, "expected a number in [0, 1]"))
        return errors


ALGORITHMS: dict[str, type[TrainConfig]] = {"ppo": PPOConfig, "a2c": A2CConfig, "dqn": DQNConfig}
