"""Deep Q-Network (Mnih et al. 2015), after CleanRL's dqn.py, with SB3's step accounting.

One `iteration` = `train_freq` environment steps of epsilon-greedy play into the replay buffer,
then, once learning has started, `gradient_steps` TD updates on uniformly sampled minibatches.
All step counters (train_freq, learning_starts, target_update_freq, the epsilon schedule) count
environment steps, so a config means the same with 1 env or 8, and RL Zoo's settings carry over.

Options: a target network copied (tau = 1) or Polyak-averaged every `target_update_freq` steps,
n-step returns (Sutton 1988; as in Rainbow and SB3's `n_steps`), double DQN (van Hasselt et al.
2016), Huber or squared TD loss, gradient-norm clipping. The buffer stores 1-step transitions and
builds n-step ones when it samples, so n is not baked into the data and nothing is pending at a
checkpoint.

Gymnasium 1.x autoreset and time limits: the vector env runs in SAME_STEP mode, so every stored
transition is real (NEXT_STEP mode's reset step, whose action is ignored, never reaches the
buffer); a finished env's true last observation comes from `info["final_obs"]` and is stored as
`next_obs`; and only `terminated` zeroes the bootstrap, so a truncated episode still bootstraps
from Q(next_obs): CartPole's 500-step cap is not a failure state. Either ends an n-step return.

Resume: the checkpoint holds both networks, the optimiser, the counters and (with `save_replay`,
the default) the filled part of the replay buffer, so a requeued job continues with the data it
had. Exploration and minibatch sampling draw from numpy's global RNG, which the trainer saves.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.nn import functional as F

from hpcrl.config.hparams import DQNConfig
from hpcrl.rl.checkpoint import numpy_to_torch, torch_to_numpy
from hpcrl.rl.envs import final_observations, finished_episodes
from hpcrl.rl.networks import QNetwork
from hpcrl.rl.optim import Adam, GradientStep


class ReplayBuffer:
    """A ring of transitions in host memory, in the observation's dtype (uint8 frames stay bytes).

    `next_obs` is stored beside `obs` rather than recovered from the following slot: simpler, and
    right across autoresets and vector envs, at twice the memory (size image buffers for that).
    Transitions are stored 1-step; `sample` builds n-step ones from each env's stream.
    """

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated", "done")
    """The arrays a checkpoint holds."""

    def __init__(self, capacity: int, obs_space: gym.Space, num_envs: int = 1, n_step: int = 1, gamma: float = 0.99) -> None:
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"DQN's replay buffer stores Box observations, got {type(obs_space).__name__}")
        self.capacity, self.n_step = capacity, n_step
        self.offsets = np.arange(n_step) * num_envs  # env i's next transitions are num_envs slots apart
        self.discounts = (gamma ** np.arange(n_step + 1)).astype(np.float32)
        self.obs = np.zeros((capacity, *obs_space.shape), dtype=obs_space.dtype)
        self.next_obs = np.zeros_like(self.obs)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.done = np.zeros(capacity, dtype=bool)
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, done: np.ndarray) -> None:
        """One transition per env, in env order, every call: env i's next transition is num_envs slots on."""
        idx = np.arange(self.pos, self.pos + len(actions)) % self.capacity
        self.obs[idx], self.next_obs[idx] = obs, next_obs
        self.actions[idx], self.rewards[idx], self.terminated[idx], self.done[idx] = actions, rewards, terminated, done
        self.pos = int(idx[-1] + 1) % self.capacity
        self.size = min(self.size + len(actions), self.capacity)

    def sample(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Uniform minibatch of n-step transitions: `rewards` is the discounted sum of up to n_step
        rewards of one env's episode, `discount` what multiplies the bootstrap value of `next_obs`
        (gamma^k, or 0 after a termination). A return stops early at an episode's end (a truncation
        still bootstraps) and at the newest transition, whose successors are not yet stored."""
        idx = np.random.randint(0, self.size, size=batch_size)
        if self.n_step == 1:  # what the general path computes for n = 1, at half its cost (20 vs 42 us)
            last, steps, rewards = idx, 1, self.rewards[idx]
        else:
            seq = (idx[:, None] + self.offsets) % self.capacity  # this env's next n transitions, if stored
            stored = ((self.pos - 1 - idx) % self.capacity)[:, None] >= self.offsets  # age 0: the newest
            done = self.done[seq]
            used = stored & (np.cumsum(done, axis=1) - done == 0)  # no episode end before: steps 0 .. m-1
            steps = used.sum(axis=1)
            last = seq[np.arange(batch_size), steps - 1]
            rewards = (self.rewards[seq] * used) @ self.discounts[:-1]
        discount = self.discounts[steps] * (1.0 - self.terminated[last])
        arrays = {"obs": self.obs[idx], "next_obs": self.next_obs[last], "actions": self.actions[idx], "rewards": rewards, "discount": discount}
        return {name: torch.as_tensor(array, device=device) for name, array in arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        """The filled part only: an unfilled 1M-slot buffer would otherwise write zeros to disk."""
        arrays = {name: getattr(self, name)[: self.size] for name in self.FIELDS}
        return {**numpy_to_torch(arrays), "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        size = int(state["size"])
        if size > self.capacity:
            raise ValueError(f"the checkpoint's replay buffer holds {size} transitions, more than buffer_size {self.capacity}")
        for name, array in torch_to_numpy({name: state[name] for name in self.FIELDS}).items():
            getattr(self, name)[:size] = array
        self.pos, self.size = int(state["pos"]) % self.capacity, size


class DQN:
    metric_names = ("td_loss", "q_values", "epsilon", "lr")

    def __init__(self, cfg: DQNConfig, envs: gym.vector.VectorEnv, device: torch.device, seed: int) -> None:
        self.cfg, self.envs, self.device = cfg, envs, device
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        self.policy = self.make_policy(cfg, obs_space, action_space).to(device)
        self.target = self.make_policy(cfg, obs_space, action_space).to(device)
        self.target.load_state_dict(self.policy.state_dict())
        self.target.requires_grad_(False)
        self.gradient_step = GradientStep(self.policy.parameters(), lambda params: Adam(params, lr=cfg.lr, eps=1e-8), cfg.max_grad_norm, cfg.amp, device)
        self.buffer = ReplayBuffer(cfg.buffer_size, obs_space, envs.num_envs, cfg.n_step, cfg.gamma)
        self.num_envs = envs.num_envs
        self.steps_per_iteration = math.ceil(cfg.train_freq / self.num_envs)
        self.num_iterations = math.ceil(cfg.total_steps / (self.steps_per_iteration * self.num_envs))
        self.planned_steps = self.num_iterations * self.steps_per_iteration * self.num_envs
        """total_steps rounded up to whole iterations (train_freq env steps each, as SB3 does)."""
        self.losses_finite = torch.ones((), dtype=torch.bool, device=device)
        """Whether every TD loss so far was finite: kept on the device, read once per iteration."""
        self.global_step = 0
        self.iteration = 0
        self.episodes: list[tuple[float, int]] = []
        self.obs, _ = envs.reset(seed=seed)

    @staticmethod
    def make_policy(cfg: DQNConfig, obs_space: gym.Space, action_space: gym.Space) -> QNetwork:
        """The network evaluation rebuilds from a checkpoint's `policy` weights (the online Q-network)."""
        return QNetwork(obs_space, action_space, cfg.hidden_sizes, cfg.activation, cfg.amp, cfg.cnn_channels)

    @property
    def finished(self) -> bool:
        return self.iteration >= self.num_iterations

    def epsilon(self) -> float:
        cfg = self.cfg
        progress = min(1.0, self.global_step / (cfg.exploration_fraction * cfg.total_steps))
        return cfg.start_e + progress * (cfg.end_e - cfg.start_e)

    @torch.no_grad()
    def act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        """Epsilon-greedy per env; the network runs only when some env exploits."""
        explore = np.random.random(self.num_envs) < epsilon
        actions = np.random.randint(self.policy.n_actions, size=self.num_envs)
        if not explore.all():
            greedy = self.policy(torch.as_tensor(obs, device=self.device)).argmax(-1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions

    @torch.no_grad()
    def update_target(self) -> None:
        if self.cfg.tau >= 1.0:
            self.target.load_state_dict(self.policy.state_dict())
        else:
            for target, online in zip(self.target.parameters(), self.policy.parameters()):
                target.lerp_(online, self.cfg.tau)

    def learning(self) -> bool:
        """Past learning_starts, with a buffer holding that much data (it does not after a resume
        without the saved buffer, until refilled) and at least one minibatch."""
        cfg = self.cfg
        return self.global_step > cfg.learning_starts and len(self.buffer) >= max(cfg.batch_size, min(cfg.learning_starts, cfg.buffer_size))

    def td_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        b = self.buffer.sample(cfg.batch_size, self.device)
        with torch.no_grad():
            next_q = self.target(b["next_obs"])
            if cfg.double_dqn:
                next_q = next_q.gather(1, self.policy(b["next_obs"]).argmax(1, keepdim=True)).squeeze(1)
            else:
                next_q = next_q.max(1).values
            td_target = b["rewards"] + b["discount"] * next_q
        q = self.policy(b["obs"]).gather(1, b["actions"].unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, td_target) if cfg.loss == "huber" else F.mse_loss(q, td_target)
        self.losses_finite &= torch.isfinite(loss)
        self.gradient_step(loss)
        return loss.detach(), q.detach().mean()

    def train_iteration(self) -> dict[str, float]:
        cfg = self.cfg
        for _ in range(self.steps_per_iteration):
            epsilon = self.epsilon()
            actions = self.act(self.obs, epsilon)
            next_obs, reward, terminated, truncated, info = self.envs.step(actions)
            self.buffer.add(self.obs, final_observations(next_obs, info), actions, reward * cfg.reward_scale, terminated, terminated | truncated)
            self.obs = next_obs
            before, self.global_step = self.global_step, self.global_step + self.num_envs
            if self.global_step // cfg.target_update_freq > before // cfg.target_update_freq:
                self.update_target()
            returns, lengths = finished_episodes(info)
            self.episodes.extend(zip(returns.tolist(), lengths.tolist()))
        lr = cfg.lr * max(0.0, 1.0 - self.iteration / self.num_iterations) if cfg.anneal_lr else cfg.lr
        metrics = {"epsilon": epsilon, "lr": lr}
        if self.learning():
            self.gradient_step.set_lr(lr)
            for _ in range(cfg.gradient_steps):
                loss, q = self.td_step()
            if not self.losses_finite:
                raise FloatingPointError(f"non-finite loss at step {self.global_step} (iteration {self.iteration + 1}): lower train.lr or look for NaN rewards")
            metrics.update(td_loss=loss.item(), q_values=q.item())
        self.iteration += 1
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "target": self.target.state_dict(),
            **self.gradient_step.state_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "replay": self.buffer.state_dict() if self.cfg.save_replay else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.gradient_step.load_state_dict(state)
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])
        if state.get("replay") is not None:
            self.buffer.load_state_dict(state["replay"])
